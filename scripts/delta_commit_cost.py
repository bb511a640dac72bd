"""Per-commit cost of the Delta sink: seconds and Spark jobs per commit at 100 and 25k changes.

    .venv/bin/python scripts/delta_commit_cost.py [--master local[2]] [--commits 6]
        [--keys 100000] [--sizes 100,25000] [--merge] [--dataframe]

One commit = what the sink does for one write (changelog append + MERGE into current),
through ``DeltaSink.write`` (present in every txjoin version, so the same script measures
an older checkout: ``PYTHONPATH=<checkout> python scripts/delta_commit_cost.py``). The
current table is seeded with 100k keys first (``--keys``); each commit then updates/inserts
random keys of 0..150k. The first commits at each size warm up and are not counted. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime

import pyarrow as pa

from txjoin.pipeline.session import get_session
from txjoin.sinks.delta import DeltaSink
from txjoin.sinks.lineage import Lineage

SCHEMA = pa.schema([("order_id", pa.int64()), ("customer", pa.string()),
                    ("total", pa.decimal128(12, 2)), ("_op", pa.string()),
                    ("_commit_seq", pa.int64()), ("_xid", pa.int64()),
                    ("_commit_ts", pa.timestamp("us", tz="UTC"))])


def changes(n: int, seq: int, rnd: random.Random, keys: range) -> pa.Table:
    ts = datetime.now(UTC)
    picked = rnd.sample(keys, n)
    return pa.Table.from_pylist(
        [{"order_id": k, "customer": f"c{k % 977}", "total": None, "_op": "u",
          "_commit_seq": seq + i, "_xid": seq + i, "_commit_ts": ts}
         for i, k in enumerate(picked)], schema=SCHEMA)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--commits", type=int, default=6, help="measured commits per size")
    parser.add_argument("--warm-up", type=int, default=2)
    parser.add_argument("--keys", type=int, default=100_000,
                        help="keys the current table is seeded with (commits then touch "
                             "random keys of 0..1.5x this)")
    parser.add_argument("--sizes", default="100,25000",
                        help="changes per commit, comma-separated")
    parser.add_argument("--merge", action="store_true",
                        help="MERGE into the current table instead of rewriting the files "
                             "holding the changed keys (the sink's way for tables it cannot "
                             "commit files to)")
    parser.add_argument("--dataframe", action="store_true",
                        help="write every commit as a delta-spark DataFrame write (the sink's "
                             "way before txjoin.sinks.delta_commit)")
    args = parser.parse_args()
    if args.dataframe:
        from txjoin.sinks import delta_commit

        delta_commit.DeltaCommitter.commit = lambda *a, **k: False  # type: ignore[method-assign]
    if args.merge:
        from txjoin.sinks import delta_commit

        delta_commit.DeltaCommitter.commit_rewrite = (  # type: ignore[method-assign]
            lambda *a, **k: None)
    spark = get_session(args.master, app_name="delta-commit-cost")
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    rnd = random.Random(1)
    # Where a commit's seconds go: building the source DataFrames (``DeltaSink._frame``,
    # the Python side) against the rest (the changelog append's and MERGE's Spark jobs,
    # Delta's snapshot and checksum), timed around the sink's own steps.
    spent: dict[str, float] = {}

    def timed(name: str, method):  # type: ignore[no-untyped-def]
        def wrapper(*a, **k):  # type: ignore[no-untyped-def]
            before = time.monotonic()
            try:
                return method(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.monotonic() - before
        return wrapper
    stages: dict[int, list[list[str]]] = {}
    out: dict[str, object] = {"master": args.master, "keys": args.keys,
                               "current_table": "merge" if args.merge else "sink's default",
                               "writer": "dataframe" if args.dataframe else "sink's default"}
    with tempfile.TemporaryDirectory(prefix="delta-commit-cost-") as work:
        sink = DeltaSink(work, "orders", "cost", ["order_id"], SCHEMA, spark=spark)
        for step in ("_frame", "_save", "_commit_rows", "_merge_current", "_create"):
            if hasattr(sink, step):
                setattr(sink, step, timed(step, getattr(sink, step)))
        batch, seq = 0, 1
        sink.write(batch, changes(args.keys, seq, rnd, range(args.keys)), Lineage("ckpt", seq))
        batch, seq = batch + 1, seq + args.keys
        for n in (int(size) for size in args.sizes.split(",")):
            seconds, jobs = [], []
            steps: dict[str, list[float]] = {}
            for i in range(args.warm_up + args.commits):
                table = changes(n, seq, rnd, range(args.keys * 3 // 2))
                group = f"commit-{batch}"
                sc.setJobGroup(group, group)
                spent.clear()
                before = time.monotonic()
                sink.write(batch, table, Lineage("ckpt", seq + n))
                took = time.monotonic() - before
                batch, seq = batch + 1, seq + n
                if i >= args.warm_up:
                    seconds.append(took)
                    ids = sorted(tracker.getJobIdsForGroup(group))
                    jobs.append(len(ids))
                    # What each job was (its stages' call sites), for the last commit.
                    stages[n] = [[info.name for sid in job.stageIds
                                  if (info := tracker.getStageInfo(sid)) is not None]
                                 for job in (tracker.getJobInfo(i) for i in ids)
                                 if job is not None]
                    for step, took_step in spent.items():
                        steps.setdefault(step, []).append(took_step)
            out[f"changes_{n}"] = {
                "seconds_mean": round(statistics.mean(seconds), 3),
                "seconds_min": round(min(seconds), 3), "seconds_max": round(max(seconds), 3),
                "spark_jobs_per_commit": sorted(set(jobs)), "commits": len(seconds),
                "last_commit_jobs_stages": stages.get(n, []),
                "step_seconds_mean": {k.lstrip("_"): round(statistics.mean(v), 3)
                                      for k, v in sorted(steps.items())}}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
