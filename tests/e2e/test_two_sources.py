"""Seed 000 over two source databases, on the real stack (`txjoin up --job`).

Two logical databases in the one PostgreSQL cluster, one Debezium connector each (own
slot, publication, topic prefix and one-partition transaction topic), racing writers on
both. What the stack guarantees is checked now: each connector delivers its own
database's transactions whole, in that database's commit order, to its own topics; and
the full pipeline (`txjoin run` of jobs/users_colors_two_dbs.py, then `txjoin verify`: 0
mismatches and no per-source prefix violation).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer

from tests.e2e.conftest import E2EStack
from tests.e2e.test_end_to_end import (
    RUN_TIMEOUT_S,
    fresh_sink_database,
    run_until_idle,
    streaming_run,
    tail,
)
from tests.fixtures.broker import consume_all
from txjoin.cli import main
from txjoin.job import load_job
from txjoin.stack import down, status, up
from txjoin.stack.generate_sources import TwoSourceResult, generate_two_sources
from txjoin.stack.stack import SourceInfo, StackInfo, job_sources
from txjoin.verify.source_tables import COMMIT_LOG
from txjoin.verify.verify import VerifyResult, _states_after_each, read_history, verify_job

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TWO_DBS = REPO / "jobs" / "users_colors_two_dbs.py"
MASTER = "local[2]"
JOB = load_job(TWO_DBS)


@pytest.fixture(scope="module")
def two_db_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, StackInfo]]:
    directory = tmp_path_factory.mktemp("two-db-stack")
    started = time.monotonic()
    result = up(directory, sources=job_sources(load_job(TWO_DBS)))
    print(f"\n[two-db] stack up in {time.monotonic() - started:.1f}s")
    try:
        yield directory, result.info
    finally:
        down(directory, wipe=True)


def table_rows(source: SourceInfo, table: str) -> list[dict[str, Any]]:
    with psycopg2.connect(source.dsn) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT to_jsonb(t) FROM {table} t ORDER BY id")
        rows = [r[0] for r in cur.fetchall()]
    conn.close()
    return rows


def commit_log(source: SourceInfo) -> list[int]:
    """The source's generated transactions' xids in commit order (those Debezium publishes:
    pgoutput skips a transaction that changed no captured row)."""
    with psycopg2.connect(source.dsn) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT xid FROM {COMMIT_LOG} WHERE events > 0 ORDER BY seq")
        xids = [int(r[0]) for r in cur.fetchall()]
    conn.close()
    return xids


def read_source_topics(info: StackInfo, source: SourceInfo, ends_wanted: int,
                       timeout: float = 180.0) -> dict[str, list[Any]]:
    """Every record of one source's topics, read until its transaction topic holds
    ``ends_wanted`` END markers."""
    def ends(seen: dict[str, list[Any]]) -> int:
        return sum(1 for e in seen[source.transaction_topic] if e and e["status"] == "END")

    def data_behind(seen: dict[str, list[Any]]) -> bool:
        # The topics are read side by side: an END can arrive before its data events.
        announced: Counter[str] = Counter()
        for end in seen[source.transaction_topic]:
            for collection in (end or {}).get("data_collections") or []:
                announced[collection["data_collection"]] += collection["event_count"]
        return any(sum(1 for e in seen[f"{source.prefix}.{table}"] if e is not None) < count
                   for table, count in announced.items())

    def published(seen: dict[str, list[Any]]) -> bool:  # seen: a defaultdict(list)
        return ends(seen) >= ends_wanted and not data_behind(seen)

    return consume_all(info.bootstrap_servers, source.topics, published, timeout)


def test_each_source_has_its_own_connector_slot_and_one_partition_topics(
        two_db_stack: tuple[Path, StackInfo]) -> None:
    directory, info = two_db_stack
    assert [s.prefix for s in info.sources] == ["users_db", "colors_db"]
    components = {c.name: c for c in status(directory)}
    assert set(components) == {"postgres", "broker", "debezium:users_db", "debezium:colors_db"}
    assert all(c.running for c in components.values())
    for source in info.sources:
        assert components[f"debezium:{source.prefix}"].health == "task RUNNING, streaming"
        with psycopg2.connect(source.dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT slot_name, active FROM pg_replication_slots "
                        "WHERE database = current_database()")
            assert cur.fetchall() == [(f"txjoin_{source.prefix}", True)]
        conn.close()
    consumer = Consumer({"bootstrap.servers": info.bootstrap_servers, "group.id": "meta"})
    try:
        topics = consumer.list_topics(timeout=10).topics
    finally:
        consumer.close()
    for topic in info.topics:
        assert len(topics[topic].partitions) == 1, topic
    assert info.topics == ("users_db.public.users", "users_db.transaction",
                           "colors_db.public.users_favorite_color", "colors_db.transaction")
    # Asking the running stack for other sources is refused, not silently ignored.
    with pytest.raises(Exception, match="has source databases"):
        up(directory)


def test_racing_writers_arrive_whole_and_in_each_sources_commit_order(
        two_db_stack: tuple[Path, StackInfo]) -> None:
    _, info = two_db_stack
    result = generate_two_sources(info.source("users").dsn, info.source("colors").dsn,
                                  rate_tx_per_s=40, duration_s=6, seed=3, writers=2)
    print(f"[two-db] {result.users.transactions} users tx, {result.colors.transactions} "
          f"colours tx")
    for source, produced in ((info.source("users"), result.users),
                             (info.source("colors"), result.colors)):
        log = commit_log(source)
        assert produced.transactions >= len(log) > 0
        seen = read_source_topics(info, source, len(log))
        ends = [e for e in seen[source.transaction_topic] if e and e["status"] == "END"]
        # Commit order: the END markers' order is the writers' commit order.
        end_xids = [int(e["id"].split(":")[0]) for e in ends]
        generated = set(log)
        assert [x for x in end_xids if x in generated] == log, source.prefix
        # Whole transactions: each END's per-table counts are the data events with its xid.
        events: Counter[tuple[int, str]] = Counter()
        for topic in source.topics[:-1]:
            for event in seen[topic]:
                if event is not None and event["source"].get("txId") is not None \
                        and event["op"] != "r":
                    events[(int(event["source"]["txId"]), topic.split(".", 1)[1])] += 1
        for end in ends:
            xid = int(end["id"].split(":")[0])
            for collection in end["data_collections"] or []:
                assert events[(xid, collection["data_collection"])] == \
                    collection["event_count"], (source.prefix, xid, collection)
        # Each connector sees only its own database.
        assert sum(events.values()) == produced.events, source.prefix
        # The change log verify replays rebuilds exactly the database's current state.
        history = read_history(source.dsn)
        assert history is not None
        final = _states_after_each(JOB, history)[-1]
        for table in JOB.tables:
            if table.source == source.name:
                assert sorted(final.get(table.name, []), key=lambda r: r["id"]) == \
                    table_rows(source, table.name), (source.prefix, table.name)


def test_verify_reads_each_source_database_and_fails_before_any_run(
        two_db_stack: tuple[Path, StackInfo], tmp_path: Path) -> None:
    directory, info = two_db_stack
    with psycopg2.connect(info.source("users").dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM public.users")
        (users,) = cur.fetchone()
    conn.close()
    assert users > 0, "run after the workload test"
    cli = CliRunner().invoke(main, ["verify", str(TWO_DBS), "--dir", str(directory),
                                    "--no-postgres", "--output-dir", str(tmp_path / "none")])
    print(cli.output)
    assert cli.exit_code == 1, cli.output
    assert (f"vs the job's query on a copy of users's database and colors's database (one "
            f"snapshot each): {users} expected rows") in cli.output
    assert "checked by: rows: PostgreSQL: the job's query on a copy of" in cli.output
    assert f"missing ({users})" in cli.output
    assert "no Delta table" in cli.output

    wrong = CliRunner().invoke(main, ["verify", str(TWO_DBS), "--dir", str(directory),
                                      "--no-postgres", "--source-dsn", info.pg_dsn_source])
    assert wrong.exit_code == 2
    assert "has sources ['colors', 'users']; give NAME=DSN for each" in wrong.output


def assert_two_db_verified(result: VerifyResult) -> None:
    print(f"[two-db] {result.format(10)}")
    assert {s.sink for s in result.sinks} == {"delta", "postgres"}
    assert result.expected > 0
    assert result.ok, result.format(10)
    # PostgreSQL answered the final rows, and the state check ran (not skipped with a note).
    referees = dict(result.referees)
    assert referees["rows"].startswith("PostgreSQL: the job's query on a copy of"), referees
    assert result.note is None, result.note
    assert referees["every state"].startswith("txjoin's own oracle"), referees


class Writers(threading.Thread):
    """Both databases' racing writers in a thread; ``result`` once joined."""

    def __init__(self, info: StackInfo, duration: float, seed: int) -> None:
        super().__init__(name="two-db-writers", daemon=True)
        self.info, self.duration, self.seed = info, duration, seed
        self.result: TwoSourceResult | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = generate_two_sources(
                self.info.source("users").dsn, self.info.source("colors").dsn,
                rate_tx_per_s=15, duration_s=self.duration, seed=self.seed, writers=2)
        except BaseException as exc:
            self.error = exc


