"""Spark's own kafka source as txjoin reads it, and txjoin's checks around it, on Apache Kafka."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession

from tests.fixtures.broker import create_topics
from txjoin.errors import CheckpointError, ConfigError, ServiceError
from txjoin.ingest.spark.kafka import KafkaTopics, last_offsets, read_stream

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def bootstrap(kafka_broker: str) -> str:
    """The session's broker (tests/conftest.py); this module's topics have their own names."""
    return kafka_broker


def _topics(bootstrap: str, count: int = 2, partitions: int = 1) -> list[str]:
    names = [f"t{uuid.uuid4().hex[:8]}" for _ in range(count)]
    create_topics(bootstrap, names, partitions=partitions)
    return names


def _produce(bootstrap: str, topic: str, values: list[str | None], partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i, value in enumerate(values):
        producer.produce(topic, key=f"k{i}", value=value, partition=partition)
    producer.flush(10)


def _values(n: int, tag: str) -> list[str | None]:
    return [f'{{"{tag}": {i}}}' for i in range(n)]


def _run(df: DataFrame, checkpoint: Path, max_batches: int = 100) -> list[list[tuple]]:
    """Run ``df`` to the end of what is available now; the rows of each micro-batch."""
    batches: list[list[tuple]] = []
    query = (df.writeStream.foreachBatch(
        lambda batch, _id: batches.append([tuple(r) for r in batch.collect()]))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert not query.isActive
    assert len(batches) <= max_batches
    return batches


def test_every_record_arrives_once_in_offset_order_as_strings(
        spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    (orders,) = _topics(bootstrap, count=1, partitions=2)
    _produce(bootstrap, orders, [*_values(5, "a"), None], partition=0)
    _produce(bootstrap, orders, _values(3, "b"), partition=1)
    rows = [r for batch in _run(read_stream(spark, bootstrap, [orders]), tmp_path / "cp")
            for r in batch]
    assert sorted((r[1], r[2]) for r in rows) == [(0, i) for i in range(6)] + \
        [(1, i) for i in range(3)]
    by_partition = {p: [r[2] for r in rows if r[1] == p] for p in (0, 1)}
    assert by_partition == {0: list(range(6)), 1: list(range(3))}  # offset order
    values = {(r[1], r[2]): r[4] for r in rows}
    assert values[(0, 0)] == '{"a": 0}' and values[(0, 5)] is None  # a tombstone: null
    assert all(r[0] == orders and r[3].startswith("k") for r in rows)


def test_a_read_limit_splits_batches_and_a_restart_resumes_where_it_stopped(
        spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    orders, customers = _topics(bootstrap)
    _produce(bootstrap, orders, _values(10, "o"))
    _produce(bootstrap, customers, _values(4, "c"))
    checkpoint = tmp_path / "cp"
    first = _run(read_stream(spark, bootstrap, [orders, customers], max_events=4), checkpoint)
    assert len(first) >= 4 and all(len(b) <= 4 for b in first)
    assert last_offsets(checkpoint) == {orders: {"0": 10}, customers: {"0": 4}}
    _produce(bootstrap, orders, _values(3, "later"))
    second = _run(read_stream(spark, bootstrap, [orders, customers], max_events=4), checkpoint)
    assert sorted(r[2] for b in second for r in b) == [10, 11, 12]


def test_small_topics_apart_arrive_whole_and_a_restart_keeps_the_checkpoints_sources(
        spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    orders, tables = _topics(bootstrap)
    _produce(bootstrap, orders, _values(40, "o"))
    _produce(bootstrap, tables, _values(3, "t"))
    topics = KafkaTopics(bootstrap, [orders, tables])
    counts = topics.partitions()
    checkpoint = tmp_path / "cp"
    sources = topics.sources(checkpoint, counts, max_events=10)
    assert sources == ((orders,), (tables,))
    first = _run(read_stream(spark, bootstrap, [orders, tables], max_events=10,
                             sources=sources), checkpoint)
    # one source of both would read tables a record a batch (its share of 10 by backlog)
    assert sorted(r[2] for r in first[0] if r[0] == tables) == [0, 1, 2]
    assert len(first) >= 4 and all(len([r for r in b if r[0] == orders]) <= 10 for b in first)
    assert last_offsets(checkpoint) == {orders: {"0": 40}, tables: {"0": 3}}

    # restarted: the sources its offset log has, whatever the backlogs are now
    _produce(bootstrap, tables, _values(30, "later"))
    assert topics.sources(checkpoint, counts, max_events=10) == sources
    second = _run(read_stream(spark, bootstrap, [orders, tables], max_events=10,
                              sources=sources), checkpoint)
    assert sorted(r[2] for b in second for r in b) == list(range(3, 33))
    # a checkpoint started with one source keeps one; no limit, or latest: one
    single = tmp_path / "single"
    _run(read_stream(spark, bootstrap, [orders, tables], max_events=10), single)
    assert topics.sources(single, counts, max_events=10) == ()
    assert topics.sources(tmp_path / "new", counts, max_events=None) == ()
    assert topics.sources(tmp_path / "new", counts, 10, starting_offsets="latest") == ()


def test_topics_are_checked_with_one_line_errors(bootstrap: str) -> None:
    (data,) = _topics(bootstrap, count=1, partitions=3)
    (tx,) = _topics(bootstrap, count=1, partitions=2)
    assert KafkaTopics(bootstrap, [data]).partitions() == {data: 3}
    with pytest.raises(ConfigError, match=rf"transaction topic '{tx}' .* has 2 partitions but "
                                          "must have exactly 1"):
        KafkaTopics(bootstrap, [data], [tx]).partitions()
    with pytest.raises(ConfigError, match="topic 'no_such_topic' does not exist"):
        KafkaTopics(bootstrap, ["no_such_topic"]).partitions()
    with pytest.raises(ServiceError, match=r"cannot reach the Kafka brokers at '127\.0\.0\.1:1'"):
        KafkaTopics("127.0.0.1:1", ["x"]).partitions()


def _recreate(bootstrap: str, topics: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(topics, operation_timeout=10).values():
        future.result(15)
    deadline = time.monotonic() + 30
    # Kafka deletes asynchronously (creating too early finds the old topic still there).
    while set(topics) & set(admin.list_topics(timeout=10).topics):
        assert time.monotonic() < deadline, f"{topics} still exist 30 s after their deletion"
        time.sleep(0.2)
    create_topics(bootstrap, topics)


def test_a_recreated_topic_or_offsets_outside_it_refuse_the_checkpoint(
        spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    (topic,) = _topics(bootstrap, count=1)
    _produce(bootstrap, topic, _values(4, "o"))
    checkpoint = tmp_path / "cp"
    topics = KafkaTopics(bootstrap, [topic])
    topics.check_checkpoint(checkpoint, topics.partitions())  # a new checkpoint: records ids
    _run(read_stream(spark, bootstrap, [topic]), checkpoint)
    topics.check_checkpoint(checkpoint, topics.partitions())  # unchanged: fine

    _recreate(bootstrap, [topic])
    _produce(bootstrap, topic, _values(1, "o"))
    with pytest.raises(CheckpointError, match=rf"kafka: topic '{topic}' .* was recreated since "
                                              r"the checkpoint was written .*--rebuild"):
        topics.check_checkpoint(checkpoint, topics.partitions())
    # Without the recorded ids (a checkpoint of another tool), the offsets still tell.
    (checkpoint / "txjoin-topics.json").unlink()
    with pytest.raises(CheckpointError) as ahead:
        topics.check_checkpoint(checkpoint, topics.partitions())
    assert str(ahead.value) == (
        f"kafka: the checkpoint's offset 4 for {topic}[0] is beyond the partition's end (the "
        "topic was recreated or another cluster is configured): the topic now holds offsets "
        "0..1 (end 1); start a new checkpoint and re-derive the sinks from the topics with "
        "`txjoin run --rebuild`")


def _change(table: str, row: dict[str, object], xid: int) -> str:
    import json

    schema, name = table.split(".")
    return json.dumps({"op": "c", "before": None, "after": row,
                       "source": {"schema": schema, "table": name, "txId": xid, "lsn": xid,
                                  "ts_ms": 1},
                       "transaction": {"id": f"{xid}:{xid}", "total_order": 1,
                                       "data_collection_order": 1}})


def test_a_typo_in_a_declared_column_is_refused_from_the_topics_newest_records(
        bootstrap: str, tmp_path: Path) -> None:
    """Issue 40 item 4 where no source database is at hand (your own Debezium, no local
    stack): `run` reads the newest records of each table topic before Spark starts, and a
    declared column they lack, with a near name they carry, is one line naming the job
    file, the topic and the near name. Before, the run started and failed only when a
    record of that table arrived, with advice for a dropped column."""
    from txjoin.job import Job, Lookup, Output, Table
    from txjoin.pipeline.pipeline import RunConfig
    from txjoin.pipeline.run import preflight

    prefix = f"p{uuid.uuid4().hex[:8]}"

    def job(loan_columns: dict[str, str], defaults: dict[str, object] | None = None) -> Job:
        return Job(name="loans", source_file="jobs/library.py",
                   tables=[Table("public.books", {"id": "int", "title": "text"}),
                           Table("public.loans", loan_columns, defaults=defaults or {})],
                   fact="public.loans", fact_alias="l",
                   lookups=[Lookup("b", "public.books", parent="l", on={"id": "book_id"})],
                   output=Output(table="loans_out", key={"loan_id": "l.id"},
                                 columns={"title": "b.title"}))

    books, loans = f"{prefix}.public.books", f"{prefix}.public.loans"
    create_topics(bootstrap, [books, loans, f"{prefix}.transaction"])
    _produce(bootstrap, books, [_change("public.books", {"id": 1, "title": "Dune"}, 7)])
    # The newest record of the loans topic is a tombstone (Debezium's after a delete).
    loan = {"id": 1, "book_id": 1, "returned_at": None}
    _produce(bootstrap, loans, [_change("public.loans", loan, 7),
                                _change("public.loans", {**loan, "id": 2}, 8), None])

    def config(name: str) -> RunConfig:
        return RunConfig(topic_prefix=prefix, bootstrap_servers=bootstrap, rebuild=True,
                         checkpoint_dir=str(tmp_path / name / "cp"),
                         output_dir=str(tmp_path / name / "out"))

    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        preflight(job({"id": "int", "book_id": "int", "returnd_at": "timestamp"}),
                  config("typo"))
    seconds = time.monotonic() - started
    assert str(caught.value) == (
        f"jobs/library.py: table public.loans has no column 'returnd_at' in the newest "
        f"records of topic '{loans}' (did you mean 'returned_at'?); its columns: id, book_id, "
        f"returned_at. Fix the job file's Table columns (nothing was read or written)")
    assert seconds < 5, seconds
    assert not (tmp_path / "typo").exists()
    # The right names pass; so does a column with a default (dropped at the source) and one
    # with no near name (left to the run, whose message covers a dropped column).
    preflight(job({"id": "int", "book_id": "int", "returned_at": "timestamp"}),
              config("right"))
    preflight(job({"id": "int", "book_id": "int", "returnd_at": "timestamp"},
                  {"returnd_at": None}), config("default"))
    preflight(job({"id": "int", "book_id": "int", "due_on": "date"}), config("dropped"))
