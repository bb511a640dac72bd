"""Issue 65: what the staged engine's split saves in the core, shard count by shard count.

    .venv/bin/python scripts/staged_core_sweep.py [-n 30000] [--shards 1,2,4,8]
        [--max-events 25000] [--seed 1] [--split ta,c] [--out staged-core-sweep.json]

The bench's pizzeria workload (``txjoin bench``'s: ``-n`` transactions, no initial snapshot
beyond the pizzeria's tables), cut into micro-batches of ``--max-events`` records as the
replay source cuts it, through two engines in this one process, at each shard count:

- ``sharded``: today's (``join/sharded.py``): every shard assembles and orders every
  transaction (``ShardEngine.process_routed``);
- ``staged``: ``join/staged.py``: the sequencer once (``Sequencer.process_routed``), then
  each shard its own rows and the releases (``ShardApplier.process``);
- ``split``: the staged engine with the lookups ``--split`` names split (default: every one
  it can; ``join/owners.py``):
  the sequencer, then the owner stages (one per depth of split lookups), then the shards;
  its ``slowest_s`` is the batch's critical path (the sequencer, the slowest owner of each
  stage and the slowest shard, summed) and its ``sum_s`` every task's CPU, the sequencer's
  included; ``largest_shard_rows`` / ``largest_owner_rows``: the rows the largest shard /
  owner holds at the end (current rows and last outputs).

Per steady batch (the first 2 left out) it times, in CPU seconds of this process
(``time.process_time``), each shard's call and the sequencer's, and reports the p50 over
batches of the slowest shard and of the sum over shards, and the sequencer's. What a task
would also do in Spark is not in these figures: decoding the records (here done once,
before the clock, by the routing of each engine), the Arrow exchange and the state log
(neither engine writes one here).
The sequencer here is the core's Python; the staged design puts it before the shards as one
stage (its share below is what that stage costs in Python). Each shard count runs both
engines on the same batches; both must end with the same output (checked).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from txjoin.bench import JOB, replay_schedule, spread
from txjoin.ingest.debezium import transaction_topic
from txjoin.job import load_job
from txjoin.join.placement import splittable
from txjoin.join.routing import Routed
from txjoin.join.shard import ShardEngine, long_lived_state
from txjoin.join.sharded import ShardedEngine
from txjoin.join.staged import ReleaseColumns, Sequencer, ShardApplier, StagedEngine
from txjoin.scenarios.synthesize import Synthesizer
from txjoin.scenarios.workload import pizzeria_workload

WARM_UP = 2  # batches left out


def batches(transactions: int, seed: int, max_events: int) -> list[tuple[list, list[str]]]:
    job = load_job(JOB)
    snapshot, txs = pizzeria_workload(transactions, seed)
    synth = Synthesizer(job)
    produced = list(synth.snapshot(snapshot))
    for tx in txs:
        produced.extend(synth.transaction(tx))
    rows = spread(produced, 1, transaction_topic(synth.prefix))
    out = []
    for chunk, caught, _ in replay_schedule(rows, max_events):
        caught_tables = [t.removeprefix(synth.prefix + ".") for t in caught]
        out.append(([(t, p, o, v) for t, p, o, _, v in chunk], caught_tables))
    return out


def p50(values: list[float]) -> float:
    return round(statistics.median(values), 4) if values else 0.0


def cpu(call: Any, *args: Any) -> float:
    """The CPU seconds ``call(*args)`` takes, its objects kept out of the collector's way."""
    with long_lived_state():
        started = time.process_time()
        call(*args)
        return time.process_time() - started


def state_rows(part: Any) -> int:
    """The rows a part holds: its tables' current rows and its last outputs."""
    return sum(len(r) for r in part.join.rows.values()) + len(part.join.outputs)


def run_sharded(job: Any, n: int, work: list[tuple[list, list[str]]]) -> dict[str, Any]:
    engine = ShardedEngine(job, n)
    shards = [ShardEngine(job, s, n) for s in range(n)]
    slowest, total = [], []
    for records, caught in work:
        routed = engine.route(records)
        times = [cpu(shard.process_routed, items, caught)
                 for shard, items in zip(shards, routed, strict=True)]
        slowest.append(max(times))
        total.append(sum(times))
    merged: dict[Any, Any] = {}
    for shard in shards:
        merged.update(shard.outputs())
    return {"slowest_s": p50(slowest[WARM_UP:]), "sum_s": p50(total[WARM_UP:]),
            "output": merged}


def run_staged(job: Any, n: int, work: list[tuple[list, list[str]]]) -> dict[str, Any]:
    engine = StagedEngine(job, n)
    the_sequencer = Sequencer(job)
    appliers = [ShardApplier(job, s, n) for s in range(n)]
    slowest, total, sequencer = [], [], []
    for records, caught in work:
        meta, per_shard, _ = engine.route(records)
        sequencer.append(cpu(the_sequencer.process_routed, meta, caught))
        releases = the_sequencer.releases
        times = [cpu(applier.process, events, releases)
                 for applier, events in zip(appliers, per_shard, strict=True)]
        slowest.append(max(times))
        total.append(sum(times))
    return {"slowest_s": p50(slowest[WARM_UP:]), "sum_s": p50(total[WARM_UP:]),
            "sequencer_s": p50(sequencer[WARM_UP:]),
            "largest_shard_rows": max(state_rows(a) for a in appliers),
            "output": {k: v for a in appliers for k, v in a.outputs().items()}}


