"""Delta (delta-spark) and PostgreSQL sinks: atomic, idempotent micro-batches.

Integration tests: the Delta sink writes through the shared local Spark session
(delta-spark), the PostgreSQL sink against a throwaway PostgreSQL 18 server.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from tests.fixtures import restartable_postgres
from tests.fixtures.postgres import new_database
from txjoin.errors import ConfigError, LineageError, ServiceError, SinkSchemaError
from txjoin.sinks import Sink, current_schema, delta_commit, delta_current
from txjoin.sinks import delta as delta_sink
from txjoin.sinks.delta import DeltaSink, stored_schema
from txjoin.sinks.delta_commit import CHECKPOINT_INTERVAL, SPARK_CHECKPOINTS_OFF
from txjoin.sinks.lineage import Checkpoint, Lineage, check_lineage
from txjoin.sinks.postgres import PostgresSink, mask_dsn
from txjoin.stack.processes import free_port

PIZZAS = pa.list_(pa.struct([("pizza", pa.string()), ("price", pa.decimal128(10, 2))]))
SCHEMA = pa.schema([
    ("order_id", pa.int64()),
    ("customer", pa.string()),
    ("total", pa.decimal128(12, 2)),
    ("placed_at", pa.timestamp("us", tz="UTC")),
    ("quantity", pa.int32()),
    ("pizzas", PIZZAS),
    ("_op", pa.string()),
    ("_commit_seq", pa.int64()),
    ("_xid", pa.int64()),
    ("_commit_ts", pa.timestamp("us", tz="UTC")),
])
T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def change(op: str, order_id: int, seq: int, customer: str | None = None,
           total: str | None = None, pizzas: list[tuple[str, str]] | None = None) -> dict:
    """One output change; a delete carries null values."""
    deleted = op == "d"
    return {
        "order_id": order_id,
        "customer": None if deleted else customer or f"cust{order_id}",
        "total": None if deleted else Decimal(total or "10.50"),
        "placed_at": None if deleted else T0 + timedelta(minutes=order_id),
        "quantity": None if deleted else order_id * 2,
        "pizzas": None if deleted else [{"pizza": p, "price": Decimal(x)}
                                        for p, x in (pizzas or [])],
        "_op": op, "_commit_seq": seq, "_xid": 1000 + seq,
        "_commit_ts": T0 + timedelta(seconds=seq),
    }


def batch(*changes: dict) -> pa.Table:
    return pa.Table.from_pylist(list(changes), schema=SCHEMA)


def current_of(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "_op"}


@pytest.fixture(scope="module")
def dsn(pg_server: str) -> str:
    """A database of its own on the session's PostgreSQL server (tests/conftest.py)."""
    return new_database(pg_server, "sinks")


_tables = iter(range(1_000_000))


@pytest.fixture(params=["delta", "postgres"])
def make_sink(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Sink]]:
    """A factory of sink objects over the same output table (to test reopening)."""
    table, job = f"orders_{next(_tables)}", "pizza_orders"
    opened: list[Sink] = []

    def make() -> Sink:
        sink: Sink
        if request.param == "delta":
            sink = DeltaSink(str(tmp_path / "out"), table, job, ["order_id"], SCHEMA,
                             spark=request.getfixturevalue("spark"))
        else:
            url = request.getfixturevalue("dsn")
            sink = PostgresSink(url, table, f"{job}.{table}", ["order_id"], SCHEMA)
        opened.append(sink)
        return sink

    yield make
    for sink in opened:
        sink.close()


def test_first_write_creates_the_tables(make_sink: Callable[[], Sink]) -> None:
    sink = make_sink()
    assert sink.last_applied_batch() is None
    assert sink.read_current() == [] and sink.read_changelog() == []

    first = change("c", 1, 1, pizzas=[("margherita", "8.50")])
    assert sink.write(0, batch(first)) is True

    assert sink.last_applied_batch() == 0
    assert sink.read_current() == [current_of(first)]
    assert sink.read_changelog() == [first]


def test_current_holds_the_last_change_per_key_and_the_changelog_everything(
        make_sink: Callable[[], Sink]) -> None:
    sink = make_sink()
    changes_0 = [change("c", 1, 1), change("c", 2, 2), change("u", 1, 3, total="99.99"),
                 change("c", 3, 4)]
    changes_1 = [change("d", 2, 5), change("u", 3, 6, customer="zoe"), change("u", 1, 7),
                 change("d", 3, 8), change("c", 4, 9), change("c", 3, 10, customer="back")]

    sink.write(0, batch(*changes_0))
    assert sink.read_current() == [current_of(changes_0[2]), current_of(changes_0[1]),
                                   current_of(changes_0[3])]

    sink.write(1, batch(*changes_1))
    assert sink.read_current() == [current_of(changes_1[2]), current_of(changes_1[5]),
                                   current_of(changes_1[4])]
    assert sink.read_changelog() == changes_0 + changes_1


def _last_commit(path: str) -> tuple[set[str], set[str]]:
    """(removed, added) data files of the table's last commit, as its log names them."""
    log = sorted((Path(path) / "_delta_log").glob("*.json"))[-1]
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    return ({a["remove"]["path"] for a in actions if "remove" in a},
            {a["add"]["path"] for a in actions if "add" in a})


def _file_keys(path: str) -> list[list[int]]:
    """The keys of each live data file of a Delta table, files in key order."""
    table = DeltaTable(path)
    return sorted(pq.read_table(uri.removeprefix("file://"), columns=["order_id"])
                  .column("order_id").to_pylist() for uri in table.file_uris())


