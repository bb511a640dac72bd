"""Assembly: buffer change events per transaction until the transaction is complete.

A streaming transaction (xid) is **complete** when its END marker has been read
and, for every table the job reads, the events numbered 1..n by
``transaction.data_collection_order`` are present, n being END's count for that
table. Events are deduplicated by content identity
(:attr:`ChangeEvent.identity`), so a redelivered event is never applied twice.

Why numbering and not a plain count: before Debezium 3.7 a connector restart
inside a transaction repeats BEGIN, sends the remaining events (and possibly a
few already sent) numbered again from 1, and an END whose counts cover only the
events after the restart. Within one table's topic the renumbered run comes
after the first one, so a number that does not increase starts a new run, and
only the last run has to hold 1..n. The events of the first run precede it in
the same topic, so they were read too. (A table with events only before the
restart is not named in END at all; its events were written long before the
END and are read no later than it by a source that reads every topic to its
end offset, which txjoin's sources do.) An event delivered again with the same
content and the same number (a consumer rewind, a producer retry) is ignored
entirely. Events without numbering fall back to a distinct count.

One ambiguity remains: until the renumbered run of a table arrives, the first
run may look complete on its own. So once a transaction shows a restart (BEGIN
read twice, or numbering that starts again), each table END names must also be
*confirmed*: its renumbering was seen, or the source reported the table's topic
read to its end offset in a batch in which the END had been read (everything
Debezium wrote before that END, the renumbered run included, was then read).

The **snapshot** (Debezium ``op=r`` rows) is transaction 0. Rows of one table
arrive in that table's topic order, so a table's snapshot part is complete
("settled") as soon as any of these holds:

1. its closing row (``source.snapshot`` = ``last_in_data_collection`` or
   ``last``) has been read: every earlier row of that topic was read before it;
2. a streaming event of that table has been read: Debezium writes streaming
   events after the snapshot, and the topic is read in order;
3. the source reports the table's topic read to its end ("caught up") in a
   batch in which the snapshot had visibly finished (its ``last`` row or any
   BEGIN/END marker had been read): this is how an empty table, which has no
   snapshot row at all, settles without waiting for a change.

The snapshot is complete when every table of the job is settled; no streaming
transaction is released before that. This holds when rows of different tables
arrive in any order relative to each other and to the ``last`` row. Rows of an
*incremental* snapshot (``source.snapshot`` = ``incremental``, Debezium's
``execute-snapshot``) are not transaction 0: they arrive among streaming events and are
placed in commit order by ``sequence/incremental.py``.

**Table topics with several partitions** (declared by the source with their
partition count, see :class:`TopicPartitions`): Kafka keeps order only within a
partition, and Debezium spreads a table's events over the partitions by row
key, so a row's changes stay in order but one partition says nothing about
another. So every rule above holds *per partition*:

- the snapshot: a partition of the table is settled by its own closing row, a
  streaming event read from it, or the source reporting that partition read to
  its end after the snapshot visibly finished; the table is settled when all
  its partitions are (or rule 3 for the whole topic);
- numbering is collected over all partitions (the union of the numbers read),
  and a restart is recognised by BEGIN read twice or by a number that does not
  increase within one partition; a restarted transaction then waits until
  every partition of the table was reported read to its end in a batch in
  which the END had been read (every event Debezium wrote before that END, in
  every partition, was then read).

Events of one transaction and table are applied in the order read (partition
by partition); a row's events share a partition, so each row's changes keep
their order, and what a transaction leaves behind does not depend on the order
of different rows.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from txjoin.errors import IncompleteTransactionError, OrderingError
from txjoin.ingest.debezium import INCREMENTAL, SNAPSHOT_CLOSING, ChangeEvent, TxMarker
from txjoin.join.state import restore_fields, save_fields
from txjoin.sequence import spill
from txjoin.sequence.incremental import IncrementalRows
from txjoin.sequence.spill import EventLog, in_table_order, latest_commit_ts

SNAPSHOT_XID = 0
"""The xid of a release that is no source transaction: the initial snapshot (commit 0) and
an incremental snapshot's correction (``sequence/incremental.py``)."""