def run_split(job: Any, n: int, work: list[tuple[list, list[str]]], split: list[str]
              ) -> dict[str, Any]:
    """The staged engine with the lookups ``split`` split (``join/owners.py``): the
    sequencer, then each owner stage (one per depth), then the shards."""
    engine = StagedEngine(job, n, split=split)
    the_sequencer = Sequencer(job)
    owners = {d: [cls(job, o, n) for o in range(n)] for d, cls in engine.owner_classes.items()}
    appliers = [ShardApplier(job, s, n) for s in range(n)]
    stages: dict[str, list[float]] = {}  # per stage: the slowest task of each batch
    slowest, total = [], []
    for records, caught in work:
        meta, per_shard, owned = engine.route(records)
        path = spent = cpu(the_sequencer.process_routed, meta, caught)
        releases = ReleaseColumns(the_sequencer.releases)  # as Spark's stages send them
        stages.setdefault("sequencer", []).append(path)
        to_shards: list[list[Any]] = [[] for _ in range(n)]
        flags: set[Any] = set()
        messages: dict[int, list[Any]] = {}
        for depth, stage in owners.items():
            below: dict[int, list[Any]] = {}
            times = []
            for o, owner in enumerate(stage):
                items = [Routed(x, 0) for x in [*owned[(depth, o)], releases,
                                                *messages.get(o, ())]]
                times.append(cpu(owner.process_routed, items, caught))
                owner.hand_on(to_shards, flags, below)
            messages = below
            stages.setdefault(f"owners {depth}", []).append(max(times))
            path += max(times)
            spent += sum(times)
        times = []
        for applier, events, forwards in zip(appliers, per_shard, to_shards, strict=True):
            items = [Routed(x, 0) for x in [*events, releases, *forwards, *sorted(flags)]]
            times.append(cpu(applier.process_routed, items, caught))
        stages.setdefault("shards", []).append(max(times))
        slowest.append(path + max(times))
        total.append(spent + sum(times))
    return {"slowest_s": p50(slowest[WARM_UP:]), "sum_s": p50(total[WARM_UP:]),
            "stages_slowest_s": {k: p50(v[WARM_UP:]) for k, v in stages.items()},
            "largest_shard_rows": max(state_rows(a) for a in appliers),
            "largest_owner_rows": max((state_rows(o) for stage in owners.values() for o in stage),
                                      default=0),
            "output": {k: v for a in appliers for k, v in a.outputs().items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--transactions", type=int, default=30_000)
    parser.add_argument("--shards", default="1,2,4,8")
    parser.add_argument("--max-events", type=int, default=25_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--split", default="",
                        help="the lookups the split engine splits, by alias (default: every "
                             "one it can)")
    parser.add_argument("--out", type=Path, default=Path("staged-core-sweep.json"))
    args = parser.parse_args()
    job = load_job(JOB)
    work = batches(args.transactions, args.seed, args.max_events)
    records = sum(len(r) for r, _ in work)
    print(f"{args.transactions} transactions, {records} records, {len(work)} batches")
    results: dict[str, Any] = {"transactions": args.transactions, "records": records,
                               "batches": len(work), "per_shards": {}}
    for n in [int(x) for x in args.shards.split(",")]:
        sharded = run_sharded(job, n, work)
        staged = run_staged(job, n, work)
        split = run_split(job, n, work, args.split.split(",") if args.split
                          else splittable(job))
        expected = sharded.pop("output")
        assert staged.pop("output") == expected, f"{n} shards: the staged outputs differ"
        assert split.pop("output") == expected, f"{n} shards: the split outputs differ"
        results["per_shards"][n] = {"sharded": sharded, "staged": staged, "split": split}
        print(f"{n} shards: sharded slowest {sharded['slowest_s']} s, sum {sharded['sum_s']} s; "
              f"staged slowest {staged['slowest_s']} s, sum {staged['sum_s']} s, "
              f"sequencer {staged['sequencer_s']} s; split slowest (sequencer + owners + "
              f"shard) {split['slowest_s']} s, sum {split['sum_s']} s, largest shard "
              f"{split['largest_shard_rows']} rows (CPU per steady batch, p50)")
    runs = results["per_shards"]
    base, top = min(runs), max(runs)
    for engine in ("sharded", "staged", "split"):
        results[f"{engine}_ratios"] = {
            "slowest": round(runs[top][engine]["slowest_s"] / runs[base][engine]["slowest_s"], 3),
            "sum": round(runs[top][engine]["sum_s"] / runs[base][engine]["sum_s"], 3)}
    staged_top, staged_base = runs[top]["staged"], runs[base]["staged"]
    # the whole engine's work: the shards' plus the sequencer's, once
    results["staged_with_sequencer_ratios"] = {
        "slowest": round(max(staged_top["slowest_s"], staged_top["sequencer_s"])
                         / (staged_base["slowest_s"] + staged_base["sequencer_s"]), 3),
        "sum": round((staged_top["sum_s"] + staged_top["sequencer_s"])
                     / (staged_base["sum_s"] + staged_base["sequencer_s"]), 3)}
    print(json.dumps({k: v for k, v in results.items() if k.endswith("ratios")}, indent=2))
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
