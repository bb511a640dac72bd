"""The outbox between a batch and its sinks: durable before Spark commits, in order, once.

The sinks here are in-memory ledgers with the real sinks' contract (a batch they
already hold is skipped); the Delta and PostgreSQL sinks behind the outbox are
tested end to end by the Spark kill -9 test (tests/spark/test_pipeline.py), which
kills the driver right after a batch was handed over and before its sinks commit it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txjoin.sinks.lineage import Lineage
from txjoin.sinks.outbox import OUTBOX_DIR, Outbox, Parcel

SCHEMA = pa.schema([("order_id", pa.int64()), ("total", pa.decimal128(10, 2)),
                    ("_commit_seq", pa.int64())])


def parcel(batch_id: int, rows: int = 2) -> Parcel:
    table = pa.table({"order_id": list(range(rows)), "total": [None] * rows,
                      "_commit_seq": [batch_id] * rows}, schema=SCHEMA)
    return Parcel(batch_id, table, Lineage("ck", batch_id * 10), {"records": rows * 3})


class Killed(BaseException):
    """kill -9 of the process, as far as the outbox's thread can tell."""


class Ledger:
    """A sink's contract: each batch applied once, in order; a held batch is skipped."""

    def __init__(self, fail_on: set[int] | None = None) -> None:
        self.applied: list[int] = []
        self.tables: dict[int, pa.Table] = {}
        self.fail_on = set(fail_on or ())

    def deliver(self, parcel: Parcel) -> None:
        if parcel.batch_id in self.fail_on:
            raise RuntimeError(f"sink down at batch {parcel.batch_id}")
        if self.applied and parcel.batch_id <= self.applied[-1]:
            return  # held already: skipped
        self.applied.append(parcel.batch_id)
        self.tables[parcel.batch_id] = parcel.changes


def test_batches_reach_the_sinks_in_order_and_leave_nothing_behind(tmp_path: Path) -> None:
    ledger = Ledger()
    outbox = Outbox(tmp_path, ledger.deliver)
    for batch_id in range(5):
        outbox.put(parcel(batch_id, rows=batch_id + 1))
    outbox.wait()
    assert ledger.applied == [0, 1, 2, 3, 4]
    assert ledger.tables[3].equals(parcel(3, rows=4).changes)
    assert outbox.stored() == []
    outbox.close()


def test_one_batch_in_flight_a_hand_off_waits_for_the_previous_commit(tmp_path: Path) -> None:
    release = threading.Event()
    seen: list[int] = []

    def slow(p: Parcel) -> None:
        release.wait(10)
        seen.append(p.batch_id)

    outbox = Outbox(tmp_path, slow)
    outbox.put(parcel(0))
    assert outbox.stored() == [0]  # durable before put returned
    second = threading.Thread(target=outbox.put, args=(parcel(1),))
    second.start()
    second.join(0.3)
    assert second.is_alive() and seen == []  # waits for batch 0's sinks
    release.set()
    second.join(10)
    outbox.wait()
    assert seen == [0, 1]
    outbox.close()


def test_a_failed_commit_stops_the_next_hand_off_and_stays_for_recovery(tmp_path: Path) -> None:
    down = Ledger(fail_on={1})
    outbox = Outbox(tmp_path, down.deliver)
    outbox.put(parcel(0))
    outbox.put(parcel(1))
    with pytest.raises(RuntimeError, match="sink down at batch 1"):
        outbox.put(parcel(2))
    assert outbox.stored() == [1]  # batch 2 was not stored: Spark does not commit it
    outbox.close()

    up = Ledger()
    up.applied = list(down.applied)
    restarted = Outbox(tmp_path, up.deliver)
    assert restarted.recover() == [1]
    assert up.applied == [0, 1] and restarted.stored() == []
    recovered = up.tables[1]
    assert recovered.equals(parcel(1).changes) and recovered.schema.metadata is None


def test_recovered_parcels_keep_their_lineage_and_info(tmp_path: Path) -> None:
    blocked = threading.Event()
    outbox = Outbox(tmp_path, lambda p: blocked.wait(10))
    outbox.put(parcel(7))  # "killed" while its sinks commit: the file stays
    got: list[Parcel] = []
    Outbox(tmp_path, got.append).recover()
    assert [(p.batch_id, p.lineage, p.info, p.recovered) for p in got] == \
        [(7, Lineage("ck", 70), {"records": 6}, True)]
    blocked.set()
    outbox.close()


def test_a_partial_file_of_a_killed_hand_off_is_not_a_batch(tmp_path: Path) -> None:
    (tmp_path / OUTBOX_DIR).mkdir()
    (tmp_path / OUTBOX_DIR / ".00000000000000000003.arrow.partial").write_bytes(b"cut")
    assert Outbox(tmp_path, Ledger().deliver).stored() == []


@settings(max_examples=60, deadline=None)
@given(batches=st.integers(min_value=1, max_value=8), data=st.data())
def test_kill_anywhere_then_restart_applies_every_committed_batch_once_in_order(
        tmp_path_factory: pytest.TempPathFactory, batches: int, data: st.DataObject) -> None:
    """Spark's side modelled as its commit log: a batch is committed once foreachBatch
    (the hand-off) returned. A kill lands after some hand-offs and some sink commits;
    the restart recovers the outbox, then Spark re-runs the batch it had not committed."""
    checkpoint = tmp_path_factory.mktemp("ck")
    sink = Ledger()
    handed = data.draw(st.integers(min_value=0, max_value=batches), label="handed over")
    # the sinks got through some of the handed batches before the kill
    delivered = data.draw(st.integers(min_value=max(handed - 1, 0), max_value=handed),
                          label="delivered")
    gate = threading.Semaphore(delivered)

    def deliver_until_killed(p: Parcel) -> None:
        if gate.acquire(timeout=0.05):
            sink.deliver(p)
        else:
            raise Killed  # the kill: this commit never happened

    outbox = Outbox(checkpoint, deliver_until_killed)
    committed = -1
    for batch_id in range(handed):
        try:
            outbox.put(parcel(batch_id))
        except Killed:
            break
        committed = batch_id
    outbox.close()
    assert sink.applied == list(range(len(sink.applied)))

    restarted = Outbox(checkpoint, sink.deliver)
    restarted.recover()
    for batch_id in range(committed + 1, batches):  # Spark re-runs and goes on
        restarted.put(parcel(batch_id))
    restarted.wait()
    assert sink.applied == list(range(batches))
    assert restarted.stored() == []
    restarted.close()
