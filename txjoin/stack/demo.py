"""``txjoin demo``: the whole path live, PostgreSQL -> Debezium -> Spark -> Delta + PostgreSQL.

One command: start the local stack (unless it runs), drive the pizzeria workload in a
background thread, run the orders job while a live display shows what the pipeline does,
then drain, run the users/colours job over the same topics, verify both jobs against
PostgreSQL's own answer and print the figures that matter: events per second from
PostgreSQL into both sinks and the commit-to-sink latency of every change.

Draining needs to know that Debezium has published everything the workload committed.
:func:`wait_until_captured` commits a *barrier*: a no-op update of one row of
``public.tables`` (same values, so no job's output changes), and waits for its END
marker in the transaction topic. Everything committed before it is in the topics then,
so ``--until-idle`` (Spark's availableNow trigger) drains the whole workload.

Without a terminal (CI) the live display falls back to one plain line every few seconds.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import shutil
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import psycopg2
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from txjoin.errors import ServiceError, TxjoinError
from txjoin.stack import stack as stack_mod
from txjoin.stack.latency import CaptureTimes, legs_per_sink, percentile
from txjoin.stack.stack import StackInfo

REPO = Path(__file__).resolve().parents[2]
DEMO_JOBS = (REPO / "jobs" / "orders.py", REPO / "jobs" / "users_colors.py")
BARRIER_TABLE = "public.tables"
PLAIN_LINE_EVERY_S = 2.0
READY_TIMEOUT_S = 120.0
WARM_UP_S = 10.0
"""Seconds the workload writes at least before its timed ``--duration`` (``--warm-up``): a
fresh driver's first batches load classes, compile and start Python workers (measured here:
the first three batches after start took 4.9, 2.3 and 0.6 s, the next ones 0.3-0.5 s), which
is the start-up's cost, not the stream's pace. Their changes are verified but timed apart.
The warm-up then lasts until the stream keeps pace (``PACE_BATCHES``), at most
``WARM_UP_MAX_S``: on a slower machine the first batches after the same 10 s took 8.5, 4.1,
2.7, 1.8 and 1.2 s (a JVM still compiling, the stack's too), and a fixed 10 s timed them."""
PACE_BATCHES = 3
PACE_GAP_S = 2.0
"""The stream keeps pace once ``PACE_BATCHES`` micro-batches in a row each started at most
``PACE_GAP_S`` after the one before (``RunConfig.trigger_interval``, 200 ms by default, is
the least; a batch that takes longer starts the next one when it ends)."""
WARM_UP_BATCHES = 50
"""Micro-batches the warm-up runs at least (``--warm-up-batches``). A new driver's JIT
compiles Spark's per-batch code as batches run it, so the first batches are slow for
their count, not for the seconds: at 50 transactions/s (2026-11-28, medians of each 10
batches' trigger time, two new drivers) 564-677, 398-452, 386-411, 350-384, 302-325 ms
over the first 50 batches, then 264-345 ms, 240-290 ms after 100. Timing from the 8th batch
(a 10 s warm-up on a fresh clone) put those first batches' waits in the timed p99."""
WARM_UP_MAX_S = 60.0
"""The longest warm-up by default (``--warm-up-max``; never less than ``--warm-up``): timing
starts then, paced or not, and the summary says which (``warm_up.kept_pace``)."""
SLOWEST_BATCHES = 5  # listed in the summary (`--json`: slowest_batches, longest_gaps)
CATCH_UP_TIMEOUT_S = 60.0
"""Once the workload is captured, how long the streaming query may take to release every
transaction Debezium published before it is stopped anyway (the drain run does the rest)."""


# -- knowing that Debezium has published everything ---------------------------------------


def commit_barrier(source_dsn: str) -> int:
    """Commit a no-op change of a captured row; return its xid (Debezium's ``txId``)."""
    try:
        with contextlib.closing(psycopg2.connect(source_dsn, connect_timeout=5)) as conn, \
                conn, conn.cursor() as cur:
            cur.execute(f"UPDATE {BARRIER_TABLE} SET name = name "
                        f"WHERE id = (SELECT min(id) FROM {BARRIER_TABLE})")
            if cur.rowcount != 1:
                raise ServiceError(f"cannot commit a barrier: {BARRIER_TABLE} is empty")
            cur.execute("SELECT pg_current_xact_id()::text::bigint")
            row = cur.fetchone()
    except psycopg2.Error as exc:
        raise ServiceError(f"cannot commit a barrier on the source database: {exc}") from None
    assert row is not None
    return int(row[0])


def wait_for_end(info: StackInfo, xid: int, timeout: float = 120.0) -> None:
    """Wait until the END marker of transaction ``xid`` is in the transaction topic."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": info.bootstrap_servers,
                         "group.id": "txjoin-demo-barrier", "enable.auto.commit": False})
    consumer.assign([TopicPartition(info.transaction_topic, 0, 0)])
    wanted = f"{xid}:"
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                value = msg.value()
                if msg.error() is not None or value is None:
                    continue
                marker = json.loads(value)
                if marker.get("status") == "END" and str(marker.get("id", "")).startswith(wanted):
                    return
    finally:
        consumer.close()
    raise ServiceError(f"Debezium did not publish transaction {xid} within {timeout:.0f}s; "
                       f"see the stack's logs/debezium.log")


def wait_until_captured(info: StackInfo, timeout: float = 120.0) -> int:
    """Commit a barrier and wait until Debezium published it: every transaction committed
    before this call is then in the topics. Returns the barrier's xid."""
    xid = commit_barrier(info.pg_dsn_source)
    wait_for_end(info, xid, timeout)
    return xid


def published_transactions(info: StackInfo) -> int | None:
    """Transactions Debezium has published so far (END markers; BEGIN and END per one)."""
    from confluent_kafka import Consumer, TopicPartition

    try:
        consumer = Consumer({"bootstrap.servers": info.bootstrap_servers,
                             "group.id": "txjoin-demo-marks"})
        try:
            high = consumer.get_watermark_offsets(TopicPartition(info.transaction_topic, 0),
                                                  timeout=2)[1]
        finally:
            consumer.close()
    except Exception:  # the display must not die of a slow broker
        return None
    return int(high) // 2


# -- figures --------------------------------------------------------------------------------


@dataclass
class JobProgress:
    """What one job's micro-batches did, updated from Spark's foreachBatch thread."""

    job: str
    started: float = field(default_factory=time.time)
    batches: int = 0
    events: int = 0
    released: int = 0
    waiting: int = 0
    commit_seq: int = 0
    newest_commit_ms: int | None = None
    lag_ms_at_batch: float | None = None
    last_active_at: float | None = None
    written: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    recent: list[tuple[float, int]] = field(default_factory=list)
    latency_from_ms: float = 0.0  # changes committed earlier (a backlog) are not timed
    warm_up_from_ms: float | None = None  # changes from here to latency_from_ms: warm-up
    warm_up_ms: dict[str, list[float]] = field(default_factory=dict)  # per sink
    sink_latencies_ms: dict[str, list[float]] = field(default_factory=dict)  # per sink
    last_batch_id: int | None = None
    delta_batch_id: int | None = None  # the last batch Delta committed
    delta_lags_s: list[float] = field(default_factory=list)  # hand-off -> Delta commit
    delta_lag_batches_max: int = 0
    # batch id -> when it started (unix s), seconds computing it, of which its slowest shard
    batch_times: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    sink_commits: list[Any] = field(default_factory=list)  # every GroupCommit, in order
    first_batch: threading.Event = field(default_factory=threading.Event, repr=False)
    # the warm-up (``run_demo``): at least warm_up_min_s from warm_up_from_ms, at most
    # warm_up_max_s; timed is set when it ends (latency_from_ms is then final)
    warm_up_min_s: float = 0.0
    warm_up_max_s: float = 0.0
    warm_up_min_batches: int = 0
    warm_up_batches: int = 0  # micro-batches that started within the warm-up
    kept_pace: bool | None = None
    timed: threading.Event = field(default_factory=threading.Event, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def on_batch(self, report: Any) -> None:
        """``run_job``'s callback: fold one BatchReport in."""
        with self.lock:
            self.batches += 1
            self.events += report.records
            self.released += report.transactions_released
            self.waiting = report.waiting
            self.commit_seq = report.commit_seq
            self.last_batch_id = report.batch_id
            self.batch_times.setdefault(report.batch_id, (
                report.finished_at - report.seconds, report.breakdown.get("compute", 0.0),
                report.breakdown.get("shard_total", 0.0)))
            if self.delta_batch_id is not None or "delta" in report.written:
                self.delta_lag_batches_max = max(self.delta_lag_batches_max,
                                                 self.delta_lag_batches())
            for sink, applied in report.written.items():
                if applied:
                    self.written[sink] += report.changes
            if report.commit_ts_ms:
                newest = max(report.commit_ts_ms)
                self.newest_commit_ms = max(newest, self.newest_commit_ms or 0)
                self.lag_ms_at_batch = report.finished_at * 1000 - newest
                self.latencies_ms += [report.finished_at * 1000 - ts for ts in report.commit_ts_ms
                                      if ts >= self.latency_from_ms]
            if report.transactions_released:
                self.last_active_at = report.finished_at
            self.recent.append((report.finished_at, report.records))
            cutoff = report.finished_at - 10
            self.recent = [(t, n) for t, n in self.recent if t >= cutoff]
            self._end_warm_up(report.finished_at)
        self.first_batch.set()

    def start_warm_up(self, at: float, least_s: float, most_s: float,
                      least_batches: int = 0) -> None:
        """The workload began writing at ``at`` (unix s): changes are timed from the end of a
        warm-up of ``least_s`` (and ``least_batches`` micro-batches) to ``most_s`` (none
        when ``most_s`` is 0)."""
        with self.lock:
            self.warm_up_from_ms = at * 1000
            self.warm_up_min_s, self.warm_up_max_s = least_s, most_s
            self.warm_up_min_batches = least_batches
            self.latency_from_ms = math.inf
            if most_s <= 0:
                self._time_from(at, None)

    def end_warm_up(self, now: float) -> None:
        """The warm-up's longest time is up: time from ``now``, paced or not."""
        with self.lock:
            if not self.timed.is_set():
                self._time_from(now, False)

    def _end_warm_up(self, now: float) -> None:
        """After a batch (under the lock): end the warm-up if it lasted its least (seconds
        and micro-batches) and the stream keeps pace, or if it lasted its most."""
        if self.warm_up_from_ms is None or self.timed.is_set():
            return
        began = self.warm_up_from_ms / 1000
        self.warm_up_batches = sum(1 for t in self.batch_times.values() if t[0] >= began)
        if now - began < self.warm_up_max_s and (
                now - began < self.warm_up_min_s
                or self.warm_up_batches < self.warm_up_min_batches):
            return
        starts = [t[0] for _, t in sorted(self.batch_times.items())[-(PACE_BATCHES + 1):]]
        paced = (len(starts) == PACE_BATCHES + 1 and starts[0] >= began
                 and all(b - a <= PACE_GAP_S for a, b in itertools.pairwise(starts)))
        if paced or now - began >= self.warm_up_max_s:
            self._time_from(now, paced)

    def _time_from(self, at: float, paced: bool | None) -> None:
        self.latency_from_ms = at * 1000
        self.kept_pace = paced
        self.timed.set()

    def on_sink_commit(self, commit: Any) -> None:
        """``run_job``'s callback for each sink commit (PostgreSQL's per batch, Delta's per
        group): per-sink commit-to-sink latency, and Delta's lag behind the batches."""
        with self.lock:
            self.sink_commits.append(commit)
            self.sink_latencies_ms.setdefault(commit.sink, []).extend(
                commit.finished_at * 1000 - ts for ts in commit.commit_ts_ms
                if ts >= self.latency_from_ms)
            if self.warm_up_from_ms is not None:
                self.warm_up_ms.setdefault(commit.sink, []).extend(
                    commit.finished_at * 1000 - ts for ts in commit.commit_ts_ms
                    if self.warm_up_from_ms <= ts < self.latency_from_ms)
            if commit.commit_ts_ms and commit.sink == "delta":
                self.last_active_at = max(self.last_active_at or 0.0, commit.finished_at)
            if commit.sink == "delta":
                self.delta_batch_id = max(self.delta_batch_id or -1, commit.last_batch)
                self.delta_lags_s.append(commit.lag_seconds)

    def delta_lag_batches(self) -> int:
        """Batches PostgreSQL holds that Delta does not yet (caller holds the lock)."""
        if self.last_batch_id is None:
            return 0
        return max(0, self.last_batch_id - (-1 if self.delta_batch_id is None
                                            else self.delta_batch_id))

    def events_per_s(self) -> float:
        """Records read per second over the last ~10 s."""
        with self.lock:
            if not self.recent:
                return 0.0
            span = max(time.time() - self.recent[0][0], 1.0)
            return sum(n for _, n in self.recent) / span

    def line(self, published: int | None) -> str:
        """The plain-text progress line (no terminal)."""
        behind = "?" if published is None else str(max(published - self.commit_seq, 0))
        lag = "-" if self.lag_ms_at_batch is None else f"{self.lag_ms_at_batch:.0f}"
        sinks = ", ".join(f"{k} {v}" for k, v in sorted(self.written.items())) or "-"
        return (f"[{self.job}] {self.batches} batches, {self.events} events read "
                f"({self.events_per_s():.0f}/s), {self.released} transactions released, "
                f"{self.waiting} waiting, frontier commit_seq {self.commit_seq} ({behind} behind "
                f"Debezium), lag {lag} ms; rows written: {sinks}")


class LiveView:
    """The rich renderable of the live display (rebuilt on every refresh)."""

    def __init__(self, info: StackInfo, progress: JobProgress, generator: GeneratorThread
                 ) -> None:
        self.info, self.progress, self.generator = info, progress, generator
        self._published: int | None = None
        self._polled = 0.0

    def published(self) -> int | None:
        if time.monotonic() - self._polled > 1.0:
            self._published = published_transactions(self.info)
            self._polled = time.monotonic()
        return self._published

    def __rich__(self) -> Group:
        p = self.progress
        published = self.published()
        now_ms = time.time() * 1000
        table = Table(title=f"txjoin demo: job {p.job}", show_header=False, min_width=60)
        table.add_column(style="bold")
        table.add_column(justify="right")
        table.add_row("workload", self.generator.status())
        table.add_row("Debezium: transactions published", "?" if published is None
                      else str(published))
        table.add_row("events read", f"{p.events}  ({p.events_per_s():.0f}/s)")
        table.add_row("transactions assembled", str(p.released + p.waiting))
        table.add_row("  waiting (incomplete or behind one)", str(p.waiting))
        table.add_row("  released in commit order", str(p.released))
        table.add_row("frontier (commit_seq)", str(p.commit_seq))
        behind = "?" if published is None else str(max(published - p.commit_seq, 0))
        table.add_row("frontier lag, transactions", behind)
        age = "-" if p.newest_commit_ms is None else f"{now_ms - p.newest_commit_ms:,.0f}"
        at_batch = "-" if p.lag_ms_at_batch is None else f"{p.lag_ms_at_batch:,.0f}"
        table.add_row("frontier lag, ms (now / at last commit)", f"{age} / {at_batch}")
        for sink, rows in sorted(p.written.items()):
            table.add_row(f"rows written: {sink}", str(rows))
        with p.lock:
            latencies = {k: list(v) for k, v in p.sink_latencies_ms.items()}
            delta_behind = p.delta_lag_batches()
            delta_lag = p.delta_lags_s[-1] if p.delta_lags_s else None
        for sink, values in sorted(latencies.items()):
            table.add_row(f"commit-to-sink {sink}, ms (p50 / p99)",
                          f"{_ms(percentile(values, 50))} / {_ms(percentile(values, 99))}")
        if "delta" in latencies or "delta" in p.written:
            table.add_row("Delta behind PostgreSQL (batches / s at last commit)",
                          f"{delta_behind} / {'-' if delta_lag is None else f'{delta_lag:.1f}'}")
        table.add_row("micro-batches", str(p.batches))
        return Group(table, Text("Ctrl-C stops the demo; the stack keeps running", style="dim"))


# -- the workload in the background ---------------------------------------------------------


class GeneratorThread(threading.Thread):
    """Once ``ready`` is set (the query ran its first micro-batch, which pays Spark's
    start-up), runs ``txjoin generate``, commits the barrier and sets ``done``."""

    def __init__(self, info: StackInfo, rate: float, duration: float, seed: int,
                 writers: int, ready: threading.Event, level: int | None = None,
                 on_start: Callable[[float], None] | None = None,
                 stop: threading.Event | None = None) -> None:
        super().__init__(name="txjoin-demo-generator", daemon=True)
        self.on_start = on_start
        self.stop = stop  # set: the workload ends early (its duration is then at most)
        self.info, self.rate, self.duration, self.seed, self.writers = (
            info, rate, duration, seed, writers)
        self.level = level
        self.ready = ready
        self.done = threading.Event()
        self.started_at: float | None = None
        self.generated_at: float | None = None
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from txjoin.stack.generate import generate

        try:
            self.ready.wait(READY_TIMEOUT_S)
            self.started_at = time.time()
            if self.on_start is not None:
                self.on_start(self.started_at)
            self.result = generate(self.info.pg_dsn_source, self.rate, self.duration,
                                   seed=self.seed, writers=self.writers, stop=self.stop,
                                   level=self.level)
            self.generated_at = time.time()
            wait_until_captured(self.info)
        except BaseException as exc:  # reported by the main thread
            self.error = exc
        finally:
            self.done.set()

    def status(self) -> str:
        if self.started_at is None:
            return "waiting for the query's first micro-batch"
        if self.generated_at is None and not self.done.is_set():
            planned = "" if self.stop is not None else f"/{self.duration:g}"
            return (f"writing {self.rate:g} tx/s: {time.time() - self.started_at:.0f}"
                    f"{planned} s")
        if not self.done.is_set():
            return "stopped; waiting for Debezium to publish the last commit"
        return "done"


# -- the command ----------------------------------------------------------------------------


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` meanwhile: the JVM started now (and the Python
    workers it forks) keep logging there instead of over the live display."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _fresh_outputs(directory: Path, jobs: list[Any]) -> None:
    """Checkpoints and Delta tables left from an earlier stack point at topics and a sink
    database that no longer exist (the broker keeps topics in memory): start them over."""
    for job in jobs:
        shutil.rmtree(directory / "checkpoints" / job.name, ignore_errors=True)
        shutil.rmtree(directory / "output" / job.output.table, ignore_errors=True)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


@click.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=stack_mod.DEFAULT_DIR, show_default=True,
              help="Stack directory; checkpoints and Delta output go to <dir>/checkpoints "
                   "and <dir>/output, as with `txjoin run`.")
@click.option("--duration", type=float, default=60.0, show_default=True,
              help="Seconds the workload writes after the warm-up, timed.")
@click.option("--warm-up", type=click.FloatRange(min=0), default=WARM_UP_S, show_default=True,
              help="Seconds the workload writes at least before the timed --duration, at the "
                   "same rate, and at least --warm-up-batches micro-batches; then until the "
                   f"stream keeps pace ({PACE_BATCHES} micro-batches "
                   f"in a row, each started within {PACE_GAP_S:g} s of the one before), up to "
                   "--warm-up-max: a fresh "
                   "driver's first batches (class loading, compiling, Python workers "
                   "starting) are verified but timed apart (warm_up in --json). 0: time "
                   "every change.")
@click.option("--warm-up-max", type=click.FloatRange(min=0), default=WARM_UP_MAX_S,
              show_default=True,
              help="Seconds the warm-up lasts at most (at least --warm-up), paced or not.")
@click.option("--warm-up-batches", type=click.IntRange(min=0), default=WARM_UP_BATCHES,
              show_default=True,
              help="Micro-batches the warm-up runs at least (within --warm-up-max): a new "
                   "driver's JIT compiles Spark's per-batch code as batches run, and its "
                   "first ~50 batches take up to twice as long as later ones.")
@click.option("--rate", type=float, default=50.0, show_default=True,
              help="Workload transactions per second.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--writers", type=int, default=2, show_default=True,
              help="Concurrent workload connections (they race for rows, serialised per "
                   "transaction).")
@click.option("--orders-only", is_flag=True, help="Skip the users/colours job.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master URL.")
@click.option("--plain", is_flag=True,
              help="Plain progress lines even on a terminal (the default without one).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the summary as one JSON object on stdout (commit_to_sink_ms and "
                   "commit_to_sink_ms_by_sink with p50/p99/max, where_ms: each sink's time "
                   "leg by leg (Debezium, Kafka, waiting for a batch, Spark's and the "
                   "shards' part of the batch, the sink), events_per_s and end_to_end_s, "
                   "driver_jit: the CPU the driver's JIT compiler used in the timed window, "
                   "verify results); progress goes to stderr.")
def demo(directory: Path, duration: float, warm_up: float, warm_up_max: float,
         warm_up_batches: int, rate: float, seed: int, writers: int, orders_only: bool,
         master: str, plain: bool, as_json: bool) -> None:
    """Start the stack, write a live workload, stream it through txjoin, verify, summarise.

    The stack keeps running afterwards (`txjoin down` stops it). Exit code 0 when every sink
    of every job matches PostgreSQL's answer, 1 otherwise.
    """
    console = Console(stderr=True) if as_json else None
    try:
        summary = run_demo(directory, duration, rate, seed, writers, orders_only, master,
                           plain or as_json, console, warm_up=warm_up,
                           warm_up_max=warm_up_max, warm_up_batches=warm_up_batches)
    except TxjoinError as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(exc.exit_code)
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
    sys.exit(0 if summary["ok"] else 1)


def run_demo(directory: Path, duration: float, rate: float, seed: int = 0, writers: int = 2,
             orders_only: bool = False, master: str = "local[2]", plain: bool = False,
             console: Console | None = None, warm_up: float = WARM_UP_S,
             warm_up_max: float = WARM_UP_MAX_S,
             warm_up_batches: int = WARM_UP_BATCHES) -> dict[str, Any]:
    """The demo; its summary (``summary_data``), ``ok`` when every verification passed."""
    from txjoin.job import load_job
    from txjoin.jvm import compiler_cpu_seconds, jvm_pid
    from txjoin.pipeline.pipeline import RunConfig
    from txjoin.pipeline.run import run_job
    from txjoin.pipeline.session import get_session
    from txjoin.verify.verify import verify_job

    console = console or Console()
    # Stopping the streaming query interrupts the micro-batch in flight (it is redone on the
    # next start); PySpark then warns with a full JVM stack trace that says nothing more.
    warnings.filterwarnings("ignore", message="toPandas attempted Arrow optimization")
    live_ok = console.is_terminal and not plain
    jobs = [load_job(p) for p in (DEMO_JOBS[:1] if orders_only else DEMO_JOBS)]

    def say(text: str, markup: bool = True) -> None:
        console.print(text, highlight=False, markup=markup, soft_wrap=not console.is_terminal)

    up = stack_mod.up(directory, progress=lambda line: say(f"[dim]{line}[/dim]"))
    info = up.info
    if up.already_running or up.resumed:
        say(f"stack in {directory} already running: resuming its checkpoints and outputs")
    else:
        _fresh_outputs(Path(directory), jobs)

    spark_log = Path(directory) / "logs" / "demo-spark.log"
    started = time.monotonic()
    with _stderr_to(spark_log):
        session = get_session(master, app_name="txjoin-demo")
    driver = jvm_pid(session)
    say(f"Spark session in {time.monotonic() - started:.1f}s (its log: {spark_log})")

    def config(until_idle: bool) -> RunConfig:
        return RunConfig(topic_prefix=info.topic_prefix, bootstrap_servers=info.bootstrap_servers,
                         checkpoint_dir=str(Path(directory) / "checkpoints"),
                         output_dir=str(Path(directory) / "output"), master=master,
                         postgres_dsn=info.pg_dsn_sink, until_idle=until_idle)

    orders = jobs[0]
    progress = JobProgress(orders.name)

    # The warm-up: at least warm_up and warm_up_batches, then until the stream keeps pace, at
    # most warm_up_max.
    warm_up_max = max(warm_up, warm_up_max) if warm_up > 0 else 0.0
    workload_done = threading.Event()

    def timed_after_warm_up(started_at: float) -> None:
        progress.start_warm_up(started_at, warm_up, warm_up_max, warm_up_batches)
        threading.Thread(target=end_workload, args=(started_at,), daemon=True).start()

    # the driver's JIT compiler threads' CPU seconds when the timed window starts and ends
    jit: list[float | None] = []

    def end_workload(started_at: float) -> None:
        # `duration` seconds timed after the warm-up, whenever it ended
        if not progress.timed.wait(max(0.0, started_at + warm_up_max - time.time())):
            progress.end_warm_up(time.time())
        jit.append(None if driver is None else compiler_cpu_seconds(driver))
        time.sleep(max(0.0, progress.latency_from_ms / 1000 + duration - time.time()))
        jit.append(None if driver is None else compiler_cpu_seconds(driver))
        workload_done.set()

    generator = GeneratorThread(info, rate, warm_up_max + duration, seed, writers,
                                progress.first_batch, on_start=timed_after_warm_up,
                                stop=workload_done)
    stop = threading.Event()
    warming = (f"for {warm_up:g}s and {warm_up_batches} micro-batches of warm-up and until "
               f"the stream keeps pace (at most {warm_up_max:g}s), then " if warm_up > 0 else "")
    say(f"job {orders.name} streaming; once its first micro-batch is done the workload "
        f"writes {rate:g} tx/s {warming}{duration:g}s timed, with "
        f"{writers} writers (seed {seed})")
    # Something new to read, so the first micro-batch runs even on a resumed checkpoint.
    commit_barrier(info.pg_dsn_source)
    progress.latency_from_ms = time.time() * 1000
    # Beside the pipeline: when each transaction reached Debezium and Kafka (``where_ms``).
    capture = CaptureTimes(info.bootstrap_servers, orders.topics(info.topic_prefix),
                           info.transaction_topic, int(progress.latency_from_ms))
    capture.start()
    capture.ready.wait(30)
    generator.start()

    caught_up: list[str] = []

    def stop_when_caught_up() -> None:
        # The streaming query runs until it released every transaction of the workload:
        # stopped earlier, the last second's changes would wait for the drain run's query
        # to start (seconds: a restart, not the stream's pace) and make the p99.
        generator.done.wait()
        waited = time.monotonic()
        published = None  # read once: the workload is captured, so its count is final
        while time.monotonic() - waited < CATCH_UP_TIMEOUT_S:
            if published is None:
                published = published_transactions(info)
            if published is not None and progress.commit_seq >= published:
                caught_up.append(f"the stream released all {published} published "
                                 f"transactions {time.monotonic() - waited:.1f}s after the "
                                 "workload was captured")
                break
            time.sleep(0.2)
        else:
            caught_up.append(f"the stream had not released every published transaction "
                             f"{CATCH_UP_TIMEOUT_S:g}s after the workload was captured")
        stop.set()

    threading.Thread(target=stop_when_caught_up, daemon=True).start()
    view = LiveView(info, progress, generator)
    try:
        if live_ok:
            with Live(view, console=console, refresh_per_second=4, transient=False):
                run_job(orders, config(False), on_batch=progress.on_batch, stop=stop, quiet=True,
                        on_sink_commit=progress.on_sink_commit)
        else:
            last = [0.0]

            def plain_line(report: Any) -> None:
                progress.on_batch(report)
                if time.monotonic() - last[0] >= PLAIN_LINE_EVERY_S:
                    last[0] = time.monotonic()
                    say(progress.line(view.published()), markup=False)

            run_job(orders, config(False), on_batch=plain_line, stop=stop, quiet=True,
                    on_sink_commit=progress.on_sink_commit)
    except KeyboardInterrupt:
        stop.set()
        say(f"interrupted; the stack keeps running (`txjoin down --dir {directory}` stops it)")
        raise SystemExit(130) from None
    if generator.error is not None:
        raise generator.error
    say(f"workload stopped and captured; {caught_up[0] if caught_up else 'interrupted'}; "
        "draining (until idle)")
    run_job(orders, config(True), on_batch=progress.on_batch, quiet=True,
            on_sink_commit=progress.on_sink_commit)
    capture.stop()
    say(progress.line(published_transactions(info)), markup=False)

    others: list[tuple[Any, JobProgress, float]] = []
    for job in jobs[1:]:
        job_progress = JobProgress(job.name)
        began = time.time()
        run_job(job, config(True), on_batch=job_progress.on_batch, quiet=True,
                on_sink_commit=job_progress.on_sink_commit)
        others.append((job, job_progress, time.time() - began))
        say(job_progress.line(published_transactions(info)), markup=False)

    results = [verify_job(job, (info.pg_dsn_source, info.pg_dsn_sink), Path(directory) / "output",
                          {s.name: info.source(s.name).dsn for s in job.sources} or None)
               for job in jobs]
    summary = summary_data(rate, duration, generator, progress, results)
    warmed = None
    if progress.warm_up_from_ms is not None and progress.timed.is_set():
        warmed = round((progress.latency_from_ms - progress.warm_up_from_ms) / 1000, 1)
    summary["warm_up"] = {"seconds": warmed, "least_s": warm_up, "most_s": warm_up_max,
                          "least_batches": warm_up_batches if warm_up_max > 0 else 0,
                          "batches": progress.warm_up_batches,
                          "kept_pace": progress.kept_pace, "commit_to_sink_ms_by_sink": {
                              sink: _latency(v) for sink, v in sorted(progress.warm_up_ms.items())}}
    summary["driver_jit"] = driver_jit(jit, duration)
    timed = {ms: times for ms, times in capture.by_commit_ms().items()
             if ms >= progress.latency_from_ms}
    summary["where_ms"] = {
        sink: legs.summary() for sink, legs in legs_per_sink(
            timed, progress.batch_times, progress.sink_commits).items()}
    _summary(say, up, generator, summary, others, results)
    say(f"the stack keeps running: `txjoin down --dir {directory}` stops it "
        f"(`--wipe` also removes its data)")
    return summary


def driver_jit(samples: list[float | None], duration: float) -> dict[str, Any] | None:
    """What the driver's JIT compiler threads used of the timed window (``samples``: their
    CPU seconds at its start and end), or None where that cannot be read (not Linux)."""
    if len(samples) != 2 or samples[0] is None or samples[1] is None or duration <= 0:
        return None
    cpu_s = samples[1] - samples[0]
    return {"cpu_s": round(cpu_s, 1), "share_of_a_core": round(cpu_s / duration, 2),
            "cores": os.cpu_count()}


def _latency(values: list[float]) -> dict[str, Any]:
    return {"p50": percentile(values, 50), "p99": percentile(values, 99),
            "max": max(values) if values else None, "count": len(values)}


def summary_data(rate: float, duration: float, generator: GeneratorThread,
                 progress: JobProgress, results: list[Any]) -> dict[str, Any]:
    """The demo's figures as plain data (``txjoin demo --json``): the offered and achieved
    rates, commit-to-sink latency of the streamed job in ms, and each job's verify."""
    gen = generator.result
    by_sink = progress.sink_latencies_ms
    # A change is in "the sinks" once every sink holds it: the slower sink's latency.
    lat = by_sink.get("delta") or by_sink.get("postgres") or progress.latencies_ms
    lags = progress.delta_lags_s
    data: dict[str, Any] = {
        "rate_tx_per_s": rate, "duration_s": duration,
        "transactions": gen.transactions if gen is not None else 0,
        "events": gen.events if gen is not None else 0,
        "commit_to_sink_ms": {"p50": percentile(lat, 50), "p99": percentile(lat, 99),
                              "max": max(lat) if lat else None, "count": len(lat)},
        "commit_to_sink_ms_by_sink": {sink: _latency(v) for sink, v in sorted(by_sink.items())},
        # Delta's lag behind PostgreSQL: batches PostgreSQL held and Delta not yet (the
        # most at any batch), and a batch's wait from its hand-off to its Delta commit.
        "delta_lag": {"batches_max": progress.delta_lag_batches_max,
                      "seconds_p50": percentile(lags, 50) if lags else None,
                      "seconds_max": max(lags) if lags else None,
                      "commits": len(lags)},
        "ok": all(r.ok for r in results),
        "verify": {r.job: {"ok": r.ok, "sinks": {s.sink: {"rows": s.rows,
                                                          "mismatches": s.mismatches}
                                                 for s in r.sinks}} for r in results},
    }
    if gen is not None:
        data["achieved_tx_per_s"] = gen.transactions / max(gen.seconds, 1e-9)
    # What a p99 is made of: the batches that took longest (Spark's part) and the longest
    # waits from one batch's start to the next one's, and when they were: those of the
    # timed changes (at_s from the timed start), the warm-up's being timed apart.
    timed_from = progress.latency_from_ms / 1000
    began = timed_from if 0 < timed_from < math.inf else (generator.started_at
                                                           or progress.started)
    batches = sorted(progress.batch_times.items())

    def described(batch_id: int, started: float, compute: float, shards: float,
                  previous: float | None) -> dict[str, Any]:
        return {"batch_id": batch_id, "at_s": round(started - began, 1),
                "compute_ms": round(compute * 1000), "shards_ms": round(shards * 1000),
                "since_previous_ms": None if previous is None
                else round((started - previous) * 1000)}

    listed = [described(b, *times, batches[i - 1][1][0] if i else None)
              for i, (b, times) in enumerate(batches)]
    listed = [b for b in listed if b["at_s"] >= 0] or listed
    data["slowest_batches"] = sorted(listed, key=lambda b: -b["compute_ms"])[:SLOWEST_BATCHES]
    data["longest_gaps"] = sorted((b for b in listed if b["since_previous_ms"] is not None),
                                  key=lambda b: -b["since_previous_ms"])[:SLOWEST_BATCHES]
    # events_per_s: from the first write to the last sink commit, end to end
    end = progress.last_active_at
    data["end_to_end_s"] = data["events_per_s"] = None
    if gen is not None and generator.started_at is not None and end is not None:
        data["end_to_end_s"] = end - generator.started_at
        data["events_per_s"] = gen.events / max(data["end_to_end_s"], 1e-9)
    return data


def _summary(say: Any, up: Any, generator: GeneratorThread, summary: dict[str, Any],
             others: list[tuple[Any, JobProgress, float]], results: list[Any]) -> None:
    """The demo's summary as text, from ``summary_data``'s figures."""
    gen = generator.result
    say("")
    say("[bold]summary[/bold]")
    start = "already running" if up.already_running else f"{up.seconds:.1f} s"
    say(f"  stack start          {start}")
    if gen is not None and generator.started_at is not None:
        say(f"  workload             {gen.transactions} transactions, {gen.events} row changes "
            f"in {gen.seconds:.1f} s ({summary['achieved_tx_per_s']:.0f} tx/s, "
            f"{gen.events / max(gen.seconds, 1e-9):.0f} events/s)")
        if summary["end_to_end_s"] is not None:
            say(f"  PostgreSQL -> sinks  {gen.events} events into delta and postgres in "
                f"{summary['end_to_end_s']:.1f} s from the first write to the last sink commit "
                f"= {summary['events_per_s']:.0f} events/s")
    lat = summary["commit_to_sink_ms"]
    say(f"  commit-to-sink       p50 {_ms(lat['p50'])}, p99 {_ms(lat['p99'])}"
        f", max {_ms(lat['max'])} over {lat['count']} changes "
        f"(sink commit time - source commit time, until every sink holds it)")
    for sink, one in summary["commit_to_sink_ms_by_sink"].items():
        say(f"    {sink:<18} p50 {_ms(one['p50'])}, p99 {_ms(one['p99'])}, "
            f"max {_ms(one['max'])}")
    warm = summary.get("warm_up", {})
    if warm.get("commit_to_sink_ms_by_sink") and warm.get("seconds") is not None:
        paced = {True: ", until the stream kept pace", False: ", its longest: the stream had "
                 "not kept pace", None: ""}[warm.get("kept_pace")]
        batches = f" ({warm['batches']} micro-batches)" if warm.get("batches") else ""
        say(f"    the {warm['seconds']:g} s warm-up{batches} before{paced} (not in the figures "
            "above): " +
            ", ".join(f"{sink} p50 {_ms(one['p50'])}, p99 {_ms(one['p99'])}"
                      for sink, one in warm["commit_to_sink_ms_by_sink"].items()))
    jit = summary.get("driver_jit")
    if jit is not None:
        say(f"    the driver's JIT compiled for {jit['cpu_s']:g} s of CPU in the timed "
            f"{summary['duration_s']:g} s ({jit['share_of_a_core']:.0%} of a core, on "
            f"{jit['cores']}): a new driver compiles Spark's per-batch code for minutes; a "
            "longer --warm-up times a warmer one")
    for sink, where in summary.get("where_ms", {}).items():
        if where["changes"]:
            say(f"    {sink} leg by leg (ms, p50 / p99 / mean of the slowest 1%): " + ", ".join(
                f"{leg} {where[leg]['p50']:.0f}/{where[leg]['p99']:.0f}/"
                f"{where[leg]['slowest_1pct_mean']:.0f}"
                for leg in where if leg not in ("changes", "total")), markup=False)
    lag = summary["delta_lag"]
    if lag["commits"]:
        say(f"  Delta behind PG      at most {lag['batches_max']} batches; a batch's hand-off "
            f"to its Delta commit p50 {lag['seconds_p50']:.1f} s, max "
            f"{lag['seconds_max']:.1f} s ({lag['commits']} group commits)")
    for job, job_progress, seconds in others:
        say(f"  {job.name:<20} caught up on the whole history: {job_progress.events} events "
            f"in {seconds:.1f} s = {job_progress.events / max(seconds, 1e-9):.0f} events/s "
            f"(Spark session already up)")
    for result in results:
        colour = "green" if result.ok else "red"
        say(f"  verify {result.job:<13} [{colour}]{'OK' if result.ok else 'MISMATCH'}[/{colour}]"
            f" vs {result.oracle}: " + "; ".join(
                f"{s.sink} {s.rows} rows, {s.mismatches} mismatches" for s in result.sinks))
        if not result.ok:
            say(result.format(5), markup=False)
