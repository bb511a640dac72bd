"""What a large transaction costs the shards' memory, in the core (no Spark, no broker).

    .venv/bin/python scripts/open_transaction_memory.py [--rows 300000] [--shards 2]
        [--batch 50000] [--out FILE]

The pizzeria job (``jobs/orders.py``) over a snapshot of 20 orders, then one transaction of
``--rows`` ``table_assignment`` inserts and ``--rows`` order inserts (order i at
assignment i: ``2 x rows`` changes), then one updating every order; its records delivered
``--batch`` at a time through the partitioned engine in one process
(:class:`txjoin.join.sharded.ShardedEngine`: every shard, its state log in memory), the
first transaction's END in the batch after its last event. After each batch: this
process's resident memory above what it held before the first (``/proc/self/statm``,
after a full collection), the output rows so far; at the end the process's CPU seconds
and its peak above the start. The state logs' stores are in this process (compressed), as
Spark's state store is in the executor's JVM: they are part of every figure.

Prints one JSON object and writes it to ``--out`` (default ``open-transaction-memory.json``).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import time
from pathlib import Path

from txjoin.bench import JOB
from txjoin.job import load_job
from txjoin.join.oracle import RowChange, SourceTransaction
from txjoin.join.shard import long_lived_state
from txjoin.join.sharded import ShardedEngine
from txjoin.scenarios.synthesize import Synthesizer
from txjoin.scenarios.workload import pizzeria_workload

ORDER_TIME = "2023-09-22T21:00:00"


def resident_mb() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() >> 20


def records(rows: int) -> list[tuple[str, int, int, str | None]]:
    """The snapshot, then the two transactions, as (topic, partition, offset, value)."""
    job = load_job(JOB)
    snapshot, _ = pizzeria_workload(0, seed=1, snapshot_orders=20)
    inserts: list[RowChange] = []
    for i in range(1000, 1000 + rows):
        inserts.append(RowChange("insert", "public.table_assignment", {
            "id": i, "client_id": 1, "table_id": 1 + i % 8, "time_in": ORDER_TIME,
            "time_out": None}))
        inserts.append(RowChange("insert", "public.orders", {
            "id": i, "table_assignment_id": i, "order_time": ORDER_TIME, "pizzas": [1, 2]}))
    updates = [RowChange("update", "public.orders", {
        "id": i, "table_assignment_id": i, "order_time": ORDER_TIME, "pizzas": [3]})
        for i in range(1000, 1000 + rows)]
    synth = Synthesizer(job)
    with long_lived_state():
        produced = [*synth.snapshot(snapshot),
                    *synth.transaction(SourceTransaction("inserts", inserts)),
                    *synth.transaction(SourceTransaction("updates", updates))]
        return [(r.topic, 0, r.offset, r.value) for r in produced]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--out", type=Path, default=Path("open-transaction-memory.json"))
    args = parser.parse_args()
    job = load_job(JOB)
    every = [*job.table_names, "transaction"]
    recs = records(args.rows)
    engine = ShardedEngine(job, args.shards)
    gc.collect()
    base, peak_before = resident_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.process_time()
    batches, output = [], 0
    for start in range(0, len(recs), args.batch):
        output += len(engine.process(recs[start:start + args.batch], every))
        gc.collect()
        batches.append({"records": start + args.batch, "resident_mb": resident_mb() - base,
                        "output_rows": output})
        print(json.dumps(batches[-1]), flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    open_mb = max(b["resident_mb"] for b in batches if b["output_rows"] <= 20)
    result = {"rows": args.rows, "shards": args.shards, "batch": args.batch,
              "records": len(recs), "cpu_s": round(time.process_time() - started, 1),
              "open_mb": open_mb, "after_mb": batches[-1]["resident_mb"],
              "peak_mb": (peak >> 10) - base if peak > peak_before else None,
              "commit_seq": engine.commit_seq, "batches": batches}
    print(json.dumps({k: v for k, v in result.items() if k != "batches"}))
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