def test_two_db_job_matches_both_databases_while_and_after_racing_writers(
        two_db_stack: tuple[Path, StackInfo], tmp_path: Path) -> None:
    directory, info = two_db_stack
    sink_dsn = fresh_sink_database(E2EStack(directory, info), "sink_two_dbs")
    args = [str(TWO_DBS), "--dir", str(directory), "--master", MASTER,
            "--checkpoint-dir", str(tmp_path / "checkpoints"),
            "--output-dir", str(tmp_path / "output"), "--postgres-dsn", sink_dsn]
    log = tmp_path / "run.log"
    # Small enough for verify's replay of every observable state (it evaluates the job
    # once per _commit_seq).
    writers = Writers(info, duration=15, seed=5)
    # Streaming while both databases are written; then drained after they stop. The
    # streaming run must release some of the racing transactions before it is stopped:
    # else that part checks nothing (under load its JVM was still starting when the 15 s
    # of writes ended, and the run was killed before its first batch).
    streamed_from = log.stat().st_size if log.exists() else 0
    with streaming_run(log, *args) as proc:
        writers.start()
        writers.join()
        assert writers.error is None, writers.error
        wait_for_released_batch(log, proc, since=streamed_from)
        assert proc.poll() is None, f"txjoin run died:\n{tail(log)}"
    seconds = run_until_idle(log, *args)
    print(f"[two-db] txjoin run --until-idle: {seconds:.1f}s")
    assert_two_db_verified(verify_job(load_job(TWO_DBS), (info.pg_dsn_source, sink_dsn),
                                      tmp_path / "output",
                                      {s.name: s.dsn for s in info.sources}))

    # The command a user runs says the same (its state replay is verify_job's, just done).
    cli = CliRunner().invoke(main, ["verify", str(TWO_DBS), "--dir", str(directory),
                                    "--postgres-dsn", sink_dsn, "--no-state-check",
                                    "--output-dir", str(tmp_path / "output")])
    assert cli.exit_code == 0, cli.output
    assert "verify: OK" in cli.output

    # An idle source never holds the other back: only users change now, and the sinks
    # still converge to the job on both final states.
    users_only = generate_two_sources(info.source("users").dsn, info.source("colors").dsn,
                                      rate_tx_per_s=15, duration_s=5, seed=6, only="users")
    assert users_only.colors.transactions == 0 < users_only.users.transactions
    run_until_idle(log, *args)
    assert_two_db_verified(verify_job(load_job(TWO_DBS), (info.pg_dsn_source, sink_dsn),
                                      tmp_path / "output",
                                      {s.name: s.dsn for s in info.sources}))


