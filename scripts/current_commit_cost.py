"""A group commit's cost into a large Delta current table, by changed keys and key pattern.

    nice .venv/bin/python scripts/current_commit_cost.py --rows 10000000 \\
        [--sizes 100,25000,250000] [--patterns recent,random] [--commits 2] [--out FILE]

Seeds a current table of ``--rows`` keys (0..rows-1) clustered as the sink keeps it (files
of ``CLUSTER_FILE_ROWS`` rows, sorted by key; written here with pyarrow a file at a time and
committed as one append, so seeding never holds the table either), then times group commits
through ``DeltaSink.write_group`` (changelog append + current table), each of ``n`` changed
keys:

- ``recent``: half updates of keys among the newest 1% of the table, half new keys above
  every key (a CDC workload's increasing order ids);
- ``random``: updates of keys drawn uniformly over the whole table.

Prints JSON: per pattern and size the wall seconds of the commit, of its current-table
part, the driver's CPU seconds (Python and its JVM), the CPU seconds of the Spark tasks'
Python workers (where the files a commit touches are rewritten) and the files and rows the
commit read and wrote; the driver's peak RSS (Python, JVM) at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from txjoin.pipeline.session import get_session
from txjoin.procfs import STAT_PPID, cpu_seconds, stat_fields
from txjoin.sinks import current_schema, delta_current
from txjoin.sinks.delta import DeltaSink, _spark_schema
from txjoin.sinks.delta_commit import DeltaCommitter
from txjoin.sinks.handoff import Parcel
from txjoin.sinks.lineage import Lineage

SCHEMA = pa.schema([("order_id", pa.int64()), ("customer", pa.string()),
                    ("total", pa.decimal128(12, 2)), ("_op", pa.string()),
                    ("_commit_seq", pa.int64()), ("_xid", pa.int64()),
                    ("_commit_ts", pa.timestamp("us", tz="UTC"))])


def _rows(keys: list[int], op: str, seq: int) -> pa.Table:
    ts = datetime.now(UTC)
    n = len(keys)
    return pa.table({"order_id": pa.array(keys, pa.int64()),
                     "customer": pa.array([f"c{k % 977}-{seq}" for k in keys]),
                     "total": pa.array([None] * n, pa.decimal128(12, 2)),
                     "_op": pa.array([op] * n),
                     "_commit_seq": pa.array(range(seq, seq + n), pa.int64()),
                     "_xid": pa.array(range(seq, seq + n), pa.int64()),
                     "_commit_ts": pa.array([ts] * n, pa.timestamp("us", tz="UTC"))},
                    schema=SCHEMA)


def _seed(sink: DeltaSink, spark: Any, rows: int) -> None:
    """The current table of keys 0..rows-1, clustered; its lineage: batch 0."""
    sink.write(0, _rows([], "c", 1), Lineage("ckpt", 0))  # creates both tables
    schema = current_schema(sink.stored)
    files = []
    step = delta_current.CLUSTER_FILE_ROWS
    for start in range(0, rows, step):
        piece = _rows(list(range(start, min(rows, start + step))), "c", 1 + start)
        files.append(delta_current._write(sink.current_path,
                                          piece.drop_columns(["_op"]).cast(schema)))
    DeltaCommitter(spark).commit_files(
        sink.current_path, files, _spark_schema(schema).jsonValue(),
        sink._metadata(0, Lineage("ckpt", 0), None))
    sink._known.clear()


def _cpu(jvm_pid: int) -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    fields = stat_fields(jvm_pid)
    assert fields is not None, f"the driver's JVM {jvm_pid} is gone"
    return own.ru_utime + own.ru_stime + cpu_seconds(fields)


def _tasks_cpu(jvm_pid: int) -> float:
    """CPU seconds of the JVM's Python worker processes (the tasks that rewrite files): every
    live descendant's, with what its exited children used."""
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := stat_fields(int(entry.name))) is not None:
            stats[int(entry.name)] = fields
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[STAT_PPID]), []).append(pid)
    total, todo = 0.0, list(children.get(jvm_pid, []))
    while todo:
        pid = todo.pop()
        total += cpu_seconds(stats[pid], reaped=True)
        todo += children.get(pid, [])
    return total


def _peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--sizes", default="100,25000,250000")
    parser.add_argument("--patterns", default="recent,random")
    parser.add_argument("--commits", type=int, default=2, help="measured commits per size")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args()
    spark = get_session(args.master, app_name="current-commit-cost")
    jvm_pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
    rnd = random.Random(1)
    out: dict[str, Any] = {"rows": args.rows, "master": args.master,
                           "file_rows": delta_current.CLUSTER_FILE_ROWS,
                           "load_before": os.getloadavg()}
    spent: dict[str, Any] = {}
    original = delta_current.rewrite

    def counted(*a: Any, **k: Any) -> delta_current.Rewrite:
        done = original(*a, **k)
        spent.update(files_removed=len(done.removed), files_added=len(done.added),
                     rows_read=done.rows_read, rows_written=done.rows_written)
        return done

    delta_current.rewrite = counted  # type: ignore[assignment]
    with tempfile.TemporaryDirectory(prefix="current-commit-cost-", dir=".") as work:
        sink = DeltaSink(work, "orders", "cost", ["order_id"], SCHEMA, spark=spark)
        before = time.monotonic()
        _seed(sink, spark, args.rows)
        out["seed_seconds"] = round(time.monotonic() - before, 1)
        top, batch, seq = args.rows, 1, args.rows + 1
        for pattern in args.patterns.split(","):
            for n in (int(size) for size in args.sizes.split(",")):
                runs = []
                for _ in range(1 + args.commits):  # the first warms up
                    if pattern == "recent":
                        recent = range(max(0, top - args.rows // 100), top)
                        updates = rnd.sample(recent, min(n // 2, len(recent)))
                        new = list(range(top, top + n - len(updates)))
                        top += len(new)
                        keys = updates + new
                    else:
                        keys = rnd.sample(range(top), n)
                    changes = _rows(keys, "u", seq)
                    parcel = Parcel(batch, changes, Lineage("ckpt", seq + n), time.time())
                    spent.clear()
                    cpu, tasks, wall = _cpu(jvm_pid), _tasks_cpu(jvm_pid), time.monotonic()
                    seconds = sink.write_group([parcel])
                    runs.append({"seconds": round(time.monotonic() - wall, 2),
                                 "current_seconds": round(seconds["current"], 2),
                                 "cpu_seconds": round(_cpu(jvm_pid) - cpu, 2),
                                 "tasks_cpu_seconds": round(_tasks_cpu(jvm_pid) - tasks, 2),
                                 **spent})
                    batch, seq = batch + 1, seq + n
                out[f"{pattern}_{n}"] = runs[1:]
                print(pattern, n, runs[1:], "load", os.getloadavg(), flush=True)
    out["driver_peak_rss_mb"] = {
        "python": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "jvm": round(_peak_mb(jvm_pid))}
    out["load_after"] = os.getloadavg()
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