@dataclass
class Transaction:
    """A complete source transaction, ready to be applied in commit order."""

    xid: int
    commit_seq: int
    commit_ts_ms: int | None
    events: list[ChangeEvent] | EventLog  # in the order they apply (a log: from disk)
    source: str | None = None  # the source database (None: the initial snapshot)
    correction: bool = False  # incremental snapshot rows (``sequence/incremental.py``)


@dataclass(frozen=True)
class TopicPartitions:
    """What the source says, with one micro-batch, about table topics with several partitions.

    ``counts``: table -> its topic's partition count (only counts > 1), for every such
    topic the source reads, in every batch. ``caught_up``: table -> the partitions of
    such a topic that this batch reads to their end (a whole topic read to its end is
    reported as caught up as before).
    """

    counts: Mapping[str, int] = field(default_factory=dict)
    caught_up: Mapping[str, frozenset[int]] = field(default_factory=dict)


@dataclass
class FactRun:
    """One transaction's events of one table in one micro-batch, most of them only counted:
    the metadata of facts another shard holds (``join/routing.py``), with the events whose
    rows this shard holds among them.

    :meth:`PendingTransaction.add_run` adds them at once where adding them one by one in
    topic order would give the same state, which it checks first; so a shard pays per
    transaction, not per event, for the facts it does not hold."""

    table: str
    numbers: list[int]  # data_collection_order of each event, in topic order
    identities: list[tuple[object, ...]]  # ChangeEvent.identity of each, in the same order
    events: list[ChangeEvent]  # those whose rows this shard holds, in topic order
    first_ts_ms: int | None  # the earliest commit time among them


