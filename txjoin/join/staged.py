"""The staged engine (issue 65), in one process: every record sequenced once, then applied by
the shards that hold its rows.

Today's partitioned engine (``sharded.py``, ``shard.py``) has every shard sequence every
transaction: each receives every BEGIN/END and the metadata of every fact event it does not
hold, and assembles and orders all of them, so sequencing costs as much in each of N shards
as in one. The staged engine splits the two:

- the **sequencer** (:class:`Sequencer`) receives the metadata of every record (a data
  event without its rows, ``routing.metadata_only``; every BEGIN/END) once. It runs the
  core's rules unchanged (``sequence/assembly.py``, ``frontier.py``, ``incremental.py``:
  completeness, duplicates by content, restarts, the snapshot, partitioned topics, the
  incomplete policy) and says, per micro-batch, what is released in which order: a list
  of :class:`Release` entries, a few bytes per transaction;
- each **shard** (:class:`ShardApplier`) receives only the records whose rows it holds (its
  facts, the looked-up and child rows) and the batch's releases. It keeps its rows per
  open transaction, deduplicated by the same content identity, and applies a released
  transaction's rows when the releases name it. It never sees a BEGIN/END or another
  shard's fact, and a transaction without rows in the shard costs it nothing.

The shards number the applied releases themselves (``commit_seq``), exactly as the core
does: a correction (an incremental snapshot's rows) whose looked-up rows all equal the
state is dropped unnumbered, which every shard decides alike because every shard holds the
copied looked-up rows and the owners of split ones say when theirs changed; a correction
with a fact row is always numbered (the sequencer says which have one). So the union of
the shards' outputs is the core's, release for release.

A looked-up table may be **split** instead of copied into every shard
(``join/placement.py``): its rows are then held once, by the owner of their key, in owner
stages between the sequencer and the shards (``join/owners.py``), which send each shard the
rows its facts read, release by release.

Every rule stays where it is proven: the sequencer *is* the core's engine without a join,
fed what every shard is fed today of the records it does not hold. What a shard decides on
its own (which of its events a release applies, a redelivery of a released transaction's
event, a snapshot row after the snapshot) follows from the releases and the same
identities; the property tests (tests/unit/test_staged.py) check the result against the
oracle and against today's sharded engine.

Both parts keep their state as a log of micro-batches (``state_log.ShardLog``, layout
:data:`STAGED_LAYOUT`): the sequencer's segments carry what ``ShardEngine``'s do without
rows; a shard's (:class:`AppliedEffects`) carry its events, the batch's releases, the rows
it put or removed and its output, so a copy one batch behind is brought forward without
evaluating the join. In Spark (``join/spark/staged.py``) the sequencer is one stateful
stage before the shards' (``txjoin run --engine staged``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from txjoin import crashpoints
from txjoin.errors import JobError
from txjoin.ingest.debezium import INCREMENTAL, ChangeEvent, Position, TxMarker, decode
from txjoin.job import Job
from txjoin.join.engine import EngineStats
from txjoin.join.placement import (
    CorrectionChanged,
    FactReads,
    Forward,
    Placement,
    Subscribe,
    fact_shard,
    owner_of,
)
from txjoin.join.routing import (
    Routed,
    Router,
    gather_foreign,
    is_metadata_only,
    metadata_only,
    shard_of,
)
from txjoin.join.shard import ShardEngine, long_lived_state
from txjoin.join.state import pack, unpack
from txjoin.join.state_log import MemoryStore, ShardLog
from txjoin.join.temporal import OutputChange, TemporalJoin
from txjoin.sequence.assembly import (
    SNAPSHOT_XID,
    IncompletePolicy,
    PendingTransaction,
    SnapshotBuffer,
    TopicPartitions,
    Transaction,
)
from txjoin.sequence.frontier import RELEASED_MEMORY
from txjoin.sequence.spill import drain, in_table_order, latest_commit_ts

SNAPSHOT, TRANSACTION, CORRECTION, SKIP = "snapshot", "transaction", "correction", "skip"
"""The kinds of :class:`Release`."""

STAGED_LAYOUT = 13
"""The state layout of the staged engine's logs (the sequencer's and each shard's):
``state_log.ShardLog`` entries holding a :class:`Sequencer` or a :class:`ShardApplier`
(12: a snapshot holds the state as a value, as the sharded engine's layout 11; 13: a
shard's or an owner's segment holds the batch's releases as :class:`ReleaseColumns`; 11
and 12 are continued). A checkpoint of the sharded engine (layouts 6-11) is not one of it,
nor the reverse: the checkpoint records its engine."""

STAGED_LAYOUTS = (STAGED_LAYOUT, (11, 12, STAGED_LAYOUT))
"""``ShardLog``'s ``layouts`` for both parts: the layout written, and those continued."""

