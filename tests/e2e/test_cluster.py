"""txjoin on a real Spark standalone cluster (master + 2 workers, separate processes).

The job submitted by ``txjoin submit-line``'s command (cluster mode, ``--supervise``)
against the local stack while a racing workload writes, its executors running txjoin from
``txjoin package``'s environment archive (``--archives``). Two faults, one after the other,
in one run (each costs a cluster, a workload and a drain when run apart: ~4 and ~6.5 min
of one worker on 2 cores, issue 68's suite budget):

- the worker that does not host the driver is killed with ``kill -9`` (with its executor
  and Python workers) once the job made its first Delta commits: Spark reschedules the
  lost shards' tasks on the other worker's executor, which restores them from the
  checkpoint, and the job commits on;
- then the driver is killed with ``kill -9`` at a random moment (``$TXJOIN_SUPERVISED_KILLS``
  times, default 1, which the suite runs: each restart is a new driver JVM, application
  and cold executors, ~1-4 min on 2 cores; issue 70's figure is 3; the first once the job
  committed to Delta after the worker's loss, each next once the restarted driver did,
  then 0-2 s later); the master restarts it each time and it resumes from its checkpoint.

Afterwards both sinks equal PostgreSQL's own answer, every order version is in the
changelog once, and Delta's version and frontier never went back.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.e2e.conftest import E2EStack
from tests.e2e.test_end_to_end import (
    ORDERS,
    Workload,
    assert_orders_changelogs,
    assert_verified,
    fresh_sink_database,
    run_until_idle,
    tail,
)
from tests.fixtures.env_archive import CACHE_KEY, cached_archive
from tests.fixtures.spark_cluster import SPARK_HOME, Cluster, standalone_cluster
from txjoin.job import load_job
from txjoin.join.output import output_schema
from txjoin.package import ENV_PYTHON
from txjoin.pipeline.session import WORKER_DAEMON
from txjoin.procfs import STAT_PPID, stat_fields
from txjoin.sinks.delta import DeltaSink
from txjoin.stack.demo import wait_until_captured
from txjoin.submit import submit_line
from txjoin.verify.verify import verify_job

pytestmark = pytest.mark.e2e


def cluster_args(stack: E2EStack, master: str, work: Path, sink_dsn: str) -> list[str]:
    # Delta commits at most every second (the default is 10 s): the test waits for 2 group
    # commits before the kill and 2 after it; a group commit takes every batch pending, so
    # the second after the kill still needs a batch the stream finished after the first one
    # began, as with 10 s; only the waits between the commits are shorter (issue 34).
    return [str(ORDERS), "--dir", str(stack.directory), "--master", master,
            "--checkpoint-dir", str(work / "checkpoints"), "--output-dir", str(work / "output"),
            "--postgres-dsn", sink_dsn, "--shards", "2",
            "--spark-conf", "spark.executor.memory=1g", "--delta-commit-interval", "1"]


KILLS = int(os.environ.get("TXJOIN_SUPERVISED_KILLS", "1"))
"""How often the supervised-driver test kills its driver (module docstring)."""

DRIVER_START_TIMEOUT_S = 600
"""How long a (re)started driver may take to its next Delta commit: a new JVM, Python
driver, SparkContext, executors and a first batch on cold ones; 300 s ran out on a machine
loaded 25-33 deep (2 cores), where the first driver's query started 4.5 min after the
submission."""

DRIVER_CLASS = "org.apache.spark.deploy.worker.DriverWrapper"
"""What a standalone worker runs as a cluster-mode driver (its JVM; the Python driver is its
child, which dies with it: ``txjoin.submit``)."""


def driver_pid(work: Path) -> int | None:
    """The driver JVM a worker of the cluster under ``work`` runs, if any (other clusters'
    drivers on the machine are not this test's). A process the JVM forks (a Python worker)
    shows the JVM's command line until it execs: a match whose parent matches too is such
    a child, not the driver (once, with pids wrapped, it was found first and taken for it)."""
    parents: dict[int, int | None] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if DRIVER_CLASS.encode() in words and any(str(work).encode() in w for w in words):
            fields = stat_fields(int(entry.name))
            parents[int(entry.name)] = None if fields is None else int(fields[STAT_PPID])
    drivers = [pid for pid, parent in parents.items() if parent not in parents]
    return min(drivers, default=None)


def python_workers(work: Path) -> list[str]:
    """The interpreter (``argv[0]``) of each Python worker daemon that an executor of the
    cluster under ``work`` started (``python -m txjoin.pipeline.worker_daemon``, txjoin's
    ``spark.python.daemon.module``), and of the workers it forked."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if WORKER_DAEMON.encode() in words and cwd.startswith(str(work)):
            found.append(words[0].decode())
    return found


def driver_logs(cluster: Cluster, lines: int = 30) -> str:
    """The tail of every driver's output (each start has its own folder on its worker)."""
    out = []
    for log in cluster.logs[1:]:
        for stream in sorted(log.with_suffix("").glob("driver-*/std*")):
            out.append(f"== {stream.relative_to(log.parent)}\n{tail(stream, lines)}")
    return "\n".join(out) or "no driver output"


def driver_worker(cluster: Cluster, pid: int) -> int:
    """The index of the worker whose process group holds driver ``pid`` (a worker starts its
    drivers as its children: ``DriverRunner``)."""
    group = os.getpgid(pid)
    return next(i for i, w in enumerate(cluster.workers) if w.pid == group)


def test_a_supervised_driver_survives_losing_a_worker_then_its_own_kill_exactly_once(
        e2e_stack: E2EStack, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    sink_dsn = fresh_sink_database(e2e_stack, "sink_supervised")
    job = load_job(ORDERS)
    output = tmp_path / "output"
    changelog = output / job.output.table / "changelog"
    delta = DeltaSink(str(output), job.output.table, job.name, list(job.output.key),
                      output_schema(job))  # read-only: the frontier of each version
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # spark-submit passes it to the driver
    rng = random.Random(70)
    history: list[tuple[int, int]] = []  # (Delta version, frontier) as seen, in time order

    def committed() -> int:
        """The changelog's Delta version now (-1: none yet), with its frontier recorded."""
        if not DeltaTable.is_deltatable(str(changelog)):
            return -1
        version = DeltaTable(str(changelog)).version()
        held = delta.held()
        frontier = None if held is None else held.frontier_commit_seq
        history.append((version, -1 if frontier is None else frontier))
        return version

    # txjoin shipped to the executors the Spark way: txjoin package's environment archive,
    # unpacked in each executor's folder (the driver runs this interpreter: a standalone
    # worker unpacks archives for executors only), built once per digest of its inputs
    cache = getattr(request.config, "cache", None)  # None: pytest's cache is disabled
    archive = cached_archive(tmp_path if cache is None else cache.mkdir(CACHE_KEY))
    # Two cores a worker (they share the machine's two): the driver takes one of its worker's,
    # so each worker also runs an executor, and one is left once the other worker is lost.
    with standalone_cluster(tmp_path / "cluster", cores=2) as cluster:
        # the run's options without the job file (submit_line's argument), the master and
        # Spark's settings (spark-submit's, on the line)
        run_args = cluster_args(e2e_stack, cluster.master_url, tmp_path, sink_dsn)[1:]
        for option in ("--master", "--spark-conf"):
            del run_args[run_args.index(option):run_args.index(option) + 2]
        line = submit_line(cluster.master_url, str(ORDERS), run_args, sys.executable,
                           spark_submit=str(SPARK_HOME / "bin" / "spark-submit"),
                           archive=str(archive))
        line[1:1] = ["--conf", "spark.executor.memory=1g", "--driver-memory", "1g"]
        workload = Workload(e2e_stack, rate=20, duration=600, seed=70)
        workload.start()
        started = time.monotonic()
        submitted = subprocess.run(line, capture_output=True, text=True, timeout=120,
                                   check=False, env={**os.environ, **cluster.java_env})
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        driver_id = next(w for w in (submitted.stdout + submitted.stderr).split()
                         if w.startswith("driver-"))
        try:
            # the job commits to Delta; then the worker without the driver dies with its
            # executor, and the job commits twice more on the other worker's executor
            deadline = time.monotonic() + DRIVER_START_TIMEOUT_S
            while committed() < 2:
                assert time.monotonic() < deadline, \
                    f"no Delta commits before the worker's kill:\n{driver_logs(cluster)}"
                time.sleep(0.3)
            pid = driver_pid(tmp_path)
            assert pid is not None, f"no driver running:\n{driver_logs(cluster)}"
            workers = python_workers(tmp_path / "cluster")
            assert workers and set(workers) == {ENV_PYTHON}, workers  # the archive's
            lost = 1 - driver_worker(cluster, pid)
            cluster.kill_worker(lost)
            version = committed()
            print(f"\n[e2e] killed worker {lost} (SIGKILL) at Delta version {version}, "
                  f"{time.monotonic() - started:.0f}s after the submission")
            assert workload.is_alive(), "the workload ended before the kill: lengthen it"
            deadline = time.monotonic() + DRIVER_START_TIMEOUT_S
            while committed() < version + 2:
                assert time.monotonic() < deadline, \
                    f"no commit after the worker's kill:\n{driver_logs(cluster)}"
                assert driver_pid(tmp_path) == pid, "the driver died with the other worker"
                time.sleep(0.3)
            version = committed()
            for kill in range(KILLS):
                # the running driver (restarted, after the first kill) commits to Delta, then
                # dies at a random moment of the stream
                deadline = time.monotonic() + DRIVER_START_TIMEOUT_S
                while committed() <= version:
                    assert time.monotonic() < deadline, \
                        f"no Delta commit after kill {kill}:\n{driver_logs(cluster)}"
                    time.sleep(0.3)
                time.sleep(rng.uniform(0, 2))
                pid = driver_pid(tmp_path)
                assert pid is not None, f"no driver running:\n{driver_logs(cluster)}"
                os.kill(pid, signal.SIGKILL)
                version = committed()
                print(f"\n[e2e] driver {pid} killed (SIGKILL) at Delta version {version}, "
                      f"{time.monotonic() - started:.0f}s after the submission")
                assert workload.is_alive(), "the workload ended before the kill: lengthen it"
            deadline = time.monotonic() + DRIVER_START_TIMEOUT_S
            while committed() <= version:  # the last restart streams on
                assert time.monotonic() < deadline, \
                    f"no commit after the last kill:\n{driver_logs(cluster)}"
                time.sleep(0.3)
            print(f"[e2e] Delta at version {history[-1][0]} after the last restart, "
                  f"{time.monotonic() - started:.0f}s after the submission")
            result = workload.finish(early=True)
        finally:
            # a failure above must not leave the writers on the shared stack's database,
            # where every later test's verify would race them
            workload.stopping.set()
            # the master stops the supervised driver for good (through its REST server, as
            # docs/production.md says: until then the kill failed to connect, unchecked, and
            # the wait below ran out its 60 s in every run)
            killed = subprocess.run([str(SPARK_HOME / "bin" / "spark-submit"), "--master",
                                     cluster.rest_url, "--kill", driver_id], capture_output=True,
                                    text=True, timeout=60, check=False,
                                    env={**os.environ, **cluster.java_env})
            deadline = time.monotonic() + 60
            while driver_pid(tmp_path) is not None and time.monotonic() < deadline:
                time.sleep(0.3)
            gone = driver_pid(tmp_path) is None
        assert killed.returncode == 0 and gone, \
            f"spark-submit --kill {driver_id}: exit {killed.returncode}, driver gone: {gone}\n" \
            f"{(killed.stdout + killed.stderr)[-3000:]}"
        wait_until_captured(e2e_stack.info)
        print(f"[e2e] workload: {result.transactions} tx, {result.events} events")
    # what is left, in this worker's session: the checkpoint the restarted drivers kept
    log = tmp_path / "drain.log"
    args = cluster_args(e2e_stack, "local[2]", tmp_path, sink_dsn)
    print(f"[e2e] drained with --until-idle in {run_until_idle(log, *args):.1f}s")
    delta.close()
    versions_seen = [v for v, _ in history]
    frontiers = [f for _, f in history]
    assert versions_seen == sorted(versions_seen), "a Delta version went back"
    assert frontiers == sorted(frontiers), "Delta's frontier went back"
    assert_verified(verify_job(job, (e2e_stack.info.pg_dsn_source, sink_dsn), output))
    assert_orders_changelogs(e2e_stack, tmp_path, sink_dsn)
