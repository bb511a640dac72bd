"""Delta commits without a Spark job (txjoin.sinks.delta_commit): the table a reader sees is
the one a DataFrame write would have left, through Spark and through delta-rs."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from txjoin.sinks.delta import _spark_schema, sink_session
from txjoin.sinks.delta_commit import DeltaCommitter

POINT = pa.struct([("x", pa.int32()), ("label", pa.string())])
SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    ("small", pa.int8()), ("medium", pa.int16()), ("count", pa.int32()),
    ("ratio", pa.float64()), ("flag", pa.bool_()), ("name", pa.string()),
    ("blob", pa.binary()), ("amount", pa.decimal128(12, 2)), ("big", pa.decimal128(38, 6)),
    ("day", pa.date32()), ("local_ts", pa.timestamp("us")),
    ("utc_ts", pa.timestamp("us", tz="UTC")),
    ("points", pa.list_(POINT)), ("point", POINT), ("tags", pa.list_(pa.string())),
])


@pytest.fixture(scope="module")
def delta_spark(spark: SparkSession) -> SparkSession:
    """The session the Delta sink reads and writes with (``sink_session``). The test session's
    own Delta settings rebuilt each new table version's state in 50 tasks: 12 s a read here
    under C1 (issue 34), 2 s with one task per core."""
    return sink_session(spark)


def rows(ids: range, tag: str) -> pa.Table:
    def row(i: int) -> dict:
        if i % 5 == 4:  # every column NULL but the key
            return {"id": i}
        return {"id": i, "small": i % 100 - 50, "medium": -i, "count": i * 3,
                "ratio": i / 7, "flag": i % 2 == 0, "name": f"{tag}-{i}-é",
                "blob": bytes([i % 256, 0]), "amount": Decimal(i) / 100,
                "big": Decimal("12345678901234567890.123456") + i,
                "day": date(2026, 1, 1 + i % 28), "local_ts": datetime(2026, 1, 2, 3, 4, i % 60),
                "utc_ts": datetime(2026, 1, 2, 3, 4, i % 60, 123456, tzinfo=UTC),
                "points": [{"x": i, "label": None}, {"x": -i, "label": "b"}],
                "point": {"x": i, "label": tag}, "tags": [tag, None]}
    return pa.Table.from_pylist([row(i) for i in ids], schema=SCHEMA)


def create(spark: SparkSession, path: Path) -> None:
    from delta.tables import DeltaTable as SparkDeltaTable

    SparkDeltaTable.createIfNotExists(spark).location(str(path)) \
        .addColumns(_spark_schema(SCHEMA)).execute()


def spark_rows(spark: SparkSession, path: Path, where: str | None = None) -> list:
    frame = spark.read.format("delta").load(str(path))
    return sorted((frame if where is None else frame.where(where)).collect(),
                  key=lambda r: r["id"])


def test_commits_without_a_spark_job_read_back_as_dataframe_writes_do(
        delta_spark: SparkSession, tmp_path: Path) -> None:
    spark = delta_spark
    written, committed = tmp_path / "written", tmp_path / "committed"
    create(spark, written)
    create(spark, committed)
    committer = DeltaCommitter(spark)
    schema_json = _spark_schema(SCHEMA).jsonValue()

    def both(data: pa.Table, mode: str, meta: str) -> None:
        (spark.createDataFrame(data, schema=_spark_schema(SCHEMA)).write.format("delta")
         .mode(mode).option("userMetadata", meta).save(str(written)))
        tracker = spark.sparkContext.statusTracker()
        spark.sparkContext.setJobGroup("direct-commit", "no job expected")
        try:
            version = committer.commit(str(committed), data, schema_json, meta,
                                       overwrite=mode == "overwrite")
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        assert list(tracker.getJobIdsForGroup("direct-commit")) == []
        assert version == DeltaTable(str(committed)).version()  # the version it committed

    both(rows(range(0, 20), "a"), "append", '{"n": 1}')
    both(rows(range(100, 120), "b"), "append", '{"n": 2}')
    assert spark_rows(spark, committed) == spark_rows(spark, written)
    # Data skipping with the files' statistics gives the rows a full scan gives.
    for where in ("id = 105", "id < 10", "count > 300", "day = DATE'2026-01-05'",
                  "small IS NULL", "name IS NULL", "id IN (4, 119)"):
        found = spark_rows(spark, committed, where)
        assert found == spark_rows(spark, written, where), where
        assert found, where

    both(rows(range(10, 30), "c"), "overwrite", '{"n": 3}')
    assert spark_rows(spark, committed) == spark_rows(spark, written)
    assert len(DeltaTable(str(committed)).file_uris()) == 1
    assert DeltaTable(str(committed)).to_pyarrow_table().sort_by("id") == \
        DeltaTable(str(written)).to_pyarrow_table().sort_by("id")

    # An empty commit is still a commit (the sink's progress moves with it).
    both(SCHEMA.empty_table(), "append", '{"n": 4}')
    table = DeltaTable(str(committed))
    assert table.version() == 4
    assert [(c["operation"], c["operationParameters"]["mode"], c["userMetadata"])
            for c in table.history(4)] == [
        ("WRITE", "Append", '{"n": 4}'), ("WRITE", "Overwrite", '{"n": 3}'),
        ("WRITE", "Append", '{"n": 2}'), ("WRITE", "Append", '{"n": 1}')]
    assert (committed / "_delta_log" / "00000000000000000004.crc").exists()
    assert json.loads(table.schema().to_json()) == schema_json


def test_a_table_that_is_not_plain_is_left_to_a_dataframe_write(
        delta_spark: SparkSession, tmp_path: Path) -> None:
    spark = delta_spark
    path = tmp_path / "constrained"
    create(spark, path)
    spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT positive CHECK (count > 0)")
    committer = DeltaCommitter(spark)
    version = DeltaTable(str(path)).version()

    assert committer.commit(str(path), rows(range(3), "a"), _spark_schema(SCHEMA).jsonValue(),
                            "{}", overwrite=False) is None
    assert DeltaTable(str(path)).version() == version
    assert not list(path.glob("*.parquet"))
