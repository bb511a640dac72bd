"""Delta at its own pace: a durable hand-off per micro-batch, group commits by one committer.

A Delta commit costs about the same for 100 changes as for 100k (DESIGN.md 2.2),
so the Delta sink does not commit inside every micro-batch. ``foreachBatch``
hands the batch's output off durably and returns (the PostgreSQL sink still
commits in the batch); a committer thread on the driver writes everything
pending as one commit per Delta table, at most every ``interval_s`` seconds.

- **Durable before Spark commits the batch.** ``<checkpoint>/delta-handoff/
  <batch_id>.arrow`` holds what the batch's tasks wrote (the data files of each
  part, ``txjoin.sinks.delta_stage``, as JSON in the schema metadata) and its
  changes' commit times (Arrow IPC; also in the metadata: its lineage and when it
  was handed off), written under a temporary name, fsynced, renamed, and the folder
  fsynced. A batch Spark re-runs after a crash rewrites the same content (the
  shards are deterministic, the files' names are the batch's and the part's). A
  parcel of a run before the tasks wrote files holds the batch's rows instead: it
  is read and committed the same way.
- **A commit ends at a micro-batch boundary.** The committer takes the pending
  batches in batch order, each whole; each table skips the batches its last
  txjoin commit already covers (its ``userMetadata`` lineage: checkpoint and
  batch range), so a crash between the changelog's and the current table's
  commits, or after both but before the files went, applies nothing twice.
- **Bounded.** At most ``max_batches`` batches and ``max_bytes`` bytes wait;
  beyond that the next hand-off waits for the committer (backpressure): the
  stream slows down, nothing is dropped, reordered or duplicated.
- **Errors surface.** A failed group commit stops the committer; the next
  hand-off, ``flush`` and ``close`` raise that error (the query stops with it),
  and the files stay for the next run.
- **Caught up on the way out.** ``flush`` commits everything pending now and
  waits; a run's end (``--until-idle``, a clean stop, ``txjoin replay``) flushes,
  and a run's start commits what a killed run left (``recover``) before the
  sinks' lineage is compared with the checkpoint.

The storage (:class:`Handoff`), the choice of what each table still needs
(:func:`still_needed`) and the committer (:class:`GroupCommitter`) need no
Spark: the committer drives any :class:`GroupWriter`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from txjoin import crashpoints
from txjoin.sinks import StagedPart
from txjoin.sinks.lineage import Lineage

HANDOFF_DIR = "delta-handoff"
_SUFFIX = ".arrow"
_LINEAGE_KEY = b"txjoin.lineage"
_HANDED_KEY = b"txjoin.handed_at"
_STAGED_KEY = b"txjoin.staged"
_COMMIT_TS = "commit_ts_ms"
DEFAULT_INTERVAL_S = 10.0
DEFAULT_MAX_BATCHES = 1000
DEFAULT_MAX_BYTES = 256 << 20


@dataclass(frozen=True)
class Parcel:
    """One micro-batch's output on its way to Delta: its rows (``changes``), or (``staged``
    not ``None``) the files the tasks wrote of it (``txjoin.sinks.delta_stage``: one
    :class:`StagedPart` per task, ``changes`` then empty) and its changes' source commit
    times (``commit_ts_ms``)."""

    batch_id: int
    changes: pa.Table
    lineage: Lineage
    handed_at: float  # unix time of the hand-off (Delta's lag behind the batch)
    staged: tuple[StagedPart, ...] | None = None
    commit_ts_ms: tuple[int, ...] = ()

    @property
    def rows(self) -> int:
        """The batch's changes."""
        if self.staged is None:
            return int(self.changes.num_rows)
        return sum(part.rows for part in self.staged)

    def commit_times_ms(self) -> list[int]:
        """The source commit times of the batch's changes (ms since the epoch)."""
        if self.staged is not None:
            return list(self.commit_ts_ms)
        return [int(v.timestamp() * 1000) for v in self.changes.column("_commit_ts").to_pylist()
                if v is not None]


