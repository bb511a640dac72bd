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
