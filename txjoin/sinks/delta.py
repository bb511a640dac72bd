"""Delta Lake sink: ``<output_dir>/<table>/current`` (merged by key) and ``.../changelog``.

Written by delta-spark: each micro-batch's changes become a Spark DataFrame
(from the batch's Arrow table) that the executors append to the changelog and
MERGE into the current table (by key; a delete removes the row), one commit per
table. Each commit carries an app transaction ``(txnAppId, txnVersion=batch_id)``,
which Delta checks inside the commit: a batch already recorded is skipped, not
applied twice. The append sets them as writer options; MERGE takes them from the
session confs ``spark.databricks.delta.write.txnAppId``/``txnVersion``, set around
it on a session of the sink's own (``SparkSession.newSession``: its own SQL
confs, so no other writer in the process picks them up). ``write`` also reads
the recorded version first, to skip a replay without starting a Spark job and to
report it. The changelog is written before the current table, so the current
table's version is the sink's progress: after a crash between the two commits
the replay skips the changelog and applies the current table only. A batch with
no changes commits only to the current table (the progress); the changelog
records the batches that appended to it.

The app id names the checkpoint (``txjoin-<job>-current-<checkpoint id>``):
Spark's batch ids restart at 0 in a new checkpoint, and Delta would skip every
batch id at or below one recorded under the same app id. Every commit also
carries the run's lineage as JSON in its ``userMetadata`` (``txjoin.checkpoint``,
``txjoin.frontier_commit_seq``, ``txjoin.last_change_xid``, ``txjoin.batch_id``),
read back from the table's history by ``held``, which also reads the same keys
from the commit info of tables written by txjoin's earlier delta-rs writer.

A rebuild writes both tables under ``<table>/_rebuild/`` and then replaces each
table's contents with one overwrite commit (a new table version: readers see the
old state or the rebuilt one, never an empty or partial table); Spark streams
the rebuilt table into that commit.

Reading (``held``, ``read_current``, ``read_changelog``) needs no Spark: it goes
through delta-rs (``deltalake``), as ``txjoin verify`` does; a sink opened
without a Spark session can only be read.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import DeltaTable

from txjoin import crashpoints
from txjoin.delta_tables import read_table
from txjoin.errors import ConfigError, LineageError
from txjoin.sinks import (
    COMMIT_SEQ,
    OP,
    OP_DELETE,
    XID,
    Upkeep,
    check_changes_schema,
    conform,
    current_schema,
    last_change_per_key,
    sort_rows,
)
from txjoin.sinks.lineage import Held, Lineage, short

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

_HISTORY = 50  # commits searched for the last txjoin commit (others: OPTIMIZE, VACUUM...)
_TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
CHECKPOINT_INTERVAL = 100
"""Commits between two Delta log checkpoints of the tables the sink creates."""
_CHECKPOINT_INTERVAL = "delta.checkpointInterval"
_LOG_RETENTION = "delta.logRetentionDuration"
_FILE_RETENTION = "delta.deletedFileRetentionDuration"


def _quoted(column: str) -> str:
    # Backticks let any column name through Spark's SQL expression parser.
    return "`" + column.replace("`", "``") + "`"


def _stored_type(t: pa.DataType) -> pa.DataType:
    """The Delta type of an output type: Delta has no time-of-day and no interval type, so a
    ``time``/``timetz`` is stored as its ISO text (``10:15:30.123456``, timetz in UTC: in
    this fixed form text order is time order) and an ``interval`` as its microseconds (as
    Debezium sends it), in arrays and collected rows too."""
    if pa.types.is_time(t):
        return pa.string()
    if pa.types.is_duration(t):
        return pa.int64()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(t.value_field.with_type(_stored_type(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_stored_type(f.type)) for f in t])
    return t


def stored_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` as the Delta tables store it (see :func:`_stored_type`)."""
    return pa.schema([f.with_type(_stored_type(f.type)) for f in schema],
                     metadata=schema.metadata)


