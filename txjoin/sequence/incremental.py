"""Incremental snapshots: where in commit order a row of Debezium's ``execute-snapshot`` goes.

An ``execute-snapshot`` signal makes Debezium re-read a captured table in chunks while
it streams (DBLog's watermark algorithm): it writes a low watermark, selects a chunk of
rows by primary key, writes a high watermark, and while it reads the log between the two
it emits streamed events as usual and drops from the chunk every key such an event
changed. At the high watermark it emits what is left of the chunk as ``op: "r"`` rows
with ``source.snapshot: "incremental"``, no transaction block, in the table's topic.

So a row R of table T at offset o says: key K's value is R's image at the chunk's select
and stays so up to the high watermark (a streamed change of K in between would have
dropped K), and every streamed event of T that precedes R in T's topic was written before
that. Debezium streams transactions in commit order, so T's topic lists the transactions
that touch T in commit order; let A be the one of the last streamed event of T before R
(the **anchor**) and B the next one after it. After A and before B, K's value is R's
image in every state the source passes through (no transaction between them touches T).

txjoin applies R right after A is released, or, when A was released in an earlier batch
(or T has no streamed event before R), first among the releases of the batch that reads
R; always before B, whose events of T come after R and so are read no earlier than R.
Every state a sink shows is then one the source passed through, with T's row K as
txjoin knew it from the events or, once R is applied, as R says.

Rows anchored at one place form one **correction**: one release of its own (xid
:data:`~txjoin.sequence.assembly.SNAPSHOT_XID`, as the initial snapshot has, and a
``commit_seq`` of its own), applied by the engine, which first drops every row equal to
the one it holds (``Engine.release``): a row equal to txjoin's state changes nothing; one
that differs is a real correction (a change txjoin never received). Every shard decides
the same: every shard reads every record of T (a fact row of another shard without its
image, ``join/routing.py``), so each computes the same anchor from the same topic order.

A row read again (a consumer rewind, a replay after a restart) is recognised by its
offset: everything up to the last incremental row read of T was read before, so a row at
or before that offset is a redelivery and is dropped. A connector restart that sends a
chunk again writes it at new offsets, after the events it then follows, so it is applied
again where it now stands, which is as true as the first time.

Only a table topic with one partition: with several, a row's partition says nothing of
the others', so there is no anchor; such a row stops the job in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from txjoin.errors import OrderingError
from txjoin.ingest.debezium import ChangeEvent
from txjoin.join.state import restore_fields, save_fields


class IncrementalRows:
    """The incremental snapshot rows read and not yet released, by anchor."""

    # Saved (join/state.py) whole, in every batch's record too: the rows wait for at most
    # the open transactions they follow.
    FIELDS = ("tail", "read_to", "waiting", "ready")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        # table -> (offset, xid) of the streamed event with the greatest offset read of it
        self.tail: dict[str, tuple[int, int]] = {}
        self.read_to: dict[str, int] = {}  # table -> offset of its last incremental row read
        self.waiting: dict[int, list[ChangeEvent]] = {}  # anchor xid -> rows to apply after it
        self.ready: list[ChangeEvent] = []  # rows to apply before the next release

    def state(self) -> dict[str, Any]:
        return save_fields(self, self.FIELDS)

    def restore(self, state: Mapping[str, Any] | None) -> None:
        """Set a state of :meth:`state`; None (a checkpoint from before incremental
        snapshots were applied): nothing read yet."""
        if state is None:
            self.clear()
            return
        restore_fields(self, state, self.FIELDS)

    def streamed(self, table: str, offset: int, xid: int) -> None:
        """A streamed event of ``table`` at ``offset`` of its topic, of transaction ``xid``."""
        tail = self.tail.get(table)
        if tail is None or offset > tail[0]:
            self.tail[table] = (offset, xid)

    def is_redelivery(self, event: ChangeEvent) -> bool:
        return event.position.offset <= self.read_to.get(event.table, -1)

    def add(self, event: ChangeEvent, pending: Mapping[int, object], partitions: int,
            anchor: tuple[int, int] | None) -> None:
        """Place an incremental row: after its anchor while that is open (``pending``),
        else among the next release's first. ``anchor``: (offset, xid) of the streamed
        event just before it (None: none), :attr:`tail` unless the caller adds some of the
        batch's events after the row's (``Engine._place_incremental``)."""
        if partitions > 1:
            raise OrderingError(
                f"incremental snapshot row of {event.table} at {event.position} (Debezium's "
                f"execute-snapshot signal) on a topic with {partitions} partitions: txjoin "
                f"applies incremental snapshots only from one-partition table topics (one "
                f"partition says nothing of another's order); nothing of it applied; give "
                f"the table's topic one partition, or snapshot into new topics and run with "
                f"--rebuild")
        if self.is_redelivery(event):
            return
        self.read_to[event.table] = event.position.offset
        if anchor is not None and anchor[1] in pending:
            self.waiting.setdefault(anchor[1], []).append(event)
        else:
            self.ready.append(event)

    def after(self, xid: int) -> list[ChangeEvent]:
        """The rows anchored after ``xid``, taken (it is released or skipped now)."""
        return self.waiting.pop(xid, [])

    def take_ready(self) -> list[ChangeEvent]:
        rows, self.ready = self.ready, []
        return rows
