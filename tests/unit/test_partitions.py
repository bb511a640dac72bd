"""Table topics with several partitions: Debezium spreads a table's events by row key.

Kafka keeps order only within a partition. The property test that draws the
partition count (with the workload, restarts and resends included, the shard
count and a delivery reading partitions with any lag between them) is
``test_sharding.test_union_of_shard_outputs_is_always_a_committed_prefix``.
These example tests pin the rules that differ for such topics: a closing row
settles only its own partition, and a record from an undeclared partition, or a
transaction topic's partition > 0, is refused.
"""

from __future__ import annotations

import pytest

from tests.unit.delivery import Pipeline, insert, only
from tests.unit.test_failure_modes import enriched, order, pizzeria
from tests.unit.test_properties import ORDERS
from txjoin.errors import ConfigError
from txjoin.sequence.assembly import TopicPartitions

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
    assert "did not declare" in message and "restart the job" in message
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
