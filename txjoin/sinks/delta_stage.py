"""The Delta sink's data files written by the Spark tasks that hold a micro-batch's output.

Each task conforms its part of the batch to the tables' stored schema and writes, under
``<table>/_staged/`` (beside the two tables, not inside them: no reader and no VACUUM ever
looks there):

- ``changelog/<name>``: its changes in commit order, the changelog's future data file,
  with the exact statistics ``delta_commit.file_stats`` gives (computed in the task);
- ``current/<name>``: the last change per key of its part (keys are disjoint between a
  batch's parts: each shard owns its keys), all the current table's group commit needs.

``<name>`` is the checkpoint, the batch and the part (:func:`staged_name`): a retried task
or a re-run batch writes the same file again, under a temporary name renamed over it, so
a name holds one attempt's whole file. The task returns what it wrote
(:class:`~txjoin.sinks.StagedPart` with ``files``) in its summary row instead of the rows;
the hand-off records those parts, and the group commit (``DeltaSink.write_group``)
hard-links each changelog file into the changelog's folder under its table name
(:func:`table_name`), commits their add actions in one commit, then reads the current
parts to update the current table. A file linked and not committed (a kill between the
two) is one no version references: the next attempt links it again, VACUUM deletes it
once it is old enough. Staged files whose batch a table holds, and any older than
``STAGED_MAX_AGE_S``, are orphans: the sink's upkeep counts and deletes them
(:func:`orphans`).
"""

from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from txjoin.errors import ConfigError
from txjoin.sinks import COMMIT_SEQ, XID, StagedPart, conform, last_change_per_key
from txjoin.sinks.delta_commit import check_not_null, file_stats
from txjoin.sinks.handoff import fsync_path

STAGED_DIR = "_staged"
CHANGELOG, CURRENT = "changelog", "current"
STAGED_MAX_AGE_S = 7 * 24 * 3600.0
"""A staged file of a batch no table holds yet is a killed run's hand-off waiting for its
next run; only one older than this (Delta's own VACUUM floor, 7 days) is taken for an
orphan."""
_NAME = re.compile(r"^(?P<checkpoint>.*)-b(?P<batch>\d{12})-p(?P<part>\d{5})\.parquet$")


STAGED_ROW_GROUP_ROWS = 8_192
"""Rows of a row group of a staged last-change file: a key range's reader skips the groups
outside it by their statistics."""


def staged_name(checkpoint_id: str | None, batch_id: int, part: int) -> str:
    """The staged file of part ``part`` of micro-batch ``batch_id`` of a checkpoint: the same
    for every attempt of the task and every re-run of the batch."""
    return f"{checkpoint_id or 'none'}-b{batch_id:012d}-p{part:05d}.parquet"


def table_name(staged: str) -> str:
    """The data file's name in the changelog's folder (Spark's naming: ``part-...``)."""
    return f"part-{staged[:-len('.parquet')]}-c000.snappy.parquet"


def parse_name(name: str) -> tuple[str, int] | None:
    """(checkpoint id, batch id) of a staged file's name; ``None``: not a staged file."""
    match = _NAME.match(name)
    return None if match is None else (match["checkpoint"], int(match["batch"]))


def write_parquet(rows: pa.Table, file: Path, row_group_rows: int | None = None) -> int:
    """``rows`` as Parquet at ``file`` (written under a temporary name, fsynced, renamed over
    whatever an earlier attempt left, the folder fsynced), in row groups of at most
    ``row_group_rows`` rows (None: pyarrow's default): its size."""
    file.parent.mkdir(parents=True, exist_ok=True)
    partial = file.with_name(f".{file.name}.{uuid.uuid4().hex}.partial")
    # Spark reads microseconds: Delta has no finer timestamp.
    pq.write_table(rows, partial, compression="snappy", coerce_timestamps="us",
                   allow_truncated_timestamps=True, row_group_size=row_group_rows)
    fsync_path(partial)
    partial.replace(file)
    fsync_path(file.parent)
    return file.stat().st_size


