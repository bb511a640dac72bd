"""Frontier: release complete transactions strictly in commit order.

Commit order is the order of END markers in the one-partition transaction
topic. The frontier queues every new END as it is read and releases from the
head while the head is complete; a complete transaction behind an incomplete
one waits. An END with ``event_count`` 0 (a transaction that touched no
captured table) is complete at once and advances the frontier.

Released xids are remembered (the most recent ``memory`` of them) so that a
redelivered BEGIN, END or data event of an already applied transaction is
recognised and dropped instead of opening a new buffer.

An incremental snapshot's rows (``sequence/incremental.py``) are released as corrections
of their own, right after the transaction they follow, or first when that one was
released before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from txjoin.ingest.debezium import ChangeEvent, TxMarker
from txjoin.join.state import restore_fields, save_fields
from txjoin.sequence.assembly import SNAPSHOT_XID, Assembler, IncompletePolicy, Transaction

if TYPE_CHECKING:
    from txjoin.sequence.whole import Whole

RELEASED_MEMORY = 100_000
"""Released xids a frontier remembers (and a staged engine's shard, ``join/staged.py``)."""


class Frontier:
    """The commit-order queue and the memory of what was released."""

    # Saved (join/state.py); RELEASED_FIELDS grow with history up to ``memory``: a
    # shard's log carries them as the batch's released xids instead.
    FIELDS = ("queue", "memory", "commit_seq", "last_xid", "skipped", "remembered")
    RELEASED_FIELDS = ("released", "_released_order")

    def __init__(self, memory: int = RELEASED_MEMORY) -> None:
        self.queue: deque[int] = deque()  # xids in END order, not yet released
        self.released: set[int] = set()
        self._released_order: deque[int] = deque()
        self.memory = memory
        self.commit_seq = 0  # commit sequence of the last released transaction
        self.last_xid: int | None = None
        self.skipped: list[int] = []
        self.remembered = 0  # xids ever remembered (released or skipped)

    def state(self, released: bool = True) -> dict[str, Any]:
        return save_fields(self, self.FIELDS + (self.RELEASED_FIELDS if released else ()))

    def restore(self, state: Mapping[str, Any], released: bool = True) -> None:
        restore_fields(self, state, self.FIELDS + (self.RELEASED_FIELDS if released else ()))

    def on_end(self, marker: TxMarker) -> None:
        self.queue.append(marker.xid)

    def _remember(self, xid: int) -> None:
        self.remembered += 1
        self.released.add(xid)
        self._released_order.append(xid)
        while len(self._released_order) > self.memory:
            self.released.discard(self._released_order.popleft())

    def release(self, assembler: Assembler) -> list[Transaction]:
        """Every transaction that can be released now, in commit order (snapshot first)."""
        out: list[Transaction] = []
        snap = assembler.snapshot
        if not snap.done:
            if not snap.is_complete():
                return out
            if snap.rows:
                out.append(assembler.take_snapshot())
            snap.done = True
        return out + self.release_streaming(assembler)

    def release_streaming(self, assembler: Assembler,
                          whole: dict[int, Whole] | None = None) -> list[Transaction]:
        """The streaming transactions that can be released now, in commit order.

        ``commit_seq`` counts this frontier's releases; an engine over several
        sources renumbers them into one sequence of applied transactions. ``whole``: the
        batch's transactions that are complete without a buffer (``whole.py``), by xid;
        each released is taken out of it.
        """
        out: list[Transaction] = []
        incremental = assembler.incremental
        self._correct(out, incremental.take_ready())
        while self.queue:
            xid = self.queue[0]
            done = whole.pop(xid, None) if whole else None
            if done is not None:
                self.commit_seq += 1
                out.append(Transaction(xid, self.commit_seq, done.commit_ts_ms(), []))
            elif assembler.is_complete(xid):
                self.commit_seq += 1
                out.append(assembler.take(xid, self.commit_seq))
            else:
                break
            self.queue.popleft()
            self.last_xid = xid
            self._remember(xid)
            self._correct(out, incremental.after(xid))
        return out

    @staticmethod
    def _correct(out: list[Transaction], rows: list[ChangeEvent]) -> None:
        """Append incremental snapshot rows as one correction (numbered by the engine)."""
        if rows:
            ts = max((e.commit_ts_ms or 0 for e in rows), default=None)
            out.append(Transaction(SNAPSHOT_XID, 0, ts, rows, correction=True))

    def enforce(self, assembler: Assembler, now_ms: int | None, policy: IncompletePolicy) -> None:
        """Apply the incomplete-transaction policy to overdue transactions."""
        if policy.action == "wait" or now_ms is None:
            return
        overdue = assembler.overdue(now_ms, policy)
        if not overdue:
            return
        if policy.action == "fail":
            assembler.fail_overdue(overdue, policy)
        for tx in overdue:  # skip
            assembler.drop(tx.xid)
            if tx.xid in self.queue:
                self.queue.remove(tx.xid)
            self.skipped.append(tx.xid)
            self._remember(tx.xid)
            # rows that follow it follow what was released before it
            assembler.incremental.ready.extend(assembler.incremental.after(tx.xid))
