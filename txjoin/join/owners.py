"""The owner stages of the staged engine: split looked-up tables, each row held once
(issue 65; which tables are split: ``join/placement.py``).

One owner stage per depth of split aliases runs between the sequencer and the shards; in a
stage, owner ``o`` holds the rows of that depth's split tables whose key it owns. Its
input per batch: its rows' events, the batch's releases, and what tells it which shards
read which of its rows: the fact events whose references it owns (depth 1), or the
``Subscribe`` messages of the stage above. It buffers its events per open transaction
exactly as a shard does (``ShardApplier``: the same identities, redeliveries, snapshot and
incremental snapshot rows; a streaming fact event only as the reads it makes of its keys)
and, release by release, in the sequencer's order:

1. takes the release's subscriptions (a fact event's shard for the keys its row references;
   a parent row's subscribers for the keys the parent row references);
2. applies the release's rows of its tables (an incremental snapshot's only where they
   change the row: the owner alone can compare them, so it says so to every shard with a
   ``CorrectionChanged`` entry, and every shard numbers the correction alike);
3. sends each subscriber of a row the release touched, and each new subscriber of a row,
   the row as it is after the release (``Forward``: a key and a row, or None when gone),
   and the stage below a ``Subscribe`` for the keys those rows reference.

A shard applies a release's forwarded rows with its own (``TemporalJoin.apply``), so it
evaluates its facts against exactly the rows the core would read. Owners number nothing
and emit no output change; their forwards and messages are the batch's output of the
stage (as the sequencer's releases are).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from txjoin.ingest.debezium import INCREMENTAL, ChangeEvent
from txjoin.job import Job
from txjoin.join.placement import (
    CorrectionChanged,
    FactReads,
    Forward,
    Key,
    Placement,
    Subscribe,
    owner_of,
)
from txjoin.join.routing import Routed
from txjoin.join.staged import (
    CORRECTION,
    SKIP,
    TRANSACTION,
    AppliedEffects,
    Release,
    ReleaseColumns,
    ShardApplier,
    _position_key,
    release_rows,
)
from txjoin.join.temporal import OutputChange
from txjoin.sequence.assembly import IncompletePolicy, TopicPartitions
from txjoin.sequence.spill import drain


class LookupOwner(ShardApplier):
    """Owner ``shard`` of ``n_shards`` in the owner stage of depth :attr:`depth` of
    :attr:`placement` (a subclass per stage: :func:`owner_class`)."""

    placement: Placement
    depth: int
    FIELDS = (*ShardApplier.FIELDS, "subscribers", "reads")

    def __init__(self, job: Job, shard: int = 0, n_shards: int = 1,
                 policy: IncompletePolicy | None = None) -> None:
        super().__init__(job, shard, n_shards, policy)
        self.aliases = self.placement.at_depth[self.depth]
        # per alias: key -> the shards that read its row
        self.subscribers: dict[str, dict[Key, set[int]]] = {a: {} for a in self.aliases}
        # an open transaction's streaming fact events, as what they read here: (alias, key,
        # the fact's shard); a redelivered event adds nothing
        self.reads: dict[tuple[str, int], set[tuple[str, Key, int]]] = {}
        self._taken_reads: set[tuple[str, Key, int]] = set()
        self.forwards: list[Forward] = []
        self.messages: list[Subscribe] = []
        self.corrections_changed: list[CorrectionChanged] = []
        self._subscribed: list[tuple[str, Key, int]] = []

    def process_routed(self, records: Iterable[Routed], caught_up: Iterable[str] = (),
                       partitions: TopicPartitions | None = None) -> list[OutputChange]:
        events: list[ChangeEvent] = []
        given: list[Release | ReleaseColumns] = []
        facts: list[FactReads] = []
        incoming: dict[int, list[Subscribe]] = defaultdict(list)
        for item, _size in records:
            if isinstance(item, (Release, ReleaseColumns)):
                given.append(item)
            elif isinstance(item, Subscribe):
                incoming[item.release].append(item)
            elif isinstance(item, FactReads):
                facts.append(item)
            else:
                assert isinstance(item, ChangeEvent), item
                events.append(item)
        events.sort(key=_position_key)
        releases, columns = release_rows(given)
        self.forwards, self.messages, self.corrections_changed = [], [], []
        self._subscribed = []
        self.batch_join_s = 0.0
        self.join.journal = []
        try:
            for fact in facts:
                self._add_reads(fact)
            for event in events:
                self._add(event)
            pending, reads, remember = self.pending, self.reads, self._remember
            for index, release in enumerate(releases):
                if release[0] == TRANSACTION and index not in incoming:
                    tx = release[1], release[2]
                    if tx not in pending and tx not in reads:
                        # nothing of it here (most of a batch's releases at several owners):
                        # remembered as _own would, without its pass
                        remember(*tx)
                        continue
                self._own(index, Release._make(release), incoming.get(index, ()))
            journal = self.join.journal
        finally:
            self.join.journal = None
        self.stats.batches += 1
        self.last_effects = AppliedEffects(events, columns, journal, self.applied_seq,
                                           self.snapshot_released, self._subscribed, facts)
        return []

    def _add_reads(self, fact: FactReads) -> None:
        """A streaming fact event as the reads it makes here (Spark's routing sends it so;
        :meth:`_add` keeps one it got whole alike)."""
        self.stats.events += 1
        source = self._sources[fact.table]
        if fact.xid in self._released_sets[source]:
            return  # a redelivery of a released transaction's event
        self.reads.setdefault((source, fact.xid), set()).update(self._mine(fact))

    def _add(self, event: ChangeEvent) -> None:
        """A streaming fact event is kept as the reads it makes here (not buffered whole
        as a shard buffers it); any other event as a shard keeps it."""
        if event.table != self.job.fact or event.snapshot == INCREMENTAL or event.is_snapshot:
            super()._add(event)
            return
        assert event.xid is not None
        self._add_reads(self.placement.compact(event, self.n_shards)
                        or FactReads(event.table, event.xid, 0, ()))

    def _take(self, release: Release) -> Any:
        """A shard's ``_take``, and the reads of the transaction it releases or skips set
        aside (``_taken_reads``; catching up from the log lets them go)."""
        if release.kind in (TRANSACTION, SKIP):
            assert release.source is not None, release
            self._taken_reads = self.reads.pop((release.source, release.xid), set())
        return super()._take(release)

    def _own(self, index: int, release: Release, incoming: Iterable[Subscribe]) -> None:
        rows = self._take(release)
        reads, self._taken_reads = self._taken_reads, set()
        if release.kind == SKIP:
            return
        new: dict[str, dict[Key, set[int]]] = defaultdict(dict)
        for message in incoming:
            for shard in message.shards:
                self._subscribe(message.alias, message.key, shard, new)
        for alias, key, shard in sorted(reads, key=repr):
            self._subscribe(alias, key, shard, new)
        touched: dict[str, set[Key]] = defaultdict(set)
        moved: set[tuple[str, Key]] = set()
        correction: list[ChangeEvent] = []
        # one pass, each event let go as it is used (a large transaction's read back once)
        for event in drain(rows):
            if event.table == self.job.fact:  # a snapshot's or a correction's
                for alias, key, shard in self._references(event):
                    self._subscribe(alias, key, shard, new)
            elif release.kind == CORRECTION:
                correction.append(event)
            else:
                self._apply_owned(event, touched, moved)
        if correction:
            changed = self.join.changing(correction)  # only the owner can compare them
            if changed:
                self.corrections_changed.append(CorrectionChanged(index))
            for event in changed:
                self._apply_owned(event, touched, moved)
        for table, pk in moved:  # a key changed inside one event: its new owner holds it
            gone = self.join.rows[table].get(pk)
            if gone is not None:
                self.join._remove(table, pk, gone)
        self._send(index, touched, new)

    def _apply_owned(self, event: ChangeEvent, touched: dict[str, set[Key]],
                     moved: set[tuple[str, Key]]) -> None:
        """Apply an event of a split table; note the keys it touched here, and those it put
        that another owner holds."""
        for table, row in self.join._apply_event(event):
            pk = self.job.table(table).key_of(row)
            if owner_of(pk, self.n_shards) == self.shard:
                touched[table].add(pk)
            else:
                moved.add((table, pk))

    def _subscribe(self, alias: str, key: Key, shard: int,
                   new: dict[str, dict[Key, set[int]]]) -> None:
        if not self.placement.persistent:  # a read for this release only
            new[alias].setdefault(key, set()).add(shard)
            return
        readers = self.subscribers[alias].setdefault(key, set())
        if shard not in readers:
            readers.add(shard)
            new[alias].setdefault(key, set()).add(shard)
            self._subscribed.append((alias, key, shard))

    def _references(self, event: ChangeEvent) -> Iterator[tuple[str, Key, int]]:
        """What a fact event's row reads of the keys this owner owns: (alias, key, the
        fact's shard); nothing if it cannot be read (its shard stops the job on it)."""
        if event.after is not None:
            yield from self._mine(self.placement.compact(event, self.n_shards))

    def _mine(self, fact: FactReads | None) -> Iterator[tuple[str, Key, int]]:
        """A fact's reads of the keys this owner owns, with the fact's shard."""
        if fact is None:
            return
        for alias, key in fact.reads:
            if owner_of(key, self.n_shards) == self.shard:
                yield alias, key, fact.shard

    def buffered_rows(self) -> int:
        return super().buffered_rows() + sum(len(r) for r in self.reads.values())

    def _send(self, index: int, touched: dict[str, set[Key]],
              new: dict[str, dict[Key, set[int]]]) -> None:
        rows_of = self.join.rows
        for alias in self.aliases:
            table = self.job.lookup(alias).table
            subscribers = self.subscribers[alias]
            changed, fresh = touched.get(table, set()), new.get(alias, {})
            for key in sorted(changed | fresh.keys(), key=repr):
                row = rows_of[table].get(key)
                shards = (subscribers.get(key, set()) if key in changed else set()) | fresh.get(
                    key, set())
                if not shards or (row is None and key not in changed):
                    continue
                for shard in sorted(shards):
                    self.forwards.append(Forward(shard, index, table, key, row))
                if row is None:
                    continue
                for lk in self.placement.below[alias]:
                    for ref in self.placement.references(lk, row):
                        self.messages.append(Subscribe(index, lk.alias, ref,
                                                       tuple(sorted(shards))))

    def hand_on(self, to_shards: list[list[Any]], flags: set[CorrectionChanged],
                below: dict[int, list[Subscribe]]) -> None:
        """Put the batch's output where the next stages take it: each forward in its shard's
        list, the correction flags (every shard's), each message under its owner in the
        next depth's stage."""
        for forward in self.forwards:
            to_shards[forward.shard].append(forward)
        flags.update(self.corrections_changed)
        for message in self.messages:
            below.setdefault(owner_of(message.key, self.n_shards), []).append(message)

    def apply_effects(self, effects: AppliedEffects, changes: Iterable[OutputChange]) -> None:
        for fact in effects.fact_reads:  # before the releases that take them
            self._add_reads(fact)
        super().apply_effects(effects, changes)
        for alias, key, shard in effects.subscribed:
            self.subscribers[alias].setdefault(key, set()).add(shard)


def owner_class(placement: Placement, depth: int) -> type[LookupOwner]:
    """The owner class of ``placement``'s stage of depth ``depth`` (``StagedEngine`` makes
    each once, so a log's ``isinstance`` check holds across batches)."""
    return type(f"LookupOwner{depth}", (LookupOwner,), {"placement": placement, "depth": depth})