SEQUENCER = -1
"""The sequencer's number where a shard's would go (its log's ``where``, its host)."""


class Release(NamedTuple):
    """One entry of the sequencer's output, in the order the shards apply them.

    - ``snapshot``: every source's initial snapshot is complete; ``with_rows``: it had rows
      (in some shard);
    - ``transaction``: source transaction ``xid`` of ``source``, committed at
      ``commit_ts_ms``;
    - ``correction``: an incremental snapshot's rows, those at ``rows`` (positions, in
      apply order); ``with_fact``: one of them is a fact row (numbered even when nothing
      changes: only its holder can compare it);
    - ``skip``: ``--on-incomplete skip`` dropped transaction ``xid`` of ``source``.
    """

    kind: str
    source: str | None = None
    xid: int = SNAPSHOT_XID
    commit_ts_ms: int | None = None
    rows: tuple[Position, ...] = ()
    with_rows: bool = False
    with_fact: bool = False


class ReleaseColumns:
    """A batch's releases by field, each field a tuple: how the sequencer's releases go to
    every shard and owner (``join/spark/staged.py``) and how a segment of theirs keeps them
    (:class:`AppliedEffects`). Pickled as seven tuples instead of a tuple a release (~4x
    faster: once in the sequencer, then in every shard's and owner's segment each batch,
    where at 8 shards most releases concern another shard), and read as plain tuples: a
    release that holds nothing in a shard never becomes an object there."""

    __slots__ = ("columns",)

    def __init__(self, releases: Iterable[tuple[Any, ...]] = ()) -> None:
        self.columns: tuple[tuple[Any, ...], ...] = tuple(zip(*releases, strict=True))

    def __len__(self) -> int:
        return len(self.columns[0]) if self.columns else 0

    def rows(self) -> Iterator[tuple[Any, ...]]:
        """Each release as a plain tuple of a :class:`Release`'s fields, in order."""
        return zip(*self.columns, strict=True)

    def __iter__(self) -> Iterator[Release]:
        return map(Release._make, self.rows())


def release_rows(items: Sequence[Release | ReleaseColumns]
                 ) -> tuple[list[tuple[Any, ...]], ReleaseColumns]:
    """Releases given one by one or as :class:`ReleaseColumns`: as tuples in their order,
    and as the columns a segment keeps (those given when they came as one, not rebuilt)."""
    rows: list[tuple[Any, ...]] = []
    for item in items:
        if isinstance(item, ReleaseColumns):
            rows.extend(item.rows())
        else:
            rows.append(item)
    if len(items) == 1 and isinstance(items[0], ReleaseColumns):
        return rows, items[0]
    return rows, ReleaseColumns(rows)


def _position_key(item: ChangeEvent | TxMarker) -> tuple[str, int, int]:
    pos = item.position
    return pos.topic, pos.partition, pos.offset