def _spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema of ``schema``, nullability included (key columns stay NOT NULL)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def _txjoin_commit(table: DeltaTable) -> dict[str, Any] | None:
    """The lineage of the table's last txjoin commit, ``None`` if none is in recent history.

    delta-spark commits hold it as JSON in ``userMetadata``; the delta-rs writer
    txjoin had before put the same keys straight into the commit info.
    """
    for commit in table.history(_HISTORY):
        info = commit
        if commit.get("userMetadata"):
            try:
                info = json.loads(commit["userMetadata"])
            except ValueError:
                continue  # someone else's metadata
        if isinstance(info, dict) and "txjoin.batch_id" in info:
            return info
    return None


def _data_files(path: str) -> int:
    """Parquet files under a table's folder: the live ones and those only old versions use."""
    return sum(1 for f in Path(path).rglob("*.parquet") if "_delta_log" not in f.parts)


def _number(info: dict[str, Any], key: str) -> int | None:
    value = info.get(key)
    return None if value is None else int(value)


class DeltaSink:
    """Delta tables written by delta-spark; see the module docstring for the protocol."""

    name = "delta"

    def __init__(self, output_dir: str, table: str, job: str, key_columns: list[str],
                 schema: pa.Schema, spark: SparkSession | None = None) -> None:
        check_changes_schema(schema, key_columns, f"delta sink for table {table!r}")
        self.table, self.job = table, job
        self.key_columns = list(key_columns)
        self.schema = schema
        self.stored = stored_schema(schema)
        # Absolute: delta-spark reads a relative location such as ".txjoin/..." as a name.
        self.root = Path(output_dir).absolute() / table
        self.where = str(self.root)
        self.current_path = str(self.root / "current")
        self.changelog_path = str(self.root / "changelog")
        # Its own session: the MERGE's txn and metadata confs stay out of other writers' way.
        self._spark = None if spark is None else spark.newSession()
        if self._spark is not None:
            # Looking up an app transaction (and MERGE's file list) rebuilds the table's
            # state from its log in spark.databricks.delta.snapshotPartitions tasks, 50 by
            # default: measured here, a 25k-row append with txnAppId took 16-46 s with 50
            # and ~5 s with 1 (2 loaded cores). A sink's log is small: one task per core.
            parallelism = str(self._spark.sparkContext.defaultParallelism)
            self._spark.conf.set("spark.databricks.delta.snapshotPartitions", parallelism)
            # VACUUM lists the table's folders in one task per folder up to this many
            # (10,000 by default): measured 20 s per VACUUM of a small table, 1.5 s with 2.
            self._spark.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism",
                                 parallelism)
            # A batch's writes are small jobs; measured per 200-change batch here (2 cores):
            # 5.5 s as configured by default, ~2 s with these. MERGE's source is an in-memory
            # frame of the batch (deterministic: no need to materialise it again); the CRC
            # file Delta writes after each commit only helps validate the log, and computing
            # it costs a state reconstruction per commit; adaptive execution re-plans jobs
            # of a few hundred rows for nothing. File statistics stay on: MERGE prunes
            # files of a large current table with them.
            # A log checkpoint (every delta.checkpointInterval commits, 10 by default)
            # rebuilds the table's state and writes it out inside the commit that reaches
            # it: measured here it doubled that batch's commit (1.4 s -> 3.7 s), every tenth
            # batch. Every 100th for the tables the sink creates: the steady commit also got
            # cheaper (mean 1.52 s -> 1.27 s over 90 commits of 20 changes; the log a commit
            # reads since the last checkpoint stays small).
            self._spark.conf.set("spark.databricks.delta.properties.defaults.checkpointInterval",
                                 str(CHECKPOINT_INTERVAL))  # and maintain() moves older ones
            for key, value in (("spark.databricks.delta.merge.materializeSource", "none"),
                               ("spark.databricks.delta.writeChecksumFile.enabled", "false"),
                               ("spark.sql.adaptive.enabled", "false")):
                self._spark.conf.set(key, value)
        self._rebuild_id: str | None = None
        self._checked: str | None = None  # checkpoint id already compared with the tables

    def app_id(self, kind: str, checkpoint_id: str | None) -> str:
        """The app transaction id of one table (``changelog``/``current``) for a checkpoint."""
        base = f"txjoin-{self.job}-{kind}"
        return base if checkpoint_id is None else f"{base}-{checkpoint_id}"

    @property
    def rebuild_root(self) -> Path:
        return self.root / "_rebuild"

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            raise ConfigError(f"delta sink {self.where} was opened without a Spark session, "
                              "for reading only; pass the session to write it")
        return self._spark

    def _targets(self) -> tuple[str, str]:
        """(changelog, current) paths written now: the shadow ones while rebuilding."""
        if self._rebuild_id is None:
            return self.changelog_path, self.current_path
        return str(self.rebuild_root / "changelog"), str(self.rebuild_root / "current")

    def _held(self, path: str, kind: str) -> Held | None:
        if not DeltaTable.is_deltatable(path):
            return None
        table = DeltaTable(path)
        info = _txjoin_commit(table)
        if info is None:  # written before lineage: only the app transaction tells the batch
            batch = table.transaction_version(self.app_id(kind, None))
            return None if batch is None else Held(None, batch, None, None)
        checkpoint = info.get("txjoin.checkpoint")
        recorded = table.transaction_version(self.app_id(kind, checkpoint))
        # No app transaction: a rebuild from an empty source (-1), or a delta-rs commit.
        batch = int(info["txjoin.batch_id"]) if recorded is None else recorded
        return Held(checkpoint_id=checkpoint, last_batch_id=batch,
                    frontier_commit_seq=_number(info, "txjoin.frontier_commit_seq"),
                    last_change_xid=_number(info, "txjoin.last_change_xid"))

    def _applied(self, path: str, kind: str, checkpoint_id: str | None) -> int:
        """Last batch of ``checkpoint_id`` in the table at ``path``; -1 if none."""
        if not DeltaTable.is_deltatable(path):
            return -1
        recorded = DeltaTable(path).transaction_version(self.app_id(kind, checkpoint_id))
        if recorded is not None:
            return recorded
        # Not under this app id: a rebuilt table, or one the delta-rs writer recorded.
        held = self._held(path, kind)
        return held.last_batch_id if held is not None and held.checkpoint_id == checkpoint_id \
            else -1

    def held(self) -> Held | None:
        """Lineage of the current table's last txjoin commit (the sink's progress)."""
        return self._held(self.current_path, "current")

    def last_applied_batch(self) -> int | None:
        """The batch id recorded with the last commit of the current table."""
        held = self.held()
        return None if held is None or held.last_batch_id < 0 else held.last_batch_id

    def _check_lineage(self, current_path: str, lineage: Lineage | None) -> None:
        if lineage is None or lineage.checkpoint_id in (None, self._checked):
            return
        held = self._held(current_path, "current")
        if held is not None and held.checkpoint_id and held.checkpoint_id != lineage.checkpoint_id:
            raise LineageError(
                f"delta sink {self.where} holds {held.describe()}, not of this run's checkpoint "
                f"{short(lineage.checkpoint_id)}; nothing written; run with --rebuild, or "
                "restore the checkpoint the sink was written with")
        self._checked = lineage.checkpoint_id

    def _metadata(self, batch_id: int, lineage: Lineage | None, last_xid: int | None) -> str:
        metadata: dict[str, Any] = {"txjoin.job": self.job, "txjoin.batch_id": batch_id}
        if lineage is not None and lineage.checkpoint_id is not None:
            metadata["txjoin.checkpoint"] = lineage.checkpoint_id
        if lineage is not None and lineage.frontier_commit_seq is not None:
            metadata["txjoin.frontier_commit_seq"] = lineage.frontier_commit_seq
        if last_xid is not None:
            metadata["txjoin.last_change_xid"] = last_xid
        return json.dumps(metadata, sort_keys=True)

    def _frame(self, rows: pa.Table) -> DataFrame:
        return self.spark.createDataFrame(rows, schema=_spark_schema(rows.schema))

    def _create(self, path: str, schema: pa.Schema) -> None:
        """An empty first commit with the declared types: it holds no rows, so readers
        still see whole batches."""
        if DeltaTable.is_deltatable(path):
            return
        log = Path(path) / "_delta_log"
        if log.is_dir() and not any(log.glob("[0-9]*.json")) and \
                not any(log.glob("*.checkpoint*")):
            # A writer stopped before the table's first commit left an empty log, which
            # delta-spark reads as a table that "doesn't exist" and will not create: no
            # commit means no table, so the empty log goes.
            shutil.rmtree(log)
        from delta.tables import DeltaTable as SparkDeltaTable

        (SparkDeltaTable.createIfNotExists(self.spark).location(path)
         .addColumns(_spark_schema(schema)).execute())

    def _save(self, frame: DataFrame, path: str, mode: str, app_id: str, batch_id: int,
              metadata: str) -> None:
        """One commit of ``frame`` to ``path``, recording ``(app_id, batch_id)`` when >= 0."""
        writer = frame.write.format("delta").mode(mode).option("userMetadata", metadata)
        if mode == "overwrite":  # a rebuild may follow a change of the job's columns
            writer = writer.option("overwriteSchema", "true")
        if batch_id >= 0:
            writer = writer.option("txnAppId", app_id).option("txnVersion", batch_id)
        writer.save(path)

    def write(self, batch_id: int, changes: pa.Table, lineage: Lineage | None = None) -> bool:
        """Append ``changes`` to the changelog, then merge them into the current table."""
        changes = conform(changes, self.schema, f"delta sink {self.table!r}",
                          batch_id).cast(self.stored)
        changelog_path, current_path = self._targets()
        self._check_lineage(current_path, lineage)
        checkpoint = None if lineage is None else lineage.checkpoint_id
        n = changes.num_rows
        last_xid = None if n == 0 else changes.column(XID)[n - 1].as_py()
        if last_xid is None:  # an empty batch keeps the last change's xid
            before = self._held(current_path, "current")
            last_xid = None if before is None else before.last_change_xid
        metadata = self._metadata(batch_id, lineage, last_xid)
        wrote = False
        # An empty batch appends nothing to the changelog, so it makes no changelog commit
        # (during a catch-up most batches only buffer; an empty batch's write took 1.0 s
        # with the changelog's commit and its app transaction lookup, 0.6 s without, p50
        # of 30 here); the current table's commit still moves the sink's progress.
        if n > 0 and self._applied(changelog_path, "changelog", checkpoint) < batch_id:
            self._create(changelog_path, self.stored)
            self._save(self._frame(changes), changelog_path, "append",
                       self.app_id("changelog", checkpoint), batch_id, metadata)
            wrote = True
            crashpoints.reached(crashpoints.DELTA_BETWEEN_TABLES, batch_id)  # tests only
        if self._applied(current_path, "current", checkpoint) < batch_id:
            self._create(current_path, current_schema(self.stored))
            self._merge_current(current_path, self.app_id("current", checkpoint), batch_id,
                                metadata, last_change_per_key(changes, self.key_columns))
            wrote = True
        return wrote

    def _merge_current(self, path: str, app_id: str, batch_id: int, metadata: str,
                       last: pa.Table) -> None:
        if last.num_rows == 0:
            # Still one commit, so the progress moves with the (empty) batch.
            self._save(self._frame(last.drop_columns([OP])), path, "append", app_id, batch_id,
                       metadata)
            return
        from delta.tables import DeltaTable as SparkDeltaTable

        on = " AND ".join(f"t.{_quoted(c)} = s.{_quoted(c)}" for c in self.key_columns)
        deleted = f"s.{_quoted(OP)} = '{OP_DELETE}'"
        merge = (SparkDeltaTable.forPath(self.spark, path).alias("t")
                 .merge(self._frame(last).alias("s"), on)
                 # Clauses are tried in order: a delete wins over the update. The
                 # source's _op column has no target column: `*` leaves it out.
                 .whenMatchedDelete(deleted)
                 .whenMatchedUpdateAll()
                 .whenNotMatchedInsertAll(f"NOT ({deleted})"))
        conf = self.spark.conf
        conf.set(_TXN_APP_ID, app_id)
        conf.set(_TXN_VERSION, str(batch_id))
        conf.set(_USER_METADATA, metadata)
        try:
            merge.execute()
        finally:
            for key in (_TXN_APP_ID, _TXN_VERSION, _USER_METADATA):
                conf.unset(key)

    def maintain(self, retention_hours: float | None = None) -> list[Upkeep]:
        """Compact both tables' small files, then (``retention_hours``) VACUUM them.

        Compaction (delta-spark's OPTIMIZE) rewrites small files into larger ones in one
        commit that changes no row (``dataChange=false``): a reader sees the same state
        before and after, and every earlier version stays readable. VACUUM deletes the
        files no version of the last ``retention_hours`` hours needs: time travel keeps
        working inside the retention, not beyond it. Delta refuses a retention under its
        7-day safety floor (a reader running longer could lose files); a retention the
        user sets explicitly lifts it for this sink's session. The log checkpoints and
        expires itself as it is written (``delta.checkpointInterval``, every
        ``CHECKPOINT_INTERVAL`` commits, set on older tables here;
        ``delta.logRetentionDuration``, 30 days by default): with ``retention_hours`` the
        log keeps the same window as the data files (set once, in a table property), so
        time travel reaches exactly as far back as the retention. Delta expires log
        entries at a checkpoint, to the start of a day: the log is bounded by a day's
        commits plus the retention, not by the retention alone. Run between batches, never
        beside a writer: OPTIMIZE and a concurrent MERGE would conflict.
        """
        from delta.tables import DeltaTable as SparkDeltaTable

        if retention_hours is not None and retention_hours < 0:
            raise ConfigError(f"a VACUUM retention must be >= 0 hours, got {retention_hours}")
        if retention_hours is not None:
            self.spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled",
                                "false")
        wanted = {_CHECKPOINT_INTERVAL: str(CHECKPOINT_INTERVAL)}
        if retention_hours is not None:
            # The log keeps the data files' window, and so does the deleted-file retention
            # (Delta wants the log to keep at least as long).
            keep = f"interval {max(1, round(retention_hours * 3600))} seconds"
            wanted |= {_LOG_RETENTION: keep, _FILE_RETENTION: keep}
        done = []
        for path in (self.changelog_path, self.current_path):
            if not DeltaTable.is_deltatable(path):
                continue
            before = time.monotonic()
            existing = DeltaTable(path)
            files_before = len(existing.file_uris())
            on_disk_before = _data_files(path)
            self._set_properties(path, existing.metadata().configuration, wanted)
            table = SparkDeltaTable.forPath(self.spark, path)
            table.optimize().executeCompaction()
            if retention_hours is not None:
                table.vacuum(retention_hours)
            done.append(Upkeep(path, files_before, len(DeltaTable(path).file_uris()),
                               on_disk_before, _data_files(path), time.monotonic() - before))
        return done

    def _set_properties(self, path: str, config: dict[str, str],
                        wanted: dict[str, str]) -> None:
        """Table properties ``wanted`` on the table at ``path`` (whose properties are
        ``config``), in one metadata commit with no row change, unless it has them already;
        tables created before a setting came (``CHECKPOINT_INTERVAL``) get it at their next
        upkeep."""
        if all(config.get(key) == value for key, value in wanted.items()):
            return
        assignments = ", ".join(f"'{key}' = '{value}'" for key, value in wanted.items())
        self.spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({assignments})")

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
        for kind, path, shadow, schema in (
                ("changelog", self.changelog_path, shadow_changelog, self.stored),
                ("current", self.current_path, shadow_current, current_schema(self.stored))):
            held = self._held(shadow, kind)
            rows = (self.spark.read.format("delta").load(shadow)
                    if DeltaTable.is_deltatable(shadow) else self._frame(schema.empty_table()))
            batch = -1 if held is None else held.last_batch_id  # -1: nothing applied yet
            lineage = Lineage(self._rebuild_id,
                              None if held is None else held.frontier_commit_seq)
            self._save(rows, path, "overwrite", self.app_id(kind, self._rebuild_id), batch,
                       self._metadata(batch, lineage,
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
        """Nothing to release: the Spark session belongs to the caller."""
