"""``txjoin run``: start the Spark session, wire the Kafka source, sinks and pipeline, wait.

Before the query starts, every sink's lineage is compared with the job's
checkpoint (``txjoin.sinks.lineage``): a sink written from another checkpoint,
or behind this one, stops the run (exit 2) instead of having batches silently
skipped; what a stopped or killed run handed off to the Delta sink is
committed first (``txjoin.sinks.handoff``). ``rebuild`` starts a new
checkpoint, drains the source into the sinks' shadow tables, swaps them in
atomically, then goes on as a normal run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import click
from pyspark.sql import DataFrame, SparkSession

from txjoin.job import Job
from txjoin.pipeline.metrics import Metrics, MetricsServer
from txjoin.pipeline.pipeline import BatchReport, Pipeline, PipelineQuery, RunConfig, build_sinks
from txjoin.pipeline.session import get_session
from txjoin.sinks import Sink
from txjoin.sinks.handoff import GroupCommit
from txjoin.sinks.lineage import Checkpoint, check_lineage, short


def print_report(report: BatchReport) -> None:
    sinks = "+".join(f"{name}{'' if applied else '(replayed, skipped)'}"
                     for name, applied in report.written.items())
    click.echo(f"batch {report.batch_id}: {report.records} records, "
               f"{report.transactions_released} transactions released, {report.changes} "
               f"changes -> {sinks}; frontier commit_seq {report.commit_seq}, "
               f"{report.waiting} waiting")


def print_group(commit: GroupCommit) -> None:
    batches = (f"batch {commit.first_batch}" if commit.batches == 1
               else f"batches {commit.first_batch}-{commit.last_batch}")
    earlier = " (left by an earlier run)" if commit.recovered else ""
    click.echo(f"delta: {batches} committed{earlier}, {commit.changes} changes in "
               f"{sum(commit.seconds.values()):.1f}s, "
               f"{commit.lag_seconds:.1f}s after the first was handed off")


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


def _await(query: PipelineQuery, until_idle: bool, stop: threading.Event | None) -> bool:
    """Wait for ``query``; False when interrupted (Ctrl-C or ``stop``) before it ended."""
    try:
        if until_idle:
            query.awaitTermination()
        else:
            while query.isActive and not (stop is not None and stop.is_set()):
                query.awaitTermination(1)
            return False
    except KeyboardInterrupt:
        click.echo("stopping (the checkpoint keeps the progress; run again to resume)")
        return False
    finally:
        if query.isActive:
            query.stop()
    return True


def _raise_failure(query: PipelineQuery) -> None:
    exc = query.exception()
    if exc is not None:
        raise exc


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


def _run(job: Job, config: RunConfig, metrics: Metrics,
         on_batch: Callable[[BatchReport], None] | None, stop: threading.Event | None,
         quiet: bool, say: Callable[[str], None],
         on_sink_commit: Callable[[GroupCommit], None] | None = None) -> list[BatchReport]:
    spark = get_session(config.master, app_name=f"txjoin-{job.name}",
                        extra_conf=config.spark_conf)
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
        else:
            # Batches a killed run handed off but did not commit go to Delta first.
            pipeline.recover()
            check_lineage(sinks, Checkpoint.open(path))
        source = source_frame(spark, job, config, pipeline)
        if config.rebuild:
            query = pipeline.start(source, available_now=True, query_name=f"txjoin_{job.name}")
            finished = _await(query, True, stop)
            _raise_failure(query)
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
        _await(query, config.until_idle, stop)
        _raise_failure(query)
        say(summary_line(pipeline.reports, sinks))
    finally:
        pipeline.close()
        for sink in sinks:
            sink.close()
    return pipeline.reports
