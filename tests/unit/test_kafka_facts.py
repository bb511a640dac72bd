"""The caught-up rule for Spark's kafka source under a read limit (``KafkaFacts.caught_up``).

``spark_rate_limit`` is Spark 4.2's ``KafkaMicroBatchStream.rateLimit`` (spark-sql-kafka
4.2.0), in Python with the same float arithmetic: the end offsets a batch is planned with
when ``maxOffsetsPerTrigger`` is set. The rule must never call a batch caught up while a
partition was cut short (that would settle a snapshot or confirm a restarted transaction
too early), and must call a batch caught up once the backlog is small.
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from txjoin.ingest.spark.kafka import KafkaFacts


def spark_rate_limit(limit: int, start: dict[int, int], latest: dict[int, int]) -> dict[int, int]:
    sizes = {tp: latest[tp] - start[tp] for tp in latest if latest[tp] - start[tp] > 0}
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(latest)
    ends = {}
    for tp, end in latest.items():
        if tp not in sizes:
            ends[tp] = end
            continue
        prorate = limit * (sizes[tp] / total)
        prorate_long = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        ends[tp] = min(end, start[tp] + prorate_long)
    return ends


backlogs = st.lists(st.integers(0, 5000), min_size=1, max_size=12)


@given(backlogs, st.integers(1, 20000), st.integers(0, 10**6))
def test_a_batch_called_caught_up_read_every_partition_to_its_end(
        backlog: list[int], limit: int, base: int) -> None:
    start = {tp: base + 17 * tp for tp in range(len(backlog))}
    latest = {tp: start[tp] + n for tp, n in enumerate(backlog)}
    ends = spark_rate_limit(limit, start, latest)
    records = sum(ends[tp] - start[tp] for tp in start)
    facts = KafkaFacts({"t": len(backlog)}, max_events=limit)
    if facts.caught_up(records):
        assert ends == latest, (backlog, limit, ends)


@given(backlogs, st.integers(1, 20000))
def test_a_small_backlog_is_caught_up_in_one_batch(backlog: list[int], limit: int) -> None:
    facts = KafkaFacts({"t": len(backlog)}, max_events=limit)
    if sum(backlog) < limit - len(backlog):
        start = dict.fromkeys(range(len(backlog)), 0)
        latest = dict(enumerate(backlog))
        assert spark_rate_limit(limit, start, latest) == latest
        assert facts.caught_up(sum(backlog))


def test_without_a_limit_every_batch_is_caught_up() -> None:
    assert KafkaFacts({"a": 3, "b": 1}).caught_up(10**9)
    assert KafkaFacts({"a": 3, "b": 1}).several() == {"a": 3}
