"""Table topics with several partitions: Debezium spreads a table's events by row key.

Kafka keeps order only within a partition, so a partitioned delivery reads each
partition in order with any lag between partitions of one topic. Properties,
with the job, workload (connector restarts and resends included), partition
count, shard count and delivery drawn at random: after every batch every shard
has released the same transactions, the union of their outputs is the oracle's
output after that committed prefix, and at the end it is the oracle's after the
last transaction. The source reports caught-up partitions, or only whole
topics. Example tests pin the rules that differ for such topics: a closing row
settles only its own partition, and a record from an undeclared partition, or a
transaction topic's partition > 0, is refused.
"""

from __future__ import annotations

import zlib
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.delivery import Pipeline, insert, only
from tests.unit.strategies import Production, deliveries, produce, workloads
from tests.unit.test_failure_modes import enriched, order, pizzeria
from tests.unit.test_properties import JOB_VARIANTS, ORDERS
from txjoin.core.assembly import TopicPartitions
from txjoin.core.oracle import outputs_after_each
from txjoin.core.sharded import ShardedEngine
from txjoin.errors import ConfigError
from txjoin.scenarios.synthesize import Produced

PREFIX = "shop."


def partition_of(record: Produced, parts: int) -> int:
    """Kafka's default partitioner in spirit: a record's partition follows its key."""
    if record.table is None or parts == 1:
        return 0  # the transaction topic has one partition
    return zlib.crc32((record.key or "").encode()) % parts


def split(production: Production, parts: int) -> tuple[Production, dict[str, tuple[str, int]]]:
    """The production with each table topic's partitions as topics of their own
    (``<topic>#<p>``, offsets from 0), so the delivery strategy reads each partition in
    order with any lag between them; and pseudo-topic -> (topic, partition)."""
    where: dict[str, tuple[str, int]] = {}
    topics: list[str] = []
    for topic in production.topics:
        table_topic = any(r.topic == topic and r.table is not None for r in production.records)
        for p in range(parts if table_topic else 1):
            name = f"{topic}#{p}"
            where[name] = (topic, p)
            topics.append(name)
    offsets: dict[str, int] = {}
    moved: dict[int, Produced] = {}
    records = []
    for r in production.records:
        name = f"{r.topic}#{partition_of(r, parts)}"
        offset = offsets.get(name, 0)
        offsets[name] = offset + 1
        moved[id(r)] = replace(r, topic=name, offset=offset)
        records.append(moved[id(r)])
    pairs = [(moved[id(a)], moved[id(b)]) for a, b in production.must_precede_end]
    return Production(records, pairs, topics), where


def run_partitioned(job: Any, workload: Any, data: Any, parts: int, n_shards: int) -> None:
    production, where = split(produce(job, workload), parts)
    batches = data.draw(deliveries(production), label="delivery")
    expected = outputs_after_each(job, workload.snapshot, workload.transactions)
    counts = dict.fromkeys(job.table_names, parts) if parts > 1 else {}
    engine = ShardedEngine(job, n_shards)
    applied: dict[Any, Any] = {}
    last_k = -1
    for n, batch in enumerate(batches):
        records = [(*where[r.topic], r.offset, r.value) for r in batch.records]
        # a topic is read to its end when every one of its partitions is
        caught = {where[t][0].removeprefix(PREFIX) for t in batch.caught_up}
        caught -= {where[t][0].removeprefix(PREFIX) for t in where if t not in batch.caught_up}
        caught_parts: dict[str, set[int]] = {}
        for t in batch.caught_up:
            topic, p = where[t]
            if topic.removeprefix(PREFIX) in counts:
                caught_parts.setdefault(topic.removeprefix(PREFIX), set()).add(p)
        # a source that reports only whole topics is drawn too
        if data.draw(st.booleans(), label=f"whole topics only {n}"):
            caught_parts = {}
        partitions = TopicPartitions(counts, {t: frozenset(p) for t, p in caught_parts.items()})
        drop = data.draw(st.sets(st.integers(0, n_shards - 1)), label=f"drop cache {n}")
        for ch in engine.process(records, caught, drop_cache=drop, partitions=partitions):
            if ch.row is None:
                applied.pop(ch.key, None)
            else:
                applied[ch.key] = ch.row
        assert applied == engine.outputs(), "the change stream disagrees with the shards' state"
        k = engine.commit_seq  # asserts every shard released the same prefix
        if not engine.engines()[0].assembler.snapshot.done:
            assert applied == {}
            continue
        assert k >= last_k
        last_k = k
        assert applied == expected[k], f"batch {n}: not the oracle's output after T{k}"
    assert engine.commit_seq == len(workload.transactions)
    assert applied == expected[-1]


