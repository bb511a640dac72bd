"""`txjoin job from-sql --dsn`: the column types and keys come from a real PostgreSQL catalog.

The stack's own schema (txjoin/stack/schema.sql) on the session's PostgreSQL: the seeds'
queries, with bare table names resolved by the search_path, compile to jobs whose
declarations equal the hand-written ones (the rows are compared in tests/unit/test_sql_job.py
with the declarations taken from the job files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg2
from click.testing import CliRunner

from tests.fixtures.postgres import new_database
from txjoin.cli import main
from txjoin.job import load_job

ROOT = Path(__file__).resolve().parents[2]


def test_the_seeds_queries_compile_from_the_catalog(pg_server: str, tmp_path: Path) -> None:
    dsn = new_database(pg_server, "from_sql")
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute((ROOT / "txjoin/stack/schema.sql").read_text())
    conn.close()
    for query, name, hand_file, semantics in [
        ("orders_flink.sql", "orders", "orders.py", "as_of_fact"),
        ("users_colors.sql", "users_colors", "users_colors.py", "current"),
    ]:
        out = tmp_path / f"{name}.py"
        done = CliRunner().invoke(main, ["job", "from-sql", str(ROOT / "jobs/sql" / query),
                                         "--name", name, "--dsn", dsn, "--out", str(out)])
        assert done.exit_code == 0, done.output
        job, hand = load_job(out), load_job(ROOT / "jobs" / hand_file)
        assert job.semantics == semantics == hand.semantics
        assert {t.name: (t.columns, t.key) for t in job.tables} == {
            t.name: (t.columns, t.key) for t in hand.tables}
        assert job.output.table == hand.output.table
        assert list(job.output.key) == list(hand.output.key)
        assert list(job.output.columns) == list(hand.output.columns)
    # A table the catalog does not have: the catalog reader's own line.
    bad = tmp_path / "bad.sql"
    bad.write_text("SELECT o.id FROM ordrs o")
    done = CliRunner().invoke(main, ["job", "from-sql", str(bad), "--name", "x", "--dsn", dsn])
    assert done.exit_code == 2 and "table 'ordrs' does not exist" in done.output


RIDES = """
CREATE TABLE {s}.drivers (id int PRIMARY KEY, name text);
CREATE TABLE {s}.vehicles (id int PRIMARY KEY, driver_id int {u}, plate text);
CREATE TABLE {s}.trips (id int PRIMARY KEY, driver_id int, fare numeric(6,2));
CREATE TABLE {s}.stops (id int PRIMARY KEY, trip_id int, seq int, place text{tie});
"""

RIDES_SQL = """
CREATE VIEW trips_view AS
SELECT t.id, d.name AS driver, v.plate,
       string_agg(st.place, ' > ' ORDER BY st.seq) AS route
