"""``txjoin soak``: the real stack for a long run, with faults, and whether anything grows.

The racing pizzeria workload writes at a set rate (its live rows held level by default:
``--level``) while ``txjoin run jobs/orders.py`` streams
as a subprocess, as a user runs it. At seeded random moments the soak injects one fault at a
time:

- ``driver``: SIGKILL to the run's process group (the Python driver, its JVM and the Python
  workers), then the same command again: it must resume from its checkpoint.
- ``broker`` / ``connect``: SIGKILL to the stack's Kafka broker or Kafka Connect worker, then
  ``txjoin up`` on the stack directory, which starts only the dead process on its ports and
  data (as tests/e2e/test_faults.py does).
- ``sink``: the PostgreSQL sink stopped for 20 s, then started again. The stack's source and
  sink databases share one server, so the soak's job writes to a sink server of its own (as
  tests/e2e/test_sink_outage.py does) and only that one stops.

After each fault the soak waits until the sink applies a batch again, so faults never overlap
and each one's recovery time is known. A job that exits on its own (a fault can make Spark's
Kafka source give up) is started again, as a supervisor would, and counted.

Every ``SAMPLE_EVERY_S`` it samples the run's memory (RSS of the driver: the ``txjoin run``
process and its JVM; of Spark's Python workers), the checkpoint's size and its state store's,
and the files of the Delta tables. At the end it stops the workload, drains (``--until-idle``),
verifies both sinks against PostgreSQL's own answer and fits each metric's trend: the least
squares slope per minute over the last two thirds of the run (the first third is warm-up: the
JVM's heap, the checkpoint's retained batches and the first compactions settle there).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import psutil
import psycopg2
from rich.console import Console
from rich.markup import escape

from txjoin.errors import ServiceError, TxjoinError
from txjoin.stack import postgres as postgres_mod
from txjoin.stack import stack as stack_mod
from txjoin.stack.demo import DEMO_JOBS, GeneratorThread, commit_barrier
from txjoin.stack.processes import ProcessId, ensure_port_free, free_port, stop

if TYPE_CHECKING:
    from txjoin.job import Job

ORDERS = DEMO_JOBS[0]
DEFAULT_LEVEL = 10_000
"""Live clients the soak's workload keeps (about 2.5 orders each at steady state): reached
within minutes at 500 tx/s, then the source rows, hence the join's state, stay level."""
FAULT_KINDS = ("driver", "broker", "connect", "sink")
STACK_COMPONENT = {"broker": "broker", "connect": "debezium"}  # fault kind -> stack process
SAMPLE_EVERY_S = 10.0
SINK_OUTAGE_S = 20.0
BROKER_DOWN_S = 5.0  # the workload keeps committing while Connect's producer retries
TREND_WINDOW = 2 / 3  # the trends are fitted over the last two thirds of the run
RESTART_WARMUP_S = 420.0
"""A restarted driver's memory grows meanwhile: not in its RSS trend. Measured: after a
kill -9 at 500 tx/s the new driver's RSS (Python and its JVM, which in local mode holds the
state store's RocksDB too) climbed from 1.2 to 2.1 GB over about seven minutes, the first
driver's plateau, and stayed there; 60 s of warm-up read that climb as growth."""
RECOVERY_TIMEOUT_S = 300.0  # a fault's recovery, the job's first batch
DRAIN_TIMEOUT_S = 900.0
SINK_RETRY_TIMEOUT_S = 120.0  # the job's --postgres-retry-timeout: outlasts the outage


# -- the plan: when which fault --------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """A fault to inject ``at_s`` seconds after the workload started."""

    at_s: float
    kind: str