@dataclass
class PendingTransaction:
    """Events of one xid buffered until its END's counts are met."""

    xid: int
    # a list, or past spill.SPILL_EVENTS on disk (sequence/spill.py)
    events: list[ChangeEvent] | EventLog = field(default_factory=list)
    identities: set[Any] = field(default_factory=set)  # ChangeEvent.identity
    deliveries: set[Any] = field(default_factory=set)  # (identity, number)
    per_table: dict[str, int] = field(default_factory=dict)  # distinct events
    # last number read per table, or per (table, partition) for a partitioned topic
    last_number: dict[str | tuple[str, int], int] = field(default_factory=dict)
    run: dict[str, set[int]] = field(default_factory=dict)  # numbers of the last run
    end: TxMarker | None = None
    first_ts_ms: int | None = None
    begins: int = 0
    restarted: bool = False
    confirmed: set[str] = field(default_factory=set)  # tables whose last run is known final
    # partitions read to their end since END, per table of a partitioned topic
    confirmed_parts: dict[str, set[int]] = field(default_factory=dict)
    # Once its events spill (sequence/spill.py), identities are kept as their 16-byte
    # digests (:func:`identity_digest`) and deliveries as :func:`delivery_key` (a class
    # default, so a transaction pickled before this field reads False).
    compact: bool = False

    # What a batch's record carries of a transaction that was open before the batch: these
    # fields as they are after it, and the events it added (``Assembler.state``). The rest
    # (events, identities, deliveries, run) change only in :meth:`add`, so adding the same
    # events again to the state before the batch gives them back exactly.
    SMALL_FIELDS = ("end", "first_ts_ms", "begins", "restarted", "confirmed",
                    "confirmed_parts", "last_number", "per_table")

    def add(self, event: ChangeEvent, partitions: int = 1) -> bool:
        """Buffer an event; False when its content was already buffered.

        ``partitions``: of the table's topic (several: module docstring).
        """
        ident: Any = event.identity
        number, table = event.data_collection_order, event.table
        delivery: Any = (ident, number)
        if self.compact:
            ident = identity_digest(ident)
            delivery = delivery_key(ident, number)
        if delivery in self.deliveries:
            return False
        self.deliveries.add(delivery)
        if number is not None and partitions > 1:
            where = (table, event.position.partition)  # order holds within a partition only
            if number <= self.last_number.get(where, 0):
                self.restarted = True  # confirmed only by every partition's end
            self.last_number[where] = number
            self.run.setdefault(table, set()).add(number)
        elif number is not None:
            if number <= self.last_number.get(table, 0):
                self.run[table] = set()  # renumbered from 1: a restart inside the transaction
                self.restarted = True
                self.confirmed.add(table)
            self.run.setdefault(table, set()).add(number)
            self.last_number[table] = number
        self.touch(event.commit_ts_ms)
        if ident in self.identities:
            return False
        self.identities.add(ident)
        self.events.append(event)
        self._spill_when_large()
        self.per_table[table] = self.per_table.get(table, 0) + 1
        return True

    def _spill_when_large(self) -> None:
        """Past ``spill.SPILL_EVENTS`` identities (its own events and other shards' facts it
        counts), its events to disk and its identities and deliveries to digests: a large
        open transaction's memory is then ~150 bytes an event (sequence/spill.py)."""
        if self.compact or len(self.identities) <= spill.SPILL_EVENTS:
            return
        self.events = EventLog(self.events)
        self.identities = {identity_digest(i) for i in self.identities}
        self.deliveries = {delivery_key(identity_digest(i), n) for i, n in self.deliveries}
        self.compact = True

    def fits_run(self, run: FactRun) -> bool:
        """Whether adding ``run``'s events one by one would give exactly what :meth:`add_run`
        gives: no restart shown, every number new and above the table's last one (so no
        event is a redelivery or a renumbering), every content new (so none is a duplicate
        of another number). An unpartitioned topic only. Else its events go one by one."""
        numbers, table = run.numbers, run.table
        if self.restarted or numbers[0] <= self.last_number.get(table, 0):
            return False
        if any(b <= a for a, b in itertools.pairwise(numbers)):
            return False
        fresh = set(map(identity_digest, run.identities) if self.compact else run.identities)
        return len(fresh) == len(numbers) and self.identities.isdisjoint(fresh)

    def add_run(self, run: FactRun) -> None:
        """Add the events of a run that :meth:`fits_run`, as :meth:`add` would one by one."""
        table = run.table
        if self.compact:
            idents = list(map(identity_digest, run.identities))
            self.deliveries.update(map(delivery_key, idents, run.numbers))
            self.identities.update(idents)
        else:
            self.deliveries.update(zip(run.identities, run.numbers, strict=True))
            self.identities.update(run.identities)
        self.run.setdefault(table, set()).update(run.numbers)
        self.last_number[table] = run.numbers[-1]
        self.per_table[table] = self.per_table.get(table, 0) + len(run.numbers)
        self.events.extend(run.events)
        self._spill_when_large()
        self.touch(run.first_ts_ms)

    def touch(self, ts_ms: int | None) -> None:
        if ts_ms is not None and (self.first_ts_ms is None or ts_ms < self.first_ts_ms):
            self.first_ts_ms = ts_ms

    def grown(self, added: list[tuple[ChangeEvent | FactRun, int]]
              ) -> tuple[dict[str, Any], list]:
        """What a batch did to this transaction, open before it: its small fields and the
        (event, partitions) it added, in order (:meth:`regrow` redoes it)."""
        return save_fields(self, self.SMALL_FIELDS), added

    def regrow(self, grown: tuple[Mapping[str, Any],
                                  list[tuple[ChangeEvent | FactRun, int]]]) -> None:
        """Redo a batch recorded by :meth:`grown` on the state this transaction had before it."""
        small, added = grown
        for event, partitions in added:
            if isinstance(event, FactRun):
                assert self.fits_run(event), "a logged run no longer fits its transaction"
                self.add_run(event)
            else:
                self.add(event, partitions)
        restore_fields(self, small, self.SMALL_FIELDS)

    def _have(self, table: str, need: int) -> int:
        if table in self.run:
            return sum(1 for n in range(1, need + 1) if n in self.run[table])
        return min(self.per_table.get(table, 0), need)

    def missing(self, tables: frozenset[str]) -> dict[str, tuple[int, int]]:
        """Tables still short of END's count: table -> (have, need)."""
        if self.end is None or self.end.counts is None:
            return {}
        return {t: (self._have(t, n), n) for t, n in self.end.counts.items()
                if t in tables and (self._have(t, n) < n or (
                    self.restarted and n > 0 and t not in self.confirmed))}

    def is_complete(self, tables: frozenset[str]) -> bool:
        return self.end is not None and not self.missing(tables)

    def describe(self, tables: frozenset[str]) -> str:
        if self.end is None:
            have = ", ".join(f"{t}: {n}" for t, n in sorted(self.per_table.items())) or "none"
            return f"its END marker was never read (events buffered: {have})"
        return "missing events: " + ", ".join(
            f"{t} has {h} of {n}" + (" (restart: waiting for the topic's end)" if h == n else "")
            for t, (h, n) in sorted(self.missing(tables).items()))


