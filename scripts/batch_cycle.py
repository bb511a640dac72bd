"""Where a steady micro-batch's time goes: the cycle that bounds PostgreSQL's latency.

    .venv/bin/python scripts/batch_cycle.py [--dir .txjoin] [--rate 50] [--seconds 60]
        [--conf KEY=VALUE] [--out batch-cycle.json]

On a running local stack (`txjoin up --dir DIR`; `./scripts/demo.sh` leaves one), runs
`jobs/orders.py` on `local[2]` in this process, continuing the stack's checkpoint (as
`txjoin demo` and `txjoin run --dir DIR` do), while the pizzeria workload writes ``--rate``
transactions/s for ``--seconds``. Then, over the batches after the first third (a new
driver's JIT still compiles Spark's per-batch code through its first ~50 batches,
docs/latency.md), it prints the p50 and p90 of:

- Spark's phases of a micro-batch (``StreamingQueryProgress.durationMs``: ``latestOffset``,
  ``queryPlanning``, ``addBatch`` (txjoin's ``foreachBatch``), ``walCommit``, ...);
- txjoin's own parts of ``addBatch`` (``BatchReport.breakdown``: ``compute`` is the Spark
  job that reads, routes, runs the shards and the sinks' tasks; the ``shard_*`` parts are
  the slowest shard's Python inside it; ``sink_*`` the sinks);
- from Spark's event log, each stage of that job: its wall time, its slowest task, the sum
  of its tasks' run time, and how many tasks it had.

So the job's time splits into Spark's machinery and txjoin's Python. Results (every
figure, and the settings) go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from txjoin.api import start
from txjoin.job import load_job
from txjoin.pipeline.pipeline import RunConfig
from txjoin.pipeline.session import get_session
from txjoin.stack.generate import generate
from txjoin.stack.stack import load_stack

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "jobs" / "orders.py"


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": round(statistics.median(ordered), 1),
            "p90": round(ordered[int(len(ordered) * 0.9)], 1)} if ordered else {}


def stages_of(event_log: Path, steady_from: int) -> dict[str, dict[str, Any]]:
    """Per stage of a micro-batch's job (by its place in the job and its task count): wall
    time, slowest task, tasks' run time summed, over the batches from ``steady_from``."""
    jobs: dict[int, dict[str, Any]] = {}
    submitted: dict[int, int] = {}
    done: dict[int, tuple[int, int]] = {}  # stage -> (completion ms, tasks)
    tasks: dict[int, list[tuple[int, int]]] = defaultdict(list)  # stage -> (duration, run)
    for line in event_log.read_text().splitlines():
        event = json.loads(line)
        kind = event["Event"]
        if kind == "SparkListenerJobStart":
            batch = event.get("Properties", {}).get("streaming.sql.batchId")
            if batch is not None:
                jobs[event["Job ID"]] = {"batch": int(batch), "stages": event["Stage IDs"]}
        elif kind == "SparkListenerStageSubmitted":
            submitted[event["Stage Info"]["Stage ID"]] = event["Stage Info"]["Submission Time"]
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            done[info["Stage ID"]] = (info["Completion Time"], info["Number of Tasks"])
        elif kind == "SparkListenerTaskEnd":
            task = event["Task Info"]
            tasks[event["Stage ID"]].append((task["Finish Time"] - task["Launch Time"],
                                             event.get("Task Metrics", {}).get(
                                                 "Executor Run Time", 0)))
    figures: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for job in jobs.values():
        if job["batch"] < steady_from:
            continue
        ran = [s for s in job["stages"] if s in done and s in submitted and tasks[s]]
        for place, stage in enumerate(ran):
            name = f"stage {place + 1} of {len(ran)} ({done[stage][1]} tasks)"
            figures[name]["wall_ms"].append(done[stage][0] - submitted[stage])
            figures[name]["slowest_task_ms"].append(max(d for d, _ in tasks[stage]))
            figures[name]["tasks_run_ms"].append(sum(r for _, r in tasks[stage]))
    return {name: {"batches": len(f["wall_ms"]), **{k: percentiles(v) for k, v in f.items()}}
            for name, f in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=ROOT / ".txjoin")
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session, to measure it (repeatable)")
    parser.add_argument("--out", type=Path, default=Path("batch-cycle.json"))
    args = parser.parse_args()
    conf = dict(c.split("=", 1) for c in args.conf)
    info = load_stack(args.dir)
    if info is None:
        raise SystemExit(f"no stack in {args.dir}: start one with `txjoin up --dir {args.dir}`")
    events = Path(tempfile.mkdtemp(prefix="txjoin-cycle-events-"))
    spark = get_session("local[2]", app_name="txjoin-batch-cycle", extra_conf={
        "spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(),
        "spark.eventLog.compress": "false", **conf})
    config = RunConfig(topic_prefix=info.topic_prefix, bootstrap_servers=info.bootstrap_servers,
                       checkpoint_dir=str(args.dir / "checkpoints"),
                       output_dir=str(args.dir / "output"), master="local[2]",
                       postgres_dsn=info.pg_dsn_sink)
    reports: list[Any] = []
    stream = start(spark, load_job(JOB), config, on_batch=reports.append)
    try:
        generate(info.pg_dsn_source, args.rate, args.seconds, seed=args.seed)
        time.sleep(3)  # the last transactions' batches
        progress = list(spark.streams.active[0].recentProgress)
    finally:
        stream.stop()
        stream.close()
    steady = reports[len(reports) // 3:]
    steady_from = steady[0].batch_id if steady else 0
    results: dict[str, Any] = {
        "rate_tx_per_s": args.rate, "seconds": args.seconds, "conf": conf,
        "batches": len(reports),
        "steady_batches": len(steady), "steady_from_batch": steady_from,
        "batch_seconds_ms": percentiles([r.seconds * 1000 for r in steady]),
        "spark_duration_ms": {
            phase: percentiles([p.durationMs.get(phase, 0) for p in progress
                                if p.batchId >= steady_from])
            for phase in sorted({k for p in progress for k in p.durationMs})},
        "txjoin_breakdown_ms": {
            part: percentiles([r.breakdown.get(part, 0.0) * 1000 for r in steady])
            for part in sorted({k for r in steady for k in r.breakdown})},
    }
    logs = sorted(events.rglob("*"))
    log = next((f for f in logs if f.is_file() and f.name.startswith(("events", "local-"))),
               None)
    results["job_stages"] = {} if log is None else stages_of(log, steady_from)
    shutil.rmtree(events, ignore_errors=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{len(reports)} batches, {len(steady)} steady (from batch {steady_from}), "
          f"{args.rate:g} tx/s; ms, p50 / p90")
    for group in ("spark_duration_ms", "txjoin_breakdown_ms"):
        for name, figure in results[group].items():
            if figure and figure["p90"] > 0:
                print(f"  {group.split('_')[0]:7s} {name:26s} {figure['p50']:8.1f} "
                      f"{figure['p90']:8.1f}")
    for name, figure in results["job_stages"].items():
        print(f"  job     {name:26s} wall {figure['wall_ms']['p50']:.0f} / "
              f"{figure['wall_ms']['p90']:.0f}, slowest task "
              f"{figure['slowest_task_ms']['p50']:.0f}, tasks' run time "
              f"{figure['tasks_run_ms']['p50']:.0f} (p50, {figure['batches']} batches)")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
