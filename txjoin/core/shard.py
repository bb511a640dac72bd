"""One shard of the partitioned engine: the whole sequencing, a part of the join.

A :class:`ShardEngine` is the core :class:`~txjoin.core.engine.Engine` with two
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

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from txjoin.core.assembly import IncompletePolicy
from txjoin.core.engine import Engine
from txjoin.core.join import OutputChange, TemporalJoin
from txjoin.core.routing import ShardOwnership, from_wire
from txjoin.debezium import ChangeEvent, TxMarker
from txjoin.job import Job


def _position_key(item: ChangeEvent | TxMarker) -> tuple[str, int, int]:
    pos = item.position
    return pos.topic, pos.partition, pos.offset


class ShardEngine(Engine):
    """Sequencing of every transaction; the join for the facts of shard ``shard`` of ``n``."""

    def __init__(self, job: Job, shard: int = 0, n_shards: int = 1,
                 policy: IncompletePolicy | None = None) -> None:
        super().__init__(job, policy)
        self.shard = shard
        self.n_shards = n_shards
        self.join = TemporalJoin(job, owns=None if n_shards == 1 else
                                 ShardOwnership(shard, n_shards))
        self.last_effects: Effects | None = None
        self.batch_snapshot_rows = 0  # snapshot rows in the last batch processed
        # Which logged state this engine is (state_log.py): micro-batches applied, and the
        # token naming that exact state.
        self.log_version = 0
        self.log_token = ""

    def process_wire(self, records: Iterable[bytes], caught_up: Iterable[str] = ()
                     ) -> list[OutputChange]:
        """Process one batch of routed records (``routing.to_wire``); output changes.

        Also records the batch's *effects* (:attr:`last_effects`): what a copy of
        this shard's state at the previous batch needs to become this state.
        """
        items = self.decode_wire(records)
        snapshot_events = [it for it in items if isinstance(it, ChangeEvent) and it.is_snapshot]
        self.batch_snapshot_rows = len(snapshot_events)
        remembered = self.frontier.remembered
        self.join.journal = []
        try:
            changes = self.process_decoded(items, caught_up)
            journal = self.join.journal
        finally:
            self.join.journal = None
        new = self.frontier.remembered - remembered
        released = list(self.frontier._released_order)[-new:] if new else []
        self.last_effects = Effects(self._sequencer_state(), snapshot_events, released, journal)
        return changes

    @staticmethod
    def decode_wire(records: Iterable[bytes]) -> list[ChangeEvent | TxMarker]:
        """Routed records -> events and markers in the order every shard uses."""
        items = [from_wire(r) for r in records]
        items.sort(key=_position_key)
        return items

    def _sequencer_state(self) -> dict[str, dict[str, Any]]:
        """The assembly and frontier state, without what grows with history or the database
        (released xids, snapshot rows and identities: carried as deltas) and the join."""
        snap = self.assembler.snapshot
        return {
            "engine": {k: v for k, v in self.__dict__.items() if k not in _NOT_SEQUENCER},
            "assembler": {k: v for k, v in self.assembler.__dict__.items() if k != "snapshot"},
            "snapshot": {k: v for k, v in snap.__dict__.items()
                         if k not in ("rows", "identities")},
            "frontier": {k: v for k, v in self.frontier.__dict__.items()
                         if k not in ("released", "_released_order")},
        }

    def apply_effects(self, effects: Effects, changes: Iterable[OutputChange]) -> None:
        """Bring this shard forward over a batch it processed before (no join evaluation)."""
        snap = self.assembler.snapshot
        for event in effects.snapshot_events:
            snap.add(event)
        state = effects.sequencer  # freshly unpickled from the segment: ours to keep
        self.__dict__.update(state["engine"])
        self.assembler.__dict__.update(state["assembler"])
        snap.__dict__.update(state["snapshot"])
        if snap.done:
            snap.rows = []  # released within (or before) this batch
        self.frontier.__dict__.update(state["frontier"])
        for xid in effects.released:
            self.frontier._remember(xid)
        self.join.replay_journal(effects.journal, changes)


@dataclass
class Effects:
    """What one batch did to a shard's state, enough to redo it without evaluating."""

    sequencer: dict[str, dict[str, Any]]
    snapshot_events: list[ChangeEvent]
    released: list[int]
    journal: list[tuple[str, Any, Any]]


_NOT_SEQUENCER = frozenset({"job", "join", "assembler", "frontier", "log_version", "log_token",
                            "last_effects"})
