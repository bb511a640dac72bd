"""Crash points: a test-only hook that kills the pipeline at a named point, as kill -9 would.

Set ``TXJOIN_CRASH_AT=<point>[:<batch>]`` in the environment of a pipeline process
(the driver; Spark's Python workers and the shard hosts inherit it) and the process
group dies with SIGKILL when the point is reached, in micro-batch ``<batch>`` if given
(else the first time). Unset (the only setting outside tests), every call is one
comparison with None. This module is the only reader of the variable.

Before it kills, the hook says where it fired, so a test tells a crash point that fired
from a process that died otherwise (both end with ``-SIGKILL``): one line on stderr and,
with ``TXJOIN_CRASH_RECORD=<file>``, one JSON line appended to that file and fsynced
(:func:`fired` reads them back).

Points (in a micro-batch's order):

- ``sequenced``: the staged engine's sequencer (``txjoin run --engine staged``) has
  logged the batch's releases in its state store, no shard has applied them (an
  executor-side point, in the sequencer's host);
- ``owned``: with split tables (``--split``), an owner has logged the batch and sent the
  shards the rows their facts read, no shard has applied them (executor-side, in the
  owner's host);
- ``shard_apply``: in a shard, after the engine applied a released transaction to its
  state and before the batch's state is saved (an executor-side point: the shard's
  host or Python worker kills the group);
- ``postgres_staged``: the tasks holding the batch's output have COPYed it into the
  PostgreSQL sink's staging table (committed there), the driver has not applied it;
- ``postgres_applied``: inside the PostgreSQL transaction that applies the staged batch,
  after its changelog append, delete and upsert, before the progress row moves and the
  transaction commits (one transaction: the kill rolls it all back);
- ``delta_staged``: the tasks holding the batch's output have written its Delta data files
  (``txjoin.sinks.delta_stage``), the driver has neither committed nor handed them off;
- ``first_sink``: the first sink to finish has committed the batch, the other has not
  (the sinks write at the same time: whichever finishes first);
- ``handoff_store``: in the middle of handing the batch off to Delta: the parcel is
  written and fsynced under its temporary name, not yet renamed into place;
- ``sinks_committed``: every sink committed the batch, Spark has not written its commit
  log (``commits/<batch>`` in the checkpoint).

On the Delta committer's thread, in a group commit of batches already handed off (the
point fires at any batch of the group):

- ``delta_published``: the group's staged changelog files are linked into the changelog's
  folder, not committed (files no version references);
- ``delta_between_tables``: inside the Delta sink's write, after the changelog append
  and before the commit to the current table (only a group with changes appends);
- ``delta_current_written``: the current table's new data files (those replacing the files
  the group's changed keys touch, ``txjoin.sinks.delta_current``) are in its folder, not
  committed (files no version references);
- ``delta_group_committed``: both tables committed the group, its hand-off files are not
  removed yet;
- ``delta_recovered``: the same moment in the group commit a run's start makes of what an
  earlier run left (``GroupCommitter.recover``, before the query starts).

In verify's record (``txjoin.verify.history``; no batch: the first time):

- ``verify_append``: in the middle of appending the slot's new transactions to the record:
  the first half of their lines are in the file (fsynced), the rest not;
- ``verify_appended``: the record holds them all (fsynced), the slot is not advanced yet.

The driver's process group is killed (the driver, its JVM, and so on), so a process
started with this variable must lead its own group (the tests start it with
``start_new_session=True``). PySpark's daemon puts the Python workers (and the shard
hosts they start) in a group of their own: an executor-side point kills that group and
the group of the JVM above it (in local mode, the driver's; on a cluster, the executor's).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from txjoin.errors import ConfigError
from txjoin.procfs import STAT_PPID, stat_fields

CRASH_ENV = "TXJOIN_CRASH_AT"
RECORD_ENV = "TXJOIN_CRASH_RECORD"

SEQUENCED = "sequenced"
OWNED = "owned"
SHARD_APPLY = "shard_apply"
POSTGRES_STAGED = "postgres_staged"
POSTGRES_APPLIED = "postgres_applied"
FIRST_SINK = "first_sink"
DELTA_STAGED = "delta_staged"
DELTA_PUBLISHED = "delta_published"
DELTA_BETWEEN_TABLES = "delta_between_tables"
DELTA_CURRENT_WRITTEN = "delta_current_written"
HANDOFF_STORE = "handoff_store"
SINKS_COMMITTED = "sinks_committed"
DELTA_GROUP_COMMITTED = "delta_group_committed"
DELTA_RECOVERED = "delta_recovered"
VERIFY_APPEND = "verify_append"
VERIFY_APPENDED = "verify_appended"
POINTS = (SEQUENCED, OWNED, SHARD_APPLY, POSTGRES_STAGED, POSTGRES_APPLIED, DELTA_STAGED,
          FIRST_SINK, DELTA_PUBLISHED, DELTA_BETWEEN_TABLES, DELTA_CURRENT_WRITTEN, HANDOFF_STORE,
          SINKS_COMMITTED, DELTA_GROUP_COMMITTED, DELTA_RECOVERED, VERIFY_APPEND, VERIFY_APPENDED)

EXECUTOR_POINTS = (SEQUENCED, OWNED, SHARD_APPLY)
"""The points reached in a shard's (or the sequencer's, or an owner's) host or Python
worker."""

BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""The local property Spark's micro-batch execution sets on a batch's jobs (its tasks see it)."""


