"""The streaming pipeline: source -> decode/assemble/order/join (stateful) -> sinks.

Shape of the query::

    source (txjoin_kafka | txjoin_replay): topic, partition, offset, key, value
      -> groupBy(constant).applyInPandasWithState(core Engine)   # one Python call per batch
      -> foreachBatch: Delta + PostgreSQL sinks, each one commit per batch

Why one state group: the frontier and the join need every transaction in
commit order, so their state is global; keying assembly by an xid bucket would
only move the same events through a second stateful stage. One group means
Python is called exactly once per micro-batch (the per-call cost measured in
DESIGN §4 is paid once), and the core processes the whole batch vectorised.
The engine's state (open transactions, frontier, current rows, last outputs)
is one binary value in Spark's state store, checkpointed with the source
offsets; the sinks are idempotent by batch id. After a crash at any point
Spark re-runs the last batch from the previous state with the same input and
the engine, being deterministic, produces the same changes, which the sinks
skip if they already hold them: nothing lost, nothing applied twice.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from txjoin.core.assembly import IncompletePolicy
from txjoin.core.engine import TRANSACTION_STREAM, Engine
from txjoin.core.join import OutputChange
from txjoin.core.output import changes_to_table, output_schema, row_from_json, row_to_json
from txjoin.job import Job
from txjoin.sinks import Sink
from txjoin.sinks.lineage import Lineage, checkpoint_id

STATE_SCHEMA = "engine binary"

# Python workers are reused between micro-batches: keep the engine of the last
# batch, keyed by the query's state function, with the digest of the state it
# saved. When Spark hands back exactly that state (the normal case) the engine
# is reused instead of unpickled; after a failure or a re-run the digests differ
# and the engine is restored from the checkpointed state as usual.
_ENGINES: dict[str, tuple[bytes, Engine]] = {}


def _digest(blob: bytes) -> bytes:
    return hashlib.blake2b(blob, digest_size=16).digest()
OUTPUT_SCHEMA = ("kind string, seq long, key string, row string, op string, commit_seq long, "
                 "xid long, commit_ts_ms long, info string")


@dataclass
class RunConfig:
    """Everything ``txjoin run`` needs besides the job (see ``txjoin run --help``)."""

    topic_prefix: str = "shop"
    bootstrap_servers: str | None = None
    starting_offsets: str = "earliest"
    trigger_interval: str = "1 second"
    max_events_per_trigger: int | None = None
    checkpoint_dir: str = ".txjoin/checkpoints"
    output_dir: str = ".txjoin/output"
    master: str = "local[*]"
    postgres_dsn: str | None = None
    until_idle: bool = False
    on_incomplete: str = "fail"
    incomplete_timeout_s: float = 300.0
    spark_conf: dict[str, str] = field(default_factory=dict)
    rebuild: bool = False  # start a new checkpoint and re-derive the sinks from the source
    postgres_retry_timeout_s: float = 60.0  # how long a lost PostgreSQL sink is retried

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
    breakdown: dict[str, float] = field(default_factory=dict)  # where the seconds went
    commit_ts_ms: list[int] = field(default_factory=list)
    finished_at: float = 0.0


def make_state_function(job: Job, policy: IncompletePolicy, prefix: str,
                        always_caught_up: bool = False
                        ) -> Callable[[Any, Iterator[pd.DataFrame], GroupState],
                                      Iterator[pd.DataFrame]]:
    """The function Spark calls (once per micro-batch) with all the batch's records.

    ``always_caught_up``: the source reads every topic to its end in every batch
    but sends no caught-up markers (Spark's native ``kafka`` format without a
    per-trigger limit).
    """
    every_stream = {*job.table_names, TRANSACTION_STREAM}

    token = uuid.uuid4().hex  # one per query start: a restarted query never reuses a cache

    def tables_of(topics: Any) -> set[str]:
        return {t.removeprefix(prefix + ".") for t in topics}

    def process(key: Any, frames: Iterator[pd.DataFrame], state: GroupState
                ) -> Iterator[pd.DataFrame]:
        started = time.perf_counter()
        # Through the imported module: a global captured by this (pickled) closure
        # would arrive as a fresh copy with every task.
        engines: dict[str, tuple[bytes, Engine]] = importlib.import_module(__name__)._ENGINES
        blob = state.get[0] if state.exists else None
        cached = engines.pop(token, None)
        reused = cached is not None and blob is not None and cached[0] == _digest(blob)
        if reused:
            engine = cached[1]  # type: ignore[index]
        else:
            engine = Engine.from_state(job, blob) if blob is not None else Engine(job, policy)
        restored = time.perf_counter()
        frame = pd.concat(list(frames), ignore_index=True)
        markers = frame["offset"] < 0
        caught = every_stream if always_caught_up else tables_of(frame.loc[markers, "topic"])
        released_before = engine.stats.transactions_released
        processing = time.perf_counter()
        changes = engine.process(frame.loc[~markers], caught_up=caught)
        processed = time.perf_counter()
        saved = engine.state_bytes()
        state.update((saved,))
        engines[token] = (_digest(saved), engine)
        info = {"records": int((~markers).sum()), "commit_seq": engine.commit_seq,
                "snapshot_done": engine.assembler.snapshot.done,
                "snapshot_released": engine.snapshot_released, "waiting": engine.waiting,
                "released": engine.stats.transactions_released - released_before,
                "duplicates": engine.assembler.duplicates,
                "skipped": list(engine.frontier.skipped), "engine_reused": reused,
                "seconds": {"state_restore": restored - started, "engine": processed - processing,
                            "state_save": time.perf_counter() - processed}}
        yield _changes_frame(changes, info)

    return process


def _changes_frame(changes: list[OutputChange], info: dict[str, Any]) -> pd.DataFrame:
    rows: list[tuple[Any, ...]] = [
        ("change", n, json.dumps(list(ch.key), default=str), row_to_json(ch.row), ch.op,
         ch.commit_seq, ch.xid, ch.commit_ts_ms, None) for n, ch in enumerate(changes)]
    rows.append(("progress", len(changes), None, None, None, info["commit_seq"], None, None,
                 json.dumps(info)))
    return pd.DataFrame(rows, columns=["kind", "seq", "key", "row", "op", "commit_seq", "xid",
                                       "commit_ts_ms", "info"])


def decode_batch(job: Job, frame: pd.DataFrame) -> tuple[pa.Table, dict[str, Any]]:
    """The stateful stage's output for one batch -> (changes table, progress info)."""
    progress = frame[frame["kind"] == "progress"]
    info: dict[str, Any] = json.loads(progress["info"].iloc[0]) if len(progress) else {}
    data = frame[frame["kind"] == "change"].sort_values(["commit_seq", "seq"])
    changes, rows = [], []
    for key, row, op, seq, xid, ts in zip(data["key"], data["row"], data["op"],
                                          data["commit_seq"], data["xid"], data["commit_ts_ms"],
                                          strict=True):
        changes.append(OutputChange(tuple(json.loads(key)), op, None, int(seq), int(xid),
                                    None if pd.isna(ts) else int(ts)))
        rows.append(row_from_json(row))
    return changes_to_table(job, changes, rows), info


