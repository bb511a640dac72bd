"""The stack on a database the user already runs (issue 21 items 2, 3 and 5).

A PostgreSQL of the user's, with tables of many column types (an enum, a domain,
money, uuid, jsonb, bytea, arrays...) and rows already in them: ``txjoin job init``
writes the job from its catalog, ``txjoin up --source-dsn DSN --job FILE`` checks the
server and captures exactly those tables, ``txjoin verify --record`` starts verify's own
record of the database's history, the user's own concurrent SQL writes the tables,
``txjoin run`` and ``txjoin verify`` find both sinks equal to the job as of each order's
commit (as_of_fact), a corrupted sink row is found, and
``txjoin down --wipe`` leaves no replication slot or publication behind on it.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from tests.e2e.test_end_to_end import run_until_idle, tail, txjoin_in_process
from tests.e2e.test_two_sources import plain_sql_transactions
from tests.fixtures.postgres import running_postgres
from txjoin.delta_tables import read_table
from txjoin.errors import ConfigError
from txjoin.job import Table
from txjoin.stack import load_stack
from txjoin.stack.demo import wait_for_end
from txjoin.stack.external import check_capture

pytestmark = pytest.mark.e2e

SCHEMA = """
CREATE TYPE mood AS ENUM ('happy', 'sad', 'curious');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE TABLE public.customers (
    id serial PRIMARY KEY, name varchar(40) NOT NULL, code char(4), mood mood,
    signup date, vip boolean, score real, balance money, ref uuid, profile jsonb,
    tags text[], avatar bytea, opens time, closes timetz(3), grace interval);
CREATE TABLE public.orders (
    id bigserial PRIMARY KEY, customer_id integer NOT NULL REFERENCES public.customers (id),
    qty posint, amount numeric(10,2), exact numeric, rate double precision,
    placed_at timestamptz, local_at timestamp(3), meta json, lines numeric(8,2)[], note text,
    logged timestamp, refs uuid[], days date[], blobs bytea[], slots time[], moods mood[]);
