"""One transaction of many events, in the partitioned engine: its budget, and its log.

A transaction is buffered until it is complete (on disk past ``spill.SPILL_EVENTS``
events; a run may set a budget, ``--max-transaction-bytes``), and
while it is open over many micro-batches each batch's log segment carries only what the
batch added to it (layout 7), so a restore reads each event once. Apart from
test_sharding.py so that scripts/test.sh's two workers can run the two files side by side.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.unit.test_properties import JOB_VARIANTS
from txjoin.errors import TransactionTooLargeError
from txjoin.join.shard import long_lived_state
from txjoin.join.sharded import ShardedEngine


@functools.cache  # the 200k events: both budget tests read them
def _big_transaction(events: int) -> tuple[Any, list[tuple[str, int, int, str | None]], int]:
    """A snapshot of 20 orders, then one transaction updating them ``events`` times (made
    once for the tests that use it: ~9 s for 200,000 events here). Not to be changed."""
    from txjoin.join.oracle import RowChange, SourceTransaction
    from txjoin.scenarios.synthesize import Synthesizer
    from txjoin.scenarios.workload import pizzeria_workload

    job, _ = JOB_VARIANTS["orders/as_of_fact"]
    snapshot, _txs = pizzeria_workload(0, seed=1, snapshot_orders=20)
    orders = snapshot["public.orders"]
    changes = [RowChange("update", "public.orders",
                         dict(orders[i % 20], pizzas=[1 + i % 4, 1 + (i // 4) % 4]))
               for i in range(events)]
    synth = Synthesizer(job)
    with long_lived_state():  # kept for the session: out of the collector's way
        produced = [*synth.snapshot(snapshot),
                    *synth.transaction(SourceTransaction("big", changes))]
        records = [(r.topic, 0, r.offset, r.value) for r in produced]
    return job, records, synth.xid


def test_a_transaction_over_the_budget_stops_with_its_xid_and_size() -> None:
    job, records, xid = _big_transaction(200_000)
    every = [*job.table_names, "transaction"]
    engine = ShardedEngine(job, 2, max_transaction_bytes=8 << 20)
    with pytest.raises(TransactionTooLargeError, match=f"transaction xid {xid} is larger than "
                                                       f"--max-transaction-bytes {8 << 20}"):
        for start in range(0, len(records), 50_000):  # delivered over several batches
            engine.process(records[start:start + 50_000], every)


def test_a_200k_event_transaction_is_applied_whole_with_the_defaults() -> None:
    """No budget by default: the transaction's events wait on disk (sequence/spill.py)."""
    job, records, _xid = _big_transaction(200_000)
    every = [*job.table_names, "transaction"]
    engine = ShardedEngine(job, 2)
    emitted = []
    for start in range(0, len(records), 50_000):
        emitted.append(engine.process(records[start:start + 50_000], every))
    # nothing of the transaction before its last batch; then each order's last version once
    assert all(ch.commit_seq == 0 for batch in emitted[:-1] for ch in batch)
    last = [ch for ch in emitted[-1] if ch.commit_seq == 1]
    assert len(last) == 20 and engine.commit_seq == 1


def test_a_transaction_open_over_many_batches_logs_each_event_once() -> None:
    """A batch's log segment carries the events it added to a transaction that was open
    before it, not the whole transaction again (layout 7): the segments of a transaction
    delivered over ten batches stay the size of a batch, and a shard restored from them
    at every batch holds exactly the state of one that never stopped."""
    job, records, _xid = _big_transaction(10_000)
    every = [*job.table_names, "transaction"]
    steady, restored = ShardedEngine(job, 2), ShardedEngine(job, 2)
    sizes = []
    for start in range(0, len(records), 1_000):
        chunk = records[start:start + 1_000]
        before = [s.written for s in restored.stores]
        assert steady.process(chunk, every) == restored.process(chunk, every,
                                                                drop_cache=range(2))
        sizes.append(sum(s.written for s in restored.stores) - sum(before))
        for a, b in zip(steady.engines(), restored.engines(), strict=True):
            assert a.state() == b.state()
            assert a.outputs() == b.outputs()
    assert steady.commit_seq == 1 and len(sizes) == 11
    # the snapshot's batch aside, no segment grows with the batches before it (whole, the
    # tenth would be ten times the first)
    assert max(sizes[2:-1]) < 1.5 * sizes[1], sizes


