"""One shard of the partitioned engine: the whole sequencing, a part of the join.

A :class:`ShardEngine` is the core :class:`~txjoin.join.engine.Engine` with two
differences (see ``routing.py`` for who receives what):

- its join holds only the facts the shard owns (plus full copies of the
  looked-up tables), and skips the metadata-only events of other shards' facts;
- it records what each micro-batch did (:class:`Effects`: the small assembly
  and frontier state, the snapshot rows and released xids it added, every row
  it put or removed) so that a copy of the shard one batch behind can be
  brought forward with :meth:`apply_effects`, without decoding the batch again
  or evaluating the join. The state log (``state_log.py``) stores the effects
  with the output changes as the batch's segment.

Every shard sees the metadata of every event and marker, in the same order
(sorted by topic, partition, offset, as the core engine does), so every shard's
assembler and frontier go through the same states and release the same
transactions in the same batch.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from txjoin.errors import TransactionTooLargeError
from txjoin.ingest.debezium import INCREMENTAL, ChangeEvent, TxMarker
from txjoin.job import Job
from txjoin.join.engine import Engine
from txjoin.join.routing import METADATA_SIZE, ForeignFacts, Routed
from txjoin.join.temporal import OutputChange, TemporalJoin
from txjoin.sequence.assembly import IncompletePolicy, SnapshotBuffer, TopicPartitions


@contextlib.contextmanager
def long_lived_state(settle: bool = True) -> Iterator[None]:
    """Run a shard's batch with the cyclic collector off, then collect only what the batch
    allocated and move the survivors out of the collector's generations (``gc.freeze``).

    A shard's state is millions of long-lived objects (rows, open transactions' events):
    left to the collector, every full collection during a batch walks all of them again
    (a 200,000-event transaction: ~20% of its batches' time). ``settle=False`` leaves the
    collector off for the caller to :func:`settle_state` later: a shard's host does it
    after it replied, between two batches, not on the task's path."""
    gc.disable()
    try:
        yield
    finally:
        if settle:
            settle_state()


def settle_state() -> None:
    """The end of :func:`long_lived_state`: collect what the batch allocated, freeze the
    survivors, turn the collector back on."""
    gc.collect(1)
    gc.freeze()
    gc.enable()


def _position_key(item: ChangeEvent | TxMarker) -> tuple[str, int, int]:
    pos = item.position
    return pos.topic, pos.partition, pos.offset


class ShardEngine(Engine):
    """Sequencing of every transaction; the join for the facts of shard ``shard`` of ``n``."""

    # Saved (join/state.py): the engine's, and the open transactions' buffered bytes.
    FIELDS = (*Engine.FIELDS, "open_bytes")

    def __init__(self, job: Job, shard: int = 0, n_shards: int = 1,
                 policy: IncompletePolicy | None = None) -> None:
        super().__init__(job, policy)
        self.shard = shard
        self.n_shards = n_shards
        self.join = TemporalJoin(job)
        self.last_effects: Effects | None = None
        # Bytes of routed records buffered per open transaction, and the budget
        # (``--max-transaction-bytes``; None, the default: no limit). Logged with the
        # assembly state.
        self.open_bytes: dict[tuple[str, int], int] = {}  # (source, xid) -> bytes
        self.max_transaction_bytes: int | None = None
        self.batch_snapshot_rows = 0  # snapshot rows in the last batch processed
        self.batch_wire_s = 0.0  # seconds the last batch spent reading its routed records
        # Which logged state this engine is (state_log.py): micro-batches applied, and the
        # token naming that exact state.
        self.log_version = 0
        self.log_token = ""

    def process_routed(self, records: Iterable[Routed], caught_up: Iterable[str] = (),
                       partitions: TopicPartitions | None = None) -> list[OutputChange]:
        """Process one batch of routed records (``routing.Routed``); output changes.

        Also records the batch's *effects* (:attr:`last_effects`): what a copy of
        this shard's state at the previous batch needs to become this state.
        """
        started = time.perf_counter()
        records = list(records)
        if self.max_transaction_bytes is not None:
            self._count_open_bytes(records)
        items: list[ChangeEvent | TxMarker] = []
        foreign: list[ForeignFacts] = []
        for r in records:
            if isinstance(r.item, ForeignFacts):
                foreign.append(r.item)
            else:
                items.append(r.item)
        # per table: counted per transaction, or (a partitioned topic's) event by event, as
        # routing's metadata-only events
        counted = [f for f in foreign if self._counts_per_transaction(f, partitions)]
        items.extend(f.event(i) for f in foreign if f not in counted for i in range(len(f)))
        items.sort(key=_position_key)
        self.batch_wire_s = time.perf_counter() - started
        # (an incremental snapshot's rows are not the snapshot's: the sequencer state holds them)
        snapshot_events = [it for it in items if isinstance(it, ChangeEvent) and it.is_snapshot
                           and it.snapshot != INCREMENTAL]
        # every shard sees every snapshot row (with its image or without): the batch's count
        self.batch_snapshot_rows = len(snapshot_events)
        # what the buffer keeps of them: the rows this shard holds
        snapshot_events = [e for e in snapshot_events if SnapshotBuffer.holds(e)]
        remembered = {s: f.remembered for s, f in self.frontiers.items()}
        self.join.journal = []
        try:
            changes = self.process_decoded(items, caught_up, partitions, counted)
            journal = self.join.journal
        finally:
            self.join.journal = None
        if self.open_bytes:
            self.open_bytes = {k: n for k, n in self.open_bytes.items()
                               if isinstance(k, tuple) and k[0] in self.assemblers
                               and k[1] in self.assemblers[k[0]].pending}
        released: dict[str, list[int]] = {}
        for source, frontier in self.frontiers.items():
            new = frontier.remembered - remembered[source]
            if new:
                released[source] = list(frontier._released_order)[-new:]
        self.last_effects = Effects(self._sequencer_state(), snapshot_events, released, journal)
        return changes

    def _counts_per_transaction(self, foreign: ForeignFacts,
                                partitions: TopicPartitions | None) -> bool:
        """Whether the batch's foreign events of a table can be counted per transaction:
        their topic has one partition (with several, numbering is collected per partition:
        event by event)."""
        table = foreign.table
        declared = partitions.counts.get(table, 1) if partitions is not None else 1
        return (max(declared, self.partition_counts.get(table, 1)) == 1
                and not any(foreign.partitions))

    def _count_open_bytes(self, records: list[Routed]) -> None:
        """Fail, naming the xid and its size, when a transaction outgrows the budget.

        A run given ``--max-transaction-bytes`` (none by default: a large open
        transaction's events wait on disk, ``sequence/spill.py``) stops with a clear error
        on a transaction larger than that. The size is the bytes of the routed records
        this shard buffered for it (``Routed.size``).
        """
        budget = self.max_transaction_bytes
        assert budget is not None
        counted = self.open_bytes
        sources = self._table_sources
        first = self.job.source_names[0]
        for item, nbytes in records:
            if isinstance(item, ForeignFacts):
                source = sources.get(item.table, first)
                sizes: Iterable[tuple[int, int]] = ((xid, n * METADATA_SIZE) for xid, n
                                                    in Counter(item.xids).items())
            elif isinstance(item, ChangeEvent) and item.xid is not None:
                source = sources.get(item.table, first)
                sizes = [(item.xid, nbytes)]
            else:
                continue
            for xid, nbytes in sizes:
                key = (source, xid)  # xids are per database
                size = counted.get(key, 0) + nbytes
                counted[key] = size
                if size > budget:
                    position = (item.event(item.xids.index(xid)).position
                                if isinstance(item, ForeignFacts) else item.position)
                    raise TransactionTooLargeError(
                        f"transaction xid {xid} is larger than --max-transaction-bytes "
                        f"{budget} (more than {size} bytes buffered in shard {self.shard} at "
                        f"{position}); raise or drop --max-transaction-bytes (without it, "
                        f"a large transaction waits on the worker's local disk), or split "
                        f"such transactions at the source")

    def buffered_rows(self) -> int:
        """The snapshot rows and events it buffers (``state_log.engine_rows``)."""
        return sum(len(a.snapshot.rows) + sum(len(p.events) for p in a.pending.values())
                   for a in self.assemblers.values())

    def _sequencer_state(self) -> dict[str, Any]:
        """The assembly and frontier state of every source, without what grows with history
        or the database (released xids, snapshot rows and identities: carried as deltas)
        and the join."""
        return self.state(rows=False)

    def apply_effects(self, effects: Effects, changes: Iterable[OutputChange]) -> None:
        """Bring this shard forward over a batch it processed before (no join evaluation)."""
        first = self.job.source_names[0]
        state = effects.sequencer  # freshly unpickled from the segment: ours to keep
        released = effects.released
        for event in effects.snapshot_events:
            source = self._table_sources.get(event.table, first)
            self.assemblers[source].snapshot.add(event)
        self.restore(state, rows=False)
        for assembler in self.assemblers.values():
            if assembler.snapshot.done:
                assembler.snapshot.rows = []  # released within (or before) this batch
        for source, xids in released.items():
            frontier = self.frontiers[source]
            remembered = frontier.remembered  # the count after the batch, restored above
            for xid in xids:
                frontier._remember(xid)
            frontier.remembered = remembered
        self.join.replay_journal(effects.journal, changes)


@dataclass
class Effects:
    """What one batch did to a shard's state, enough to redo it without evaluating."""

    sequencer: dict[str, Any]  # ShardEngine.state(rows=False)
    snapshot_events: list[ChangeEvent]
    released: dict[str, list[int]]  # per source
    journal: list[tuple[str, Any, Any]]