class Sequencer(ShardEngine):
    """The core engine without a join: assembly and commit order of every source, from the
    metadata of every record (a shard that holds no rows); a batch's releases are
    :attr:`releases` after :meth:`process_routed`."""

    def __init__(self, job: Job, shard: int = SEQUENCER, n_shards: int = 1,
                 policy: IncompletePolicy | None = None) -> None:
        super().__init__(job, shard, n_shards, policy)
        self.releases: list[Release] = []
        self._skips_seen = dict.fromkeys(job.source_names, 0)

    def restore(self, state: Any, rows: bool = True) -> None:
        super().restore(state, rows)
        self._skips_seen = {s: len(f.skipped) for s, f in self.frontiers.items()}

    def process_routed(self, records: Iterable[Routed], caught_up: Iterable[str] = (),
                       partitions: TopicPartitions | None = None) -> list[OutputChange]:
        self.releases = []
        return super().process_routed(records, caught_up, partitions)

    def _record_skips(self) -> None:
        """Transactions the incomplete policy dropped since the last call (``Frontier.enforce``
        runs between the engine's two release passes), as ``skip`` entries."""
        for source, frontier in self.frontiers.items():
            seen = self._skips_seen[source]
            for xid in frontier.skipped[seen:]:
                self.releases.append(Release(SKIP, source, xid))
            self._skips_seen[source] = len(frontier.skipped)

    def release(self) -> Iterator[Transaction]:
        """What the core's ``Engine.release`` hands out, the snapshot even without rows here
        (the shards hold them), every correction kept (the shards compare it)."""
        self._record_skips()
        if not self.snapshot_done:
            if not all(a.snapshot.is_complete() for a in self.assemblers.values()):
                return
            with_rows = False
            for assembler in self.assemblers.values():
                with_rows = with_rows or bool(assembler.snapshot.tables_with_rows)
                assembler.snapshot.done = True
                assembler.snapshot.rows = []
            self.releases.append(Release(SNAPSHOT, with_rows=with_rows))
            self.snapshot_released = with_rows
        for source, frontier in self.frontiers.items():
            for tx in frontier.release_streaming(self.assemblers[source],
                                                 self._whole.get(source)):
                tx.source = source
                yield tx

    def _apply(self, tx: Transaction) -> list[OutputChange]:
        self.stats.transactions_released += 1
        if tx.correction:
            rows = list(drain(tx.events))
            self.releases.append(Release(
                CORRECTION, tx.source, SNAPSHOT_XID, tx.commit_ts_ms,
                tuple(e.position for e in rows),
                with_fact=any(e.table == self.job.fact for e in rows)))
        else:
            tx.events = []  # metadata only: nothing to keep
            self.releases.append(Release(TRANSACTION, tx.source, tx.xid, tx.commit_ts_ms))
        return []


@dataclass
class AppliedEffects:
    """What one batch did to a :class:`ShardApplier`, enough to redo it without evaluating:
    the events it added, the releases it took, the rows it put or removed (``journal``),
    and its numbering after the batch."""

    events: list[ChangeEvent]
    releases: Iterable[Release]  # a ReleaseColumns since layout 13
    journal: list[tuple[str, Any, Any]]
    applied_seq: int
    snapshot_released: bool
    # an owner's (join/owners.py): the subscriptions the batch added (alias, key, shard),
    # and the streaming fact events it got as their reads
    subscribed: list[tuple[str, Any, int]] = field(default_factory=list)
    fact_reads: list[Any] = field(default_factory=list)

    @property
    def snapshot_events(self) -> list[ChangeEvent]:
        """The batch's snapshot rows (``ShardLog`` sizes a segment with them)."""
        return [e for e in self.events if e.is_snapshot]


