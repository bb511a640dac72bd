"""`txjoin up --job JOB --schema FILE`: the job's database from the user's own DDL (issue 73).

`create_source_database` on the session's PostgreSQL server: the user's constraints
(foreign keys, UNIQUE, NOT NULL, CHECK) hold in the database the stack captures, with
txjoin's change log, commit trigger and full replica identity added; DDL that does not
hold the job's tables and columns with types it reads is one line per problem. Then `up`
itself with such a file: refused after PostgreSQL alone started, and nothing of the new
stack kept (the next `up` builds its database again).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from urllib.parse import urlparse

import psycopg2
import pytest
from click.testing import CliRunner

from txjoin.cli import main
from txjoin.errors import ConfigError
from txjoin.job import load_job
from txjoin.stack.postgres import SchemaFile, create_source_database

JOB_FILE = """
from txjoin.job import Job, Lookup, Output, Table

job = Job(
    name="rides",
    tables=[Table("public.drivers", {"id": "int", "name": "text"}),
            Table("public.trips", {"id": "int", "driver_id": "int", "fare": "numeric(6,2)"})],
    fact="public.trips", fact_alias="t",
    lookups=[Lookup("d", "public.drivers", "t", {"id": "driver_id"}, how="left")],
    output=Output(table="rides", key={"id": "t.id"}, columns={"fare": "t.fare",
                                                              "driver": "d.name"}),
    semantics="current")
"""


def rides_job(tmp_path: Path) -> Path:
    """The job file, written to ``tmp_path``."""
    path = tmp_path / "rides.py"
    path.write_text(JOB_FILE)
    return path


SCHEMA = """
CREATE TABLE public.drivers (id int PRIMARY KEY, name text NOT NULL UNIQUE);
CREATE TABLE public.trips (
    id int PRIMARY KEY,
    driver_id int NOT NULL REFERENCES public.drivers (id),
    fare numeric(6,2) CHECK (fare >= 0),
    note text);
CREATE TABLE public.audit (id serial PRIMARY KEY, what text);
"""

UNFIT = """
CREATE TABLE public.drivers (id int PRIMARY KEY, full_name text);
CREATE TABLE public.trips (id int PRIMARY KEY, driver_id int, fare numeric(9,3));
"""


def build(pg_server: str, tmp_path: Path, database: str, ddl: str) -> str:
    """``database`` on the session's server, built from ``ddl`` for the rides job."""
    schema = tmp_path / f"{database}.sql"
    schema.write_text(ddl)
    port = urlparse(pg_server).port
    assert port is not None
    return create_source_database(port, database, load_job(rides_job(tmp_path)).tables,
                                  SchemaFile(str(schema), "rides.py"))


def test_the_users_ddl_builds_the_database_constraints_and_all(
        pg_server: str, tmp_path: Path) -> None:
    url = build(pg_server, tmp_path, "rides_own", SCHEMA)
    with contextlib.closing(psycopg2.connect(url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT c.relname, c.relreplident FROM pg_class c WHERE c.relname IN "
                    "('drivers', 'trips', 'audit') ORDER BY 1")
        assert cur.fetchall() == [("audit", "d"), ("drivers", "f"), ("trips", "f")]
        cur.execute("INSERT INTO public.drivers VALUES (1, 'Ann')")
        cur.execute("INSERT INTO public.trips VALUES (10, 1, 7.50, NULL)")
        conn.commit()
        for bad, constraint in [("INSERT INTO public.trips VALUES (11, 2, 1, NULL)",
                                 "trips_driver_id_fkey"),
                                ("INSERT INTO public.drivers VALUES (2, 'Ann')",
                                 "drivers_name_key"),
                                ("INSERT INTO public.trips VALUES (12, 1, -1, NULL)",
                                 "trips_fare_check")]:
            with pytest.raises(psycopg2.IntegrityError, match=constraint):
                cur.execute(bad)
            conn.rollback()
        cur.execute("SELECT count(*) FROM public.txjoin_commits")  # the commit trigger ran
        assert cur.fetchone()[0] == 1


def test_ddl_that_does_not_hold_the_jobs_tables_is_one_line_per_problem(
        pg_server: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        build(pg_server, tmp_path, "rides_unfit", UNFIT)
    lines = str(raised.value).splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("rides.py against --schema ") and \
        "table public.drivers has no column 'name'" in lines[0], lines
    assert ("table public.trips column 'fare' is declared 'numeric(6,2)', but the source "
            "database has it as numeric(9,3)") in lines[1], lines


def test_up_refuses_a_schema_that_does_not_fit_the_job_and_keeps_nothing(
        tmp_path: Path) -> None:
    job_file, schema = rides_job(tmp_path), tmp_path / "unfit.sql"
    schema.write_text(UNFIT)
    stack = tmp_path / "stack"
    done = CliRunner().invoke(main, ["up", "--dir", str(stack), "--job", str(job_file),
                                     "--schema", str(schema), "--timeout", "60"])
    assert done.exit_code == 2, done.output
    assert "has no column 'name'" in done.output and "numeric(9,3)" in done.output
    assert not (stack / "stack.json").exists()
    assert not (stack / "postgres").exists() and not (stack / "kafka-data").exists()
    done = CliRunner().invoke(main, ["up", "--job", str(job_file), "--source-dsn", "x",
                                     "--schema", str(schema)])
    assert done.exit_code == 2 and "--schema builds the database the stack creates" in \
        done.output, done.output

