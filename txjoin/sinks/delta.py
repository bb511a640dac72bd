"""Delta Lake sink: ``<output_dir>/<table>/current`` (merged by key) and ``.../changelog``.

Written with delta-rs (``deltalake``) from Arrow, no JVM needed. Each micro-batch
is one commit per table, and each commit carries an app transaction
``(txjoin-<job>-changelog|current, batch_id)``. delta-rs records app-transaction
versions but does not enforce them, so ``write`` reads the recorded version
first and skips a table already at ``>= batch_id``. The changelog is written
before the current table, so the current table's version is the sink's progress:
after a crash between the two commits the replay skips the changelog and
applies the current table only.

``DeltaSparkSink`` does the same through delta-spark when the Spark session has
the Delta extension.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from txjoin.errors import ConfigError
from txjoin.sinks import (
    COMMIT_SEQ,
    OP,
    OP_DELETE,
    check_changes_schema,
    conform,
    current_schema,
    last_change_per_key,
    sort_rows,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"


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
        self.current_path = str(Path(output_dir) / table / "current")
        self.changelog_path = str(Path(output_dir) / table / "changelog")
        self.current_app_id = f"txjoin-{job}-current"
        self.changelog_app_id = f"txjoin-{job}-changelog"

    def _open(self, path: str, schema: pa.Schema) -> DeltaTable:
        if not DeltaTable.is_deltatable(path):
            # An empty first commit: it holds no rows, so readers still see whole batches.
            return DeltaTable.create(path, schema, mode="ignore")
        return DeltaTable(path)

    def _commit(self, app_id: str, batch_id: int) -> CommitProperties:
        return CommitProperties(
            app_transactions=[Transaction(app_id, batch_id)],
            custom_metadata={"txjoin.job": self.job, "txjoin.batch_id": batch_id},
        )

    def last_applied_batch(self) -> int | None:
        """The batch id recorded with the last commit of the current table."""
        if not DeltaTable.is_deltatable(self.current_path):
            return None
        return DeltaTable(self.current_path).transaction_version(self.current_app_id)

    def write(self, batch_id: int, changes: pa.Table) -> bool:
        """Append ``changes`` to the changelog, then merge them into the current table."""
        changes = conform(changes, self.schema, f"delta sink {self.table!r}", batch_id)
        wrote = False
        changelog = self._open(self.changelog_path, self.schema)
        if _applied(changelog, self.changelog_app_id) < batch_id:
            write_deltalake(changelog, changes, mode="append",
                            commit_properties=self._commit(self.changelog_app_id, batch_id))
            wrote = True

        current = self._open(self.current_path, current_schema(self.schema))
        if _applied(current, self.current_app_id) < batch_id:
            self._merge_current(current, batch_id, last_change_per_key(changes, self.key_columns))
            wrote = True
        return wrote

    def _merge_current(self, current: DeltaTable, batch_id: int, last: pa.Table) -> None:
        commit = self._commit(self.current_app_id, batch_id)
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

    def read_current(self) -> list[dict]:
        """Current rows ordered by key."""
        if not DeltaTable.is_deltatable(self.current_path):
            return []
        rows = DeltaTable(self.current_path).to_pyarrow_table().to_pylist()
        return sort_rows(rows, self.key_columns)

    def read_changelog(self) -> list[dict]:
        """Every change ordered by ``_commit_seq`` (then key)."""
        if not DeltaTable.is_deltatable(self.changelog_path):
            return []
        rows = DeltaTable(self.changelog_path).to_pyarrow_table().to_pylist()
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
        self.current_path = str(Path(output_dir) / table / "current")
        self.changelog_path = str(Path(output_dir) / table / "changelog")
        self.current_app_id = f"txjoin-{job}-current"
        self.changelog_app_id = f"txjoin-{job}-changelog"

    def _version(self, path: str, app_id: str) -> int:
        # delta-rs reads the app transactions delta-spark recorded: one check for both.
        return _applied(DeltaTable(path), app_id) if DeltaTable.is_deltatable(path) else -1

    def last_applied_batch(self) -> int | None:
        """The batch id recorded with the last commit of the current table."""
        version = self._version(self.current_path, self.current_app_id)
        return None if version < 0 else version

    def write(self, batch_id: int, changes: pa.Table) -> bool:
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