class ShardApplier:
    """One shard of the staged engine: its rows per open transaction, applied as released.

    Its input per batch (:meth:`process_routed`): its events (the rows it holds) and the
    batch's :class:`Release` entries (or one :class:`ReleaseColumns`), as ``Routed``
    items."""

    FIELDS: tuple[str, ...] = ("pending", "incremental", "incremental_read_to", "released",
                               "applied_seq", "snapshot_released")

    def __init__(self, job: Job, shard: int = 0, n_shards: int = 1,
                 policy: IncompletePolicy | None = None) -> None:
        self.job = job
        self.shard, self.n_shards = shard, n_shards
        self.join = TemporalJoin(job)
        self._sources = {t: job.source_of(t) for t in job.table_names}
        self.pending: dict[tuple[str, int], PendingTransaction] = {}
        self.snapshot = SnapshotBuffer(frozenset(job.table_names))
        # an incremental snapshot's rows by position until a correction names them, and the
        # last offset read of them per table (a row at or before it is read again)
        self.incremental: dict[Position, ChangeEvent] = {}
        self.incremental_read_to: dict[str, int] = {}
        self.memory = RELEASED_MEMORY
        self.released: dict[str, deque[int]] = {s: deque() for s in job.source_names}
        self._released_sets: dict[str, set[int]] = {s: set() for s in job.source_names}
        self.applied_seq = 0
        self.snapshot_released = False
        self.stats = EngineStats()
        # what state_log.ShardLog reads and sets
        self.last_effects: AppliedEffects | None = None
        self.max_transaction_bytes: int | None = None  # (a shard of this engine spills)
        self.batch_wire_s = 0.0
        self.batch_join_s = 0.0
        self.log_version = 0
        self.log_token = ""

    # -- a batch -------------------------------------------------------------------------

    def process_routed(self, records: Iterable[Routed], caught_up: Iterable[str] = (),
                       partitions: TopicPartitions | None = None) -> list[OutputChange]:
        """Buffer the batch's events (in topic order per partition), then apply its releases
        (in their order) with the rows the owners forward for each (``join/owners.py``);
        the output changes, in commit order. ``caught_up`` and ``partitions`` are the
        sequencer's business."""
        events: list[ChangeEvent] = []
        given: list[Release | ReleaseColumns] = []
        forwarded: dict[int, list[tuple[str, Any, Any]]] = {}
        changed: set[int] = set()
        for item, _size in records:
            if isinstance(item, (Release, ReleaseColumns)):
                given.append(item)
            elif isinstance(item, Forward):
                forwarded.setdefault(item.release, []).append((item.table, item.key, item.row))
            elif isinstance(item, CorrectionChanged):
                changed.add(item.release)
            else:
                assert isinstance(item, ChangeEvent), item
                events.append(item)
        events.sort(key=_position_key)
        releases, columns = release_rows(given)
        self.batch_join_s = 0.0
        self.join.journal = []
        try:
            for event in events:
                self._add(event)
            changes: list[OutputChange] = []
            pending, remember = self.pending, self._remember
            for index, release in enumerate(releases):
                if release[0] == TRANSACTION and index not in forwarded:
                    tx = release[1], release[2]
                    if tx not in pending:
                        # nothing of it here (most of a batch's releases at several shards):
                        # numbered and remembered as _release would, without its pass
                        remember(*tx)
                        self.applied_seq += 1
                        continue
                changes.extend(self._release(Release._make(release), forwarded.get(index, ()),
                                             index in changed))
            journal = self.join.journal
        finally:
            self.join.journal = None
        self.stats.batches += 1
        self.stats.changes_emitted += len(changes)
        self.last_effects = AppliedEffects(events, columns, journal, self.applied_seq,
                                           self.snapshot_released)
        return changes

    def process(self, events: Iterable[ChangeEvent], releases: Iterable[Release]
                ) -> list[OutputChange]:
        """:meth:`process_routed` of plain events and releases."""
        return self.process_routed([*(Routed(e, 0) for e in events),
                                    *(Routed(r, 0) for r in releases)])  # type: ignore[arg-type]

    def _add(self, event: ChangeEvent) -> None:
        self.stats.events += 1
        if event.snapshot == INCREMENTAL:
            if event.position.offset > self.incremental_read_to.get(event.table, -1):
                self.incremental_read_to[event.table] = event.position.offset
                self.incremental[event.position] = event
            return
        if event.is_snapshot:
            self.snapshot.add(event)  # a new row after the snapshot stops the job, as in shards
            return
        assert event.xid is not None
        source = self._sources[event.table]
        if event.xid in self._released_sets[source]:
            return  # a redelivery of a released transaction's event
        key = (source, event.xid)
        tx = self.pending.get(key)
        if tx is None:
            tx = self.pending[key] = PendingTransaction(event.xid)
        tx.add(event)

    def _remember(self, source: str, xid: int) -> None:
        order, released = self.released[source], self._released_sets[source]
        order.append(xid)
        released.add(xid)
        while len(order) > self.memory:
            released.discard(order.popleft())

    def _take(self, release: Release) -> list[ChangeEvent] | Any:
        """What ``release`` does to the buffers, without the join: the rows it applies."""
        kind = release.kind
        if kind == SNAPSHOT:
            self.snapshot_released = release.with_rows
            rows, self.snapshot.rows = self.snapshot.rows, []
            self.snapshot.done = True
            return rows
        if kind == CORRECTION:
            return [self.incremental.pop(p) for p in release.rows if p in self.incremental]
        assert kind in (TRANSACTION, SKIP) and release.source is not None, release
        self._remember(release.source, release.xid)
        tx = self.pending.pop((release.source, release.xid), None)
        if tx is None or kind == SKIP:
            return []
        self.stats.transactions_released += 1
        return in_table_order(tx.events)

    def _release(self, release: Release, forwarded: Sequence[tuple[str, Any, Any]] = (),
                 owners_changed: bool = False) -> list[OutputChange]:
        """Apply one release; ``forwarded``: the split tables' rows the owners sent for it,
        ``owners_changed``: an owner's rows of a correction changed."""
        kind = release.kind
        rows = self._take(release)
        if kind == SKIP:
            return []
        keep = self.job.semantics == "current"  # else read for this release only
        started = time.perf_counter()
        try:
            if kind == SNAPSHOT:
                if not rows and not forwarded:
                    return []
                return self.join.apply(Transaction(SNAPSHOT_XID, 0, latest_commit_ts(rows),
                                                   rows), forwarded, keep)
            if kind == CORRECTION:
                events = self.join.changing(rows)
                if not events and not release.with_fact and not owners_changed:
                    return []  # looked-up rows only, all equal: every shard drops it
                self.applied_seq += 1
                return self.join.apply(Transaction(SNAPSHOT_XID, self.applied_seq,
                                                   release.commit_ts_ms, events,
                                                   correction=True), forwarded, keep)
            self.applied_seq += 1
            if not rows and not forwarded:
                return []  # nothing of it here: no pass over it
            out = self.join.apply(Transaction(release.xid, self.applied_seq,
                                              release.commit_ts_ms, rows, release.source),
                                  forwarded, keep)
            crashpoints.in_shard()  # tests only: the transaction applied, the batch not saved
            return out
        finally:
            if forwarded and not keep:
                self.join.forget(forwarded)  # (join/placement.py)
            self.batch_join_s += time.perf_counter() - started

    def apply_effects(self, effects: AppliedEffects, changes: Iterable[OutputChange]) -> None:
        """Bring this shard forward over a batch it processed before (no join evaluation)."""
        for event in effects.events:
            self._add(event)
        for release in effects.releases:
            self._take(release)
        self.applied_seq = effects.applied_seq
        self.snapshot_released = effects.snapshot_released
        self.join.replay_journal(effects.journal, changes)

    # -- introspection and checkpointing --------------------------------------------------

    @property
    def commit_seq(self) -> int:
        return self.applied_seq

    def buffered_rows(self) -> int:
        """The snapshot rows and events it buffers (``state_log.engine_rows``)."""
        return (len(self.snapshot.rows) + len(self.incremental)
                + sum(len(p.events) for p in self.pending.values()))

    def outputs(self) -> dict[tuple[Any, ...], dict[str, Any]]:
        unpack_row = self.join.unpack
        return {key: unpack_row(packed) for key, packed in self.join.outputs.items()}

    def state_value(self) -> dict[str, Any]:
        """The whole state (the job itself is not included), as a value to pickle (as
        ``Engine.state_value``)."""
        return {**{name: getattr(self, name) for name in self.FIELDS},
                "snapshot": self.snapshot.state(), "join": self.join.state()}

    def state_bytes(self) -> bytes:
        """:meth:`state_value` packed."""
        return pack(self.state_value())

    @classmethod
    def from_state(cls, job: Job, blob: bytes, policy: IncompletePolicy | None = None,
                   shard: int = 0, n_shards: int = 1) -> ShardApplier:
        return cls.from_state_value(job, unpack(blob), policy, shard, n_shards)

    @classmethod
    def from_state_value(cls, job: Job, state: Any, policy: IncompletePolicy | None = None,
                         shard: int = 0, n_shards: int = 1) -> ShardApplier:
        applier = cls(job, shard, n_shards, policy)
        for name in cls.FIELDS:
            setattr(applier, name, state[name])
        applier._released_sets = {s: set(order) for s, order in applier.released.items()}
        applier.snapshot.restore(state["snapshot"])
        applier.join.restore(state["join"])
        return applier


