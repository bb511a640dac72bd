"""``txjoin generate --bulk N`` on the real stack: every row change it reports arrives in
Kafka, grouped into the transactions it reports, and the oracle bookkeeping is kept.

The topics are read independently of the command's own capture watch, from the offsets
they had before the run. Timings are printed (run with -s), never asserted.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, TopicPartition

from tests.e2e.conftest import E2EStack
from txjoin.stack import commands
from txjoin.stack.stack import StackInfo

pytestmark = pytest.mark.e2e

ROWS = 2_000


def _ends(info: StackInfo) -> dict[str, int]:
    """Each topic's end offset (one partition each on the shared stack)."""
    consumer = Consumer({"bootstrap.servers": info.bootstrap_servers, "group.id": "bulk-marks"})
    try:
        return {t: consumer.get_watermark_offsets(TopicPartition(t, 0), timeout=10,
                                                  cached=False)[1] for t in info.topics}
    finally:
        consumer.close()


def _read_from(info: StackInfo, start: dict[str, int], transactions: int, events: int,
               timeout: float = 60.0) -> dict[str, list[Any]]:
    """Read every topic from ``start`` until ``transactions`` ENDs and ``events`` data events
    are in (or the timeout, which leaves the counts short for the assertions to show)."""
    consumer = Consumer({"bootstrap.servers": info.bootstrap_servers, "group.id": "bulk-read",
                         "enable.auto.commit": False, "enable.partition.eof": False})
    consumer.assign([TopicPartition(t, 0, offset) for t, offset in start.items()])
    seen: dict[str, list[Any]] = defaultdict(list)
    ends = data = 0
    deadline = time.monotonic() + timeout
    try:
        while (ends < transactions or data < events) and time.monotonic() < deadline:
            for msg in consumer.consume(1_000, 0.5):
                assert msg.error() is None, msg.error()
                value = None if msg.value() is None else json.loads(msg.value())
                seen[msg.topic()].append(value)
                if msg.topic() == info.transaction_topic:
                    ends += value["status"] == "END"
                elif value is not None and value["op"] != "r":
                    data += 1
        # Anything beyond the counts would be an event the report left out.
        for msg in consumer.consume(1_000, 2.0):
            seen[msg.topic()].append(None if msg.value() is None else json.loads(msg.value()))
    finally:
        consumer.close()
    return seen


def test_bulk_report_counts_exactly_the_transactions_and_rows_that_reach_kafka(
        e2e_stack: E2EStack) -> None:
    info = e2e_stack.info
    start = _ends(info)
    outcome = CliRunner().invoke(commands.generate, [
        "--dir", str(e2e_stack.directory), "--bulk", str(ROWS), "--seed", "11", "--json"])
    assert outcome.exit_code == 0, outcome.output
    report = json.loads(outcome.output)
    print(f"\n[bulk] {report}")
    assert report["rows"] >= ROWS
    assert sum(report["rows_by_table"].values()) == report["rows"]
    assert report["orders_recorded"] > 0
    assert report["events_captured"] == report["rows"]
    assert report["transactions_captured"] == report["transactions"]
    assert report["capture_seconds"] > 0
    assert report["capture_events_per_s"] == pytest.approx(
        report["rows"] / report["capture_seconds"], rel=0.01)

    seen = _read_from(info, start, report["transactions"], report["rows"])

    # Whole transactions: each END announces exactly the data events carrying its xid.
    data_by_xid: dict[int, Counter[str]] = defaultdict(Counter)
    last_change: dict[int, tuple[int, bool]] = {}  # order id -> (xid, exists afterwards)
    for topic, events in seen.items():
        if topic == info.transaction_topic:
            continue
        for event in events:
            if event is None or event["op"] == "r":
                continue  # a delete's tombstone, or the stack's initial snapshot
            source = event["source"]
            data_by_xid[int(source["txId"])][f"{source['schema']}.{source['table']}"] += 1
            if source["table"] == "orders":
                row = event["after"] or event["before"]
                last_change[row["id"]] = (int(source["txId"]), event["after"] is not None)
    ends = {int(e["id"].split(":")[0]): e for e in seen[info.transaction_topic]
            if e["status"] == "END"}
    assert len(ends) == report["transactions"]
    assert set(data_by_xid) == set(ends)
    for xid, end in ends.items():
        per_table = {d["data_collection"]: d["event_count"] for d in end["data_collections"]}
        assert per_table == dict(data_by_xid[xid]), xid
    delivered = Counter[str]()
    for per_table in data_by_xid.values():
        delivered.update(per_table)
    assert dict(delivered) == report["rows_by_table"]

    # The oracle: the last transaction that changed an order also recorded it, last.
    with psycopg2.connect(info.pg_dsn_source) as conn, conn.cursor() as cur:
        cur.execute("SELECT order_id, xid, present FROM public.orders_expected "
                    "WHERE order_id = ANY(%s)", (list(last_change),))
        recorded = {order: (xid, present) for order, xid, present in cur.fetchall()}
    conn.close()
    assert {o: xid for o, (xid, _) in recorded.items()} == {
        o: xid for o, (xid, _) in last_change.items()}
    deleted = {o for o, (_, exists) in last_change.items() if not exists}
    assert deleted and all(not recorded[o][1] for o in deleted)


def test_json_without_bulk_is_a_usage_error(tmp_path: Path) -> None:
    outcome = CliRunner().invoke(commands.generate, ["--dir", str(tmp_path), "--json"])
    assert outcome.exit_code == 2 and "--json needs --bulk" in outcome.output
