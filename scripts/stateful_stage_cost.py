"""What Spark's micro-batch costs before txjoin's code does anything: the same small stream
through queries of growing shape, each with a trivial body.

    .venv/bin/python scripts/stateful_stage_cost.py [--seconds 45] [--rate 200]
        [--shapes plain,shuffle,python,apply-hdfs,apply,tws] [--out stateful-stage-cost.json]

Each shape runs in a process of its own (a new driver JVM, as the demo's is: in one JVM
the later shapes would run on code the earlier ones compiled) for ``--seconds`` on
``local[2]`` in a session of txjoin's settings
(``txjoin.pipeline.session``: the worker daemon, FAIR, 2 shuffle partitions), over Spark's
``rate`` source (``--rate`` rows/s in 5 partitions, about what the demo's 50 transactions/s
bring), trigger 200 ms, and a ``foreachBatch`` that collects the batch (``toArrow``), as
txjoin's does:

- ``plain``: the source's rows collected;
- ``shuffle``: repartitioned by a 2-valued key first (what ``groupBy(shard)`` shuffles);
- ``python``: then a Python runner per partition (``mapInPandas``, returning its rows);
- ``apply-hdfs``: ``applyInPandasWithState`` by that key instead (a count in its state),
  Spark's default state store;
- ``apply``: the same with RocksDB (txjoin's store);
- ``tws``: ``transformWithStateInPandas`` with RocksDB, a value state and a map state of
  txjoin's schemas, one small value written a batch (what ``txjoin.join.spark.shards`` runs,
  less all of txjoin).

Prints, per shape, the p50 and p90 of Spark's ``triggerExecution``, ``addBatch`` and
``queryPlanning`` over the batches after the first third (a new driver's JIT), and writes
them to ``--out``. The difference between shapes is what each step of Spark's machinery
costs a micro-batch; ``tws`` against a real batch of ``scripts/batch_cycle.py`` is what
txjoin's own code costs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SHAPES = ("plain", "shuffle", "python", "apply-hdfs", "apply", "tws")


def run_shape(shape: str, seconds: float, rate: int) -> dict[str, Any]:
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.streaming.state import GroupStateTimeout

    from txjoin.join.spark.shards import LOG_KEY_SCHEMA, LOG_VALUE_SCHEMA, META_SCHEMA
    from txjoin.pipeline.pipeline import STATE_STORE_CONF
    from txjoin.pipeline.session import get_session, stop_session

    class Trivial(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            self.meta = handle.getValueState("meta", META_SCHEMA)
            self.log = handle.getMapState("log", LOG_KEY_SCHEMA, LOG_VALUE_SCHEMA)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            n = sum(len(f) for f in rows)
            self.meta.update((b"x" * 100,))
            yield pd.DataFrame({"shard": [int(key[0])], "n": [n]})

        def close(self) -> None:
            pass

    def count(key: Any, frames: Any, state: Any) -> Any:
        n = sum(len(f) for f in frames)
        state.update((n,))
        yield pd.DataFrame({"shard": [int(key[0])], "n": [n]})

    def rows(frames: Any) -> Any:
        for frame in frames:
            yield frame[["shard", "value"]]

    work = Path(tempfile.mkdtemp(prefix="stateful-stage-cost-"))
    conf = {"spark.sql.shuffle.partitions": "2"}
    if shape in ("apply", "tws"):
        conf.update(STATE_STORE_CONF)  # txjoin's store
    spark = get_session("local[2]", app_name=f"stateful-stage-cost-{shape}", extra_conf=conf)
    try:
        source = (spark.readStream.format("rate").option("rowsPerSecond", rate)
                  .option("numPartitions", 5).load()
                  .withColumn("shard", (F.col("value") % 2).cast("int")))
        if shape == "plain":
            out = source.select("shard", "value")
        elif shape == "shuffle":
            out = source.repartition(2, "shard").select("shard", "value")
        elif shape == "python":
            out = source.repartition(2, "shard").mapInPandas(rows, "shard int, value long")
        elif shape in ("apply-hdfs", "apply"):
            out = source.groupBy("shard").applyInPandasWithState(
                count, "shard int, n long", "n long", "Append", GroupStateTimeout.NoTimeout)
        else:
            out = source.groupBy("shard").transformWithStateInPandas(
                Trivial(), "shard int, n long", "Append", "None")
        query = (out.writeStream.foreachBatch(lambda df, _batch: df.toArrow())
                 .option("checkpointLocation", str(work / "checkpoint"))
                 .trigger(processingTime="200 milliseconds").start())
        time.sleep(seconds)
        query.stop()
        progress = query.recentProgress
    finally:
        stop_session()
    steady = progress[len(progress) // 3:]
    figures: dict[str, Any] = {"batches": len(progress), "steady": len(steady)}
    for phase in ("triggerExecution", "addBatch", "queryPlanning"):
        values = sorted(p["durationMs"].get(phase, 0) for p in steady)
        figures[phase] = {"p50": statistics.median(values),
                          "p90": values[int(len(values) * 0.9)]}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--out", default="stateful-stage-cost.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a shape, in this process: JSON out
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_shape(args.one, args.seconds, args.rate)))
        return
    results: dict[str, Any] = {"seconds": args.seconds, "rate": args.rate, "shapes": {}}
    print("shape        batches  trigger p50/p90  addBatch p50/p90  planning p50/p90 (ms)")
    for shape in args.shapes.split(","):
        if shape not in SHAPES:
            raise SystemExit(f"--shapes: {shape!r} is not one of {', '.join(SHAPES)}")
        done = subprocess.run([sys.executable, __file__, "--one", shape, "--seconds",
                               str(args.seconds), "--rate", str(args.rate)],
                              stdout=subprocess.PIPE, text=True, check=True)
        f = results["shapes"][shape] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{shape:<12} {f['batches']:>7}  " + "  ".join(
            f"{f[p]['p50']:>7.0f} /{f[p]['p90']:>5.0f}"
            for p in ("triggerExecution", "addBatch", "queryPlanning")), flush=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