@pytest.mark.parametrize("variant", sorted(JOB_VARIANTS))
@given(data=st.data())
def test_partitioned_topics_still_give_committed_prefixes_only(variant: str, data: Any) -> None:
    job, rows = JOB_VARIANTS[variant]
    workload = data.draw(workloads(rows), label="workload")
    parts = data.draw(st.integers(1, 3), label="partitions")
    n_shards = data.draw(st.integers(1, 4), label="shards")
    run_partitioned(job, workload, data, parts, n_shards)


CLIENTS_IN_3 = TopicPartitions({"public.clients": 3})


def test_a_partitioned_table_settles_when_every_partition_has_shown_its_end() -> None:
    """The closing row proves only its own partition read: another partition's snapshot rows
    may still come. Each partition settles by its closing row, a streaming event read from
    it, or the source reporting it read to its end after the snapshot finished."""
    pipe = Pipeline(ORDERS)
    snapshot = pipe.snapshot({"clients": [{"id": 1, "name": "Ann"}, {"id": 2, "name": "Bob"}]})
    snap = pipe.engine.assembler.snapshot
    first, last = [r for r in snapshot if r.table == "public.clients"]
    engine = pipe.engine
    engine.process([(last.topic, 1, 0, last.value)], partitions=CLIENTS_IN_3)
    assert "public.clients" not in snap.settled  # partition 1 only
    engine.process([(first.topic, 0, 0, first.value)], partitions=TopicPartitions(
        {"public.clients": 3}, {"public.clients": frozenset({0})}))
    assert "public.clients" not in snap.settled  # partitions 0 and 1
    engine.process([], partitions=TopicPartitions(
        {"public.clients": 3}, {"public.clients": frozenset({2})}))
    assert "public.clients" in snap.settled


def test_a_partitioned_table_also_settles_when_its_whole_topic_is_read() -> None:
    pipe = Pipeline(ORDERS)
    snapshot = pipe.snapshot({"clients": [{"id": 1, "name": "Ann"}, {"id": 2, "name": "Bob"}]})
    last = [r for r in snapshot if r.table == "public.clients"][-1]
    pipe.engine.process([(last.topic, 1, 0, last.value)], partitions=CLIENTS_IN_3)
    pipe.engine.process([], caught_up={"public.clients"}, partitions=CLIENTS_IN_3)
    assert "public.clients" in pipe.engine.assembler.snapshot.settled


def test_a_record_from_an_undeclared_partition_is_refused_saying_why_and_what_to_do() -> None:
    pipe = pizzeria()
    records = pipe.commit("place", insert("orders", **order(100, [1])))
    event = only(records, kind="data")[0]
    with pytest.raises(ConfigError) as exc:
        pipe.engine.process([(event.topic, 1, event.offset, event.value)])
    message = str(exc.value)
    assert "\n" not in message
    assert f"{event.topic} has a record in partition 1 (offset {event.offset})" in message
    assert "did not declare" in message and "--max-events-per-trigger" in message
    end = only(records, kind="end")[0]
    with pytest.raises(ConfigError, match="transaction topic must have exactly 1 partition"):
        pipe.engine.process([(end.topic, 1, end.offset, end.value)],
                            partitions=TopicPartitions({"public.orders": 2}))
    with pytest.raises(ConfigError, match=r"partition 2 .*did not declare"):  # beyond the count
        pipe.engine.process([(event.topic, 2, event.offset, event.value)],
                            partitions=TopicPartitions({"public.orders": 2}))
    # Nothing was applied: the same records from partition 0 go through.
    pipe.deliver_rest()
    assert pipe.output[(100,)] == enriched(100, [1])