def fault_schedule(duration_s: float, every_s: float, seed: int) -> list[Fault]:
    """The faults of a run: one in each ``every_s`` slot after the first (a warm-up), at a
    random moment of the slot's first half, so two faults are at least ``every_s / 2`` apart.
    Kinds come in shuffled rounds of ``FAULT_KINDS``, so each comes up equally often. The same
    seed gives the same schedule; ``every_s <= 0`` gives none."""
    if every_s <= 0:
        return []
    rng = random.Random(seed)
    faults: list[Fault] = []
    kinds: list[str] = []
    for slot in range(1, int(duration_s // every_s)):
        if not kinds:
            kinds = list(FAULT_KINDS)
            rng.shuffle(kinds)
        at = slot * every_s + rng.uniform(0, every_s / 2)
        faults.append(Fault(round(at, 1), kinds.pop()))
    return faults


# -- the measurements ------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """What the run looked like ``t_s`` seconds after the workload started. RSS is None while
    no driver JVM runs (the job restarting); ``driver_pid`` tells the driver's lifetimes apart."""

    t_s: float
    driver_pid: int | None
    driver_rss_mb: float | None
    worker_rss_mb: float | None
    checkpoint_mb: float
    state_store_mb: float
    delta_parquet_files: int
    delta_log_files: int
    source_rows: int | None = None
    """Live rows of the job's tables in the source database: what the join's state holds."""
    state_bytes_per_source_row: float | None = None
    """The state store per live source row: flat when the state grows only with the data."""


METRICS = tuple(f.name for f in fields(Sample) if f.name not in ("t_s", "driver_pid"))
PER_DRIVER = ("driver_rss_mb", "worker_rss_mb")  # start afresh with each driver


def run_rss_mb(pid: int) -> tuple[float | None, float | None]:
    """RSS of the ``txjoin run`` process ``pid`` with its JVM, and of its Python workers (the
    JVM's Python children), in MB; (None, None) when no JVM runs under it (yet)."""
    try:
        run = psutil.Process(pid)
        tree = run.children(recursive=True)
        jvms = [p for p in tree if p.name() == "java"]
        if not jvms:
            return None, None
        driver = run.memory_info().rss + sum(p.memory_info().rss for p in jvms)
        workers = sum(p.memory_info().rss for p in tree
                      if p not in jvms and p.name().startswith("python"))
    except psutil.Error:  # exited between the listing and the reading
        return None, None
    return driver / 2**20, workers / 2**20


def dir_mb(path: Path) -> float:
    """Bytes of the files under ``path``, in MB (files that vanish meanwhile are skipped)."""
    total = 0
    for parent, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(parent, name)).st_size
    return total / 2**20


def delta_file_counts(root: Path) -> tuple[int, int]:
    """(data files, log files) of the Delta tables under ``root``: ``*.parquet`` outside any
    ``_delta_log``, and every file inside one (commits, checkpoints)."""
    parquet = log = 0
    for parent, _, files in os.walk(root):
        if "_delta_log" in Path(parent).relative_to(root).parts:
            log += len(files)
        else:
            parquet += sum(name.endswith(".parquet") for name in files)
    return parquet, log


def slope_per_minute(*segments: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of the values against time (``(seconds, value)`` points), per
    minute. Several segments share one slope, each with its own intercept (a restarted
    driver's memory starts afresh, and only its growth counts); None without two instants
    in one segment."""
    sxx = sxy = 0.0
    for points in segments:
        if len(points) < 2:
            continue
        mean_t = sum(t for t, _ in points) / len(points)
        mean_v = sum(v for _, v in points) / len(points)
        sxx += sum((t - mean_t) ** 2 for t, _ in points)
        sxy += sum((t - mean_t) * (v - mean_v) for t, v in points)
    return None if sxx == 0 else sxy / sxx * 60


def trends(samples: Sequence[Sample], duration_s: float) -> dict[str, dict[str, Any]]:
    """Per metric: its first and last sampled values and its slope per minute over the last
    ``TREND_WINDOW`` of the run; RSS per driver lifetime, after ``RESTART_WARMUP_S`` of each."""
    window_from = round(duration_s * (1 - TREND_WINDOW), 1)
    result: dict[str, dict[str, Any]] = {}
    for metric in METRICS:
        per_driver = metric in PER_DRIVER
        points = [(s.t_s, float(v), s.driver_pid if per_driver else None) for s in samples
                  if (v := getattr(s, metric)) is not None]
        started: dict[int | None, float] = {}
        lifetimes: dict[int | None, list[tuple[float, float]]] = {}
        first = points[0][2] if points else None  # its warm-up is the run's first third
        for t, v, pid in points:
            warm = started.setdefault(pid, t) + (RESTART_WARMUP_S if per_driver and
                                                 pid != first else 0)
            if t >= max(window_from, warm):
                lifetimes.setdefault(pid, []).append((t, v))
        slope = slope_per_minute(*lifetimes.values())
        result[metric] = {
            "first": points[0][1] if points else None,
            "last": points[-1][1] if points else None,
            "slope_per_min": None if slope is None else round(slope, 4),
            "window_from_s": window_from,
            "window_samples": sum(len(p) for p in lifetimes.values())}
        if per_driver:  # bounded memory: each driver lifetime levels off at the same peak
            peaks: dict[int | None, float] = {}
            for _t, v, pid in points:
                peaks[pid] = max(v, peaks.get(pid, v))
            result[metric]["lifetime_peaks"] = list(peaks.values())
    return result


# -- the parts the soak drives ---------------------------------------------------------------


class JobRun:
    """``txjoin run`` as a subprocess in its own process group, its output appended to
    ``log``; started again after a kill or an exit, as a supervisor would."""

    def __init__(self, args: Sequence[str], log: Path) -> None:
        self.args, self.log = list(args), log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "txjoin", "run", *self.args],
                                         stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def exit_code(self) -> int | None:
        """The exit code once it has exited on its own, else None."""
        return None if self.proc is None else self.proc.poll()

    def signal_group(self, sig: signal.Signals, wait: float) -> None:
        """Send ``sig`` to the whole process group; SIGKILL it if it outlives ``wait`` s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class SinkServer:
    """The soak's PostgreSQL sink: a server of its own under ``<dir>/soak-sink``, so that
    stopping it leaves the source database (and Debezium) running."""

    def __init__(self, directory: Path) -> None:
        self.home = directory / "soak-sink"
        shutil.rmtree(self.home, ignore_errors=True)  # a throwaway: never resumed
        self.root = postgres_mod.data_root(self.home)
        self.port = free_port()
        self.log = directory / "logs" / "soak-sink-postgres.log"
        self.server: postgres_mod.PostgresServer | None = None

    @property
    def dsn(self) -> str:
        return postgres_mod.dsn(self.port, postgres_mod.SINK_DB)

    def start(self) -> None:
        ensure_port_free(self.port, "the soak's sink PostgreSQL", wait=15.0)
        self.server = postgres_mod.start_postgres(self.root, self.port, self.log)

    def stop(self) -> None:
        if self.server is not None:
            postgres_mod.stop_postgres(self.server.process)
            self.server = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.home, ignore_errors=True)

    def keep(self) -> Path | None:
        """Stop the server and keep its data (what a failed soak's job wrote, to look into);
        the data directory, or None (and nothing left) if the server never made one."""
        self.stop()
        if postgres_mod.initialised(self.root):
            return self.root
        self.remove()
        return None


def kill_component(directory: Path, component: str) -> None:
    """SIGKILL one process of the stack (``broker``, ``debezium``) and wait until it is gone."""
    running = [c for c in stack_mod.status(directory) if c.name == component and c.running]
    if not running:
        raise ServiceError(f"the stack's {component} is not running; see `txjoin status "
                           f"--dir {directory}`")
    stop(ProcessId.of(running[0].pid), signal.SIGKILL)


def sink_batch(dsn: str, job: str) -> int | None:
    """The last batch the PostgreSQL sink applied for ``job`` (None: none yet, or down)."""
    with contextlib.suppress(psycopg2.Error), \
            contextlib.closing(psycopg2.connect(dsn, connect_timeout=2)) as conn, \
            conn.cursor() as cur:
        cur.execute("SELECT max(last_batch_id) FROM txjoin_progress WHERE job = %s", (job,))
        row = cur.fetchone()
        return None if row is None or row[0] is None else int(row[0])
    return None


def source_rows(dsn: str, tables: Sequence[str]) -> int | None:
    """Live rows of ``tables`` in the source database (None if it cannot be read now)."""
    query = "SELECT " + " + ".join(f"(SELECT count(*) FROM {t})" for t in tables)
    try:
        with contextlib.closing(psycopg2.connect(dsn, connect_timeout=2)) as conn, \
                conn.cursor() as cur:
            cur.execute(query)
            return int(cur.fetchone()[0])
    except psycopg2.Error:
        return None


class Sampler(threading.Thread):
    """Takes a ``Sample`` every ``every`` seconds until ``halt`` is set."""

    def __init__(self, run: JobRun, checkpoint: Path, output: Path, t0: float, every: float,
                 say: Callable[[str], None], source_dsn: str, tables: Sequence[str]) -> None:
        super().__init__(name="txjoin-soak-sampler", daemon=True)
        self.run_, self.checkpoint, self.output, self.t0, self.every = (
            run, checkpoint, output, t0, every)
        self.source_dsn, self.tables = source_dsn, list(tables)
        self.say = say
        self.samples: list[Sample] = []
        self.halt = threading.Event()

    def sample(self) -> Sample:
        pid = self.run_.pid
        driver, workers = (None, None) if pid is None else run_rss_mb(pid)
        parquet, log = delta_file_counts(self.output)
        state_mb = dir_mb(self.checkpoint / "state")
        rows = source_rows(self.source_dsn, self.tables)
        return Sample(round(time.monotonic() - self.t0, 1), pid,
                      None if driver is None else round(driver, 1),
                      None if workers is None else round(workers, 1),
                      round(dir_mb(self.checkpoint), 3), round(state_mb, 3), parquet, log, rows,
                      round(state_mb * 1e6 / rows, 1) if rows else None)

    def run(self) -> None:
        while True:
            sample = self.sample()
            self.samples.append(sample)
            self.say(_sample_line(sample))
            if self.halt.wait(self.every):
                return


def _sample_line(s: Sample) -> str:
    rss = ("driver down" if s.driver_rss_mb is None
           else f"driver {s.driver_rss_mb:.0f} MB, workers {s.worker_rss_mb:.0f} MB")
    return (f"  t={s.t_s:5.0f}s  {rss}, checkpoint {s.checkpoint_mb:.1f} MB (state "
            f"{s.state_store_mb:.1f} MB), delta {s.delta_parquet_files} parquet + "
            f"{s.delta_log_files} log files, {s.source_rows} source rows")


# -- the soak --------------------------------------------------------------------------------


class Soak:
    """One soak: the job streaming into its own checkpoint, Delta tables and sink server,
    the faults injected and the job's own exits, and the sampler."""

    def __init__(self, directory: Path, info: stack_mod.StackInfo, job: Job,
                 run_options: Sequence[str], say: Callable[[str], None]) -> None:
        self.directory, self.info, self.job, self.say = directory, info, job, say
        self.checkpoints = directory / "checkpoints" / "soak"
        self.output = directory / "output" / "soak"
        for derived in (self.checkpoints, self.output):  # each soak reads the topics afresh
            shutil.rmtree(derived, ignore_errors=True)
        log = directory / "logs" / "soak-run.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        self.sink = SinkServer(directory)
        self.run = JobRun([str(ORDERS), "--dir", str(directory),
                           "--checkpoint-dir", str(self.checkpoints),
                           "--output-dir", str(self.output), "--postgres-dsn", self.sink.dsn,
                           *run_options], log)
        self.sampler: Sampler | None = None
        self.t0 = time.monotonic()  # reset when the workload starts
        self.faults: list[dict[str, Any]] = []
        self.job_exits: list[dict[str, Any]] = []

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def last_batch(self) -> int | None:
        return sink_batch(self.sink.dsn, self.job.name)

    def start_job(self) -> None:
        """Start the sink server and the job; wait for the job's first batch."""
        self.sink.start()
        self.say(f"job {self.job.name} streaming into {self.output} and a sink server of its "
                 f"own on port {self.sink.port}; its log: {self.run.log}")
        self.run.start()
        commit_barrier(self.info.pg_dsn_source)  # something to read even on an old stack
        if not self.wait_for_batch(None):
            raise ServiceError(f"the job applied no batch within {RECOVERY_TIMEOUT_S:.0f}s; "
                               f"its log {self.run.log} ends:\n{self.run.tail()}")

    def stream(self, generator: GeneratorThread, schedule: Sequence[Fault]) -> list[Fault]:
        """Run the workload to its end, sampling and injecting the faults as they fall due;
        return the faults the workload's end came before."""
        self.t0 = time.monotonic()
        generator.ready.set()
        generator.start()
        self.say(f"workload: {generator.rate:g} tx/s for {generator.duration:g}s with "
                 f"{generator.writers} writers (seed {generator.seed}); faults planned: "
                 + (", ".join(f"{f.kind} at {f.at_s:.0f}s" for f in schedule) or "none"))
        self.sampler = Sampler(self.run, self.checkpoints / self.job.name, self.output,
                               self.t0, SAMPLE_EVERY_S, self.say, self.info.pg_dsn_source,
                               self.job.table_names)
        self.sampler.start()
        pending = list(schedule)
        while not generator.done.is_set():
            if pending and pending[0].at_s <= self.now():
                self.inject(pending.pop(0).kind)
            self.supervise()
            generator.done.wait(1.0)
        self.sampler.halt.set()
        self.sampler.join()
        if generator.error is not None:
            raise generator.error
        return pending

    def supervise(self) -> None:
        """Start the job again if it exited on its own (a supervisor's job)."""
        code = self.run.exit_code()
        if code is None:
            return
        self.job_exits.append({"at_s": self.now(), "exit_code": code})
        self.say(f"[yellow]t={self.now():.0f}s: txjoin run exited {code}; starting it again"
                 f"[/yellow] (its log: {self.run.log})")
        self.run.start()

    def wait_for_batch(self, after: int | None, timeout: float = RECOVERY_TIMEOUT_S) -> bool:
        """Wait until the sink applied a batch later than ``after``, keeping the job running;
        False after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.supervise()
            batch = self.last_batch()
            if batch is not None and (after is None or batch > after):
                return True
            time.sleep(1.0)
        return False

    def inject(self, kind: str) -> None:
        """Inject one fault, bring back what it broke, wait until the sink moves again."""
        at, began = self.now(), time.monotonic()
        self.say(f"[bold]t={at:.0f}s: fault {kind}[/bold]")
        if kind == "driver":
            self.run.signal_group(signal.SIGKILL, 30)
            before = self.last_batch()
            self.run.start()
        elif kind == "sink":
            before = self.last_batch()
            self.sink.stop()
            time.sleep(SINK_OUTAGE_S)
            self.sink.start()
        else:
            kill_component(self.directory, STACK_COMPONENT[kind])
            before = self.last_batch()
            if kind == "broker":
                time.sleep(BROKER_DOWN_S)
            stack_mod.up(self.directory)
        recovered = self.wait_for_batch(before)
        seconds = round(time.monotonic() - began, 1) if recovered else None
        self.faults.append({"kind": kind, "at_s": at, "recovered_s": seconds})
        self.say(f"t={self.now():.0f}s: {kind} fault over: " + (
            f"the sink applied a batch {seconds:.0f}s after it" if seconds is not None else
            f"no batch in the sink within {RECOVERY_TIMEOUT_S:.0f}s (see {self.run.log})"))

    def drain(self) -> float:
        """Stop the streaming job (Ctrl-C) and drain with ``--until-idle``; its seconds."""
        self.say(f"t={self.now():.0f}s: workload stopped and captured; draining (--until-idle)")
        self.run.signal_group(signal.SIGINT, 60)
        began = time.monotonic()
        with open(self.run.log, "ab") as out:
            drained = subprocess.run(
                [sys.executable, "-m", "txjoin", "run", "--until-idle", *self.run.args],
                stdout=out, stderr=out, stdin=subprocess.DEVNULL, timeout=DRAIN_TIMEOUT_S,
                check=False)
        if drained.returncode != 0:
            raise ServiceError(f"the drain (txjoin run --until-idle) exited "
                               f"{drained.returncode}; its log {self.run.log} ends:\n"
                               f"{self.run.tail()}")
        return round(time.monotonic() - began, 1)

    def close(self, keep_sink: bool = False) -> Path | None:
        """Stop the sampler and the job (never the stack); remove the sink server, or with
        ``keep_sink`` stop it and return its kept data directory."""
        if self.sampler is not None:
            self.sampler.halt.set()
        self.run.signal_group(signal.SIGKILL, 30)
        if keep_sink:
            return self.sink.keep()
        self.sink.remove()
        return None


def run_soak(directory: Path, rate: float, duration: float, results_file: Path,
             seed: int = 0, fault_every: float | None = None, writers: int = 2,
             master: str = "local[2]", maintain_every: int = 20,
             vacuum_retention_hours: float | None = None, level: int | None = DEFAULT_LEVEL,
             say: Callable[[str], None] = print) -> dict[str, Any]:
    """The soak (module docstring); its results as plain data, ``ok`` when both sinks matched.

    ``fault_every`` defaults to a fifth of the run (each kind of fault once), the VACUUM
    retention to a tenth of it. The results go to ``results_file`` as JSON, also when the
    soak fails half-way (with an ``error``). Leaves the stack running (as ``txjoin demo``
    does); removes the soak's own sink server, unless the soak failed: then its data stays
    (stopped) for a look at what the job wrote, and ``sink_kept`` says where.
    """
    from txjoin.job import load_job
    from txjoin.verify.verify import verify_job

    job = load_job(ORDERS)
    every = duration / 5 if fault_every is None else fault_every
    if vacuum_retention_hours is None:
        vacuum_retention_hours = round(duration / 10 / 3600, 4)
    options = ["--master", master, "--postgres-retry-timeout", str(SINK_RETRY_TIMEOUT_S)]
    if maintain_every:
        options += ["--maintain-every", str(maintain_every),
                    "--vacuum-retention-hours", str(vacuum_retention_hours)]
    up = stack_mod.up(directory, progress=lambda line: say(f"[dim]{line}[/dim]"))
    soak = Soak(directory, up.info, job, options, say)
    results: dict[str, Any] = {
        "rate_tx_per_s": rate, "duration_s": duration, "seed": seed, "writers": writers,
        "level": level,
        "fault_every_s": every, "maintain_every": maintain_every or None,
        "vacuum_retention_hours": vacuum_retention_hours if maintain_every else None,
        "faults": soak.faults, "job_exits": soak.job_exits}
    try:
        soak.start_job()
        generator = GeneratorThread(up.info, rate, duration, seed, writers, threading.Event(),
                                    level)
        skipped = soak.stream(generator, fault_schedule(duration, every, seed))
        gen = generator.result
        results.update(skipped_faults=[asdict(f) for f in skipped], workload={
            "transactions": gen.transactions, "events": gen.events,
            "seconds": round(gen.seconds, 1),
            "achieved_tx_per_s": round(gen.transactions / max(gen.seconds, 1e-9), 1)})
        results["drain_s"] = soak.drain()
        verified = verify_job(job, (up.info.pg_dsn_source, soak.sink.dsn), soak.output)
        results.update(mismatches=verified.mismatches, ok=verified.ok, verify={
            s.sink: {"rows": s.rows, "mismatches": s.mismatches} for s in verified.sinks})
        if not verified.ok:
            say(escape(verified.format(5)))
        return results
    except BaseException as exc:
        results.update(ok=False, error=str(exc) or type(exc).__name__)
        raise
    finally:
        kept = soak.close(keep_sink=not results.get("ok", False))
        if kept is not None:
            results["sink_kept"] = str(kept)
            say(f"the soak's PostgreSQL sink is kept (stopped) in {escape(str(kept))}, to look "
                "at what the job wrote; remove it when done")
        samples = soak.sampler.samples if soak.sampler is not None else []
        results.update(trends=trends(samples, duration), samples=[asdict(s) for s in samples])
        results_file.parent.mkdir(parents=True, exist_ok=True)
        results_file.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


# -- the command -----------------------------------------------------------------------------


@click.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=stack_mod.DEFAULT_DIR, show_default=True,
              help="Stack directory; the soak's checkpoint and Delta tables go to "
                   "<dir>/checkpoints/soak and <dir>/output/soak (started afresh each time).")
@click.option("--rate", type=float, default=500.0, show_default=True,
              help="Workload transactions per second.")
@click.option("--duration", type=float, default=1800.0, show_default=True,
              help="Seconds the workload writes.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seeds the workload and the faults' moments and order.")
@click.option("--fault-every", type=click.FloatRange(min=0), default=None,
              help="Seconds between faults (one at a random moment of each such slot after "
                   "the first; 0: none). Default: a fifth of --duration, so each kind once.")
@click.option("--writers", type=int, default=2, show_default=True,
              help="Concurrent workload connections.")
@click.option("--level", type=click.IntRange(min=0), default=DEFAULT_LEVEL, show_default=True,
              help="Live clients (and users) the workload keeps: beyond them it deletes the "
                   "oldest with its orders, so the join's state stays level and growth means "
                   "a leak (`txjoin generate --level`). 0: rows grow with time.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master URL.")
@click.option("--maintain-every", type=click.IntRange(min=0), default=20, show_default=True,
              help="The job's --maintain-every (0: no Delta upkeep).")
@click.option("--vacuum-retention-hours", type=click.FloatRange(min=0), default=None,
              help="The job's --vacuum-retention-hours. Default: a tenth of --duration, so "
                   "files VACUUM may delete are deleted inside the trends' window.")
@click.option("--results", "results_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None,
              help="Write the results as JSON here. Default: <dir>/soak-results.json.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the results as one JSON object on stdout; progress goes to stderr.")
def soak(directory: Path, rate: float, duration: float, seed: int, fault_every: float | None,
         writers: int, level: int, master: str, maintain_every: int,
         vacuum_retention_hours: float | None, results_file: Path | None, as_json: bool) -> None:
    """Stream jobs/orders.py for a long run under a racing workload and faults, then verify.

    Faults at seeded random moments: kill -9 of the job's driver, of the Kafka broker and of
    the Connect worker, and a 20 s stop of the PostgreSQL sink. Reports the mismatches, the
    faults, and the slope of driver and worker RSS, checkpoint and state-store size and Delta
    file counts over the last two thirds of the run. Exit code 0 when both sinks match
    PostgreSQL's answer, 1 otherwise. The stack keeps running (`txjoin down` stops it).
    """
    console = Console(stderr=as_json)

    def say(text: str) -> None:
        console.print(text, highlight=False, soft_wrap=not console.is_terminal)

    directory = directory.resolve()
    results_file = results_file or directory / "soak-results.json"
    try:
        results = run_soak(directory, rate, duration, results_file, seed, fault_every, writers,
                           master, maintain_every, vacuum_retention_hours, level or None,
                           say)
    except TxjoinError as exc:
        click.secho(f"error: {exc} (what was measured: {results_file})", fg="red", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo(f"interrupted; what was measured is in {results_file}; the stack keeps "
                   f"running (`txjoin down --dir {directory}` stops it)", err=True)
        sys.exit(130)
    if as_json:
        click.echo(json.dumps(results, sort_keys=True))
    else:
        _summary(say, results, results_file)
    sys.exit(0 if results["ok"] else 1)


METRIC_LABELS = {"driver_rss_mb": ("driver RSS", "MB"), "worker_rss_mb": ("worker RSS", "MB"),
                 "checkpoint_mb": ("checkpoint", "MB"), "state_store_mb": ("state store", "MB"),
                 "delta_parquet_files": ("Delta data files", "files"),
                 "delta_log_files": ("Delta log files", "files"),
                 "source_rows": ("source rows", "rows"),
                 "state_bytes_per_source_row": ("state per source row", "bytes")}


def _summary(say: Callable[[str], None], results: dict[str, Any], results_file: Path) -> None:
    """The results as text."""
    work = results["workload"]
    say("")
    say(f"[bold]soak summary[/bold] ({results['rate_tx_per_s']:g} tx/s offered for "
        f"{results['duration_s']:g} s, seed {results['seed']})")
    say(f"  workload     {work['transactions']:,} transactions, {work['events']:,} row changes "
        f"in {work['seconds']:.0f} s ({work['achieved_tx_per_s']:.0f} tx/s)")
    faults = "; ".join(
        f"{f['kind']} at {f['at_s']:.0f} s (" + ("sink moved again after "
                                                 f"{f['recovered_s']:.0f} s)"
                                                 if f["recovered_s"] is not None
                                                 else "did not recover)")
        for f in results["faults"]) or "none"
    say(f"  faults       {faults}")
    exits = "; ".join(f"at {e['at_s']:.0f} s (exit {e['exit_code']}, restarted)"
                      for e in results["job_exits"]) or "none"
    say(f"  job exits    {exits}")
    say(f"  drain        {results['drain_s']:.0f} s (--until-idle)")
    colour = "green" if results["ok"] else "red"
    say(f"  verify       [{colour}]{'OK' if results['ok'] else 'MISMATCH'}[/{colour}]: "
        + "; ".join(f"{sink} {v['rows']} rows, {v['mismatches']} mismatches"
                    for sink, v in results["verify"].items()))
    window = results["trends"][METRICS[0]]["window_from_s"]
    say(f"  trends       least-squares slope per minute over {window:.0f}-"
        f"{results['duration_s']:.0f} s (RSS: per driver lifetime, after its first "
        f"{RESTART_WARMUP_S:.0f} s); first -> last sample")
    for metric, (label, unit) in METRIC_LABELS.items():
        t = results["trends"][metric]
        slope = "-" if t["slope_per_min"] is None else f"{t['slope_per_min']:+,.2f} {unit}/min"
        first = "-" if t["first"] is None else f"{t['first']:,.0f}"
        last = "-" if t["last"] is None else f"{t['last']:,.0f}"
        peaks = ", ".join(f"{p:,.0f}" for p in t.get("lifetime_peaks", []))
        say(f"    {label:<18} {slope:>20}   {first} -> {last} {unit}"
            + (f" (peak per driver lifetime: {peaks})" if peaks else ""))
    say(f"  results in {results_file}; the stack keeps running (`txjoin down` stops it)")