BATCH_LINE = re.compile(rb"^batch \d+: \d+ records, (\d+) transactions released", re.M)


def wait_for_released_batch(log: Path, proc: Any, since: int) -> None:
    """Wait until the streaming run ``proc`` printed, after byte ``since`` of ``log``, a
    batch line that released transactions."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not any(int(m.group(1)) > 0
                  for m in BATCH_LINE.finditer(log.read_bytes()[since:])):
        assert proc.poll() is None, f"txjoin run died:\n{tail(log)}"
        assert time.monotonic() < deadline, f"no such batch yet:\n{tail(log)}"
        time.sleep(0.5)


def plain_sql_transactions(dsn: str, statements: Any, writers: int = 4, each: int = 15,
                           seed: int = 0) -> list[int]:
    """``writers`` connections committing ``each`` transactions of the user's own SQL at once
    (no advisory lock, no commit log of their own: what an application does); their xids.
    ``statements(rng, cur)`` runs one transaction's statements."""
    import random

    xids: list[int] = []
    errors: list[BaseException] = []

    def write(index: int) -> None:
        rng = random.Random(seed * 100 + index)
        try:
            with contextlib.closing(psycopg2.connect(dsn)) as conn:
                for _ in range(each):
                    with conn, conn.cursor() as cur:
                        statements(rng, cur)
                        cur.execute("SELECT pg_current_xact_id()::text::bigint")
                        xids.append(int(cur.fetchone()[0]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]
    return xids


def test_verify_checks_every_state_of_transactions_it_did_not_write(
        two_db_stack: tuple[Path, StackInfo], tmp_path: Path) -> None:
    """The user's own concurrent SQL on an `up --job` database (issue 21 item 4): the
    database records its commit order itself, in the order Debezium publishes it, so verify
    replays every state of the sink against it and finds the run right. The user also adds
    a double precision and a real column to the colours, and the job picks the colour of
    least weight (nullable, repeated): PostgreSQL's answer and the state replay agree."""
    directory, info = two_db_stack
    users, colors = info.source("users"), info.source("colors")

    def user_tx(rng: Any, cur: Any) -> None:
        cur.execute("INSERT INTO public.users (full_name) VALUES (%s) RETURNING id",
                    (f"plain {rng.randrange(10_000)}",))
        cur.execute("UPDATE public.users SET full_name = full_name || '!' WHERE id = %s",
                    (rng.randint(1, cur.fetchone()[0]),))

    def colour_tx(rng: Any, cur: Any) -> None:
        for _ in range(rng.randint(1, 3)):
            cur.execute("INSERT INTO public.users_favorite_color (user_id, favorite_color, "
                        "weight, ratio) VALUES (%s, %s, %s, %s)",
                        (rng.randint(1, 40), rng.choice(["red", "blue"]),
                         rng.choice(WEIGHTS), rng.choice([None, 0.1, 0.5, 3.14])))
        if rng.random() < 0.3:
            cur.execute("UPDATE public.users_favorite_color SET weight = %s WHERE id = "
                        "(SELECT max(id) FROM public.users_favorite_color)",
                        (rng.choice(WEIGHTS),))

    # The user adds columns to the looked-up table (issue 33: a double precision and a real
    # verify must read back from the change log; issue 38.3: the job picks each user's colour
    # of least weight, a nullable column with repeats, as PostgreSQL does).
    with contextlib.closing(psycopg2.connect(colors.dsn)) as conn, conn, conn.cursor() as cur:
        cur.execute("ALTER TABLE public.users_favorite_color ADD COLUMN IF NOT EXISTS weight "
                    "double precision, ADD COLUMN IF NOT EXISTS ratio real")

    written = {users: plain_sql_transactions(users.dsn, user_tx, seed=1),
               colors: plain_sql_transactions(colors.dsn, colour_tx, seed=2)}
    for source, xids in written.items():
        log = commit_log(source)
        assert set(xids) <= set(log), source.prefix  # every writer's commit is recorded
        with psycopg2.connect(source.dsn) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT xid, events FROM {COMMIT_LOG}")
            events = dict(cur.fetchall())
        conn.close()
        seen = read_source_topics(info, source, len(log))
        ends = [e for e in seen[source.transaction_topic] if e and e["status"] == "END"]
        # The recorded order is the order Debezium published (WAL commit order), and the
        # recorded event counts are END's.
        assert [int(e["id"].split(":")[0]) for e in ends
                if int(e["id"].split(":")[0]) in events] == log, source.prefix
        for end in ends:
            xid = int(end["id"].split(":")[0])
            if xid in set(xids):
                assert events[xid] == sum(c["event_count"] for c in end["data_collections"])

    sink_dsn = fresh_sink_database(E2EStack(directory, info), "sink_plain_sql")
    job_file = tmp_path / "weights.py"
    job_file.write_text(WEIGHTS_JOB)
    run_until_idle(tmp_path / "run.log", str(job_file), "--dir", str(directory), "--master",
                   MASTER, "--checkpoint-dir", str(tmp_path / "checkpoints"),
                   "--output-dir", str(tmp_path / "output"), "--postgres-dsn", sink_dsn)
    job = load_job(job_file)
    result = verify_job(job, (info.pg_dsn_source, sink_dsn), tmp_path / "output",
                        {s.name: s.dsn for s in info.sources})
    assert_two_db_verified(result)
    with contextlib.closing(psycopg2.connect(sink_dsn)) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FILTER (WHERE weight IS NOT NULL), count(*) FILTER "
                    f"(WHERE ratio IS NOT NULL) FROM {job.output.table}")
        assert min(cur.fetchone()) > 0  # both columns reached the sink and were compared


WEIGHTS = [None, None, 0.1, 0.1, 3.14, 2.5e-3]
WEIGHTS_JOB = """
from txjoin.job import Job, Lookup, Output, Pick, Source, Table

job = Job(
    name="users_colors_weights",
    sources=[Source("users", prefix="users_db"), Source("colors", prefix="colors_db")],
    tables=[
        Table("public.users", {"id": "int", "full_name": "text"}, source="users"),
        Table("public.users_favorite_color", {
            "id": "int", "user_id": "int", "favorite_color": "text", "weight": "double",
            "ratio": "real",
        }, source="colors", defaults={"weight": None, "ratio": None}),
    ],
    fact="public.users",
    fact_alias="u",
    lookups=[Lookup("ufc", "public.users_favorite_color", parent="u", on={"user_id": "id"},
                    how="left", pick=Pick("weight", "min"))],
    output=Output(table="users_lightest_colour", key={"id": "u.id"},
                  columns={"full_name": "u.full_name", "favorite_color": "ufc.favorite_color",
                           "weight": "ufc.weight", "ratio": "ufc.ratio"}),
    semantics="current",
)
"""