def native_kafka_available(spark: SparkSession) -> bool:
    """Whether Spark's own ``kafka`` format (spark-sql-kafka) is on the classpath."""
    try:
        spark._jvm.org.apache.spark.util.Utils.classForName(  # type: ignore[union-attr]
            "org.apache.spark.sql.kafka010.KafkaSourceProvider", True, False)
        return True
    except Exception:
        return False


def build_sinks(job: Job, config: RunConfig, spark: SparkSession | None = None,
                pg_table_suffix: str | None = None) -> list[Sink]:
    """Delta always (delta-spark when the session has its extension, else delta-rs);
    PostgreSQL when a DSN is configured (``pg_table_suffix`` keeps several runs, e.g.
    scenarios, apart in one database)."""
    from txjoin.sinks.delta import DeltaSink, DeltaSparkSink

    schema = output_schema(job)
    keys = list(job.output.key)
    sinks: list[Sink] = []
    extensions = spark.conf.get("spark.sql.extensions", "") if spark is not None else ""
    if spark is not None and "DeltaSparkSessionExtension" in (extensions or ""):
        sinks.append(DeltaSparkSink(spark, config.output_dir, job.output.table, job.name, keys,
                                    schema))
    else:
        sinks.append(DeltaSink(config.output_dir, job.output.table, job.name, keys, schema))
    if config.postgres_dsn:
        from txjoin.sinks.postgres import PostgresSink

        table, name = job.output.table, job.name
        if pg_table_suffix:
            table = f"{table[:63 - len('_changelog') - len(pg_table_suffix) - 1]}_{pg_table_suffix}"
            name = f"{name}:{pg_table_suffix}"
        sinks.append(PostgresSink(config.postgres_dsn, table, name, keys, schema,
                                  retry_timeout_s=config.postgres_retry_timeout_s))
    return sinks


