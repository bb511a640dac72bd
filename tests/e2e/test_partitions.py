"""End to end with table topics in 3 partitions: real Debezium spreads each table's records by
row key (Kafka Connect's default partitioner), ``txjoin_kafka`` reads every partition and
declares the topics partitioned, the core reads them by the partitioned rules.

A racing workload, a ``txjoin run`` that streams while Debezium is restarted mid-workload,
then a drain: both sinks must equal PostgreSQL's own answer, and the changelog must hold
every version of every order exactly once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.e2e.conftest import E2EStack, committed_after, restart_debezium, running_stack
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
from txjoin.stack.demo import wait_until_captured
from txjoin.verify.verify import verify_job

pytestmark = pytest.mark.e2e

PARTITIONS = 3


@pytest.fixture(scope="module")
def partitioned_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EStack]:
    with running_stack(tmp_path_factory.mktemp("e2e-partitioned-stack"), PARTITIONS) as stack:
        yield stack


def records_per_partition(bootstrap: str, topic: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "txjoin-e2e-partitions"})
    try:
        return [hi - lo for lo, hi in (consumer.get_watermark_offsets(
            TopicPartition(topic, p), timeout=10) for p in range(PARTITIONS))]
    finally:
        consumer.close()


def test_partitioned_table_topics_with_a_debezium_restart_match_postgresql(
        partitioned_stack: E2EStack, tmp_path: Path) -> None:
    stack = partitioned_stack
    sink_dsn = fresh_sink_database(stack, "sink_partitioned")
    log = tmp_path / "run.log"
    args = run_args(stack, ORDERS, tmp_path, sink_dsn)
    # The duration is a bound: the workload stops once some of it committed after Debezium
    # is back; it must outlast the run's start and first batch (a cold Spark) and the restart.
    workload = Workload(stack, rate=40, duration=300, seed=21)
    workload.start()

    with streaming_run(log, *args) as running:
        wait_for_first_commit(tmp_path, running, log)  # streaming (was: a 20 s sleep)
        restart_s = restart_debezium(stack.directory)
        print(f"\n[e2e] Debezium restarted in {restart_s:.1f}s")
        assert workload.is_alive(), "the workload ended before Debezium restarted"
        committed_after(stack.info.pg_dsn_source, 40)  # some of it lands after the restart
        result = workload.finish(early=True)
        wait_until_captured(stack.info)
        assert running.poll() is None, f"txjoin run died:\n{tail(log)}"
        os.killpg(running.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            running.wait(60)
    print(f"[e2e] workload: {result.transactions} tx, {result.events} events")

    orders = records_per_partition(stack.info.bootstrap_servers,
                                   f"{stack.info.topic_prefix}.public.orders")
    print(f"[e2e] orders topic records per partition: {orders}")
    assert sum(1 for n in orders if n) >= 2, "Debezium wrote the orders to one partition only"

    seconds = run_until_idle(log, *args)
    print(f"[e2e] drained with --until-idle in {seconds:.1f}s")
    assert_verified(verify_job(load_job(ORDERS), (stack.info.pg_dsn_source, sink_dsn),
                               tmp_path / "output"))
    assert_orders_changelogs(stack, tmp_path, sink_dsn)
