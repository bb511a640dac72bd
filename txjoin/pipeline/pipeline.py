"""The streaming pipeline: source -> routing (JVM) -> shards (decode, sequence, join) -> sinks.

Shape of the query::

    source (Spark's kafka | txjoin_replay | txjoin_files): topic, partition, offset, key, value
      -> routing: from_json + Spark expressions        # the JVM, before the shuffle
      -> groupBy(shard).transformWithStateInPandas(ShardProcessor)   # n shards in parallel:
                                                       # decode (once) + sequence + join
      -> foreachBatch: each shard COPYs its output into PostgreSQL's staging table and
         writes Delta's data files itself (txjoin.sinks.tasks); the driver applies
         PostgreSQL's stage with the progress in one transaction, and hands what the tasks
         wrote for Delta off durably; Delta commits many batches' files at once on a
         thread of its own (txjoin.sinks.handoff)

A record enters Python once, in the shard task that reads it
(``txjoin/join/spark/routing.py``).

Every shard sees the metadata of every event and marker, so every shard
assembles every transaction and releases the same ones in the same micro-batch
(commit order stays global); each shard joins only the facts it owns, with
full copies of the looked-up tables (``txjoin/join/routing.py``). A shard's
state is its own log in Spark's state store (RocksDB): each micro-batch writes
only what it brought, snapshots are amortised (``txjoin/join/state_log.py``).
The sinks get the union of the shards' output changes in commit order: the
PostgreSQL sink (and any other but Delta) commits it in the batch; the Delta
sink's committer commits every batch handed off since its last commit in one
commit per table, at most every ``--delta-commit-interval`` seconds, so no batch
waits for a lakehouse commit unless the hand-off is full (backpressure). After a
crash at any point Spark re-runs the last batch from the previous state with the
same input; the shards, being deterministic, produce the same changes, which the
sinks skip if they already hold them, and the hand-off's batches are committed
before the query starts: nothing lost, nothing applied twice.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from txjoin import crashpoints
from txjoin.errors import RECOVER, ConfigError, JobError
from txjoin.ingest.debezium import DEFAULT_TOPIC_PREFIX
from txjoin.ingest.spark import DEFAULT_MAX_EVENTS_PER_TRIGGER
from txjoin.ingest.spark.kafka import (
    OFFSET_SPANS_PROPERTY,
    KafkaFacts,
    KafkaTopics,
    batch_offset_spans,
)
from txjoin.job import Job, Table
from txjoin.join import ENGINES, SHARDED, STAGED
from txjoin.join.output import output_schema
from txjoin.join.placement import SPLIT_ALL, Placement, splittable
from txjoin.join.spark.owners import OwnerProcessor
from txjoin.join.spark.routing import route
from txjoin.join.spark.shards import OUTPUT_SCHEMA, ShardProcessor, shard_labels
from txjoin.join.spark.staged import (
    ApplierProcessor,
    SequencerProcessor,
    route_staged,
    staged_stages,
)
from txjoin.join.staged import STAGED_LAYOUTS
from txjoin.join.state_log import CONTINUED_LAYOUTS, LAYOUT_VERSION
from txjoin.sequence.assembly import IncompletePolicy
from txjoin.sinks import DEFAULT_RETRY_TIMEOUT_S, Sink, StagedSink
from txjoin.sinks.delta import DeltaSink
from txjoin.sinks.handoff import (
    DEFAULT_INTERVAL_S,
    DEFAULT_MAX_BATCHES,
    DEFAULT_MAX_BYTES,
    GroupCommit,
    GroupCommitter,
    Handoff,
    Parcel,
)
from txjoin.sinks.lineage import Lineage, checkpoint_id
from txjoin.sinks.tasks import (
    TASK_SINKS_PROPERTY,
    TaskSinks,
    encode,
    in_commit_order,
    summarise,
)


@dataclass
class RunConfig:
    """Everything ``txjoin run`` needs besides the job (see ``txjoin run --help``)."""

    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    topic_prefixes: dict[str, str] = field(default_factory=dict)  # source -> prefix overrides
    bootstrap_servers: str | None = None
    starting_offsets: str = "earliest"
    # No batch waits for Delta any more, so a batch is short (~0.3-0.5 s here): a change
    # waits for the next trigger, at most this, before the batch that takes it starts.
    trigger_interval: str = "200 milliseconds"
    max_events_per_trigger: int | None = DEFAULT_MAX_EVENTS_PER_TRIGGER  # None: no limit
    checkpoint_dir: str = ".txjoin/checkpoints"
    output_dir: str = ".txjoin/output"
    master: str = "local[*]"
    postgres_dsn: str | None = None
    until_idle: bool = False
    on_incomplete: str = "fail"
    incomplete_timeout_s: float = 300.0
    spark_conf: dict[str, str] = field(default_factory=dict)
    shards: int | None = None  # None: Spark's default parallelism
    # "sharded": every shard sequences every transaction; "staged": one sequencer stage,
    # then shards that hold only their rows (txjoin/join/staged.py)
    engine: str = SHARDED
    # the staged engine's looked-up tables split by key (lookup aliases, or "all" of those
    # that can be: txjoin/join/placement.py); the rest are copied to every shard
    split: tuple[str, ...] = ()
    # None: no limit (an open transaction spills to the worker's disk: sequence/spill.py)
    max_transaction_bytes: int | None = None
    source: str = "kafka"  # or "files:DIR" (txjoin.ingest.spark.files)
    rebuild: bool = False  # start a new checkpoint and re-derive the sinks from the source
    postgres_retry_timeout_s: float = DEFAULT_RETRY_TIMEOUT_S  # a lost PostgreSQL sink
    maintain_every: int | None = None  # compact the Delta tables every N batches (None: never)
    vacuum_retention_hours: float | None = None  # and VACUUM them (None: no VACUUM)
    metrics_port: int | None = None  # serve Prometheus metrics on this port (None: no)
    delta_commit_interval_s: float = DEFAULT_INTERVAL_S  # at most one Delta commit this often
    delta_handoff_max_batches: int = DEFAULT_MAX_BATCHES  # batches waiting for Delta, at most
    delta_handoff_max_bytes: int = DEFAULT_MAX_BYTES  # their bytes on disk, at most

    def prefixes(self, job: Job) -> dict[str, str]:
        """Source name -> topic prefix for ``job`` (``topic_prefix`` for a single source)."""
        return job.source_prefixes(self.topic_prefix, self.topic_prefixes)

    @property
    def policy(self) -> IncompletePolicy:
        return IncompletePolicy(self.on_incomplete, self.incomplete_timeout_s)  # type: ignore[arg-type]


@dataclass
class BatchReport:
    """What one micro-batch did, for progress displays, the harness and benchmarks."""

    batch_id: int
    records: int
    changes: int
    commit_seq: int
    snapshot_done: bool
    snapshot_released: bool
    waiting: int
    transactions_released: int
    written: dict[str, bool] = field(default_factory=dict)  # sink -> applied (False: replay)
    seconds: float = 0.0  # the whole foreachBatch call (includes computing the batch)
    breakdown: dict[str, float] = field(default_factory=dict)  # where: see stage_seconds
    commit_ts_ms: list[int] = field(default_factory=list)
    finished_at: float = 0.0
    snapshot_rows: int = 0  # snapshot (op=r) rows the batch brought
    state_bytes_written: int = 0  # bytes the shards handed to the state store
    shard_states: list[str] = field(default_factory=list)  # cached/caught-up/restored/new
    # each shard's own figures, by shard number (merge_infos: ``per_shard``)
    per_shard: list[dict[str, Any]] = field(default_factory=list)


def decode_batch(job: Job, frame: pd.DataFrame) -> tuple[pa.Table, dict[str, Any]]:
    """The shards' output for one batch, collected -> (changes table in commit order,
    progress info).

    Each shard sends its changes as Arrow tables (built on the executor; one or more
    rows, in order, the first with its progress: ``shards.changes_columns``). The pipeline
    has the shards write them into the sinks' stages instead (``txjoin.sinks.tasks``).
    """
    info = merge_infos([json.loads(v) for v in frame["info"] if isinstance(v, str)])
    return in_commit_order(list(frame["changes"]), output_schema(job)), info


def stage_seconds(compute_s: float, info: dict[str, Any]) -> dict[str, float]:
    """Where a batch's foreachBatch time went before the sinks, under the stages' names.

    - ``compute``: wall time of computing the batch (Spark runs source -> routing ->
      shuffle -> shards as one job when foreachBatch collects it);
    - ``shard_*``: per stage, the slowest shard's seconds: ``state_load`` (the engine
      from the cache or the state store), ``read_records`` (decoding its routed
      records: the only time a record's JSON is read in Python),
      ``sequence`` (assembly, commit order, frontier: what every shard repeats),
      ``join``, ``state_save`` (its segment to the state store), ``total``.

    ``compute`` includes the shards writing their parts of the batch into the sinks' stages
    (``txjoin.sinks.tasks``). The pipeline adds ``output_decode`` (the shards'
    summaries read), one ``sink_<name>_tasks`` per staged sink (the slowest shard's seconds
    writing its part), one ``sink_<name>`` per sink committed in the batch (PostgreSQL: the
    driver's seconds, preparing the stage and applying it), ``sink_maintain``,
    ``delta_handoff`` (the batch handed off to Delta) and ``delta_backpressure`` (the
    part of it spent waiting for the Delta committer to make room); Spark's planning,
    offset log and state-store commit are in its own progress (``txjoin bench``).
    """
    seconds = {"compute": compute_s}
    seconds.update({f"shard_{k}": v for k, v in info.get("seconds", {}).items()})
    return seconds


def merge_infos(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """One progress record from the shards' (the frontier is the same in every shard).

    The staged engine's sequencer reports through shard 0 (``sequencer``): its seconds are
    added to the slowest shard's per stage (its stage runs before theirs), and it is one
    more task in ``per_shard`` (shard -1, ``stage`` "sequencer"). Its owners report through
    the shard of their number (``owners``): per owner stage, the slowest owner's seconds are
    added alike, and each is a task in ``per_shard`` (``stage`` "owners<depth>")."""
    if not infos:
        return {}
    merged = dict(max(infos, key=lambda i: i["commit_seq"]))
    merged["records"] = sum(i["records"] for i in infos)
    merged["state_bytes_written"] = sum(i.get("state_bytes_written", 0) for i in infos)
    # every shard sees every snapshot row (ShardEngine.batch_snapshot_rows): not a sum
    merged["snapshot_rows"] = max(i.get("snapshot_rows", 0) for i in infos)
    merged["shards"] = len(infos)
    merged["states"] = sorted(i.get("state", "") for i in infos)
    # the slowest shard sets the pace; per stage: the max over shards
    merged["seconds"] = {k: max(i.get("seconds", {}).get(k, 0.0) for i in infos)
                         for k in infos[0].get("seconds", {})}
    # and each shard's own, for what a cluster's batch costs (its slowest task) against the
    # work of all tasks together (``txjoin bench --shard-sweep``)
    tasks = sorted(infos, key=lambda i: i.get("shard", 0))
    sequencer = next((i["sequencer"] for i in infos if i.get("sequencer")), None)
    before: list[dict[str, Any]] = []  # the tasks of the stages before the shards'
    if sequencer is not None:
        before.append({**sequencer, "stage": "sequencer"})
        for stage, seconds in sequencer.get("seconds", {}).items():
            merged["seconds"][stage] = merged["seconds"].get(stage, 0.0) + seconds
    owners = sorted((o for i in infos for o in i.get("owners", ())),
                    key=lambda o: (o["depth"], o["owner"]))
    for depth in sorted({o["depth"] for o in owners}):
        mine = [o for o in owners if o["depth"] == depth]
        before += [{**o, "shard": o["owner"], "stage": f"owners{depth}"} for o in mine]
        for stage in {k for o in mine for k in o.get("seconds", {})}:
            merged["seconds"][stage] = merged["seconds"].get(stage, 0.0) + max(
                o.get("seconds", {}).get(stage, 0.0) for o in mine)
    tasks = [*before, *tasks]
    merged.pop("sequencer", None)
    merged.pop("owners", None)
    merged["per_shard"] = [{k: i[k] for k in PER_SHARD if k in i} for i in tasks]
    return merged


# What a shard reports of itself beside the merged progress (ShardProcessor.handle): its
# stages' wall seconds, its process's CPU seconds over the batch, the rows its state holds,
# its process's peak RSS, the bytes it wrote to the state store and the records it read.
PER_SHARD = ("shard", "stage", "seconds", "cpu_seconds", "state_rows", "peak_rss_mb",
             "state_bytes_written", "records")


ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
STATE_STORE_CONF = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}
"""The stateful operators' store: RocksDB (transformWithState needs it) with changelog
checkpointing (a batch uploads its puts, not the store)."""
LAYOUT_FILE = "txjoin-layout.json"


def check_layout(checkpoint: Path, n_shards: int | None, record: bool = True,
                 engine: str = SHARDED, split: Sequence[str] = ()) -> int:
    """Check (or record) the checkpoint's state layout and shard count; its shuffle partitions.

    A checkpoint written by txjoin 0.1 (one engine value per query) has Spark
    state but no layout file: refused with what to do, like one with another
    shard count (the state is split by shard) or of the other ``--engine``.
    ``n_shards`` None: whatever the checkpoint recorded; ``record=False`` only checks
    (``txjoin run`` before Spark); ``split``: the staged engine's split lookups (the
    owners' state is theirs: another split is refused too).
    """
    marker = checkpoint / LAYOUT_FILE
    layout, continued = (STAGED_LAYOUTS if engine == STAGED
                         else (LAYOUT_VERSION, CONTINUED_LAYOUTS))
    if marker.exists():
        recorded = json.loads(marker.read_text())
        written_by = recorded.get("engine", SHARDED)
        if written_by != engine:
            raise ConfigError(
                f"checkpoint {checkpoint} was written by the {written_by} engine, not the "
                f"{engine} one: run with --engine {written_by} (the state is the engine's), or "
                f"start from a new checkpoint (txjoin run --rebuild)")
        if recorded.get("layout") not in continued:
            raise ConfigError(
                f"checkpoint {checkpoint} has state layout {recorded.get('layout')}, this txjoin "
                f"needs {layout}: {RECOVER}")
        if written_by == STAGED and sorted(recorded.get("split", [])) != sorted(split):
            was = ",".join(recorded.get("split", [])) or "none"
            raise ConfigError(
                f"checkpoint {checkpoint} was written with --split {was}, not "
                f"{','.join(split) or 'none'}: run with --split {was} (a split table's rows "
                f"are held by its owners, a copied one's by every shard), or start from a new "
                f"checkpoint (txjoin run --rebuild)")
        if n_shards is not None and recorded.get("shards") != n_shards:
            raise ConfigError(
                f"checkpoint {checkpoint} was written with --shards {recorded.get('shards')}, "
                f"not {n_shards}: run with --shards {recorded.get('shards')} (the state is split "
                f"by shard), or start from a new checkpoint")
        if record and recorded["layout"] != layout:  # continued: an older txjoin
            marker.write_text(json.dumps({**recorded, "layout": layout}) + "\n")
        return int(recorded.get("partitions", recorded.get("shards")))
    if (checkpoint / "offsets").exists() or (checkpoint / "state").exists():
        raise ConfigError(
            f"checkpoint {checkpoint} was written by an older txjoin (state layout 1: one "
            f"engine value); this txjoin needs layout {layout}: {RECOVER}")
    if not record or n_shards is None:
        return n_shards or 0
    checkpoint.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"layout": layout, "shards": n_shards, "partitions": n_shards,
                                  **({"engine": engine} if engine != SHARDED else {}),
                                  **({"split": list(split)} if split else {})}) + "\n")
    return n_shards


def split_placement(job: Job, config: RunConfig) -> Placement:
    """The staged engine's split lookups (``--split``), checked: a ConfigError names a lookup
    that cannot be split, and those that can."""
    wanted = list(config.split)
    if not wanted:
        return Placement(job)
    if config.engine != STAGED:
        raise ConfigError(f"--split needs --engine staged (the owners are its stages), "
                          f"not --engine {config.engine}")
    possible = splittable(job)
    if wanted == [SPLIT_ALL]:
        wanted = possible
    try:
        placement = Placement(job, wanted)
    except JobError as exc:
        raise ConfigError(f"--split: {exc}") from None
    refused = [a for a in wanted if a not in placement.split]
    if refused:
        raise ConfigError(
            f"--split {','.join(wanted)}: job {job.name} cannot split {','.join(refused)} (a "
            f"lookup on its table's whole primary key of integer, text or uuid columns, its "
            f"table read by no other lookup, below the fact or a split lookup, can); these "
            f"can: {','.join(possible) or 'none'}")
    return placement


def check_kafka(job: Job, config: RunConfig, prefixes: dict[str, str],
                checkpoint: Path | None) -> tuple[KafkaTopics, KafkaFacts]:
    """The job's topics on ``config``'s broker, checked (reachable, every topic there, the
    ``checkpoint``'s partitions as the topics', unless None), and what the shards learn from
    them. No Spark: ``txjoin run`` calls it before starting the session too."""
    if not config.bootstrap_servers:
        raise ConfigError("no bootstrap servers: pass --bootstrap-servers (or set "
                          "TXJOIN_BOOTSTRAP_SERVERS), or start the local stack with "
                          "`txjoin up`")
    transaction_topics = list(job.transaction_topics(prefixes).values())
    topics = KafkaTopics(config.bootstrap_servers, job.all_topics(prefixes), transaction_topics)
    counts = topics.partitions()
    if checkpoint is not None:
        topics.check_checkpoint(checkpoint, counts)
    sources = topics.sources(checkpoint, counts, config.max_events_per_trigger,
                             config.starting_offsets)
    return topics, KafkaFacts(counts, config.max_events_per_trigger, sources)


def check_record_columns(job: Job, prefixes: dict[str, str], topics: KafkaTopics,
                         counts: dict[str, int]) -> None:
    """A declared column that the newest records of its table's topic do not carry, while
    they carry a near name, is a typo in the job file; a declared type the newest record's
    values do not read as (``int`` for '3.60') is a wrong type: one line before anything
    starts, also where the source database is not at hand (its topics are). A column
    missing with no near name is left to the run, whose message covers a column dropped at
    the source."""
    from txjoin.errors import did_you_mean
    from txjoin.ingest.debezium import Position, row_columns

    tables = {t.name: t for t in job.tables}
    by_topic = dict(zip(job.topics(prefixes), (tables[n] for n in job.table_names),
                        strict=True))
    for topic, records in topics.newest_values(list(by_topic), counts).items():
        table = by_topic[topic]
        newest_first = sorted(records, key=lambda r: r[1], reverse=True)
        columns = next((c for c in (row_columns(v, Position(topic, p, o))
                                    for p, o, v in newest_first) if c is not None), None)
        if columns is None:
            continue
        for column in table.columns:
            if column in columns or column in table.defaults:
                continue
            hint = did_you_mean(column, columns)
            if hint:
                raise ConfigError(
                    f"{job.source_file}: table {table.name} has no column {column!r} in the "
                    f"newest records of topic {topic!r}{hint}; its columns: "
                    f"{', '.join(columns)}. Fix the job file's Table columns (nothing was "
                    f"read or written)")
        check_record_types(job, table, topic, newest_first)


def check_record_types(job: Job, table: Table, topic: str,
                       records: list[tuple[int, int, bytes | None]]) -> None:
    """The newest change record of ``records`` (partition, offset, value; newest first) read
    with ``table``'s declared types, as the run will read it: a value its declared type
    cannot read stops the run here, in one line naming the record, the table, column,
    value and declared type, instead of in the first batch behind Spark's traces."""
    from txjoin.ingest.debezium import ChangeEvent, DecodeError, Position, decode
    from txjoin.ingest.types import ColumnValueError

    for partition, offset, value in records:
        try:
            event = decode(value, Position(topic, partition, offset))
        except DecodeError:
            continue  # the run reports it at its position
        row = None if not isinstance(event, ChangeEvent) else (
            event.after if event.after is not None else event.before)
        if row is None:
            continue
        try:
            table.convert_row(row, where=f"{job.source_file}: the newest record of topic "
                                         f"{topic!r} (partition {partition}, offset {offset}):")
        except ColumnValueError as exc:
            raise ConfigError(f"{exc.reason}; declare the column's type as the source has it "
                              f"in the job file's Table (nothing was read or written)"
                              ) from None
        return


class Pipeline:
    """Builds and runs the streaming query for one job."""

    def __init__(self, spark: SparkSession, job: Job, config: RunConfig, sinks: list[Sink],
                 on_batch: Callable[[BatchReport], None] | None = None,
                 on_sink_commit: Callable[[GroupCommit], None] | None = None) -> None:
        self.spark = spark
        # Each source's prefix set on the job: the engine tells sources' markers apart by topic.
        self.prefixes = config.prefixes(job)
        self.job = job.with_source_prefixes(self.prefixes)
        self.config = config
        self.sinks = sinks
        self.on_batch = on_batch
        self.reports: list[BatchReport] = []
        self.schema = output_schema(job)
        self.kafka_facts: KafkaFacts | None = None  # set when Spark's kafka source is used
        self.on_sink_commit = on_sink_commit
        delta = next((s for s in sinks if isinstance(s, DeltaSink)), None)
        self.inline = [s for s in sinks if s is not delta]  # they commit in the batch
        self.committer: GroupCommitter | None = None
        if delta is not None:
            self.committer = GroupCommitter(
                delta, Handoff(self.checkpoint), interval_s=config.delta_commit_interval_s,
                max_batches=config.delta_handoff_max_batches,
                max_bytes=config.delta_handoff_max_bytes, maintain_every=config.maintain_every,
                retention_hours=config.vacuum_retention_hours, on_commit=on_sink_commit)

    @property
    def checkpoint(self) -> str:
        return str(Path(self.config.checkpoint_dir) / self.job.name)

    def kafka_source(self) -> DataFrame:
        """Spark's own ``kafka`` source over the job's topics (two, small topics apart, under
        a read limit: ``txjoin.ingest.spark.kafka``), after checking them and the
        checkpoint; the shards learn the partition counts, the read limit and the sources
        from :attr:`kafka_facts`."""
        from txjoin.ingest.spark.kafka import read_stream

        topics, self.kafka_facts = check_kafka(self.job, self.config, self.prefixes,
                                               Path(self.checkpoint))
        assert self.config.bootstrap_servers is not None
        return read_stream(self.spark, self.config.bootstrap_servers, topics.topics,
                           starting_offsets=self.config.starting_offsets,
                           max_events=self.config.max_events_per_trigger,
                           sources=self.kafka_facts.sources)

    def n_shards(self) -> int:
        """``--shards``, else what the checkpoint was started with, else Spark's parallelism."""
        if self.config.shards:
            return self.config.shards
        marker = Path(self.checkpoint) / LAYOUT_FILE
        if marker.exists():
            with contextlib.suppress(ValueError, KeyError):
                return int(json.loads(marker.read_text())["shards"])
        return int(self.spark.sparkContext.defaultParallelism)

    def build(self, source: DataFrame) -> DataFrame:
        n = self.n_shards()
        if n < 1:
            raise ConfigError(f"--shards must be at least 1, got {n}")
        engine = self.config.engine
        if engine not in ENGINES:
            raise ConfigError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        placement = split_placement(self.job, self.config)
        partitions = check_layout(Path(self.checkpoint), n, engine=engine,
                                  split=placement.split)
        # The stateful operators' store (STATE_STORE_CONF). The shuffle gets one partition
        # per shard; a restarted checkpoint keeps its own partition count.
        for key, value in STATE_STORE_CONF.items():
            self.spark.conf.set(key, value)
        self.spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
        labels = shard_labels(n, partitions)
        token = uuid.uuid4().hex
        if engine == STAGED:
            # each owner stage's labels apart from the shards' and the other stages'
            owner_labels: list[list[int]] = []
            for _depth in range(placement.depths):
                taken = [*labels, *(label for d in owner_labels for label in d)]
                owner_labels.append(shard_labels(n, partitions, taken=taken))
            policy, prefixes = self.config.policy, self.prefixes
            owners = [OwnerProcessor(self.job, labels, policy, prefixes, token, placement,
                                     depth, owner_labels)
                      for depth in range(1, placement.depths + 1)]
            return staged_stages(
                route_staged(source, self.job, prefixes, labels, placement, owner_labels),
                SequencerProcessor(self.job, labels, policy, prefixes, token,
                                   kafka_facts=self.kafka_facts, owner_labels=owner_labels),
                ApplierProcessor(self.job, labels, policy, prefixes, token),
                OUTPUT_SCHEMA, owners=owners)
        processor = ShardProcessor(self.job, labels, self.config.policy,
                                   self.prefixes, token,
                                   kafka_facts=self.kafka_facts,
                                   max_transaction_bytes=self.config.max_transaction_bytes)
        return (route(source, self.job, self.prefixes, labels)
                .groupBy("shard")
                .transformWithStateInPandas(processor, OUTPUT_SCHEMA, "Append", "None"))

    def _write(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        checkpoint = checkpoint_id(self.checkpoint)
        # The stages first (a sink holding the batch already has none: Spark re-ran it);
        # then one Spark job computes the batch and its tasks write their parts of it.
        staged_sinks = [s for s in self.inline if isinstance(s, StagedSink)]
        direct = [s for s in self.inline if not isinstance(s, StagedSink)]
        stages: dict[str, Any] = {}
        prepare: dict[str, float] = {}
        prepare_cpu: dict[str, float] = {}
        for staged_sink in staged_sinks:
            before, cpu = time.monotonic(), time.thread_time()
            stage = staged_sink.stage(batch_id, checkpoint)
            prepare[staged_sink.name] = time.monotonic() - before
            prepare_cpu[staged_sink.name] = time.thread_time() - cpu
            if stage is not None:
                stages[staged_sink.name] = stage
        delta = None if self.committer is None else self.committer.sink
        if isinstance(delta, DeltaSink):  # the tasks write its data files too
            before = time.monotonic()
            delta_stage = delta.stage(batch_id, checkpoint)
            prepare[delta.name] = time.monotonic() - before
            if delta_stage is not None:
                stages[delta.name] = delta_stage
        keep_rows = bool(direct)
        computing = time.monotonic()
        facts = self.kafka_facts
        limited = facts is not None and facts.max_events is not None
        context = self.spark.sparkContext
        # The job below runs on this thread, so its tasks get these properties: the stages
        # the shards write their output into (txjoin.sinks.tasks), and, under a read limit,
        # what the batch was planned to read, for the shards' caught-up rule.
        properties = {TASK_SINKS_PROPERTY: encode(TaskSinks(stages, keep_rows))}
        if limited:
            properties[OFFSET_SPANS_PROPERTY] = json.dumps(
                batch_offset_spans(Path(self.checkpoint), batch_id), sort_keys=True)
        for name, value in properties.items():
            context.setLocalProperty(name, value)
        try:
            summary = summarise(df.toArrow(), self.schema, keep_rows)
        finally:
            for name in properties:
                context.setLocalProperty(name, None)  # type: ignore[arg-type]
        computed = time.monotonic()
        if DeltaSink.name in stages:  # tests only: Delta's files written, neither committed
            crashpoints.reached(crashpoints.DELTA_STAGED, batch_id)  # nor handed off
        info = merge_infos(summary.infos)
        breakdown = stage_seconds(computed - computing, info)
        breakdown["output_decode"] = time.monotonic() - computed
        for name, seconds in summary.task_seconds.items():
            breakdown[f"sink_{name}_tasks"] = seconds
        written = {}
        commit_seq = int(info.get("commit_seq", self.reports[-1].commit_seq
                                  if self.reports else 0))
        frontier = info.get("commit_seq")  # absent: the sinks keep the frontier they hold
        lineage = Lineage(checkpoint, None if frontier is None else int(frontier))
        commit_ts_ms = summary.commit_ts_ms

        # The inline sinks are independent (each commits the batch once, and skips a batch
        # it already holds when Spark re-runs it): they commit at the same time.
        def write(sink: Sink) -> tuple[bool, float, float]:
            before, cpu = time.monotonic(), time.thread_time()
            if not isinstance(sink, StagedSink):
                assert summary.changes is not None
                applied = sink.write(batch_id, summary.changes, lineage=lineage)
            elif sink.name in stages:
                applied = sink.apply(stages[sink.name], summary.staged.get(sink.name, []),
                                     lineage)
            else:
                applied = False  # it held the batch before the tasks ran
            crashpoints.reached(crashpoints.FIRST_SINK, batch_id)  # tests only
            return (applied, time.monotonic() - before + prepare.get(sink.name, 0.0),
                    time.thread_time() - cpu + prepare_cpu.get(sink.name, 0.0))

        with ThreadPoolExecutor(max_workers=len(self.inline) or 1,
                                thread_name_prefix="txjoin-sink") as pool:
            futures = [(sink.name, pool.submit(write, sink)) for sink in self.inline]
            for name, future in futures:  # the first error (in sink order) stops the batch
                written[name], breakdown[f"sink_{name}"], cpu = future.result()
                self._sink_committed(name, batch_id, summary.rows, commit_ts_ms,
                                     breakdown[f"sink_{name}"], written[name], cpu)
        if self.committer is not None:
            # What the tasks wrote (none: the sink held the batch), durable before
            # foreachBatch returns (Spark then records the batch as done); waits only when
            # the hand-off is full (Delta behind: backpressure).
            before = time.monotonic()
            breakdown["delta_backpressure"] = self.committer.put(Parcel(
                batch_id, pa.table({}), lineage, time.time(),
                tuple(summary.staged.get(DeltaSink.name, ())),
                tuple(commit_ts_ms) if DeltaSink.name in stages else ()))
            breakdown["delta_handoff"] = time.monotonic() - before + prepare.get(
                DeltaSink.name, 0.0)
            written["delta"] = True  # handed off; the committer reports its commits
        every = self.config.maintain_every
        if self.inline and every is not None and (batch_id + 1) % every == 0:
            # Between two batches: no writer of ours runs beside the upkeep (Delta's runs
            # on its committer, between two group commits).
            before = time.monotonic()
            for sink in self.inline:
                sink.maintain(self.config.vacuum_retention_hours)
            breakdown["sink_maintain"] = time.monotonic() - before
        report = BatchReport(
            batch_id=batch_id, records=int(info.get("records", 0)), changes=summary.rows,
            commit_seq=commit_seq,
            snapshot_done=bool(info.get("snapshot_done", False)),
            snapshot_released=bool(info.get("snapshot_released", False)),
            waiting=int(info.get("waiting", 0)),
            transactions_released=int(info.get("released", 0)), written=written,
            seconds=time.monotonic() - started, breakdown=breakdown,
            commit_ts_ms=commit_ts_ms, finished_at=time.time(),
            snapshot_rows=int(info.get("snapshot_rows", 0)),
            state_bytes_written=int(info.get("state_bytes_written", 0)),
            shard_states=list(info.get("states", [])),
            per_shard=list(info.get("per_shard", [])))
        self.reports.append(report)
        if self.on_batch is not None:
            self.on_batch(report)
        crashpoints.reached(crashpoints.SINKS_COMMITTED, batch_id)  # tests only

    def _sink_committed(self, name: str, batch_id: int, changes: int, commit_ts_ms: list[int],
                        seconds: float, applied: bool, cpu_seconds: float) -> None:
        if self.on_sink_commit is None:
            return
        now = time.time()
        self.on_sink_commit(GroupCommit(
            first_batch=batch_id, last_batch=batch_id, batches=1, changes=changes,
            commit_ts_ms=commit_ts_ms if applied else [], started_at=now - seconds,
            finished_at=now, seconds={"commit": seconds}, oldest_handed_at=now,
            wrote=applied, sink=name, cpu_seconds=cpu_seconds))

    def recover(self) -> GroupCommit | None:
        """Commit to Delta what a stopped or killed run handed off (before a query starts,
        and before the sinks' lineage is compared with the checkpoint)."""
        return None if self.committer is None else self.committer.recover()

    def flush(self) -> None:
        """Commit every batch handed off so far to Delta now and wait (a reader of the Delta
        tables then sees the last batch); raises the committer's error."""
        if self.committer is not None:
            self.committer.flush()

    def close(self) -> None:
        """Stop the Delta committer, leaving what it could not commit for the next run."""
        if self.committer is not None:
            self.committer.close(flush=False)

    def start(self, source: DataFrame, *, available_now: bool = False,
              query_name: str | None = None) -> PipelineQuery:
        """Start the query (after committing what an earlier run left to Delta) and the
        Delta committer; the query's end waits for Delta to catch up."""
        self.recover()
        if self.committer is not None:
            self.committer.start()
        writer = (self.build(source).writeStream
                  .foreachBatch(self._write)
                  .option("checkpointLocation", self.checkpoint)
                  .outputMode("append"))
        if query_name:
            writer = writer.queryName(query_name)
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=self.config.trigger_interval)
        return PipelineQuery(writer.start(), self.committer)


class PipelineQuery:
    """The streaming query, whose end also waits for Delta to catch up.

    ``awaitTermination`` (once the query ended) and ``stop`` return after the Delta
    committer committed every batch handed off, and raise its error; an error in the
    committer while the query waits for data stops the query with that error.
    Everything else is the ``StreamingQuery``'s.
    """

    def __init__(self, query: StreamingQuery, committer: GroupCommitter | None) -> None:
        self.query = query
        self._committer = committer

    def _failed(self) -> BaseException | None:
        return None if self._committer is None else self._committer.error

    def awaitTermination(self, timeout: int | None = None) -> bool | None:
        try:
            ended = (self.query.awaitTermination() if timeout is None
                     else self.query.awaitTermination(timeout))
        except BaseException:
            if self._committer is not None and self._committer.error is not None:
                raise self._committer.error from None  # the cause of the query's failure
            raise
        if ended is None or ended:
            if self._committer is not None:
                self._committer.flush()
        elif self._failed() is not None:  # Delta failed while the query had nothing to do
            self.query.stop()
            raise self._failed()  # type: ignore[misc]
        return ended

    def stop(self) -> None:
        self.query.stop()
        if self._committer is not None:
            self._committer.flush()

    def exception(self) -> Any:
        failed = self._failed()
        return failed if failed is not None else self.query.exception()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.query, name)
