"""Delta commits of Arrow rows through delta-spark's own transaction, without a Spark job.

A DataFrame write (``df.write.format("delta")``) of a few thousand rows costs delta-spark
1.3-2.6 s of CPU on these machines, most of it not the rows: for any commit that is not a
blind append it rebuilds the table's whole log state twice (an overwrite's domain metadata,
its list of files to remove), and each write is several Spark jobs (DESIGN.md 2.2). The
sink already holds the rows a commit writes, as Arrow. So this writes them as one Parquet
file with pyarrow, in the table's folder, and commits the file through delta-spark's
``OptimisticTransaction`` (``DeltaLog.startTransaction().commit(actions, Write(...))``):
the same transaction, conflict check, commit info (``userMetadata``) and checksum file as a
DataFrame write, with the files to remove (an overwrite) known from the sink's own last
commit or read with delta-rs, never by rebuilding the log state. Measured with
``scripts/delta_commit_cost.py``: see ``docs/benchmarks.md``. The log checkpoints of the
sink's tables are written with delta-rs too (:func:`checkpoint_if_due`), not by
delta-spark's Spark jobs inside a commit.

Only tables this can write exactly as delta-spark would are written this way
(:func:`plain`): unpartitioned, no column mapping, no CHECK constraint, no change data
feed, no generated, identity or default columns, no deletion vectors or row tracking
(table features beyond ``PLAIN_WRITER_FEATURES``), and the schema the sink writes. Any
other table (one altered by hand, say) is written by a DataFrame write as before:
:meth:`DeltaCommitter.commit` says ``False`` and writes nothing.

Statistics: each file's ``numRecords``, each top-level column's ``nullCount`` and, for
integer and date columns, ``minValues``/``maxValues`` (exact, so a reader's data skipping
and a MERGE's file pruning stay right); other columns have none, which a reader takes as
"may match" (no skipping), never as a wrong answer.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_log = logging.getLogger("txjoin.delta")

CHECKPOINT_INTERVAL = 100
"""Commits between two log checkpoints of the tables the sink creates (written by txjoin:
:func:`checkpoint_if_due`)."""
SPARK_CHECKPOINTS_OFF = str(2**31 - 1)
"""``delta.checkpointInterval`` of a table whose log checkpoints txjoin writes. delta-spark
checkpoints a table inside the commit whose version is a multiple of that property, with
Spark jobs (a log state reconstruction, a Parquet write): 3.7 s on an idle machine, 10 s
beside a stream at 500 tx/s, where that commit stalled the stream for 2.7 s. At the
property's largest value delta-spark never reaches one."""
CHECKPOINT_INTERVAL_PROPERTY = "delta.checkpointInterval"

PLAIN_WRITER_FEATURES = frozenset({"appendOnly", "invariants", "timestampNtz"})
"""Table features of a table this module writes: the ones delta-spark gives a table created
from the sink's schema (``invariants``: NOT NULL key columns, which :func:`check_not_null`
enforces here as delta-spark's writer would)."""
PLAIN_READER_FEATURES = frozenset({"timestampNtz"})
_PLAIN_WRITER_VERSION = 2  # legacy protocol: 2 = appendOnly + invariants, 3+ = constraints...
_PLAIN_READER_VERSION = 1


@dataclass(frozen=True)
class _Table:
    """What a transaction read of the table: its version and whether it is plain."""

    version: int
    plain: bool
    append_only: bool


def plain(metadata: dict[str, Any], protocol: dict[str, Any], schema: dict[str, Any]) -> bool:
    """Whether a table of this ``metaData`` and ``protocol`` action holds exactly ``schema``
    (a Delta schema as JSON) and needs nothing of a writer but Parquet files of it."""
    if metadata.get("partitionColumns"):
        return False
    config = metadata.get("configuration") or {}
    if any(key.startswith("delta.constraints.") for key in config):
        return False
    if config.get("delta.columnMapping.mode", "none") != "none":
        return False
    if config.get("delta.enableChangeDataFeed", "false").lower() == "true":
        return False
    if json.loads(metadata.get("schemaString") or "{}") != schema:
        return False
    if not all(_nullable_inside(field["type"]) for field in schema.get("fields", ())):
        return False  # NOT NULL inside a struct, list or map: delta-spark's writer checks it
    reader, writer = protocol.get("minReaderVersion", 1), protocol.get("minWriterVersion", 1)
    if writer == 7:
        writer_ok = set(protocol.get("writerFeatures") or ()) <= PLAIN_WRITER_FEATURES
    else:
        writer_ok = writer <= _PLAIN_WRITER_VERSION
    if reader == 3:
        reader_ok = set(protocol.get("readerFeatures") or ()) <= PLAIN_READER_FEATURES
    else:
        reader_ok = reader <= _PLAIN_READER_VERSION
    return writer_ok and reader_ok


