"""Delta Lake sink: ``<output_dir>/<table>/current`` (merged by key) and ``.../changelog``.

Written with delta-rs (``deltalake``) from Arrow, no JVM needed. Each micro-batch
is one commit per table, and each commit carries an app transaction
``(txjoin-<job>-changelog|current, batch_id)``. delta-rs records app-transaction
versions but does not enforce them, so ``write`` reads the recorded version
first and skips a table already at ``>= batch_id``. The changelog is written
before the current table, so the current table's version is the sink's progress:
after a crash between the two commits the replay skips the changelog and
applies the current table only.

Every commit also carries the run's lineage in its commit info
(``txjoin.checkpoint``, ``txjoin.frontier_commit_seq``, ``txjoin.last_change_xid``),
read back by ``held``. A rebuild writes both tables under ``<table>/_rebuild/``
and then replaces each table's contents with one overwrite commit (a new table
version: readers see the old state or the rebuilt one, never an empty or
partial table). The swap streams the rebuilt tables into that commit.

``DeltaSparkSink`` does the same through delta-spark when the Spark session has
the Delta extension (batch ids only, without lineage or rebuild).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from txjoin.delta_tables import native_dataset, read_table
from txjoin.errors import ConfigError, LineageError
from txjoin.sinks import (
    COMMIT_SEQ,
    OP,
    OP_DELETE,
    XID,
    check_changes_schema,
    conform,
    current_schema,
    last_change_per_key,
    sort_rows,
)
from txjoin.sinks.lineage import Held, Lineage, short

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
_HISTORY = 50  # commits searched for the last txjoin commit (others: OPTIMIZE, VACUUM...)


def _quoted(column: str) -> str:
    # Backticks let any column name through delta-rs's SQL predicate parser.
    return "`" + column.replace("`", "``") + "`"


def _applied(table: DeltaTable, app_id: str) -> int:
    """Last batch id recorded for ``app_id``, -1 if none (careful: batch 0 is falsy)."""
    version = table.transaction_version(app_id)
    return -1 if version is None else version


def _key_predicate(key_columns: list[str]) -> str:
    return " AND ".join(f"target.{_quoted(c)} = source.{_quoted(c)}" for c in key_columns)


class DeltaSink:
    """Delta tables written with delta-rs; see the module docstring for the protocol."""

    name = "delta"

    def __init__(self, output_dir: str, table: str, job: str, key_columns: list[str],
                 schema: pa.Schema) -> None:
        check_changes_schema(schema, key_columns, f"delta sink for table {table!r}")
        self.table, self.job = table, job
        self.key_columns = list(key_columns)
        self.schema = schema
        self.root = Path(output_dir) / table
        self.where = str(self.root)
        self.current_path = str(self.root / "current")
        self.changelog_path = str(self.root / "changelog")
        self.current_app_id = f"txjoin-{job}-current"
        self.changelog_app_id = f"txjoin-{job}-changelog"
        self._rebuild_id: str | None = None
        self._checked: str | None = None  # checkpoint id already compared with the tables

    @property
    def rebuild_root(self) -> Path:
        return self.root / "_rebuild"

    def _targets(self) -> tuple[str, str]:
        """(changelog, current) paths written now: the shadow ones while rebuilding."""
        if self._rebuild_id is None:
            return self.changelog_path, self.current_path
        return str(self.rebuild_root / "changelog"), str(self.rebuild_root / "current")

    def _open(self, path: str, schema: pa.Schema) -> DeltaTable:
        if not DeltaTable.is_deltatable(path):
            # An empty first commit: it holds no rows, so readers still see whole batches.
            return DeltaTable.create(path, schema, mode="ignore")
        return DeltaTable(path)

    def _commit(self, app_id: str, batch_id: int, lineage: Lineage | None = None,
                last_xid: int | None = None) -> CommitProperties:
        metadata: dict[str, Any] = {"txjoin.job": self.job, "txjoin.batch_id": batch_id}
        if lineage is not None and lineage.checkpoint_id is not None:
            metadata["txjoin.checkpoint"] = lineage.checkpoint_id
        if lineage is not None and lineage.frontier_commit_seq is not None:
            metadata["txjoin.frontier_commit_seq"] = lineage.frontier_commit_seq
        if last_xid is not None:
            metadata["txjoin.last_change_xid"] = last_xid
        return CommitProperties(app_transactions=[Transaction(app_id, batch_id)],
                                custom_metadata=metadata)

    def _held(self, path: str, app_id: str) -> Held | None:
        if not DeltaTable.is_deltatable(path):
            return None
        table = DeltaTable(path)
        batch = table.transaction_version(app_id)
        if batch is None:
            return None
        info: dict[str, Any] = next(
            (c for c in table.history(_HISTORY) if "txjoin.batch_id" in c), {})

        def number(key: str) -> int | None:
            value = info.get(key)
            return None if value is None else int(value)
        return Held(checkpoint_id=info.get("txjoin.checkpoint"), last_batch_id=batch,
                    frontier_commit_seq=number("txjoin.frontier_commit_seq"),
                    last_change_xid=number("txjoin.last_change_xid"))

    def held(self) -> Held | None:
        """Lineage of the current table's last txjoin commit (the sink's progress)."""
        return self._held(self.current_path, self.current_app_id)

    def last_applied_batch(self) -> int | None:
        """The batch id recorded with the last commit of the current table."""
        held = self.held()
        return None if held is None or held.last_batch_id < 0 else held.last_batch_id

    def _check_lineage(self, current_path: str, lineage: Lineage | None) -> None:
        if lineage is None or lineage.checkpoint_id in (None, self._checked):
            return
        held = self._held(current_path, self.current_app_id)
        if held is not None and held.checkpoint_id and held.checkpoint_id != lineage.checkpoint_id:
            raise LineageError(
                f"delta sink {self.where} holds {held.describe()}, not of this run's checkpoint "
                f"{short(lineage.checkpoint_id)}; nothing written; run with --rebuild, or "
                "restore the checkpoint the sink was written with")
        self._checked = lineage.checkpoint_id

    def write(self, batch_id: int, changes: pa.Table, lineage: Lineage | None = None) -> bool:
        """Append ``changes`` to the changelog, then merge them into the current table."""
        changes = conform(changes, self.schema, f"delta sink {self.table!r}", batch_id)
        changelog_path, current_path = self._targets()
        self._check_lineage(current_path, lineage)
        n = changes.num_rows
        last_xid = None if n == 0 else changes.column(XID)[n - 1].as_py()
        if last_xid is None:  # an empty batch keeps the last change's xid
            before = self._held(current_path, self.current_app_id)
            last_xid = None if before is None else before.last_change_xid
        wrote = False
        changelog = self._open(changelog_path, self.schema)
        if _applied(changelog, self.changelog_app_id) < batch_id:
            write_deltalake(changelog, changes, mode="append", commit_properties=self._commit(
                self.changelog_app_id, batch_id, lineage, last_xid))
            wrote = True

        current = self._open(current_path, current_schema(self.schema))
        if _applied(current, self.current_app_id) < batch_id:
            self._merge_current(current, self._commit(self.current_app_id, batch_id, lineage,
                                                      last_xid),
                                last_change_per_key(changes, self.key_columns))
            wrote = True
        return wrote

    def _merge_current(self, current: DeltaTable, commit: CommitProperties,
                       last: pa.Table) -> None:
        if last.num_rows == 0:
            # Still one commit, so the progress moves with the (empty) batch.
            write_deltalake(current, last.drop_columns([OP]), mode="append",
                            commit_properties=commit)
            return
        not_delete = f"source.{_quoted(OP)} <> '{OP_DELETE}'"
        (current.merge(last, _key_predicate(self.key_columns), source_alias="source",
                       target_alias="target", commit_properties=commit)
         # Clauses are tried in order: a delete wins over the update.
         .when_matched_delete(f"source.{_quoted(OP)} = '{OP_DELETE}'")
         .when_matched_update_all(predicate=not_delete, except_cols=[OP])
         .when_not_matched_insert_all(predicate=not_delete, except_cols=[OP])
         .execute())

    def begin_rebuild(self, checkpoint_id: str) -> None:
        """Write into fresh tables under ``<table>/_rebuild/`` from now on."""
        shutil.rmtree(self.rebuild_root, ignore_errors=True)
        self._rebuild_id, self._checked = checkpoint_id, None

    def finish_rebuild(self) -> None:
        """One overwrite commit per table with the rebuilt contents and lineage."""
        if self._rebuild_id is None:
            return
        shadow_changelog, shadow_current = self._targets()
        # The changelog first: as for batches, the current table is the progress.
        for path, shadow, app_id, schema in (
                (self.changelog_path, shadow_changelog, self.changelog_app_id, self.schema),
                (self.current_path, shadow_current, self.current_app_id,
                 current_schema(self.schema))):
            held = self._held(shadow, app_id)
            # Streamed batch by batch, so the rebuilt table need not fit in memory.
            rows: Any = (native_dataset(shadow).scanner().to_reader()
                         if DeltaTable.is_deltatable(shadow) else schema.empty_table())
            batch = -1 if held is None else held.last_batch_id  # -1: nothing applied yet
            lineage = Lineage(self._rebuild_id,
                              None if held is None else held.frontier_commit_seq)
            write_deltalake(path, rows, mode="overwrite", schema_mode="overwrite",
                            commit_properties=self._commit(
                                app_id, batch, lineage,
                                None if held is None else held.last_change_xid))
        shutil.rmtree(self.rebuild_root, ignore_errors=True)
        self._rebuild_id, self._checked = None, None

    def read_current(self) -> list[dict]:
        """Current rows ordered by key."""
        if not DeltaTable.is_deltatable(self.current_path):
            return []
        rows = read_table(self.current_path).to_pylist()
        return sort_rows(rows, self.key_columns)

    def read_changelog(self) -> list[dict]:
        """Every change ordered by ``_commit_seq`` (then key)."""
        if not DeltaTable.is_deltatable(self.changelog_path):
            return []
        rows = read_table(self.changelog_path).to_pylist()
        return sort_rows(rows, [COMMIT_SEQ, *self.key_columns])

    def close(self) -> None:
        """Nothing to release: every call opens the table's latest snapshot."""


