"""The local stack for real: PostgreSQL -> Debezium (Kafka Connect) -> Kafka, plus its configs.

One stack serves the module (starting it costs ~10 s). Timings are printed (run with -s),
never asserted: the machine is shared with Spark jobs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition

from tests.fixtures import broker as broker_fixture
from txjoin.errors import ConfigError, ServiceError
from txjoin.procfs import STAT_STATE, stat_fields
from txjoin.stack import broker, debezium, down, load_stack, status, up
from txjoin.stack.generate import generate
from txjoin.stack.stack import STATE_FILE, StackInfo

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = tmp_path_factory.mktemp("stack")
    started = time.monotonic()
    result = up(directory)
    print(f"\n[stack] up in {time.monotonic() - started:.1f}s")
    yield directory, result.info
    down(directory, wipe=True)


def consume_all(info: StackInfo, until: Any, timeout: float = 180.0) -> dict[str, list[Any]]:
    """Every topic of the stack, read from the start until ``until(seen)``."""
    return broker_fixture.consume_all(info.bootstrap_servers, info.topics, until, timeout)


def high_watermarks(info: StackInfo) -> dict[str, int]:
    """Each topic's high watermark (what the broker says a consumer can read)."""
    consumer = Consumer({"bootstrap.servers": info.bootstrap_servers, "group.id": "marks"})
    try:
        return {t: consumer.get_watermark_offsets(TopicPartition(t, 0), timeout=10)[1]
                for t in info.topics}
    finally:
        consumer.close()


def settled_high_watermarks(info: StackInfo,
                            quiet_s: float = 3 * debezium.OFFSET_FLUSH_INTERVAL_MS / 1000,
                            timeout: float = 120.0) -> dict[str, int]:
    """The high watermarks once Debezium has stopped sending: unchanged for ``quiet_s``.

    An earlier test's backlog (or Debezium re-sending after a kill -9 from its last flushed
    offset) may still be streaming; ``quiet_s`` is longer than the worker's offset flush
    interval, so a settled stream also has its offsets flushed.
    """
    deadline = time.monotonic() + timeout
    marks = high_watermarks(info)
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < quiet_s:
        assert time.monotonic() < deadline, f"topics still growing after {timeout:.0f}s: {marks}"
        time.sleep(0.5)
        now = high_watermarks(info)
        if now != marks:
            marks, quiet_since = now, time.monotonic()
    return marks


def data_events(seen: dict[str, list[Any]], info: StackInfo) -> int:
    """Streaming data events read so far (not snapshot rows, markers or tombstones)."""
    return sum(1 for topic, events in seen.items() if topic != info.transaction_topic
               for e in events if e is not None and e["op"] != "r")


def ends(seen: dict[str, list[Any]], info: StackInfo) -> list[dict[str, Any]]:
    return [e for e in seen.get(info.transaction_topic, []) if e["status"] == "END"]


def test_up_reports_every_component_healthy(stack: Any) -> None:
    directory, info = stack
    components = {c.name: c for c in status(directory)}
    assert set(components) == {"postgres", "broker", "debezium"}
    assert all(c.running for c in components.values())
    assert components["debezium"].health == "task RUNNING, streaming"
    assert load_stack(directory) == info
    assert info.topic_prefix == "shop"
    assert info.pg_dsn_source.endswith("/shop") and info.pg_dsn_sink.endswith("/sink")


def test_up_twice_is_harmless(stack: Any) -> None:
    directory, info = stack
    pids = [c.pid for c in status(directory)]
    again = up(directory)
    assert again.already_running and again.info == info
    assert [c.pid for c in status(directory)] == pids


def test_every_topic_has_one_partition_and_orders_expected_is_not_captured(stack: Any) -> None:
    _, info = stack
    consumer = Consumer({"bootstrap.servers": info.bootstrap_servers, "group.id": "meta"})
    try:
        topics = consumer.list_topics(timeout=10).topics
    finally:
        consumer.close()
    for topic in info.topics:
        assert len(topics[topic].partitions) == 1, topic
    assert "shop.public.orders_expected" not in topics
    assert "public.orders_expected" not in info.tables


