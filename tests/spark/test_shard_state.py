"""A shard's log on Spark's own state store: what a compaction does lands as one batch.

``state_log.ShardLog`` compacts by clearing the shard's log and writing a snapshot in
the same batch (``BlobStore.clear``); the core's tests run it on ``MemoryStore``. Here
the same calls go through ``_SparkBlobStore`` to transformWithState's RocksDB store:
after a clear and a put in one batch, a restarted query finds exactly the put, and the
meta value untouched.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from txjoin.join.spark.shards import (
    LOG_KEY_SCHEMA,
    LOG_VALUE_SCHEMA,
    META_SCHEMA,
    _SparkBlobStore,
)
from txjoin.pipeline.pipeline import STATE_STORE_CONF

pytestmark = pytest.mark.spark

KEYS = [(0, 1), (0, 2), (1, 0), (1, 3)]


class _Probe(StatefulProcessor):
    """Runs the commands of its input lines on a shard's store; emits what the store holds."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.store = _SparkBlobStore(handle.getValueState("meta", META_SCHEMA),
                                     handle.getMapState("log", LOG_KEY_SCHEMA,
                                                        LOG_VALUE_SCHEMA))

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: Any) -> Iterator[pd.DataFrame]:
        for frame in rows:
            for line in frame["value"]:
                op, *args = line.split()
                if op == "put":
                    self.store.put(int(args[0]), int(args[1]), 0, args[2].encode())
                elif op == "meta":
                    self.store.put_meta({"version": int(args[0])})
                elif op == "clear":
                    self.store.clear()
        held = {f"{k},{v}": (None if (b := self.store.get(k, v, 0)) is None else b.decode())
                for k, v in KEYS}
        yield pd.DataFrame({"held": [json.dumps({"log": held, "meta": self.store.get_meta()})]})

    def close(self) -> None:
        pass


def _batch(spark: SparkSession, tmp_path: Path, lines: list[str]) -> dict[str, Any]:
    """Add a file of commands, run the query on it to the end, return what the store held."""
    inbox = tmp_path / "in"
    inbox.mkdir(exist_ok=True)
    (inbox / f"{len(list(inbox.iterdir())):03d}.txt").write_text("\n".join(lines) + "\n")
    for key, value in STATE_STORE_CONF.items():
        spark.conf.set(key, value)
    seen: list[str] = []

    def collect(df: DataFrame, _batch_id: int) -> None:
        seen.extend(r["held"] for r in df.collect())

    query = (spark.readStream.format("text").load(str(inbox))
             .selectExpr("1 AS shard", "value").groupBy("shard")
             .transformWithStateInPandas(_Probe(), "held string", "Append", "None")
             .writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert len(seen) == 1, seen
    held: dict[str, Any] = json.loads(seen[0])
    return held


def test_a_clear_and_a_put_in_one_batch_leave_exactly_the_put(
        spark: SparkSession, tmp_path: Path) -> None:
    first = _batch(spark, tmp_path, ["meta 7", "put 0 1 a", "put 0 2 b", "put 1 0 c"])
    assert first == {"log": {"0,1": "a", "0,2": "b", "1,0": "c", "1,3": None},
                     "meta": {"version": 7}}
    # a compaction's shape: everything goes, a snapshot comes, in the same batch
    second = _batch(spark, tmp_path, ["clear", "put 1 3 d"])
    assert second == {"log": {"0,1": None, "0,2": None, "1,0": None, "1,3": "d"},
                      "meta": {"version": 7}}
    # a new query on the checkpoint reads the committed store: the same
    third = _batch(spark, tmp_path, ["noop"])
    assert third == second
