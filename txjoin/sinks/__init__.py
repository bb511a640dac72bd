"""Sinks: where the join's output changes land, one atomic commit per micro-batch.

The pipeline hands a sink each micro-batch's output changes as a
``pyarrow.Table``: the output key columns, the value columns and the metadata
columns ``_op`` (``c``/``u``/``d``), ``_commit_seq``, ``_xid`` and
``_commit_ts``, in ``_commit_seq`` order. A sink keeps two views: the current
table (last change per key, deletes applied) and an append-only changelog. Each
``write`` commits the batch and the sink's progress together (as dlt's ledger
does), so a reader never sees part of a batch and a replayed batch is skipped.
The progress also records the run's lineage (``txjoin.sinks.lineage``): the
checkpoint the batch came from and the frontier after it, so a run from another
checkpoint is refused instead of being mistaken for a replay, and
``begin_rebuild``/``finish_rebuild`` re-derive a sink into shadow tables that
replace its contents in one atomic step.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc

from txjoin.errors import ConfigError

if TYPE_CHECKING:
    from txjoin.sinks.lineage import Held, Lineage

OP, COMMIT_SEQ, XID, COMMIT_TS = "_op", "_commit_seq", "_xid", "_commit_ts"
META_COLUMNS = (OP, COMMIT_SEQ, XID, COMMIT_TS)
"""Metadata columns of a changes table; the current table keeps all but ``_op``."""
OP_DELETE = "d"
READ_BATCH_ROWS = 10_000
"""Rows a sink hands verify at a time (:meth:`Sink.read_current_batches`)."""

DEFAULT_RETRY_TIMEOUT_S = 60.0
"""How long a lost PostgreSQL sink is retried (``txjoin run --postgres-retry-timeout``)."""


@dataclass
class Upkeep:
    """One table's maintenance: live data files before/after compaction, parquet files on
    disk before/after (VACUUM removes the unreferenced ones), and its seconds. ``kind``
    ``"staging tables"``: a PostgreSQL sink's staging tables that killed runs left (on disk
    before/after; none is live)."""

    path: str
    files_before: int
    files_after: int
    on_disk_before: int
    on_disk_after: int
    seconds: float
    kind: str = "files"

    def line(self) -> str:
        if self.kind != "files":
            return (f"{self.path}: {self.on_disk_before} -> {self.on_disk_after} {self.kind} "
                    f"left by killed runs, {self.seconds:.1f}s")
        return (f"{self.path}: {self.files_before} -> {self.files_after} live files, "
                f"{self.on_disk_before} -> {self.on_disk_after} on disk, {self.seconds:.1f}s")


@runtime_checkable
class Sink(Protocol):
    """A destination for output changes with exactly-once, all-or-nothing batches."""

    name: str
    where: str  # the sink's table or path, for messages

    def last_applied_batch(self) -> int | None:
        """Id of the last micro-batch committed, ``None`` if none ever was."""
        ...

    def held(self) -> Held | None:
        """The lineage of what the sink holds, ``None`` if it was never written."""
        ...

    def other_owner(self) -> tuple[str, str] | None:
        """``(job, what frees its tables)`` when the lineage of the sink's tables names a job
        other than this sink's (it wrote them); ``None``: this job's, new, or unrecorded."""
        ...

    def write(self, batch_id: int, changes: pa.Table, lineage: Lineage | None = None) -> bool:
        """Apply one micro-batch atomically; ``False`` if it was already applied (replay).

        With ``lineage``, a sink holding batches of another checkpoint raises
        ``LineageError`` instead of writing.
        """
        ...

    def begin_rebuild(self, checkpoint_id: str) -> None:
        """From now on write into empty shadow tables; readers keep seeing the old contents."""
        ...

    def finish_rebuild(self) -> None:
        """Replace the sink's contents with the shadow's in one atomic step."""
        ...

    def maintain(self, retention_hours: float | None = None) -> list[Upkeep]:
        """Compact what the sink's writes left small and, with ``retention_hours``, delete
        what no version inside that window needs; never a partial state for readers. Run
        between batches. One :class:`Upkeep` per table it maintained (none: nothing to do)."""
        ...

    def read_current(self) -> list[dict]:
        """Current rows as Python values (nested as lists/dicts, decimals as ``Decimal``)."""
        ...

    def read_changelog(self) -> list[dict]:
        """Every emitted change, with ``_op``/``_commit_seq``/``_xid``/``_commit_ts``."""
        ...

    def read_current_batches(self, rows: int = READ_BATCH_ROWS) -> Iterator[list[dict]]:
        """Current rows as :meth:`read_current` gives them, in key order (text by code
        point, NULLs last), at most ``rows`` at a time: verify compares a large table
        without holding it in Python."""
        ...

    def changelog_repeats(self) -> tuple[int, list[tuple[Any, ...]]]:
        """The changelog's row count, and every (key..., ``_commit_seq``) it holds more than
        once (sorted), counted where the changelog is rather than read into Python."""
        ...

    def close(self) -> None:
        """Release connections; the sink object is unusable afterwards."""
        ...


@dataclass(frozen=True)
class StagedPart:
    """What one task wrote of a micro-batch into a sink's stage: its part number, rows, and
    the commit sequence and xid of its last change (commit order), for the progress;
    ``files``: what it wrote where the sink's commit takes files (Delta: the data file's
    name, size and statistics, ``txjoin.sinks.delta_stage``), plain JSON values."""

    part: int
    rows: int
    last_commit_seq: int | None
    last_xid: int | None
    files: dict[str, Any] | None = None


class TaskStage(Protocol):
    """Where the tasks holding a micro-batch's output write it for a :class:`StagedSink`
    (picklable: a Spark task runs :meth:`copy`)."""

    def copy(self, part: int, changes: pa.Table) -> StagedPart:
        """Write ``changes`` (in commit order) as part ``part`` of the batch, replacing what
        an earlier attempt of the same part wrote."""
        ...


@runtime_checkable
class StagedSink(Sink, Protocol):
    """A sink written from the tasks: the driver prepares a batch's stage, the tasks write
    their parts into it, the driver applies it with the sink's progress in one commit."""

    def stage(self, batch_id: int, checkpoint_id: str | None) -> TaskStage | None:
        """The stage of micro-batch ``batch_id``; ``None`` when the sink holds the batch
        already (a replay: nothing to write). A sink of another checkpoint raises
        ``LineageError``."""
        ...

    def apply(self, stage: Any, staged: list[StagedPart], lineage: Lineage | None) -> bool:
        """Apply the staged batch and the sink's progress atomically; ``False`` if it was
        already applied."""
        ...