"""


def customer(rng: random.Random) -> tuple[Any, ...]:
    return (f"cust {rng.randrange(10**6)}", rng.choice(["AB12", "ZZ", None]),
            rng.choice(["happy", "sad", "curious", None]),
            f"2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}",
            rng.random() < 0.5, rng.choice([0.5, 1.25, -3.75, None]),
            f"{rng.randint(-500, 5000)}.{rng.randint(0, 99):02d}",
            f"{rng.getrandbits(128):032x}", f'{{"tier": {rng.randint(1, 3)}, "n": [1, 2]}}',
            rng.choice([["a", "b"], [], None, ["x,y", "q\"z"]]),
            bytes(rng.randrange(256) for _ in range(rng.randint(0, 6))),
            f"0{rng.randint(6, 9)}:{rng.randint(10, 59)}:00.{rng.randint(0, 999999):06d}",
            rng.choice(["22:00:00.125+01", "23:30:00-05:30", None]),
            rng.choice(["1 day 02:00:00", "3 mons 5 days", "-00:00:01.5", None]))


def order(rng: random.Random, customer_id: int) -> tuple[Any, ...]:
    return (customer_id, rng.randint(1, 9), f"{rng.randint(0, 9999)}.{rng.randint(0, 99):02d}",
            rng.choice(["12.5", "0.000001", "123456789.123456789", None]), rng.random() * 100,
            f"2025-03-0{rng.randint(1, 9)} 1{rng.randint(0, 9)}:30:00+02",
            f"2025-03-0{rng.randint(1, 9)} 08:15:00.{rng.randint(0, 999):03d}",
            rng.choice(['{"gift": true}', '[1, 2.5, "x"]', None]),
            rng.choice([["1.50", "2.25"], [], None]), rng.choice(["fast", None]),
            f"2025-04-0{rng.randint(1, 9)} 07:00:00.{rng.randint(0, 999999):06d}",
            rng.choice([[f"{rng.getrandbits(128):032x}", None], None]),
            rng.choice([["2024-02-29", "1999-12-31"], []]),
            rng.choice([[b"\x00\x01", b""], None]), rng.choice([["10:00:00.5", "23:59:59"], None]),
            rng.choice([["happy", "sad"], []]))


INSERT_CUSTOMER = ("INSERT INTO public.customers (name, code, mood, signup, vip, score, "
                   "balance, ref, profile, tags, avatar, opens, closes, grace) VALUES "
                   "(%s, %s, %s, %s, %s, %s, %s::numeric::money, %s, %s, %s, %s, %s, %s, %s) "
                   "RETURNING id")
INSERT_ORDER = ("INSERT INTO public.orders (customer_id, qty, amount, exact, rate, placed_at, "
                "local_at, meta, lines, note, logged, refs, days, blobs, slots, moods) VALUES "
                "(%s, %s, %s, %s, %s, %s, %s, %s, %s::numeric[], %s, %s, %s::uuid[], "
                "%s::date[], %s::bytea[], %s::time[], %s::mood[])")


def user_transaction(rng: random.Random, cur: Any) -> None:
    """One transaction of the user's application: new customers with orders in the same
    transaction, changed customers (the lookup race), changed and deleted orders."""
    # A committed customer: with concurrent writers, an id below max(id) may belong to a
    # transaction still open (bigserial hands out ids before commit), so take the nearest
    # id at or below a random one that exists now.
    cur.execute("SELECT max(id) FROM public.customers")
    cur.execute("SELECT max(id) FROM public.customers WHERE id <= %s",
                (rng.randint(1, cur.fetchone()[0]),))
    existing = cur.fetchone()[0]
    kind = rng.random()
    if kind < 0.35:
        cur.execute(INSERT_CUSTOMER, customer(rng))
        new = cur.fetchone()[0]
        for _ in range(rng.randint(1, 3)):
            cur.execute(INSERT_ORDER, order(rng, new))
    elif kind < 0.6:
        cur.execute("UPDATE public.customers SET name = name || '+', mood = %s, "
                    "balance = balance + 1::money, tags = array_append(tags, 'u'), "
                    "opens = opens + interval '1 minute', grace = grace * 2 WHERE id = %s",
                    (rng.choice(["happy", "sad"]), existing))
    elif kind < 0.85:
        cur.execute(INSERT_ORDER, order(rng, existing))
        cur.execute("UPDATE public.orders SET qty = qty + 1, note = 'changed' WHERE id = "
                    "(SELECT max(id) FROM public.orders)")
    else:
        cur.execute("DELETE FROM public.orders WHERE id = (SELECT min(id) FROM public.orders)")


@pytest.fixture(scope="module")
def users_database() -> Iterator[str]:
    """The user's own PostgreSQL (wal_level=logical), with the schema and some rows."""
    with running_postgres() as dsn:
        rng = random.Random(7)
        with contextlib.closing(psycopg2.connect(dsn)) as conn, conn, conn.cursor() as cur:
            cur.execute(SCHEMA)
            for _ in range(5):  # rows before capture starts: Debezium's snapshot
                cur.execute(INSERT_CUSTOMER, customer(rng))
                cur.execute(INSERT_ORDER, order(rng, cur.fetchone()[0]))
        yield dsn


def txjoin(*args: str) -> subprocess.CompletedProcess[str]:
    """``txjoin ARGS`` in this process (``txjoin_in_process``): a Python process importing
    txjoin costs ~2-3 s of CPU, eleven times here; `up` starts its services detached
    either way, and the command as a process of its own is tests/spark/test_cli_process.py's."""
    return txjoin_in_process(*args)