@dataclass
class IncompletePolicy:
    """What to do with a transaction that does not complete.

    The clock is the source's commit time (``ts_ms``), not the wall clock, so a
    replay of the same input decides the same way. A transaction is overdue
    when every input stream has been read past ``timeout_s`` seconds after it
    began (see ``Engine.source_clock``: a topic that is merely behind holds the
    clock back) while it is still incomplete.

    - ``fail`` (default): stop with an error naming the xid and what is missing.
    - ``skip``: drop it (loudly, counted in the stats) and let later ones pass.
    - ``wait``: wait forever.
    """

    action: Literal["fail", "skip", "wait"] = "fail"
    timeout_s: float = 300.0


def identity_digest(identity: tuple[object, ...]) -> bytes:
    """A snapshot row's identity (``ChangeEvent.identity``) in 16 bytes.

    A shard keeps the identity of every snapshot row it holds for as long as it runs
    (a redelivered row is told from a late one by it), so it keeps this digest, not
    the identity with its row image (about a fifth of the memory). 128 bits: two
    distinct rows of a billion-row snapshot share a digest with odds under 1e-20.
    """
    return hashlib.blake2b(repr(identity).encode(), digest_size=16).digest()


def delivery_key(digest: bytes, number: int | None) -> bytes:
    """A delivery (an identity's digest and its ``data_collection_order``) as one value: what
    a spilled transaction keeps of it (24 bytes)."""
    return digest + (-1 if number is None else number).to_bytes(8, "little", signed=True)


