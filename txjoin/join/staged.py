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
looked-up rows; a correction with a fact row is always numbered (the sequencer says which
have one). So the union of the shards' outputs is the core's, release for release.

Every rule stays where it is proven: the sequencer *is* the core's engine without a join,
fed what every shard is fed today of the records it does not hold. What a shard decides on
its own (which of its events a release applies, a redelivery of a released transaction's
event, a snapshot row after the snapshot) follows from the releases and the same
identities; the property tests (tests/unit/test_staged.py) check the result against the
oracle and against today's sharded engine. In Spark the sequencer is meant to be one
stage before the shards (its input: the JVM router's metadata columns), not yet wired.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from txjoin.ingest.debezium import INCREMENTAL, ChangeEvent, Position, TxMarker, decode
from txjoin.job import Job
from txjoin.join.engine import Engine
from txjoin.join.routing import Router, is_metadata_only, metadata_only
from txjoin.join.state import pack, unpack
from txjoin.join.temporal import OutputChange, TemporalJoin
from txjoin.sequence.assembly import (
    SNAPSHOT_XID,
    IncompletePolicy,
    PendingTransaction,
    SnapshotBuffer,
    TopicPartitions,
    Transaction,
)
from txjoin.sequence.spill import drain, in_table_order, latest_commit_ts

SNAPSHOT, TRANSACTION, CORRECTION, SKIP = "snapshot", "transaction", "correction", "skip"
"""The kinds of :class:`Release`."""

RELEASED_MEMORY = 100_000
"""Released xids remembered per source (``Frontier.memory``): the sequencer's and every
shard's, so both drop the same redelivered events."""


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


def _position_key(item: ChangeEvent | TxMarker) -> tuple[str, int, int]:
    pos = item.position
    return pos.topic, pos.partition, pos.offset


class Sequencer(Engine):
    """The core engine without a join: assembly and commit order of every source, from the
    metadata of every record; :meth:`sequence` returns a batch's releases."""

    def __init__(self, job: Job, policy: IncompletePolicy | None = None,
                 released_memory: int = RELEASED_MEMORY) -> None:
        super().__init__(job, policy, released_memory)
        self._releases: list[Release] = []
        self._skips_seen = dict.fromkeys(job.source_names, 0)

    def restore(self, state: Any, rows: bool = True) -> None:
        super().restore(state, rows)
        self._skips_seen = {s: len(f.skipped) for s, f in self.frontiers.items()}

    def sequence(self, items: Iterable[ChangeEvent | TxMarker], caught_up: Iterable[str] = (),
                 partitions: TopicPartitions | None = None) -> list[Release]:
        """One micro-batch of metadata (events without rows, markers; any order): what it
        releases, in order. Raises what the core raises (an incomplete transaction under
        ``fail``, a record of an undeclared partition, ...)."""
        self._releases = []
        self.process_decoded(sorted(items, key=_position_key), caught_up, partitions)
        return self._releases

    def _record_skips(self) -> None:
        """Transactions the incomplete policy dropped since the last call (``Frontier.enforce``
        runs between the engine's two release passes), as ``skip`` entries."""
        for source, frontier in self.frontiers.items():
            seen = self._skips_seen[source]
            for xid in frontier.skipped[seen:]:
                self._releases.append(Release(SKIP, source, xid))
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
            self._releases.append(Release(SNAPSHOT, with_rows=with_rows))
            self.snapshot_released = with_rows
        for source, frontier in self.frontiers.items():
            for tx in frontier.release_streaming(self.assemblers[source]):
                tx.source = source
                yield tx

    def _apply(self, tx: Transaction) -> list[OutputChange]:
        self.stats.transactions_released += 1
        if tx.correction:
            rows = list(drain(tx.events))
            self._releases.append(Release(
                CORRECTION, tx.source, SNAPSHOT_XID, tx.commit_ts_ms,
                tuple(e.position for e in rows),
                with_fact=any(e.table == self.job.fact for e in rows)))
        else:
            tx.events = []  # metadata only: nothing to keep
            self._releases.append(Release(TRANSACTION, tx.source, tx.xid, tx.commit_ts_ms))
        return []


class ShardApplier:
    """One shard of the staged engine: its rows per open transaction, applied as released."""

    def __init__(self, job: Job, shard: int = 0, n_shards: int = 1,
                 released_memory: int = RELEASED_MEMORY) -> None:
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
        self.memory = released_memory
        self.released: dict[str, deque[int]] = {s: deque() for s in job.source_names}
        self._released_sets: dict[str, set[int]] = {s: set() for s in job.source_names}
        self.applied_seq = 0
        self.snapshot_released = False

    # -- a batch -------------------------------------------------------------------------

    def process(self, events: Iterable[ChangeEvent], releases: Iterable[Release]
                ) -> list[OutputChange]:
        """Buffer the batch's events this shard holds (in topic order per partition), then
        apply the batch's releases; the output changes, in commit order."""
        for event in sorted(events, key=_position_key):
            self._add(event)
        changes: list[OutputChange] = []
        for release in releases:
            changes.extend(self._release(release))
        return changes

    def _add(self, event: ChangeEvent) -> None:
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

    def _release(self, release: Release) -> list[OutputChange]:
        kind = release.kind
        if kind == SNAPSHOT:
            self.snapshot_released = release.with_rows
            rows, self.snapshot.rows = self.snapshot.rows, []
            self.snapshot.done = True
            if not rows:
                return []
            return self.join.apply(Transaction(SNAPSHOT_XID, 0, latest_commit_ts(rows), rows))
        if kind == SKIP:
            assert release.source is not None
            self.pending.pop((release.source, release.xid), None)
            self._remember(release.source, release.xid)
            return []
        if kind == CORRECTION:
            rows = [self.incremental.pop(p) for p in release.rows if p in self.incremental]
            events = self.join.changing(rows)
            if not events and not release.with_fact:
                return []  # looked-up rows only, all equal: every shard drops it
            self.applied_seq += 1
            return self.join.apply(Transaction(SNAPSHOT_XID, self.applied_seq,
                                               release.commit_ts_ms, events, correction=True))
        assert kind == TRANSACTION and release.source is not None
        self.applied_seq += 1
        self._remember(release.source, release.xid)
        tx = self.pending.pop((release.source, release.xid), None)
        if tx is None:
            return []  # nothing of it here: no pass over it
        return self.join.apply(Transaction(release.xid, self.applied_seq, release.commit_ts_ms,
                                           in_table_order(tx.events), release.source))

    # -- introspection and checkpointing --------------------------------------------------

    @property
    def commit_seq(self) -> int:
        return self.applied_seq

    def outputs(self) -> dict[tuple[Any, ...], dict[str, Any]]:
        unpack_row = self.join.unpack
        return {key: unpack_row(packed) for key, packed in self.join.outputs.items()}

    FIELDS = ("pending", "incremental", "incremental_read_to", "released", "applied_seq",
              "snapshot_released")

    def state_bytes(self) -> bytes:
        """The whole state (the job itself is not included)."""
        return pack({**{name: getattr(self, name) for name in self.FIELDS},
                     "snapshot": self.snapshot.state(), "join": self.join.state()})

    @classmethod
    def from_state(cls, job: Job, blob: bytes, shard: int = 0, n_shards: int = 1
                   ) -> ShardApplier:
        state = unpack(blob)
        applier = cls(job, shard, n_shards)
        for name in cls.FIELDS:
            setattr(applier, name, state[name])
        applier._released_sets = {s: set(order) for s, order in applier.released.items()}
        applier.snapshot.restore(state["snapshot"])
        applier.join.restore(state["join"])
        return applier


class StagedEngine:
    """A sequencer and ``n`` shard appliers, each persisted after every batch (as a
    checkpoint would), with the interface of ``sharded.ShardedEngine``."""

    def __init__(self, job: Job, n_shards: int, policy: IncompletePolicy | None = None) -> None:
        self.job = job
        self.router = Router(job, n_shards)
        self.policy = policy or IncompletePolicy()
        self.sequencer = Sequencer(job, self.policy)
        self.appliers = [ShardApplier(job, s, n_shards) for s in range(n_shards)]
        self.saved_sequencer = self.sequencer.state_bytes()
        self.saved = [a.state_bytes() for a in self.appliers]
        self.last_releases: list[Release] = []

    @property
    def n_shards(self) -> int:
        return len(self.appliers)

    def route(self, records: Iterable[tuple[str, int, int, str | None]]
              ) -> tuple[list[ChangeEvent | TxMarker], list[list[ChangeEvent]]]:
        """The sequencer's input (every record's metadata) and each shard's (the events
        whose rows it holds)."""
        meta: list[ChangeEvent | TxMarker] = []
        per_shard: list[list[ChangeEvent]] = [[] for _ in self.appliers]
        for topic, partition, offset, value in records:
            item = decode(value, Position(topic, partition, offset))
            if item is None:
                continue
            if isinstance(item, TxMarker):
                meta.append(item)
                continue
            routed = self.router.route(item, 0)
            if routed[0] is None:
                continue  # a table the job does not read
            meta.append(metadata_only(routed[0].item))  # type: ignore[arg-type]
            for shard, one in enumerate(routed):
                event = one.item  # type: ignore[union-attr]
                assert isinstance(event, ChangeEvent)
                if not is_metadata_only(event):
                    per_shard[shard].append(event)
        return meta, per_shard

    def process(self, records: Iterable[tuple[str, int, int, str | None]],
                caught_up: Iterable[str] = (), drop_cache: Iterable[int] = (),
                partitions: TopicPartitions | None = None,
                drop_sequencer: bool = False) -> list[OutputChange]:
        """One micro-batch; ``drop_cache``: shards that go on from their saved state (a
        restart); ``drop_sequencer``: the sequencer too."""
        job = self.job
        for shard in drop_cache:
            self.appliers[shard] = ShardApplier.from_state(job, self.saved[shard], shard,
                                                           self.n_shards)
        if drop_sequencer:
            self.sequencer = Sequencer.from_state(job, self.saved_sequencer, self.policy)
        meta, per_shard = self.route(records)
        releases = self.sequencer.sequence(meta, caught_up, partitions)
        self.last_releases = releases
        changes: list[OutputChange] = []
        for shard, applier in enumerate(self.appliers):
            changes.extend(applier.process(per_shard[shard], releases))
        self.saved_sequencer = self.sequencer.state_bytes()
        self.saved = [a.state_bytes() for a in self.appliers]
        changes.sort(key=lambda ch: ch.commit_seq)
        return changes

    @property
    def commit_seq(self) -> int:
        seqs = {a.commit_seq for a in self.appliers}
        assert len(seqs) == 1, f"shards disagree on the releases: {seqs}"
        return seqs.pop()

    @property
    def snapshot_done(self) -> bool:
        return self.sequencer.snapshot_done

    @property
    def snapshot_released(self) -> bool:
        return self.appliers[0].snapshot_released

    def outputs(self) -> dict[tuple[Any, ...], dict[str, Any]]:
        merged: dict[tuple[Any, ...], dict[str, Any]] = {}
        for applier in self.appliers:
            merged.update(applier.outputs())
        return merged