@dataclass
class GroupCommit:
    """What one sink commit did, for reports, metrics and benchmarks: a Delta group commit,
    or (``sink="postgres"``) a PostgreSQL commit of one micro-batch."""

    first_batch: int
    last_batch: int
    batches: int
    changes: int
    commit_ts_ms: list[int]  # source commit times of the changes it committed
    started_at: float
    finished_at: float
    seconds: dict[str, float] = field(default_factory=dict)  # changelog/current/maintain
    # The CPU seconds the driver's committing thread spent on it (work its Spark tasks or the
    # database did is not in it): what bounds how many rows a driver can commit.
    cpu_seconds: float = 0.0
    oldest_handed_at: float = 0.0
    recovered: bool = False  # left by an earlier run, committed before the query started
    wrote: bool = True  # False: every table already held these batches
    sink: str = "delta"

    @property
    def lag_seconds(self) -> float:
        """How long the group's oldest batch waited between its hand-off and this commit."""
        return max(0.0, self.finished_at - self.oldest_handed_at)


class GroupWriter(Protocol):
    """A sink that commits a range of micro-batches at once (``DeltaSink``)."""

    name: str

    def write_group(self, parcels: Sequence[Parcel]) -> dict[str, float]:
        """Commit ``parcels`` (in batch order) as one commit per table, skipping the batches
        a table already holds; the seconds per table committed."""
        ...

    def maintain(self, retention_hours: float | None = None) -> Any:
        ...

    def thread_cpu(self) -> float:
        """CPU seconds the calling thread has spent, the sink's own processes included (for
        ``GroupCommit.cpu_seconds``)."""
        ...


def still_needed(parcels: Sequence[Parcel], held_checkpoint: str | None,
                 held_batch: int | None) -> list[Parcel]:
    """The parcels a table holding ``held_batch`` of ``held_checkpoint`` has not committed.

    A table of the same checkpoint holds every batch up to its last one (commits end at
    batch boundaries); a table of another checkpoint (a rebuild's) or none holds none of
    them (the sink refuses another checkpoint's table before this is asked).
    """
    if held_batch is None:
        return list(parcels)
    return [p for p in parcels
            if p.lineage.checkpoint_id != held_checkpoint or p.batch_id > held_batch]


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a rename in it is durable once the folder is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Handoff:
    """The hand-off folder: one Arrow IPC file per pending micro-batch."""

    def __init__(self, checkpoint: str | Path) -> None:
        self.directory = Path(checkpoint) / HANDOFF_DIR

    def path(self, batch_id: int) -> Path:
        return self.directory / f"{batch_id:020d}{_SUFFIX}"

    def partial_path(self, batch_id: int) -> Path:
        """Where :meth:`store` writes the batch before renaming it to :meth:`path` (a file
        there is a write cut short: never read, rewritten by the batch's next store)."""
        final = self.path(batch_id)
        return final.with_name(f".{final.name}.partial")

    def stored(self) -> list[int]:
        """Batch ids waiting, in order (temporary files of a write cut short are ignored)."""
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name[:-len(_SUFFIX)]) for p in self.directory.iterdir()
                      if p.name.endswith(_SUFFIX) and p.name[:-len(_SUFFIX)].isdigit())

    def size(self, batch_id: int) -> int:
        try:
            return self.path(batch_id).stat().st_size
        except FileNotFoundError:
            return 0

    def store(self, parcel: Parcel) -> int:
        """Write ``parcel`` durably (temporary name, fsync, rename, fsync the folder); its
        bytes. A batch already stored is rewritten whole: a re-run brings the same changes."""
        self.directory.mkdir(parents=True, exist_ok=True)
        lineage = {"checkpoint_id": parcel.lineage.checkpoint_id,
                   "frontier_commit_seq": parcel.lineage.frontier_commit_seq}
        content = parcel.changes
        metadata = {**(content.schema.metadata or {}),
                    _LINEAGE_KEY: json.dumps(lineage).encode(),
                    _HANDED_KEY: repr(parcel.handed_at).encode()}
        if parcel.staged is not None:
            # The tasks wrote the rows: the parcel is what they wrote and its commit times.
            content = pa.table({_COMMIT_TS: pa.array(parcel.commit_ts_ms, pa.int64())})
            metadata[_STAGED_KEY] = json.dumps([p.__dict__ for p in parcel.staged]).encode()
        table = content.replace_schema_metadata(metadata)
        final, partial = self.path(parcel.batch_id), self.partial_path(parcel.batch_id)
        with open(partial, "wb") as out:
            with pa.ipc.new_file(out, table.schema) as writer:
                writer.write_table(table)
            out.flush()
            os.fsync(out.fileno())
        crashpoints.reached(crashpoints.HANDOFF_STORE, parcel.batch_id)  # tests only
        partial.replace(final)
        fsync_path(self.directory)
        return final.stat().st_size

    def load(self, batch_id: int) -> Parcel:
        with pa.OSFile(str(self.path(batch_id))) as source:
            table = pa.ipc.open_file(source).read_all()
        if table.num_rows == 0:  # read back with no chunk at all, which Spark refuses
            table = table.schema.empty_table()
        metadata = dict(table.schema.metadata or {})
        lineage = Lineage(**json.loads(metadata.pop(_LINEAGE_KEY)))
        handed_at = float(metadata.pop(_HANDED_KEY, b"0"))
        staged = metadata.pop(_STAGED_KEY, None)
        if staged is not None:
            return Parcel(batch_id, pa.table({}), lineage, handed_at,
                          tuple(StagedPart(**p) for p in json.loads(staged)),
                          tuple(table.column(_COMMIT_TS).to_pylist()))
        return Parcel(batch_id, table.replace_schema_metadata(metadata or None), lineage,
                      handed_at)

    def remove(self, batch_ids: Sequence[int]) -> None:
        for batch_id in batch_ids:
            self.path(batch_id).unlink(missing_ok=True)
        if batch_ids and self.directory.is_dir():
            fsync_path(self.directory)


