"""txjoin's Python API: a job's streaming query on a ``SparkSession`` the caller owns.

``txjoin run`` is one caller of it (with a session of its own); a notebook, an existing
Spark application or ``spark-submit`` (``txjoin.submit``) are others::

    import txjoin
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.config(map=txjoin.spark_conf()).getOrCreate()
    job = txjoin.load_job("orders.py")
    config = txjoin.RunConfig(bootstrap_servers="broker:9092", postgres_dsn="...",
                              checkpoint_dir="/mnt/shared/txjoin/checkpoints",
                              output_dir="/mnt/shared/txjoin/output")
    stream = txjoin.start(spark, job, config)   # the same refusals as `txjoin run`
    print(stream.progress())                    # frontier, per-sink freshness
    stream.stop()                               # after the batch in progress; Delta caught up

:func:`check` is every refusal that needs no Spark (run before any query starts, by
:func:`start` too); :func:`start` builds the sinks and the pipeline on the session and
starts the query; the :class:`Stream` it returns waits, reports and stops.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from txjoin.errors import ConfigError
from txjoin.pipeline.pipeline import (
    BatchReport,
    Pipeline,
    PipelineQuery,
    RunConfig,
    check_kafka,
    check_layout,
    check_record_columns,
    split_placement,
)
from txjoin.sinks.handoff import GroupCommit

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from txjoin.job import Job
    from txjoin.pipeline.metrics import Metrics
    from txjoin.sinks import Sink

__all__ = ["BatchReport", "Progress", "RunConfig", "SinkProgress", "Stream", "check",
           "spark_conf", "start"]

BATCH_FINISH_WAIT_S = 600.0
"""How long a stop waits for the batch in progress to commit."""

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def spark_conf(master: str = "local[*]") -> dict[str, str]:
    """The Spark settings txjoin's own sessions start with, for a session of the caller's
    (``SparkSession.builder.config(map=txjoin.spark_conf())``): delta-spark and Spark's
    kafka source on ``spark.jars``, Delta's extension and catalog, UTC, Arrow, the
    checkpoint manager measured in docs/how-it-works.md."""
    from txjoin.jvm import local_fs_conf
    from txjoin.pipeline.session import default_conf

    return {**default_conf(), **local_fs_conf(master)}


def resolve_paths(config: RunConfig, deploy_mode: str = "client") -> RunConfig:
    """``config`` with its checkpoint and output roots as local paths, or a one-line refusal.

    txjoin reads and writes files of its own in both roots (the checkpoint's identity,
    layout and Delta hand-off; the Delta tables through delta-rs and Spark) through local
    paths: a local disk, or a shared mount (NFS and the like) at the same path on every
    node. A ``file:`` URI is taken as its path; any other scheme (``hdfs://``, ``s3a://``,
    ``abfss://``) is refused rather than mangled by ``pathlib``. In cluster deploy mode a
    relative path is refused: the driver resolves it against its working directory, a
    new one on each node and at each restart, so a restarted driver would not find its
    checkpoint."""
    changes: dict[str, Any] = {}
    for name, option in (("checkpoint_dir", "--checkpoint-dir"), ("output_dir", "--output-dir")):
        value = str(getattr(config, name))
        scheme = _SCHEME.match(value)
        if scheme and len(scheme.group(1)) > 1:  # not a Windows drive letter
            if scheme.group(1).lower() != "file":
                raise ConfigError(
                    f"{option} {value}: txjoin keeps its checkpoint and Delta output on local "
                    f"paths (a local disk, or a shared mount at the same path on every node); "
                    f"{scheme.group(1)}: is not supported: mount the storage and pass the "
                    f"mount's path")
            from urllib.parse import unquote, urlparse

            value = unquote(urlparse(value).path)
            changes[name] = value
        if deploy_mode == "cluster" and not Path(value).is_absolute():
            raise ConfigError(
                f"{option} {value} is relative: in cluster deploy mode the driver runs in a "
                f"new working directory on each start, so a restarted driver would not find "
                f"it; give an absolute path that every node reaches (a shared mount)")
    return dataclasses.replace(config, **changes) if changes else config


def check(job: Job, config: RunConfig, deploy_mode: str = "client") -> RunConfig:
    """Every refusal that needs no Spark, before any query starts; ``config`` with its
    paths resolved (:func:`resolve_paths`), for :func:`start`.

    In the order a run meets them: the paths; a sink table another job wrote (also with
    ``rebuild``, which would replace it); the sinks' lineage against the checkpoint
    (a sink written from another checkpoint, or behind this one; batches a stopped or
    killed run handed off to Delta count as held: ``txjoin.sinks.handoff``) and the
    PostgreSQL sink's columns (not with ``rebuild``); the broker and topics (a Kafka
    source) and the declared columns against the topics' newest records; the
    checkpoint's layout and shard count. Raises the run's own one-line errors
    (:class:`txjoin.errors.TxjoinError`); writes nothing but the checkpoint's identity,
    as the run would."""
    from txjoin.ingest.spark.files import parse_source
    from txjoin.sinks.build import build_sinks
    from txjoin.sinks.delta import DeltaSink
    from txjoin.sinks.handoff import Handoff
    from txjoin.sinks.lineage import Checkpoint, check_lineage, check_owners
    from txjoin.sinks.postgres import PostgresSink

    config = resolve_paths(config, deploy_mode)
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
    if parse_source(config.source) is None:
        # A rebuild starts a new checkpoint: only the broker and topics are checked.
        topics, facts = check_kafka(job.with_source_prefixes(prefixes), config, prefixes,
                                    None if config.rebuild else checkpoint)
        check_record_columns(job, prefixes, topics, facts.partitions)
    placement = split_placement(job, config)
    if not config.rebuild:  # shards as Pipeline.n_shards takes them (0/None: not given)
        check_layout(checkpoint, config.shards or None, record=False, engine=config.engine,
                     split=placement.split)
    return config


@dataclass(frozen=True)
class SinkProgress:
    """How fresh one sink is: its last commit, and the newest source commit it holds."""

    name: str
    commits: int = 0  # commits of this stream (PostgreSQL: one per batch; Delta: per group)
    last_batch: int | None = None  # the last micro-batch it committed
    committed_at: float | None = None  # when (unix time)
    source_commit_ts: float | None = None  # newest source commit time it committed (unix)
    pending_batches: int = 0  # Delta: batches handed off, not committed there yet

    @property
    def freshness_seconds(self) -> float | None:
        """How far the sink trailed the source at its last commit (None: nothing yet)."""
        if self.committed_at is None or self.source_commit_ts is None:
            return None
        return max(0.0, self.committed_at - self.source_commit_ts)


@dataclass(frozen=True)
class Progress:
    """A stream's progress: batches, the frontier, every sink's freshness."""

    batches: int
    records: int
    frontier_commit_seq: int | None  # the last transaction released (None: no batch yet)
    waiting: int  # transactions buffered, not complete yet
    sinks: dict[str, SinkProgress] = field(default_factory=dict)
    active: bool = True  # the query is running


class Stream:
    """A job's streaming query with its sinks, on the caller's session (:func:`start`).

    ``query`` is the streaming query (a ``StreamingQuery`` whose end also waits for Delta);
    ``reports`` the micro-batches this stream ran. :meth:`stop` (or leaving a ``with``
    block) ends it cleanly: the batch in progress commits, Delta catches up, the sinks
    close. Built by :func:`start`; ``txjoin run`` uses its steps for ``--rebuild``.
    """

    def __init__(self, spark: SparkSession, job: Job, config: RunConfig,
                 on_batch: Callable[[BatchReport], None] | None = None,
                 on_sink_commit: Callable[[GroupCommit], None] | None = None,
                 metrics: Metrics | None = None) -> None:
        from txjoin.pipeline.metrics import Metrics
        from txjoin.pipeline.session import RUNTIME_CONF
        from txjoin.sinks.build import build_sinks

        for key, value in RUNTIME_CONF.items():  # what a running session takes of txjoin's
            spark.conf.set(key, value)
        self.spark = spark
        self.job = job
        self.config = config
        self.metrics = metrics or Metrics(job.name)
        self._on_batch = on_batch
        self._on_sink_commit = on_sink_commit
        self._lock = threading.Lock()
        self._sinks: dict[str, SinkProgress] = {}
        self.query: PipelineQuery | None = None
        self._closed = False
        self.sinks: list[Sink] = build_sinks(job, config, spark)
        try:
            self.pipeline = Pipeline(spark, job, config, self.sinks, on_batch=self._batch,
                                     on_sink_commit=self._committed)
        except BaseException:
            self._close_sinks()
            raise
        if self.pipeline.committer is not None:
            self.metrics.delta_lag = self.pipeline.committer.lag

    @property
    def reports(self) -> list[BatchReport]:
        """Every micro-batch this stream ran, in order."""
        return self.pipeline.reports

    def _batch(self, report: BatchReport) -> None:
        self.metrics.observe(report)
        if self._on_batch is not None:
            self._on_batch(report)

    def _committed(self, commit: GroupCommit) -> None:
        self.metrics.observe_sink(commit)
        if commit.wrote:
            with self._lock:
                before = self._sinks.get(commit.sink, SinkProgress(commit.sink))
                newest = max(commit.commit_ts_ms, default=None)
                self._sinks[commit.sink] = dataclasses.replace(
                    before, commits=before.commits + 1, last_batch=commit.last_batch,
                    committed_at=commit.finished_at,
                    source_commit_ts=(before.source_commit_ts if newest is None
                                      else newest / 1000))
        if self._on_sink_commit is not None:
            self._on_sink_commit(commit)

    def source(self) -> DataFrame:
        """The streaming input (``config.source``: ``kafka`` or ``files:DIR``)."""
        return source_frame(self.spark, self.job, self.config, self.pipeline)

    def begin(self, available_now: bool = False) -> PipelineQuery:
        """Start the query (after committing to Delta what an earlier run handed off):
        ``available_now`` drains the input there is, else it streams at the trigger."""
        self.query = self.pipeline.start(self.source(), available_now=available_now,
                                         query_name=f"txjoin_{self.job.name}")
        return self.query

    def progress(self) -> Progress:
        """The stream's progress now (cheap: read from what each batch and commit reported)."""
        reports = self.pipeline.reports
        last = reports[-1] if reports else None
        with self._lock:
            sinks = {s.name: self._sinks.get(s.name, SinkProgress(s.name)) for s in self.sinks}
        committer = self.pipeline.committer
        if committer is not None and "delta" in sinks:
            sinks["delta"] = dataclasses.replace(sinks["delta"],
                                                 pending_batches=committer.lag()[0])
        return Progress(batches=len(reports), records=sum(r.records for r in reports),
                        frontier_commit_seq=None if last is None else last.commit_seq,
                        waiting=0 if last is None else last.waiting, sinks=sinks,
                        active=self.query is not None and bool(self.query.isActive))

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait for the query to end (an ``available_now`` one ends by itself; raises its
        error), at most ``timeout`` seconds; True when it ended."""
        if self.query is None:
            return True
        ended = self.query.awaitTermination(None if timeout is None else int(max(1, timeout)))
        self.raise_failure()
        return ended is None or bool(ended)

    def wait(self, stop: threading.Event) -> bool:
        """Wait for the query to end or ``stop`` to be set, then for the batch in progress to
        commit; stop the query (Delta then caught up). True when it was stopped before it
        ended."""
        if self.query is None:
            return False
        return wait_for(self.query, stop)

    def raise_failure(self, stop: threading.Event | None = None) -> None:
        """Raise the query's error, unless a stop was asked for (see :func:`wait_for`)."""
        if self.query is None:
            return
        exc = self.query.exception()
        if exc is not None and not (stop is not None and stop.is_set()):
            raise exc

    def stop(self) -> None:
        """Stop cleanly: the batch in progress commits, Delta commits every batch handed off,
        the sinks close. Safe to call twice."""
        if self._closed:
            return
        try:
            if self.query is not None and self.query.isActive:
                stop = threading.Event()
                stop.set()
                wait_for(self.query, stop)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the Delta committer (what it could not commit stays for the next run) and
        close the sinks; the query, if still running, is the caller's to stop first."""
        if self._closed:
            return
        self._closed = True
        try:
            self.pipeline.close()
        finally:
            self._close_sinks()

    def _close_sinks(self) -> None:
        for sink in self.sinks:
            sink.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


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