def _parse(spec: str | None) -> tuple[str, int | None] | None:
    if not spec:
        return None
    point, _, batch = spec.partition(":")
    if point not in POINTS or (batch and not batch.isdigit()):
        raise ConfigError(f"{CRASH_ENV}={spec!r}: expected <point>[:<batch>] with a point "
                         f"among {', '.join(POINTS)} and a batch id >= 0; unset it outside tests")
    return point, int(batch) if batch else None


_ARMED = _parse(os.environ.get(CRASH_ENV))


def reached(point: str, batch_id: int | None) -> None:
    """Kill the process group if ``TXJOIN_CRASH_AT`` names ``point`` (at ``batch_id``)."""
    if _ARMED is None or _ARMED[0] != point:
        return
    if _ARMED[1] is not None and _ARMED[1] != batch_id:
        return
    _say(point, batch_id)
    if point in EXECUTOR_POINTS:
        jvm = _spark_jvm()
        if jvm is not None:
            os.killpg(os.getpgid(jvm), signal.SIGKILL)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _say(point: str, batch_id: int | None) -> None:
    """Where the hook fires, written before the kill (unbuffered writes: nothing is left in
    a buffer the kill would drop)."""
    entry = json.dumps({"point": point, "batch": batch_id, "pid": os.getpid()})
    os.write(2, f"txjoin crash point {point} at batch {batch_id}: SIGKILL\n".encode())
    record = os.environ.get(RECORD_ENV)
    if record:
        fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (entry + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)


def fired(record: str | os.PathLike[str]) -> list[tuple[str, int | None]]:
    """(point, batch) of every kill the hook recorded in ``record`` (``TXJOIN_CRASH_RECORD``),
    in order; several processes of one group may each reach a point before the kill (two
    shards in one batch)."""
    path = Path(record)
    if not path.exists():
        return []
    return [(e["point"], e["batch"]) for e in map(json.loads, path.read_text().splitlines())]


def _spark_jvm() -> int | None:
    """The JVM above a Spark Python worker (or a shard's host), if any: PySpark's daemon
    leads a process group of its own, so the JVM's group is not the worker's."""
    pid = os.getpid()
    try:
        while pid > 1:
            fields = stat_fields(pid)
            if fields is None:
                return None
            pid = int(fields[STAT_PPID])
            with open(f"/proc/{pid}/comm", encoding="ascii") as fh:
                if fh.read().strip() == "java":
                    return pid
    except (OSError, ValueError, IndexError):
        pass
    return None


_SHARD_BATCH: int | None = None


def shard_batch(batch_id: int | None) -> None:
    """Record the micro-batch a shard runs now (set by the shard, read by :func:`in_shard`)."""
    global _SHARD_BATCH
    _SHARD_BATCH = batch_id


def in_shard(point: str = SHARD_APPLY) -> None:
    """An executor-side ``point``, at the batch :func:`shard_batch` recorded."""
    if _ARMED is not None:
        reached(point, _SHARD_BATCH)


def armed(*points: str) -> bool:
    """Whether ``TXJOIN_CRASH_AT`` names one of ``points`` (callers skip gathering its batch
    id)."""
    return _ARMED is not None and _ARMED[0] in points


def task_batch_id() -> int | None:
    """The micro-batch id of the Spark task running in this Python worker, if any."""
    from pyspark import TaskContext

    context = TaskContext.get()
    value = None if context is None else context.getLocalProperty(BATCH_ID_PROPERTY)
    return None if value is None else int(value)
