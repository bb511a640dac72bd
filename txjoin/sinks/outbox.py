"""The hand-off from a micro-batch to its sinks: durable first, committed in the background.

A batch's sinks commit while Spark computes the next batch. Spark records a batch
as done (its commit log) as soon as ``foreachBatch`` returns, so before it returns
the batch's output is made durable in the checkpoint: ``<checkpoint>/outbox/
<batch_id>.arrow`` (written whole, fsynced, then renamed into place). One
background thread commits it to every sink and then deletes the file.

- **At most one batch in flight.** Handing a batch over waits for the previous
  one's sinks first; if they failed, the hand-off raises that error and the new
  batch is neither stored nor committed by Spark: the query stops there.
- **Nothing lost.** A batch Spark committed is in the sinks, or in the outbox
  until it is: ``recover`` (run before a query starts) commits whatever a stopped
  or killed run left there, in batch order, before anything newer.
- **Nothing applied twice.** Every sink skips a batch it already holds (Delta's
  app transaction, PostgreSQL's progress row), so a batch both recovered from
  the outbox and re-run by Spark, or recovered after its file outlived its
  commit, is applied once.

Readers never see more than the sinks committed: a batch becomes visible when
its sink commits, exactly as before; only the next batch's computing overlaps.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from txjoin.sinks.lineage import Lineage

OUTBOX_DIR = "outbox"
_SUFFIX = ".arrow"
_LINEAGE_KEY = b"txjoin.lineage"
_INFO_KEY = b"txjoin.info"


@dataclass(frozen=True)
class Parcel:
    """One batch's output and what its sinks and its report need."""

    batch_id: int
    changes: pa.Table
    lineage: Lineage
    info: dict[str, Any] = field(default_factory=dict)  # the shards' progress (JSON)
    recovered: bool = False  # read back from the outbox by ``recover``


class Outbox:
    """Batches on their way to the sinks (see the module docstring)."""

    def __init__(self, checkpoint: str | Path, deliver: Callable[[Parcel], None]) -> None:
        self.directory = Path(checkpoint) / OUTBOX_DIR
        self._deliver = deliver
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txjoin-outbox")
        self._in_flight: Future[None] | None = None

    def path(self, batch_id: int) -> Path:
        return self.directory / f"{batch_id:020d}{_SUFFIX}"

    def stored(self) -> list[int]:
        """Batch ids waiting in the outbox, in order."""
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name[:-len(_SUFFIX)]) for p in self.directory.iterdir()
                      if p.name.endswith(_SUFFIX) and p.name[:-len(_SUFFIX)].isdigit())

    def recover(self) -> list[int]:
        """Commit what an earlier run left in the outbox, in batch order; the batch ids."""
        self.wait()
        done = []
        for batch_id in self.stored():
            parcel = self._load(batch_id)
            self._deliver(parcel)
            self.path(batch_id).unlink()
            done.append(batch_id)
        return done

    def put(self, parcel: Parcel) -> None:
        """Store ``parcel`` durably and commit it in the background, once the batch before
        it is committed (raising that batch's error if its sinks failed)."""
        self.wait()
        self._store(parcel)
        self._in_flight = self._pool.submit(self._commit, parcel)

    def failed(self) -> bool:
        """Whether the batch in flight has finished with an error (``wait`` raises it)."""
        done = self._in_flight
        return done is not None and done.done() and done.exception() is not None

    def wait(self) -> None:
        """Wait for the batch in flight; raise its error once (its file stays for recovery)."""
        done, self._in_flight = self._in_flight, None
        if done is not None:
            done.result()

    def close(self) -> None:
        """Wait for the batch in flight (its error is not raised here) and stop the thread."""
        done, self._in_flight = self._in_flight, None
        if done is not None:
            done.exception()
        self._pool.shutdown(wait=True)

    def _commit(self, parcel: Parcel) -> None:
        self._deliver(parcel)
        self.path(parcel.batch_id).unlink(missing_ok=True)

    def _store(self, parcel: Parcel) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        lineage = {"checkpoint_id": parcel.lineage.checkpoint_id,
                   "frontier_commit_seq": parcel.lineage.frontier_commit_seq}
        metadata = {**(parcel.changes.schema.metadata or {}),
                    _LINEAGE_KEY: json.dumps(lineage).encode(),
                    _INFO_KEY: json.dumps(parcel.info).encode()}
        table = parcel.changes.replace_schema_metadata(metadata)
        final = self.path(parcel.batch_id)
        partial = final.with_name(f".{final.name}.partial")
        with open(partial, "wb") as out:
            with pa.ipc.new_file(out, table.schema) as writer:
                writer.write_table(table)
            out.flush()
            os.fsync(out.fileno())
        partial.replace(final)
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a crash
        finally:
            os.close(directory)

    def _load(self, batch_id: int) -> Parcel:
        with pa.OSFile(str(self.path(batch_id))) as source:
            table = pa.ipc.open_file(source).read_all()
        metadata = dict(table.schema.metadata or {})
        lineage = json.loads(metadata.pop(_LINEAGE_KEY))
        info = json.loads(metadata.pop(_INFO_KEY))
        return Parcel(batch_id, table.replace_schema_metadata(metadata or None),
                      Lineage(lineage["checkpoint_id"], lineage["frontier_commit_seq"]),
                      info, recovered=True)