class SnapshotBuffer:
    """Transaction 0: the ``op=r`` rows, with the settledness of every job table.

    ``identities``: the digest (:func:`identity_digest`) of every row held.
    """

    # Saved (join/state.py); ROW_FIELDS grow with the snapshot: a shard's log carries
    # them as the batch's snapshot rows instead.
    FIELDS = ("tables_with_rows", "settled", "parts", "finished_evidence", "done")
    ROW_FIELDS = ("rows", "identities")

    def __init__(self, tables: frozenset[str]) -> None:
        self.tables = tables
        # a list, or past spill.SPILL_EVENTS rows on disk (sequence/spill.py)
        self.rows: list[ChangeEvent] | EventLog = []
        self.identities: set[bytes] = set()
        self.tables_with_rows: set[str] = set()
        self.settled: set[str] = set()
        # partitions whose snapshot rows are all read, per table of a partitioned topic
        self.parts: dict[str, set[int]] = {}
        self.finished_evidence = False  # `last` row or a transaction marker read
        self.done = False  # released (or nothing to release)

    def state(self, rows: bool = True) -> dict[str, Any]:
        return save_fields(self, self.FIELDS + (self.ROW_FIELDS if rows else ()))

    def restore(self, state: Mapping[str, Any], rows: bool = True) -> None:
        restore_fields(self, state, self.FIELDS + (self.ROW_FIELDS if rows else ()))
        if rows and any(isinstance(i, tuple) for i in self.identities):
            # A state of version 2 (join/state.py) kept the identities themselves.
            self.identities = {identity_digest(i) if isinstance(i, tuple) else i
                               for i in self.identities}

    @staticmethod
    def holds(event: ChangeEvent) -> bool:
        """Whether the buffer keeps this snapshot row: not one without its image (``after``
        None: the metadata a shard gets of another shard's fact, ``join/routing.py``)."""
        return event.after is not None

    def add(self, event: ChangeEvent, partitions: int = 1) -> None:
        """Buffer a snapshot row; ``partitions``: of its topic (several: a closing row
        settles only its own partition).

        A row the buffer does not hold (:meth:`holds`) counts for settling the snapshot
        but is not buffered: there is nothing to apply, and the shard holding it checks it
        for duplicates and order. A shard thus holds its own snapshot rows, not every
        shard's."""
        rowless = not self.holds(event)
        identity = None if rowless else identity_digest(event.identity)
        if self.done:
            if rowless or identity in self.identities:
                return  # a redelivered snapshot row: already applied (by its holder)
            raise OrderingError(
                f"snapshot row of {event.table} at {event.position} arrived after the snapshot "
                f"was complete (every table had settled). Debezium writes a table's snapshot "
                f"rows before its `last` row; check that the source reads every topic to its end "
                f"offset, or re-snapshot into a fresh checkpoint.")
        if identity is not None:
            if identity in self.identities:
                return
            self.identities.add(identity)
            self.rows.append(event)
            if isinstance(self.rows, list) and len(self.rows) > spill.SPILL_EVENTS:
                self.rows = EventLog(self.rows)  # a large snapshot waits on disk too
        self.tables_with_rows.add(event.table)
        if event.snapshot in SNAPSHOT_CLOSING:
            self._settle(event.table, event.position.partition, partitions)
        if event.snapshot == "last":
            self.finished_evidence = True

    def streaming_seen(self, table: str, partition: int = 0, partitions: int = 1) -> None:
        self._settle(table, partition, partitions)
        self.finished_evidence = True

    def _settle(self, table: str, partition: int, partitions: int) -> None:
        """Partition ``partition`` of ``table``'s topic has shown all its snapshot rows."""
        if partitions == 1:
            self.settled.add(table)
            return
        parts = self.parts.setdefault(table, set())
        parts.add(partition)
        if len(parts) >= partitions:
            self.settled.add(table)

    def caught_up(self, tables: set[str], parts: Mapping[str, Iterable[int]] | None = None,
                  counts: Mapping[str, int] | None = None) -> None:
        """Topics (``tables``) or single partitions (``parts``: table -> partitions of a
        topic with ``counts[table]`` partitions) read to their end in this batch."""
        if self.finished_evidence:
            self.settled |= tables & self.tables
            for table, numbers in (parts or {}).items():
                if table in self.tables:
                    for number in numbers:
                        self._settle(table, number, (counts or {}).get(table, 1))

    def is_complete(self) -> bool:
        return self.tables <= self.settled


