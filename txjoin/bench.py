"""``txjoin bench``: throughput and latency of the whole pipeline, and of its ceiling.

1. Generate a pizzeria workload of N transactions (mixed sizes, ~5 events
   each), synthesize the Debezium records and produce them into a fresh tansu
   broker (one record per produce batch: tansu's watermark defect).
2. Full pipeline: Kafka source -> core engine (applyInPandasWithState) ->
   Delta + PostgreSQL sinks, ``availableNow`` with ``--max-events-per-trigger``.
3. Ceiling: the same topics through the Kafka source and Debezium decoding
   only (``mapInPandas``), counted.

Prints and writes to a JSON file: source events/s, transactions/s,
micro-batch latency p50/p99, peak RSS of the driver (Python + JVM) and of the
Python workers, and the ratio to the ceiling. Not a test: numbers, not verdicts.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pandas as pd
import psutil

from txjoin.core.engine import Engine
from txjoin.job import load_job
from txjoin.scenarios.synthesize import Synthesizer
from txjoin.scenarios.workload import pizzeria_workload

JOB = Path(__file__).resolve().parents[1] / "jobs" / "orders.py"


class RssSampler:
    """Peak RSS of this process + its JVM child, and of Spark's Python workers."""

    def __init__(self) -> None:
        self.driver = 0
        self.workers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            try:
                kids = me.children(recursive=True)
                jvm = sum(p.memory_info().rss for p in kids if "java" in p.name())
                workers = sum(p.memory_info().rss for p in kids if "python" in p.name())
                self.driver = max(self.driver, me.memory_info().rss + jvm)
                self.workers = max(self.workers, workers)
            except psutil.Error:
                pass
            self._stop.wait(0.2)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def produce(bootstrap: str, records: list[tuple[str, str | None, str | None]]) -> float:
    """Write records with one record per produce batch (tansu's watermark defect); seconds."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.size": 1,
                         "enable.idempotence": True, "queue.buffering.max.messages": 1_000_000})
    started = time.monotonic()
    for topic, key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    return time.monotonic() - started


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_bench(transactions: int, max_events: int, seed: int, out: Path, master: str,
              keep: bool = False) -> dict[str, Any]:
    from txjoin.spark.pipeline import Pipeline, RunConfig, build_sinks
    from txjoin.spark.session import get_session
    from txjoin.spark.sources.kafka import read_stream, register_kafka_source
    from txjoin.stack.broker import create_topics, start_broker, stop_broker
    from txjoin.stack.postgres import data_root, dsn, start_postgres, stop_postgres
    from txjoin.stack.processes import free_port

    job = load_job(JOB)
    work = Path(tempfile.mkdtemp(prefix="txjoin-bench-"))
    snapshot, txs = pizzeria_workload(transactions, seed)
    synth = Synthesizer(job)
    produced = list(synth.snapshot(snapshot))
    for tx in txs:
        produced.extend(synth.transaction(tx))
    records = [(r.topic, r.key, r.value) for r in produced]
    data_events = sum(1 for r in produced if r.kind in ("data", "snapshot"))
    click.echo(f"workload: {len(txs)} transactions, {data_events} data events, "
               f"{len(records)} records (with BEGIN/END and tombstones)")

    broker = start_broker(free_port(), work / "logs" / "broker.log")
    pg_root = data_root(work)
    pg = start_postgres(pg_root, free_port(), work / "logs" / "postgres.log")
    result: dict[str, Any] = {"transactions": len(txs), "data_events": data_events,
                              "records": len(records), "max_events_per_trigger": max_events,
                              "master": master}
    try:
        bootstrap = broker.bootstrap_servers
        topics = list(synth.topics)
        create_topics(bootstrap, topics)
        produce_s = produce(bootstrap, records)
        result["produce_records_per_s"] = round(len(records) / produce_s)
        click.echo(f"produced in {produce_s:.1f}s")
        spark = get_session(master, app_name="txjoin-bench")
        register_kafka_source(spark)

        # Warm up (JVM, Python workers) so neither measurement pays the first-query cost.
        warm = read_stream(spark, bootstrap, [f"{synth.prefix}.transaction"], None, "earliest",
                           1000)
        def count(df: Any, _id: int) -> None:
            df.count()

        (warm.writeStream.foreachBatch(count)
         .option("checkpointLocation", str(work / "warmup-ckpt"))
         .trigger(availableNow=True).start().awaitTermination())

        # -- ceiling: source + decode only -------------------------------------
        def decode_only(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            from txjoin.debezium import Position, decode

            for frame in frames:
                n = 0
                for t, p, o, v in zip(frame["topic"], frame["partition"], frame["offset"],
                                      frame["value"], strict=True):
                    if o >= 0 and decode(v, Position(t, p, o)) is not None:
                        n += 1
                yield pd.DataFrame({"n": [n]})

        counted: list[int] = []
        source = read_stream(spark, bootstrap, topics, f"{synth.prefix}.transaction",
                             "earliest", max_events)
        started = time.monotonic()
        query = (source.mapInPandas(decode_only, "n long").writeStream
                 .foreachBatch(lambda df, _id: counted.append(int(df.groupBy().sum("n")
                                                                  .collect()[0][0] or 0)))
                 .option("checkpointLocation", str(work / "ceiling-ckpt"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        ceiling_s = time.monotonic() - started
        result["ceiling_events_per_s"] = round(len(records) / ceiling_s)
        result["ceiling_decoded"] = sum(counted)
        click.echo(f"ceiling (source + decode): {result['ceiling_events_per_s']} records/s")

        # -- the full pipeline -----------------------------------------------------
        config = RunConfig(topic_prefix=synth.prefix, bootstrap_servers=bootstrap,
                           max_events_per_trigger=max_events,
                           checkpoint_dir=str(work / "ckpt"), output_dir=str(work / "out"),
                           postgres_dsn=dsn(pg.port, "sink"), master=master)
        sinks = build_sinks(job, config, spark)
        pipeline = Pipeline(spark, job, config, sinks)
        with RssSampler() as rss:
            started = time.monotonic()
            query = pipeline.start(pipeline.kafka_source(), available_now=True)
            query.awaitTermination()
            total_s = time.monotonic() - started
        reports = pipeline.reports
        durations = [p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress
                     if p.get("numInputRows")]
        result.update({
            "pipeline_seconds": round(total_s, 2),
            "events_per_s": round(len(records) / total_s),
            "data_events_per_s": round(data_events / total_s),
            "transactions_per_s": round(len(txs) / total_s),
            "micro_batches": len(reports),
            "batch_latency_p50_s": round(_percentile(durations, 0.5), 3),
            "batch_latency_p99_s": round(_percentile(durations, 0.99), 3),
            "sink_write_p50_s": round(statistics.median([r.seconds for r in reports]), 3)
            if reports else 0,
            "seconds_per_batch_by_stage": {
                k: round(statistics.mean(r.breakdown.get(k, 0.0) for r in reports), 3)
                for k in (reports[0].breakdown if reports else {})},
            "peak_rss_driver_mb": round(rss.driver / 2**20),
            "peak_rss_python_workers_mb": round(rss.workers / 2**20),
        })
        result["ratio_to_ceiling"] = round(result["events_per_s"] /
                                           max(1, result["ceiling_events_per_s"]), 3)
        # The oracle scans (quadratic: for tests); the core alone is the fast reference here.
        reference = Engine(job)
        reference.process([(r.topic, 0, r.offset, r.value) for r in produced],
                          caught_up=[*job.table_names, "transaction"])
        expected = reference.outputs()
        delta_rows = {(r["order_id"],) for r in sinks[0].read_current()}
        pg_rows = {(r["order_id"],) for r in sinks[1].read_current()}
        result["output_rows"] = len(expected)
        result["sinks_match_oracle_keys"] = delta_rows == set(expected) == pg_rows
        for sink in sinks:
            sink.close()
    finally:
        stop_broker(broker.process)
        stop_postgres(pg.process)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(pg_root, ignore_errors=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


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
@click.option("--keep", is_flag=True, help="Keep the work directory (checkpoints, Delta, logs).")
@click.option("--peer", "peers", multiple=True, type=click.Choice(["flink"]),
              help="Also run this system on the same workload, archived as files, and compare "
                   "throughput and inconsistent observable states (txjoin.peers.bench).")
@click.option("--chart", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --peer or --source files:DIR: a PNG chart of the comparison.")
@click.option("--source", default="kafka", show_default=True,
              help="'files:DIR': archive the workload in DIR (Kafka Connect sink layout) and "
                   "read it with the file source instead of a broker.")
def bench(transactions: int, max_events_per_trigger: int, seed: int, out: Path, master: str,
          keep: bool, peers: tuple[str, ...], chart: Path | None, source: str) -> None:
    """Benchmark the full pipeline (Kafka -> core -> Delta + PostgreSQL) against its ceiling."""
    if peers or chart is not None or source != "kafka":
        from txjoin.peers.bench import run_peer_bench
        from txjoin.spark.sources.files import parse_source

        directory = parse_source(source)
        run_peer_bench(transactions, seed, out, chart, peers,
                       None if directory is None else Path(directory), master,
                       max_events_per_trigger, keep)
        click.echo(f"written to {out}" + (f" and {chart}" if chart else ""))
        return
    result = run_bench(transactions, max_events_per_trigger, seed, out, master, keep)
    width = max(len(k) for k in result)
    for key, value in result.items():
        click.echo(f"{key:<{width}}  {value}")
    click.echo(f"written to {out}")