class StagedEngine:
    """A sequencer, the owner stages of the split tables (``join/owners.py``; none unless
    ``split`` names lookups that can be, ``join/placement.py``) and ``n`` shard appliers,
    each with its own log in a :class:`MemoryStore` (as Spark's state store holds them),
    with the interface of ``sharded.ShardedEngine``."""

    def __init__(self, job: Job, n_shards: int, policy: IncompletePolicy | None = None,
                 split: Iterable[str] = ()) -> None:
        from txjoin.join.owners import owner_class  # (owners.py builds on this module)

        self.job = job
        self.policy = policy or IncompletePolicy()
        self.placement = Placement(job, split)
        self.router = Router(job, n_shards, place=fact_shard if self.placement else shard_of)
        self.owner_classes = {d: owner_class(self.placement, d)
                              for d in range(1, self.placement.depths + 1)}
        self.sequencer_store = MemoryStore()
        self.stores = [MemoryStore() for _ in range(n_shards)]
        self.owner_stores = {(d, o): MemoryStore() for d in self.owner_classes
                             for o in range(n_shards)}
        self.sequencer: Sequencer | None = None
        self.cache: dict[int, ShardApplier] = {}
        self.owner_cache: dict[tuple[int, int], ShardApplier] = {}
        self.last_releases: list[Release] = []

    @property
    def n_shards(self) -> int:
        return len(self.stores)

    def sequencer_log(self) -> ShardLog:
        return ShardLog(self.sequencer_store, self.job, SEQUENCER, self.n_shards, self.policy,
                        where="the sequencer", engine_class=Sequencer,
                        layouts=STAGED_LAYOUTS)

    def shard_log(self, shard: int) -> ShardLog:
        return ShardLog(self.stores[shard], self.job, shard, self.n_shards, self.policy,
                        engine_class=ShardApplier,  # type: ignore[arg-type]
                        layouts=STAGED_LAYOUTS)

    def owner_log(self, depth: int, owner: int) -> ShardLog:
        return ShardLog(self.owner_stores[(depth, owner)], self.job, owner, self.n_shards,
                        self.policy, where=f"owner {owner} of depth {depth}",
                        engine_class=self.owner_classes[depth],  # type: ignore[arg-type]
                        layouts=STAGED_LAYOUTS)

    def route(self, records: Iterable[tuple[str, int, int, str | None]]
              ) -> tuple[list[Routed], list[list[ChangeEvent]],
                         dict[tuple[int, int], list[ChangeEvent | FactReads]]]:
        """The sequencer's input (every record's metadata, each table's streaming events
        as columns, as Spark's sequencer takes them), each shard's (the events
        whose rows it holds) and each owner's by (depth, owner): the events of its split
        tables' rows and, at depth 1, the fact events whose references it owns."""
        meta: list[Routed] = []
        per_shard: list[list[ChangeEvent]] = [[] for _ in self.stores]
        owned: dict[tuple[int, int], list[ChangeEvent | FactReads]] = {
            k: [] for k in self.owner_stores}
        placement, fact = self.placement, self.job.fact
        for topic, partition, offset, value in records:
            item = decode(value, Position(topic, partition, offset))
            if item is None:
                continue
            if isinstance(item, TxMarker):
                meta.append(Routed(item, 0))
                continue
            routed = self.router.route(item, 0)
            if routed[0] is None:
                continue  # a table the job does not read
            meta.append(Routed(metadata_only(routed[0].item), 0))  # type: ignore[arg-type]
            if placement.is_split(item.table):
                event = routed[0].item
                assert isinstance(event, ChangeEvent)
                depth = placement.depth[placement.table_alias[item.table]]
                for owner in self._owners_of_row(event):
                    owned[(depth, owner)].append(event)
                continue
            whole = None
            for shard, one in enumerate(routed):
                event = one.item  # type: ignore[union-attr]
                assert isinstance(event, ChangeEvent)
                if not is_metadata_only(event):
                    per_shard[shard].append(event)
                    whole = whole or event
            if placement and item.table == fact and whole is not None \
                    and whole.after is not None:
                # to the depth-1 owners of the keys it reads (none if its row cannot be
                # read: its shard stops the job on it); a streaming one as its reads, as
                # Spark's routing sends it, a snapshot or correction row whole (an owner
                # buffers it until its release)
                reads = placement.compact(whole, self.n_shards)
                if reads is None:
                    continue
                streaming = whole.xid is not None and not (
                    whole.is_snapshot or whole.snapshot == INCREMENTAL)
                for owner in {owner_of(key, self.n_shards) for _alias, key in reads.reads}:
                    owned[(1, owner)].append(reads if streaming else whole)
        return gather_foreign(sorted(self.job.table_names), meta), per_shard, owned

    def _owners_of_row(self, event: ChangeEvent) -> set[int]:
        """The owners of a split table's event: of its ``before`` and ``after`` keys (a
        truncate: every owner; a row that cannot be read: owner 0, which stops on it)."""
        n = self.n_shards
        if event.op == "t":
            return set(range(n))
        table = self.job.table(event.table)
        try:
            return {owner_of(table.convert_key(image), n)
                    for image in (event.before, event.after) if image is not None}
        except JobError:
            return {0}

    def process(self, records: Iterable[tuple[str, int, int, str | None]],
                caught_up: Iterable[str] = (), drop_cache: Iterable[int] = (),
                partitions: TopicPartitions | None = None,
                drop_sequencer: bool = False) -> list[OutputChange]:
        """One micro-batch; ``drop_cache``: shards (and the owners of the same numbers)
        that go on from their logs (a restart); ``drop_sequencer``: the sequencer too."""
        for shard in drop_cache:
            self.cache.pop(shard, None)
            for depth in self.owner_classes:
                self.owner_cache.pop((depth, shard), None)
        if drop_sequencer:
            self.sequencer = None
        with long_lived_state():
            meta, per_shard, owned = self.route(records)
        caught = list(caught_up)
        with long_lived_state():
            result = self.sequencer_log().process(self.sequencer, meta, caught, partitions)
        sequencer = result.engine
        assert isinstance(sequencer, Sequencer)
        self.sequencer = sequencer
        self.last_releases = sequencer.releases
        releases = ReleaseColumns(sequencer.releases)  # as Spark's stages send them
        to_shards: list[list[Any]] = [[] for _ in self.stores]
        flags: set[CorrectionChanged] = set()
        messages: dict[int, list[Subscribe]] = {}
        for depth in self.owner_classes:
            below: dict[int, list[Subscribe]] = {}
            for o in range(self.n_shards):
                owner_items: list[Any] = [*owned[(depth, o)], releases, *messages.get(o, ())]
                with long_lived_state():
                    done = self.owner_log(depth, o).process(
                        self.owner_cache.get((depth, o)),  # type: ignore[arg-type]
                        [Routed(item, 0) for item in owner_items], caught, partitions)
                owner = done.engine
                self.owner_cache[(depth, o)] = owner  # type: ignore[assignment]
                owner.hand_on(to_shards, flags, below)  # type: ignore[attr-defined]
            messages = below
        changes: list[OutputChange] = []
        for shard, events in enumerate(per_shard):
            shard_items: list[Any] = [*events, releases, *to_shards[shard], *sorted(flags)]
            with long_lived_state():
                done = self.shard_log(shard).process(
                    self.cache.get(shard),  # type: ignore[arg-type]
                    [Routed(item, 0) for item in shard_items], caught, partitions)
            applier = done.engine
            assert isinstance(applier, ShardApplier)
            self.cache[shard] = applier
            changes.extend(done.changes)
        changes.sort(key=lambda ch: ch.commit_seq)
        return changes

    @property
    def appliers(self) -> list[ShardApplier]:
        return [self.cache[s] for s in range(self.n_shards)]

    @property
    def commit_seq(self) -> int:
        seqs = {a.commit_seq for a in self.appliers}
        assert len(seqs) == 1, f"shards disagree on the releases: {seqs}"
        return seqs.pop()

    @property
    def snapshot_done(self) -> bool:
        return self.sequencer is not None and self.sequencer.snapshot_done

    @property
    def snapshot_released(self) -> bool:
        return self.appliers[0].snapshot_released

    def outputs(self) -> dict[tuple[Any, ...], dict[str, Any]]:
        merged: dict[tuple[Any, ...], dict[str, Any]] = {}
        for applier in self.appliers:
            merged.update(applier.outputs())
        return merged
