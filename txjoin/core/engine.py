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
from dataclasses import dataclass
from typing import Any

import pandas as pd

from txjoin.core.assembly import Assembler, IncompletePolicy, Transaction
from txjoin.core.frontier import Frontier
from txjoin.core.join import OutputChange, TemporalJoin
from txjoin.debezium import ChangeEvent, Position, TxMarker, decode
from txjoin.job import Job

STATE_VERSION = 1
TRANSACTION_STREAM = "transaction"
"""The name of the transaction topic's stream (``<prefix>.transaction``) in ``caught_up``."""


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
        # newest source commit time read per stream (table, or "transaction")
        self.stream_ts_ms: dict[str, int] = {}
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
        stream_ts = self.stream_ts_ms
        for item in items:
            if isinstance(item, TxMarker):
                ts, stream = item.ts_ms, TRANSACTION_STREAM
            else:
                ts, stream = item.commit_ts_ms, item.table
            if ts is not None:
                if self.max_ts_ms is None or ts > self.max_ts_ms:
                    self.max_ts_ms = ts
                if ts > stream_ts.get(stream, ts - 1):
                    stream_ts[stream] = ts
            if isinstance(item, TxMarker):
                self.stats.markers += 1
                if self.assembler.add_marker(item, released):
                    self.frontier.on_end(item)
            else:
                self.stats.events += 1
                self.assembler.add_event(item, released)
        caught = set(caught_up)
        self.assembler.caught_up(caught)
        changes = []
        for tx in self.frontier.release(self.assembler):
            changes.extend(self._apply(tx))
        self.frontier.enforce(self.assembler, self.source_clock(caught), self.policy)
        # a skip may unblock the queue
        for tx in self.frontier.release(self.assembler):
            changes.extend(self._apply(tx))
        self.stats.batches += 1
        return changes

    def source_clock(self, caught_up: set[str]) -> int | None:
        """How far every input stream has provably been read, in source commit time.

        The slowest stream sets it: a stream read to its end counts as the newest
        commit time seen anywhere, any other as the newest commit time read from
        it; a stream never read stops the clock. So a transaction whose events sit
        in a topic that is merely behind (a catch-up split by
        ``--max-events-per-trigger``) is never taken for one that will not complete.
        """
        if self.max_ts_ms is None:
            return None
        times = []
        for stream in [*self.job.table_names, TRANSACTION_STREAM]:
            if stream in caught_up:
                times.append(self.max_ts_ms)
            elif stream in self.stream_ts_ms:
                times.append(self.stream_ts_ms[stream])
            else:
                return None
        return min(times)

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
        # Start from a fresh engine so that attributes added since the state was
        # written keep their defaults (an older checkpoint still restores).
        engine = cls(job)
        join_state = state.pop("join")
        engine.__dict__.update(state)
        engine.job = job
        engine.join.__dict__.update(join_state)
        engine.join.job = job
        return engine