def without_metadata(row: dict) -> dict:
    """A sink row with only the job's output columns (metadata columns start with ``_``)."""
    return {k: v for k, v in row.items() if not k.startswith("_")}


def check_changes_schema(schema: pa.Schema, key_columns: list[str], where: str) -> None:
    """Fail early, naming the sink, when keys or metadata columns are missing."""
    missing = [c for c in (*key_columns, *META_COLUMNS) if c not in schema.names]
    if missing:
        raise ConfigError(f"{where}: the changes schema lacks the column(s) {missing}; "
                          f"it has {schema.names}")
    if not key_columns:
        raise ConfigError(f"{where}: at least one key column is needed to merge by key")


def conform(changes: pa.Table, schema: pa.Schema, where: str, batch_id: int) -> pa.Table:
    """``changes`` in the sink's declared column order and types, or a clear error."""
    if changes.schema == schema:
        return changes
    try:
        return changes.select(schema.names).cast(schema)
    except (KeyError, ValueError, pa.ArrowInvalid) as exc:
        raise ConfigError(f"{where}: batch {batch_id} does not match the declared schema "
                          f"{schema}: {exc}") from exc


def current_schema(schema: pa.Schema) -> pa.Schema:
    """Schema of the current table: the changes schema without ``_op``."""
    return schema.remove(schema.get_field_index(OP))


def last_change_per_key(changes: pa.Table, key_columns: list[str]) -> pa.Table:
    """The last row of each key (rows are in commit order), in first-seen key order."""
    if changes.num_rows == 0:
        return changes
    position = "__txjoin_row"
    indexed = changes.append_column(position, pa.array(range(changes.num_rows), pa.int64()))
    last = indexed.group_by(key_columns, use_threads=False).aggregate([(position, "max")])
    rows = pc.sort_indices(last[f"{position}_max"])
    return changes.take(pc.take(last[f"{position}_max"], rows))


def apply_changes(rows: pa.Table, last: pa.Table, key_columns: list[str]) -> pa.Table:
    """``rows`` (a current table) after ``last`` (at most one change per key, with ``_op``):
    every row whose key changed goes, then the rows of the changes that are not deletes
    come in (without ``_op``), cast to ``rows``' schema."""
    position = "__txjoin_row"
    keys = rows.select(key_columns).append_column(
        position, pa.array(range(rows.num_rows), pa.int64()))
    kept = keys.join(last.select(key_columns), key_columns, join_type="left anti",
                     use_threads=False)
    survivors = rows.take(pc.take(kept[position], pc.sort_indices(kept[position])))
    inserted = last.filter(pc.not_equal(last[OP], OP_DELETE)).drop_columns([OP])
    return pa.concat_tables([survivors, inserted.select(rows.schema.names).cast(rows.schema)])


def sort_rows(rows: list[dict], columns: list[str]) -> list[dict]:
    """Rows ordered by ``columns`` (stable, ``None`` first) for deterministic reads."""
    return sorted(rows, key=lambda r: tuple((r[c] is not None, r[c]) for c in columns))
