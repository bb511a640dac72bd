"""The whole pipeline through Kafka: Apache Kafka -> Spark's kafka source -> core -> sinks.

Small micro-batches (``maxOffsetsPerTrigger``) split transactions and let some
topics run ahead of others (the small ones through a kafka source of their own); a
second query resumes from the checkpoint after more records were written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.fixtures.broker import create_topics
from txjoin.bench import produce
from txjoin.job import load_job
from txjoin.join import SHARDED, STAGED
from txjoin.join.oracle import outputs_after_each
from txjoin.pipeline.pipeline import Pipeline, RunConfig
from txjoin.scenarios.checks import check_exactly_once, check_final
from txjoin.scenarios.synthesize import Synthesizer
from txjoin.scenarios.workload import pizzeria_workload
from txjoin.sinks import without_metadata
from txjoin.sinks.build import build_sinks

pytestmark = pytest.mark.spark

ORDERS = Path(__file__).resolve().parents[2] / "jobs" / "orders.py"


@pytest.fixture(scope="module")
def bootstrap(kafka_broker: str) -> str:
    """The session's broker (tests/conftest.py); this module's topics have their own names."""
    return kafka_broker


@pytest.mark.parametrize("engine", [SHARDED, STAGED])
def test_pipeline_over_kafka_in_small_batches_resumes_and_matches_the_oracle(
        spark: SparkSession, bootstrap: str, pg_dsn: str, tmp_path: Path, engine: str) -> None:
    """Each engine on topics of its own. A transaction waits at most 5 s of source time
    for its events: only a topic the read limit cut short may hold them, so a batch that
    took such a topic for one read to its end would fail the run (the staged sequencer
    once did, when it did not count tombstones)."""
    job = load_job(ORDERS)
    snapshot, txs = pizzeria_workload(80, seed=21)
    prefix = "kshop" if engine == SHARDED else f"kshop{engine}"
    synth = Synthesizer(job, prefix=prefix)
    records = list(synth.snapshot(snapshot))
    first = len(txs) // 2
    for tx in txs[:first]:
        records.extend(synth.transaction(tx))
    create_topics(bootstrap, list(synth.topics))
    produce(bootstrap, [(r.topic, r.key, r.value) for r in records])

    config = RunConfig(topic_prefix=prefix, bootstrap_servers=bootstrap,
                       max_events_per_trigger=80, checkpoint_dir=str(tmp_path / "ckpt"),
                       output_dir=str(tmp_path / "out"), postgres_dsn=pg_dsn, engine=engine,
                       incomplete_timeout_s=5)

    def drain() -> list:
        sinks = build_sinks(job, config, spark, pg_table_suffix=f"kafka_{engine}")
        pipeline = Pipeline(spark, job, config, sinks)
        query = pipeline.start(pipeline.kafka_source(), available_now=True)
        # the small topics (all but orders: the transaction topic runs ahead of its events)
        # have a source of their own, kept on the restart
        assert pipeline.kafka_facts is not None
        orders = f"{prefix}.public.orders"
        assert [set(g) for g in pipeline.kafka_facts.sources] == [
            {orders}, set(pipeline.kafka_facts.partitions) - {orders}]
        query.awaitTermination()
        return sinks

    sinks = drain()
    assert len(sinks) == 2
    expected = outputs_after_each(job, snapshot, txs)
    for sink in sinks:
        rows = [without_metadata(r) for r in sink.read_current()]
        result = check_final(rows, expected[first], ["order_id"])
        assert result.ok, f"{sink.name} after the first half: {result.message}"

    more = []
    for tx in txs[first:]:
        more.extend(synth.transaction(tx))
    produce(bootstrap, [(r.topic, r.key, r.value) for r in more])
    sinks = drain()
    for sink in sinks:
        current = sink.read_current()
        rows = [without_metadata(r) for r in current]
        result = check_final(rows, expected[-1], ["order_id"])
        assert result.ok, f"{sink.name} at the end: {result.message}"
        once = check_exactly_once(sink.read_changelog(), ["order_id"], current, expected)
        assert once.ok, f"{sink.name}: {once.message}"
        sink.close()


def test_two_source_databases_over_kafka_converge_with_their_own_prefixes(
        spark: SparkSession, bootstrap: str, pg_dsn: str, tmp_path: Path) -> None:
    """Seed 000 over two databases: two prefixes (overridden as `--topic-prefix NAME=P`
    would), two one-partition transaction topics, small batches that split both."""
    import random

    from txjoin.join.oracle import RowChange, SourceTransaction, outputs_by_source_prefixes
    from txjoin.scenarios.synthesize import SourcesSynthesizer

    job = load_job(ORDERS.parent / "users_colors_two_dbs.py")
    prefixes = {"users": "k2users", "colors": "k2colors"}
    rng = random.Random(7)
    snapshot = {"public.users": [{"id": i, "full_name": f"user {i}"} for i in range(1, 6)],
                "public.users_favorite_color": [
                    {"id": 1, "user_id": 1, "favorite_color": "red"}]}
    txs = []
    for n in range(40):
        if n % 3:
            uid = rng.randint(1, 8)
            op = "update" if uid <= 5 or any(
                c.row.get("id") == uid for t in txs for c in t.changes
                if t.source == "users") else "insert"
            txs.append(SourceTransaction(f"u{n}", [RowChange(
                op, "public.users", {"id": uid, "full_name": f"name {n}"})], "users"))
        else:
            txs.append(SourceTransaction(f"c{n}", [RowChange(
                "insert", "public.users_favorite_color",
                {"id": 100 + n, "user_id": rng.randint(1, 8),
                 "favorite_color": rng.choice(["blue", "green", "pink"])})], "colors"))
    synth = SourcesSynthesizer(job, prefixes)
    records = list(synth.snapshot(snapshot))
    for tx in txs:
        records.extend(synth.transaction(tx))
    create_topics(bootstrap, list(synth.topics))
    produce(bootstrap, [(r.topic, r.key, r.value) for r in records])

    config = RunConfig(topic_prefixes=prefixes, bootstrap_servers=bootstrap,
                       max_events_per_trigger=9, checkpoint_dir=str(tmp_path / "ckpt"),
                       output_dir=str(tmp_path / "out"), postgres_dsn=pg_dsn)
    sinks = build_sinks(job, config, spark, pg_table_suffix="kafka2")
    pipeline = Pipeline(spark, job, config, sinks)
    pipeline.start(pipeline.kafka_source(), available_now=True).awaitTermination()

    grid = outputs_by_source_prefixes(job, snapshot, txs)
    for sink in sinks:
        current = sink.read_current()
        result = check_final([without_metadata(r) for r in current], grid[max(grid)], ["id"])
        assert result.ok, f"{sink.name}: {result.message}"
        changelog = sink.read_changelog()
        assert check_exactly_once(changelog, ["id"], current).ok
        assert {r["_source"] for r in changelog} <= {None, "users", "colors"}
        assert {r["_source"] for r in changelog if r["_commit_seq"] > 0} == {"users", "colors"}
        sink.close()


def _produce_in_transactions(bootstrap: str, groups: list[list[tuple[str, str | None,
                                                                    str | None]]]) -> None:
    """Each group of (topic, key, value) records in a Kafka transaction of its own, as Kafka
    Connect's exactly-once source support writes them: every commit leaves a marker at an
    offset of each partition it wrote, so the topics' offsets have gaps."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "txjoin-gaps",
                         "linger.ms": 5})
    producer.init_transactions(30)
    for group in groups:
        producer.begin_transaction()
        for topic, key, value in group:
            producer.produce(topic, key=key, value=value, partition=0)
        producer.commit_transaction(30)
    producer.flush(30)


