"""An incremental snapshot (Debezium's ``execute-snapshot``) of a looked-up table and of the
fact table, sent through the stack's signal table while writers change both, through the
real stack (PostgreSQL, Debezium, Kafka, Spark at 2 shards, both sinks), checked by
``verify``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg2
from confluent_kafka import Consumer, TopicPartition

from tests.e2e.conftest import E2EStack, committed_after
from tests.e2e.test_end_to_end import (
    ORDERS,
    Workload,
    assert_verified,
    fresh_sink_database,
    run_args,
    run_until_idle,
)
from txjoin.ingest.debezium import INCREMENTAL, table_topic
from txjoin.job import load_job
from txjoin.stack import debezium
from txjoin.stack.demo import wait_until_captured
from txjoin.stack.stack import StackInfo
from txjoin.verify.verify import verify_job

LOOKED_UP = "public.pizzas"  # repriced by the workload's writers
FACT = "public.orders"  # its rows of another shard reach each shard without their image


def window_closed(dsn: str, timeout: float = 120.0) -> None:
    """Wait until Debezium wrote the high watermark of a chunk of each table into the signal
    table (a table of a few hundred rows is one chunk): its rows are then emitted, behind
    the events before it."""
    deadline = time.monotonic() + timeout
    while True:
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT count(DISTINCT data::json->>'dataCollectionId') FROM "
                        f"{debezium.signal_table()} WHERE type = 'snapshot-window-close'")
            closed = cur.fetchone()[0]
        conn.close()
        if closed >= 2:
            return
        assert time.monotonic() < deadline, "Debezium wrote no high watermark"
        time.sleep(0.2)


def incremental_rows(info: StackInfo, table: str) -> list[dict]:
    """The incremental snapshot rows in ``table``'s topic."""
    topic = table_topic(info.topic_prefix, table)
    consumer = Consumer({"bootstrap.servers": info.bootstrap_servers,
                         "group.id": "txjoin-e2e-incremental", "enable.auto.commit": False})
    try:
        high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        consumer.assign([TopicPartition(topic, 0, 0)])
        rows, read = [], 0
        while read < high:
            for msg in consumer.consume(1000, 1.0):
                read = max(read, msg.offset() + 1)
                if msg.error() is None and msg.value() is not None:
                    doc = json.loads(msg.value())
                    if doc["source"]["snapshot"] == INCREMENTAL:
                        rows.append(doc["after"])
        return rows
    finally:
        consumer.close()


def test_an_incremental_snapshot_of_a_looked_up_and_the_fact_table_while_writers_change_them(
        e2e_stack: E2EStack, tmp_path: Path) -> None:
    info = e2e_stack.info
    sink_dsn = fresh_sink_database(e2e_stack, "sink_incremental")
    before = {t: len(incremental_rows(info, t)) for t in (LOOKED_UP, FACT)}
    workload = Workload(e2e_stack, rate=40, duration=12, seed=67)
    workload.start()
    committed_after(info.pg_dsn_source, 40)
    with psycopg2.connect(info.pg_dsn_source) as conn, conn.cursor() as cur:
        cur.execute(debezium.execute_snapshot_sql([LOOKED_UP, FACT]))
    conn.close()
    window_closed(info.pg_dsn_source)
    result = workload.finish()
    wait_until_captured(info)
    rows = {t: len(incremental_rows(info, t)) - before[t] for t in before}
    repriced = result.transactions_by_kind.get("price_change", 0)
    print(f"\n[e2e] {result.transactions} tx, {repriced} repricings; incremental rows {rows}")
    assert all(rows.values()), f"Debezium sent no incremental snapshot row of some: {rows}"

    seconds = run_until_idle(tmp_path / "run.log",
                             *run_args(e2e_stack, ORDERS, tmp_path, sink_dsn), "--shards", "2")
    print(f"[e2e] txjoin run --until-idle {ORDERS.name}: {seconds:.1f}s")
    assert_verified(verify_job(load_job(ORDERS), (info.pg_dsn_source, sink_dsn),
                               tmp_path / "output"))