def test_a_layout_6_log_continues_under_layout_7(monkeypatch: pytest.MonkeyPatch) -> None:
    """A log written by txjoin before layout 7 (every changed open transaction whole in
    each segment) is read as it is and continued; from its next segment on it says 7."""
    from tests.unit.delivery import continue_older_layout
    from txjoin.sequence.assembly import Assembler

    def layout_6_state(self: Assembler, rows: bool = True) -> dict[str, Any]:
        assert not rows
        return {"changed": {x: self.pending[x] for x in sorted(self.touched)
                            if x in self.pending},
                "gone": sorted(self.gone), "duplicates": self.duplicates,
                "snapshot": self.snapshot.state(rows=False)}

    job, records, _xid = _big_transaction(10_000)
    continued = continue_older_layout(job, records, 2_000, 6, layout_6_state, monkeypatch)
    assert continued.commit_seq == 1


def test_a_layout_9_log_with_a_large_open_transaction_continues(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A log written before open transactions spilled (layout 9: their events in lists,
    their identities whole) is read as it is and continued: the transaction restored from
    it spills once it grows, and the outputs equal a run's that was never restored."""
    from tests.unit.delivery import continue_older_layout
    from txjoin.join.state_log import LAYOUT_VERSION
    from txjoin.sequence import spill
    from txjoin.sequence.assembly import Assembler

    assert LAYOUT_VERSION > 9
    monkeypatch.setattr(spill, "SPILL_EVENTS", 500)
    job, records, _xid = _big_transaction(10_000)
    continued = continue_older_layout(job, records, 2_000, 9, Assembler.state, monkeypatch,
                                      older=[(spill, "SPILL_EVENTS", 10**9)])
    assert continued.commit_seq == 1


def test_a_layout_10_snapshot_of_the_state_as_bytes_is_restored_and_continued(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before layout 11 a log's snapshot held the engine's state pickled into bytes first
    (a second, uncompressed copy of the shard in memory while it was written, and again
    while it was read); layout 11 pickles the state itself into the store. A layout-10 log
    whose snapshot (taken inside a large open transaction) is in the old form is restored
    from it and continued, batch for batch as a run never restored."""
    from tests.unit.delivery import continue_older_layout
    from txjoin.join import state_log
    from txjoin.join.state_log import SNAPSHOT, ShardLog, engine_rows
    from txjoin.sequence import spill
    from txjoin.sequence.assembly import Assembler

    written = []

    def layout_10_compact(self: ShardLog, engine: Any, meta: dict[str, Any], version: int,
                          token: str) -> int:
        state = engine.state_bytes()
        self.store.clear()
        size = self._write(SNAPSHOT, version, {"engine": state, "token": token})
        meta.update(snapshot=version, snapshot_rows=engine_rows(engine), since_snapshot=0,
                    segments=0)
        written.append(version)
        return size

    monkeypatch.setattr(spill, "SPILL_EVENTS", 500)
    job, records, _xid = _big_transaction(10_000)
    continued = continue_older_layout(
        job, records, 2_000, 10, Assembler.state, monkeypatch,
        older=[(ShardLog, "_compact", layout_10_compact),
               (state_log, "MAX_SEGMENTS", 1)])
    assert written, "no layout-10 snapshot was taken"
    assert continued.commit_seq == 1

    # The staged engine's layout 11 the same: its sequencer's, owners' and shards' snapshots
    # in the old form, then each part restored from its log every batch.
    from txjoin.join.placement import splittable
    from txjoin.join.staged import StagedEngine

    written.clear()
    every = [*job.table_names, "transaction"]
    chunks = [records[start:start + 2_000] for start in range(0, len(records), 2_000)]
    steady, old = (StagedEngine(job, 2, split=splittable(job)) for _ in range(2))
    with monkeypatch.context() as patch:
        patch.setattr(ShardLog, "_compact", layout_10_compact)
        patch.setattr(state_log, "MAX_SEGMENTS", 1)
        for part in chunks[:3]:
            assert steady.process(part, every) == old.process(part, every)
    assert written, "no old-form snapshot was taken"
    for part in chunks[3:]:
        assert steady.process(part, every) == old.process(part, every, drop_cache=range(2),
                                                          drop_sequencer=True)
    assert steady.commit_seq == old.commit_seq == 1 and steady.outputs() == old.outputs()
