"""A new user's mistakes against the running local stack: found before anything starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.e2e.conftest import E2EStack
from txjoin.cli import main

pytestmark = pytest.mark.e2e

ORDERS = Path(__file__).resolve().parents[2] / "jobs" / "orders.py"


def test_a_typo_in_a_declared_column_stops_the_run_before_spark_with_the_near_name(
        e2e_stack: E2EStack, tmp_path: Path) -> None:
    job = tmp_path / "orders_typo.py"
    job.write_text(ORDERS.read_text().replace('"order_time": "timestamp"',
                                              '"order_tme": "timestamp"'))
    result = CliRunner().invoke(main, ["run", str(job), "--dir", str(e2e_stack.directory),
                                       "--checkpoint-dir", str(tmp_path / "cp"),
                                       "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert (f"{job}: table public.orders has no column 'order_tme' in the source database"
            in result.output), result.output
    assert "(did you mean 'order_time'?)" in result.output, result.output
    assert not (tmp_path / "cp").exists() and not (tmp_path / "out").exists()


LIBRARY_JOB = '''
from txjoin.job import Job, Lookup, Output, Table

job = Job(
    name="library",
    tables=[Table("public.members", {"id": "int", "name": "text"}),
            Table("public.books", {"id": "int", "title": "text"}),
            Table("public.loans", {"id": "int", "member_id": "int", "book_id": "int"})],
    fact="public.loans", fact_alias="l",
    lookups=[Lookup("m", "public.members", parent="l", on={"id": "member_id"}),
             Lookup("b", "public.books", parent="l", on={"id": "book_id"})],
    output=Output(table="loans_out", key={"loan_id": "l.id"},
                  columns={"member": "m.name", "title": "b.title"}),
)
'''

LIBRARY_SQL = [
    "INSERT INTO public.members (id, name) VALUES (1, 'Ada'), (2, 'Linus')",
    "INSERT INTO public.books (id, title) VALUES (1, 'Dune'), (2, 'Emma')",
    "BEGIN; INSERT INTO public.loans VALUES (10, 1, 1); INSERT INTO public.loans VALUES "
    "(11, 2, 2); COMMIT",
    "UPDATE public.members SET name = 'Ada L.' WHERE id = 1",  # loan 10 keeps 'Ada'
    "INSERT INTO public.loans VALUES (12, 1, 2)",  # sees 'Ada L.'
    "BEGIN; UPDATE public.books SET title = 'Emma (2nd ed.)' WHERE id = 2; "
    "DELETE FROM public.loans WHERE id = 11; COMMIT",
    "UPDATE public.loans SET book_id = 1 WHERE id = 12",  # now as of this commit
]


def test_the_library_as_of_fact_job_verifies_on_plain_sql_after_up_job(tmp_path: Path) -> None:
    """Issue 40's newcomer path: `up --job` (which starts verify's record), plain SQL,
    `run --until-idle`, `verify` of the default as_of_fact semantics: 0 mismatches, every
    loan as of the commit that last changed it; then a corrupted sink row is found.
    On main verify answered exit 2: no public.loans_expected, use semantics="current"."""
    import contextlib

    import psycopg2

    from tests.e2e.test_end_to_end import run_until_idle, tail, txjoin_command
    from txjoin.stack import load_stack

    job = tmp_path / "library.py"
    job.write_text(LIBRARY_JOB)
    directory = tmp_path / "stack"

    def txjoin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(txjoin_command(*args), capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=300, check=False)

    up = txjoin("up", "--dir", str(directory), "--job", str(job))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert up.stderr == "", up.stderr  # issue 73: no warnings of its JVMs or pip's
        stack = load_stack(directory)
        assert stack is not None
        with contextlib.closing(psycopg2.connect(stack.pg_dsn_source)) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                for statement in LIBRARY_SQL:
                    cur.execute(statement)
        log = tmp_path / "run.log"
        run_until_idle(log, str(job), "--dir", str(directory), "--master", "local[1]",
                       process=True)  # as the newcomer runs it
        verify = txjoin("verify", str(job), "--dir", str(directory))
        assert verify.returncode == 0, verify.stdout + verify.stderr + tail(log)
        assert "verify: OK" in verify.stdout and verify.stdout.count(" 0 mismatches") == 2
        assert "2 expected rows, 1 absent keys" in verify.stdout, verify.stdout
        assert "replayed from verify's record" in verify.stdout and "note:" not in verify.stdout
        with contextlib.closing(psycopg2.connect(stack.pg_dsn_sink)) as conn, conn, \
                conn.cursor() as cur:
            cur.execute("SELECT loan_id, member, title FROM loans_out ORDER BY loan_id")
            assert cur.fetchall() == [(10, "Ada", "Dune"), (12, "Ada L.", "Dune")]
            cur.execute("UPDATE loans_out SET member = 'Ada' WHERE loan_id = 12")
        found = txjoin("verify", str(job), "--dir", str(directory))
        assert found.returncode == 1, found.stdout + found.stderr
        assert "verify: 1 mismatches" in found.stdout, found.stdout
    finally:
        txjoin("down", "--dir", str(directory), "--wipe")