def test_workload_arrives_as_whole_debezium_transactions(stack: Any) -> None:
    _, info = stack
    result = generate(info.pg_dsn_source, rate_tx_per_s=150, duration_s=3, seed=7, writers=2)
    assert result.transactions > 0 and result.orders_recorded > 0
    started = time.monotonic()
    # Every END, and every data event: a transaction's END can be read before its
    # events on the table topics (Debezium's producer sends to the topics independently).
    seen = consume_all(info, lambda s: len(ends(s, info)) >= result.transactions
                       and data_events(s, info) >= result.events)
    print(f"\n[stack] {result.transactions} tx / {result.events} events generated in "
          f"{result.seconds:.1f}s, all delivered {time.monotonic() - started:.1f}s later")

    # Snapshot rows (the seed menu) come first, without transaction metadata.
    pizzas = [e for e in seen["shop.public.pizzas"] if e is not None]
    snapshot = [e for e in pizzas if e["op"] == "r"]
    assert len(snapshot) == 4 and all(e["transaction"] is None for e in snapshot)
    # decimal.handling.mode=string: exact decimals as strings.
    assert all(isinstance(e["after"]["price"], str) for e in pizzas if e["after"])
    assert {e["after"]["price"] for e in snapshot} >= {"8.50", "7.00"}

    data_by_xid: dict[str, Counter[str]] = defaultdict(Counter)
    for topic, events in seen.items():
        if topic == info.transaction_topic:
            continue
        for event in events:
            if event is None or event["op"] == "r":
                continue  # tombstone after a delete, or snapshot
            tx = event["transaction"]
            assert tx is not None, event
            xid = tx["id"].split(":")[0]
            assert xid == str(event["source"]["txId"])
            assert event["source"]["table"] != "orders_expected"
            data_by_xid[xid][f"{event['source']['schema']}.{event['source']['table']}"] += 1

    statuses: dict[str, list[str]] = defaultdict(list)
    for marker in seen[info.transaction_topic]:
        statuses[marker["id"].split(":")[0]].append(marker["status"])
    assert all(s == ["BEGIN", "END"] for s in statuses.values())
    for end in ends(seen, info):
        xid = end["id"].split(":")[0]
        per_table = {d["data_collection"]: d["event_count"] for d in end["data_collections"]}
        assert per_table == dict(data_by_xid[xid]), xid
        assert end["event_count"] == sum(per_table.values())
    assert set(data_by_xid) == {xid for xid in statuses}
    assert len(statuses) == result.transactions
    delivered = Counter[str]()
    for per_table in data_by_xid.values():
        delivered.update(per_table)
    assert delivered == result.events_by_table

    # Every record the broker holds was read: nothing hides behind the high watermark.
    assert high_watermarks(info) == {t: len(seen.get(t, [])) for t in info.topics}

    # The oracle table is written in the same transactions, but only the source sees it.
    with psycopg2.connect(info.pg_dsn_source) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*), count(DISTINCT xid) FROM public.orders_expected")
        rows, xids = cur.fetchone()
    conn.close()
    assert rows > 0 and xids > 0


def test_orders_expected_keeps_order_duplicates_and_the_price_it_was_placed_at(
        stack: Any) -> None:
    _, info = stack
    conn = psycopg2.connect(info.pg_dsn_source)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("INSERT INTO public.table_assignment (client_id, table_id, time_in) "
                        "VALUES (1, 1, now()) RETURNING id")
            (assignment,) = cur.fetchone()
            # 99 is not on the menu: the inner join drops that element only.
            cur.execute("INSERT INTO public.orders (table_assignment_id, order_time, pizzas) "
                        "VALUES (%s, now(), '{2,99,1,2}') RETURNING id", (assignment,))
            (order_id,) = cur.fetchone()
            cur.execute("SELECT public.record_order_expected(%s)", (order_id,))
        with conn, conn.cursor() as cur:
            cur.execute("SELECT name, price::text FROM public.pizzas "
                        "WHERE id IN (1, 2) ORDER BY id")
            (first, first_price), (second, second_price) = cur.fetchall()
            cur.execute("UPDATE public.pizzas SET price = price + 1 WHERE id = 2")
        with conn, conn.cursor() as cur:
            cur.execute("SELECT client_name, pizzas::text, present FROM public.orders_expected "
                        "WHERE order_id = %s", (order_id,))
            client, pizzas, present = cur.fetchone()
        assert present and client.startswith("April")  # the workload may rename clients
        assert json.loads(pizzas, parse_float=str) == [
            {"pizza": second, "price": second_price}, {"pizza": first, "price": first_price},
            {"pizza": second, "price": second_price}]
        with conn, conn.cursor() as cur:
            cur.execute("UPDATE public.orders SET pizzas = '{99}' WHERE id = %s", (order_id,))
            cur.execute("SELECT public.record_order_expected(%s)", (order_id,))
            cur.execute("SELECT present, pizzas FROM public.orders_expected WHERE order_id = %s",
                        (order_id,))
            assert cur.fetchone() == (False, None)
    finally:
        conn.close()


