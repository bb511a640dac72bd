"""The demo's warm-up (txjoin/stack/demo.py): at least --warm-up, then until the stream keeps
pace, at most --warm-up-max; the changes after it are timed, those within it apart."""

from __future__ import annotations

import pytest

from txjoin.pipeline.pipeline import BatchReport
from txjoin.stack.demo import PACE_BATCHES, PACE_GAP_S, JobProgress

BEGAN = 1_000_000.0  # unix s: when the workload began writing


def _batch(progress: JobProgress, batch_id: int, started: float, seconds: float = 0.5,
           committed_at: list[float] | None = None) -> None:
    progress.on_batch(BatchReport(
        batch_id=batch_id, records=1, changes=1, commit_seq=batch_id, snapshot_done=True,
        snapshot_released=True, waiting=0, transactions_released=1, seconds=seconds,
        commit_ts_ms=[int(t * 1000) for t in committed_at or []],
        finished_at=BEGAN + started + seconds))


def _warming(least: float, most: float) -> JobProgress:
    progress = JobProgress("orders")
    progress.start_warm_up(BEGAN, least, most)
    return progress


def test_the_warm_up_lasts_its_least_then_ends_at_the_first_paced_batch() -> None:
    progress = _warming(10, 60)
    # a cold start: slow batches, then every second
    starts = [0.0, 6.0, 11.0, 13.5, 14.5, 15.5, 16.5, 17.5]
    for batch_id, started in enumerate(starts[:4]):
        _batch(progress, batch_id, started, committed_at=[BEGAN + started - 0.1])
        assert not progress.timed.is_set(), started  # past its least, not paced yet
    _batch(progress, 4, starts[4])
    _batch(progress, 5, starts[5])
    assert not progress.timed.is_set()  # two gaps within PACE_GAP_S, the one before not
    _batch(progress, 6, starts[6])
    assert PACE_BATCHES == 3 and PACE_GAP_S >= 1.0
    assert progress.timed.is_set() and progress.kept_pace is True
    assert progress.latency_from_ms == (BEGAN + 16.5 + 0.5) * 1000
    # its changes were the warm-up's; a change committed after it is timed
    assert progress.sink_latencies_ms == {} and progress.latencies_ms == []
    _batch(progress, 7, starts[7], committed_at=[BEGAN + 17.2])
    assert progress.latencies_ms == [pytest.approx(800.0)]


def test_paced_batches_before_the_least_do_not_end_it() -> None:
    progress = _warming(10, 60)
    for batch_id in range(9):
        _batch(progress, batch_id, float(batch_id))
    assert not progress.timed.is_set()
    _batch(progress, 9, 9.6)  # finished at 10.1 s
    assert progress.timed.is_set() and progress.kept_pace is True


def test_a_stream_that_never_keeps_pace_is_timed_from_the_most() -> None:
    progress = _warming(10, 60)
    for batch_id in range(12):
        _batch(progress, batch_id, batch_id * 5.0)  # 5 s apart
    assert not progress.timed.is_set()
    _batch(progress, 12, 60.0)
    assert progress.timed.is_set() and progress.kept_pace is False
    # without a batch at all, the demo's timer ends it (end_warm_up): once only
    idle = _warming(10, 60)
    idle.end_warm_up(BEGAN + 60.0)
    idle.end_warm_up(BEGAN + 70.0)
    assert idle.kept_pace is False and idle.latency_from_ms == (BEGAN + 60.0) * 1000


def test_no_warm_up_times_every_change() -> None:
    progress = _warming(0, 0)
    assert progress.timed.is_set() and progress.kept_pace is None
    assert progress.latency_from_ms == BEGAN * 1000


def test_the_warm_up_runs_its_least_micro_batches_within_its_most() -> None:
    progress = JobProgress("orders")
    progress.start_warm_up(BEGAN, 10, 60, least_batches=30)
    # paced from the start, past its least seconds at batch 20: still warming
    for batch_id in range(29):
        _batch(progress, batch_id, batch_id * 0.5)
        assert not progress.timed.is_set(), batch_id
    _batch(progress, 29, 14.5)  # the 30th batch started within the warm-up
    assert progress.timed.is_set() and progress.kept_pace is True
    assert progress.warm_up_batches == 30
    assert progress.latency_from_ms == (BEGAN + 14.5 + 0.5) * 1000
    # too few batches by its most: timed from there, as a stream that never kept pace
    slow = JobProgress("orders")
    slow.start_warm_up(BEGAN, 10, 60, least_batches=30)
    for batch_id in range(20):
        _batch(slow, batch_id, batch_id * 2.5)  # paced (within PACE_GAP_S) but slow
    assert not slow.timed.is_set()
    _batch(slow, 20, 59.6)  # finished at 60.1 s
    assert slow.timed.is_set() and slow.kept_pace is False and slow.warm_up_batches == 21