class Pipeline:
    """Builds and runs the streaming query for one job."""

    def __init__(self, spark: SparkSession, job: Job, config: RunConfig, sinks: list[Sink],
                 on_batch: Callable[[BatchReport], None] | None = None) -> None:
        self.spark = spark
        self.job = job
        self.config = config
        self.sinks = sinks
        self.on_batch = on_batch
        self.reports: list[BatchReport] = []
        self.schema = output_schema(job)
        self.always_caught_up = False  # set when the native kafka format is the source

    @property
    def checkpoint(self) -> str:
        return str(Path(self.config.checkpoint_dir) / self.job.name)

    def kafka_source(self) -> DataFrame:
        from txjoin.spark.sources.kafka import read_stream

        if not self.config.bootstrap_servers:
            from txjoin.errors import ConfigError
            raise ConfigError("no bootstrap servers: pass --bootstrap-servers (or set "
                              "TXJOIN_BOOTSTRAP_SERVERS), or start the local stack with "
                              "`txjoin up`")
        prefix = self.config.topic_prefix
        topics = [*self.job.topics(prefix), f"{prefix}.transaction"]
        if self.config.max_events_per_trigger is None and native_kafka_available(self.spark):
            return self._native_kafka_source(topics, f"{prefix}.transaction")
        return read_stream(self.spark, self.config.bootstrap_servers, topics,
                           transaction_topic=f"{prefix}.transaction",
                           starting_offsets=self.config.starting_offsets,
                           max_events=self.config.max_events_per_trigger)

    def _native_kafka_source(self, topics: list[str], transaction_topic: str) -> DataFrame:
        """Spark's own ``kafka`` format, when spark-sql-kafka is on the classpath.

        Only without a per-trigger limit: then every batch reads every topic to the
        end offsets of its planning, which is what the core's caught-up rule needs
        and this format cannot report. Not testable here (the jar is unreachable).
        """
        from txjoin.spark.sources.kafka import KafkaSourceConfig, KafkaStreamReader

        assert self.config.bootstrap_servers is not None
        # Same checks as txjoin_kafka: the topics exist, the transaction topic has one
        # partition, the brokers answer.
        KafkaStreamReader(KafkaSourceConfig(self.config.bootstrap_servers, tuple(topics),
                                            transaction_topic=transaction_topic)).initialOffset()
        self.always_caught_up = True
        return (self.spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", self.config.bootstrap_servers)
                .option("subscribe", ",".join(topics))
                .option("startingOffsets", self.config.starting_offsets)
                .option("failOnDataLoss", "true").load()
                .selectExpr("topic", "partition", "offset", "CAST(key AS STRING) AS key",
                            "CAST(value AS STRING) AS value", "timestamp"))

    def build(self, source: DataFrame) -> DataFrame:
        fn = make_state_function(self.job, self.config.policy, self.config.topic_prefix,
                                 always_caught_up=self.always_caught_up)
        return (source.withColumn("_group", F.lit(0))
                .groupBy("_group")
                .applyInPandasWithState(fn, OUTPUT_SCHEMA, STATE_SCHEMA, "append",
                                        GroupStateTimeout.NoTimeout))

    def _write(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        frame = df.toPandas()
        computed = time.monotonic()
        table, info = decode_batch(self.job, frame)
        breakdown = {f"python_{k}": v for k, v in info.get("seconds", {}).items()}
        breakdown["source_and_stateful"] = computed - started
        breakdown["decode_output"] = time.monotonic() - computed
        written = {}
        commit_seq = int(info.get("commit_seq", self.reports[-1].commit_seq
                                  if self.reports else 0))
        frontier = info.get("commit_seq")  # absent: the sinks keep the frontier they hold
        lineage = Lineage(checkpoint_id(self.checkpoint),
                          None if frontier is None else int(frontier))
        for sink in self.sinks:
            before = time.monotonic()
            written[sink.name] = sink.write(batch_id, table, lineage=lineage)
            breakdown[f"sink_{sink.name}"] = time.monotonic() - before
        report = BatchReport(
            batch_id=batch_id, records=int(info.get("records", 0)), changes=table.num_rows,
            commit_seq=commit_seq,
            snapshot_done=bool(info.get("snapshot_done", False)),
            snapshot_released=bool(info.get("snapshot_released", False)),
            waiting=int(info.get("waiting", 0)),
            transactions_released=int(info.get("released", 0)), written=written,
            seconds=time.monotonic() - started, breakdown=breakdown,
            commit_ts_ms=[int(v.timestamp() * 1000) for v in
                          table.column("_commit_ts").to_pylist() if v is not None],
            finished_at=time.time())
        self.reports.append(report)
        if self.on_batch is not None:
            self.on_batch(report)

    def start(self, source: DataFrame, *, available_now: bool = False,
              query_name: str | None = None) -> StreamingQuery:
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
        return writer.start()