def test_small_batches_over_offsets_with_gaps_match_the_oracle(
        spark: SparkSession, bootstrap: str, pg_dsn: str, tmp_path: Path) -> None:
    """Topics written in Kafka transactions (an exactly-once source connector's markers
    leave gaps in the offsets) read under a read limit: the shards learn which topics a
    batch read to their end from the offsets the driver planned it over
    (``kafka.batch_offset_spans``), not from the records they got, and the run ends with
    the oracle's output, every change once."""
    job = load_job(ORDERS)
    snapshot, txs = pizzeria_workload(40, seed=23)
    synth = Synthesizer(job, prefix="kgaps")
    groups = [list(synth.snapshot(snapshot))]
    groups += [list(synth.transaction(tx)) for tx in txs]
    create_topics(bootstrap, list(synth.topics))
    _produce_in_transactions(bootstrap, [[(r.topic, r.key, r.value) for r in g]
                                         for g in groups])
    config = RunConfig(topic_prefix="kgaps", bootstrap_servers=bootstrap,
                       max_events_per_trigger=60, checkpoint_dir=str(tmp_path / "ckpt"),
                       output_dir=str(tmp_path / "out"), postgres_dsn=pg_dsn,
                       incomplete_timeout_s=5)
    sinks = build_sinks(job, config, spark, pg_table_suffix="kafka_gaps")
    pipeline = Pipeline(spark, job, config, sinks)
    query = pipeline.start(pipeline.kafka_source(), available_now=True)
    query.awaitTermination()
    expected = outputs_after_each(job, snapshot, txs)
    assert len(pipeline.reports) > 3, "the read limit split the topics into several batches"
    for sink in sinks:
        current = sink.read_current()
        result = check_final([without_metadata(r) for r in current], expected[-1],
                             ["order_id"])
        assert result.ok, f"{sink.name}: {result.message}"
        once = check_exactly_once(sink.read_changelog(), ["order_id"], current, expected)
        assert once.ok, f"{sink.name}: {once.message}"
        sink.close()
