"""The Delta sink's current table as files clustered by key: a group commit rewrites only the
files that may hold a changed key.

Each data file of the current table holds its rows sorted by key, at most
``CLUSTER_FILE_ROWS`` of them, and its key range is in the log (the exact ``minValues`` /
``maxValues`` of ``delta_commit.file_stats``, for integer and date key columns). A group
commit's last change per key (``last``) is applied like this:

1. the candidate files: those whose key range may hold a changed key (a file without
   statistics for a key column, a string key say, is always one);
2. each candidate's key columns alone are read, to find which file holds which changed key
   (a key is in at most one file: the table has one row per key);
3. a changed key no file holds and not deleted is new: it goes to the candidate file
   whose range holds it, else to the table's last file (the greatest keys, when it has room:
   increasing keys, such as order ids, fill it up), else to new files;
4. each file touched is read, changed, sorted by key and written again as files of at most
   ``CLUSTER_FILE_ROWS`` rows; one commit removes the files touched and adds those written.

So the driver holds one file's rows at a time, never the table's, and a commit's cost is
the files it touches: few when the changed keys are recent ones of an increasing key (a
CDC workload's), nearly the whole table when they are spread over every file's range (25k
random keys over files of 100k rows of a 10M-row table touch every file; see
docs/benchmarks.md). A table of an older layout (one unsorted file, files of a MERGE) is
continued: step 2 makes any layout right, and every file a commit touches comes out sorted.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from txjoin.sinks import OP, OP_DELETE, apply_changes
from txjoin.sinks.delta_commit import file_stats
from txjoin.sinks.delta_stage import write_parquet

CLUSTER_FILE_ROWS = 100_000
"""Rows of a current table's data file at most: a commit touching a file rewrites this many
rows; smaller files cost more files in the log and more per file opened."""
_ROW = "__txjoin_change"


@dataclass(frozen=True)
class Rewrite:
    """What one commit to the current table does: the files it removes (``(path, size)``,
    as the log names them) and the add actions of the files it wrote in the table's folder,
    and the rows it read and wrote (for the figures)."""

    removed: list[tuple[str, int]]
    added: list[dict[str, Any]]
    rows_read: int
    rows_written: int


@dataclass
class _File:
    path: str  # as the log names it
    size: int
    rows: int | None
    low: dict[str, Any]
    high: dict[str, Any]


def _local(table_path: str, name: str) -> str:
    """The local path of a data file the log names ``name`` (relative, or a file URI)."""
    if "://" in name or name.startswith("file:"):
        return unquote(urlparse(name).path)
    return str(Path(table_path) / unquote(name))


def _files(path: str, version: int, key_columns: list[str]) -> list[_File]:
    adds = pa.table(DeltaTable(path, version=version).get_add_actions(flatten=True))
    names = adds.column_names
    found = []
    for row in adds.to_pylist():
        low = {k: row[f"min.{k}"] for k in key_columns
               if f"min.{k}" in names and row[f"min.{k}"] is not None}
        high = {k: row[f"max.{k}"] for k in key_columns
                if f"max.{k}" in names and row[f"max.{k}"] is not None}
        found.append(_File(row["path"], int(row["size_bytes"]), row.get("num_records"),
                           low, high))
    return found


def _in_range(keys: pa.Table, file: _File) -> pa.Array:
    """Which of ``keys`` the file's key range may hold (all: no statistics)."""
    mask = pa.array([True] * keys.num_rows, pa.bool_())
    for column, low in file.low.items():
        if column in file.high:
            inside = pc.and_(pc.greater_equal(keys[column], pa.scalar(low, keys[column].type)),
                             pc.less_equal(keys[column], pa.scalar(file.high[column],
                                                                   keys[column].type)))
            mask = pc.and_(mask, inside)
    return mask