def test_debezium_throughput_is_reported(stack: Any) -> None:
    """Not a limit, a number: one bulk transaction and a fast pizzeria run."""
    _, info = stack
    rows = 20_000
    with psycopg2.connect(info.pg_dsn_source) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO public.users (full_name) "
                    "SELECT 'bulk ' || g FROM generate_series(1, %s) g", (rows,))
    conn.close()
    started = time.monotonic()
    seen = consume_all(info, lambda s: any(e["event_count"] == rows for e in ends(s, info)))
    bulk_s = time.monotonic() - started
    # The bulk is one transaction whose END counts all its rows, in its one table.
    bulk = [e for e in ends(seen, info) if e["event_count"] == rows]
    assert bulk and all(e["data_collections"] == [
        {"data_collection": "public.users", "event_count": rows}] for e in bulk), bulk
    ends_before = len(ends(seen, info))

    result = generate(info.pg_dsn_source, rate_tx_per_s=5_000, duration_s=5, seed=3, writers=2)
    total_ends = ends_before + result.transactions
    seen = consume_all(info, lambda s: len(ends(s, info)) >= total_ends)
    flow_s = time.monotonic() - started - bulk_s
    assert len(ends(seen, info)) >= total_ends and result.transactions > 0
    print(f"\n[stack] bulk: {rows} events in {bulk_s:.1f}s = {rows / bulk_s:.0f} ev/s; "
          f"workload: {result.transactions} tx ({result.transactions / result.seconds:.0f} tx/s), "
          f"{result.events} events, delivered {flow_s:.1f}s after the bulk "
          f"= {result.events / flow_s:.0f} ev/s")


def test_connector_settings_the_worker_refuses_are_a_clear_error(stack: Any,
                                                                tmp_path: Path) -> None:
    """A second worker, on the stack's broker and database, handed an invalid setting: the
    worker's HTTP 400 becomes one line naming the setting (not a timeout of `up`)."""
    directory, info = stack
    state = json.loads((directory / STATE_FILE).read_text())
    work = tmp_path / "connect-refused"
    worker = debezium.start_debezium(
        work, info.bootstrap_servers, state["postgres"]["port"], "postgres", "postgres",
        tmp_path / "refused.log", overrides={"name": "txjoin-refused", "snapshot.mode": "bogus",
                                             "slot.name": "txjoin_refused"},
        cluster=debezium.cluster_name("refused"))
    try:
        deadline = time.monotonic() + 120
        with pytest.raises(ConfigError) as refused:
            while not debezium.register(worker.rest_url, worker.connector, work):
                assert time.monotonic() < deadline, "the worker never answered the settings"
                time.sleep(0.25)
    finally:
        debezium.stop_debezium(worker.process)
    message = str(refused.value)
    assert message.startswith("Kafka Connect refused the connector settings "
                              "(debezium-postgres.properties, rendered to ")
    assert "The 'snapshot.mode' value is invalid: Value must be one of" in message
    assert "\n" not in message and "You can also find" not in message
    assert message.endswith("; fix them and run `txjoin up` again")


def test_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ServiceError, match=f"port {port} .* busy"):
            up(tmp_path / "busy", pg_port=port)
    assert not (tmp_path / "busy" / STATE_FILE).exists()