@dataclass(frozen=True)
class DeltaStage:
    """One micro-batch's staged files (picklable: a Spark task runs :meth:`copy`)."""

    root: str  # the ``_staged`` folder of the tables written now
    checkpoint_id: str | None
    batch_id: int
    table: str  # the sink's table, for messages
    schema: pa.Schema  # the changes' schema
    stored: pa.Schema  # as the Delta tables store it (delta.stored_schema)
    key_columns: tuple[str, ...]

    def path(self, kind: str, part: int) -> Path:
        return Path(self.root) / kind / staged_name(self.checkpoint_id, self.batch_id, part)

    def copy(self, part: int, changes: pa.Table) -> StagedPart:
        """Write ``changes`` (in commit order) as part ``part`` of the batch: the changelog's
        file and the part's last change per key, replacing an earlier attempt's."""
        n = changes.num_rows
        if n == 0:
            return StagedPart(part, 0, None, None)
        rows = conform(changes, self.schema, f"delta sink {self.table!r}",
                       self.batch_id).cast(self.stored)
        check_not_null(rows)
        changelog = self.path(CHANGELOG, part)
        size = write_parquet(rows, changelog)
        # Sorted by key in row groups, so the work that applies one key range to the
        # current table (delta_current.StagedChanges.read) reads only the groups of its keys.
        last = last_change_per_key(rows, list(self.key_columns)).sort_by(
            [(k, "ascending") for k in self.key_columns])
        write_parquet(last, self.path(CURRENT, part), STAGED_ROW_GROUP_ROWS)
        files: dict[str, Any] = {"name": changelog.name, "size": size,
                                 "stats": file_stats(rows), "current_rows": last.num_rows}
        return StagedPart(part, n, rows.column(COMMIT_SEQ)[n - 1].as_py(),
                          rows.column(XID)[n - 1].as_py(), files)


def publish(root: str, name: str, table_path: str) -> tuple[str, int]:
    """Hard-link the staged changelog file ``name`` into the table's folder under its
    :func:`table_name` (replacing a link an interrupted attempt left): (its name in the
    table, its modification time in ms). A staged file that is gone and not linked is
    data lost (deleted by hand): refused."""
    staged = Path(root) / CHANGELOG / name
    target = Path(table_path) / table_name(name)
    try:
        link = target.with_name(f".{target.name}.{uuid.uuid4().hex}.link")
        os.link(staged, link)
        link.replace(target)
    except FileNotFoundError:
        if not target.exists():
            raise ConfigError(
                f"delta sink: the staged file {staged} of a batch handed off is gone, and "
                f"not in {table_path} either; nothing committed; run with --rebuild") from None
    return target.name, int(target.stat().st_mtime * 1000)


def remove(root: str, kind: str, names: list[str]) -> None:
    """Delete staged files a commit took (a kill before leaves them to upkeep)."""
    for name in names:
        (Path(root) / kind / name).unlink(missing_ok=True)


def orphans(root: str, kind: str, held: tuple[str | None, int | None],
            now: float | None = None) -> list[Path]:
    """The staged files of ``kind`` nothing will commit: those of a batch the table holds
    (``held``: its checkpoint and last batch), and any older than ``STAGED_MAX_AGE_S``
    (temporary files of a write cut short included)."""
    folder = Path(root) / kind
    if not folder.is_dir():
        return []
    now = time.time() if now is None else now
    found = []
    for file in folder.iterdir():
        parsed = parse_name(file.name)
        try:
            old = now - file.stat().st_mtime > STAGED_MAX_AGE_S
        except FileNotFoundError:
            continue
        done = (parsed is not None and held[1] is not None and parsed[0] == (held[0] or "none")
                and parsed[1] <= held[1])
        if done or old:
            found.append(file)
    return sorted(found)
