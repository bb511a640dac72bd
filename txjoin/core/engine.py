"""The transactional core as one batch-oriented object: records in, output changes out.

``Engine.process`` takes one micro-batch of raw source records (topic,
partition, offset, value) and returns the output changes of every transaction
that became releasable, in commit order. Its whole state (open transactions,
frontier, current rows of the job's tables, last outputs) serialises with
:meth:`Engine.state_bytes` so a streaming adapter can checkpoint it with the
batch; it is bounded by the open transactions plus the current rows (no
history).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from txjoin.core.assembly import Assembler, IncompletePolicy, Transaction
from txjoin.core.frontier import Frontier
from txjoin.core.join import OutputChange, TemporalJoin
from txjoin.debezium import ChangeEvent, Position, TxMarker, decode
from txjoin.job import Job

STATE_VERSION = 1


@dataclass
class EngineStats:
    """Counters for progress displays and benchmarks."""

    records: int = 0
    events: int = 0
    markers: int = 0
    tombstones: int = 0
    transactions_released: int = 0
    changes_emitted: int = 0
    batches: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Engine:
    """Decode -> assemble -> order -> join, on micro-batches."""

    def __init__(self, job: Job, policy: IncompletePolicy | None = None,
                 released_memory: int = 100_000) -> None:
        self.job = job
        self.policy = policy or IncompletePolicy()
        self.assembler = Assembler(frozenset(job.table_names))
        self.frontier = Frontier(released_memory)
        self.join = TemporalJoin(job)
        self.stats = EngineStats()
        self.max_ts_ms: int | None = None
        self.snapshot_released = False

    # -- the batch API ------------------------------------------------------------

    def process(self, records: pd.DataFrame | Iterable[tuple[str, int, int, Any]],
                caught_up: Iterable[str] = ()) -> list[OutputChange]:
        """Process one batch of records and return the output changes it releases.

        ``records``: a frame with columns ``topic, partition, offset, value`` (or
        tuples in that order). Records of one topic-partition must be in offset
        order; interleaving between topics is free. ``caught_up``: tables whose
        topic the source has read to its end offset in this batch (lets an
        empty table settle the snapshot without a change; see assembly).
        """
        if isinstance(records, pd.DataFrame):
            frame = records.sort_values(["topic", "partition", "offset"], kind="stable")
            rows: Iterable[tuple[str, int, int, Any]] = zip(
                frame["topic"], frame["partition"], frame["offset"], frame["value"],
                strict=True)
        else:
            rows = records
        decoded = []
        for topic, partition, offset, value in rows:
            self.stats.records += 1
            item = decode(value, Position(str(topic), int(partition), int(offset)))
            if item is not None:
                decoded.append(item)
        return self.process_decoded(decoded, caught_up)

    def process_decoded(self, items: Iterable[ChangeEvent | TxMarker],
                        caught_up: Iterable[str] = ()) -> list[OutputChange]:
        """Like :meth:`process`, for records already decoded."""
        released = self.frontier.released
        for item in items:
            ts = item.ts_ms if isinstance(item, TxMarker) else item.commit_ts_ms
            if ts is not None and (self.max_ts_ms is None or ts > self.max_ts_ms):
                self.max_ts_ms = ts
            if isinstance(item, TxMarker):
                self.stats.markers += 1
                if self.assembler.add_marker(item, released):
                    self.frontier.on_end(item)
            else:
                self.stats.events += 1
                self.assembler.add_event(item, released)
        self.assembler.caught_up(set(caught_up))
        changes = []
        for tx in self.frontier.release(self.assembler):
            changes.extend(self._apply(tx))
        self.frontier.enforce(self.assembler, self.max_ts_ms, self.policy)
        # a skip may unblock the queue
        for tx in self.frontier.release(self.assembler):
            changes.extend(self._apply(tx))
        self.stats.batches += 1
        return changes

    def _apply(self, tx: Transaction) -> list[OutputChange]:
        if tx.xid == 0:
            self.snapshot_released = True
        self.stats.transactions_released += 1
        out = self.join.apply(tx)
        self.stats.changes_emitted += len(out)
        return out

    # -- introspection -------------------------------------------------------------

    @property
    def commit_seq(self) -> int:
        """Commit sequence of the last released transaction (0: none or only the snapshot)."""
        return self.frontier.commit_seq

    @property
    def waiting(self) -> int:
        """Transactions buffered: incomplete, or complete but behind an incomplete one."""
        return len(self.assembler.pending)

    def outputs(self) -> dict[tuple[Any, ...], dict[str, Any]]:
        """The current output: key -> row."""
        return dict(self.join.outputs)

    # -- checkpointing -----------------------------------------------------------------

    def state_bytes(self) -> bytes:
        """Serialise the whole state (the job itself is not included)."""
        state = {k: v for k, v in self.__dict__.items() if k != "job"}
        state["join"] = {k: v for k, v in self.join.__dict__.items() if k != "job"}
        return pickle.dumps((STATE_VERSION, state), protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def from_state(cls, job: Job, blob: bytes) -> Engine:
        version, state = pickle.loads(blob)
        if version != STATE_VERSION:
            raise ValueError(f"engine state version {version} is not {STATE_VERSION}")
        engine = cls.__new__(cls)
        join_state = state.pop("join")
        engine.__dict__.update(state)
        engine.job = job
        engine.join = TemporalJoin.__new__(TemporalJoin)
        engine.join.__dict__.update(join_state)
        engine.join.job = job
        return engine
