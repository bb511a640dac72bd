"""The Spark pipeline end to end on the replay source: scenarios, restarts, kill -9.

Both sinks (Delta via delta-spark, PostgreSQL) are compared row by row with the
oracle; the changelog must hold every version exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyspark.sql import SparkSession

from txjoin.bench import spread
from txjoin.ingest.spark.replay import write_schedule
from txjoin.job import load_job
from txjoin.join.oracle import outputs_after_each
from txjoin.pipeline.pipeline import RunConfig, build_sinks
from txjoin.scenarios.checks import check_exactly_once, check_final
from txjoin.scenarios.spark_runner import run_scenario_spark
from txjoin.scenarios.spec import load_scenario
from txjoin.scenarios.synthesize import Synthesizer
from txjoin.scenarios.workload import pizzeria_workload
from txjoin.sinks import without_metadata
from txjoin.sinks.delta import DeltaSink
from txjoin.sinks.postgres import PostgresSink

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
ORDERS = ROOT / "jobs" / "orders.py"


SHARDS = 2
"""Every scenario runs through Spark at this shard count, in both sinks (Delta via
delta-spark, PostgreSQL): two shards on ``local[2]``, what ``txjoin run`` picks by default
here, so the fact table is split and lookups are copied to every shard."""
OTHER_SHARDS: dict[int, list[str]] = {
    # One shard: the router's single-shard path (every event whole to shard 0); a restart
    # with re-read and duplicated events, and a transaction spread over eight batches.
    1: ["duplicates_restart_mid_transaction", "large_transaction_split"],
    # More shards than cores (several shards' state stores in one task slot); the same two,
    # rows deleted and re-inserted under their key, and two sources' markers interleaved
    # with a restart.
    4: ["duplicates_restart_mid_transaction", "large_transaction_split",
        "delete_and_reinsert", "two_dbs_interleaved_delivery"],
}
"""The few scenarios that also run at other shard counts, PostgreSQL sink only. What the
shard count could change in a scenario's result (routing, every shard releasing the same
prefix, restoring from the shard logs after a restart) is checked for every scenario at
1-4 shards without Spark (tests/unit/test_sharding.py, same schedules); Spark adds the
state store and the shuffle, which these exercise at 1 and 4 shards. Until issue 34 every
scenario ran at shards 1, 2 and 4 (60 streaming runs)."""
CASES = [(p, SHARDS) for p in SCENARIOS] + [
    (ROOT / "scenarios" / f"{name}.yaml", n) for n, names in OTHER_SHARDS.items()
    for name in names]


@pytest.mark.parametrize("path, shards", CASES,
                         ids=[f"{p.stem}-shards{n}" for p, n in CASES])
def test_every_scenario_holds_in_both_sinks(spark: SparkSession, pg_dsn: str, path: Path,
                                            shards: int, tmp_path: Path) -> None:
    assert path.exists(), path
    report = run_scenario_spark(spark, load_scenario(path), str(tmp_path), postgres_dsn=pg_dsn,
                                shards=shards, delta=shards == SHARDS)
    assert report.passed, "\n".join(report.failures)
    assert report.batches > 0


def _scenario_yaml(snapshot: dict[str, Any], txs: list[Any], delivery: list[Any]) -> dict:
    def op(change: Any) -> dict:
        if change.op == "delete":
            return {"delete": change.table, "key": {"id": change.row["id"]}}
        return {change.op: change.table, "row": dict(change.row)}

    return {
        "name": "restart_every_batch", "job": str(ORDERS),
        "about": "A random pizzeria workload with a processor restart between every batch.",
        "snapshot": {t: rows for t, rows in snapshot.items() if rows},
        "transactions": [{"name": tx.name, "ops": [op(c) for c in tx.changes]} for tx in txs],
        "delivery": {"batches": delivery},
    }


# At the scenarios' shard count in both sinks, and at 4 shards (more than cores) with
# PostgreSQL; shards 1 dropped in issue 34: its restart is the same checkpoint and sink
# protocol, checked at one shard by duplicates_restart_mid_transaction above, and a shard
# restored from its log after every batch is property-tested without Spark
# (tests/unit/test_sharding.py::test_a_shard_restored_from_its_log_equals_one_that_never_stopped).
@pytest.mark.parametrize("shards", [SHARDS, 4], ids=[f"shards{n}" for n in (SHARDS, 4)])
def test_restart_at_every_batch_boundary_changes_nothing(spark: SparkSession, pg_dsn: str,
                                                         shards: int, tmp_path: Path) -> None:
    snapshot, txs = pizzeria_workload(12, seed=7)
    delivery: list[Any] = [["snapshot:*"], "restart"]
    rnd = random.Random(3)
    for tx in txs:
        tables = sorted({c.table for c in tx.changes})
        if tables and rnd.random() < 0.5:
            # the transaction's data first, its BEGIN/END in the next batch (torn delivery)
            delivery += [[f"{tx.name}:{t}" for t in tables], "restart",
                         [f"{tx.name}:begin", f"{tx.name}:end"], "restart"]
        else:
            delivery += [[f"{tx.name}:*"], "restart"]
    doc = _scenario_yaml(snapshot, txs, delivery[:-1])
    path = tmp_path / "restart_every_batch.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    report = run_scenario_spark(spark, load_scenario(path), str(tmp_path / "run"),
                                postgres_dsn=pg_dsn, shards=shards,
                                delta=shards == SHARDS)
    assert report.passed, "\n".join(report.failures)
    assert report.batches == sum(1 for d in delivery if d != "restart")


def _kill_schedule(tmp_path: Path, n_tx: int, partitions: int = 1
                   ) -> tuple[Path, dict, list]:
    job = load_job(ORDERS)
    snapshot, txs = pizzeria_workload(n_tx, seed=11)
    synth = Synthesizer(job)
    produced = list(synth.snapshot(snapshot))
    for tx in txs:
        produced.extend(synth.transaction(tx))
    # table topics over `partitions` partitions by key; interleave topic-partitions at
    # random, keeping each one's order; ~20 batches
    rnd = random.Random(5)
    queues: dict[tuple[str, int], list] = {}
    for row in spread(produced, partitions, f"{synth.prefix}.transaction"):
        queues.setdefault((row[0], row[1]), []).append(row)
    batches: list[tuple[list, list]] = []
    while any(queues.values()):
        rows = []
        for queue in queues.values():
            take = rnd.randint(0, 60)
            rows += queue[:take]
            del queue[:take]
        done = {t for (t, _), q in queues.items() if not q}
        done -= {t for (t, _), q in queues.items() if q}  # every partition read to its end
        batches.append((rows, sorted(done)))
    path = tmp_path / "schedule.json"
    write_schedule(str(path), batches)
    return path, snapshot, txs


def _wait_for_line(proc: subprocess.Popen, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if needle in line:
            return
        if not line and proc.poll() is not None:
            raise AssertionError(f"pipeline process exited with {proc.returncode}")
    raise AssertionError(f"no {needle!r} within {timeout}s")


# More shards than cores, over partitioned topics read with any lag between partitions
# (~2.5 min a run). Other shard counts are not killed here: the restart they would test is
# the same checkpoint and sink protocol, which every scenario and the restart at every
# batch boundary run at shards 1, 2 and 4 (this test ran at shards 4 and at shards 2 over
# 3 partitions separately until the suite's time had to come down).
@pytest.mark.parametrize("shards, partitions", [(4, 3)], ids=["shards4-partitions3"])
def test_kill_9_and_restart_loses_nothing_and_applies_nothing_twice(
        pg_dsn: str, shards: int, partitions: int, tmp_path: Path) -> None:
    """partitions: table topics spread over that many partitions by key (declared by the
    replay source), read with any lag between partitions."""
    schedule, snapshot, txs = _kill_schedule(tmp_path, 150, partitions)
    work = tmp_path / "work"
    cmd = [sys.executable, "-m", "tests.spark.kill_target", str(schedule), str(work), pg_dsn,
           str(ORDERS), f"--shards={shards}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for batch_marker in ("batch 2 done", "batch 9 done"):
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, start_new_session=True)
        try:
            _wait_for_line(proc, batch_marker, timeout=240)
            time.sleep(random.Random(batch_marker).uniform(0.0, 0.6))  # land mid-batch
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and Python workers
            proc.wait()
    finish = subprocess.run([*cmd, "--until-idle"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600, check=False)
    assert finish.returncode == 0, finish.stdout[-3000:] + finish.stderr[-3000:]

    job = load_job(ORDERS)
    expected = outputs_after_each(job, snapshot, txs)[-1]
    config = RunConfig(checkpoint_dir=str(work / "ckpt"), output_dir=str(work / "out"),
                       postgres_dsn=pg_dsn)
    sinks = build_sinks(job, config)
    assert isinstance(sinks[0], DeltaSink) and isinstance(sinks[1], PostgresSink)
    for sink in sinks:
        current = [without_metadata(r) for r in sink.read_current()]
        result = check_final(current, expected, ["order_id"])
        assert result.ok, f"{sink.name}: {result.message}"
        once = check_exactly_once(sink.read_changelog(), ["order_id"], sink.read_current())
        assert once.ok, f"{sink.name}: {once.message}"
        sink.close()
    assert len(expected) > 50