class GroupCommitter:
    """Commits the hand-off's batches to one Delta sink in groups (see the module docstring).

    ``put`` is called by ``foreachBatch``; ``start`` runs the committer thread;
    ``flush`` commits everything pending now and waits; ``close`` flushes and stops
    the thread. ``maintain_every`` runs the sink's upkeep from the committer after a
    group commit once that many batches were committed since the last upkeep (never
    beside a commit). ``on_commit`` gets every group commit's :class:`GroupCommit`.
    """

    def __init__(self, sink: GroupWriter, handoff: Handoff, *,
                 interval_s: float = DEFAULT_INTERVAL_S,
                 max_batches: int = DEFAULT_MAX_BATCHES, max_bytes: int = DEFAULT_MAX_BYTES,
                 maintain_every: int | None = None, retention_hours: float | None = None,
                 on_commit: Callable[[GroupCommit], None] | None = None) -> None:
        self.sink, self.handoff = sink, handoff
        self.interval_s = interval_s
        self.max_batches, self.max_bytes = max(1, max_batches), max(1, max_bytes)
        self.maintain_every, self.retention_hours = maintain_every, retention_hours
        self.on_commit = on_commit
        self._cond = threading.Condition()
        self._pending: dict[int, int] = {}  # batch id -> bytes, handed off, not committed
        self._handed_at: dict[int, float] = {}
        self._error: BaseException | None = None
        self._flush_wanted = 0  # flush requests not served yet
        self._committing = False
        self._closing = False
        self._last_start = float("-inf")
        self._since_upkeep = 0
        self._thread: threading.Thread | None = None
        self.commits: list[GroupCommit] = []

    # -- what foreachBatch calls ------------------------------------------------------

    def put(self, parcel: Parcel) -> float:
        """Hand one batch off durably; waits while the hand-off is full (backpressure) and
        raises the committer's error. The seconds it waited for room."""
        waited_from = time.monotonic()
        with self._cond:
            self._raise_error()
            while self._pending and parcel.batch_id not in self._pending and (
                    len(self._pending) >= self.max_batches
                    or sum(self._pending.values()) >= self.max_bytes):
                self._cond.notify_all()
                self._cond.wait(0.5)
                self._raise_error()
        waited = time.monotonic() - waited_from
        size = self.handoff.store(parcel)
        with self._cond:
            self._pending[parcel.batch_id] = size
            self._handed_at[parcel.batch_id] = parcel.handed_at
            self._cond.notify_all()
        return waited

    def lag(self) -> tuple[int, float]:
        """(batches handed off and not yet in Delta, seconds the oldest of them waited)."""
        with self._cond:
            if not self._handed_at:
                return 0, 0.0
            return len(self._handed_at), max(0.0, time.time() - min(self._handed_at.values()))

    # -- the thread -------------------------------------------------------------------

    def recover(self) -> GroupCommit | None:
        """Commit what an earlier run left in the hand-off (before the thread starts)."""
        ids = self.handoff.stored()
        if not ids:
            return None
        return self._commit(ids, recovered=True)

    def start(self) -> None:
        if self._thread is None:
            self._closing = False
            self._thread = threading.Thread(target=self._loop, name="txjoin-delta-committer",
                                            daemon=True)
            self._thread.start()

    def flush(self) -> None:
        """Commit everything handed off so far now (not waiting for the interval) and wait;
        raise the committer's error."""
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._raise_error()
                ids = sorted(self._pending)
            else:
                ids = []
                self._flush_wanted += 1
                self._cond.notify_all()
                while (self._pending or self._committing) and self._error is None \
                        and self._thread.is_alive():
                    self._cond.wait(0.5)
                self._flush_wanted = max(0, self._flush_wanted - 1)
                self._raise_error()
        if ids:  # no thread: commit here
            self._commit(ids)

    def close(self, flush: bool = True) -> None:
        """Stop the thread, after committing everything pending when ``flush`` (raising the
        committer's error then); without it pending batches stay for the next run."""
        try:
            if flush:
                self.flush()
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            if self._thread is not None:
                self._thread.join()
                self._thread = None

    @property
    def error(self) -> BaseException | None:
        with self._cond:
            return self._error

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _due(self) -> bool:
        if not self._pending:
            return False
        # A full hand-off does not hurry the next commit: the interval bounds Delta's
        # cost, and the stream waits (backpressure) until the commit makes room.
        return self._flush_wanted > 0 or time.monotonic() >= self._last_start + self.interval_s

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closing and not self._due():
                    wait = self._last_start + self.interval_s - time.monotonic()
                    self._cond.wait(min(0.5, wait) if self._pending and wait > 0 else 0.5)
                if self._closing:
                    return
                ids = sorted(self._pending)
                self._committing = True
            try:
                self._commit(ids)
            except BaseException as exc:  # stop here; put/flush/close raise it
                with self._cond:
                    self._error = exc
                    self._committing = False
                    self._cond.notify_all()
                return
            with self._cond:
                self._committing = False
                self._cond.notify_all()

    def _commit(self, ids: list[int], recovered: bool = False) -> GroupCommit:
        """One group commit of the batches ``ids`` (in order), then upkeep when due."""
        self._last_start = time.monotonic()
        started_at = time.time()
        cpu = self.sink.thread_cpu()
        parcels = [self.handoff.load(i) for i in ids]
        seconds = self.sink.write_group(parcels)
        finished_at = time.time()
        # tests only: a kill after the group's Delta commits, its hand-off files still there
        point = crashpoints.DELTA_RECOVERED if recovered else crashpoints.DELTA_GROUP_COMMITTED
        if crashpoints.armed(point):
            for batch_id in ids:
                crashpoints.reached(point, batch_id)
        self.handoff.remove(ids)
        with self._cond:
            for i in ids:
                self._pending.pop(i, None)
                self._handed_at.pop(i, None)
            self._cond.notify_all()
        commit = GroupCommit(
            first_batch=ids[0], last_batch=ids[-1], batches=len(ids),
            changes=sum(p.rows for p in parcels),
            commit_ts_ms=[t for p in parcels for t in p.commit_times_ms()],
            started_at=started_at, finished_at=finished_at, seconds=dict(seconds),
            oldest_handed_at=min((p.handed_at for p in parcels), default=finished_at),
            recovered=recovered, wrote=bool(seconds), cpu_seconds=self.sink.thread_cpu() - cpu)
        self._since_upkeep += len(ids)
        every = self.maintain_every
        if every is not None and self._since_upkeep >= every:
            # Between two group commits: no writer runs beside the compaction.
            before = time.monotonic()
            self.sink.maintain(self.retention_hours)
            commit.seconds["maintain"] = time.monotonic() - before
            self._since_upkeep = 0
        self.commits.append(commit)
        if self.on_commit is not None:
            self.on_commit(commit)
        return commit