def test_missing_java_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker.shutil, "which", lambda name: None)
    with pytest.raises(ServiceError, match="java not found"):
        up(tmp_path / "nojava")
    assert not (tmp_path / "nojava" / STATE_FILE).exists()


def test_cli_reports_errors_without_a_traceback(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from txjoin.stack import commands

    result = CliRunner().invoke(commands.generate, ["--dir", str(tmp_path / "none")])
    assert result.exit_code == 2 and "no running stack" in result.output
    result = CliRunner().invoke(commands.status, ["--dir", str(tmp_path / "none")])
    assert result.exit_code == 0 and "no stack" in result.output


def test_stale_directory_is_a_clear_error(tmp_path: Path) -> None:
    directory = tmp_path / "stale"
    directory.mkdir()
    dead = {"pid": 999_999_999, "start_ticks": 1}
    (directory / STATE_FILE).write_text(json.dumps({
        "stopped": False, "pg_dsn_source": "x", "pg_dsn_sink": "x", "bootstrap_servers": "x",
        "topic_prefix": "shop", "tables": [], "postgres": dead, "broker": dead, "debezium": dead,
    }))
    assert load_stack(directory) is None
    with pytest.raises(ServiceError, match="stale stack"):
        up(directory)
    assert down(directory, wipe=True) == []
    assert not directory.exists()


def test_up_after_kill_9_starts_the_dead_again_on_the_same_ports_and_data(stack: Any) -> None:
    directory, info = stack
    before = {c.name: c for c in status(directory)}
    marks = high_watermarks(info)
    for name in ("broker", "debezium"):
        os.kill(before[name].pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(c.running for c in status(directory) if c.name != "postgres"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert load_stack(directory) is None
    assert {c.name: c.health for c in status(directory)}["broker"].startswith("DEAD")

    started = time.monotonic()
    again = up(directory)
    print(f"\n[stack] broker and Connect back after kill -9 in {time.monotonic() - started:.1f}s")
    assert again.resumed and not again.already_running and again.info == info
    after = {c.name: c for c in status(directory)}
    assert after["postgres"].pid == before["postgres"].pid  # left alone: it was running
    assert {n: c.port for n, c in after.items()} == {n: c.port for n, c in before.items()}
    assert after["debezium"].health == "task RUNNING, streaming"
    assert all(high_watermarks(info)[t] >= marks[t] for t in info.topics)  # topics kept


def test_down_stops_every_pid_and_up_resumes_on_the_data(stack: Any) -> None:
    directory, info = stack
    pids = [c.pid for c in status(directory)]
    marks = settled_high_watermarks(info)
    assert sorted(down(directory)) == ["broker", "debezium", "postgres"]
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), pid
    assert load_stack(directory) is None
    assert all(not c.running for c in status(directory))
    assert down(directory) == []

    again = up(directory)
    assert again.resumed and again.info == info
    assert settled_high_watermarks(info) == marks  # nothing lost, resent or snapshotted again
    assert sorted(down(directory)) == ["broker", "debezium", "postgres"]


def _zombie(pid: int) -> bool:
    fields = stat_fields(pid)
    assert fields is not None, f"process {pid} is gone, not a zombie"
    return fields[STAT_STATE] == "Z"


# -- configuration shared with docker-compose ---------------------------------------------


def test_connector_json_is_the_properties_file_rendered_for_compose() -> None:
    rendered = debezium.connector_config(debezium.COMPOSE_VALUES)
    assert json.loads((REPO / "config" / "debezium-postgres.json").read_text()) == rendered
    assert rendered["plugin.name"] == "pgoutput"
    assert rendered["provide.transaction.metadata"] == "true"
    assert rendered["decimal.handling.mode"] == "string"
    assert rendered["value.converter.schemas.enable"] == "false"
    assert "orders_expected" not in rendered["table.include.list"]


def test_compose_parses_and_registers_the_shared_connector_config() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "kafka", "connect", "txjoin"} <= set(services)
    text = (REPO / "docker-compose.yaml").read_text()
    assert "config/debezium-postgres.json" in text
    assert "txjoin/stack/schema.sql" in text
    assert "wal_level=logical" in text
