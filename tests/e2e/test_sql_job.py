"""`txjoin job from-sql --dsn`: the column types and keys come from a real PostgreSQL catalog.

The stack's own schema (txjoin/stack/schema.sql) on the session's PostgreSQL: the seeds'
queries, with bare table names resolved by the search_path, compile to jobs whose
declarations equal the hand-written ones (the rows are compared in tests/unit/test_sql_job.py
with the declarations taken from the job files).
"""

from __future__ import annotations

from pathlib import Path

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


def test_from_sql_warns_where_a_documented_rule_applies_unless_the_catalog_rules_it_out(
        pg_server: str, tmp_path: Path) -> None:
    # Issue 73 item 3: a driver with two vehicles (the job keeps the greatest id, the view
    # counts both) and stops with equal seq (txjoin breaks the tie by id): said when the job
    # is compiled, unless a UNIQUE in the catalog says it cannot happen.
    dsn = new_database(pg_server, "from_sql_rules")
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("CREATE SCHEMA loose; CREATE SCHEMA strict;")
        cur.execute(RIDES.format(s="loose", u="", tie=""))
        cur.execute(RIDES.format(s="strict", u="UNIQUE", tie=", UNIQUE (trip_id, seq)"))
    conn.close()
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
