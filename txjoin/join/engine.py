"""The transactional core as one batch-oriented object: records in, output changes out.

``Engine.process`` takes one micro-batch of raw source records (topic,
partition, offset, value) and returns the output changes of every transaction
that became releasable, in commit order. Its whole state (open transactions,
frontier, current rows of the job's tables, last outputs) serialises with
:meth:`Engine.state_bytes` so a streaming adapter can checkpoint it with the
batch; it is bounded by the open transactions plus the current rows (no
history).

**Several sources.** A job over several source databases (``Job.sources``) has
an assembler and a frontier per source: each source's transactions are
assembled (xids are per database) and released in that source's commit order,
its snapshot settles on its own, and an idle source never holds another back.
Nothing is released before every source's snapshot is complete (the snapshots
are applied together as commit 0). Then, each time the engine releases, it
applies the released transactions of the first declared source, then those of
the second, ... (each in its commit order): a deterministic interleaving of the
sources' commit orders, the same in every shard, so every observable state is
the job on (S1 after some T1_k, S2 after some T2_m), k and m never decreasing.
``commit_seq`` numbers the applied transactions across sources.

**Incremental snapshots** (``sequence/incremental.py``): each source's frontier hands out
its rows as corrections placed in its commit order; the engine drops the rows equal to
what it holds and numbers a correction like a transaction unless nothing is left of it.
Every shard must number alike, and only a fact row's owner can compare it, so a
correction with a fact row is always numbered (with no output change when the row is
equal); one of looked-up rows only (every shard holds those) is dropped when all are equal.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from txjoin import crashpoints
from txjoin.errors import DecodeError, JobError
from txjoin.ingest.debezium import (
    INCREMENTAL,
    ChangeEvent,
    Position,
    TxMarker,
    decode,
    raise_partitioned,
    transaction_topic,
)
from txjoin.job import TRANSACTION_STREAM, Job
from txjoin.join.routing import ForeignFacts
from txjoin.join.state import ENGINE_STATE_VERSION, check_version, restore_fields, save_fields
from txjoin.join.temporal import OutputChange, TemporalJoin
from txjoin.sequence.assembly import (
    SNAPSHOT_XID,
    Assembler,
    FactRun,
    IncompletePolicy,
    TopicPartitions,
    Transaction,
)
from txjoin.sequence.frontier import RELEASED_MEMORY, Frontier
from txjoin.sequence.spill import EventLog, drain
from txjoin.sequence.whole import Whole, whole_in_batch

__all__ = ["TRANSACTION_STREAM", "Engine", "EngineStats"]


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

    # Saved (join/state.py), with each source's assembler and frontier and the join.
    FIELDS: tuple[str, ...] = ("applied_seq", "stats", "max_ts_ms", "stream_ts_ms",
                               "snapshot_released", "partition_counts")

    def __init__(self, job: Job, policy: IncompletePolicy | None = None,
                 released_memory: int = RELEASED_MEMORY) -> None:
        self.job = job
        self.policy = policy or IncompletePolicy()
        # One assembler and one frontier per source, in declared order.
        self.assemblers = {s: Assembler(frozenset(job.tables_of(s))) for s in job.source_names}
        self.frontiers = {s: Frontier(released_memory) for s in job.source_names}
        self.applied_seq = 0  # commit_seq of the last applied transaction, across sources
        self.join = TemporalJoin(job)
        self.stats = EngineStats()
        self.max_ts_ms: int | None = None
        # newest source commit time read per stream (table, or a transaction stream)
        self.stream_ts_ms: dict[str, int] = {}
        self.snapshot_released = False
        # Table -> partition count of its topic, for topics with several partitions, as
        # the sources declared them (kept: see sequence/assembly.py for what changes for them).
        self.partition_counts: dict[str, int] = {}
        self.batch_join_s = 0.0  # seconds the last batch spent in the join (the rest: sequencing)
        # the batch's whole transactions not yet released, per source (sequence/whole.py)
        self._whole: dict[str, dict[int, Whole]] = {}
        self._derive()

    def _derive(self) -> None:
        """Which source a marker's topic and an event's table belong to."""
        job = self.job
        self._table_sources = {t: job.source_of(t) for t in job.table_names}
        self._marker_sources: dict[str, str] | None = None
        if len(job.source_names) > 1:
            missing = [s.name for s in job.sources if not s.prefix]
            if missing:
                raise JobError(f"job {job.name!r} ({job.source_file}): source {missing[0]!r} has "
                               f"no topic prefix, so its transaction topic is unknown; set "
                               f"Source(prefix=...) or pass --topic-prefix {missing[0]}=PREFIX")
            self._marker_sources = {transaction_topic(s.prefix or ""): s.name
                                   for s in job.sources}

    def marker_source(self, marker: TxMarker) -> str:
        """The source whose transaction topic carried ``marker``."""
        if self._marker_sources is None:
            return self.job.source_names[0]
        source = self._marker_sources.get(marker.position.topic)
        if source is None:
            pos = marker.position
            raise DecodeError(f"transaction marker on topic {pos.topic}, which is the transaction "
                              f"topic of none of the job's sources "
                              f"({', '.join(sorted(self._marker_sources))}); check the sources' "
                              f"topic prefixes", topic=pos.topic, partition=pos.partition,
                              offset=pos.offset)
        return source

    @property
    def assembler(self) -> Assembler:
        """The first source's assembler (the only one of a job without declared sources)."""
        return next(iter(self.assemblers.values()))

    @property
    def frontier(self) -> Frontier:
        """The first source's frontier (the only one of a job without declared sources)."""
        return next(iter(self.frontiers.values()))

    @property
    def snapshot_done(self) -> bool:
        """Every source's snapshot is complete and applied."""
        return all(a.snapshot.done for a in self.assemblers.values())

    # -- the batch API ------------------------------------------------------------

    def process(self, records: Iterable[tuple[str, int, int, Any]],
                caught_up: Iterable[str] = (), partitions: TopicPartitions | None = None
                ) -> list[OutputChange]:
        """Process one batch of records and return the output changes it releases.

        ``records``: ``(topic, partition, offset, value)`` tuples. Records of one
        topic-partition must be in offset order; interleaving between topics is free.
        ``caught_up``: tables whose topic the source has read to its end offset in this
        batch (lets an empty table settle the snapshot without a change; see assembly).
        ``partitions``: the table topics with several partitions and which of their
        partitions this batch reads to their end, as the source knows them when it
        plans the batch (every txjoin source declares them in every batch). A record
        from a partition > 0 of any other topic is refused.
        """
        decoded = []
        for topic, partition, offset, value in records:
            self.stats.records += 1
            item = decode(value, Position(str(topic), int(partition), int(offset)))
            if item is not None:
                decoded.append(item)
        return self.process_decoded(decoded, caught_up, partitions)

    def process_decoded(self, items: Iterable[ChangeEvent | TxMarker],
                        caught_up: Iterable[str] = (), partitions: TopicPartitions | None = None,
                        foreign: Sequence[ForeignFacts] = ()) -> list[OutputChange]:
        """Like :meth:`process`, for records already decoded. ``foreign``: streaming events
        of the batch whose rows this engine does not hold (``join/routing.py``), one
        :class:`ForeignFacts` per table of an unpartitioned topic (a shard: its other
        shards' facts; the staged engine's sequencer: every table's): counted per
        transaction (:meth:`_add_foreign`)."""
        self.batch_join_s = 0.0
        for assembler in self.assemblers.values():
            assembler.begin_batch()
        counts = self.partition_counts
        if partitions is not None:
            for table, count in partitions.counts.items():
                if table in self._table_sources and count > counts.get(table, 1):
                    counts[table] = count
        stream_ts = self.stream_ts_ms
        single = self._marker_sources is None
        first = self.job.source_names[0]
        table_sources = self._table_sources
        assert len({f.table for f in foreign}) == len(foreign), "one ForeignFacts a table"
        # per table of ``foreign``: its rows per transaction ...
        runs = {f.table: f.by_xid() for f in foreign}
        # ... this engine's own events of those transactions, in topic order: added with
        # them (their order decides what the numbering says)
        held: dict[str, dict[int, list[ChangeEvent]]] = {t: {} for t in runs}
        # ... its incremental rows, placed once the batch's streamed events are in (their
        # anchor may be among them), and those events' (offset, xid) ...
        deferred: dict[str, list[ChangeEvent]] = {t: [] for t in runs}
        streamed: dict[str, list[tuple[int, int]]] = {t: [] for t in runs}
        # ... and its tail before the batch
        tails = {t: self.assemblers[table_sources.get(t, first)].incremental.tail.get(t)
                 for t in runs}
        # the transactions the batch holds whole: released from the queue without a buffer
        items = items if isinstance(items, list) else list(items)
        whole = whole_in_batch(
            items, foreign, runs, self.assemblers, self.frontiers,
            (lambda m: first) if single else self.marker_source,
            lambda t: table_sources.get(t, first)) if runs and self.snapshot_done else {}
        self._whole = whole
        for item in items:
            if item.position.partition and (isinstance(item, TxMarker) or
                                            item.position.partition >= counts.get(item.table, 1)):
                raise_partitioned(item.position, isinstance(item, TxMarker))
            if isinstance(item, TxMarker):
                source = first if single else self.marker_source(item)
                ts, stream = item.ts_ms, self.job.transaction_stream(source)
            else:
                source = table_sources.get(item.table, first)
                ts, stream = item.commit_ts_ms, item.table
            if ts is not None:
                if self.max_ts_ms is None or ts > self.max_ts_ms:
                    self.max_ts_ms = ts
                if ts > stream_ts.get(stream, ts - 1):
                    stream_ts[stream] = ts
            if isinstance(item, TxMarker):
                self.stats.markers += 1
                frontier = self.frontiers[source]
                if whole and item.xid in whole.get(source, ()):
                    self.assemblers[source].snapshot.finished_evidence = True
                    if item.status == "END":
                        frontier.on_end(item)
                    continue
                if self.assemblers[source].add_marker(item, frontier.released):
                    frontier.on_end(item)
            else:
                self.stats.events += 1
                table_runs = runs.get(item.table)
                if table_runs is not None:
                    if item.snapshot == INCREMENTAL:
                        deferred[item.table].append(item)
                        continue
                    if not item.is_snapshot and item.xid is not None:
                        streamed[item.table].append((item.position.offset, item.xid))
                    if item.xid in table_runs and not item.is_snapshot:
                        held[item.table].setdefault(item.xid, []).append(item)
                        continue
                self.assemblers[source].add_event(item, self.frontiers[source].released,
                                                  counts.get(item.table, 1))
        for group in foreign:
            table = group.table
            table_runs = runs[table]
            theirs = whole.get(table_sources.get(table, first)) if whole else None
            if theirs:
                table_runs = {x: rows for x, rows in table_runs.items() if x not in theirs}
                if len(table_runs) < len(runs[table]):  # as add_run says of each run
                    self.assemblers[table_sources.get(table, first)].snapshot.streaming_seen(
                        table)
            self._add_foreign(group, table_runs, held[table])
            self._place_incremental(group, deferred[table], streamed[table], tails[table])
        caught = set(caught_up)
        parts = partitions.caught_up if partitions is not None else {}
        for assembler in self.assemblers.values():
            assembler.caught_up(caught & assembler.tables, parts, counts)
        changes = []
        for tx in self.release():
            changes.extend(self._apply(tx))
        for source, left in whole.items():  # those an incomplete one still holds back
            for whole_tx in left.values():
                whole_tx.open(self.assemblers[source], self.frontiers[source].released)
        self._whole = {}
        skipped = False
        for source, frontier in self.frontiers.items():
            before = len(frontier.skipped)
            frontier.enforce(self.assemblers[source], self.source_clock(caught, source),
                             self.policy)
            skipped = skipped or len(frontier.skipped) > before
        if skipped:  # a skip may unblock a queue
            for tx in self.release():
                changes.extend(self._apply(tx))
        self.stats.batches += 1
        return changes

    def _add_foreign(self, foreign: ForeignFacts, runs: dict[int, list[int]],
                     held: dict[int, list[ChangeEvent]]) -> None:
        """Buffer ``foreign``'s events of one table (``runs``: its rows per transaction, in
        topic order) with this engine's own events of the same transactions (``held``): one
        :class:`FactRun` per transaction where it fits, else event by event in topic order
        (a redelivery, a restart inside the transaction, a duplicate: the rules of
        ``sequence/assembly.py`` decide as for any event)."""
        table = foreign.table
        source = self._table_sources.get(table, self.job.source_names[0])
        assembler, released = self.assemblers[source], self.frontiers[source].released
        self.stats.events += len(foreign)
        times = [t for t in foreign.ts_ms if t is not None]
        if times:
            newest = max(times)
            if self.max_ts_ms is None or newest > self.max_ts_ms:
                self.max_ts_ms = newest
            if newest > self.stream_ts_ms.get(table, newest - 1):
                self.stream_ts_ms[table] = newest
        numbers, ts_ms, offsets = foreign.numbers, foreign.ts_ms, foreign.offsets
        for xid, rows in runs.items():
            mine = held.get(xid)
            order: list[int | ChangeEvent] = list(rows)
            if mine:
                order = sorted([*rows, *mine], key=lambda r: offsets[r] if isinstance(r, int)
                               else r.position.offset)
            run_numbers = [numbers[r] if isinstance(r, int) else r.data_collection_order
                           for r in order]
            if None not in run_numbers:
                stamps = [ts_ms[r] if isinstance(r, int) else r.commit_ts_ms for r in order]
                known = [t for t in stamps if t is not None]
                run = FactRun(table, run_numbers,  # type: ignore[arg-type]
                              [foreign.identity(r) if isinstance(r, int) else r.identity
                               for r in order], mine or [], min(known) if known else None)
                if assembler.add_run(xid, run, released):
                    continue
            for r in order:
                assembler.add_event(foreign.event(r) if isinstance(r, int) else r, released)

    def _place_incremental(self, foreign: ForeignFacts, rows: list[ChangeEvent],
                           positions: list[tuple[int, int]],
                           before: tuple[int, int] | None) -> None:
        """Place the batch's incremental rows of ``foreign``'s table (``rows``), whose anchors
        are among this engine's streamed events of it in the batch (``positions``) or
        ``foreign``'s, added after them, or else the table's tail before the batch
        (``before``); and record the last of those as the table's tail."""
        table = foreign.table
        source = self._table_sources.get(table, self.job.source_names[0])
        assembler = self.assemblers[source]
        incremental = assembler.incremental
        if not rows:  # the common case: only the tail, without sorting the batch's facts
            offsets = foreign.offsets
            if offsets:
                i = max(range(len(offsets)), key=offsets.__getitem__)
                positions = [*positions, (offsets[i], foreign.xids[i])]
            if positions:
                incremental.streamed(table, *max(positions))
            return
        positions = sorted([*positions, *zip(foreign.offsets, foreign.xids, strict=True)])
        for row in sorted(rows, key=lambda e: e.position.offset):
            offset = row.position.offset
            anchor = before
            for position in positions:  # in offset order: the last one before the row
                if position[0] >= offset:
                    break
                anchor = position
            assembler.add_incremental(row, self.partition_counts.get(table, 1), anchor)
        if positions:
            incremental.streamed(table, *positions[-1])

    def _correction(self, tx: Transaction) -> Transaction | None:
        """A correction without the rows equal to what the join holds; None when nothing is
        left to apply or to number (see the module docstring for fact rows)."""
        fact = self.job.fact
        events = self.join.changing(tx.events)
        if not events and all(e.table != fact for e in tx.events):
            return None
        tx.events = events
        return tx

    def release(self) -> Iterator[Transaction]:
        """What can be applied now: the snapshots (once all are complete), then each source's
        releasable transactions in declared source order, numbered by ``commit_seq``.

        One at a time: a correction is compared with what the releases before it left, so
        apply each before taking the next."""
        if not self.snapshot_done:
            if not all(a.snapshot.is_complete() for a in self.assemblers.values()):
                return
            snapshots = []
            for assembler in self.assemblers.values():
                if assembler.snapshot.rows:
                    snapshots.append(assembler.take_snapshot())
                assembler.snapshot.done = True
            if len(snapshots) == 1:
                yield snapshots[0]
            elif snapshots:  # every source's, as one transaction 0
                events: list[ChangeEvent] | EventLog = (
                    EventLog() if any(isinstance(s.events, EventLog) for s in snapshots)
                    else [])
                for snapshot in snapshots:
                    events.extend(drain(snapshot.events))
                ts = max((s.commit_ts_ms or 0 for s in snapshots), default=None)
                yield Transaction(SNAPSHOT_XID, 0, ts, events)
        for source, frontier in self.frontiers.items():
            for tx in frontier.release_streaming(self.assemblers[source],
                                                 self._whole.get(source)):
                if tx.correction:
                    correction = self._correction(tx)
                    if correction is None:
                        continue
                    tx = correction
                self.applied_seq += 1
                tx.commit_seq = self.applied_seq
                tx.source = None if tx.correction else source
                yield tx

    def source_clock(self, caught_up: set[str], source: str | None = None) -> int | None:
        """How far every input stream of ``source`` has provably been read, in its commit time.

        The slowest stream sets it: a stream read to its end counts as the newest
        commit time seen anywhere in the source, any other as the newest commit
        time read from it; a stream never read stops the clock. So a transaction
        whose events sit in a topic that is merely behind (a catch-up split by
        ``--max-events-per-trigger``) is never taken for one that will not complete.
        Each source has its own clock (two databases share no clock): an idle
        source never stops another's.
        """
        source = source or self.job.source_names[0]
        streams = [*self.job.tables_of(source), self.job.transaction_stream(source)]
        seen = [self.stream_ts_ms[s] for s in streams if s in self.stream_ts_ms]
        if not seen:
            return None
        newest = max(seen)
        times = []
        for stream in streams:
            if stream in caught_up:
                times.append(newest)
            elif stream in self.stream_ts_ms:
                times.append(self.stream_ts_ms[stream])
            else:
                return None
        return min(times)

    def _apply(self, tx: Transaction) -> list[OutputChange]:
        if tx.xid == SNAPSHOT_XID and not tx.correction:
            self.snapshot_released = True
        self.stats.transactions_released += 1
        started = time.perf_counter()
        out = self.join.apply(tx)
        crashpoints.in_shard()  # tests only: the transaction applied, the batch not saved
        self.batch_join_s += time.perf_counter() - started
        self.stats.changes_emitted += len(out)
        return out

    # -- introspection -------------------------------------------------------------

    @property
    def commit_seq(self) -> int:
        """Commit sequence of the last applied transaction (0: none or only the snapshot)."""
        return self.applied_seq

    @property
    def waiting(self) -> int:
        """Transactions buffered: incomplete, or complete but behind an incomplete one."""
        return sum(len(a.pending) for a in self.assemblers.values())

    @property
    def duplicates(self) -> int:
        """Redelivered events and markers dropped, over every source."""
        return sum(a.duplicates for a in self.assemblers.values())

    @property
    def skipped(self) -> list[int]:
        """Xids dropped by ``--on-incomplete skip`` (per source: see ``frontiers``)."""
        return [x for f in self.frontiers.values() for x in f.skipped]

    def outputs(self) -> dict[tuple[Any, ...], dict[str, Any]]:
        """The current output: key -> row."""
        unpack = self.join.unpack
        return {key: unpack(packed) for key, packed in self.join.outputs.items()}

    # -- checkpointing -----------------------------------------------------------------

    def state(self, rows: bool = True) -> dict[str, Any]:
        """The whole state by name (``rows``: with what grows with history or the database,
        the snapshot's buffered rows and the released xids; without them: what a shard's
        log saves per batch, see ``shard.py``). The job itself is not included."""
        return {"engine": save_fields(self, self.FIELDS),
                "sources": {source: {"assembler": self.assemblers[source].state(rows),
                                     "frontier": self.frontiers[source].state(rows)}
                            for source in self.job.source_names}}

    def restore(self, state: Mapping[str, Any], rows: bool = True) -> None:
        """Set the state saved by :meth:`state` (the same ``rows``), except the join's."""
        restore_fields(self, state["engine"], self.FIELDS)
        for source, parts in state["sources"].items():
            self.assemblers[source].restore(parts["assembler"], rows)
            self.frontiers[source].restore(parts["frontier"], rows)

    def state_value(self) -> tuple[int, dict[str, Any]]:
        """The whole state, the join's included (the job itself is not), as a value to pickle:
        its parts themselves, not copies (``state_log`` pickles it into its store as it
        goes, never the whole as one ``bytes`` beside the engine)."""
        return ENGINE_STATE_VERSION, {**self.state(), "join": self.join.state()}

    def state_bytes(self) -> bytes:
        """:meth:`state_value` pickled."""
        return pickle.dumps(self.state_value(), protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def from_state(cls, job: Job, blob: bytes, policy: IncompletePolicy | None = None,
                   **init: Any) -> Engine:
        """An engine of ``job`` with the state of :meth:`state_bytes` (``init``: the rest of
        the constructor's arguments, e.g. a shard's number)."""
        return cls.from_state_value(job, pickle.loads(blob), policy, **init)

    @classmethod
    def from_state_value(cls, job: Job, value: Any, policy: IncompletePolicy | None = None,
                         **init: Any) -> Engine:
        """An engine of ``job`` with the state of :meth:`state_value`."""
        version, state = value
        check_version(version, f"job {job.name!r}")
        engine = cls(job, policy=policy, **init)
        engine.restore(state)
        engine.join.restore(state["join"])
        return engine
