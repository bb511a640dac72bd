"""A PostgreSQL the user already runs as the stack's source (``txjoin up --source-dsn``).

The stack's Kafka and Debezium capture the job's tables from the user's database; the
stack's own PostgreSQL then holds only the sink. Before anything starts,
:func:`check_capture` asks the server what logical decoding needs and fails with one
line that says what to change: ``wal_level``, the role's replication privilege, a free
replication slot, each table and column the job declares, each table's replica identity,
and who may create the connector's publication. Nothing is written to the user's
database here: Debezium creates its replication slot and (if absent) its publication;
``txjoin down --wipe`` drops both again (:func:`drop_capture`), since an abandoned slot
makes the server keep WAL for ever.

Verify's state check needs the commit order of every transaction, which only a database
txjoin built records (``txjoin up --job``); on the user's database it checks the final
rows and says in one line that it did not check each state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import psycopg2

from txjoin.errors import ConfigError, ServiceError
from txjoin.sinks.postgres import mask_dsn

if TYPE_CHECKING:
    from txjoin.job import Table


def connection_settings(dsn: str) -> dict[str, str]:
    """Debezium's ``database.*`` settings for ``dsn`` (host, port, user, password, name, TLS)."""
    try:
        parts = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError as exc:
        raise ConfigError(f"--source-dsn {mask_dsn(dsn)}: not a PostgreSQL connection string "
                          f"({str(exc).strip()}); e.g. postgresql://user:pass@host:5432/db"
                          ) from None
    if not parts.get("dbname"):
        raise ConfigError(f"--source-dsn {mask_dsn(dsn)} names no database; add it, e.g. "
                          f"postgresql://user@host:5432/mydb")
    settings = {"database.hostname": parts.get("host") or "127.0.0.1",
                "database.port": parts.get("port") or "5432",
                "database.user": parts.get("user") or "postgres",
                "database.password": parts.get("password") or "",
                "database.dbname": parts["dbname"]}
    if parts.get("sslmode"):
        settings["database.sslmode"] = parts["sslmode"]
    return settings


@contextlib.contextmanager
def _connect(dsn: str) -> Iterator[Any]:
    try:
        conn = psycopg2.connect(dsn, connect_timeout=10)
    except psycopg2.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ServiceError(f"cannot connect to --source-dsn {mask_dsn(dsn)}: {first}") from None
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            yield cur
    finally:
        conn.close()


def check_capture(dsn: str, tables: Sequence[Table], slot: str, publication: str) -> None:
    """ConfigError (one line: what to change) unless Debezium can capture ``tables`` from
    ``dsn`` with replication slot ``slot`` and publication ``publication``."""
    where = mask_dsn(dsn)
    with _connect(dsn) as cur:
        cur.execute("SELECT current_setting('wal_level'), current_user, current_database(), "
                    "r.rolsuper, r.rolreplication, "
                    "current_setting('max_replication_slots')::int, "
                    "(SELECT count(*) FROM pg_replication_slots), "
                    "EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s), "
                    "EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %s) "
                    "FROM pg_roles r WHERE r.rolname = current_user", (slot, publication))
        (wal_level, role, database, superuser, replication, max_slots, slots, has_slot,
         has_publication) = cur.fetchone()
        if wal_level != "logical":
            raise ConfigError(
                f"{where}: wal_level is {wal_level!r}, and Debezium needs logical decoding: "
                f"run `ALTER SYSTEM SET wal_level = logical` as a superuser and restart "
                f"PostgreSQL")
        if not (superuser or replication or _member_of(cur, "rds_replication")):
            raise ConfigError(
                f"{where}: role {role!r} may not stream changes: run `ALTER ROLE \"{role}\" "
                f"REPLICATION` as a superuser, or connect as a role that has it")
        if not has_slot and slots >= max_slots:
            raise ConfigError(
                f"{where}: all {max_slots} replication slots are in use: drop an unused one "
                f"(pg_drop_replication_slot) or raise max_replication_slots and restart")
        not_owned = []
        for table in tables:
            _check_table(cur, table, where, database)
            cur.execute("SELECT pg_has_role(current_user, c.relowner, 'USAGE') FROM pg_class c "
                        "WHERE c.oid = to_regclass(%s)", (table.name,))
            if not cur.fetchone()[0]:
                not_owned.append(table.name)
        if not has_publication and not superuser and not_owned:
            names = ", ".join(t.name for t in tables)
            raise ConfigError(
                f"{where}: role {role!r} cannot create Debezium's publication (it does not "
                f"own {', '.join(not_owned)}): as their owner run `CREATE PUBLICATION "
                f"{publication} FOR TABLE {names}`")


def _member_of(cur: Any, group: str) -> bool:
    cur.execute("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s) "
                "AND pg_has_role(current_user, %s, 'MEMBER')", (group, group))
    return bool(cur.fetchone()[0])


def _check_table(cur: Any, table: Table, where: str, database: str) -> None:
    """The table exists, has the job's columns, and its deletes carry the job's key."""
    cur.execute("SELECT c.relreplident, ARRAY(SELECT a.attname::text FROM pg_index i "
                "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                "WHERE i.indrelid = c.oid AND i.indisprimary), "
                "ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid "
                "AND a.attnum > 0 AND NOT a.attisdropped) "
                "FROM pg_class c WHERE c.oid = to_regclass(%s) AND c.relkind IN ('r', 'p')",
                (table.name,))
    row = cur.fetchone()
    if row is None:
        raise ConfigError(f"{where}: table {table.name} not found in database {database!r}; "
                          f"the job's Table names must be schema.table as in the database "
                          f"(`txjoin job init --dsn` writes them from the catalog)")
    identity, primary_key, columns = row
    missing = [c for c in table.columns if c not in columns]
    if missing:
        raise ConfigError(f"{where}: {table.name} has no column {missing[0]!r} that the job "
                          f"declares; its columns: {', '.join(columns)}")
    cur.execute("SELECT has_table_privilege(current_user, to_regclass(%s), 'SELECT')",
                (table.name,))
    if not cur.fetchone()[0]:
        raise ConfigError(f"{where}: the role may not read {table.name} (Debezium's snapshot "
                          f"does): run `GRANT SELECT ON {table.name} TO <the role>`")
    full = f"run `ALTER TABLE {table.name} REPLICA IDENTITY FULL`"
    if identity == "n" or (identity == "d" and not primary_key):
        raise ConfigError(f"{where}: {table.name} has no replica identity (no primary key), "
                          f"so its deletes carry no row: {full}")
    if identity == "i" or (identity == "d" and not set(table.key) <= set(primary_key)):
        raise ConfigError(f"{where}: {table.name}'s deletes carry only its replica identity "
                          f"({', '.join(primary_key) or 'an index'}), not the job's key "
                          f"({', '.join(table.key)}): {full}")


def drop_capture(dsn: str, slot: str, publication: str) -> str | None:
    """Drop the connector's replication slot and publication from the user's database;
    None when done, else one line saying what is left and how to drop it."""
    try:
        with _connect(dsn) as cur:
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE slot_name = %s", (slot,))
            cur.execute(f'DROP PUBLICATION IF EXISTS "{publication}"')
    except (ServiceError, psycopg2.Error) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (f"replication slot {slot} and publication {publication} may remain on "
                f"{mask_dsn(dsn)} ({first}): drop them there with "
                f"`SELECT pg_drop_replication_slot('{slot}')` and `DROP PUBLICATION "
                f"{publication}`, or the server keeps WAL for the slot")
    return None
