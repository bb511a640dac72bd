"""One shard of the partitioned engine: the whole sequencing, a part of the join.

A :class:`ShardEngine` is the core :class:`~txjoin.core.engine.Engine` with two
differences (see ``routing.py`` for who receives what):

- its join holds only the facts the shard owns (plus full copies of the
  looked-up tables), and skips the metadata-only events of other shards' facts;
- it can *re-apply* a micro-batch it has processed before from the output
  changes recorded then (:meth:`replay`), without evaluating the join again.
  The state log (``state_log.py``) uses this to bring a cached or restored
  shard forward cheaply and exactly.

Every shard sees the metadata of every event and marker, in the same order
(sorted by topic, partition, offset, as the core engine does), so every shard's
assembler and frontier go through the same states and release the same
transactions in the same batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from txjoin.core.assembly import IncompletePolicy, Transaction
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
        self._recorded: dict[int, list[OutputChange]] | None = None
        self.batch_snapshot_rows = 0  # snapshot rows in the last batch processed
        # Which logged state this engine is (state_log.py): micro-batches applied, and the
        # token naming that exact state.
        self.log_version = 0
        self.log_token = ""

    def process_wire(self, records: Iterable[bytes], caught_up: Iterable[str] = ()
                     ) -> list[OutputChange]:
        """Process one batch of routed records (``routing.to_wire``); output changes."""
        items = self.decode_wire(records)
        self.batch_snapshot_rows = sum(
            1 for it in items if isinstance(it, ChangeEvent) and it.is_snapshot)
        return self.process_decoded(items, caught_up)

    @staticmethod
    def decode_wire(records: Iterable[bytes]) -> list[ChangeEvent | TxMarker]:
        """Routed records -> events and markers in the order every shard uses."""
        items = [from_wire(r) for r in records]
        items.sort(key=_position_key)
        return items

    def replay(self, items: Sequence[ChangeEvent | TxMarker], caught_up: Iterable[str],
               changes: Iterable[OutputChange]) -> None:
        """Re-apply a batch processed before, taking its output changes as recorded."""
        recorded: dict[int, list[OutputChange]] = defaultdict(list)
        for ch in changes:
            recorded[ch.commit_seq].append(ch)
        self._recorded = recorded
        try:
            self.process_decoded(items, caught_up)
        finally:
            self._recorded = None

    def _apply(self, tx: Transaction) -> list[OutputChange]:
        if self._recorded is None:
            return super()._apply(tx)
        if tx.xid == 0:
            self.snapshot_released = True
        self.stats.transactions_released += 1
        out = self._recorded.pop(tx.commit_seq, [])
        self.join.apply_recorded(tx, out)
        self.stats.changes_emitted += len(out)
        return out
