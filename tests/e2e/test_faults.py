"""Faults of the real parts while the job streams: the Kafka broker or the Connect worker
killed with SIGKILL, then started again the way a user (or a supervisor) does, `txjoin up`
on the same stack directory.

(a) The broker dies mid-stream while the workload writes: Debezium's producer waits for it
    and retries, the job may fail (the test restarts it, as a supervisor would).
(b) The Connect worker dies in the middle of one large source transaction: it resumes from
    its last flushed offsets, so part of the transaction arrives twice.

Either way the sinks must equal PostgreSQL's own answer, with every version of every order
exactly once in the changelog (no transaction applied twice). The module has its own stack
(faults must not reach the session's, and a short backlog keeps the runs short). Timings are
printed (run with -s), never asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.e2e.conftest import E2EStack, committed_after, running_stack
from tests.e2e.test_end_to_end import (
    ORDERS,
    Workload,
    assert_orders_changelogs,
    assert_verified,
    fresh_sink_database,
    run_args,
    run_until_idle,
    streaming_run,
    tail,
    wait_for_first_commit,
)
from txjoin.job import load_job
from txjoin.stack import status, up
from txjoin.stack.demo import wait_for_end, wait_until_captured
from txjoin.stack.generate import generate
from txjoin.stack.postgres import ADVISORY_LOCK_KEY
from txjoin.verify.verify import verify_job

pytestmark = pytest.mark.e2e

BROKER_DOWN_S = 8
BIG_TRANSACTION_ORDERS = 10_000  # two data events each (table_assignment + orders)


@pytest.fixture(scope="module")
def faults_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EStack]:
    with running_stack(tmp_path_factory.mktemp("e2e-faults-stack")) as stack:
        yield stack


def kill_9(stack: E2EStack, component: str) -> None:
    """SIGKILL one process of the stack and wait until it is gone."""
    pid = {c.name: c.pid for c in status(stack.directory)}[component]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(c.running for c in status(stack.directory) if c.name == component):
        assert time.monotonic() < deadline, f"{component} (pid {pid}) survived SIGKILL"
        time.sleep(0.1)


def resume(stack: E2EStack, component: str) -> float:
    """`txjoin up` on the stack directory: it starts the dead component on the same ports
    and data. Returns the seconds it took."""
    started = time.monotonic()
    result = up(stack.directory)
    assert result.resumed and result.info == stack.info
    seconds = time.monotonic() - started
    print(f"[e2e] {component} killed with SIGKILL, back after `txjoin up` in {seconds:.1f}s")
    return seconds


def stop_or_note_death(run: subprocess.Popen[bytes], log: Path) -> None:
    """Ctrl-C a streaming job that survived the fault; a job that died is left for the
    drain to restart (a supervisor's job)."""
    if run.poll() is not None:
        print(f"[e2e] the streaming job exited {run.returncode} during the fault; "
              f"restarted by the drain. Its last lines:\n{tail(log, 8)}")
        return
    print("[e2e] the streaming job survived the fault")
    os.killpg(run.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        run.wait(60)


def drain_and_verify(stack: E2EStack, log: Path, args: list[str], work: Path,
                     sink_dsn: str) -> None:
    seconds = run_until_idle(log, *args)
    print(f"[e2e] drained with --until-idle in {seconds:.1f}s")
    assert_verified(verify_job(load_job(ORDERS), (stack.info.pg_dsn_source, sink_dsn),
                               work / "output"))
    assert_orders_changelogs(stack, work, sink_dsn)


def test_broker_kill_9_mid_stream_loses_and_repeats_nothing(faults_stack: E2EStack,
                                                            tmp_path: Path) -> None:
    stack = faults_stack
    sink_dsn = fresh_sink_database(stack, "sink_broker_killed")
    log = tmp_path / "run.log"
    args = run_args(stack, ORDERS, tmp_path, sink_dsn)
    generate(stack.info.pg_dsn_source, rate_tx_per_s=30, duration_s=3, seed=30)  # orders

    with streaming_run(log, *args) as run:
        wait_for_first_commit(tmp_path, run, log)
        # The duration is a bound: the workload stops once some of it committed after the
        # broker is back (until issue 34 it ran 45 s out, whatever the fault took).
        workload = Workload(stack, rate=30, duration=180, seed=31)
        workload.start()
        committed_after(stack.info.pg_dsn_source, 30)  # under way (was: a 5 s sleep)
        kill_9(stack, "broker")
        time.sleep(BROKER_DOWN_S)  # the workload keeps committing; Connect keeps retrying
        assert workload.is_alive(), "the workload ended while the broker was down: lengthen it"
        resume(stack, "broker")
        committed_after(stack.info.pg_dsn_source, 30)
        result = workload.finish(early=True)
        wait_until_captured(stack.info)
        stop_or_note_death(run, log)
    print(f"[e2e] workload: {result.transactions} tx, {result.events} events")
    drain_and_verify(stack, log, args, tmp_path, sink_dsn)


# -- (b) the Connect worker dies inside one large transaction -------------------------------


class BigTransaction(threading.Thread):
    """One transaction: ``orders`` table assignments, an order on each, and PostgreSQL's
    answer for every order (under the generator's lock, so commit order is kept)."""

    def __init__(self, dsn: str, orders: int) -> None:
        super().__init__(name="e2e-big-transaction", daemon=True)
        self.dsn, self.orders = dsn, orders
        self.xid: int | None = None
        self.error: BaseException | None = None
        self.ready = threading.Event()

    def run(self) -> None:
        try:
            conn = psycopg2.connect(self.dsn)
            try:
                with conn, conn.cursor() as cur:
                    cur.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
                    cur.execute("SELECT pg_current_xact_id()::text::bigint")
                    self.xid = int(cur.fetchone()[0])
                    self.ready.set()
                    cur.execute(
                        "WITH a AS (INSERT INTO public.table_assignment "
                        "  (client_id, table_id, time_in) "
                        "  SELECT (SELECT min(id) FROM public.clients), "
                        "         (SELECT min(id) FROM public.tables), now() "
                        "  FROM generate_series(1, %s) RETURNING id) "
                        "INSERT INTO public.orders (table_assignment_id, order_time, pizzas) "
                        "SELECT id, now(), ARRAY[1, 2, 2] FROM a RETURNING id", (self.orders,))
                    ids = [row[0] for row in cur.fetchall()]
                    cur.execute("SELECT count(public.record_order_expected(id)) "
                                "FROM unnest(%s::int[]) AS id", (ids,))
            finally:
                conn.close()
        except BaseException as exc:
            self.error = exc
        finally:
            self.ready.set()

    def finish(self) -> int:
        self.join(120)
        if self.error is not None:
            raise self.error
        assert self.xid is not None
        return self.xid


def markers_of(stack: E2EStack, xid: int, timeout: float = 120.0,
               until: str = "BEGIN") -> list[str]:
    """The statuses of ``xid``'s markers in the transaction topic, read until one is
    ``until`` (or, for BEGIN, everything so far once it is seen)."""
    consumer = Consumer({"bootstrap.servers": stack.info.bootstrap_servers,
                         "group.id": "txjoin-e2e-faults", "enable.auto.commit": False})
    consumer.assign([TopicPartition(stack.info.transaction_topic, 0, 0)])
    wanted, seen = f"{xid}:", []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            batch = consumer.consume(1000, 0.2)
            for msg in batch:
                value = msg.value()
                if msg.error() is None and value is not None:
                    marker = json.loads(value)
                    if str(marker.get("id", "")).startswith(wanted):
                        seen.append(marker["status"])
            if until in seen and not batch:
                return seen
    finally:
        consumer.close()
    raise AssertionError(f"no {until} of transaction {xid} within {timeout:.0f}s: {seen}")


def test_connect_kill_9_inside_a_large_transaction_applies_it_once(faults_stack: E2EStack,
                                                                   tmp_path: Path) -> None:
    stack = faults_stack
    sink_dsn = fresh_sink_database(stack, "sink_connect_killed")
    log = tmp_path / "run.log"
    args = run_args(stack, ORDERS, tmp_path, sink_dsn)
    wait_until_captured(stack.info)  # earlier tests' transactions are all published

    with streaming_run(log, *args) as run:
        # The job streams (it found the stack whole at its start) before the worker dies.
        wait_for_first_commit(tmp_path, run, log)
        big = BigTransaction(stack.info.pg_dsn_source, BIG_TRANSACTION_ORDERS)
        big.start()
        assert big.ready.wait(60) and big.xid is not None, big.error
        started = time.monotonic()
        before = markers_of(stack, big.xid)  # its BEGIN is out, data events follow
        kill_9(stack, "debezium")
        print(f"\n[e2e] Connect killed once the BEGIN of a {2 * BIG_TRANSACTION_ORDERS}-event "
              f"transaction was out ({time.monotonic() - started:.1f}s after it was written)")
        assert "END" not in markers_of(stack, big.xid, timeout=10), \
            "the transaction was fully published before the kill: make it larger"
        assert before == ["BEGIN"]
        xid = big.finish()
        resume(stack, "debezium")
        wait_for_end(stack.info, xid)
        wait_until_captured(stack.info)
        print(f"[e2e] markers of the large transaction after the restart: "
              f"{markers_of(stack, xid, until='END')}")
        stop_or_note_death(run, log)
    drain_and_verify(stack, log, args, tmp_path, sink_dsn)
