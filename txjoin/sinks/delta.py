"""Delta Lake sink: ``<output_dir>/<table>/current`` (merged by key) and ``.../changelog``.

Written in group commits (``txjoin.sinks.handoff``) through delta-spark's
transaction: the Spark tasks that hold a micro-batch's output write its data
files (``txjoin.sinks.delta_stage``: per task, its changes for the changelog and
its last change per key), the hand-off records what they wrote, and a group
commit appends the changelog files of the micro-batches handed off since the
last commit (linked into the table's folder, their add actions in one commit:
every change, in commit order) and applies the last change per key over the
whole range, read from the tasks' files, to the current table (a delete removes
the row), one commit per table. The driver never holds the changelog's rows, nor the
current table's: its data files are clustered by key (``txjoin.sinks.delta_current``), and
a group commit rewrites, one file at a time, only the files that hold a changed key (or
take a new one), then commits their replacement in one commit. A table delta-spark's
transaction cannot be written to file by file (altered by hand) is MERGEd. A commit
always ends at a micro-batch boundary, and carries its lineage as JSON in its
``userMetadata`` (``txjoin.checkpoint``, ``txjoin.batch_id`` (the last batch),
``txjoin.first_batch_id``, ``txjoin.frontier_commit_seq``,
``txjoin.last_change_xid``): what makes a replay idempotent. The sink reads
each table's last txjoin commit from its recent history once (``held``, also
the keys of tables written by txjoin's earlier delta-rs writer) and keeps it as
it commits, so checking costs nothing per commit and does not grow with the
table's history; Delta's app transactions (``txnAppId``/``txnVersion``) are not
used: looking one up rebuilds the table's whole log state at every commit
(DESIGN.md 2.2). Tables written before lineage are read by their app
transaction. The changelog is written before the current table, so the current
table's last commit is the sink's progress: after a crash between the two
commits the replay skips the changelog's batches and applies the current
table's. A range without changes commits only to the current table (the
progress); the changelog's commits are those that appended to it.

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
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from txjoin import crashpoints
from txjoin.delta_tables import read_table
from txjoin.errors import ConfigError, LineageError
from txjoin.sinks import (
    COMMIT_SEQ,
    OP,
    OP_DELETE,
    READ_BATCH_ROWS,
    StagedPart,
    Upkeep,
    check_changes_schema,
    current_schema,
    delta_current,
    delta_stage,
    sort_rows,
)
from txjoin.sinks.columns import ArrowColumns
from txjoin.sinks.delta_commit import (
    CHECKPOINT_INTERVAL_PROPERTY,
    SPARK_CHECKPOINTS_OFF,
    DeltaCommitter,
    checkpoint_if_due,
)
from txjoin.sinks.delta_stage import CHANGELOG, CURRENT, STAGED_DIR, DeltaStage
from txjoin.sinks.handoff import Parcel, still_needed
from txjoin.sinks.lineage import Held, Lineage, short

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

COMMIT_POOL = "txjoin-delta-commit"
"""The scheduler pool of the group commit's Spark jobs: with Spark's FAIR scheduler
(txjoin's sessions set it: ``session.default_conf``) a commit rewriting many files takes
turns with the stream's micro-batches for the cores instead of going first (FIFO); a session
of the user's in FIFO mode ignores it."""
FILES_PER_TASK = 8
"""Files a task of the group commit rewrites (about 0.06 s of CPU each, at 100k rows): a
PySpark task costs ~0.04 s of CPU of its own (measured: 100 files in 100 tasks, 10.1 s of the
workers' CPU, 5.9 s of it rewriting), and a task of a few files still gives the stream's
batches their turn (``COMMIT_POOL``) within a second."""
DRIVER_MAX_ROWS = 10_000
"""Rows (files' and changes') of a group commit's rewrite up to which the driver rewrites
the files itself (~25 ms of CPU): a Spark job costs more than that in time. Above it the
tasks do, one file as well as many: the driver only commits."""
_HISTORY = 50  # commits searched for the last txjoin commit (others: OPTIMIZE, VACUUM...)
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
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


def _position(held: Held | None) -> tuple[str | None, int | None]:
    return (None, None) if held is None else (held.checkpoint_id, held.last_batch_id)


def _after(last: Parcel, xid: int | None) -> Held:
    """What a table holds after a commit that ended with ``last``."""
    return Held(last.lineage.checkpoint_id, last.batch_id, last.lineage.frontier_commit_seq, xid)


def _number(info: dict[str, Any], key: str) -> int | None:
    value = info.get(key)
    return None if value is None else int(value)


def sink_session(spark: SparkSession) -> SparkSession:
    """A new session of ``spark`` (the MERGE's txn and metadata confs stay out of other
    writers' way) with the settings the Delta sink writes and reads its tables with."""
    session = spark.newSession()
    # A state reconstruction (MERGE's file list, a log checkpoint) reads the log in
    # spark.databricks.delta.snapshotPartitions tasks, 50 by default: measured
    # here, a 25k-row append that looked up an app transaction took 16-46 s with 50
    # and ~5 s with 1 (2 loaded cores). A sink's log is small: one task per core.
    parallelism = str(session.sparkContext.defaultParallelism)
    session.conf.set("spark.databricks.delta.snapshotPartitions", parallelism)
    # VACUUM lists the table's folders in one task per folder up to this many
    # (10,000 by default): measured 20 s per VACUUM of a small table, 1.5 s with 2.
    session.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", parallelism)
    # A commit's writes are small jobs: MERGE's source is an in-memory frame of
    # the batches (deterministic: no need to materialise it again); adaptive
    # execution re-plans jobs of a few hundred rows for nothing. File statistics
    # stay on: MERGE prunes files of a large current table with them. Checksum
    # files stay on (Delta's default): without them the commit after another
    # writer's (OPTIMIZE) rebuilds the whole log state (DESIGN.md 2.2).
    # delta-spark's log checkpoint (every delta.checkpointInterval commits, 10 by
    # default) rebuilds the table's state and writes it out with Spark jobs inside the
    # commit that reaches it: 1.4 s -> 3.7 s for that commit on an idle machine, 10 s
    # beside a stream. The tables the sink creates never reach one; the sink writes
    # their checkpoints with delta-rs every CHECKPOINT_INTERVAL commits
    # (delta_commit.checkpoint_if_due), and maintain() moves older tables to that.
    session.conf.set("spark.databricks.delta.properties.defaults.checkpointInterval",
                     SPARK_CHECKPOINTS_OFF)
    # A range without changes still commits (its lineage is the sink's progress):
    # Delta drops a commit with no action unless told not to (the app transaction
    # the sink no longer records used to be that action).
    for key, value in (("spark.databricks.delta.merge.materializeSource", "none"),
                       ("spark.databricks.delta.skipRecordingEmptyCommits", "false"),
                       ("spark.sql.adaptive.enabled", "false")):
        session.conf.set(key, value)
    return session


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
        self._spark = None if spark is None else sink_session(spark)
        # Commits of Arrow rows without a Spark job, to tables plain enough (delta_commit).
        self._committer: DeltaCommitter | None = None
        self._rebuild_id: str | None = None
        self._checked: str | None = None  # checkpoint id already compared with the tables
        self._known: dict[str, Held | None] = {}  # table path -> what it holds (_progress)
        # Staged batches (stage(), foreachBatch's thread): (the current table's path, the
        # checkpoint) -> the batch it held when the first stage looked (None: none of it).
        self._stage_floor: dict[tuple[str, str | None], int | None] = {}
        self._stage_lock = threading.Lock()
        self._jvm_threads: Any = None  # the driver JVM's ThreadMXBean (thread_cpu)

    def thread_cpu(self) -> float:
        """CPU seconds the calling thread has spent: its own, plus those of the driver JVM's
        thread that serves it (py4j pins one JVM thread to each Python thread, and
        delta-spark's commit runs there). Its Spark tasks' work is not in it."""
        cpu = time.thread_time()
        if self._spark is not None:
            if self._jvm_threads is None:
                management = self._spark.sparkContext._jvm.java.lang.management  # type: ignore[union-attr]
                self._jvm_threads = management.ManagementFactory.getThreadMXBean()
            cpu += self._jvm_threads.getCurrentThreadCpuTime() / 1e9
        return cpu

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

    def _staged_root(self) -> str:
        """Where the tasks write the batches' files for the tables written now."""
        base = self.root if self._rebuild_id is None else self.rebuild_root
        return str(base / STAGED_DIR)

    def stage(self, batch_id: int, checkpoint_id: str | None) -> DeltaStage | None:
        """Where the tasks write micro-batch ``batch_id``'s files (the tables created first,
        empty); ``None`` when the current table (the sink's progress) holds the batch
        already (Spark re-ran it after a crash the hand-off's recovery committed). A sink
        of another checkpoint raises ``LineageError``."""
        changelog_path, current_path = self._targets()
        key = (current_path, checkpoint_id)
        with self._stage_lock:
            if key not in self._stage_floor:
                self._check_lineage(current_path, Lineage(checkpoint_id))
                self._create(changelog_path, self.stored)
                self._create(current_path, current_schema(self.stored))
                held = self._held(current_path, "current")
                self._stage_floor[key] = (
                    held.last_batch_id if held is not None
                    and held.checkpoint_id == checkpoint_id else None)
            floor = self._stage_floor[key]
        if floor is not None and batch_id <= floor:
            return None
        return DeltaStage(self._staged_root(), checkpoint_id, batch_id, self.table, self.schema,
                          self.stored, tuple(self.key_columns))

    def _held(self, path: str, kind: str) -> Held | None:
        if not DeltaTable.is_deltatable(path):
            return None
        table = DeltaTable(path)
        info = _txjoin_commit(table)
        if info is None:  # written before lineage: only the app transaction tells the batch
            batch = table.transaction_version(self.app_id(kind, None))
            return None if batch is None else Held(None, batch, None, None)
        return Held(checkpoint_id=info.get("txjoin.checkpoint"),
                    last_batch_id=int(info["txjoin.batch_id"]),
                    frontier_commit_seq=_number(info, "txjoin.frontier_commit_seq"),
                    last_change_xid=_number(info, "txjoin.last_change_xid"),
                    job=info.get("txjoin.job"))

    def _progress(self, path: str, kind: str) -> Held | None:
        """What the table at ``path`` holds: read from its history once, then kept as this
        sink commits (the only writer), so a commit's check costs nothing per commit."""
        if path not in self._known:
            self._known[path] = self._held(path, kind)
        return self._known[path]

    def held(self) -> Held | None:
        """Lineage of the current table's last txjoin commit (the sink's progress)."""
        return self._held(self.current_path, "current")

    def other_owner(self) -> tuple[str, str] | None:
        """The job named by the current table's last txjoin commit, when it is not this one."""
        held = self.held()
        if held is None or held.job in (None, self.job):
            return None
        return str(held.job), f"remove {self.root}"

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

    def _metadata(self, batch_id: int, lineage: Lineage | None, last_xid: int | None,
                  first_batch: int | None = None) -> str:
        metadata: dict[str, Any] = {"txjoin.job": self.job, "txjoin.batch_id": batch_id}
        if first_batch is not None:
            metadata["txjoin.first_batch_id"] = first_batch
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

    def _save(self, frame: DataFrame, path: str, mode: str, metadata: str,
              new_schema: bool = False) -> None:
        """One commit of ``frame`` to ``path`` with ``metadata`` (the lineage); ``new_schema``
        (an overwrite): the table takes the frame's schema (a rebuild may follow a change of
        the job's columns), else it keeps its own (key columns NOT NULL among them)."""
        writer = (frame.write.format("delta").mode(mode).option("userMetadata", metadata)
                  .option("maxRecordsPerFile", delta_current.CLUSTER_FILE_ROWS))
        if new_schema:
            writer = writer.option("overwriteSchema", "true")
        writer.save(path)

    def _commit_rows(self, path: str, rows: pa.Table, schema: pa.Schema, mode: str,
                     metadata: str) -> None:
        """One commit of ``rows`` (of the table's ``schema``; ``mode`` append or overwrite)
        to the table at ``path``: through delta-spark's transaction without a Spark job
        when the table is plain (``txjoin.sinks.delta_commit``), else a DataFrame write."""
        if self._committer is None:
            self._committer = DeltaCommitter(self.spark)
        rows = rows.cast(schema)
        version = self._committer.commit(path, rows, _spark_schema(schema).jsonValue(),
                                         metadata, overwrite=mode == "overwrite")
        if version is None:
            self._save(self._frame(rows), path, mode, metadata)
        checkpoint_if_due(path, version)

    def write(self, batch_id: int, changes: pa.Table, lineage: Lineage | None = None) -> bool:
        """Append ``changes`` to the changelog, then merge them into the current table (one
        batch as its own group commit); ``False`` if both tables held it already."""
        parcel = Parcel(batch_id, changes, lineage or Lineage(None), time.time())
        return bool(self.write_group([parcel]))

    def write_group(self, parcels: Sequence[Parcel]) -> dict[str, float]:
        """One commit per table for the micro-batches ``parcels`` (in batch order): the
        changelog appends all their changes in commit order, the current table merges the
        last change per key over the whole range. Each table skips the batches its last
        txjoin commit covers; the seconds of each table committed (none: a replay)."""
        if not parcels:
            return {}
        last = parcels[-1]
        changelog_path, current_path = self._targets()
        self._check_lineage(current_path, last.lineage)
        root = self._staged_root()
        seconds: dict[str, float] = {}
        try:
            # The changelog first: the current table's commit is the sink's progress.
            # A parcel of rows (``write``, an older hand-off) is written as files once.
            needed = {p.batch_id for kind, path in (("changelog", changelog_path),
                                                    ("current", current_path))
                      for p in still_needed(parcels, *_position(self._progress(path, kind)))}
            staged = {p.batch_id: p for p in self._as_staged(
                [p for p in parcels if p.batch_id in needed], root)}
            held = self._progress(changelog_path, "changelog")
            todo = [staged[p.batch_id] for p in still_needed(parcels, *_position(held))]
            parts = [part for p in todo for part in p.staged or () if part.files]
            if parts:
                before = time.monotonic()
                xid = max(parts, key=lambda part: part.last_commit_seq or 0).last_xid
                metadata = self._metadata(last.batch_id, last.lineage, xid, todo[0].batch_id)
                self._create(changelog_path, self.stored)
                self._append_files(changelog_path, root, parts, metadata)
                self._known[changelog_path] = _after(last, xid)
                delta_stage.remove(root, CHANGELOG, [part.files["name"] for part in parts
                                                     if part.files])
                seconds["changelog"] = time.monotonic() - before
                for p in todo:  # tests only: a kill between the two tables' commits
                    crashpoints.reached(crashpoints.DELTA_BETWEEN_TABLES, p.batch_id)
            held = self._progress(current_path, "current")
            todo = [staged[p.batch_id] for p in still_needed(parcels, *_position(held))]
            if todo:
                before = time.monotonic()
                parts = [part for p in todo for part in p.staged or () if part.files]
                # A range without changes keeps the last change's xid.
                xid = (max(parts, key=lambda part: part.last_commit_seq or 0).last_xid if parts
                       else None if held is None else held.last_change_xid)
                metadata = self._metadata(last.batch_id, last.lineage, xid, todo[0].batch_id)
                self._create(current_path, current_schema(self.stored))
                self._merge_current(current_path, metadata, self._last_changes(root, parts),
                                    [p.batch_id for p in todo])
                self._known[current_path] = _after(last, xid)
                delta_stage.remove(root, CURRENT, [part.files["name"] for part in parts
                                                   if part.files])
                seconds["current"] = time.monotonic() - before
        except BaseException:
            # A commit may or may not have happened: read the tables again.
            self._known.clear()
            if self._committer is not None:
                self._committer.forget()
            raise
        return seconds

    def _as_staged(self, parcels: Sequence[Parcel], root: str) -> list[Parcel]:
        """``parcels`` with their rows written as staged files here, for a parcel that holds
        rows (``write``, or a hand-off an earlier txjoin left): then every parcel is
        committed from its files."""
        staged = []
        for p in parcels:
            if p.staged is None:
                stage = DeltaStage(root, p.lineage.checkpoint_id, p.batch_id, self.table,
                                   self.schema, self.stored, tuple(self.key_columns))
                p = Parcel(p.batch_id, p.changes, p.lineage, p.handed_at,
                           (stage.copy(0, p.changes),), tuple(p.commit_times_ms()))
            staged.append(p)
        return staged

    def _append_files(self, path: str, root: str, parts: list[StagedPart],
                      metadata: str) -> None:
        """One commit appending the parts' staged changelog files, linked into the table's
        folder first (a kill between the two leaves files no version references)."""
        files = []
        for part in parts:
            assert part.files is not None
            name, mtime = delta_stage.publish(root, part.files["name"], path)
            files.append({"path": name, "size": part.files["size"], "modificationTime": mtime,
                          "stats": part.files["stats"]})
        if crashpoints.armed(crashpoints.DELTA_PUBLISHED):  # tests only
            batches = {delta_stage.parse_name(part.files["name"]) for part in parts
                       if part.files}
            for _, batch_id in sorted(b for b in batches if b is not None):
                crashpoints.reached(crashpoints.DELTA_PUBLISHED, batch_id)
        if self._committer is None:
            self._committer = DeltaCommitter(self.spark)
        version = self._committer.commit_files(path, files, _spark_schema(self.stored).jsonValue(),
                                               metadata)
        if version is None:  # a table this cannot commit files to: a DataFrame write
            rows = pa.concat_tables([pq.read_table(f"{path}/{f['path']}") for f in files])
            self._save(self._frame(rows.cast(self.stored)), path, "append", metadata)
        checkpoint_if_due(path, version)

    def _in_tasks(self, function: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """A ``delta_current.Runner``: the items (the current table's files a group commit
        rewrites, each read and written where its task runs) in Spark tasks of about
        ``FILES_PER_TASK`` items, at least one task per core, in the scheduler pool
        ``COMMIT_POOL``; on the driver when they hold at most ``DRIVER_MAX_ROWS`` rows."""
        if sum(map(delta_current.item_rows, items)) <= DRIVER_MAX_ROWS:
            return delta_current.on_driver(function, items)
        context = self.spark.sparkContext
        tasks = min(len(items), max(context.defaultParallelism,
                                    -(-len(items) // FILES_PER_TASK)))
        context.setLocalProperty("spark.scheduler.pool", COMMIT_POOL)
        try:
            return context.parallelize(items, tasks).map(function).collect()
        finally:
            context.setLocalProperty("spark.scheduler.pool", None)  # type: ignore[arg-type]

    def _last_changes(self, root: str, parts: list[StagedPart]) -> delta_current.StagedChanges:
        """The last change per key over ``parts`` (in batch order; a batch's parts hold
        disjoint keys), where the tasks staged each part's: read by the work that applies
        them (``delta_current.StagedChanges``), the driver reading only their keys."""
        return delta_current.StagedChanges(
            tuple(f"{root}/{CURRENT}/{part.files['name']}" for part in parts if part.files),
            self.stored, tuple(self.key_columns))

    def _merge_current(self, path: str, metadata: str,
                       last: pa.Table | delta_current.StagedChanges,
                       batches: Sequence[int] = ()) -> None:
        if not isinstance(last, pa.Table) and not last.files:
            last = last.read()
        if last.num_rows == 0:
            # Still one commit, so the progress moves with the (empty) batches.
            self._commit_rows(path, last.drop_columns([OP]), current_schema(self.stored), "append",
                              metadata)
            return
        if self._committer is None:
            self._committer = DeltaCommitter(self.spark)
        schema = current_schema(self.stored)

        def rewrite(version: int) -> tuple[list[tuple[str, int]], list[dict[str, Any]]]:
            done = delta_current.rewrite(path, version, last, self.key_columns, schema,
                                         self._in_tasks)
            for batch_id in batches:  # tests only: a kill before the commit
                crashpoints.reached(crashpoints.DELTA_CURRENT_WRITTEN, batch_id)
            return done.removed, done.added

        version = self._committer.commit_rewrite(path, _spark_schema(schema).jsonValue(),
                                                 metadata, rewrite)
        if version is not None:
            checkpoint_if_due(path, version)
            return
        # A table this cannot commit files to (altered by hand): delta-spark's MERGE.
        from delta.tables import DeltaTable as SparkDeltaTable

        if not isinstance(last, pa.Table):
            last = last.read()

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
        conf.set(_USER_METADATA, metadata)
        try:
            merge.execute()
        finally:
            conf.unset(_USER_METADATA)
        checkpoint_if_due(path)

    def maintain(self, retention_hours: float | None = None) -> list[Upkeep]:
        """Compact the changelog's small files, then (``retention_hours``) VACUUM both tables.

        Compaction (delta-spark's OPTIMIZE; the current table's commits keep its files
        clustered, ``txjoin.sinks.delta_current``) rewrites small files into larger ones in one
        commit that changes no row (``dataChange=false``): a reader sees the same state
        before and after, and every earlier version stays readable. VACUUM deletes the
        files no version of the last ``retention_hours`` hours needs: time travel keeps
        working inside the retention, not beyond it. Delta refuses a retention under its
        7-day safety floor (a reader running longer could lose files); a retention the
        user sets explicitly lifts it for this sink's session. The sink checkpoints and
        expires the log as it writes (every ``CHECKPOINT_INTERVAL`` commits, with delta-rs:
        ``delta_commit.checkpoint_if_due``; older tables, which delta-spark checkpointed
        inside a commit, are moved to that here; log entries are kept
        ``delta.logRetentionDuration``, 30 days by default): with ``retention_hours`` the
        log keeps the same window as the data files (set once, in a table property), so
        time travel reaches exactly as far back as the retention. A checkpoint expires the
        log entries before it that are older than the retention: the log is bounded by the
        retention plus ``CHECKPOINT_INTERVAL`` commits. Run between batches, never
        beside a writer: OPTIMIZE and a concurrent MERGE would conflict.
        """
        from delta.tables import DeltaTable as SparkDeltaTable

        if retention_hours is not None and retention_hours < 0:
            raise ConfigError(f"a VACUUM retention must be >= 0 hours, got {retention_hours}")
        if retention_hours is not None:
            self.spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled",
                                "false")
        wanted = {CHECKPOINT_INTERVAL_PROPERTY: SPARK_CHECKPOINTS_OFF}
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
            if path == self.changelog_path:
                # Not the current table: its commits keep it in files of at most
                # CLUSTER_FILE_ROWS rows clustered by key, which OPTIMIZE's bin-packing
                # (into files of up to 1 GB) would merge into a few files of wide ranges,
                # every one of them then touched by every commit.
                table.optimize().executeCompaction()
            if retention_hours is not None:
                table.vacuum(retention_hours)
            done.append(Upkeep(path, files_before, len(DeltaTable(path).file_uris()),
                               on_disk_before, _data_files(path), time.monotonic() - before))
        staged = self._drop_orphans()
        return done if staged is None else [*done, staged]

    def _drop_orphans(self) -> Upkeep | None:
        """Delete the staged files nothing will commit (``delta_stage.orphans``: of batches
        their table holds, left by a kill between a commit and its clean-up, or older than
        ``STAGED_MAX_AGE_S``), counted (``None``: none found)."""
        root = str(self.root / STAGED_DIR)
        if not Path(root).is_dir():
            return None
        before = time.monotonic()
        found = [file for kind, path in ((CHANGELOG, self.changelog_path),
                                         (CURRENT, self.current_path))
                 for file in delta_stage.orphans(root, kind, _position(self._held(path, kind)))]
        if not found:
            return None
        for file in found:
            file.unlink(missing_ok=True)
        return Upkeep(root, 0, 0, len(found), 0, time.monotonic() - before,
                      kind="staged data files")

    def _set_properties(self, path: str, config: dict[str, str],
                        wanted: dict[str, str]) -> None:
        """Table properties ``wanted`` on the table at ``path`` (whose properties are
        ``config``), in one metadata commit with no row change, unless it has them already;
        tables created before a setting came (``SPARK_CHECKPOINTS_OFF``) get it at their
        next upkeep."""
        if all(config.get(key) == value for key, value in wanted.items()):
            return
        assignments = ", ".join(f"'{key}' = '{value}'" for key, value in wanted.items())
        self.spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({assignments})")

    def begin_rebuild(self, checkpoint_id: str) -> None:
        """Write into fresh tables under ``<table>/_rebuild/`` from now on."""
        shutil.rmtree(self.rebuild_root, ignore_errors=True)
        self._rebuild_id, self._checked = checkpoint_id, None
        self._known.clear()

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
            if kind == "current":
                # Kept clustered by key (delta_current): Spark's sort by range writes
                # files of disjoint key ranges, cut at CLUSTER_FILE_ROWS rows.
                rows = rows.orderBy(*self.key_columns)
            batch = -1 if held is None else held.last_batch_id  # -1: nothing applied yet
            lineage = Lineage(self._rebuild_id,
                              None if held is None else held.frontier_commit_seq)
            self._save(rows, path, "overwrite",
                       self._metadata(batch, lineage,
                                      None if held is None else held.last_change_xid),
                       new_schema=True)
        shutil.rmtree(self.rebuild_root, ignore_errors=True)
        self._rebuild_id, self._checked = None, None
        self._known.clear()

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

    def read_current_batches(self, rows: int = READ_BATCH_ROWS) -> Iterator[list[dict]]:
        """Current rows in key order, ``rows`` at a time: the table is read as Arrow (a
        few bytes a value) and sorted there; only a batch at a time becomes Python rows."""
        if not DeltaTable.is_deltatable(self.current_path):
            return
        table = read_table(self.current_path)
        # Arrow orders strings by their UTF-8 bytes: code point order, as PostgreSQL's "C".
        table = table.sort_by([(k, "ascending") for k in self.key_columns])
        for batch in table.to_batches(max_chunksize=rows):
            yield batch.to_pylist()

    def read_current_columns(self, rows: int = READ_BATCH_ROWS) -> Iterator[ArrowColumns]:
        """What :meth:`read_current_batches` gives, a batch at a time as Arrow."""
        if not DeltaTable.is_deltatable(self.current_path):
            return
        table = read_table(self.current_path)
        table = table.sort_by([(k, "ascending") for k in self.key_columns])
        for batch in table.to_batches(max_chunksize=rows):
            yield ArrowColumns(batch)

    def changelog_repeats(self) -> tuple[int, list[tuple[Any, ...]]]:
        """The changelog's rows, and its (key..., ``_commit_seq``) held more than once,
        grouped in Arrow over those columns only."""
        if not DeltaTable.is_deltatable(self.changelog_path):
            return 0, []
        columns = [*self.key_columns, COMMIT_SEQ]
        table = read_table(self.changelog_path, columns=columns)
        counts = table.group_by(columns, use_threads=False).aggregate([([], "count_all")])
        repeated = counts.filter(pc.greater(counts["count_all"], 1)).select(columns)
        return table.num_rows, sorted(tuple(r[c] for c in columns)
                                      for r in repeated.to_pylist())

    def close(self) -> None:
        """Nothing to release: the Spark session belongs to the caller."""
