"""``txjoin run``: check, start the Spark session, wire the source, sinks and pipeline, wait.

Before the Spark session starts (a JVM, 5-13 s), everything that can refuse the
run without Spark is checked (:func:`preflight`): every sink's lineage against
the job's checkpoint (``txjoin.sinks.lineage``: a sink written from another
checkpoint, or behind this one, stops the run, exit 2, instead of having
batches silently skipped; batches a stopped or killed run handed off to Delta count as held, and
are committed before the query starts: ``txjoin.sinks.handoff``), the broker and
the job's topics against the checkpoint, and the checkpoint's state layout and
shard count. ``rebuild``
starts a new checkpoint, drains the source into the sinks' shadow tables, swaps
them in atomically, then goes on as a normal run.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
from pyspark.sql import DataFrame, SparkSession

from txjoin.job import Job
from txjoin.pipeline.metrics import Metrics, MetricsServer
from txjoin.pipeline.pipeline import (
    BatchReport,
    Pipeline,
    PipelineQuery,
    RunConfig,
    check_kafka,
    check_layout,
    check_record_columns,
)
from txjoin.pipeline.session import get_session
from txjoin.sinks import Sink
from txjoin.sinks.build import build_sinks
from txjoin.sinks.delta import DeltaSink
from txjoin.sinks.handoff import GroupCommit, Handoff
from txjoin.sinks.lineage import Checkpoint, check_lineage, check_owners, short
from txjoin.sinks.postgres import PostgresSink


def print_report(report: BatchReport) -> None:
    sinks = "+".join(f"{name}{'' if applied else '(replayed, skipped)'}"
                     for name, applied in report.written.items())
    click.echo(f"batch {report.batch_id}: {report.records} records, "
               f"{report.transactions_released} transactions released, {report.changes} "
               f"changes -> {sinks}; frontier commit_seq {report.commit_seq}, "
               f"{report.waiting} waiting")


def source_frame(spark: SparkSession, job: Job, config: RunConfig, pipeline: Pipeline
                 ) -> DataFrame:
    """The streaming input: ``config.source`` is ``kafka`` or ``files:DIR``."""
    from txjoin.ingest.spark import files

    directory = files.parse_source(config.source)
    if directory is None:
        return pipeline.kafka_source()
    prefixes = pipeline.prefixes
    return files.read_stream(spark, directory, pipeline.job.topics(prefixes),
                             transaction_topic=list(
                                 pipeline.job.transaction_topics(prefixes).values()),
                             max_events=config.max_events_per_trigger)


def summary_line(reports: list[BatchReport], sinks: list[Sink]) -> str:
    """One line for the end of a run: what it did, also when there was nothing to do."""
    written = {sink.name: sum(r.changes for r in reports if r.written.get(sink.name))
               for sink in sinks}
    if reports:
        frontier: int | None = reports[-1].commit_seq
    else:
        held = [h for h in (sink.held() for sink in sinks) if h is not None]
        frontier = next((h.frontier_commit_seq for h in held), None)
    rows = ", ".join(f"{name} {n}" for name, n in written.items()) or "no sinks"
    return (f"done: {len(reports)} batches, {sum(r.records for r in reports)} records, "
            f"{sum(r.transactions_released for r in reports)} transactions released; "
            f"rows written: {rows}; frontier commit_seq "
            f"{'none yet' if frontier is None else frontier}")


BATCH_FINISH_WAIT_S = 600.0
"""How long a stop asked for by Ctrl-C waits for the batch in progress to commit."""


@contextlib.contextmanager
def _ctrl_c_stops(stop: threading.Event) -> Iterator[None]:
    """Ctrl-C sets ``stop``: the run ends after the batch in progress commits; a second
    Ctrl-C stops at once (the next run replays that batch; nothing is lost or doubled).

    Replaces, for the run, the handler SparkContext installs: it cancels Spark's jobs from
    inside the signal handler, in the middle of the main thread's own call into the JVM,
    and py4j then prints a 'reentrant call' traceback and a stray KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupted(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        click.echo("stopping after the batch in progress commits (Ctrl-C again to stop now)",
                   err=True)

    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _await(query: PipelineQuery, until_idle: bool, stop: threading.Event,
           say: Callable[[str], None]) -> bool:
    """Wait for ``query``; False when stopped (Ctrl-C or ``stop``) before it ended. A stop
    lets the batch in progress finish and commit first."""
    stopped = _wait(query, stop)  # Ctrl-C sets stop (_ctrl_c_stops, from _run)
    if stopped:
        say("stopped (the checkpoint keeps the progress; run again to resume)")
    return not stopped and until_idle


def _wait(query: PipelineQuery, stop: threading.Event) -> bool:
    """Wait for ``query`` to end or ``stop`` to be set, then for the batch in progress to
    commit; stop the query. True when it was stopped before it ended."""
    stopped = False
    try:
        while query.isActive and not stop.is_set():
            query.awaitTermination(1)
        stopped = query.isActive
        deadline = time.monotonic() + BATCH_FINISH_WAIT_S
        while stopped and query.status.get("isTriggerActive") and time.monotonic() < deadline:
            time.sleep(0.05)
    except KeyboardInterrupt:
        stopped = True
    except Exception:
        # The query failed. After a Ctrl-C that is expected: the terminal sends SIGINT to
        # the whole process group, Spark's Python workers too, which can fail the batch in
        # progress. Nothing of it is committed; the next run replays it (a real error then
        # shows again).
        if not stop.is_set():
            raise
        stopped = True
    finally:
        if query.isActive:
            query.stop()
    return stopped


def _raise_failure(query: PipelineQuery, stop: threading.Event) -> None:
    """Raise the query's error, unless a stop was asked for (see :func:`_wait`)."""
    exc = query.exception()
    if exc is not None and not stop.is_set():
        raise exc


def print_group(commit: GroupCommit) -> None:
    batches = (f"batch {commit.first_batch}" if commit.batches == 1
               else f"batches {commit.first_batch}-{commit.last_batch}")
    earlier = " (left by an earlier run)" if commit.recovered else ""
    click.echo(f"delta: {batches} committed{earlier}, {commit.changes} changes in "
               f"{sum(commit.seconds.values()):.1f}s, "
               f"{commit.lag_seconds:.1f}s after the first was handed off")


def run_job(job: Job, config: RunConfig, on_batch: Callable[[BatchReport], None] | None = None,
            stop: threading.Event | None = None, quiet: bool = False,
            on_sink_commit: Callable[[GroupCommit], None] | None = None) -> list[BatchReport]:
    """Run the job until stopped (Ctrl-C or ``stop``), or until idle with ``until_idle``;
    either way Delta has caught up when it returns. ``on_sink_commit``: every sink commit
    (PostgreSQL's per batch, Delta's per group)."""
    metrics = Metrics(job.name)
    server = None if config.metrics_port is None else MetricsServer(metrics, config.metrics_port)
    say = (lambda _: None) if quiet else click.echo
    if server is not None:
        say(f"metrics: http://localhost:{server.port}/metrics")
    try:
        return _run(job, config, metrics, on_batch, stop, quiet, say, on_sink_commit)
    finally:
        if server is not None:
            server.close()


def preflight(job: Job, config: RunConfig) -> None:
    """Every refusal that needs no Spark, in the order the run would meet them: a sink table
    another job wrote, the sinks' lineage and the PostgreSQL sink's columns (unless
    rebuilding), the broker and topics
    (a Kafka source) and the declared columns against the topics' newest records, the
    checkpoint's layout and shard count. Raises the run's own one-line errors; writes
    nothing but the checkpoint's identity (as the run would)."""
    prefixes = config.prefixes(job)
    checkpoint = Path(config.checkpoint_dir) / job.with_source_prefixes(prefixes).name
    sinks = build_sinks(job, config)  # without Spark: for reading their lineage only
    try:
        check_owners(sinks, job.name, job.source_file)  # --rebuild would replace them too
        if not config.rebuild:
            # Batches a stopped or killed run handed off to Delta and did not commit count
            # as held: the run commits them before its query starts (Pipeline.recover).
            check_lineage(sinks, Checkpoint.open(checkpoint),
                          handed_off={DeltaSink.name: Handoff(checkpoint).stored()})
            for sink in sinks:
                if isinstance(sink, PostgresSink):
                    sink.check_tables()  # a table altered underneath
    finally:
        for sink in sinks:
            sink.close()
    from txjoin.ingest.spark.files import parse_source

    if parse_source(config.source) is None:
        # A rebuild starts a new checkpoint: only the broker and topics are checked.
        topics, facts = check_kafka(job.with_source_prefixes(prefixes), config, prefixes,
                                    None if config.rebuild else checkpoint)
        check_record_columns(job, prefixes, topics, facts.partitions)
    if not config.rebuild:  # shards as Pipeline.n_shards takes them (0/None: not given)
        check_layout(checkpoint, config.shards or None, record=False)


def _run(job: Job, config: RunConfig, metrics: Metrics,
         on_batch: Callable[[BatchReport], None] | None, stop: threading.Event | None,
         quiet: bool, say: Callable[[str], None],
         on_sink_commit: Callable[[GroupCommit], None] | None = None) -> list[BatchReport]:
    stop = stop or threading.Event()  # set by Ctrl-C too (_ctrl_c_stops)
    preflight(job, config)
    spark = get_session(config.master, app_name=f"txjoin-{job.name}",
                        extra_conf=config.spark_conf)
    # Installed after the session started (a new SparkContext installs its own handler) and
    # before anything long: a Ctrl-C while Delta commits what a killed run handed off is a
    # clean stop too.
    with _ctrl_c_stops(stop):
        return _stream(job, config, spark, metrics, on_batch, stop, quiet, say, on_sink_commit)


def _stream(job: Job, config: RunConfig, spark: SparkSession, metrics: Metrics,
            on_batch: Callable[[BatchReport], None] | None, stop: threading.Event,
            quiet: bool, say: Callable[[str], None],
            on_sink_commit: Callable[[GroupCommit], None] | None) -> list[BatchReport]:
    """The run once its Spark session is up: sinks, pipeline, (rebuild,) query, wait."""
    sinks = build_sinks(job, config, spark)

    def report(r: BatchReport) -> None:
        metrics.observe(r)
        if not quiet:
            print_report(r)
        if on_batch is not None:
            on_batch(r)

    def committed(commit: GroupCommit) -> None:
        metrics.observe_sink(commit)
        if not quiet and commit.sink == "delta" and commit.wrote:
            print_group(commit)
        if on_sink_commit is not None:
            on_sink_commit(commit)

    pipeline = Pipeline(spark, job, config, sinks, on_batch=report, on_sink_commit=committed)
    if pipeline.committer is not None:
        metrics.delta_lag = pipeline.committer.lag
    try:
        path = Path(pipeline.checkpoint)
        if config.rebuild:
            checkpoint, moved = Checkpoint.fresh(path)
            say(f"rebuilding the sinks from the source with the new checkpoint {path} "
                f"({short(checkpoint.id)})"
                + ("" if moved is None else f"; the previous one is kept in {moved}"))
            for sink in sinks:
                sink.begin_rebuild(checkpoint.id)
        # Without --rebuild, preflight() compared the sinks' lineage with the checkpoint
        # (and pipeline.start() commits to Delta what an earlier run handed off).
        source = source_frame(spark, job, config, pipeline)
        if config.rebuild:
            query = pipeline.start(source, available_now=True, query_name=f"txjoin_{job.name}")
            finished = _await(query, True, stop, say)
            _raise_failure(query, stop)
            if not finished:
                return pipeline.reports  # the rebuild stays unswapped; run --rebuild again
            for sink in sinks:
                sink.finish_rebuild()
            say(f"rebuilt: {', '.join(f'{s.name} sink {s.where}' for s in sinks)} now hold "
                f"the new checkpoint's output")
            if config.until_idle:
                say(summary_line(pipeline.reports, sinks))
                return pipeline.reports
            source = source_frame(spark, job, config, pipeline)
        query = pipeline.start(source, available_now=config.until_idle,
                               query_name=f"txjoin_{job.name}")
        _await(query, config.until_idle, stop, say)
        _raise_failure(query, stop)
        say(summary_line(pipeline.reports, sinks))
    finally:
        pipeline.close()
        for sink in sinks:
            sink.close()
    return pipeline.reports