def test_a_group_commit_rewrites_only_the_files_holding_its_changed_keys(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The current table's files are clustered by key, CLUSTER_FILE_ROWS rows at most; a
    # commit replaces the files holding a changed key, new keys above every file's range
    # fill the last file, other new keys go to a file of their own.
    monkeypatch.setattr(delta_current, "CLUSTER_FILE_ROWS", 3)
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    sink.write(0, batch(*(change("c", k, k) for k in (9, 3, 7, 1, 5, 2, 8, 4, 6))))
    assert _file_keys(sink.current_path) == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]

    first_files = _last_commit(sink.current_path)[1]
    sink.write(1, batch(change("u", 5, 10, customer="zoe"), change("d", 8, 11)))
    removed, added = _last_commit(sink.current_path)
    assert len(removed) == 2 and len(added) == 2 and len(removed & first_files) == 2
    assert _file_keys(sink.current_path) == [[1, 2, 3], [4, 5, 6], [7, 9]]

    sink.write(2, batch(change("c", 11, 12), change("c", 10, 13)))  # into the last file
    assert len(_last_commit(sink.current_path)[0]) == 1
    assert _file_keys(sink.current_path) == [[1, 2, 3], [4, 5, 6], [7, 9], [10, 11]]
    sink.write(3, batch(change("c", 0, 14)))  # below every range: a file of its own
    assert _last_commit(sink.current_path)[0] == set()
    assert _file_keys(sink.current_path) == [[0], [1, 2, 3], [4, 5, 6], [7, 9], [10, 11]]

    expected = sorted([0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11])
    assert [r["order_id"] for r in sink.read_current()] == expected
    assert next(r for r in sink.read_current() if r["order_id"] == 5)["customer"] == "zoe"
    # What other engines read: a plain deltalake read and a plain Spark read.
    assert sorted(DeltaTable(sink.current_path).to_pyarrow_table()["order_id"].to_pylist()) \
        == expected
    spark_rows = spark.read.format("delta").load(sink.current_path).collect()
    assert sorted(r["order_id"] for r in spark_rows) == expected


