"""What the core spends to load an initial snapshot and to release it (no Spark).

    .venv/bin/python scripts/release_cost.py --orders 50000 --repeat 3 --out release.json

The pizzeria's snapshot of ``--orders`` orders (a quarter as many clients and table
assignments, as ``txjoin bench --snapshot-orders``) as Debezium records, fed to the
partitioned engine (``ShardedEngine``, its state logs in memory) in batches of
``--batch`` records; the last batch marks every topic caught up, which releases the
snapshot: every order evaluated and emitted. Prints and writes, per run, the CPU seconds
of the loading batches and of the releasing one, and the release's microseconds per
output row (the best run is the figure; the others show the spread). The releasing batch
is what a snapshot's or a large transaction's release costs a shard in a Spark task
(``shard_join`` and ``shard_state_save`` in ``txjoin bench``'s per-batch stages).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(orders: int, shards: int, batch: int) -> dict[str, float]:
    from txjoin.job import load_job
    from txjoin.join.sharded import ShardedEngine
    from txjoin.scenarios.synthesize import Synthesizer
    from txjoin.scenarios.workload import pizzeria_workload

    job = load_job(REPO / "jobs" / "orders.py")
    snapshot, _ = pizzeria_workload(0, seed=1, snapshot_orders=orders)
    records = [(r.topic, 0, r.offset, r.value) for r in Synthesizer(job).snapshot(snapshot)]
    every = [*job.table_names, "transaction"]
    engine = ShardedEngine(job, shards)
    last = (len(records) - 1) // batch * batch  # the start of the releasing batch
    started = time.process_time()
    for i in range(0, last, batch):
        if engine.process(records[i:i + batch]):
            raise SystemExit("the snapshot was released before its last batch")
    loaded = time.process_time()
    changes = engine.process(records[last:], every)
    released = time.process_time()
    assert engine.snapshot_released and len(changes) == orders, (len(changes), orders)
    return {"records": len(records), "load_cpu_s": round(loaded - started, 3),
            "load_records_per_cpu_s": round((last or 1) / max(1e-9, loaded - started)),
            "release_cpu_s": round(released - loaded, 3),
            "release_us_per_row": round(1e6 * (released - loaded) / orders, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=50_000)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--batch", type=int, default=25_000, help="records a batch")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("release-cost.json"))
    args = parser.parse_args(argv)
    runs = [run(args.orders, args.shards, args.batch) for _ in range(args.repeat)]
    for each in runs:
        print(json.dumps(each))
    best = min(runs, key=lambda r: r["release_cpu_s"])
    result = {"orders": args.orders, "shards": args.shards, "batch": args.batch,
              "best": best, "runs": runs}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"release of {args.orders:,} orders: {best['release_cpu_s']} s CPU "
          f"({best['release_us_per_row']} us a row); loading "
          f"{best['load_records_per_cpu_s']:,} records per CPU second; written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