class Assembler:
    """Buffers events per xid; hands out complete transactions on request."""

    FIELDS = ("pending", "duplicates")  # saved (join/state.py), with the snapshot's

    def __init__(self, tables: frozenset[str]) -> None:
        self.tables = tables
        self.pending: dict[int, PendingTransaction] = {}
        self.snapshot = SnapshotBuffer(tables)
        self.incremental = IncrementalRows()
        self.duplicates = 0
        # Since begin_batch: the open transactions changed, those that left (taken or
        # skipped), those that began, and the events added to the others. Not saved: what a
        # batch's state without rows carries instead of all.
        self.touched: set[int] = set()
        self.gone: set[int] = set()
        self.born: set[int] = set()
        self.added: dict[int, list[tuple[ChangeEvent | FactRun, int]]] = {}

    def begin_batch(self) -> None:
        self.touched, self.gone, self.born, self.added = set(), set(), set(), {}

    def _open(self, xid: int) -> PendingTransaction:
        """The open transaction ``xid``, begun now if it is not open."""
        tx = self.pending.get(xid)
        if tx is None:
            tx = self.pending[xid] = PendingTransaction(xid)
            self.born.add(xid)
        return tx

    def state(self, rows: bool = True) -> dict[str, Any]:
        """Its state by name. ``rows``: the whole of it, the snapshot's buffered rows
        included; without: what :meth:`begin_batch` started to follow, so a batch's record
        follows the batch, not the backlog: the transactions that left, those that began
        (whole), and of the others that changed only what changed (``grown``: a transaction
        open over many batches is not recorded whole in each)."""
        if rows:
            return {**save_fields(self, self.FIELDS), "snapshot": self.snapshot.state(),
                    "incremental": self.incremental.state()}
        changed: dict[int, PendingTransaction] = {}
        grown: dict[int, tuple[dict[str, Any], list]] = {}
        for xid in sorted(self.touched):
            tx = self.pending.get(xid)
            if tx is None:
                continue
            if xid in self.born:
                changed[xid] = tx
            else:
                grown[xid] = tx.grown(self.added.get(xid, []))
        return {"changed": changed, "grown": grown, "gone": sorted(self.gone),
                "duplicates": self.duplicates, "snapshot": self.snapshot.state(rows=False),
                "incremental": self.incremental.state()}

    def restore(self, state: Mapping[str, Any], rows: bool = True) -> None:
        """Set a state of :meth:`state`; without ``rows``, apply the batch's changes to
        the open transactions this assembler holds."""
        if rows:
            restore_fields(self, state, self.FIELDS)
        else:
            restore_fields(self, state, ("duplicates",))
            for xid in state["gone"]:
                self.pending.pop(xid, None)
            self.pending.update(state["changed"])
            for xid, grown in state.get("grown", {}).items():  # none in layout 6's records
                self.pending[xid].regrow(grown)
        self.snapshot.restore(state["snapshot"], rows)
        self.incremental.restore(state.get("incremental"))  # none before layout 9

    def drop(self, xid: int) -> PendingTransaction | None:
        """Remove an open transaction (taken, or skipped by the policy)."""
        self.gone.add(xid)
        return self.pending.pop(xid, None)

    def add_event(self, event: ChangeEvent, released: set[int], partitions: int = 1) -> None:
        """Buffer an event; ``partitions``: of its table's topic."""
        if event.table not in self.tables:
            return
        if event.snapshot == INCREMENTAL:
            self.add_incremental(event, partitions, self.incremental.tail.get(event.table))
            return
        if event.is_snapshot:
            self.snapshot.add(event, partitions)
            return
        self.snapshot.streaming_seen(event.table, event.position.partition, partitions)
        assert event.xid is not None
        self.incremental.streamed(event.table, event.position.offset, event.xid)
        if event.xid in released:
            self.duplicates += 1
            return
        self.touched.add(event.xid)
        tx = self._open(event.xid)
        if event.xid not in self.born:
            self.added.setdefault(event.xid, []).append((event, partitions))
        if not tx.add(event, partitions):
            self.duplicates += 1

    def add_incremental(self, event: ChangeEvent, partitions: int,
                        anchor: tuple[int, int] | None) -> None:
        """Place an incremental snapshot row (``sequence/incremental.py``); ``anchor``:
        (offset, xid) of the streamed event of its table just before it (None: none)."""
        if event.table not in self.snapshot.settled:
            # Every shard gets the row (with its image or without): all stop alike.
            raise OrderingError(
                f"incremental snapshot row of {event.table} at {event.position} (Debezium's "
                f"execute-snapshot signal) before txjoin has the table's initial snapshot: "
                f"a table added to a running capture is not applied yet (releases would "
                f"have to wait for its incremental snapshot to complete); nothing of it "
                f"applied; snapshot the tables into new topics (a new topic prefix) and run "
                f"with --rebuild")
        self.incremental.add(event, self.pending, partitions, anchor)

    def add_run(self, xid: int, run: FactRun, released: set[int]) -> bool:
        """Buffer a transaction's events of one table of an unpartitioned topic at once
        (:class:`FactRun`); False, with nothing changed, when they must go one by one
        (:meth:`add_event`, in topic order) because the run does not fit the transaction
        (:meth:`PendingTransaction.fits_run`: a redelivery, a restart, a duplicate)."""
        if run.table not in self.tables:
            return True
        if xid in released:
            self.snapshot.streaming_seen(run.table)
            self.duplicates += len(run.numbers)
            return True
        tx = self.pending.get(xid)
        if not (tx or PendingTransaction(xid)).fits_run(run):
            return False
        self.snapshot.streaming_seen(run.table)
        self.touched.add(xid)
        tx = self._open(xid)
        if xid not in self.born:
            self.added.setdefault(xid, []).append((run, 1))
        tx.add_run(run)
        return True

    def add_marker(self, marker: TxMarker, released: set[int]) -> bool:
        """Record a BEGIN/END; True when it is a new END (the frontier queues it)."""
        self.snapshot.finished_evidence = True
        if marker.xid in released:
            self.duplicates += 1
            return False
        self.touched.add(marker.xid)
        tx = self._open(marker.xid)
        tx.touch(marker.ts_ms)
        if marker.status == "BEGIN":
            tx.begins += 1
            tx.restarted = tx.restarted or tx.begins > 1
            return False
        if tx.end is not None:
            self.duplicates += 1
            return False
        tx.end = marker
        return True

    def caught_up(self, tables: set[str], parts: Mapping[str, Iterable[int]] | None = None,
                  counts: Mapping[str, int] | None = None) -> None:
        """The source read these tables' topics (or, ``parts``, these partitions of a
        topic with ``counts[table]`` partitions) to their end in the batch just added."""
        read = {t: set(ps) for t, ps in (parts or {}).items() if t in self.tables}
        self.snapshot.caught_up(tables, read, counts)
        for tx in self.pending.values():
            if tx.end is not None and tx.restarted:
                self.touched.add(tx.xid)
                tx.confirmed |= tables
                for table, numbers in read.items():
                    got = tx.confirmed_parts.setdefault(table, set())
                    got |= numbers
                    if len(got) >= (counts or {}).get(table, 1):
                        tx.confirmed.add(table)

    def is_complete(self, xid: int) -> bool:
        tx = self.pending.get(xid)
        return tx is not None and tx.is_complete(self.tables)

    def take(self, xid: int, commit_seq: int) -> Transaction:
        tx = self.drop(xid)
        assert tx is not None and tx.end is not None
        # Same-table events keep their topic order; tables are independent within a tx.
        return Transaction(xid, commit_seq, tx.end.ts_ms or tx.first_ts_ms,
                           in_table_order(tx.events))

    def take_snapshot(self) -> Transaction:
        """The snapshot's rows as transaction 0 (of a large one, its log: tables by name,
        each table's rows as they came; rows of different tables are independent)."""
        snap = self.snapshot
        snap.done = True
        events, snap.rows = snap.rows, []
        return Transaction(SNAPSHOT_XID, 0, latest_commit_ts(events), events)

    def overdue(self, now_ms: int, policy: IncompletePolicy) -> list[PendingTransaction]:
        limit = policy.timeout_s * 1000
        return [tx for tx in self.pending.values()
                if not tx.is_complete(self.tables) and tx.first_ts_ms is not None
                and now_ms - tx.first_ts_ms > limit]

    def fail_overdue(self, txs: list[PendingTransaction], policy: IncompletePolicy) -> None:
        tx = txs[0]
        raise IncompleteTransactionError(
            f"transaction xid {tx.xid} is still incomplete more than {policy.timeout_s:g}s "
            f"(source commit time) after it began: {tx.describe(self.tables)}. Check the "
            f"connector (provide.transaction.metadata=true, one-partition transaction topic) "
            f"and that every table topic is subscribed; to drop such transactions instead, "
            f"run with --on-incomplete skip.")