def test_a_group_commit_that_deletes_every_row_of_a_file_removes_it_and_adds_none(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A touched file left empty is replaced by no file (CI found a commit that stopped here).
    monkeypatch.setattr(delta_current, "CLUSTER_FILE_ROWS", 3)
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    sink.write(0, batch(*(change("c", k, k) for k in (1, 2, 3, 4, 5, 6))))
    sink.write(1, batch(change("d", 4, 7), change("d", 5, 8), change("d", 6, 9)))
    removed, added = _last_commit(sink.current_path)
    assert len(removed) == 1 and added == set()
    assert _file_keys(sink.current_path) == [[1, 2, 3]]
    sink.write(2, batch(*(change("d", k, 9 + k) for k in (1, 2, 3))))
    assert _file_keys(sink.current_path) == []
    assert sink.read_current() == []
    assert DeltaTable(sink.current_path).to_pyarrow_table().num_rows == 0
    sink.write(3, batch(change("c", 8, 20)))
    assert [r["order_id"] for r in sink.read_current()] == [8]


@pytest.mark.parametrize("where", ["tasks", "driver"])
def test_random_group_commits_into_clustered_files_keep_one_row_per_key(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        where: str) -> None:
    # Inserts, updates and deletes anywhere in the key range, and new keys below, between
    # and above the files' ranges, group after group: each commit's files are rewritten in
    # Spark tasks (one file or several) or on the driver (a commit of few rows), files stay
    # within CLUSTER_FILE_ROWS rows, key ranges never overlap, and the table is the model's.
    monkeypatch.setattr(delta_current, "CLUSTER_FILE_ROWS", 5)
    monkeypatch.setattr(delta_sink, "DRIVER_MAX_ROWS", 0 if where == "tasks" else 10**6)
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    rnd = random.Random(66)
    model: dict[int, dict] = {}
    seq = 0
    for b in range(8):
        changes = []
        for order_id in rnd.sample(range(0, 80), rnd.randint(1, 14)):
            seq += 1
            op = ("d" if order_id in model and rnd.random() < 0.3 else
                  "u" if order_id in model else "c")
            changes.append(change(op, order_id, seq, customer=f"c{seq}"))
        sink.write(b, batch(*changes))
        for c in changes:
            if c["_op"] == "d":
                model.pop(c["order_id"], None)
            else:
                model[c["order_id"]] = current_of(c)
        files = _file_keys(sink.current_path)
        assert all(0 < len(keys) <= 5 for keys in files), files
        assert all(a[-1] < b[0] for a, b in itertools.pairwise(files)), files
        assert [k for keys in files for k in keys] == sorted(model)
        assert sink.read_current() == [model[k] for k in sorted(model)]


def test_a_current_table_of_overlapping_files_is_continued_without_a_key_twice(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An older layout (files whose key ranges overlap, as a MERGE or a bin-packing leaves
    # them): a new key inside two files' ranges goes to one of them, a changed key is
    # replaced in the file that holds it.
    monkeypatch.setattr(delta_current, "CLUSTER_FILE_ROWS", 3)
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    sink.write(0, batch(change("c", 1, 1), change("c", 5, 2), change("c", 9, 3)))
    schema = current_schema(stored_schema(SCHEMA))
    other = pa.Table.from_pylist([current_of(change("c", k, 3 + k)) for k in (2, 6, 10)],
                                 schema=schema)
    delta_commit.DeltaCommitter(spark).commit(  # a second file, range [2, 10]
        sink.current_path, other, delta_sink._spark_schema(schema).jsonValue(),
        sink._metadata(0, None, None), overwrite=False)
    assert _file_keys(sink.current_path) == [[1, 5, 9], [2, 6, 10]]

    sink.write(1, batch(change("c", 7, 20), change("u", 5, 21, customer="zoe"),
                        change("d", 6, 22), change("c", 11, 23)))
    expected = [1, 2, 5, 7, 9, 10, 11]
    assert [r["order_id"] for r in sink.read_current()] == expected
    assert sorted(DeltaTable(sink.current_path).to_pyarrow_table()["order_id"].to_pylist()) \
        == expected
    assert sorted(r["order_id"] for r in
                  spark.read.format("delta").load(sink.current_path).collect()) == expected
    assert next(r for r in sink.read_current() if r["order_id"] == 5)["customer"] == "zoe"


def test_a_key_created_and_deleted_in_one_batch_leaves_no_row(
        make_sink: Callable[[], Sink]) -> None:
    sink = make_sink()
    sink.write(0, batch(change("c", 7, 1), change("u", 7, 2), change("d", 7, 3)))

    assert sink.read_current() == []
    assert [r["_op"] for r in sink.read_changelog()] == ["c", "u", "d"]


def test_replaying_a_batch_is_skipped_and_changes_nothing(
        make_sink: Callable[[], Sink]) -> None:
    sink = make_sink()
    sink.write(0, batch(change("c", 1, 1)))
    sink.write(1, batch(change("u", 1, 2, total="20.00")))
    current, changelog = sink.read_current(), sink.read_changelog()

    # A replay may even carry different rows (re-run after a crash): still skipped.
    assert sink.write(1, batch(change("u", 1, 2, total="77.00"))) is False
    assert sink.write(0, batch(change("d", 1, 1))) is False

    assert sink.read_current() == current
    assert sink.read_changelog() == changelog
    assert sink.last_applied_batch() == 1


def test_an_empty_batch_still_moves_the_progress(make_sink: Callable[[], Sink]) -> None:
    sink = make_sink()
    sink.write(0, batch(change("c", 1, 1)))

    assert sink.write(1, batch()) is True

    assert sink.last_applied_batch() == 1
    assert len(sink.read_current()) == 1


def test_an_empty_batch_makes_no_delta_changelog_commit_and_replays_cleanly(
        spark: SparkSession, tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    assert sink.write(0, batch(), Lineage("ckpt", None)) is True  # nothing to append yet
    assert not DeltaTable.is_deltatable(sink.changelog_path)
    sink.write(1, batch(change("c", 1, 1)), Lineage("ckpt", 1))
    changelog_version = DeltaTable(sink.changelog_path).version()

    assert sink.write(2, batch(), Lineage("ckpt", 2)) is True
    assert sink.write(2, batch(), Lineage("ckpt", 2)) is False  # a replay: nothing again

    assert DeltaTable(sink.changelog_path).version() == changelog_version
    assert sink.last_applied_batch() == 2
    assert [r["order_id"] for r in sink.read_changelog()] == [1]
    assert sink.write(3, batch(change("u", 1, 3)), Lineage("ckpt", 3)) is True
    assert [r["_commit_seq"] for r in sink.read_changelog()] == [1, 3]


def test_nested_lists_of_structs_with_decimals_round_trip(
        make_sink: Callable[[], Sink]) -> None:
    sink = make_sink()
    rows = [change("c", 1, 1, pizzas=[("margherita", "8.50"), ("diavola", "12.00")]),
            change("c", 2, 2, pizzas=[]),
            change("c", 3, 3, pizzas=[("quattro \"formaggi\"", "0.05")]),
            {**change("c", 4, 4), "pizzas": [{"pizza": None, "price": None}]}]

    sink.write(0, batch(*rows))

    assert sink.read_current() == [current_of(r) for r in rows]
    prices = [p["price"] for p in sink.read_current()[0]["pizzas"]]
    assert prices == [Decimal("8.50"), Decimal("12.00")]
    assert all(isinstance(p, Decimal) for p in prices)


def test_progress_survives_reopening_the_sink(make_sink: Callable[[], Sink]) -> None:
    first = make_sink()
    first.write(0, batch(change("c", 1, 1)))
    first.write(1, batch(change("c", 2, 2)))
    first.close()

    reopened = make_sink()
    assert reopened.last_applied_batch() == 1
    assert reopened.write(1, batch(change("c", 9, 3))) is False
    assert reopened.write(2, batch(change("u", 2, 3, customer="ann"))) is True
    assert [r["customer"] for r in reopened.read_current()] == ["cust1", "ann"]


def test_delta_replay_after_a_crash_between_changelog_and_current(
        spark: SparkSession, tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    sink.write(0, batch(change("c", 1, 1)))
    # Simulate a crash after the changelog commit of batch 1: write it alone, with the
    # lineage the sink's changelog commit records.
    crashed = batch(change("u", 1, 2, total="5.00"))
    (spark.createDataFrame(crashed).write.format("delta").mode("append")
     .option("userMetadata", json.dumps({"txjoin.job": "job", "txjoin.batch_id": 1}))
     .save(sink.changelog_path))
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    assert sink.last_applied_batch() == 0

    assert sink.write(1, crashed) is True

    assert [r["_commit_seq"] for r in sink.read_changelog()] == [1, 2]
    assert sink.read_current()[0]["total"] == Decimal("5.00")


def test_delta_maintenance_compacts_without_changing_a_state_or_the_progress(
        spark: SparkSession, tmp_path: Path) -> None:
    """Compaction and VACUUM (issue 20 item 3): same rows, same progress and lineage,
    replays still skipped, every version inside the retention still readable; VACUUM
    with no retention leaves only the live files on disk."""
    lineage = Lineage("ck-maintain", 0)
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    for b in range(6):
        sink.write(b, batch(change("c" if b == 0 else "u", b % 3, b + 1),
                            change("c" if b < 3 else "u", 10 + b % 3, 100 + b)), lineage)
    current, changelog = sink.read_current(), sink.read_changelog()
    held = sink.held()
    version = DeltaTable(sink.current_path).version()
    old = DeltaTable(sink.current_path, version=version - 2).to_pyarrow_table()

    compacted = sink.maintain(retention_hours=1)
    assert [u.path for u in compacted] == [sink.changelog_path, sink.current_path]
    appended, rewritten = compacted
    # Six appends left six files, compacted into one (1 h keeps the old files).
    assert appended.files_before == 6 and appended.files_after == 1, appended.line()
    assert appended.on_disk_after == appended.on_disk_before + 1
    # The current table (a few keys) stays one file as its commits rewrite it: nothing to do.
    assert rewritten.files_before == rewritten.files_after == 1, rewritten.line()
    assert rewritten.on_disk_after == rewritten.on_disk_before
    assert sink.read_current() == current and sink.read_changelog() == changelog
    assert sink.held() == held
    assert DeltaTable(sink.current_path, version=version - 2).to_pyarrow_table() == old
    # Progress and idempotence go on through the maintenance commits.
    assert sink.write(5, batch(change("d", 2, 6)), lineage) is False
    assert sink.write(6, batch(change("d", 2, 7)), lineage) is True
    assert sink.last_applied_batch() == 6

    vacuumed = sink.maintain(retention_hours=0)
    for upkeep in vacuumed:
        assert upkeep.on_disk_after == upkeep.files_after, upkeep.line()
    assert [r["order_id"] for r in sink.read_current()] == \
        [r["order_id"] for r in current if r["order_id"] != 2]


def test_delta_tables_are_created_with_delta_sparks_checkpoints_off(
        spark: SparkSession, tmp_path: Path) -> None:
    """delta-spark checkpoints the log inside every tenth commit by default, with Spark
    jobs that doubled that commit (and stalled the stream beside it); the sink's tables
    (a rebuild's shadow ones too) never reach one (txjoin writes their checkpoints), and
    the setting stays on the sink's own session."""
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    sink.write(0, batch(change("c", 1, 1)))
    sink.begin_rebuild("rebuilt")
    sink.write(0, batch(change("c", 2, 2)))
    for path in (sink.changelog_path, sink.current_path,
                 str(sink.rebuild_root / "changelog"), str(sink.rebuild_root / "current")):
        config = DeltaTable(path).metadata().configuration
        assert config.get("delta.checkpointInterval") == SPARK_CHECKPOINTS_OFF == "2147483647"
    assert CHECKPOINT_INTERVAL == 100
    assert spark.conf.get("spark.databricks.delta.properties.defaults.checkpointInterval",
                          None) is None


def test_the_sink_checkpoints_its_tables_logs_and_both_readers_read_through_them(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every CHECKPOINT_INTERVAL commits (3 here) the sink writes a log checkpoint of each
    table with delta-rs; delta-spark, reading the table afresh from that checkpoint, and
    delta-rs see the state the commits left, and the next commits build on it."""
    monkeypatch.setattr(delta_commit, "CHECKPOINT_INTERVAL", 3)
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    for b in range(7):  # versions 0 (the empty first commit) to 7 of each table
        sink.write(b, batch(change("c", 10 + b, b + 1), change("u", 1, b + 1)),
                   Lineage("ck", b))
    for path in (sink.changelog_path, sink.current_path):
        log = Path(path) / "_delta_log"
        assert sorted(f.name for f in log.glob("*.checkpoint.parquet")) == [
            "00000000000000000003.checkpoint.parquet", "00000000000000000006.checkpoint.parquet"]
        assert json.loads((log / "_last_checkpoint").read_text())["version"] == 6
    expected = sink.read_current()
    assert sorted(r["order_id"] for r in expected) == [1, *range(10, 17)]
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # read the log afresh
    snapshot = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
        spark._jsparkSession, sink.current_path).update(
        False, spark._jvm.scala.Option.empty(), spark._jvm.scala.Option.empty())
    assert (snapshot.version(), snapshot.checkpointProvider().version()) == (7, 6)
    by_spark = spark.read.format("delta").load(sink.current_path).collect()
    assert sorted((r["order_id"], r["_commit_seq"]) for r in by_spark) == \
        sorted((r["order_id"], r["_commit_seq"]) for r in expected)
    assert spark.read.format("delta").load(sink.changelog_path).count() == 14
    assert sink.write(7, batch(change("d", 1, 8)), Lineage("ck", 7)) is True
    assert sorted(r["order_id"] for r in sink.read_current()) == list(range(10, 17))


def test_delta_upkeep_moves_an_older_table_to_the_checkpoint_interval(
        spark: SparkSession, tmp_path: Path) -> None:
    """A table created before the setting (Delta's default interval, 10) gets it from
    ``maintain``, in a commit that changes no row; a second upkeep adds no such commit."""
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    sink.write(0, batch(change("c", 1, 1)), Lineage("ck-old", 0))
    for path in (sink.changelog_path, sink.current_path):
        spark.sql(f"ALTER TABLE delta.`{path}` UNSET TBLPROPERTIES ('delta.checkpointInterval')")
        assert "delta.checkpointInterval" not in DeltaTable(path).metadata().configuration
    current, held = sink.read_current(), sink.held()
    sink.maintain()
    versions = []
    for path in (sink.changelog_path, sink.current_path):
        table = DeltaTable(path)
        assert table.metadata().configuration["delta.checkpointInterval"] == \
            SPARK_CHECKPOINTS_OFF
        versions.append(table.version())
    assert sink.read_current() == current and sink.held() == held
    sink.maintain()
    assert [DeltaTable(p).version() for p in (sink.changelog_path, sink.current_path)] == \
        versions  # one file per table: nothing to compact, the property is there already
    assert sink.write(1, batch(change("u", 1, 2)), Lineage("ck-old", 1)) is True


def test_delta_writes_over_an_empty_log_a_killed_first_write_left(
        spark: SparkSession, tmp_path: Path) -> None:
    """A job killed while creating its tables leaves ``_delta_log`` without a commit;
    delta-spark calls such a path a missing table and refuses to create it there."""
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    for path in (sink.changelog_path, sink.current_path):
        (Path(path) / "_delta_log").mkdir(parents=True)
    assert sink.write(0, batch(change("c", 1, 1))) is True
    assert [r["order_id"] for r in sink.read_current()] == [1]


def test_postgres_tables_have_typed_columns_and_a_progress_row(dsn: str) -> None:
    sink = PostgresSink(dsn, "typed_orders", "typed", ["order_id"], SCHEMA)
    sink.write(3, batch(change("c", 1, 41)))
    sink.close()

    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT column_name, data_type, numeric_precision, numeric_scale "
                    "FROM information_schema.columns WHERE table_name = 'typed_orders' "
                    "ORDER BY ordinal_position")
        columns: dict[str, Any] = {r[0]: r[1:] for r in cur.fetchall()}
        cur.execute("SELECT last_batch_id, last_change_commit_seq, last_change_xid "
                    "FROM txjoin_progress WHERE job = 'typed'")
        progress = cur.fetchone()
    assert columns["order_id"][0] == "bigint"
    assert columns["total"] == ("numeric", 12, 2)
    assert columns["placed_at"][0] == "timestamp with time zone"
    assert columns["quantity"][0] == "integer"
    assert columns["pizzas"][0] == "jsonb"
    assert "_op" not in columns
    assert progress == (3, 41, 1041)


def test_postgres_a_table_another_job_wrote_names_that_job(dsn: str) -> None:
    # Issue 73 item 1: the progress row records the table a job writes, so a second job
    # with the same output table (another name, its own progress row) is told whose it is.
    first = PostgresSink(dsn, "shared_trips", "trips", ["order_id"], SCHEMA)
    assert first.other_owner() is None
    first.write(0, batch(change("c", 1, 1)))
    assert first.other_owner() is None  # its own
    first.close()
    second = PostgresSink(dsn, "shared_trips", "trips_asof", ["order_id"], SCHEMA)
    try:
        assert second.other_owner() == (
            "trips", "DROP TABLE public.shared_trips, public.shared_trips_changelog; "
                     "DELETE FROM public.txjoin_progress WHERE job = 'trips'")
    finally:
        second.close()
    elsewhere = PostgresSink(dsn, "own_trips", "trips_asof", ["order_id"], SCHEMA)
    try:
        assert elsewhere.other_owner() is None
    finally:
        elsewhere.close()


def test_postgres_a_job_whose_types_changed_is_told_so_not_blamed_on_the_sink(
        dsn: str) -> None:
    # Issue 73 item 2: the job's `quantity` went from int to bigint; the sink is as the job's
    # earlier runs made it, so the message says the job changed (and how to rebuild).
    first = PostgresSink(dsn, "retyped_orders", "retyped", ["order_id"], SCHEMA)
    first.write(0, batch(change("c", 1, 1)))
    first.close()
    retyped = pa.schema([f.with_type(pa.int64()) if f.name == "quantity" else f
                         for f in SCHEMA])
    second = PostgresSink(dsn, "retyped_orders", "retyped", ["order_id"], retyped)
    try:
        with pytest.raises(SinkSchemaError) as caught:
            second.check_tables()
    finally:
        second.close()
    assert str(caught.value) == (
        "postgres sink table public.retyped_orders: column 'quantity' has type integer, as "
        "this job wrote it, and the job now writes bigint: the job's declared types changed, "
        "not the sink; nothing was written; run with --rebuild to rewrite the sink's tables "
        "with the new types, or declare the type as before in the job file")
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:  # altered underneath instead
        cur.execute("ALTER TABLE retyped_orders ALTER COLUMN quantity TYPE bigint")
    third = PostgresSink(dsn, "retyped_orders", "retyped", ["order_id"], SCHEMA)
    try:
        with pytest.raises(SinkSchemaError, match="has type bigint, the job writes integer; "
                                                  "nothing was written; restore the column"):
            third.check_tables()
    finally:
        third.close()


def test_postgres_password_never_appears_when_the_server_is_unreachable() -> None:
    secret = "s3cr3t-pa55"
    dsn = f"postgresql://txjoin:{secret}@127.0.0.1:{free_port()}/postgres"

    with pytest.raises(ServiceError) as caught:
        PostgresSink(dsn, "orders", "job", ["order_id"], SCHEMA)

    message = str(caught.value)
    assert secret not in message
    assert "postgresql://txjoin:***@127.0.0.1" in message
    # The driver's own exception is not chained, so no traceback can show it either.
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_mask_dsn_hides_passwords_in_both_dsn_forms() -> None:
    assert mask_dsn("postgresql://u:p%40ss@h:5/db") == "postgresql://u:***@h:5/db"
    assert mask_dsn("host=h password='a b' user=u") == "host=h password=*** user=u"
    assert mask_dsn("host=h password=abc user=u") == "host=h password=*** user=u"
    assert mask_dsn("postgresql://u@h/db") == "postgresql://u@h/db"


def test_postgres_refuses_a_table_name_that_would_be_truncated(dsn: str) -> None:
    # 63-byte identifiers: `<table>_changelog` would be cut to the same name as `<table>`.
    with pytest.raises(ConfigError, match="too long"):
        PostgresSink(dsn, "t" * 60, "job", ["order_id"], SCHEMA)


# -- COPY: every value survives the CSV round trip --------------------------------

ODD = pa.schema([
    ("id", pa.int64()), ("text", pa.string()), ("blob", pa.binary()), ("ratio", pa.float64()),
    ("flag", pa.bool_()), ("day", pa.date32()), ("local", pa.timestamp("us")),
    ("tags", pa.list_(pa.string())),
    ("_op", pa.string()), ("_commit_seq", pa.int64()), ("_xid", pa.int64()),
    ("_commit_ts", pa.timestamp("us", tz="UTC")),
])


def test_postgres_copy_keeps_empty_strings_nulls_quotes_bytes_and_special_floats(
        dsn: str) -> None:
    rows = [
        {"id": 1, "text": "", "blob": b"", "ratio": float("nan"), "flag": True,
         "day": T0.date(), "local": T0.replace(tzinfo=None), "tags": ["", None, 'a"b']},
        {"id": 2, "text": None, "blob": None, "ratio": float("inf"), "flag": None,
         "day": None, "local": None, "tags": None},
        {"id": 3, "text": 'a "quoted", multi\nline\\N text', "blob": b"\x00\xff,\n",
         "ratio": -0.5, "flag": False, "day": T0.date(), "local": T0.replace(tzinfo=None),
         "tags": []},
        {"id": 4, "text": "\\N", "blob": b"\\", "ratio": None, "flag": True,
         "day": T0.date(), "local": None, "tags": ["x,y"]},
    ]
    meta = [{"_op": "c", "_commit_seq": n, "_xid": n, "_commit_ts": T0} for n in range(4)]
    changes = pa.Table.from_pylist([r | m for r, m in zip(rows, meta, strict=True)],
                                   schema=ODD)
    sink = PostgresSink(dsn, "odd_values", "odd", ["id"], ODD)

    sink.write(0, changes)

    current = [{k: v for k, v in r.items() if not k.startswith("_")}
               for r in sink.read_current()]
    assert math.isnan(current[0].pop("ratio")) and math.isnan(rows[0].pop("ratio"))
    assert current == rows
    sink.close()


# -- lineage: batches keyed by the checkpoint, not by Spark's batch id ------------


def test_a_sink_records_the_checkpoint_frontier_and_last_xid_of_each_batch(
        make_sink: Callable[[], Sink]) -> None:
    sink = make_sink()
    assert sink.held() is None

    sink.write(0, batch(change("c", 1, 1), change("c", 2, 2)), lineage=Lineage("ckpt-a", 5))
    sink.write(1, batch(), lineage=Lineage("ckpt-a", 7))

    held = sink.held()
    assert held is not None
    assert (held.checkpoint_id, held.last_batch_id, held.frontier_commit_seq,
            held.last_change_xid) == ("ckpt-a", 1, 7, 1002)


def test_a_batch_of_another_checkpoint_is_refused_not_skipped(
        make_sink: Callable[[], Sink]) -> None:
    sink = make_sink()
    sink.write(0, batch(change("c", 1, 1)), lineage=Lineage("ckpt-a", 1))
    sink.write(1, batch(change("c", 2, 2)), lineage=Lineage("ckpt-a", 2))

    # A wiped checkpoint starts again at batch 0: not a replay.
    with pytest.raises(LineageError, match="holds batch 1, frontier commit_seq 2 of checkpoint"):
        make_sink().write(0, batch(change("c", 3, 3)), lineage=Lineage("ckpt-b", 1))

    assert [r["order_id"] for r in sink.read_current()] == [1, 2]
    # The same checkpoint's replay is still a no-op.
    assert make_sink().write(1, batch(change("c", 9, 9)), lineage=Lineage("ckpt-a", 2)) is False


def test_check_lineage_names_the_sink_what_it_holds_and_both_ways_out(
        make_sink: Callable[[], Sink], tmp_path: Path) -> None:
    sink = make_sink()
    old = Checkpoint.open(tmp_path / "ckpt")
    check_lineage([sink], old)  # an empty sink and a new checkpoint: fine
    sink.write(0, batch(change("c", 1, 1)), lineage=Lineage(old.id, 3))
    check_lineage([sink], Checkpoint.open(tmp_path / "ckpt"))  # same identity when reopened

    new, moved = Checkpoint.fresh(tmp_path / "ckpt")

    assert moved is not None and new.id != old.id
    with pytest.raises(LineageError) as caught:
        check_lineage([sink], new)
    message = str(caught.value)
    assert "\n" not in message
    assert f"{sink.name} sink {sink.where} holds batch 0, frontier commit_seq 3 of checkpoint " \
           f"{old.id[:8]}" in message
    assert "--rebuild" in message and "restore the checkpoint" in message


def test_an_empty_sink_behind_a_checkpoint_with_batches_is_refused(
        make_sink: Callable[[], Sink], tmp_path: Path) -> None:
    checkpoint_dir = tmp_path / "ckpt"
    Checkpoint.open(checkpoint_dir)
    (checkpoint_dir / "commits").mkdir()
    (checkpoint_dir / "commits" / "4").write_text("v1")

    with pytest.raises(LineageError, match=r"holds nothing, but the checkpoint .* \(at batch 4\)"):
        check_lineage([make_sink()], Checkpoint.open(checkpoint_dir))


def test_sinks_from_before_lineage_keep_matching_the_checkpoint_they_came_with(
        make_sink: Callable[[], Sink], tmp_path: Path) -> None:
    sink = make_sink()
    sink.write(0, batch(change("c", 1, 1)))  # no lineage recorded, as before this version
    legacy = tmp_path / "ckpt"
    (legacy / "commits").mkdir(parents=True)
    (legacy / "commits" / "0").write_text("v1")

    check_lineage([sink], Checkpoint.open(legacy))
    check_lineage([sink], Checkpoint.open(legacy))  # also when no batch ran in between
    with pytest.raises(LineageError, match="an unrecorded checkpoint"):
        check_lineage([sink], Checkpoint.open(tmp_path / "other"))


def test_a_rebuild_replaces_the_contents_in_one_step_and_records_the_new_lineage(
        make_sink: Callable[[], Sink]) -> None:
    sink = make_sink()
    for n in range(3):
        sink.write(n, batch(change("c", n, n + 1)), lineage=Lineage("old", n + 1))
    old_current, old_changelog = sink.read_current(), sink.read_changelog()

    sink.begin_rebuild("new")
    sink.write(0, batch(change("c", 10, 1), change("c", 11, 2)), lineage=Lineage("new", 2))
    sink.write(1, batch(change("d", 10, 3)), lineage=Lineage("new", 4))
    # Readers still see the old state, whole.
    assert make_sink().read_current() == old_current
    assert make_sink().read_changelog() == old_changelog
    sink.finish_rebuild()

    assert [r["order_id"] for r in sink.read_current()] == [11]
    assert [r["_commit_seq"] for r in sink.read_changelog()] == [1, 2, 3]
    held = make_sink().held()
    assert held is not None and (held.checkpoint_id, held.last_batch_id,
                                 held.frontier_commit_seq) == ("new", 1, 4)
    # And the run goes on from there, a replay still being a no-op.
    assert sink.write(1, batch(change("c", 99, 9)), lineage=Lineage("new", 4)) is False
    assert sink.write(2, batch(change("c", 12, 5)), lineage=Lineage("new", 5)) is True
    assert [r["order_id"] for r in sink.read_current()] == [11, 12]


def test_a_rebuild_from_an_empty_source_leaves_empty_tables_of_the_new_lineage(
        make_sink: Callable[[], Sink]) -> None:
    sink = make_sink()
    sink.write(5, batch(change("c", 1, 1)), lineage=Lineage("old", 1))

    sink.begin_rebuild("new")
    sink.finish_rebuild()

    assert sink.read_current() == [] and sink.read_changelog() == []
    held = sink.held()
    assert held is not None and (held.checkpoint_id, held.last_batch_id) == ("new", -1)
    assert sink.last_applied_batch() is None
    assert sink.write(0, batch(change("c", 2, 2)), lineage=Lineage("new", 2)) is True


def test_delta_rebuild_is_one_new_version_per_table(spark: SparkSession, tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    sink.write(0, batch(change("c", 1, 1)), lineage=Lineage("old", 1))
    versions = (DeltaTable(sink.current_path).version(), DeltaTable(sink.changelog_path).version())
    sink.begin_rebuild("new")
    for n in range(3):
        sink.write(n, batch(change("c", 5 + n, n + 1)), lineage=Lineage("new", n + 1))
    assert (DeltaTable(sink.current_path).version(),
            DeltaTable(sink.changelog_path).version()) == versions

    sink.finish_rebuild()

    assert (DeltaTable(sink.current_path).version(),
            DeltaTable(sink.changelog_path).version()) == (versions[0] + 1, versions[1] + 1)
    assert not sink.rebuild_root.exists()


def _log_actions(table_path: str, kind: str) -> list[dict]:
    """Every ``kind`` action (``txn``, ``commitInfo``...) in a Delta table's JSON log, in order."""
    return [action[kind] for log in sorted((Path(table_path) / "_delta_log").glob("*.json"))
            for action in map(json.loads, log.read_text().splitlines()) if kind in action]


def test_delta_commits_carry_the_lineage_that_skips_a_replay_and_no_app_transaction(
        spark: SparkSession, tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    sink.write(0, batch(change("c", 1, 1)), lineage=Lineage("ckpt", 1))
    sink.write(1, batch(change("u", 1, 2, total="20.00")), lineage=Lineage("ckpt", 2))
    paths = {"changelog": sink.changelog_path, "current": sink.current_path}
    versions = {kind: DeltaTable(path).version() for kind, path in paths.items()}
    current, changelog = sink.read_current(), sink.read_changelog()

    for path in paths.values():
        # No app transaction: looking one up rebuilds the table's log state every commit.
        assert _log_actions(path, "txn") == []
        lineage = [json.loads(c["userMetadata"]) for c in _log_actions(path, "commitInfo")
                   if "userMetadata" in c]
        assert [(m["txjoin.checkpoint"], m["txjoin.batch_id"], m["txjoin.frontier_commit_seq"],
                 m["txjoin.last_change_xid"]) for m in lineage] == \
            [("ckpt", 0, 1, 1001), ("ckpt", 1, 2, 1002)]

    # A new sink object reads the lineage back from the tables and skips the replay.
    again = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    assert again.write(1, batch(change("d", 1, 2)), lineage=Lineage("ckpt", 2)) is False

    assert {kind: DeltaTable(path).version() for kind, path in paths.items()} == versions
    assert again.read_current() == current and again.read_changelog() == changelog


def _field(name: str, kind: Any, nullable: bool = True) -> dict:
    return {"name": name, "type": kind, "nullable": nullable, "metadata": {}}


def test_delta_tables_keep_the_column_types_the_delta_rs_writer_gave_them(
        spark: SparkSession, tmp_path: Path) -> None:
    not_null_key = SCHEMA.set(0, pa.field("order_id", pa.int64(), nullable=False))
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], not_null_key, spark=spark)
    sink.write(0, batch(change("c", 1, 1)).cast(not_null_key))

    # As txjoin's delta-rs writer (<= ed7335f) declared them, read from its tables.
    pizzas = {"type": "array", "containsNull": True, "elementType": {"type": "struct", "fields": [
        _field("pizza", "string"), _field("price", "decimal(10,2)")]}}
    values = [_field("order_id", "long", nullable=False), _field("customer", "string"),
              _field("total", "decimal(12,2)"), _field("placed_at", "timestamp"),
              _field("quantity", "integer"), _field("pizzas", pizzas)]
    meta = [_field("_commit_seq", "long"), _field("_xid", "long"),
            _field("_commit_ts", "timestamp")]
    for path, fields in ((sink.current_path, values + meta),
                         (sink.changelog_path, [*values, _field("_op", "string"), *meta])):
        table = DeltaTable(path)
        assert json.loads(table.schema().to_json()) == {"type": "struct", "fields": fields}
        protocol = table.protocol()
        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)


def test_delta_tables_left_by_the_delta_rs_writer_are_continued(
        spark: SparkSession, tmp_path: Path) -> None:
    from deltalake import CommitProperties, Transaction, write_deltalake

    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    # What txjoin's delta-rs writer committed: lineage in the commit info, one app id.
    for kind, path in (("changelog", sink.changelog_path), ("current", sink.current_path)):
        rows = batch(change("c", 1, 1))
        write_deltalake(path, rows if kind == "changelog" else rows.drop_columns(["_op"]),
                        commit_properties=CommitProperties(
                            app_transactions=[Transaction(sink.app_id(kind, None), 4)],
                            custom_metadata={"txjoin.job": "job", "txjoin.batch_id": 4,
                                             "txjoin.checkpoint": "ckpt",
                                             "txjoin.frontier_commit_seq": 1,
                                             "txjoin.last_change_xid": 1001}))

    held = sink.held()
    assert held is not None and (held.checkpoint_id, held.last_batch_id,
                                 held.frontier_commit_seq, held.last_change_xid) == \
        ("ckpt", 4, 1, 1001)
    assert sink.write(4, batch(change("d", 1, 1)), lineage=Lineage("ckpt", 1)) is False
    assert sink.write(5, batch(change("c", 2, 2)), lineage=Lineage("ckpt", 2)) is True
    assert [r["order_id"] for r in sink.read_current()] == [1, 2]
    assert sink.last_applied_batch() == 5


# -- a PostgreSQL sink table altered underneath ------------------------------------


@pytest.mark.parametrize("alteration, column, what, repair", [
    ("DROP COLUMN customer", "customer", "is missing", "ADD COLUMN customer text"),
    ("ALTER COLUMN total TYPE text", "total", "has type text, the job writes numeric(12,2)",
     "ALTER COLUMN total TYPE numeric(12,2) USING total::numeric"),
])
def test_postgres_table_altered_underneath_fails_naming_table_and_column_and_writes_nothing(
        dsn: str, alteration: str, column: str, what: str, repair: str) -> None:
    table = f"altered_{next(_tables)}"
    sink = PostgresSink(dsn, table, table, ["order_id"], SCHEMA)
    sink.write(0, batch(change("c", 1, 1)))
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f"ALTER TABLE {table} {alteration}")

    with pytest.raises(SinkSchemaError) as caught:
        sink.write(1, batch(change("c", 2, 2)))

    message = str(caught.value)
    assert f"table public.{table}: column {column!r} {what}" in message and "\n" not in message
    assert "--rebuild" in message
    assert sink.last_applied_batch() == 0
    assert [r["_commit_seq"] for r in sink.read_changelog()] == [1]

    # Repaired by hand, the same batch goes through and nothing is lost.
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f"ALTER TABLE {table} {repair}")
    assert sink.write(1, batch(change("c", 2, 2))) is True
    assert [r["_commit_seq"] for r in sink.read_changelog()] == [1, 2]
    sink.close()


def test_postgres_table_altered_underneath_is_recreated_by_a_rebuild(dsn: str) -> None:
    table = f"altered_{next(_tables)}"
    sink = PostgresSink(dsn, table, table, ["order_id"], SCHEMA)
    sink.write(0, batch(change("c", 1, 1)), lineage=Lineage("old", 1))
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f"ALTER TABLE {table} DROP COLUMN quantity")
    with pytest.raises(SinkSchemaError, match="'quantity' is missing"):
        sink.write(1, batch(change("c", 2, 2)), lineage=Lineage("old", 2))

    sink.begin_rebuild("new")
    sink.write(0, batch(change("c", 1, 1)), lineage=Lineage("new", 1))
    sink.write(1, batch(change("c", 2, 2)), lineage=Lineage("new", 2))
    sink.finish_rebuild()

    assert [r["quantity"] for r in sink.read_current()] == [2, 4]
    assert sink.write(2, batch(change("c", 3, 3)), lineage=Lineage("new", 3)) is True
    sink.close()


def test_postgres_progress_of_the_first_layout_is_migrated(dsn: str) -> None:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("CREATE SCHEMA legacy; SET search_path TO legacy; "
                    "CREATE TABLE txjoin_progress (job text PRIMARY KEY, batch_id bigint NOT "
                    "NULL, commit_seq bigint, updated_at timestamptz DEFAULT now()); "
                    "INSERT INTO txjoin_progress VALUES ('old_job', 7, 99, now())")
    sink = PostgresSink(dsn + "?options=-csearch_path%3Dlegacy", "orders", "old_job",
                        ["order_id"], SCHEMA)

    held = sink.held()

    assert held is not None and (held.checkpoint_id, held.last_batch_id) == (None, 7)
    assert sink.write(7, batch(change("c", 1, 1))) is False
    assert sink.write(8, batch(change("c", 1, 100))) is True
    sink.close()


# -- PostgreSQL going away mid-stream -----------------------------------------------

restartable = restartable_postgres.restartable  # the fixture


def test_postgres_down_mid_stream_is_retried_and_every_change_lands_once(
        restartable: restartable_postgres.RestartablePostgres) -> None:
    sink = PostgresSink(restartable.dsn, "orders", "job", ["order_id"], SCHEMA,
                        retry_timeout_s=60)
    sink.write(0, batch(change("c", 1, 1)), lineage=Lineage("ckpt", 1))
    restartable.stop()
    back = threading.Timer(5.0, restartable.start)
    back.start()
    started = time.monotonic()

    assert sink.write(1, batch(change("u", 1, 2), change("c", 2, 3)),
                      lineage=Lineage("ckpt", 3)) is True

    back.join()
    assert time.monotonic() - started >= 4
    assert [r["_commit_seq"] for r in sink.read_changelog()] == [1, 2, 3]
    assert sink.last_applied_batch() == 1
    sink.close()


def test_postgres_down_longer_than_the_limit_is_one_clear_error(
        restartable: restartable_postgres.RestartablePostgres) -> None:
    sink = PostgresSink(restartable.dsn, "orders", "job", ["order_id"], SCHEMA,
                        retry_timeout_s=3)
    sink.write(0, batch(change("c", 1, 1)))
    restartable.stop()
    started = time.monotonic()

    with pytest.raises(ServiceError) as caught:
        sink.write(1, batch(change("c", 2, 2)))

    assert time.monotonic() - started < 20
    message = str(caught.value)
    assert "\n" not in message
    assert "unreachable for 3s, batch 1 not written" in message
    assert "--postgres-retry-timeout" in message
    restartable.start()
    assert sink.write(1, batch(change("c", 2, 2))) is True
    assert [r["order_id"] for r in sink.read_current()] == [1, 2]
    sink.close()