def test_capture_checks_say_in_one_line_what_to_change(users_database: str,
                                                       tmp_path: Path) -> None:
    """Each thing logical decoding needs, missing, is one line naming the fix; the checks
    run before the stack starts anything."""
    tables = [Table("public.orders", {"id": "bigint", "note": "text"})]
    check_capture(users_database, tables, "txjoin_x", "dbz_x")  # all is well
    with contextlib.closing(psycopg2.connect(users_database)) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("CREATE ROLE app LOGIN")
            cur.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO app")
            cur.execute("ALTER TABLE public.orders REPLICA IDENTITY NOTHING")
        try:
            cases = {
                "REPLICA IDENTITY FULL": (users_database, tables),
                "no column 'colour'": (
                    users_database, [Table("public.orders", {"id": "bigint", "colour": "text"})]),
                "table public.nothing not found": (users_database,
                                                   [Table("public.nothing", {"id": "int"})]),
            }
            for expected, (dsn, declared) in cases.items():
                with pytest.raises(ConfigError, match=expected) as caught:
                    check_capture(dsn, declared, "txjoin_x", "dbz_x")
                assert "\n" not in str(caught.value)
            app_dsn = users_database.replace("postgres@", "app@")
            with pytest.raises(ConfigError, match='ALTER ROLE "app" REPLICATION'):
                check_capture(app_dsn, tables, "txjoin_x", "dbz_x")
        finally:
            with conn.cursor() as cur:
                cur.execute("ALTER TABLE public.orders REPLICA IDENTITY DEFAULT")
                cur.execute("DROP OWNED BY app")
                cur.execute("DROP ROLE app")
    # Through the CLI: a usage error (exit 2) of one line, and no stack left behind.
    done = txjoin("up", "--dir", str(tmp_path / "stack"), "--source-dsn",
                  users_database.replace("/postgres", "/nodb"), "--job",
                  str(Path(__file__).resolve().parents[2] / "jobs" / "orders.py"))
    assert done.returncode != 0
    assert "cannot connect to --source-dsn" in done.stderr + done.stdout, done.stderr
    assert "Traceback" not in done.stderr


def captured(dsn: str, directory: Path) -> None:
    """Wait until Debezium published every transaction committed on the user's database so
    far: a no-op update of a captured row committed last, then its END in the topic (the
    stack's own barrier table is not in the user's database). Without it a drain can end
    before a loaded machine's connector caught up, and verify finds the sinks behind."""
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn, conn.cursor() as cur:
        cur.execute("UPDATE public.customers SET id = id "
                    "WHERE id = (SELECT min(id) FROM public.customers)")
        cur.execute("SELECT pg_current_xact_id()::text::bigint")
        row = cur.fetchone()
    assert row is not None
    wait_for_end(load_stack(directory), int(row[0]))