def _chunks(rows: pa.Table, key_columns: list[str]) -> Iterator[pa.Table]:
    """``rows`` sorted by key, cut into files of at most ``CLUSTER_FILE_ROWS`` rows."""
    if rows.num_rows == 0:  # every row of the touched files deleted: no file replaces them
        return
    rows = rows.sort_by([(k, "ascending") for k in key_columns])
    pieces = -(-rows.num_rows // CLUSTER_FILE_ROWS)
    step = -(-rows.num_rows // max(1, pieces))
    for start in range(0, rows.num_rows, step):
        yield rows.slice(start, step)


def rewrite(path: str, version: int, last: pa.Table, key_columns: list[str],
            schema: pa.Schema) -> Rewrite:
    """Apply ``last`` (the last change per key, with ``_op``) to the current table at
    ``path`` as of ``version`` (of ``schema``, as stored): write the files that replace the
    files it touches, in the table's folder (no version references them until the caller
    commits the :class:`Rewrite`; a kill before leaves them to VACUUM)."""
    keys = last.select(key_columns).append_column(
        _ROW, pa.array(range(last.num_rows), pa.int64()))
    files = _files(path, version, key_columns)
    holder = np.full(last.num_rows, -1, np.int64)  # change -> the file holding its key
    candidates: list[int] = []
    rows_read = 0
    for i, file in enumerate(files):
        mask = _in_range(keys, file)
        if not pc.any(mask).as_py():
            continue
        candidates.append(i)
        held = pq.read_table(_local(path, file.path), columns=key_columns)
        rows_read += held.num_rows
        found = keys.filter(mask).join(held, key_columns, join_type="inner", use_threads=False)
        holder[found[_ROW].to_numpy()] = i
    # A new key (held by no file, not deleted) inside a candidate's range goes to that file.
    free = (holder == -1) & pc.not_equal(last[OP], OP_DELETE).to_numpy(zero_copy_only=False)
    for i in candidates:
        if not free.any():
            break
        inside = free & _in_range(keys, files[i]).to_numpy(zero_copy_only=False)
        holder[inside] = i
        free &= ~inside
    tail = _tail(files, key_columns)
    if tail is not None and free.any():
        # Keys above every file's range (an increasing key's new ones) fill the last file.
        first = key_columns[0]
        above = free & pc.greater(keys[first], pa.scalar(files[tail].high[first],
                                                         keys[first].type)).to_numpy(
            zero_copy_only=False)
        holder[above] = tail
        free &= ~above
    touched = {int(i): np.flatnonzero(holder == i) for i in np.unique(holder[holder >= 0])}
    homeless = np.flatnonzero(free)
    removed, added, written = [], [], 0
    for i, rows in sorted(touched.items()):
        file = files[i]
        data = pq.read_table(_local(path, file.path)).select(schema.names).cast(schema)
        rows_read += data.num_rows
        after = apply_changes(data, last.take(rows), key_columns)
        removed.append((file.path, file.size))
        for piece in _chunks(after, key_columns):
            added.append(_write(path, piece))
            written += piece.num_rows
    if homeless.size:
        inserted = apply_changes(schema.empty_table(), last.take(homeless), key_columns)
        for piece in _chunks(inserted, key_columns):
            added.append(_write(path, piece))
            written += piece.num_rows
    return Rewrite(removed, added, rows_read, written)


def _tail(files: list[_File], key_columns: list[str]) -> int | None:
    """The file holding the greatest keys (by the first key column's range), when it has room
    for more rows; ``None``: no such file (or no statistics to tell)."""
    first = key_columns[0]
    ranged = [i for i, f in enumerate(files) if first in f.high]
    if not ranged:
        return None
    i = max(ranged, key=lambda i: files[i].high[first])
    rows = files[i].rows
    return i if rows is not None and rows < CLUSTER_FILE_ROWS else None


def _write(path: str, rows: pa.Table) -> dict[str, Any]:
    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    file = Path(path) / name
    size = write_parquet(rows, file)
    return {"path": name, "partitionValues": {}, "size": size,
            "modificationTime": int(file.stat().st_mtime * 1000), "dataChange": True,
            "stats": file_stats(rows)}