def wait_for(query: PipelineQuery, stop: threading.Event) -> bool:
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


def check_session(spark: SparkSession) -> None:
    """A session without delta-spark's extension cannot run the Delta sink's merges: one
    line saying how to start one that can (static settings: only at session start)."""
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    if DELTA_EXTENSION not in extensions:
        raise ConfigError(
            f"this SparkSession has no {DELTA_EXTENSION} (spark.sql.extensions is "
            f"{extensions or 'unset'}): start it with txjoin's settings, "
            f"SparkSession.builder.config(map=txjoin.spark_conf()), or with spark-submit "
            f"--conf spark.sql.extensions={DELTA_EXTENSION} (`txjoin submit-line` prints them)")


def deploy_mode(spark: SparkSession) -> str:
    """``client`` or ``cluster``: where spark-submit put this session's driver."""
    return str(spark.conf.get("spark.submit.deployMode", "client") or "client")


def start(spark: SparkSession, job: Job, config: RunConfig,
          on_batch: Callable[[BatchReport], None] | None = None,
          on_sink_commit: Callable[[GroupCommit], None] | None = None) -> Stream:
    """Check ``job`` and ``config`` (:func:`check`), then start its streaming query with its
    sinks on ``spark``; the :class:`Stream` running it.

    ``config.master`` is ignored: the session's master is the one. ``config.until_idle``
    drains the input available now and ends (:meth:`Stream.await_termination`); else the
    stream runs until :meth:`Stream.stop`. ``on_batch`` gets every micro-batch's report,
    ``on_sink_commit`` every sink commit (PostgreSQL's per batch, Delta's per group), both
    on Spark's streaming thread. ``rebuild`` is ``txjoin run --rebuild``'s (it drains,
    swaps the sinks and then streams): refused here."""
    if config.rebuild:
        raise ConfigError("RunConfig(rebuild=True) is for `txjoin run --rebuild` (it drains "
                          "the source into the sinks' shadow tables and swaps them in): run "
                          "that once, then start the stream without rebuild")
    check_session(spark)
    config = dataclasses.replace(config, master=str(spark.sparkContext.master))
    config = check(job, config, deploy_mode(spark))
    stream = Stream(spark, job, config, on_batch=on_batch, on_sink_commit=on_sink_commit)
    try:
        stream.begin(available_now=config.until_idle)
    except BaseException:
        stream.close()
        raise
    return stream