def test_job_from_the_catalog_on_the_users_database_matches_postgresql(
        users_database: str, tmp_path: Path) -> None:
    """The generated job keeps each order's customer as of the order (as_of_fact): verify
    checks it on the user's own SQL from its own record of the database's history
    (`verify --record` before the workload: a test_decoding slot), finds both sinks equal,
    names the orders written before the record began, and finds a corrupted sink row."""
    job_file = tmp_path / "orders_job.py"
    done = txjoin("job", "init", "--dsn", users_database, "--tables",
                  "public.orders,public.customers", "--fact", "public.orders", "--out",
                  str(job_file))
    assert done.returncode == 0, done.stderr
    assert 'semantics="as_of_fact"' in job_file.read_text()

    directory = tmp_path / "stack"
    up = txjoin("up", "--dir", str(directory), "--source-dsn", users_database, "--job",
                str(job_file))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "orders.public.customers" in up.stdout and "orders.transaction" in up.stdout
        # Without a record, verify says how to get one (it was: use semantics="current").
        unrecorded = txjoin("verify", str(job_file), "--dir", str(directory))
        assert unrecorded.returncode == 2, unrecorded.stdout + unrecorded.stderr
        assert f"run `txjoin verify {job_file} --record` before the workload" \
            in unrecorded.stderr, unrecorded.stderr
        log = tmp_path / "run.log"
        plain_sql_transactions(users_database, user_transaction, writers=3, each=20, seed=3)
        captured(users_database, directory)
        run_until_idle(log, str(job_file), "--dir", str(directory), "--master", "local[2]")
        # The record starts after a first workload: the orders it left are facts whose
        # customers as of their commit verify cannot know (named, not checked).
        record = txjoin("verify", str(job_file), "--dir", str(directory), "--record")
        assert record.returncode == 0, record.stdout + record.stderr
        with contextlib.closing(psycopg2.connect(users_database)) as conn, conn.cursor() as cur:
            cur.execute("SELECT max(id) FROM public.orders")
            recorded_from = cur.fetchone()[0]
        # The second run resumes from the first one's checkpoint.
        plain_sql_transactions(users_database, user_transaction, writers=3, each=20, seed=4)
        captured(users_database, directory)
        run_until_idle(log, str(job_file), "--dir", str(directory), "--master", "local[2]")
        verify = txjoin("verify", str(job_file), "--dir", str(directory))
        assert verify.returncode == 0, verify.stdout + verify.stderr + tail(log)
        assert "verify: OK" in verify.stdout and verify.stdout.count(" 0 mismatches") == 2
        assert "replayed from verify's record" in verify.stdout, verify.stdout
        with contextlib.closing(psycopg2.connect(users_database)) as conn, conn.cursor() as cur:
            # The second workload updates only orders it wrote, and deletes the oldest.
            cur.execute("SELECT count(*) FROM public.orders WHERE id <= %s", (recorded_from,))
            before_record = cur.fetchone()[0]
            cur.execute("SELECT slot_name FROM pg_replication_slots ORDER BY 1")
            assert [r[0] for r in cur.fetchall()] == ["txjoin_orders", "txjoin_verify"]
        assert before_record > 0
        assert (f"note: {before_record} fact(s) not checked: last changed before verify's "
                f"record began") in verify.stdout, verify.stdout
        # time, timetz and interval reach Delta too (as text and microseconds).
        stored = read_table(str(directory / "output" / "orders_enriched" / "current")).schema
        types = {f.name: str(f.type) for f in stored}
        assert (types["customer_opens"], types["customer_closes"], types["customer_grace"]) \
            == ("string", "string", "int64"), types
        # A corrupted row of the PostgreSQL sink (an order of the second workload) is
        # found by a verify that reads nothing new from the slot: the record kept the
        # history the previous verify consumed.
        stack = load_stack(directory)
        assert stack is not None
        with contextlib.closing(psycopg2.connect(stack.pg_dsn_sink)) as conn, conn, \
                conn.cursor() as cur:
            cur.execute("UPDATE orders_enriched SET customer_name = 'corrupted' WHERE "
                        "id = (SELECT max(id) FROM orders_enriched) RETURNING id")
            corrupted = cur.fetchone()[0]
        assert corrupted > recorded_from
        found = txjoin("verify", str(job_file), "--dir", str(directory))
        assert found.returncode == 1, found.stdout + found.stderr
        assert "verify: 1 mismatches" in found.stdout, found.stdout
        assert "different (1):" in found.stdout and "customer_name: corrupted" in found.stdout, \
            found.stdout
        dropped = txjoin("verify", str(job_file), "--dir", str(directory), "--drop-record")
        assert dropped.returncode == 0 and "slot txjoin_verify dropped" in dropped.stdout, \
            dropped.stdout + dropped.stderr
        with contextlib.closing(psycopg2.connect(users_database)) as conn, conn.cursor() as cur:
            cur.execute("SELECT slot_name FROM pg_replication_slots")
            assert [r[0] for r in cur.fetchall()] == ["txjoin_orders"]
        # A record left running: `down --wipe` drops its slot with Debezium's (below).
        again = txjoin("verify", str(job_file), "--dir", str(directory), "--record")
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        down = txjoin("down", "--dir", str(directory), "--wipe")
    assert down.returncode == 0, down.stderr
    with contextlib.closing(psycopg2.connect(users_database)) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_replication_slots")
        assert cur.fetchone()[0] == 0  # no slot keeps the user's WAL after --wipe (verify's)
        cur.execute("SELECT count(*) FROM pg_publication")
        assert cur.fetchone()[0] == 0
        cur.execute("SELECT count(*) FROM public.orders")
        assert cur.fetchone()[0] > 0  # the user's data stays
