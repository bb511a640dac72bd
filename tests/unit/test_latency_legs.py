"""Where a change's time goes (txjoin.stack.latency): the legs add up to the whole, per sink."""

from __future__ import annotations

import pytest

from txjoin.sinks.handoff import GroupCommit
from txjoin.stack.latency import CaptureTimes, Legs, legs_per_sink

pytestmark = pytest.mark.unit


def _commit(sink: str, batch: int, ts: list[int], started: float, finished: float,
            wrote: bool = True) -> GroupCommit:
    return GroupCommit(first_batch=batch, last_batch=batch, batches=1, changes=len(ts),
                       commit_ts_ms=ts, started_at=started, finished_at=finished, wrote=wrote,
                       sink=sink)


def test_each_leg_of_a_change_and_their_sum_is_its_commit_to_sink_time() -> None:
    # Committed at 1000 ms; Debezium at 1050; its last record in Kafka at 1070; the batch
    # reading it started at 1.2 s, its PostgreSQL commit ran 1.9-2.0 s; Delta's group commit
    # holding it ran 11.0-13.5 s.
    captured = {1000: (1050, 1070)}
    commits = [_commit("postgres", 4, [1000], 1.9, 2.0),
               _commit("delta", 4, [1000], 11.0, 13.5)]
    # Of the batch's 0.7 s before the sink, 0.5 s computing it (0.2 s in its slowest shard).
    legs = legs_per_sink(captured, {4: (1.2, 0.5, 0.2)}, commits)
    pg, delta = legs["postgres"], legs["delta"]
    assert pg.totals == [pytest.approx(1000.0)]
    assert pg.legs == [pytest.approx((50, 20, 130, 300, 200, 200, 100))]
    assert sum(pg.legs[0]) == pytest.approx(pg.totals[0])
    assert delta.totals == [pytest.approx(12500.0)]
    assert delta.legs == [pytest.approx((50, 20, 130, 300, 200, 200, 100, 9000, 2500))]
    assert sum(delta.legs[0]) == pytest.approx(delta.totals[0])


def test_replayed_batches_and_changes_not_captured_are_left_out() -> None:
    commits = [_commit("postgres", 1, [5], 1.0, 1.1, wrote=False),  # a replay: not timed
               _commit("postgres", 2, [5, 9], 2.0, 2.1),  # 9 was never seen in Kafka
               _commit("postgres", 3, [7], 3.0, 3.1)]  # batch 3's start is unknown
    legs = legs_per_sink({5: (6, 7), 7: (8, 9)}, {1: (0.5, 0, 0), 2: (1.5, 0, 0)}, commits)
    assert legs["postgres"].totals == [pytest.approx(2100 - 5)]
    assert legs["postgres"].legs[0][2] == pytest.approx(1500 - 7)  # waited in its own batch
    assert legs["delta"].totals == []


def test_the_slowest_one_percent_shows_what_makes_up_the_p99() -> None:
    legs = Legs(("fast", "slow"))
    for i in range(99):
        legs.add(10 + i * 0.01, (10 + i * 0.01, 0))
    legs.add(500, (10, 490))  # one outlier, made of the second leg
    summary = legs.summary()
    assert summary["changes"] == 100
    assert summary["total"]["p99"] == pytest.approx(10.98)
    assert summary["slow"]["slowest_1pct_mean"] == pytest.approx(490)
    assert summary["fast"]["slowest_1pct_mean"] == pytest.approx(10)
    assert Legs(("a",)).summary() == {"changes": 0}


def test_capture_times_take_the_latest_record_of_a_transaction_end_marker_included() -> None:
    times = CaptureTimes("unused:9092", ["p.public.orders"], "p.transaction", 0)
    times._record("p.public.orders", {"source": {"txId": 42, "ts_ms": 1000}, "ts_ms": 1040}, 1060)
    times._record("p.public.orders", {"source": {"txId": 42, "ts_ms": 1000}, "ts_ms": 1045}, 1065)
    times._record("p.transaction", {"status": "BEGIN", "id": "42:100"}, 1001)
    times._record("p.transaction", {"status": "END", "id": "42:180"}, 1072)
    # Another transaction in the same millisecond, later to Kafka.
    times._record("p.public.orders", {"source": {"txId": 43, "ts_ms": 1000}, "ts_ms": 1050}, 1080)
    # A transaction whose data events were not read (before the consumer started): left out.
    times._record("p.transaction", {"status": "END", "id": "41:90"}, 990)
    assert times.by_commit_ms() == {1000: (1050, 1080)}