def _nullable_inside(kind: Any) -> bool:
    """Whether everything nested in a Delta type may be NULL (only top-level columns are
    checked for NOT NULL here, as :func:`check_not_null` does)."""
    if not isinstance(kind, dict):
        return True
    if kind.get("type") == "struct":
        return all(f.get("nullable", True) and _nullable_inside(f["type"])
                   for f in kind.get("fields", ()))
    if kind.get("type") == "array":
        return bool(kind.get("containsNull", True)) and _nullable_inside(kind["elementType"])
    if kind.get("type") == "map":
        return (bool(kind.get("valueContainsNull", True)) and _nullable_inside(kind["keyType"])
                and _nullable_inside(kind["valueType"]))
    return True


def _stat(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


def file_stats(rows: pa.Table) -> str:
    """The ``stats`` JSON of a file holding ``rows`` (see the module docstring)."""
    stats: dict[str, Any] = {"numRecords": rows.num_rows}
    nulls: dict[str, int] = {}
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    for field, column in zip(rows.schema, rows.columns, strict=True):
        if pa.types.is_nested(field.type):
            continue
        nulls[field.name] = column.null_count
        if ((pa.types.is_integer(field.type) or pa.types.is_date(field.type))
                and column.null_count < len(column)):
            bounds = pc.min_max(column)
            low[field.name] = _stat(bounds["min"].as_py())
            high[field.name] = _stat(bounds["max"].as_py())
    if low:
        stats["minValues"], stats["maxValues"] = low, high
    stats["nullCount"] = nulls
    return json.dumps(stats)


def check_not_null(rows: pa.Table) -> None:
    """Delta's NOT NULL invariant, as delta-spark's writer enforces it (top-level columns)."""
    for field in rows.schema:
        if not field.nullable and rows.column(field.name).null_count:
            raise ValueError(f"column {field.name!r} is NOT NULL in the Delta table but "
                             f"{rows.column(field.name).null_count} rows to write hold NULL")


class DeltaCommitter:
    """Commits Arrow rows to plain Delta tables through delta-spark's transaction API.

    One per sink (its Spark session). Keeps, per table, the files its last overwrite left,
    so the next overwrite removes them without reading the log; a table someone else
    committed to since (``txjoin maintain``'s OPTIMIZE) has its files read with delta-rs.
    """

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        self._jvm: Any = spark._jvm
        self._classes: dict[str, Any] = {}
        self._files: dict[str, tuple[int, list[tuple[str, int]]]] = {}

    def forget(self) -> None:
        """Drop what is kept of every table (after a failed commit)."""
        self._files.clear()

    def commit(self, path: str, rows: pa.Table, spark_schema: dict[str, Any], metadata: str,
               overwrite: bool) -> int | None:
        """One commit to the Delta table at ``path``: append ``rows`` (in the table's Arrow
        schema as stored, nullability included) or (``overwrite``) replace the table's rows
        with them; ``metadata`` its ``userMetadata``; ``spark_schema`` the rows' schema as
        Delta's schema JSON. The version committed; ``None``, with nothing written, if the
        table is not plain (:func:`plain`)."""
        java = self._java
        session = self._spark._jsparkSession
        # The transaction reads its settings (empty commits recorded) from the active session.
        java("org.apache.spark.sql.SparkSession").setActiveSession(session)
        txn = java("org.apache.spark.sql.delta.DeltaLog").forTable(session, path).startTransaction()
        table = self._table(txn, spark_schema)
        if not table.plain or (overwrite and table.append_only):
            return None
        now = int(time.time() * 1000)
        actions: list[str] = []
        if overwrite:
            txn.readWholeTable()  # an overwrite conflicts with any concurrent change
            actions += [json.dumps({"remove": {
                "path": name, "deletionTimestamp": now, "dataChange": True,
                "extendedFileMetadata": True, "partitionValues": {}, "size": size}})
                for name, size in self._live_files(path, table.version)]
        added: list[tuple[str, int]] = []
        if rows.num_rows:
            check_not_null(rows)
            name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
            file = Path(path) / name
            # Spark reads microseconds: Delta has no finer timestamp.
            pq.write_table(rows, file, compression="snappy",
                           coerce_timestamps="us", allow_truncated_timestamps=True)
            size = os.path.getsize(file)
            added.append((name, size))
            actions.append(json.dumps({"add": {
                "path": name, "partitionValues": {}, "size": size,
                "modificationTime": int(os.path.getmtime(file) * 1000), "dataChange": True,
                "stats": file_stats(rows)}}))
        version = self._commit(txn, actions, overwrite, metadata)
        if overwrite:
            self._files[path] = (version, added)
        elif path in self._files and self._files[path][0] == table.version:
            self._files[path] = (version, self._files[path][1] + added)
        return version

    def commit_files(self, path: str, files: list[dict[str, Any]], spark_schema: dict[str, Any],
                     metadata: str) -> int | None:
        """One commit appending data files already in the table's folder (the tasks wrote
        them: ``txjoin.sinks.delta_stage``), each ``{"path", "size", "modificationTime",
        "stats"}`` (``path`` relative to the table); ``metadata`` its ``userMetadata``. The
        version committed; ``None``, with nothing committed, if the table is not plain."""
        java = self._java
        session = self._spark._jsparkSession
        java("org.apache.spark.sql.SparkSession").setActiveSession(session)
        txn = java("org.apache.spark.sql.delta.DeltaLog").forTable(session, path).startTransaction()
        table = self._table(txn, spark_schema)
        if not table.plain:
            return None
        actions = [json.dumps({"add": {
            "path": f["path"], "partitionValues": {}, "size": f["size"],
            "modificationTime": f["modificationTime"], "dataChange": True,
            "stats": f["stats"]}}) for f in files]
        version = self._commit(txn, actions, False, metadata)
        if path in self._files and self._files[path][0] == table.version:
            self._files[path] = (version, self._files[path][1]
                                 + [(f["path"], f["size"]) for f in files])
        return version

    def commit_rewrite(self, path: str, spark_schema: dict[str, Any], metadata: str,
                       rewrite: Callable[[int], tuple[list[tuple[str, int]],
                                                      list[dict[str, Any]]]]) -> int | None:
        """One commit replacing some of the table's data files: ``rewrite(version)`` (the
        version the transaction read) writes the new files in the table's folder and says
        which files go (``(path, size)``) and the new files' add actions. The version
        committed; ``None``, with ``rewrite`` not called, if the table is not plain."""
        java = self._java
        session = self._spark._jsparkSession
        java("org.apache.spark.sql.SparkSession").setActiveSession(session)
        txn = java("org.apache.spark.sql.delta.DeltaLog").forTable(session, path).startTransaction()
        table = self._table(txn, spark_schema)
        if not table.plain or table.append_only:
            return None
        txn.readWholeTable()  # it rewrites files: conflicts with any concurrent change
        removed, added = rewrite(table.version)
        now = int(time.time() * 1000)
        actions = [json.dumps({"remove": {
            "path": name, "deletionTimestamp": now, "dataChange": True,
            "extendedFileMetadata": True, "partitionValues": {}, "size": size}})
            for name, size in removed] + [json.dumps({"add": add}) for add in added]
        version = self._commit(txn, actions, True, metadata)
        self._files.pop(path, None)
        return version

    def _commit(self, txn: Any, actions: list[str], overwrite: bool, metadata: str) -> int:
        action = self._java("org.apache.spark.sql.delta.actions.Action")
        return int(txn.commit(self._seq([action.fromJson(a) for a in actions]),
                              self._operation(overwrite, metadata)))

    def _table(self, txn: Any, spark_schema: dict[str, Any]) -> _Table:
        meta = json.loads(txn.metadata().json())["metaData"]
        protocol = json.loads(txn.protocol().json())["protocol"]
        append_only = (meta.get("configuration") or {}).get("delta.appendOnly") == "true"
        return _Table(int(txn.snapshot().version()), plain(meta, protocol, spark_schema),
                      append_only)

    def _live_files(self, path: str, version: int) -> list[tuple[str, int]]:
        """(path, size) of the data files of the table at ``version``."""
        kept = self._files.get(path)
        if kept is None or kept[0] != version:
            adds = pa.table(DeltaTable(path, version=version).get_add_actions(flatten=True))
            kept = (version, list(zip(adds.column("path").to_pylist(),
                                      adds.column("size_bytes").to_pylist(), strict=True)))
            self._files[path] = kept
        return kept[1]

    def _java(self, name: str) -> Any:
        """The JVM's class ``name``, looked up once: py4j resolves ``jvm.a.b.C`` one name at a
        time, and each of ``a``, ``a.b`` is a class the JVM looks for in every jar."""
        found = self._classes.get(name)
        if found is None:
            found = self._classes[name] = getattr(self._jvm, name)
        return found

    def _seq(self, items: list[Any]) -> Any:
        java_list = self._java("java.util.ArrayList")()
        for item in items:
            java_list.add(item)
        return self._java("scala.jdk.javaapi.CollectionConverters").asScala(java_list).toList()

    def _operation(self, overwrite: bool, metadata: str) -> Any:
        """delta-spark's ``Write`` operation (what a DataFrame write records in the history)."""
        java = self._java
        none = java("scala.None$").__getattr__("MODULE$")
        mode = java("org.apache.spark.sql.SaveMode")
        # Write(mode, partitionBy, predicate, userMetadata, isDynamicPartitionOverwrite,
        #       canOverwriteSchema, canMergeSchema, replaceOnCond, replaceUsingCols)
        return java("org.apache.spark.sql.delta.DeltaOperations").Write(
            mode.Overwrite if overwrite else mode.Append, none, none, java("scala.Some")(metadata),
            none, none, none, none, none)


def checkpoint_if_due(path: str, version: int | None = None) -> bool:
    """After a commit (of ``version``, if known) to the Delta table at ``path``: once
    ``CHECKPOINT_INTERVAL`` commits have passed since the table's last log checkpoint, write
    one at its latest version with delta-rs, then expire the log entries older than the
    table's ``delta.logRetentionDuration`` (what delta-spark does at a checkpoint). 11 ms
    for a 100-commit log here, against delta-spark's Spark jobs (:data:`SPARK_CHECKPOINTS_OFF`).
    Only tables whose checkpoints are txjoin's (their ``delta.checkpointInterval`` is
    ``SPARK_CHECKPOINTS_OFF``); delta-spark checkpoints any other itself. Whether it wrote
    one. A reader sees the same table through the checkpoint as through the commits: it is
    their state, written before ``_last_checkpoint`` points to it. One that fails (a
    table delta-rs cannot write, say) is a one-line warning, not an error: the commit is
    in, and a reader reads the commits since the last checkpoint."""
    last = _last_checkpoint(path)
    if version is not None and version - last < CHECKPOINT_INTERVAL:
        return False
    table = DeltaTable(path)
    ours = table.metadata().configuration.get(CHECKPOINT_INTERVAL_PROPERTY)
    if ours != SPARK_CHECKPOINTS_OFF or table.version() - last < CHECKPOINT_INTERVAL:
        return False
    try:
        table.create_checkpoint()
        table.cleanup_metadata()
        _expire_checksums(Path(path) / "_delta_log")
    except Exception as exc:  # the commit is in: a missing checkpoint loses nothing
        _log.warning("delta sink: no log checkpoint of %s at version %s (%s); the table is "
                     "intact and readers read its commits; tried again at its next commit",
                     path, table.version(), " ".join(str(exc).split())[:300])
        return False
    return True


def _expire_checksums(log: Path) -> None:
    """delta-rs's cleanup removes the expired commits (and checkpoints) but not their
    checksum files, which delta-spark's removes with them: Delta's ``NNN.crc`` of a
    version older than the oldest commit left, and Hadoop's hidden ``.NAME.crc`` of a file
    that is gone. Also Hadoop's checksum of ``_last_checkpoint``, which delta-spark wrote
    (an older table) and delta-rs has just rewritten without one: Hadoop's local file
    system checks a file against its checksum when it reads it."""
    versions = [int(f.name[:20]) for f in log.glob("[0-9]*.json") if f.name[:20].isdigit()]
    if not versions:
        return
    oldest = min(versions)
    for file in log.iterdir():
        name = file.name
        if name == "._last_checkpoint.crc":
            gone = True
        elif name.startswith(".") and name.endswith(".crc"):
            gone = not (log / name[1:-len(".crc")]).exists()
        else:
            gone = name.endswith(".crc") and name[:20].isdigit() and int(name[:20]) < oldest
        if gone:
            file.unlink(missing_ok=True)


def _last_checkpoint(path: str) -> int:
    """The version of the table's last log checkpoint (0: none yet)."""
    try:
        last = json.loads((Path(path) / "_delta_log" / "_last_checkpoint").read_text())
        return int(last["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0
