"""Each shard's engine lives in one host process per executor, whichever worker runs its task.

Spark hands a shard's task to any idle Python worker; when the workers cached the
engines, every worker ended up holding every shard. With hosts
(``txjoin/join/spark/host.py``) a shard runs in its own process and finds its engine
there every batch; the shards' output is still the oracle's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from pyspark.sql import SparkSession

from txjoin.bench import replay_schedule, spread
from txjoin.errors import DecodeError
from txjoin.ingest.debezium import transaction_topic
from txjoin.ingest.spark.replay import SOURCE_NAME, ReplaySource, write_schedule_dir
from txjoin.job import load_job
from txjoin.join.oracle import outputs_after_each
from txjoin.join.spark import host
from txjoin.pipeline.pipeline import BatchReport, Pipeline, RunConfig
from txjoin.scenarios.synthesize import Synthesizer
from txjoin.scenarios.workload import pizzeria_workload
from txjoin.sinks import without_metadata
from txjoin.sinks.build import build_sinks

pytestmark = pytest.mark.spark

ORDERS = Path(__file__).resolve().parents[2] / "jobs" / "orders.py"


def _hosts() -> dict[tuple[str, str], set[int]]:
    """The shard hosts of this test process's Spark (not another test worker's) running now:
    (executor's daemon, shard number) -> their pids. A host watches its executor's daemon,
    which descends from this process (local mode: its JVM, then PySpark's daemon)."""
    ours = {str(p.pid) for p in psutil.Process().children(recursive=True)}
    found: dict[tuple[str, str], set[int]] = {}
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if host.__name__ in cmd:
            *_, watch, shard = cmd[cmd.index(host.__name__) + 1].split("-")
            if watch in ours:
                found.setdefault((watch, shard), set()).add(proc.pid)
    return found


@pytest.mark.skipif(not host.available(), reason="shard hosts need Linux")
def test_each_shard_keeps_its_engine_in_one_host_across_batches(
        spark: SparkSession, pg_dsn: str, tmp_path: Path) -> None:
    job = load_job(ORDERS)
    snapshot, txs = pizzeria_workload(40, seed=11)
    synth = Synthesizer(job, prefix="hshop")
    produced = list(synth.snapshot(snapshot))
    for tx in txs:
        produced.extend(synth.transaction(tx))
    rows = spread(produced, 1, transaction_topic(synth.prefix))
    schedule = str(tmp_path / "schedule")
    batches = write_schedule_dir(schedule, replay_schedule(rows, 25))
    assert batches >= 12
    spark.dataSource.register(ReplaySource)
    config = RunConfig(topic_prefix="hshop", checkpoint_dir=str(tmp_path / "checkpoints"),
                       output_dir=str(tmp_path / "output"), postgres_dsn=pg_dsn, shards=2)
    sinks = [s for s in build_sinks(job, config, spark, pg_table_suffix="hosts")
             if s.name == "postgres"]
    states: list[list[str]] = []
    hosts: dict[tuple[str, str], set[int]] = {}

    def observe(report: BatchReport) -> None:
        states.append(report.shard_states)
        for key, pids in _hosts().items():
            hosts.setdefault(key, set()).update(pids)

    pipeline = Pipeline(spark, job, config, sinks, on_batch=observe)
    source = spark.readStream.format(SOURCE_NAME).option("schedule", schedule).load()
    pipeline.start(source, available_now=True).awaitTermination()
    final = {tuple(r[c] for c in job.output.key): r
             for r in map(without_metadata, sinks[0].read_current())}
    for sink in sinks:
        sink.close()
    expected = outputs_after_each(job, snapshot, txs)[-1]
    assert set(final) == set(expected)
    assert len(states) == batches
    # the first batch creates both engines; from then on each shard finds its own, every batch
    assert states[0] == ["new", "new"]
    assert all(s == ["cached", "cached"] for s in states[1:]), states
    # one host per shard number on the executor, the same process every batch
    shards = {shard for _, shard in hosts}
    assert {"0", "1"} <= shards and all(len(pids) == 1 for pids in hosts.values()), hosts


def test_a_host_exits_when_the_process_it_watches_is_gone() -> None:
    """A host outlives no executor: it watches the worker's parent (PySpark's daemon)."""
    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    name = f"txjoin-shard-test-{os.getpid()}-{time.time_ns()}"
    proc = subprocess.Popen([sys.executable, "-m", host.__name__, name,
                             str(watched.pid)])
    try:
        deadline = time.monotonic() + 20
        while True:  # it listens
            try:
                host._connect("\0" + name).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the host did not start"
                time.sleep(0.05)
        assert proc.poll() is None
        watched.kill()
        watched.wait()
        assert proc.wait(timeout=10) == 0
        with pytest.raises(OSError):
            host._connect("\0" + name)
    finally:
        watched.kill()
        proc.kill()


def test_an_error_in_a_host_is_raised_in_the_task_as_it_was() -> None:
    """Its class, message and attributes: the driver's one-line error reads them."""
    err = DecodeError("not JSON", topic="shop.public.orders", partition=2, offset=41)
    args = (type(err).__module__, type(err).__qualname__, err.args, vars(err))
    rebuilt = host._rebuilt(*args)
    assert type(rebuilt) is DecodeError and str(rebuilt) == str(err)
    assert str(rebuilt) == "malformed record at shop.public.orders[2]@41: not JSON"
    assert (rebuilt.topic, rebuilt.partition, rebuilt.offset) == ("shop.public.orders", 2, 41)
    unknown = host._rebuilt("txjoin.no_such_module", "Gone", ("lost",), {})
    assert type(unknown) is RuntimeError and str(unknown) == "txjoin.no_such_module.Gone: lost"
