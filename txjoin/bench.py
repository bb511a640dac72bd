"""``txjoin bench``: throughput and latency of the whole pipeline, and of its ceiling.

1. Generate a pizzeria workload of N transactions (mixed sizes, ~5 events
   each) after a snapshot of ``--snapshot-orders`` orders, and synthesize the
   Debezium records. ``--source kafka`` produces them into a fresh Apache Kafka
   broker and reads them with Spark's own kafka source, ``--max-events-per-trigger``
   being its ``maxOffsetsPerTrigger``; ``--source replay`` writes them as a replay
   schedule of ``--max-events-per-trigger`` records per micro-batch (no broker: the
   engine measured apart from it).
2. Full pipeline: source -> routing in the JVM -> ``--shards`` shards
   (transformWithStateInPandas: decode, sequence, join) -> Delta + PostgreSQL
   sinks, ``availableNow``.
3. Ceilings, measured before the pipeline, after a warm-up pass: the source
   alone; the source with one Python stage that does nothing (what handing
   every record to a Python worker and back costs, once: the shards pay it); the
   source and the same routing stage (the ceiling of what reaches the shards),
   each drained into Spark's ``noop`` sink and nothing else.

Prints and writes to a JSON file: source events/s, transactions/s,
micro-batch latency p50/p99 (and p50 of batches without snapshot rows), where
a batch's time goes per stage (``stage_seconds_p50``/``_mean``, and every batch
under ``batches``: Spark's planning, offset log and state-store commit, the
computation of the batch with each shard stage's share, each
sink; see :func:`batch_stages`), the initial snapshot's load rate, state bytes
written per batch, peak RSS of the driver (this Python process and Spark's JVM,
not the broker's), of the executors' JVMs where they are apart from it (``--master
'local-cluster[2,1,1024]'``: as on a cluster; on ``local[N]`` the driver's JVM runs the
tasks) and of the Python workers with the shards' hosts while the pipeline runs, and the
ratio to the ceiling. The workload is built, written to the
broker (or the replay schedule) and its reference output computed in a child
process forked before Spark starts (``harness_rss_mb``: what this process holds
then). Not a test: numbers, not verdicts.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import shutil
import statistics
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import psutil

from txjoin.errors import ConfigError
from txjoin.ingest.debezium import transaction_topic
from txjoin.job import Job, load_job
from txjoin.join import ENGINES, SHARDED
from txjoin.join.engine import Engine
from txjoin.join.placement import parse_split
from txjoin.join.spark import host as shard_host
from txjoin.peers import PEERS
from txjoin.pipeline.metrics import quantile
from txjoin.scenarios.synthesize import Synthesizer
from txjoin.scenarios.workload import pizzeria_workload
from txjoin.sequence.assembly import TopicPartitions
from txjoin.sinks.handoff import GroupCommit

JOB = Path(__file__).resolve().parents[1] / "jobs" / "orders.py"


SPARK_SUBMIT = "org.apache.spark.deploy.SparkSubmit"  # the main class of PySpark's JVM
EXECUTOR = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
"""The main class of an executor's own JVM (``--master local-cluster[...]``, as on a cluster);
on ``local[N]`` the driver's JVM runs the tasks and there is none."""


