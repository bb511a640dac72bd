"""The ``txjoin_kafka`` streaming source against a real (tansu) broker."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession

from tests.fixtures.broker import create_topics, running_broker
from txjoin.errors import CheckpointError, ConfigError, ServiceError
from txjoin.spark.sources.kafka import (
    TOPIC_IDS,
    KafkaSourceConfig,
    KafkaStreamReader,
    read_stream,
    split_budget,
)

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    with running_broker() as servers:
        yield servers


def _topics(bootstrap: str, count: int = 2, partitions: int = 1) -> list[str]:
    names = [f"t{uuid.uuid4().hex[:8]}" for _ in range(count)]
    create_topics(bootstrap, names, partitions)
    return names


def _produce(bootstrap: str, topic: str, values: list[str | None]) -> None:
    # One record per produce + flush: tansu's high watermark hides the tail of
    # multi-record batches.
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i, value in enumerate(values):
        producer.produce(topic, key=f"k{i}", value=value)
        producer.flush(10)


def _run(df: DataFrame, checkpoint: Path,
         caught_up: list[set[str]] | None = None) -> list[list[tuple]]:
    """Run ``df`` to the end of what is available now; records of each non-empty micro-batch.

    Caught-up marker rows (offset -1) are collected apart, one set of topics per batch.
    """
    batches: list[list[tuple]] = []

    def collect(batch: DataFrame, batch_id: int) -> None:
        everything = [tuple(r) for r in batch.collect()]
        rows = [r for r in everything if r[2] >= 0]
        if caught_up is not None:
            caught_up.append({r[0] for r in everything if r[2] == -1})
        if rows:
            batches.append(rows)

    query = (df.writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert not query.isActive, "availableNow query did not finish"
    if query.exception() is not None:
        raise AssertionError(str(query.exception()))
    return batches


def _values(n: int, tag: str) -> list[str | None]:
    return [json.dumps({"tag": tag, "i": i}) for i in range(n)]


def test_every_record_arrives_exactly_once_with_its_position(
        spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    orders, customers = _topics(bootstrap)
    _produce(bootstrap, orders, [*_values(5, "o"), None])  # a tombstone at offset 5
    _produce(bootstrap, customers, _values(3, "c"))

    caught: list[set[str]] = []
    batches = _run(read_stream(spark, bootstrap, [orders, customers]), tmp_path / "cp", caught)

    # Read to the end in one batch: both topics are reported caught up with it.
    assert caught[-1] == {orders, customers}
    rows = sorted(r for batch in batches for r in batch)
    assert [(r[0], r[1], r[2], r[4]) for r in rows] == sorted(
        [(orders, 0, i, v) for i, v in enumerate([*_values(5, "o"), None])]
        + [(customers, 0, i, v) for i, v in enumerate(_values(3, "c"))])
    assert all(r[3] == f"k{r[2]}" for r in rows)
    assert all(r[5] is not None for r in rows)


def test_max_events_per_trigger_splits_into_several_batches_and_restart_resumes(
        spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    orders, customers = _topics(bootstrap)
    _produce(bootstrap, orders, _values(7, "o"))
    _produce(bootstrap, customers, _values(3, "c"))
    checkpoint = tmp_path / "cp"

    caught: list[set[str]] = []
    first = _run(read_stream(spark, bootstrap, [orders, customers], max_events=4), checkpoint,
                 caught)

    assert len(first) >= 3
    # A topic cut short by the limit is not caught up; the last batch reads both to the end.
    assert orders not in caught[0] and caught[-1] == {orders, customers}
    assert all(len(batch) <= 4 for batch in first)
    # Both topics have data from the first batch on: neither waits for the other.
    assert {r[0] for r in first[0]} == {orders, customers}
    seen = [(r[0], r[2]) for batch in first for r in batch]
    assert sorted(seen) == sorted([(orders, i) for i in range(7)]
                                  + [(customers, i) for i in range(3)])

    _produce(bootstrap, orders, _values(2, "later"))
    second = _run(read_stream(spark, bootstrap, [orders, customers], max_events=4), checkpoint)

    assert [(r[0], r[2]) for batch in second for r in batch] == [(orders, 7), (orders, 8)]


def test_latest_starts_after_what_is_already_there(
        spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    (topic,) = _topics(bootstrap, count=1)
    _produce(bootstrap, topic, _values(3, "old"))

    batches = _run(read_stream(spark, bootstrap, [topic], starting_offsets="latest"),
                   tmp_path / "cp")

    assert batches == []


@pytest.mark.parametrize("partitioned, expected", [
    ("transaction", r"transaction topic '{topic}'.*has 2 partitions.*exactly 1"),
    # only for Spark's own kafka format, which cannot declare partitioned table topics
    ("table", r"table topic '{topic}'.*has 2 partitions.*did not declare"
              r".*--max-events-per-trigger"),
])
def test_a_topic_with_two_partitions_is_refused_with_a_clear_error(
        bootstrap: str, partitioned: str, expected: str) -> None:
    (single,) = _topics(bootstrap, count=1)
    (split,) = _topics(bootstrap, count=1, partitions=2)
    data, tx = (single, split) if partitioned == "transaction" else (split, single)
    reader = KafkaStreamReader(KafkaSourceConfig(bootstrap, (data, tx), transaction_topic=tx,
                                                 one_partition_tables=partitioned == "table"))

    with pytest.raises(ConfigError, match=expected.format(topic=split)):
        reader.initialOffset()


def test_a_table_topic_with_two_partitions_is_read_whole_and_declared_in_every_batch(
        spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    (tx,) = _topics(bootstrap, count=1)
    (split,) = _topics(bootstrap, count=1, partitions=2)
    _produce(bootstrap, split, _values(8, "s"))  # keys k0..k7: both partitions get some
    _produce(bootstrap, tx, _values(1, "tx"))
    rows: list[list[tuple]] = []
    query = (read_stream(spark, bootstrap, [split], transaction_topic=tx, max_events=3)
             .writeStream.foreachBatch(lambda df, _: rows.append([tuple(r) for r in df.collect()]))
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()

    data = [r for batch in rows for r in batch if r[2] >= 0 and r[0] == split]
    assert sorted(str(r[4]) for r in data) == sorted(str(v) for v in _values(8, "s"))
    assert {r[1] for r in data} == {0, 1}
    for batch in rows:  # the partitioned topic (not the transaction topic), every batch
        assert [(r[0], r[1]) for r in batch if r[2] == -2] == [(split, 2)]
    # the last batch reads both partitions to their end, and says so per partition
    assert sorted((r[0], r[1]) for r in rows[-1] if r[2] == -3) == [(split, 0), (split, 1)]


def test_transaction_topic_error_reaches_the_streaming_query(
        spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    (data,) = _topics(bootstrap, count=1)
    (tx,) = _topics(bootstrap, count=1, partitions=2)

    with pytest.raises(Exception, match="exactly 1"):
        _run(read_stream(spark, bootstrap, [data], transaction_topic=tx), tmp_path / "cp")


def test_missing_topic_and_unreachable_broker_name_the_bootstrap_servers(bootstrap: str) -> None:
    missing = KafkaStreamReader(KafkaSourceConfig(bootstrap, ("no_such_topic",)))
    expected = f"'no_such_topic' does not exist on '{bootstrap}'"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        missing.initialOffset()

    nobody = KafkaStreamReader(KafkaSourceConfig("127.0.0.1:1", ("x",)))
    with pytest.raises(ServiceError, match=re.escape("brokers at '127.0.0.1:1'")):
        nobody.initialOffset()


def test_budget_is_shared_fairly_and_no_partition_with_data_gets_nothing() -> None:
    a, b, c = ("a", 0), ("b", 0), ("c", 0)
    assert split_budget({a: 100, b: 100, c: 0}, 10) == {a: 5, b: 5, c: 0}
    assert split_budget({a: 100, b: 2}, 10) == {a: 8, b: 2}
    assert split_budget({a: 1, b: 1, c: 1}, 2) == {a: 1, b: 1, c: 0}
    assert split_budget({a: 3, b: 50, c: 1}, 5) == {a: 2, b: 2, c: 1}
    assert sum(split_budget({a: 7, b: 3}, 4).values()) == 4


def test_options_are_validated() -> None:
    from pyspark.sql.datasource import CaseInsensitiveDict

    options = CaseInsensitiveDict({"bootstrap.servers": "h:1", "topics": "a, b",
                                   "startingOffsets": "Latest", "maxEventsPerTrigger": "10",
                                   "transactionTopic": "tx"})
    config = KafkaSourceConfig.from_options(options)
    assert config.topics == ("a", "b", "tx")
    assert config.starting_offsets == "latest"
    assert config.max_events_per_trigger == 10
    options["maxEventsPerTrigger"] = "0"
    with pytest.raises(ConfigError, match="maxEventsPerTrigger"):
        KafkaSourceConfig.from_options(options)


def test_several_transaction_topics_one_per_source_database() -> None:
    from pyspark.sql.datasource import CaseInsensitiveDict

    options = CaseInsensitiveDict({"bootstrap.servers": "h:1", "topics": "u.public.users",
                                   "transactionTopic": "u.transaction, c.transaction"})
    config = KafkaSourceConfig.from_options(options)
    assert config.topics == ("u.public.users", "u.transaction", "c.transaction")
    assert config.transaction_topics == ("u.transaction", "c.transaction")


def test_second_transaction_topic_with_two_partitions_is_refused(bootstrap: str) -> None:
    data, tx1 = _topics(bootstrap, count=2)
    (tx2,) = _topics(bootstrap, count=1, partitions=2)
    reader = KafkaStreamReader(KafkaSourceConfig(bootstrap, (data, tx1, tx2),
                                                 transaction_topic=(tx1, tx2)))

    with pytest.raises(ConfigError, match=rf"transaction topic '{tx2}'.*has 2 partitions"):
        reader.initialOffset()


# -- a checkpoint that no longer matches its topics ---------------------------------


def _recreate(bootstrap: str, topics: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(topics, operation_timeout=10).values():
        future.result(15)
    create_topics(bootstrap, topics)


def test_recreating_the_topics_under_a_running_checkpoint_stops_the_query_naming_them(
        spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    orders, customers = _topics(bootstrap)
    _produce(bootstrap, orders, _values(6, "o"))
    _produce(bootstrap, customers, _values(2, "c"))
    seen: list[int] = []

    def collect(batch: DataFrame, batch_id: int) -> None:
        seen.append(sum(1 for r in batch.collect() if r[2] >= 0))

    query = (read_stream(spark, bootstrap, [orders, customers]).writeStream
             .foreachBatch(collect).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        deadline = time.monotonic() + 120
        while sum(seen) < 8 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sum(seen) == 8

        # The topics come back empty, then fill up less far than the checkpoint read.
        _recreate(bootstrap, [orders, customers])
        _produce(bootstrap, orders, _values(2, "new"))

        with pytest.raises(Exception) as stopped:  # Spark's wrapper of the source's error
            query.awaitTermination(120)
        message = str(stopped.value)
    finally:
        if query.isActive:
            query.stop()
    # A batch planned between the deletion and the creation finds a topic missing.
    recreated = re.search(rf"CheckpointError: txjoin_kafka: topic '({orders}|{customers})' .* "
                          r"was recreated .*--rebuild", message)
    missing = re.search(rf"ConfigError: txjoin_kafka: topic '({orders}|{customers})' does not "
                        "exist", message)
    assert recreated or missing, message
    assert sum(seen) == 8


def test_checkpoint_offsets_outside_the_topic_name_topic_partition_offset_and_range(
        bootstrap: str) -> None:
    (topic,) = _topics(bootstrap, count=1)
    _produce(bootstrap, topic, _values(5, "o"))
    reader = KafkaStreamReader(KafkaSourceConfig(bootstrap, (topic,)))

    reader.validate({topic: {"0": 5}})  # at the end: fine
    with pytest.raises(CheckpointError) as ahead:
        reader.validate({topic: {"0": 40}})
    assert str(ahead.value) == (
        f"txjoin_kafka: the checkpoint's offset 40 for {topic}[0] is beyond the partition's "
        "end (the topic was recreated or another cluster is configured): the topic now holds "
        "offsets 0..5 (end 5); start a new checkpoint and re-derive the sinks from the topics "
        "with `txjoin run --rebuild`")
    with pytest.raises(CheckpointError, match=r"offset -1 .* below its earliest retained"):
        reader.validate({topic: {"0": -1}})
    with pytest.raises(CheckpointError, match=r"was recreated .*topic id not-the-id is now"):
        reader.validate({topic: {"0": 1}, TOPIC_IDS: {topic: "not-the-id"}})
    # A fresh checkpoint records the ids.
    assert reader.initialOffset()[TOPIC_IDS][topic]


def test_a_checkpoint_ahead_of_its_topics_never_ends_quietly_with_nothing_done(
        spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    (topic,) = _topics(bootstrap, count=1)
    _produce(bootstrap, topic, _values(4, "o"))
    _run(read_stream(spark, bootstrap, [topic]), tmp_path / "cp")
    _recreate(bootstrap, [topic])
    _produce(bootstrap, topic, _values(1, "o"))

    with pytest.raises(Exception, match=rf"CheckpointError: txjoin_kafka: topic '{topic}' "
                                       r".* was recreated"):
        _run(read_stream(spark, bootstrap, [topic]), tmp_path / "cp")
