"""The sinks' work done in the tasks that produce a micro-batch's output; the driver commits.

Before a micro-batch's Spark job the driver prepares each staged sink's stage of the batch
(the PostgreSQL sink's staging table, ``txjoin.sinks.postgres.Stage``; the Delta sink's
staged data files, ``txjoin.sinks.delta_stage``) and sets them, pickled, as a Spark local
property (:data:`TASK_SINKS_PROPERTY`, :func:`encode`), which every task of the job gets.
The job's last stateful stage (the shards: ``txjoin.join.spark.shards``) writes its part of
the batch into every stage itself, in the process that produced it, as soon as it has
(:func:`write_part`): its changes never travel through Spark, and no second Python runner
per task takes them over. Its output row carries what it staged per sink, its changes'
count and their source commit times (the sinks' latency figures), and the changes
themselves only when a sink without a stage needs them on the driver. The driver applies
each stage with the sink's progress in one transaction, and hands Delta's off to its group
commits (:func:`summarise` reads the shards' rows back).

A part is a shard's output in the batch (its number is the shard's): keys are disjoint
between shards, and a re-run of the batch or a retried task writes the same part again,
replacing what an earlier attempt wrote.
"""

from __future__ import annotations

import base64
import json
import pickle
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txjoin.sinks import COMMIT_SEQ, COMMIT_TS, StagedPart, TaskStage

TASK_SINKS_PROPERTY = "txjoin.sinks.taskSinks"
"""The Spark local property the driver sets, before a micro-batch's job, to the batch's
:class:`TaskSinks` (:func:`encode`), for the shards' tasks (``TaskContext``)."""

PART_KEY = "sink_part"
"""The key of a shard's progress (its output's ``info``) that holds what it wrote
(:func:`write_part`)."""


@dataclass(frozen=True)
class TaskSinks:
    """What the tasks of one micro-batch write, and where (picklable: no connection)."""

    stages: dict[str, TaskStage]  # sink name -> its stage of this batch
    keep_rows: bool  # the driver needs the rows too (a sink without a stage)


def encode(sinks: TaskSinks) -> str:
    """``sinks`` as the text of :data:`TASK_SINKS_PROPERTY`."""
    return base64.b64encode(pickle.dumps(sinks, pickle.HIGHEST_PROTOCOL)).decode("ascii")


@lru_cache(maxsize=4)
def decode(value: str) -> TaskSinks:
    """The :class:`TaskSinks` of a :data:`TASK_SINKS_PROPERTY` (cached: every shard of a
    process reads the same one per batch)."""
    sinks: TaskSinks = pickle.loads(base64.b64decode(value))
    return sinks


def task_value() -> str | None:
    """In a task of a micro-batch's job: :data:`TASK_SINKS_PROPERTY` as the driver set it
    (None: the job writes no sink, its output is collected whole)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return None if context is None else context.getLocalProperty(TASK_SINKS_PROPERTY)


def commit_ts_ms(table: pa.Table) -> pa.Array:
    """The source commit times of ``table``'s changes, in ms since the epoch (no NULLs)."""
    column = table.column(COMMIT_TS).drop_null()
    ms = pc.cast(column, pa.timestamp("ms", column.type.tz), safe=False)
    return pc.cast(ms, pa.int64()).combine_chunks()


def write_part(sinks: TaskSinks, part: int, changes: pa.Table) -> dict[str, Any]:
    """Write ``changes`` (one shard's in the batch, in commit order) as part ``part`` into
    every stage: what goes to the driver (JSON values), under :data:`PART_KEY` of the
    shard's progress."""
    staged = {}
    for name, stage in sinks.stages.items():
        before = time.monotonic()
        done = stage.copy(part, changes)
        staged[name] = {**done.__dict__, "seconds": time.monotonic() - before}
    return {"rows": changes.num_rows, "staged": staged,
            "commit_ts_ms": commit_ts_ms(changes).to_pylist()}


def in_commit_order(blobs: Sequence[bytes | None], schema: pa.Schema) -> pa.Table:
    """Shards' changes (Arrow IPC streams, each shard's in its order) as one table in commit
    order: keys are disjoint between shards, so a stable sort by commit sequence is it."""
    tables = [pa.ipc.open_stream(blob).read_all() for blob in blobs if blob is not None]
    if not tables:
        return pa.Table.from_pylist([], schema=schema)
    table = pa.concat_tables(tables)
    return table.take(pc.sort_indices(table, [(COMMIT_SEQ, "ascending")]))


@dataclass
class Summary:
    """A batch's output as the driver sees it after the shards wrote it."""

    infos: list[dict[str, Any]]  # the shards' progress, without what they wrote
    rows: int
    staged: dict[str, list[StagedPart]]  # sink name -> its parts
    task_seconds: dict[str, float]  # sink name -> the slowest shard's seconds staging
    commit_ts_ms: list[int]
    changes: pa.Table | None  # the rows in commit order, when kept


def summarise(output: pa.Table, schema: pa.Schema, keep_rows: bool) -> Summary:
    """The shards' output rows (``shards.OUTPUT_SCHEMA``) of a batch whose tasks wrote their
    parts (:func:`write_part`) -> :class:`Summary`; with ``keep_rows``, the rows they kept
    in commit order. A shard that reports no part (it ran without the property) is an
    error: its changes would be lost."""
    infos = [json.loads(i) for i in output.column("info").to_pylist() if i is not None]
    staged: dict[str, list[StagedPart]] = {}
    task_seconds: dict[str, float] = {}
    rows, commit_ts = 0, []
    for info in sorted(infos, key=lambda i: i.get("shard", 0)):
        part = info.pop(PART_KEY, None)
        if part is None:
            raise RuntimeError(f"shard {info.get('shard')} wrote no part of the batch: its "
                               f"task did not get {TASK_SINKS_PROPERTY}")
        rows += part["rows"]
        commit_ts += part["commit_ts_ms"]
        for name, done in part["staged"].items():
            task_seconds[name] = max(task_seconds.get(name, 0.0), done.pop("seconds"))
            staged.setdefault(name, []).append(StagedPart(**done))
    changes = (in_commit_order(output.column("changes").to_pylist(), schema) if keep_rows
               else None)
    return Summary(infos=infos, rows=rows, staged=staged, task_seconds=task_seconds,
                   commit_ts_ms=commit_ts, changes=changes)
