"""Issue 65's staged engine, its first question: what a stateful stage before the shards costs
a micro-batch, and whether Spark runs the shape at all.

    .venv/bin/python scripts/staged_stage_cost.py [--seconds 25] [--rows-per-second 2000]
        [--groups 97] [--shards 2] [--out staged-stage-cost.json]

Two streaming queries over Spark's ``rate`` source (no broker), each for ``--seconds``, one
after the other, on ``local[2]`` with RocksDB state stores, the trigger every second:

- ``one_stage``: the rows, keyed by shard (``value % shards``), into one
  ``transformWithStateInPandas`` (Append), as txjoin's shards are today;
- ``two_stages``: first an ``applyInPandasWithState`` keyed by transaction group
  (``value % groups``: the staged engine's assembly by transaction) emitting one report row
  per group that had input, each copied to every shard (``explode``), unioned with the rows
  keyed by shard, into the same ``transformWithStateInPandas``: the shape in which
  transactions are assembled once and the shards learn the commit frontier in the same
  micro-batch;
- ``two_stages_jvm``: the same with the first stage in the JVM, a ``flatMapGroupsWithState``
  of txjoin's probe jar (jvm/stageprobe, built by scripts/jars.sh; skipped without it).

Each query's shard stage counts the rows and the reports it received per batch, so the run
also checks that every report of a batch reaches every shard in that batch. Prints and
writes JSON: per query the p50 over the steady batches (the first 5 dropped) of the
``foreachBatch`` compute (the batch's one Spark job) and of the trigger (Spark's whole
micro-batch), and the reports per shard per batch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from txjoin.jvm import stage_probe_jar
from txjoin.pipeline.pipeline import ROCKSDB_PROVIDER
from txjoin.pipeline.session import get_session

WARM_UP = 5  # batches left out of the figures


def _count(key: tuple[Any, ...], frames: Iterator[pd.DataFrame],
           state: GroupState) -> Iterator[pd.DataFrame]:
    """The transaction group's stage: its running count of rows, one report row a batch."""
    seen = sum(len(f) for f in frames) + (state.get[0] if state.exists else 0)
    state.update((seen,))
    yield pd.DataFrame({"grp": [key[0]], "seen": [seen]})


class _Shard(StatefulProcessor):
    """The shard's stage: rows and reports received in the batch."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: Any) -> Iterator[pd.DataFrame]:
        got = reports = 0
        for frame in rows:
            got += int(frame["value"].notna().sum())
            reports += int(frame["seen"].notna().sum())
        yield pd.DataFrame({"shard": [int(key[0])], "rows": [got], "reports": [reports]})

    def close(self) -> None:
        pass


def _query(spark: SparkSession, staged: str, args: argparse.Namespace) -> DataFrame:
    raw = (spark.readStream.format("rate").option("rowsPerSecond", args.rows_per_second).load()
           .select(F.col("value")))
    rows = raw.select((F.col("value") % args.shards).alias("shard"), F.col("value"),
                      F.lit(None).cast("long").alias("seen"))
    if staged:
        if staged == "jvm":
            jvm: Any = spark._jvm
            counted = DataFrame(jvm.txjoin.staged.GroupCount.reports(raw._jdf, args.groups),
                                spark)
        else:
            counted = (raw.select((F.col("value") % args.groups).alias("grp"), F.col("value"))
                       .groupBy("grp")
                       .applyInPandasWithState(_count, "grp long, seen long", "seen long",
                                               "append", GroupStateTimeout.NoTimeout))
        reports = (counted.select(F.explode(F.array(*[F.lit(s) for s in range(args.shards)]))
                           .alias("shard"), F.lit(None).cast("long").alias("value"),
                           F.col("seen")))
        rows = rows.unionByName(reports)
    return rows.groupBy("shard").transformWithStateInPandas(
        _Shard(), "shard long, rows long, reports long", "Append", "None")


def _run(spark: SparkSession, staged: str, args: argparse.Namespace) -> dict[str, Any]:
    computes: list[float] = []
    reports: list[list[int]] = []

    def sink(frame: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        rows = frame.collect()
        computes.append(time.monotonic() - started)
        reports.append([int(r["reports"]) for r in sorted(rows, key=lambda r: r["shard"])])

    checkpoint = tempfile.mkdtemp(prefix="staged-stage-cost-")
    try:
        query = (_query(spark, staged, args).writeStream.foreachBatch(sink)
                 .option("checkpointLocation", checkpoint)
                 .trigger(processingTime="1 second").start())
        time.sleep(args.seconds)
        query.stop()
        triggers = [p["durationMs"].get("triggerExecution", 0) / 1000
                    for p in query.recentProgress]
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    steady = slice(WARM_UP, None)
    return {"batches": len(computes),
            "compute_p50_s": round(statistics.median(computes[steady]), 3),
            "trigger_p50_s": round(statistics.median(triggers[steady]), 3),
            # every shard received the same reports in each batch (all groups' of that batch)
            "reports_reach_every_shard": all(len(set(r)) == 1 for r in reports[steady]),
            "reports_per_shard": reports[steady]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=25.0)
    parser.add_argument("--rows-per-second", type=int, default=2000)
    parser.add_argument("--groups", type=int, default=97)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("staged-stage-cost.json"))
    args = parser.parse_args()
    jar = stage_probe_jar()
    conf = {"spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER}
    if jar is not None:
        conf["spark.driver.extraClassPath"] = str(jar)
    spark = get_session("local[2]", app_name="staged-stage-cost", extra_conf=conf)
    out: dict[str, Any] = {"rows_per_second": args.rows_per_second, "groups": args.groups,
                           "shards": args.shards}
    runs = [("one_stage", ""), ("two_stages", "python")]
    if jar is None:
        print("no jvm/stageprobe jar (scripts/jars.sh builds it with a JDK's javac): "
              "the JVM stage is not measured", flush=True)
    else:
        runs.append(("two_stages_jvm", "jvm"))
    for name, staged in runs:
        out[name] = _run(spark, staged, args)
        print(name, {k: v for k, v in out[name].items() if k != "reports_per_shard"},
              flush=True)
    for name, suffix in (("two_stages", ""), ("two_stages_jvm", "_jvm")):
        if name in out:
            for figure in ("compute", "trigger"):
                out[f"extra_stage{suffix}_{figure}_s"] = round(
                    out[name][f"{figure}_p50_s"] - out["one_stage"][f"{figure}_p50_s"], 3)
    text = json.dumps(out, indent=2)
    print(json.dumps({k: v for k, v in out.items() if not isinstance(v, dict)}, indent=2))
    args.out.write_text(text + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
