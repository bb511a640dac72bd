"""The Delta sink's log checkpoints, written with delta-rs (``delta_commit.checkpoint_if_due``).

delta-spark wrote them inside the commit that reached one, with Spark jobs (3.7-10 s, the
stream stalled beside it); the sink's tables turn that off and the sink writes them itself
every ``CHECKPOINT_INTERVAL`` commits, expiring the log as delta-spark's checkpoint did.
Here on tables written by delta-rs (no Spark); tests/spark/test_sinks.py reads the sink's
own tables through them with delta-spark.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from txjoin.sinks import delta_commit
from txjoin.sinks.delta_commit import SPARK_CHECKPOINTS_OFF, checkpoint_if_due

pytestmark = pytest.mark.unit


def _commit(path: Path, value: int, configuration: dict[str, str] | None = None) -> int:
    write_deltalake(path, pa.table({"a": [value]}), mode="append", configuration=configuration)
    log = path / "_delta_log"
    version = DeltaTable(path).version()
    # what delta-spark and Hadoop's local file system leave beside each commit
    (log / f"{version:020d}.crc").write_text("{}")
    (log / f".{version:020d}.json.crc").write_bytes(b"crc")
    return version


def _checkpoints(path: Path) -> list[int]:
    return sorted(int(f.name[:20]) for f in (path / "_delta_log").glob("*.checkpoint.parquet"))


def test_a_table_of_the_sinks_gets_a_checkpoint_every_interval_and_reads_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delta_commit, "CHECKPOINT_INTERVAL", 3)
    path = tmp_path / "t"
    written = [checkpoint_if_due(str(path), _commit(
        path, v, {"delta.checkpointInterval": SPARK_CHECKPOINTS_OFF} if v == 0 else None))
        for v in range(8)]
    assert written == [False, False, False, True, False, False, True, False]
    assert _checkpoints(path) == [3, 6]
    assert json.loads((path / "_delta_log" / "_last_checkpoint").read_text())["version"] == 6
    # a reader starting from the checkpoint sees every commit's row
    assert sorted(DeltaTable(path).to_pyarrow_table().column("a").to_pylist()) == list(range(8))
    # without the version (a DataFrame write or a MERGE): read from the table
    _commit(path, 8)
    _commit(path, 9)
    assert checkpoint_if_due(str(path)) is True and _checkpoints(path) == [3, 6, 9]


def test_a_checkpoint_expires_the_log_before_it_with_its_checksum_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delta_commit, "CHECKPOINT_INTERVAL", 3)
    path = tmp_path / "t"
    log = path / "_delta_log"
    for v in range(3):
        _commit(path, v, {"delta.checkpointInterval": SPARK_CHECKPOINTS_OFF,
                          "delta.logRetentionDuration": "interval 1 seconds"} if v == 0 else None)
    # delta-spark's checkpoint pointer of an older table, with Hadoop's checksum of it
    (log / "._last_checkpoint.crc").write_bytes(b"crc of delta-spark's _last_checkpoint")
    time.sleep(1.2)  # versions 0-2 older than the retention
    assert checkpoint_if_due(str(path), _commit(path, 3)) is True
    kept = sorted(f.name for f in log.iterdir() if f.name != "_last_checkpoint")
    assert kept == [".00000000000000000003.json.crc", "00000000000000000003.checkpoint.parquet",
                    "00000000000000000003.crc", "00000000000000000003.json"]
    assert sorted(DeltaTable(path).to_pyarrow_table().column("a").to_pylist()) == [0, 1, 2, 3]


def test_a_table_delta_spark_checkpoints_itself_is_left_to_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an older table (interval 100, or Delta's default): delta-spark still checkpoints it
    # inside its commits until `txjoin maintain` moves it over
    monkeypatch.setattr(delta_commit, "CHECKPOINT_INTERVAL", 2)
    path = tmp_path / "t"
    assert [checkpoint_if_due(str(path), _commit(
        path, v, {"delta.checkpointInterval": "100"} if v == 0 else None))
        for v in range(5)] == [False] * 5
    assert _checkpoints(path) == []


def test_a_checkpoint_that_fails_is_a_warning_and_the_table_stays_readable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(delta_commit, "CHECKPOINT_INTERVAL", 2)
    path = tmp_path / "t"
    for v in range(2):
        _commit(path, v, {"delta.checkpointInterval": SPARK_CHECKPOINTS_OFF} if v == 0 else None)

    def refused(self: DeltaTable) -> None:
        raise OSError("No space left\non device")

    monkeypatch.setattr(DeltaTable, "create_checkpoint", refused)
    with caplog.at_level("WARNING", logger="txjoin.delta"):
        assert checkpoint_if_due(str(path), _commit(path, 2)) is False
    assert [r.getMessage() for r in caplog.records] == [
        f"delta sink: no log checkpoint of {path} at version 2 (No space left on device); "
        "the table is intact and readers read its commits; tried again at its next commit"]
    assert _checkpoints(path) == []
    assert sorted(DeltaTable(path).to_pyarrow_table().column("a").to_pylist()) == [0, 1, 2]