FROM {s}.trips t
JOIN {s}.drivers d ON d.id = t.driver_id
LEFT JOIN {s}.vehicles v ON v.driver_id = d.id
LEFT JOIN {s}.stops st ON st.trip_id = t.id
GROUP BY t.id, d.name, v.plate
"""


def rides_database(pg_server: str, name: str, strict: bool = False,
                   rows: dict[str, list[dict[str, Any]]] | None = None) -> str:
    """A database with the ride-hailing tables in schema ``loose`` (no UNIQUE beyond the
    keys) holding ``rows``, and with ``strict`` the same tables with UNIQUE constraints."""
    dsn = new_database(pg_server, name)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("CREATE SCHEMA loose")
        cur.execute(RIDES.format(s="loose", u="", tie=""))
        if strict:
            cur.execute("CREATE SCHEMA strict")
            cur.execute(RIDES.format(s="strict", u="UNIQUE", tie=", UNIQUE (trip_id, seq)"))
        for table, table_rows in (rows or {}).items():
            for row in table_rows:
                cur.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES "
                            f"({', '.join(['%s'] * len(row))})", list(row.values()))
    conn.close()
    return dsn


def test_from_sql_warns_where_a_documented_rule_applies_unless_the_catalog_rules_it_out(
        pg_server: str, tmp_path: Path) -> None:
    # Issue 73 item 3: a driver with two vehicles (the job keeps the greatest id, the view
    # counts both) and stops with equal seq (txjoin breaks the tie by id): said when the job
    # is compiled, unless a UNIQUE in the catalog says it cannot happen.
    dsn = rides_database(pg_server, "from_sql_rules", strict=True)
    stderr = {}
    for schema in ("loose", "strict"):
        query = tmp_path / f"{schema}.sql"
        query.write_text(RIDES_SQL.format(s=schema))
        out = tmp_path / f"{schema}.py"
        done = CliRunner().invoke(main, ["job", "from-sql", str(query), "--name", "trips",
                                         "--dsn", dsn, "--out", str(out)])
        assert done.exit_code == 0, done.output
        assert load_job(out).output.table == "trips"  # the view's name is not the table
        stderr[schema] = done.stderr
    loose = stderr["loose"]
    assert ("v (loose.vehicles) is matched on driver_id, not its primary key (id): where "
            "several rows match, the job takes the one with the greatest id" in loose), loose
    assert "(the catalog has no UNIQUE on loose.vehicles (driver_id))" in loose
    assert ("st (loose.stops): child rows of one fact with equal seq are listed by id as "
            "well (txjoin's tie rule; PostgreSQL's order among them is unspecified): the "
            "catalog has no UNIQUE on loose.stops (trip_id, seq)" in loose), loose
    assert stderr["strict"].count("note: ") == 0, stderr["strict"]


RIDE_ROWS: dict[str, list[dict[str, Any]]] = {
    "loose.drivers": [{"id": 1, "name": "Ann"}, {"id": 2, "name": "Bob"}],
    "loose.vehicles": [{"id": 10, "driver_id": 1, "plate": "AA-1"},   # Ann drives two
                       {"id": 11, "driver_id": 1, "plate": "BB-2"},
                       {"id": 20, "driver_id": 2, "plate": "CC-3"}],
    "loose.trips": [{"id": 100, "driver_id": 1, "fare": "10.50"},
                    {"id": 101, "driver_id": 2, "fare": "7.00"},
                    {"id": 102, "driver_id": 2, "fare": None}],
    # Trip 101's two stops have equal seq: txjoin lists the tie by id ('b' first);
    # PostgreSQL's plan for the view here (a hash join built on the stops) gives them
    # in the reverse of the order they were inserted in ('a' first).
    "loose.stops": [{"id": 1010, "trip_id": 101, "seq": 1, "place": "b"},
                    {"id": 1011, "trip_id": 101, "seq": 1, "place": "a"},
                    {"id": 1000, "trip_id": 100, "seq": 1, "place": "home"},
                    {"id": 1001, "trip_id": 100, "seq": 2, "place": "work"}],
}


def test_verify_against_the_users_own_query_explains_the_documented_rules_and_flags_the_rest(
        pg_server: str, tmp_path: Path) -> None:
    # Issue 73 item 3: the view the job was compiled from as a further referee. Its two rows
    # for trip 100 (a driver with two vehicles) and trip 101's route (a tie in seq) are
    # txjoin's documented rules, one line each; a sink row changed underneath is not.
    from tests.e2e.test_verify_referee import run_engine_into_sink
    from txjoin.verify.own_query import read_own_query
    from txjoin.verify.verify import verify_job

    source = rides_database(pg_server, "own_query_source", rows=RIDE_ROWS)
    sink = new_database(pg_server, "own_query_sink")
    query, out = tmp_path / "trips.sql", tmp_path / "trips.py"
    query.write_text(RIDES_SQL.format(s="loose"))
    done = CliRunner().invoke(main, ["job", "from-sql", str(query), "--name", "trips",
                                     "--dsn", source, "--out", str(out)])
    assert done.exit_code == 0, done.output
    job = load_job(out)
    run_engine_into_sink(job, sink, RIDE_ROWS)

    def verify() -> Any:
        result = verify_job(job, (source, sink), tmp_path / "no-delta",
                            own_query=read_own_query(str(query)))
        (postgres,) = result.own_query  # the Delta sink has no table here: not compared
        return result, postgres

    result, postgres = verify()
    text = result.format()
    assert next(s for s in result.sinks if s.sink == "postgres").ok, text
    assert postgres.ok and postgres.query_rows == 4 and postgres.query_keys == 3, text
    assert "  your query: 4 rows, 3 keys" in text
    assert ("postgres: 2 key(s) differ by txjoin's documented rules, 0 mismatches" in text)
    assert ("1 by a Pick: v (loose.vehicles) matched on driver_id, where several rows "
            "match: your query has a row for each, the job the one with the greatest id"
            in text), text
    assert "id=100: 2 rows in your query (plate: AA-1 | BB-2); the sink has plate BB-2" in text
    assert ("1 by the order of ties: st (loose.stops) child rows of equal seq are listed "
            "by id as well" in text), text
    assert "id=101: route: yours a > b, the sink b > a" in text, text
    assert ("your query", f"PostgreSQL: {query} on the source") in result.referees

    with psycopg2.connect(sink) as conn, conn.cursor() as cur:
        cur.execute("UPDATE trips SET driver = 'Eve' WHERE id = 102")
        cur.execute("UPDATE trips SET plate = 'AA-1', route = 'x' WHERE id = 100")
    result, postgres = verify()
    text = result.format()
    assert not result.ok and postgres.mismatches == 2, text
    assert [r["id"] for _, r in postgres.different] == [100, 102], text
    assert "different (2): no documented rule explains them" in text

    # an as_of_fact job's rows are not today's state: refused in one line
    asof = tmp_path / "trips_asof.py"
    done = CliRunner().invoke(main, ["job", "from-sql", str(query), "--name", "trips_asof",
                                     "--semantics", "as_of_fact", "--dsn", source,
                                     "--out", str(asof)])
    assert done.exit_code == 0, done.output
    done = CliRunner().invoke(main, ["verify", str(asof), "--source-dsn", source,
                                     "--postgres-dsn", sink, "--against-sql", str(query)])
    assert done.exit_code == 2, done.output
    assert ("job 'trips_asof' has as_of_fact semantics, whose rows keep each lookup as of "
            "the fact's last change" in done.output), done.output