class RssSampler:
    """Peak RSS of this process + its Spark JVM (the driver), of the executors' JVMs where
    they have their own (``local-cluster``), and of Spark's Python workers with the shards'
    hosts they start."""

    def __init__(self) -> None:
        self.driver = 0
        self.driver_python = 0  # of which this process, and Spark's JVM (peaks apart)
        self.driver_jvm = 0
        self.executors = 0  # every executor JVM together (none on local[N])
        self.workers = 0
        self.hosts = 0  # of which the shards' hosts (peaks need not coincide)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            try:
                kids = me.children(recursive=True)
                # Spark's JVM, not the broker's (also a child of this process)
                jvms = [(p, p.cmdline()) for p in kids if "java" in p.name()]
                jvm = sum(p.memory_info().rss for p, line in jvms if SPARK_SUBMIT in line)
                executors = sum(p.memory_info().rss for p, line in jvms if EXECUTOR in line)
                pids = {p.pid for p in kids}
                # The shards' hosts (join/spark/host.py), also when their worker has gone
                hosts = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in pids
                         and shard_host.__name__ in (p.info["cmdline"] or [])]
                pythons = [p for p in [*kids, *hosts] if "python" in p.name()]
                workers = sum(p.memory_info().rss for p in pythons)
                in_hosts = sum(p.memory_info().rss for p in pythons
                               if shard_host.__name__ in p.cmdline())
                mine = me.memory_info().rss
                self.driver = max(self.driver, mine + jvm)
                self.driver_python = max(self.driver_python, mine)
                self.driver_jvm = max(self.driver_jvm, jvm)
                self.executors = max(self.executors, executors)
                self.workers = max(self.workers, workers)
                self.hosts = max(self.hosts, in_hosts)
            except psutil.Error:
                pass
            self._stop.wait(0.2)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def produce(bootstrap: str, records: list[tuple[str, str | None, str | None]],
            partitions: list[int] | None = None) -> float:
    """Write (topic, key, value) records (to ``partitions[i]``, else partition 0) with the
    producer's normal batching, as Kafka Connect does; seconds."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "enable.idempotence": True, "queue.buffering.max.messages": 1_000_000})
    started = time.monotonic()
    for i, (topic, key, value) in enumerate(records):
        partition = partitions[i] if partitions is not None else 0
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=partition)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    return time.monotonic() - started


def _identity(batches: Iterator[Any]) -> Iterator[Any]:
    yield from batches


def key_partition(key: str | None, partitions: int) -> int:
    """The partition of a record with ``key`` in a topic of ``partitions`` (stable across
    processes: a row's changes, which share the key, share the partition)."""
    return zlib.crc32((key or "").encode()) % partitions


def spread(produced: list[Any], partitions: int, transaction_topic: str
           ) -> list[tuple[str, int, int, str | None, str | None]]:
    """(topic, partition, offset, key, value) of the produced records, each table topic over
    ``partitions`` partitions by record key (as Kafka's default partitioner does for
    Debezium: a row's changes stay in one partition), the transaction topic in one."""
    rows = []
    offsets: dict[tuple[str, int], int] = {}
    for r in produced:
        part = 0
        if partitions > 1 and r.topic != transaction_topic:
            part = key_partition(r.key, partitions)
        offset = offsets.get((r.topic, part), 0)
        offsets[(r.topic, part)] = offset + 1
        rows.append((r.topic, part, offset, r.key, r.value))
    return rows


def replay_schedule(rows: list[tuple[str, int, int, str | None, str | None]], max_events: int
                    ) -> Iterator[tuple[list, list, dict[str, list[int]]]]:
    """The records in production order, ``max_events`` per micro-batch; a topic (or a
    partition of a topic with several) is caught up in a batch when none of its records
    comes later."""
    from txjoin.ingest.spark.replay import add_partition_counts

    last: dict[str, int] = {}
    last_part: dict[tuple[str, int], int] = {}
    for i, r in enumerate(rows):
        last[r[0]] = i
        last_part[(r[0], r[1])] = i
    several: dict[str, int] = {}  # as the replay source declares them
    add_partition_counts(several, rows)
    for start in range(0, len(rows), max_events):
        chunk = rows[start:start + max_events]
        end = start + len(chunk)
        parts = {t: [p for p in range(n) if last_part.get((t, p), -1) < end]
                 for t, n in several.items()}
        yield chunk, sorted(t for t, i in last.items() if i < end), parts


def batch_stages(breakdown: dict[str, float], progress: dict[str, Any] | None
                 ) -> dict[str, float]:
    """One batch's seconds per stage: the pipeline's own (``pipeline.stage_seconds``, the
    sinks') and Spark's from its progress: ``planning`` (latest offsets, getBatch, query
    planning), ``offset_log`` (the offset log and the commit log), ``state_commit`` (the
    state store's commit, summed over the stateful tasks) and ``trigger`` (the whole
    micro-batch, as Spark timed it)."""
    stages = dict(breakdown)
    if progress is not None:
        ms = progress.get("durationMs", {})
        stages["planning"] = sum(ms.get(k, 0) for k in ("latestOffset", "getBatch",
                                                        "queryPlanning")) / 1000
        stages["offset_log"] = sum(ms.get(k, 0) for k in ("walCommit", "commitOffsets")) / 1000
        stages["state_commit"] = sum(op.get("commitTimeMs", 0) for op in
                                     progress.get("stateOperators", [])) / 1000
        stages["trigger"] = ms.get("triggerExecution", 0) / 1000
    return stages


def stage_names(stages: list[dict[str, float]]) -> list[str]:
    """Every stage any batch reports, in first-seen order (a missing one counts as 0)."""
    names = list(dict.fromkeys(k for b in stages for k in b))
    for b in stages:
        for k in names:
            b.setdefault(k, 0.0)
    return names


def reference_keys(job: Job, rows: list[tuple[str, int, int, str | None, str | None]],
                   partitions: int) -> set[tuple[Any, ...]]:
    """The output keys the pipeline must end with, by the core engine alone (the oracle
    scans, quadratic: for tests)."""
    reference = Engine(job)
    reference.process([(t, p, o, v) for t, p, o, _, v in rows],
                      caught_up=[*job.table_names, "transaction"],
                      partitions=TopicPartitions(dict.fromkeys(job.table_names, partitions))
                      if partitions > 1 else None)
    return set(reference.outputs())


def prepare_workload(transactions: int, seed: int, snapshot_orders: int, partitions: int,
                     max_events: int, bootstrap: str | None, schedule: str,
                     also_jobs: Sequence[Path] = ()) -> dict[str, Any]:
    """Build the workload and write it to the broker at ``bootstrap`` (topics created) or,
    without one, as a replay schedule in ``schedule``; return its counts, ``topics`` and the
    ``expected`` output keys (by the core engine alone), and each of ``also_jobs``' in
    ``also_expected``."""
    from txjoin.ingest.spark.replay import write_schedule_dir
    from txjoin.stack.broker import create_topics

    job = load_job(JOB)
    snapshot, txs = pizzeria_workload(transactions, seed, snapshot_orders=snapshot_orders)
    synth = Synthesizer(job)
    produced = list(synth.snapshot(snapshot))
    for tx in txs:
        produced.extend(synth.transaction(tx))
    made: dict[str, Any] = {
        "transactions": len(txs), "records": len(produced),
        "data_events": sum(1 for r in produced if r.kind in ("data", "snapshot"))}
    click.echo(f"workload: {made['transactions']} transactions after a snapshot of "
               f"{snapshot_orders} orders, {made['data_events']} data events, "
               f"{made['records']} records (with BEGIN/END and tombstones)")
    topics = list(synth.topics)
    synth_prefix = synth.prefix
    tx_topic = transaction_topic(synth_prefix)
    rows = spread(produced, partitions, tx_topic)
    del produced, synth, snapshot, txs
    if bootstrap is not None:
        create_topics(bootstrap, [tx_topic])
        create_topics(bootstrap, [t for t in topics if t != tx_topic], partitions=partitions)
        produce_s = produce(bootstrap, [(t, k, v) for t, _, _, k, v in rows],
                            [row[1] for row in rows])
        made["produce_records_per_s"] = round(len(rows) / produce_s)
        click.echo(f"produced in {produce_s:.1f}s")
    else:
        batches = write_schedule_dir(schedule, replay_schedule(rows, max_events))
        click.echo(f"replay schedule: {batches} micro-batches of <= {max_events} records")
    return {**made, "topics": topics, "prefix": synth_prefix,
            "expected": reference_keys(job, rows, partitions),
            "also_expected": {str(p): reference_keys(load_job(p), rows, partitions)
                              for p in also_jobs}}


def sinks_hold(job: Job, sinks: Sequence[Any], expected: set[tuple[Any, ...]]) -> bool:
    """Whether every sink's current table holds exactly the ``expected`` output keys;
    closes the sinks."""
    keys = list(job.output.key)
    try:
        return all({tuple(r[k] for k in keys) for r in sink.read_current()} == expected
                   for sink in sinks)
    finally:
        for sink in sinks:
            sink.close()


def release_memory() -> int:
    """Collect, and hand freed heap back to the OS (glibc keeps it otherwise); RSS in MB."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return round(psutil.Process().memory_info().rss / 2**20)


def run_bench(transactions: int, max_events: int, seed: int, out: Path, master: str,
              keep: bool = False, snapshot_orders: int = 0, source_kind: str = "kafka",
              shards: int | None = None, partitions: int = 1,
              also_jobs: Sequence[Path] = (), api_vs_run: bool = False,
              engine: str = SHARDED, split: tuple[str, ...] = ()) -> dict[str, Any]:
    from pyspark.sql import DataFrame

    from txjoin.ingest.spark.kafka import read_stream
    from txjoin.ingest.spark.replay import SOURCE_NAME, ReplaySource
    from txjoin.join.spark.routing import route
    from txjoin.join.spark.shards import shard_labels
    from txjoin.pipeline.pipeline import Pipeline, RunConfig
    from txjoin.pipeline.session import get_session
    from txjoin.sinks.build import build_sinks
    from txjoin.stack.broker import start_broker, stop_broker
    from txjoin.stack.postgres import data_root, dsn, start_postgres, stop_postgres
    from txjoin.stack.processes import free_port

    job = load_job(JOB)
    work = Path(tempfile.mkdtemp(prefix="txjoin-bench-"))
    broker = None
    bootstrap: str | None = None
    pg_root = data_root(work)
    pg = start_postgres(pg_root, free_port(), work / "logs" / "postgres.log")
    result: dict[str, Any] = {"max_events_per_trigger": max_events, "master": master,
                              "source": source_kind, "snapshot_orders": snapshot_orders,
                              "partitions": partitions}
    try:
        if source_kind == "kafka":
            broker = start_broker(work / "kafka", free_port(), work / "logs" / "broker.log")
            bootstrap = broker.bootstrap_servers
        schedule = str(work / "schedule")
        # The workload is built, written where the pipeline reads it, and its expected
        # output computed in a child process (forked before Spark starts): the driver's
        # peak RSS is the pipeline's, not the workload's.
        with multiprocessing.get_context("fork").Pool(1) as pool:
            made = pool.apply(prepare_workload, (transactions, seed, snapshot_orders, partitions,
                                                 max_events, bootstrap, schedule, also_jobs))
        topics, prefix, expected = made.pop("topics"), made.pop("prefix"), made.pop("expected")
        also_expected = made.pop("also_expected")
        n_records, n_txs, data_events = made["records"], made["transactions"], made["data_events"]
        result = {**made, **result}
        result["harness_rss_mb"] = release_memory()
        spark = get_session(master, app_name="txjoin-bench")
        n_shards = shards or spark.sparkContext.defaultParallelism
        result["shards"] = n_shards
        result["engine"] = engine
        if split:
            result["split"] = list(split)
        if source_kind == "kafka":
            def source(limit: int | None = max_events) -> DataFrame:
                assert bootstrap is not None
                return read_stream(spark, bootstrap, topics, "earliest", limit)
        else:
            spark.dataSource.register(ReplaySource)

            def source(limit: int | None = max_events) -> DataFrame:
                return spark.readStream.format(SOURCE_NAME).option("schedule", schedule).load()

        # Warm up (JVM, Python workers) so neither measurement pays the first-query cost.
        (spark.range(1000).selectExpr("id % 7 AS k").groupBy("k").count().collect())

        # Every batch's progress (Spark keeps the last 100): the ceiling's routed rows and
        # the pipeline's stage breakdown.
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1000000")

        # -- the full pipeline -----------------------------------------------------
        config = RunConfig(topic_prefix=prefix,
                           bootstrap_servers=bootstrap,
                           max_events_per_trigger=max_events,
                           checkpoint_dir=str(work / "ckpt"), output_dir=str(work / "out"),
                           postgres_dsn=dsn(pg.port, "sink"), master=master, shards=n_shards,
                           engine=engine, split=split)
        sinks = build_sinks(job, config, spark)
        commits: list[GroupCommit] = []
        pipeline = Pipeline(spark, job, config, sinks, on_sink_commit=commits.append)
        with RssSampler() as rss:
            started, started_wall = time.monotonic(), time.time()
            # kafka: the pipeline's own source (its checks, and the facts the shards need)
            full = pipeline.kafka_source() if source_kind == "kafka" else source()
            query = pipeline.start(full, available_now=True)
            query.awaitTermination()  # returns once Delta holds the last batch too
            total_s = time.monotonic() - started
        pipeline.close()
        # -- ceilings: how fast records go through the first stages alone -------------
        # After the pipeline, so its peak RSS is its own: the passes' Kafka consumers keep
        # their last polls (Spark's fetched-data pool, 5 min) and the JVM its grown heap.
        # Each pass is a fresh streaming query over the whole workload into Spark's noop
        # sink, which takes every row and keeps none: a pass costs its stages and nothing
        # else (counting each batch from a Python foreachBatch added a callback into Python
        # and a two-stage count job per batch: the source alone read 73k records/s that
        # way, 83k into noop, one run each). The first pass warms the source's new consumers
        # up and is not reported.
        labels = shard_labels(n_shards, n_shards)
        passes = {
            "warm_up": lambda df: df,
            # the Python source alone
            "source_only_events_per_s": lambda df: df,
            # the source's records through one more Python stage that does nothing:
            # the cost of handing every record to a Python worker and back
            "source_and_python_hop_events_per_s": lambda df: df.mapInArrow(
                _identity, df.schema),
            # the source and the pipeline's routing (JVM, before the shards): the ceiling
            # of what reaches the shards
            "ceiling_events_per_s": lambda df: route(df, job, prefix, labels),
        }
        for name, stage in passes.items():
            started = time.monotonic()
            ceiling = (stage(source()).writeStream.format("noop")
                       .option("checkpointLocation", str(work / f"{name}-ckpt"))
                       .trigger(availableNow=True).start())
            ceiling.awaitTermination()
            if name != "warm_up":
                result[name] = round(n_records / (time.monotonic() - started))
        result["ceiling_routed_rows"] = sum(p["sink"].get("numOutputRows", 0)
                                            for p in ceiling.recentProgress)
        click.echo(f"source alone: {result['source_only_events_per_s']} records/s; with one "
                   f"more Python stage: {result['source_and_python_hop_events_per_s']}; "
                   f"ceiling (source + routing): {result['ceiling_events_per_s']} records/s")

        reports = pipeline.reports
        progress = {p["batchId"]: p for p in query.recentProgress if p.get("numInputRows")}
        durations = [p["durationMs"]["triggerExecution"] / 1000 for p in progress.values()]
        steady = [r for r in reports if r.snapshot_rows == 0 and r.batch_id in progress]
        steady_durations = [progress[r.batch_id]["durationMs"]["triggerExecution"] / 1000
                            for r in steady]
        memory = [sum(op.get("memoryUsedBytes", 0) for op in progress[r.batch_id]
                      .get("stateOperators", [])) for r in steady]
        updated = [sum(op.get("numRowsUpdated", 0) for op in progress[r.batch_id]
                       .get("stateOperators", [])) for r in steady]
        stages = [batch_stages(r.breakdown, progress.get(r.batch_id)) for r in reports]
        names = stage_names(stages)
        snapshot_rows = sum(r.snapshot_rows for r in reports)
        loaded = [r.finished_at for r in reports if r.snapshot_rows]
        result.update({
            "pipeline_seconds": round(total_s, 2),
            "events_per_s": round(n_records / total_s),
            "data_events_per_s": round(data_events / total_s),
            "transactions_per_s": round(n_txs / total_s),
            "micro_batches": len(reports),
            "batch_latency_p50_s": round(quantile(durations, 0.5), 3),
            "batch_latency_p99_s": round(quantile(durations, 0.99), 3),
            # the whole foreachBatch call: computing the batch (source, routing, shards) and
            # the sinks; stage_seconds_p50 says which part took what
            "foreach_batch_p50_s": round(quantile([r.seconds for r in reports], 0.5), 3),
            "stage_seconds_p50": {k: round(quantile([b[k] for b in stages], 0.5), 3)
                                  for k in names},
            "stage_seconds_mean": {k: round(statistics.mean(b[k] for b in stages), 3)
                                   for k in names},
            "peak_rss_driver_mb": round(rss.driver / 2**20),
            "peak_rss_driver_python_mb": round(rss.driver_python / 2**20),
            "peak_rss_driver_jvm_mb": round(rss.driver_jvm / 2**20),
            "peak_rss_executor_jvms_mb": round(rss.executors / 2**20),
            "peak_rss_python_workers_mb": round(rss.workers / 2**20),
            "peak_rss_shard_hosts_mb": round(rss.hosts / 2**20),
            "steady_batches": len(steady),
            "steady_batch_p50_s": round(quantile(steady_durations, 0.5), 3),
            # Bytes the shards handed to Spark's state store (segments, meta, and the
            # amortised snapshots), per batch without snapshot rows; Spark's own figures
            # for the same batches: rows updated and the store's memory.
            "state_bytes_written_per_batch": round(statistics.mean(
                r.state_bytes_written for r in steady)) if steady else 0,
            "state_rows_updated_per_batch": round(statistics.mean(updated)) if updated else 0,
            "state_memory_used_bytes_p50": round(quantile([float(m) for m in memory], 0.5)),
            "shard_states": sorted({s for r in reports for s in r.shard_states}),
            # the initial snapshot: its records from the query's start until the batch
            # that brought the last of them was committed
            "snapshot_records": snapshot_rows,
            "snapshot_records_per_s": round(snapshot_rows / max(1e-9, max(loaded) -
                                                                started_wall))
            if loaded and snapshot_orders else None,  # without: a few dozen rows
            "batches": [{"batch_id": r.batch_id, "records": r.records, "changes": r.changes,
                         "snapshot_rows": r.snapshot_rows,
                         "seconds": {k: round(v, 4) for k, v in b.items()}}
                        for r, b in zip(reports, stages, strict=True)],
        })
        result.update(sink_figures(commits))
        result["per_shard"] = shard_figures(steady)
        result["ratio_to_ceiling"] = round(result["events_per_s"] /
                                           max(1, result["ceiling_events_per_s"]), 3)
        result["output_rows"] = len(expected)
        result["sinks_match_oracle_keys"] = sinks_hold(job, sinks, expected)

        # -- other jobs on the same workload, one after the other (--also-job) ----------
        for path in also_jobs:
            other = load_job(path)
            other_config = replace(config, checkpoint_dir=str(work / f"ckpt-{other.name}"),
                                   output_dir=str(work / f"out-{other.name}"))
            other_sinks = build_sinks(other, other_config, spark)
            other_commits: list[GroupCommit] = []
            other_pipeline = Pipeline(spark, other, other_config, other_sinks,
                                      on_sink_commit=other_commits.append)
            started = time.monotonic()
            full = (other_pipeline.kafka_source() if source_kind == "kafka" else source())
            other_pipeline.start(full, available_now=True).awaitTermination()
            seconds = time.monotonic() - started
            other_pipeline.close()
            want = also_expected[str(path)]
            result.setdefault("also_jobs", {})[other.name] = {
                "job": str(path), "pipeline_seconds": round(seconds, 2),
                "events_per_s": round(n_records / seconds),
                "events_per_s_vs_main": round(n_records / seconds / result["events_per_s"], 3),
                "micro_batches": len(other_pipeline.reports),
                "output_rows": len(want),
                "sinks_match_oracle_keys": sinks_hold(other, other_sinks, want),
                **sink_figures(other_commits)}

        # -- the same job through txjoin.start and through `txjoin run` (--api-vs-run) ---
        if api_vs_run:
            assert bootstrap is not None
            result["api_vs_run"] = compare_api_and_run(
                spark, job, config, work, pg.port, n_records, expected)
    finally:
        if broker is not None:
            stop_broker(broker.process)
        stop_postgres(pg.process)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(pg_root, ignore_errors=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def compare_api_and_run(spark: Any, job: Job, config: Any, work: Path, pg_port: int,
                        n_records: int, expected: Any) -> dict[str, Any]:
    """The workload again in new driver processes, alike but for how the job starts, each
    from a checkpoint, a Delta root and a PostgreSQL database of its own: ``run``, ``txjoin
    run --until-idle``; ``api``, :func:`txjoin.start` on the session ``txjoin run`` makes
    (:func:`api_child`: the API's own cost); ``api_own_session``, :func:`txjoin.start` on a
    session built as docs/python-api.md builds one
    (``SparkSession.builder.config(map=txjoin.spark_conf())``: the JVM and settings a
    user's session has). Per micro-batch (the foreachBatch call, ``BatchReport.seconds``;
    each prints it on its batch lines) p50 and mean after the first (which pays a new JVM's
    cold Python workers and JIT), the first apart, and each process's wall clock (its JVM's
    start included)."""
    import subprocess
    import sys

    from txjoin.sinks.build import build_sinks
    from txjoin.stack.postgres import create_database, dsn

    figures: dict[str, Any] = {}
    for via in ("run", "api", "api_own_session"):
        database = f"sink_{via}"
        create_database(pg_port, database)
        run_config = replace(config, checkpoint_dir=str(work / f"ckpt-{via}"),
                             output_dir=str(work / f"out-{via}"),
                             postgres_dsn=dsn(pg_port, database), until_idle=True)
        options = ["--bootstrap-servers", str(run_config.bootstrap_servers),
                   "--topic-prefix", str(run_config.topic_prefix),
                   "--max-events-per-trigger", str(run_config.max_events_per_trigger),
                   "--checkpoint-dir", run_config.checkpoint_dir,
                   "--output-dir", run_config.output_dir,
                   "--postgres-dsn", str(run_config.postgres_dsn),
                   "--master", str(run_config.master), "--shards", str(run_config.shards)]
        command = ([sys.executable, "-m", "txjoin", "run", str(JOB), "--until-idle", *options]
                   if via == "run" else
                   [sys.executable, "-c", "import sys; from txjoin.bench import api_child; "
                    "api_child(sys.argv[1:])", via, str(JOB), *options])
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
        if done.returncode != 0:
            last = (done.stderr or done.stdout).strip().splitlines()[-1:]
            raise ConfigError(f"--api-vs-run: the {via} driver exited {done.returncode}: "
                              f"{' '.join(last)}")
        seconds = [float(line.rsplit("; ", 1)[1].removesuffix(" s"))
                   for line in done.stdout.splitlines()
                   if line.startswith("batch ") and line.endswith(" s")]
        sinks = build_sinks(job, run_config, spark)
        try:
            held = sinks_hold(job, sinks, expected)
        finally:
            for sink in sinks:
                sink.close()
        steady = seconds[1:]
        figures[via] = {
            "micro_batches": len(seconds),
            "first_batch_s": round(seconds[0], 3) if seconds else None,
            "batch_p50_s": round(quantile(steady, 0.5), 3) if steady else None,
            "batch_mean_s": round(statistics.mean(steady), 3) if steady else None,
            "wall_s": round(wall, 2),
            "sinks_match_oracle_keys": held}
    run = figures["run"]
    for via in ("api", "api_own_session"):
        if figures[via]["batch_mean_s"] and run["batch_mean_s"]:
            figures[f"{via}_over_run_batch_mean"] = round(
                figures[via]["batch_mean_s"] / run["batch_mean_s"], 3)
    click.echo("per batch after the first, p50 / mean: " + "; ".join(
        f"{via} {f['batch_p50_s']} / {f['batch_mean_s']} s ({f['micro_batches']} batches)"
        for via, f in figures.items() if isinstance(f, dict)))
    return figures


def api_child(argv: list[str]) -> None:
    """``--api-vs-run``'s API driver: ``VIA JOB --bootstrap-servers ... --master M ...``
    (the ``txjoin run`` options it passes), run to idle through :func:`txjoin.start` on
    the session ``txjoin run`` makes (VIA ``api``) or on one built as docs/python-api.md
    builds it (``api_own_session``); a line per batch, as run's."""
    import os
    import sys

    from pyspark.sql import SparkSession

    import txjoin
    from txjoin.pipeline.run import print_report
    from txjoin.pipeline.session import get_session

    via, job_file = argv[0], argv[1]
    options = dict(zip(argv[2::2], argv[3::2], strict=True))
    master = options["--master"]
    if via == "api":
        spark = get_session(master)
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        spark = (SparkSession.builder.master(master)
                 .config(map=dict[str, Any](txjoin.spark_conf(master))).getOrCreate())
    config = txjoin.RunConfig(
        bootstrap_servers=options["--bootstrap-servers"],
        topic_prefix=options["--topic-prefix"],
        max_events_per_trigger=int(options["--max-events-per-trigger"]),
        checkpoint_dir=options["--checkpoint-dir"], output_dir=options["--output-dir"],
        postgres_dsn=options["--postgres-dsn"], shards=int(options["--shards"]),
        until_idle=True)
    with txjoin.start(spark, txjoin.load_job(job_file), config,
                      on_batch=print_report) as stream:
        stream.await_termination()
    spark.stop()


def task_stage(task: dict[str, Any]) -> str:
    """The engine stage a task of ``per_shard`` ran in (a sequencer before the stage was
    reported: shard -1)."""
    return str(task.get("stage") or ("sequencer" if task["shard"] < 0 else "shards"))


def shard_figures(steady: Sequence[Any]) -> dict[str, Any]:
    """What a cluster's batch costs against the work of all its tasks, from the steady
    batches' reports (``BatchReport.per_shard``): per shard stage (and ``cpu``, each shard
    process's CPU seconds over its batch), the p50 over batches of the slowest shard's
    seconds (``slowest``; with the staged engine the sequencer's task added, as its stage
    runs before the shards') and of the sum over tasks (``sum``); and per task, the rows
    its state held after the last batch and its process's peak RSS; per engine part
    (``by_part``: the sequencer, the owners of each depth, the shards) its slowest task's
    and its tasks' summed CPU seconds, what the critical path is made of."""
    per_batch = [r.per_shard for r in steady if r.per_shard]
    if not per_batch:
        return {}
    stages = list(dict.fromkeys(k for shards in per_batch for s in shards
                                for k in s.get("seconds", {})))

    def seconds(s: dict[str, Any], stage: str) -> float:
        return float(s.get("cpu_seconds", 0.0) if stage == "cpu"
                     else s.get("seconds", {}).get(stage, 0.0))

    def slowest(shards: list[dict[str, Any]], stage: str) -> float:
        # a batch's tasks run stage after stage: its slowest task of each, summed (the
        # staged engine's sequencer and owner stages run before the shards')
        by_stage: dict[str, float] = {}
        for s in shards:
            part = task_stage(s)
            by_stage[part] = max(by_stage.get(part, 0.0), seconds(s, stage))
        return sum(by_stage.values())

    figures: dict[str, Any] = {"slowest": {}, "sum": {}}
    for stage in [*stages, "cpu"]:
        figures["slowest"][stage] = round(quantile(
            [slowest(shards, stage) for shards in per_batch], 0.5), 4)
        figures["sum"][stage] = round(quantile(
            [sum(seconds(s, stage) for s in shards) for shards in per_batch], 0.5), 4)
    # the critical path's parts: per engine part (sequencer, owners of each depth, shards),
    # the p50 over batches of its slowest task's CPU and of its tasks' sum
    parts = sorted({task_stage(s) for shards in per_batch for s in shards})
    figures["by_part"] = {part: {
        "slowest_cpu": round(quantile([max((seconds(s, "cpu") for s in shards
                                            if task_stage(s) == part), default=0.0)
                                       for shards in per_batch], 0.5), 4),
        "sum_cpu": round(quantile([sum(seconds(s, "cpu") for s in shards
                                       if task_stage(s) == part)
                                   for shards in per_batch], 0.5), 4)} for part in parts}
    last = {(task_stage(s), s["shard"]): s for shards in per_batch for s in shards}
    figures["tasks"] = [f"{part} {shard}" for part, shard in sorted(last)]
    figures["state_rows"] = [last[k].get("state_rows", 0) for k in sorted(last)]
    figures["peak_rss_mb"] = [max(s.get("peak_rss_mb", 0) for shards in per_batch
                                  for s in shards if (task_stage(s), s["shard"]) == k)
                              for k in sorted(last)]
    figures["steady_batches"] = len(per_batch)
    return figures


def sweep_figures(runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The shard sweep's comparison: per shard count, its slowest and summed shard seconds
    (``total``, and ``cpu``) and its largest shard state, each as a ratio to the fewest
    shards' run."""
    base_n = min(runs)
    base = runs[base_n]["per_shard"]
    ratios: dict[str, Any] = {}
    for n, run in sorted(runs.items()):
        mine = run["per_shard"]
        ratios[str(n)] = {
            **{f"slowest_{k}": round(mine["slowest"][k] / max(1e-9, base["slowest"][k]), 3)
               for k in ("total", "cpu")},
            **{f"sum_{k}": round(mine["sum"][k] / max(1e-9, base["sum"][k]), 3)
               for k in ("total", "cpu")},
            "largest_state_rows": round(max(mine["state_rows"]) /
                                        max(1, max(base["state_rows"])), 3),
            "events_per_s": run["events_per_s"]}
    return {"base_shards": base_n, "ratios_to_base": ratios}


def sweep_chart(runs: dict[int, dict[str, Any]], path: Path) -> None:
    """The sweep as a PNG (matplotlib): per shard count, the slowest shard's and the summed
    shard CPU seconds per steady batch, against the ideal split of the fewest shards' work."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted(runs)
    slowest = [runs[n]["per_shard"]["slowest"]["cpu"] for n in counts]
    summed = [runs[n]["per_shard"]["sum"]["cpu"] for n in counts]
    ideal = [slowest[0] * counts[0] / n for n in counts]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(counts, summed, "o-", label="sum over tasks")
    ax.plot(counts, slowest, "o-", label="slowest task of each stage (a cluster's batch)")
    ax.plot(counts, ideal, "--", color="grey", label="work split evenly")
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_xlabel("shards (local[1])")
    ax.set_ylabel("shard CPU seconds per steady batch (p50)")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sink_figures(commits: list[GroupCommit]) -> dict[str, Any]:
    """Each sink's commits: how many, their seconds, and Delta's group commits (batches per
    commit, seconds per committed row, its lag: a batch's hand-off to its Delta commit)."""
    figures: dict[str, Any] = {}
    for sink in sorted({c.sink for c in commits}):
        mine = [c for c in commits if c.sink == sink and c.wrote]
        seconds = [sum(c.seconds.values()) for c in mine]
        rows = sum(c.changes for c in mine)
        figures[f"{sink}_commits"] = {
            "count": len(mine), "batches": sum(c.batches for c in mine), "changes": rows,
            "seconds_total": round(sum(seconds), 3),
            "seconds_p50": round(quantile(seconds, 0.5), 3),
            "seconds_max": round(max(seconds, default=0.0), 3),
            "ms_per_row": round(1000 * sum(seconds) / rows, 4) if rows else None,
            # the driver's own CPU (its committing thread; not the tasks' or the database's)
            "driver_cpu_seconds_total": round(sum(c.cpu_seconds for c in mine), 3),
            "driver_cpu_ms_per_row": (round(1000 * sum(c.cpu_seconds for c in mine) / rows, 4)
                                      if rows else None),
            # each commit: micro-batches, changes, wall and driver CPU seconds
            "each": [[c.batches, c.changes, round(sum(c.seconds.values()), 3),
                      round(c.cpu_seconds, 3)] for c in mine],
            # where they went (Delta: changelog, current, maintain; PostgreSQL: commit)
            "seconds_by_part": {part: round(sum(c.seconds.get(part, 0.0) for c in mine), 3)
                                for part in sorted({p for c in mine for p in c.seconds})}}
        if sink == "delta":
            lags = [c.lag_seconds for c in mine]
            figures["delta_lag_s"] = {"p50": round(quantile(lags, 0.5), 3),
                                      "p99": round(quantile(lags, 0.99), 3),
                                      "max": round(max(lags, default=0.0), 3)}
    return figures


@click.command()
@click.option("--transactions", "-n", type=int, default=20_000, show_default=True,
              help="Number of source transactions to generate.")
@click.option("--max-events-per-trigger", type=int, default=25_000, show_default=True,
              help="Records per micro-batch.")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("bench-results.json"), show_default=True,
              help="Where to write the results (JSON).")
@click.option("--master", default="local[2]", show_default=True, help="Spark master URL.")
@click.option("--snapshot-orders", type=int, default=0, show_default=True,
              help="Orders in the initial snapshot (with a quarter as many clients and table "
                   "assignments), before the transactions.")
@click.option("--shards", type=click.IntRange(min=1), default=None,
              help="Shards of the join (default: Spark's default parallelism).")
@click.option("--partitions", type=click.IntRange(min=1), default=1, show_default=True,
              help="Partitions of each table topic (records spread by key, as Debezium's are); "
                   "the transaction topic keeps one. kafka and replay sources.")
@click.option("--shard-sweep", "sweep", default=None, metavar="N,N,...",
              help="Run the same workload once per shard count (e.g. 1,2,4,8; use with "
                   "--master local[1], where a batch's shard tasks run one after another) "
                   "and report per count the slowest shard's and the summed shards' seconds "
                   "per steady batch, per stage and in CPU, and each shard's state rows and "
                   "peak RSS (kafka and replay sources; --chart: a PNG of it).")
@click.option("--engine", type=click.Choice(ENGINES), default=SHARDED, show_default=True,
              help="The partitioned engine (txjoin run --engine); with --shard-sweep the "
                   "sequencer (shard -1) is a stage of its own: its task is added to the slowest "
                   "shard's and counted among the tasks summed.")
@click.option("--split", default="", metavar="LOOKUPS",
              help="With --engine staged: the looked-up tables split by key (txjoin run "
                   "--split: lookup aliases, comma-separated, or 'all'); each owner stage is "
                   "a stage of its own in the shard figures.")
@click.option("--keep", is_flag=True, help="Keep the work directory (checkpoints, Delta, logs).")
@click.option("--peer", "peers", multiple=True, type=click.Choice(PEERS),
              help="Also run this system on the same workload, archived as files, and compare "
                   "throughput and inconsistent observable states (txjoin.peers.bench; "
                   "repeatable). pathway runs twice: at its default 1,500 ms commits and at "
                   "100 ms.")
@click.option("--chart", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --peer, --shard-sweep or --source files:DIR: a PNG chart of the "
                   "comparison.")
@click.option("--also-job", "also_jobs", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Also run this job (over the pizzeria's tables, e.g. jobs/orders_totals.py) "
                   "on the same workload after the orders job, and report its events/s and "
                   "the ratio to the orders job's (repeatable; kafka and replay sources).")
@click.option("--api-vs-run", is_flag=True,
              help="After the run, the same workload in three new driver processes, each "
                   "into sinks of its own: `txjoin run --until-idle`; the Python API "
                   "(txjoin.start) on the session txjoin run makes; and on a session built "
                   "from txjoin.spark_conf(). Per micro-batch seconds of each, side by side "
                   "(kafka source).")
@click.option("--source", "source_kind", default="kafka", show_default=True,
              help="kafka: through an Apache Kafka broker and Spark's kafka source; replay: the "
                   "same records without a broker (the engine apart from the broker); "
                   "files:DIR: archive the workload in DIR (Kafka Connect sink layout) and read "
                   "it with the file source.")
def bench(transactions: int, max_events_per_trigger: int, seed: int, out: Path, master: str,
          snapshot_orders: int, source_kind: str, shards: int | None, partitions: int,
          keep: bool, peers: tuple[str, ...], chart: Path | None,
          also_jobs: tuple[Path, ...], sweep: str | None, api_vs_run: bool,
          engine: str, split: str) -> None:
    """Benchmark the full pipeline (source -> shards -> Delta + PostgreSQL) against its ceiling.

    With --peer or --source files:DIR: the same workload through txjoin's file source and
    the peers, compared (txjoin.peers.bench).
    """
    workload_tables = load_job(JOB).table_names
    split_lookups = parse_split(split)
    for path in also_jobs:
        tables = set(load_job(path).table_names)
        if not tables <= set(workload_tables):
            raise ConfigError(f"--also-job {path}: reads {', '.join(sorted(tables))}; the "
                              "benchmark's workload is the pizzeria's "
                              f"({', '.join(workload_tables)})")
    if sweep is not None:
        if peers or also_jobs or shards is not None or source_kind not in ("kafka", "replay"):
            raise ConfigError("--shard-sweep sets --shards itself and runs with the kafka and "
                              "replay sources, without --peer or --also-job")
        run_sweep(parse_counts(sweep), transactions, max_events_per_trigger, seed, out,
                  master, keep, snapshot_orders, source_kind, partitions, chart, engine,
                  split_lookups)
        return
    if peers or chart is not None or source_kind.startswith("files:"):
        if also_jobs:
            raise ConfigError("--also-job runs with the kafka and replay sources, not with "
                              "--peer, --chart or --source files:DIR")
        from txjoin.ingest.spark.files import parse_source
        from txjoin.peers.bench import run_peer_bench

        directory = parse_source(source_kind)
        run_peer_bench(transactions, seed, out, chart, peers,
                       None if directory is None else Path(directory), master,
                       max_events_per_trigger, keep)
        click.echo(f"written to {out}" + (f" and {chart}" if chart else ""))
        return
    if source_kind not in ("kafka", "replay"):
        raise click.BadParameter("expected kafka, replay or files:DIR", param_hint="--source")
    if api_vs_run and source_kind != "kafka":
        raise ConfigError("--api-vs-run reads through the broker, as `txjoin run` does: use "
                          "it with --source kafka")
    result = run_bench(transactions, max_events_per_trigger, seed, out, master, keep,
                       snapshot_orders=snapshot_orders, source_kind=source_kind, shards=shards,
                       partitions=partitions, also_jobs=also_jobs, api_vs_run=api_vs_run,
                       engine=engine, split=split_lookups)
    shown = {k: v for k, v in result.items() if k != "batches"}  # per batch: in the file
    width = max(len(k) for k in shown)
    for key, value in shown.items():
        click.echo(f"{key:<{width}}  {value}")
    click.echo(f"written to {out}")


def parse_counts(text: str) -> list[int]:
    """``--shard-sweep``'s shard counts: distinct positive integers, comma separated."""
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1:
        raise click.BadParameter(f"expected shard counts such as 1,2,4,8, got {text!r}",
                                 param_hint="--shard-sweep")
    return counts


def run_sweep(counts: list[int], transactions: int, max_events: int, seed: int, out: Path,
              master: str, keep: bool, snapshot_orders: int, source_kind: str,
              partitions: int, chart: Path | None, engine: str = SHARDED,
              split: tuple[str, ...] = ()) -> None:
    """``--shard-sweep``: :func:`run_bench` once per shard count, one after another, into one
    results file (each run whole under ``runs``, its batches left out) with the ratios."""
    runs: dict[int, dict[str, Any]] = {}
    for n in counts:
        click.echo(f"-- {n} shard(s) on {master}")
        with tempfile.TemporaryDirectory(prefix="txjoin-sweep-") as tmp:
            result = run_bench(transactions, max_events, seed, Path(tmp) / "run.json", master,
                               keep, snapshot_orders=snapshot_orders, source_kind=source_kind,
                               shards=n, partitions=partitions, engine=engine, split=split)
        result.pop("batches", None)
        runs[n] = result
        figures = result.get("per_shard", {})
        if not figures:
            raise ConfigError(f"--shard-sweep: the run with {n} shard(s) had no steady batch "
                              "(every batch brought snapshot rows); raise -n or lower "
                              "--max-events-per-trigger")
        click.echo(f"   {result['events_per_s']} events/s; per steady batch: slowest shard "
                   f"{figures['slowest']['total']:.3f} s ({figures['slowest']['cpu']:.3f} s "
                   f"CPU), sum over shards {figures['sum']['total']:.3f} s "
                   f"({figures['sum']['cpu']:.3f} s CPU); state rows per shard "
                   f"{figures['state_rows']}; peak RSS per shard {figures['peak_rss_mb']} MB")
    summary = {"shard_sweep": counts, "master": master, "transactions": transactions,
               "engine": engine, **({"split": list(split)} if split else {}),
               **sweep_figures(runs), "runs": {str(n): r for n, r in runs.items()}}
    for n, ratio in summary["ratios_to_base"].items():
        click.echo(f"{n:>3} shard(s): " + ", ".join(f"{k} {v}" for k, v in ratio.items()))
    out.write_text(json.dumps(summary, indent=2) + "\n")
    if chart is not None:
        sweep_chart(runs, chart)
    click.echo(f"written to {out}" + (f" and {chart}" if chart else ""))
