"""The Delta sink's current table as files clustered by key: a group commit rewrites only the
files that may hold a changed key.

Each data file of the current table holds its rows sorted by key, at most
``CLUSTER_FILE_ROWS`` of them, and its key range is in the log (the exact ``minValues`` /
``maxValues`` of ``delta_commit.file_stats``, for integer and date key columns). A group
commit's last change per key (``last``) is applied like this, when the table has one key
column and every file's range of it is known and no two overlap (the layout this module
writes):

1. each change goes to the file whose range holds its key; a key in a gap between two
   ranges (or below or above them all) to the file before the gap when that file has
   room, else to the one after it, else to new files of that gap's keys alone, so no two
   ranges overlap afterwards either (increasing keys, such as order ids, fill the last
   file, then new ones);
2. each file with changes is one work item, run where the sink says (``Runner``: Spark
   tasks of a few files each, ``DeltaSink._in_tasks``): it reads the file once, leaves it
   as it is when it holds none of the changed keys and they are all deletes, else applies
   them (by slices between the changed keys, the file being sorted, up to
   ``MERGE_MAX_CHANGES``; else by a join and a sort) and writes the result as files of at
   most ``CLUSTER_FILE_ROWS`` rows;
3. one commit (the driver's) removes the files rewritten and adds those written.

Any other layout (several key columns, a string key without statistics, files whose ranges
overlap, as a MERGE or a bin-packing leaves them) is applied in two passes on the driver:

1. the candidate files: those whose key range may hold a changed key (a file without
   statistics for a key column is always one);
2. each candidate's key columns alone are read, to find which file holds which changed key
   (a key is in at most one file: the table has one row per key);
3. a changed key no file holds and not deleted is new: it goes to the candidate file
   whose range holds it, else to the table's last file (when it has room), else to new
   files;
4. each file touched is read, changed, sorted by key and written again as files of at most
   ``CLUSTER_FILE_ROWS`` rows; one commit removes the files touched and adds those written.

So a task (or the driver) holds one file's rows at a time, never the table's, and a
commit's cost is the files it touches: few when the changed keys are recent ones of an
increasing key (a CDC workload's), nearly the whole table when they are spread over every
file's range (25k random keys over files of 100k rows of a 10M-row table touch every file;
see docs/benchmarks.md), which the tasks then share. A table of an older layout is
continued: the two passes make any layout right, and every file a commit touches comes out
sorted.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from txjoin.sinks import OP, OP_DELETE, apply_changes, last_change_per_key
from txjoin.sinks.delta_commit import file_stats
from txjoin.sinks.delta_stage import write_parquet

CLUSTER_FILE_ROWS = 100_000
"""Rows of a current table's data file at most: a commit touching a file rewrites this many
rows; smaller files cost more files in the log and more per file opened."""
MERGE_MAX_CHANGES = 1_000
"""Changes landing in one file up to which it is rewritten by slices between them
(``_merge_sorted``: a Python step per change, ~10 us); above, by one join and a sort of the
file (~40 ms at 100k rows, whatever the changes). Measured, 10M rows: 25k random keys (~240
a file) 3.4 -> 2.4 s a commit by slices; 250k (~2,400 a file) 4.4 s by slices, 3.6 s not."""
_ROW = "__txjoin_change"

Runner = Callable[[Callable[[Any], Any], list[Any]], list[Any]]
"""Maps a function over work items, results in the items' order: where the files a commit
touches are rewritten (the sink's Spark tasks, ``DeltaSink``; :func:`on_driver` here)."""


@dataclass
class StagedChanges:
    """A group commit's last change per key where the Spark tasks staged them (each part's
    file: its last change per key, with ``_op``, sorted by key; parts in batch order, a
    batch's parts of disjoint keys), read where they are needed: the driver reads only their
    key columns to place them (:meth:`keys`), and each work item of :func:`rewrite_file`
    reads, where it runs, the changes of its own keys (:meth:`between`, :meth:`read`), so the
    group's rows never pass through the driver (picklable: items carry one to the tasks)."""

    files: tuple[str, ...]  # local paths, in batch order
    schema: pa.Schema  # as stored, with ``_op``
    key_columns: tuple[str, ...]
    low: Any = None  # an item's first key (first key column); None: every change
    high: Any = None  # an item's last key
    count: int | None = None  # the distinct keys between ``low`` and ``high``
    _keys: pa.Table | None = field(default=None, init=False, repr=False, compare=False)

    def keys(self) -> pa.Table:
        """The changed keys (each once, in no particular order), read once."""
        if self._keys is None:
            tables = [pq.read_table(f, columns=list(self.key_columns)) for f in self.files]
            keys = (pa.concat_tables(tables) if tables
                    else self.schema.empty_table().select(list(self.key_columns)))
            self._keys = keys.group_by(list(self.key_columns), use_threads=False).aggregate([])
        return self._keys

    def between(self, low: Any, high: Any, count: int) -> StagedChanges:
        """The changes of the ``count`` keys from ``low`` to ``high`` (first key column,
        inclusive), to be read by the item that applies them."""
        return StagedChanges(self.files, self.schema, self.key_columns, low, high, count)

    def read(self) -> pa.Table:
        """The last change of each key of this range (all: no range), each once, in no
        particular order (the parts are each sorted, not their concatenation)."""
        key = self.key_columns[0]
        bounds = None if self.low is None else [(key, ">=", self.low), (key, "<=", self.high)]
        tables = [pq.read_table(f, filters=bounds, use_threads=False) for f in self.files]
        if not tables:
            return self.schema.empty_table()
        last = last_change_per_key(pa.concat_tables(tables).cast(self.schema),
                                   list(self.key_columns))
        if self.count is not None and last.num_rows != self.count:
            raise RuntimeError(f"delta sink: the staged changes from key {self.low!r} to "
                               f"{self.high!r} hold {last.num_rows} keys where the commit "
                               f"placed {self.count}: the staged files changed under a "
                               f"commit; nothing committed, restart to retry it")
        return last

    @property
    def num_rows(self) -> int:
        return self.keys().num_rows if self.count is None else self.count


def on_driver(function: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    """A :data:`Runner` in this process, one item after another."""
    return [function(item) for item in items]


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


def _chunks(rows: pa.Table, key_columns: list[str], most: int | None = None,
            ordered: bool = False) -> Iterator[pa.Table]:
    """``rows`` sorted by key (``ordered``: they are), cut into files of at most ``most`` rows
    (by default ``CLUSTER_FILE_ROWS``)."""
    most = CLUSTER_FILE_ROWS if most is None else most
    if rows.num_rows == 0:  # every row of the touched files deleted: no file replaces them
        return
    if not ordered:
        rows = rows.sort_by([(k, "ascending") for k in key_columns])
    pieces = -(-rows.num_rows // most)
    step = -(-rows.num_rows // max(1, pieces))
    for start in range(0, rows.num_rows, step):
        yield rows.slice(start, step)


def rewrite(path: str, version: int, last: pa.Table | StagedChanges, key_columns: list[str],
            schema: pa.Schema, run: Runner = on_driver) -> Rewrite:
    """Apply ``last`` (the last change per key, with ``_op``, or where the tasks staged it)
    to the current table at
    ``path`` as of ``version`` (of ``schema``, as stored): write the files that replace the
    files it touches, in the table's folder (no version references them until the caller
    commits the :class:`Rewrite`; a kill before leaves them to VACUUM).

    A table of one key column whose files' key ranges are all known and do not overlap
    (this module's layout) is rewritten in one pass, each file by one call of ``run``'s
    function: it reads the file once (and, for staged changes, those of its keys) and
    rewrites it only if a change lands in it; the caller holds only the changed keys. Any
    other layout takes the two passes of the module's docstring, in this process, which
    holds the changes."""
    files = _files(path, version, key_columns)
    order = _disjoint(files, key_columns)
    if order is not None:
        return _rewrite_disjoint(path, last, key_columns, schema, files, order, run)
    if isinstance(last, StagedChanges):
        last = last.read()
    keys = last.select(key_columns).append_column(
        _ROW, pa.array(range(last.num_rows), pa.int64()))
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


def _disjoint(files: list[_File], key_columns: list[str]) -> list[int] | None:
    """The files in key order when the table has one key column, every file's range of it
    is known and no two ranges overlap; else ``None``."""
    if len(key_columns) != 1:
        return None
    key = key_columns[0]
    if not all(key in f.low and key in f.high for f in files):
        return None
    order = sorted(range(len(files)), key=lambda i: files[i].low[key])
    for a, b in itertools.pairwise(order):
        if not files[a].high[key] < files[b].low[key]:
            return None
    return order


def _rewrite_disjoint(path: str, last: pa.Table | StagedChanges, key_columns: list[str],
                      schema: pa.Schema, files: list[_File], order: list[int],
                      run: Runner) -> Rewrite:
    """:func:`rewrite` of a table whose files' key ranges do not overlap: a change goes to
    the file whose range holds its key; a key in a gap between ranges (or below or above
    them all) to the file before the gap when it has room, else the one after it, else to
    new files of that gap's keys alone, so the ranges still do not overlap afterwards.
    Each file with changes, and each gap's new files, is one work item.

    A key's place only grows with the key (a gap's keys go to the file before it, the one
    after it, or files of their own between the two), so an item's keys are exactly the
    changed keys from its least to its greatest: staged changes go to an item as that range
    (:meth:`StagedChanges.between`), read where the item runs."""
    key = key_columns[0]
    n = len(order)
    keys = last.keys() if isinstance(last, StagedChanges) else last
    holder = np.full(keys.num_rows, -1, np.int64)  # change -> the file it goes to (-1: new)
    gap = np.full(keys.num_rows, -1, np.int64)  # -> the gap it is in (new files, by gap)
    values = keys[key].to_numpy(zero_copy_only=False)

    def changes(rows: np.ndarray) -> pa.Table | StagedChanges:
        if isinstance(last, pa.Table):
            return last.take(rows)
        chosen = keys[key].take(pa.array(rows))
        return last.between(pc.min(chosen).as_py(), pc.max(chosen).as_py(), int(rows.size))

    if n:
        kind = keys[key].type
        lows = pa.array([files[i].low[key] for i in order], kind).to_numpy(zero_copy_only=False)
        highs = pa.array([files[i].high[key] for i in order], kind).to_numpy(
            zero_copy_only=False)
        ordered = np.asarray(order, np.int64)
        at = np.searchsorted(lows, values, side="right") - 1  # the last range starting <= key
        inside = (at >= 0) & (values <= highs[np.maximum(at, 0)])
        holder[inside] = ordered[at[inside]]
        room = [(files[i].rows or CLUSTER_FILE_ROWS) < CLUSTER_FILE_ROWS for i in order]
        for g in np.unique(at[~inside]):  # g: the gap after the g-th range (-1: below all)
            mask = ~inside & (at == g)
            if g >= 0 and room[g]:
                holder[mask] = ordered[g]
            elif g + 1 < n and room[g + 1]:
                holder[mask] = ordered[g + 1]
            else:
                gap[mask] = g
    items: list[tuple[Any, ...]] = []
    for i in np.unique(holder[holder >= 0]):
        file = files[int(i)]
        items.append((path, file.path, file.size, file.rows,
                      changes(np.flatnonzero(holder == i)), schema, key_columns,
                      CLUSTER_FILE_ROWS))
    new = holder == -1
    for g in np.unique(gap[new]):
        items.append((path, None, 0, 0, changes(np.flatnonzero(new & (gap == g))), schema,
                      key_columns, CLUSTER_FILE_ROWS))
    removed, added, read, written = [], [], 0, 0
    for gone, adds, rows_read, rows_written in run(rewrite_file, items):
        if gone is not None:
            removed.append(gone)
        added += adds
        read += rows_read
        written += rows_written
    return Rewrite(removed, added, read, written)


def rewrite_file(item: tuple[Any, ...]) -> tuple[tuple[str, int] | None, list[dict[str, Any]],
                                                   int, int]:
    """One work item of :func:`_rewrite_disjoint` (where it runs: a Spark task, or the
    driver): the file the log names ``name`` in the table at ``path`` (``None``: none, the
    changes' own new files; ``_rows``: its rows, for :func:`item_rows`) after ``changes`` (a
    table, or :class:`StagedChanges` of its keys, read here) -> (the file removed, or
    ``None`` when no change lands in it; the add actions of the files written; rows read;
    rows written), in files of at most ``most`` rows (``CLUSTER_FILE_ROWS`` where the commit
    runs)."""
    path, name, size, _rows, changes, schema, key_columns, most = item
    if isinstance(changes, StagedChanges):
        changes = changes.read()
    if name is None:
        data = schema.empty_table()
    else:
        data = pq.read_table(_local(path, name), use_threads=False).select(
            schema.names).cast(schema)
    merged = _merge_sorted(data, changes, key_columns[0]) if len(key_columns) == 1 else None
    if merged is not None:
        after, touched = merged
    else:
        held = changes.select(key_columns).join(data.select(key_columns), key_columns,
                                                join_type="inner", use_threads=False)
        touched = held.num_rows > 0 or not pc.all(pc.equal(changes[OP], OP_DELETE)).as_py()
        after = apply_changes(data, changes, key_columns) if touched else data
    if name is not None and not touched:
        return None, [], data.num_rows, 0  # only deletes of keys it does not hold
    adds = [_write(path, piece)
            for piece in _chunks(after, key_columns, most, ordered=merged is not None)]
    return (None if name is None else (name, size)), adds, data.num_rows, after.num_rows


def item_rows(item: tuple[Any, ...]) -> int:
    """The rows a work item of :func:`rewrite_file` handles: its file's (as the log counts
    them; a file without the count: ``CLUSTER_FILE_ROWS``) and its changes."""
    rows = item[3]
    return (CLUSTER_FILE_ROWS if rows is None else int(rows)) + item[4].num_rows


def _merge_sorted(data: pa.Table, changes: pa.Table, key: str) -> tuple[pa.Table, bool] | None:
    """``data`` (strictly sorted by ``key``, one key column) after ``changes`` (one per key,
    with ``_op``), still sorted, without a sort: its rows between two changed keys are
    slices, each change not a delete comes in at its key's place, the pieces then put
    together in one copy -> (the rows,
    whether a change landed: a key held or a row put in). ``None``: ``data`` is not sorted
    (a file of an older layout), or more than ``MERGE_MAX_CHANGES`` changes land in it, for
    :func:`apply_changes` and a sort."""
    keys = data[key].to_numpy(zero_copy_only=False)
    if keys.size > 1 and not bool(np.all(keys[:-1] < keys[1:])):
        return None
    order = pc.sort_indices(changes[key]).to_numpy(zero_copy_only=False)
    changed = changes.take(order)
    wanted = changed[key].to_numpy(zero_copy_only=False)
    at = np.searchsorted(keys, wanted)
    held = np.zeros(wanted.size, bool)
    if keys.size:
        held = (at < keys.size) & (keys[np.minimum(at, keys.size - 1)] == wanted)
    put = pc.not_equal(changed[OP], OP_DELETE).to_numpy(zero_copy_only=False)
    if not held.any() and not put.any():
        return data, False
    if int(np.count_nonzero(held | put)) > MERGE_MAX_CHANGES:
        return None
    rows = changed.drop_columns([OP]).select(data.schema.names).cast(data.schema)
    pieces, start = [], 0
    for i in np.flatnonzero(held | put):
        pieces.append(data.slice(start, int(at[i]) - start))
        if put[i]:
            pieces.append(rows.slice(int(i), 1))
        start = int(at[i]) + (1 if held[i] else 0)
    pieces.append(data.slice(start))
    return pa.concat_tables(pieces).combine_chunks(), True


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
