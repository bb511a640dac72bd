"""``txjoin run``: check, start the Spark session, start the stream, wait; a caller of
``txjoin.api`` (the Python API) with a session of its own, or spark-submit's
(``txjoin.submit``).

Before the Spark session starts (a JVM, 5-13 s), everything that can refuse the
run without Spark is checked (:func:`preflight`, ``txjoin.api.check``): the paths,
every sink's lineage against the job's checkpoint (``txjoin.sinks.lineage``: a sink
written from another checkpoint, or behind this one, stops the run, exit 2, instead of
having batches silently skipped; batches a stopped or killed run handed off to Delta
count as held, and are committed before the query starts: ``txjoin.sinks.handoff``),
the broker and the job's topics against the checkpoint, and the checkpoint's state
layout and shard count. ``rebuild`` starts a new checkpoint, drains the source into the
sinks' shadow tables, swaps them in atomically, then goes on as a normal run.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
from pyspark.sql import SparkSession

from txjoin.api import Stream, check, source_frame, wait_for
from txjoin.job import Job
from txjoin.pipeline.metrics import Metrics, MetricsServer
from txjoin.pipeline.pipeline import BatchReport, PipelineQuery, RunConfig
from txjoin.pipeline.session import get_session
from txjoin.sinks import Sink
from txjoin.sinks.handoff import GroupCommit
from txjoin.sinks.lineage import Checkpoint, short

__all__ = ["preflight", "run_job", "source_frame", "summary_line"]


def print_report(report: BatchReport) -> None:
    sinks = "+".join(f"{name}{'' if applied else '(replayed, skipped)'}"
                     for name, applied in report.written.items())
    click.echo(f"batch {report.batch_id}: {report.records} records, "
               f"{report.transactions_released} transactions released, {report.changes} "
               f"changes -> {sinks}; frontier commit_seq {report.commit_seq}, "
               f"{report.waiting} waiting; {report.seconds:.2f} s")


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
    stopped = wait_for(query, stop)  # Ctrl-C sets stop (_ctrl_c_stops, from _run)
    if stopped:
        say("stopped (the checkpoint keeps the progress; run again to resume)")
    return not stopped and until_idle


def print_group(commit: GroupCommit) -> None:
    batches = (f"batch {commit.first_batch}" if commit.batches == 1
               else f"batches {commit.first_batch}-{commit.last_batch}")
    earlier = " (left by an earlier run)" if commit.recovered else ""
    click.echo(f"delta: {batches} committed{earlier}, {commit.changes} changes in "
               f"{sum(commit.seconds.values()):.1f}s, "
               f"{commit.lag_seconds:.1f}s after the first was handed off")


def run_job(job: Job, config: RunConfig, on_batch: Callable[[BatchReport], None] | None = None,
            stop: threading.Event | None = None, quiet: bool = False,
            on_sink_commit: Callable[[GroupCommit], None] | None = None,
            deploy_mode: str = "client",
            session: Callable[[], SparkSession] | None = None) -> list[BatchReport]:
    """Run the job until stopped (Ctrl-C or ``stop``), or until idle with ``until_idle``;
    either way Delta has caught up when it returns. ``on_sink_commit``: every sink commit
    (PostgreSQL's per batch, Delta's per group). ``session``: makes the session, after
    the checks, on ``config.master`` in ``deploy_mode`` (spark-submit's: ``txjoin.submit``);
    None: the run starts its own (``get_session``, client mode)."""
    metrics = Metrics(job.name)
    server = None if config.metrics_port is None else MetricsServer(metrics, config.metrics_port)
    say = (lambda _: None) if quiet else click.echo
    if server is not None:
        say(f"metrics: http://localhost:{server.port}/metrics")
    try:
        return _run(job, config, metrics, on_batch, stop, quiet, say, on_sink_commit,
                    deploy_mode, session)
    finally:
        if server is not None:
            server.close()


def preflight(job: Job, config: RunConfig, deploy: str = "client") -> RunConfig:
    """Every refusal that needs no Spark, before the session starts (``txjoin.api.check``:
    the paths, the sinks' lineage and columns, the broker and topics, the records' columns,
    the checkpoint's layout); ``config`` with its paths resolved."""
    return check(job, config, deploy)


def _run(job: Job, config: RunConfig, metrics: Metrics,
         on_batch: Callable[[BatchReport], None] | None, stop: threading.Event | None,
         quiet: bool, say: Callable[[str], None],
         on_sink_commit: Callable[[GroupCommit], None] | None = None,
         deploy_mode: str = "client",
         session: Callable[[], SparkSession] | None = None) -> list[BatchReport]:
    stop = stop or threading.Event()  # set by Ctrl-C too (_ctrl_c_stops)
    config = preflight(job, config, deploy_mode)
    if session is None:
        spark = get_session(config.master, app_name=f"txjoin-{job.name}",
                            extra_conf=config.spark_conf)
    else:
        spark = session()
    # Installed after the session started (a new SparkContext installs its own handler) and
    # before anything long: a Ctrl-C while Delta commits what a killed run handed off is a
    # clean stop too.
    with _ctrl_c_stops(stop):
        return _stream(job, config, spark, metrics, on_batch, stop, quiet, say, on_sink_commit)


def _stream(job: Job, config: RunConfig, spark: SparkSession, metrics: Metrics,
            on_batch: Callable[[BatchReport], None] | None, stop: threading.Event,
            quiet: bool, say: Callable[[str], None],
            on_sink_commit: Callable[[GroupCommit], None] | None) -> list[BatchReport]:
    """The run once its Spark session is up: the stream (sinks, pipeline), (rebuild,) its
    query, wait."""

    def report(r: BatchReport) -> None:
        if not quiet:
            print_report(r)
        if on_batch is not None:
            on_batch(r)

    def committed(commit: GroupCommit) -> None:
        if not quiet and commit.sink == "delta" and commit.wrote:
            print_group(commit)
        if on_sink_commit is not None:
            on_sink_commit(commit)

    stream = Stream(spark, job, config, on_batch=report, on_sink_commit=committed,
                    metrics=metrics)
    sinks = stream.sinks
    try:
        if config.rebuild:
            path = Path(stream.pipeline.checkpoint)
            checkpoint, moved = Checkpoint.fresh(path)
            say(f"rebuilding the sinks from the source with the new checkpoint {path} "
                f"({short(checkpoint.id)})"
                + ("" if moved is None else f"; the previous one is kept in {moved}"))
            for sink in sinks:
                sink.begin_rebuild(checkpoint.id)
            # Without --rebuild, preflight() compared the sinks' lineage with the checkpoint
            # (and the query's start commits to Delta what an earlier run handed off).
            finished = _await(stream.begin(available_now=True), True, stop, say)
            stream.raise_failure(stop)
            if not finished:
                return stream.reports  # the rebuild stays unswapped; run --rebuild again
            for sink in sinks:
                sink.finish_rebuild()
            say(f"rebuilt: {', '.join(f'{s.name} sink {s.where}' for s in sinks)} now hold "
                f"the new checkpoint's output")
            if config.until_idle:
                say(summary_line(stream.reports, sinks))
                return stream.reports
        _await(stream.begin(available_now=config.until_idle), config.until_idle, stop, say)
        stream.raise_failure(stop)
        say(summary_line(stream.reports, sinks))
    finally:
        stream.close()
    return stream.reports
