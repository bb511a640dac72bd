"""The sinks' work done in the tasks that hold a micro-batch's output; the driver commits.

The shards' output (``shards.OUTPUT_SCHEMA``: per shard its changes as Arrow IPC and its
progress) stays in the Spark tasks that computed it. Each task puts its part of the batch
in commit order and COPYs it into every staged sink's stage (the PostgreSQL sink's
staging table, ``txjoin.sinks.postgres.Stage``), then returns one small summary row
(:data:`SUMMARY_SCHEMA`): the shards' progress, what it staged per sink (the Delta sink's
data files: ``txjoin.sinks.delta_stage``), the source commit times of its changes (the
sinks' latency figures) and, only when a sink without a stage needs them on the driver, the
rows themselves. The driver applies each stage with the sink's progress in one transaction,
and hands Delta's off to its group commits (:func:`summarise` reads the summaries back).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txjoin.sinks import COMMIT_SEQ, COMMIT_TS, StagedPart, TaskStage

SUMMARY_SCHEMA = ("part int, rows bigint, infos array<string>, changes binary, "
                  "staged string, commit_ts_ms array<bigint>")
"""One row per task: its part number, its changes' count, the shards' progress (JSON), its
changes (Arrow IPC, in commit order) when the driver needs the rows, else null, what it
staged per sink (JSON: sink -> ``StagedPart`` fields and seconds) and its changes' source
commit times (ms)."""
_SUMMARY_ARROW = pa.schema([("part", pa.int32()), ("rows", pa.int64()),
                            ("infos", pa.list_(pa.string())),
                            ("changes", pa.binary()), ("staged", pa.string()),
                            ("commit_ts_ms", pa.list_(pa.int64()))])


def in_commit_order(blobs: Sequence[bytes | None], schema: pa.Schema) -> pa.Table:
    """Shards' changes (Arrow IPC streams, each shard's in its order) as one table in commit
    order: keys are disjoint between shards, so a stable sort by commit sequence is it."""
    tables = [pa.ipc.open_stream(blob).read_all() for blob in blobs if blob is not None]
    if not tables:
        return pa.Table.from_pylist([], schema=schema)
    table = pa.concat_tables(tables)
    return table.take(pc.sort_indices(table, [(COMMIT_SEQ, "ascending")]))


def _ipc(table: pa.Table) -> bytes:
    out = pa.BufferOutputStream()
    with pa.ipc.new_stream(out, table.schema) as writer:
        writer.write_table(table)
    return bytes(out.getvalue().to_pybytes())


def commit_ts_ms(table: pa.Table) -> pa.Array:
    """The source commit times of ``table``'s changes, in ms since the epoch (no NULLs)."""
    column = table.column(COMMIT_TS).drop_null()
    ms = pc.cast(column, pa.timestamp("ms", column.type.tz), safe=False)
    return pc.cast(ms, pa.int64()).combine_chunks()


@dataclass(frozen=True)
class PartWriter:
    """The function ``mapInArrow`` runs in each task of a batch's output (picklable: the
    stages hold where to write, no connection)."""

    schema: pa.Schema  # the changes' schema (``join.output.output_schema``)
    stages: dict[str, TaskStage]  # sink name -> its stage of this batch
    keep_rows: bool  # the driver needs the rows (a sink without a stage)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        part = 0 if context is None else context.partitionId()
        blobs: list[bytes | None] = []
        infos: list[str] = []
        for batch in batches:
            blobs += batch.column("changes").to_pylist()
            infos += [i for i in batch.column("info").to_pylist() if i is not None]
        changes = in_commit_order(blobs, self.schema)
        staged = {}
        for name, stage in self.stages.items():
            before = time.monotonic()
            done = stage.copy(part, changes)
            staged[name] = {**done.__dict__, "seconds": time.monotonic() - before}
        yield pa.RecordBatch.from_pylist([{
            "part": part, "rows": changes.num_rows, "infos": infos,
            "changes": _ipc(changes) if self.keep_rows and changes.num_rows else None,
            "staged": json.dumps(staged), "commit_ts_ms": commit_ts_ms(changes).to_pylist()}],
            schema=_SUMMARY_ARROW)


@dataclass
class Summary:
    """A batch's output as the driver sees it after the tasks wrote it."""

    infos: list[dict[str, Any]]
    rows: int
    staged: dict[str, list[StagedPart]]  # sink name -> its parts
    task_seconds: dict[str, float]  # sink name -> the slowest task's seconds staging
    commit_ts_ms: list[int]
    changes: pa.Table | None  # the rows in commit order, when kept


def summarise(summaries: pa.Table, schema: pa.Schema, keep_rows: bool) -> Summary:
    """The tasks' summary rows (:data:`SUMMARY_SCHEMA`) -> :class:`Summary`; with
    ``keep_rows``, the rows they kept in commit order."""
    rows = sorted(summaries.to_pylist(), key=lambda r: r["part"])
    staged: dict[str, list[StagedPart]] = {}
    task_seconds: dict[str, float] = {}
    for r in rows:
        for name, done in json.loads(r["staged"]).items():
            task_seconds[name] = max(task_seconds.get(name, 0.0), done.pop("seconds"))
            staged.setdefault(name, []).append(StagedPart(**done))
    return Summary(
        infos=[json.loads(i) for r in rows for i in r["infos"] or ()],
        rows=sum(r["rows"] for r in rows), staged=staged, task_seconds=task_seconds,
        commit_ts_ms=[t for r in rows for t in r["commit_ts_ms"] or ()],
        changes=in_commit_order([r["changes"] for r in rows], schema) if keep_rows else None)