class DeltaSparkSink:
    """The same two tables written by delta-spark, for sessions with the Delta extension.

    The writes carry ``txnAppId``/``txnVersion`` (the MERGE via the session's
    ``spark.databricks.delta.write.txnAppId``/``txnVersion`` confs), and as with
    ``DeltaSink`` the recorded versions are checked before each table is written.
    Untested here: delta-spark's jars cannot be resolved offline on our machines.
    """

    name = "delta"

    def __init__(self, spark: SparkSession, output_dir: str, table: str, job: str,
                 key_columns: list[str], schema: pa.Schema) -> None:
        extensions = spark.conf.get("spark.sql.extensions", "") or ""
        if DELTA_EXTENSION not in extensions:
            raise ConfigError(f"DeltaSparkSink needs {DELTA_EXTENSION} in spark.sql.extensions; "
                              "use DeltaSink (delta-rs) instead")
        check_changes_schema(schema, key_columns, f"delta sink for table {table!r}")
        self.spark, self.job, self.key_columns = spark, job, list(key_columns)
        self.where = str(Path(output_dir) / table)
        self.current_path = str(Path(output_dir) / table / "current")
        self.changelog_path = str(Path(output_dir) / table / "changelog")
        self.current_app_id = f"txjoin-{job}-current"
        self.changelog_app_id = f"txjoin-{job}-changelog"

    def held(self) -> Held | None:
        """The last batch id only: this writer records no lineage (treated as unrecorded)."""
        version = self._version(self.current_path, self.current_app_id)
        return None if version < 0 else Held(None, version, None, None)

    def begin_rebuild(self, checkpoint_id: str) -> None:
        """Not supported by this writer."""
        raise ConfigError("--rebuild needs the delta-rs writer; run it without the Delta "
                          "Spark extension, or delete the Delta tables and the checkpoint")

    def finish_rebuild(self) -> None:
        """Nothing to swap (see ``begin_rebuild``)."""

    def _version(self, path: str, app_id: str) -> int:
        # delta-rs reads the app transactions delta-spark recorded: one check for both.
        return _applied(DeltaTable(path), app_id) if DeltaTable.is_deltatable(path) else -1

    def last_applied_batch(self) -> int | None:
        """The batch id recorded with the last commit of the current table."""
        version = self._version(self.current_path, self.current_app_id)
        return None if version < 0 else version

    def write(self, batch_id: int, changes: pa.Table, lineage: Lineage | None = None) -> bool:
        """Append to the changelog, then MERGE into the current table; each skipped on replay."""
        from delta.tables import DeltaTable as SparkDeltaTable
        from pyspark.sql import functions as F
        from pyspark.sql.window import Window

        if self._version(self.current_path, self.current_app_id) >= batch_id:
            return False
        df = self.spark.createDataFrame(changes)
        if self._version(self.changelog_path, self.changelog_app_id) < batch_id:
            (df.write.format("delta").mode("append").option("txnAppId", self.changelog_app_id)
             .option("txnVersion", batch_id).save(self.changelog_path))
        order = Window.partitionBy(*self.key_columns).orderBy(F.col(COMMIT_SEQ).desc())
        last = df.withColumn("_rank", F.row_number().over(order)).where("_rank = 1").drop("_rank")
        if not DeltaTable.is_deltatable(self.current_path):
            last.limit(0).drop(OP).write.format("delta").save(self.current_path)
        self.spark.conf.set("spark.databricks.delta.write.txnAppId", self.current_app_id)
        self.spark.conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        try:
            on = " AND ".join(f"t.{_quoted(c)} = s.{_quoted(c)}" for c in self.key_columns)
            columns = [c for c in df.columns if c != OP]
            values: dict[str, Any] = {_quoted(c): f"s.{_quoted(c)}" for c in columns}
            (SparkDeltaTable.forPath(self.spark, self.current_path).alias("t")
             .merge(last.alias("s"), on)
             .whenMatchedDelete(f"s.{OP} = '{OP_DELETE}'")
             .whenMatchedUpdate(set=values)
             .whenNotMatchedInsert(condition=f"s.{OP} <> '{OP_DELETE}'", values=values)
             .execute())
        finally:
            self.spark.conf.unset("spark.databricks.delta.write.txnAppId")
            self.spark.conf.unset("spark.databricks.delta.write.txnVersion")
        return True

    def read_current(self) -> list[dict]:
        """Current rows ordered by key."""
        rows = self.spark.read.format("delta").load(self.current_path).collect()
        return sort_rows([r.asDict(recursive=True) for r in rows], self.key_columns)

    def read_changelog(self) -> list[dict]:
        """Every change ordered by ``_commit_seq`` (then key)."""
        rows = self.spark.read.format("delta").load(self.changelog_path).collect()
        return sort_rows([r.asDict(recursive=True) for r in rows],
                         [COMMIT_SEQ, *self.key_columns])

    def close(self) -> None:
        """Nothing to release; the Spark session belongs to the caller."""
