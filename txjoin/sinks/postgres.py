"""PostgreSQL sink: a current table keyed by the output key, a changelog, and a progress ledger.

One database transaction per micro-batch applies the batch and moves the job's
row in ``txjoin_progress``, so readers see whole batches and a replayed batch
(same ``batch_id`` after a crash) is skipped. The progress row is keyed by the
``job`` string: give each sink its own job name (e.g. ``<job>.<table>`` when a
job writes several tables to one database).

Types: scalars map to native columns; lists, structs and maps become ``jsonb``
with decimals written as JSON numbers (exact, ``numeric`` inside jsonb) and
timestamps as ISO text. Reads convert back by the declared Arrow type, so both
sinks return the same Python values (``Decimal`` for decimals, aware datetimes).
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable
from datetime import date, datetime, time
from decimal import Decimal
from functools import partial
from typing import Any

import psycopg2
import psycopg2.extensions
import psycopg2.extras
import pyarrow as pa
from psycopg2 import sql

from txjoin.errors import ConfigError, ServiceError
from txjoin.sinks import (
    COMMIT_SEQ,
    OP,
    OP_DELETE,
    check_changes_schema,
    conform,
    current_schema,
    last_change_per_key,
    sort_rows,
)

PROGRESS_TABLE = "txjoin_progress"
CONNECT_TIMEOUT_S = 10
_PAGE_SIZE = 1000


def mask_dsn(dsn: str) -> str:
    """``dsn`` with its password replaced by ``***`` (URI and key=value forms)."""
    masked = re.sub(r"(://[^:/@?#]*:)[^@/?#]*(@)", r"\1***\2", dsn)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", masked)


def _password(dsn: str) -> str | None:
    try:
        return psycopg2.extensions.parse_dsn(dsn).get("password") or None
    except psycopg2.ProgrammingError:
        return None


def _is_nested(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_struct(t)
            or pa.types.is_map(t) or pa.types.is_fixed_size_list(t))


def pg_type(t: pa.DataType, column: str = "?") -> str:
    """PostgreSQL column type for an Arrow type (nested types become ``jsonb``)."""
    if _is_nested(t):
        return "jsonb"
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t):
        return "smallint"
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return "integer"
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return "bigint"
    if pa.types.is_uint64(t):
        return "numeric(20,0)"
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return "real"
    if pa.types.is_float64(t):
        return "double precision"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytea"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        return "timestamptz" if t.tz is not None else "timestamp"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_time(t):
        return "time"
    raise ConfigError(f"postgres sink: column {column!r} has type {t}, which has no "
                      "PostgreSQL mapping; cast it in the job's output")


# -- jsonb encoding, driven by the Arrow type --------------------------------


def _json_text(value: Any, t: pa.DataType) -> str:
    """JSON text of ``value``; decimals stay exact JSON numbers (json.dumps cannot)."""
    if value is None:
        return "null"
    if pa.types.is_struct(t):
        return "{" + ",".join(
            json.dumps(t.field(i).name) + ":" + _json_text(value.get(t.field(i).name),
                                                           t.field(i).type)
            for i in range(t.num_fields)) + "}"
    if pa.types.is_map(t):
        return "[" + ",".join(
            "[" + _json_text(k, t.key_type) + "," + _json_text(v, t.item_type) + "]"
            for k, v in value) + "]"
    if _is_nested(t):
        return "[" + ",".join(_json_text(v, t.value_type) for v in value) + "]"
    if isinstance(value, Decimal):
        return format(value, "f") if value.is_finite() else "null"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else "null"
    if isinstance(value, datetime | date | time):
        return json.dumps(value.isoformat())
    if isinstance(value, bytes):
        return json.dumps(base64.b64encode(value).decode("ascii"))
    return json.dumps(value)


def _from_json(value: Any, t: pa.DataType) -> Any:
    """Inverse of ``_json_text`` (jsonb numbers arrive as int or Decimal)."""
    if value is None:
        return None
    if pa.types.is_struct(t):
        return {t.field(i).name: _from_json(value.get(t.field(i).name), t.field(i).type)
                for i in range(t.num_fields)}
    if pa.types.is_map(t):
        return [(_from_json(k, t.key_type), _from_json(v, t.item_type)) for k, v in value]
    if _is_nested(t):
        return [_from_json(v, t.value_type) for v in value]
    return _from_pg(value, t)


def _from_pg(value: Any, t: pa.DataType) -> Any:
    """A value read from PostgreSQL (or jsonb) as the Python value Arrow would give."""
    if value is None:
        return None
    if pa.types.is_decimal(t):
        return Decimal(value).quantize(Decimal(1).scaleb(-t.scale))
    if pa.types.is_floating(t):
        return float(value)
    if pa.types.is_integer(t):
        return int(value)
    if pa.types.is_timestamp(t) and isinstance(value, str):
        return datetime.fromisoformat(value)
    if pa.types.is_date(t) and isinstance(value, str):
        return date.fromisoformat(value)
    if pa.types.is_time(t) and isinstance(value, str):
        return time.fromisoformat(value)
    if (pa.types.is_binary(t) or pa.types.is_large_binary(t)) and isinstance(value, str):
        return base64.b64decode(value)
    if isinstance(value, memoryview):
        return value.tobytes()
    return value


def _to_pg(t: pa.DataType) -> Callable[[Any], Any]:
    if _is_nested(t):
        return lambda v: None if v is None else _json_text(v, t)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return lambda v: None if v is None else psycopg2.Binary(v)
    return lambda v: v


MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1


class PostgresSink:
    """Output tables in PostgreSQL via psycopg2; see the module docstring."""

    name = "postgres"

    def __init__(self, dsn: str, table: str, job: str, key_columns: list[str],
                 schema: pa.Schema) -> None:
        check_changes_schema(schema, key_columns, f"postgres sink for table {table!r}")
        if len(f"{table}_changelog".encode()) > MAX_IDENTIFIER_BYTES:
            # PostgreSQL would silently truncate both names to the same relation.
            raise ConfigError(
                f"postgres sink: table name {table!r} is too long: with '_changelog' it exceeds "
                f"PostgreSQL's {MAX_IDENTIFIER_BYTES}-byte identifiers; use at most "
                f"{MAX_IDENTIFIER_BYTES - len('_changelog')} bytes (Output(table=...) in the job)")
        self.dsn_masked = mask_dsn(dsn)
        self._secret = _password(dsn)
        self.table, self.changelog_table, self.job = table, f"{table}_changelog", job
        self.key_columns = list(key_columns)
        self.schema = schema
        self.current = current_schema(schema)
        self._pg_types = {f.name: pg_type(f.type, f.name) for f in schema}
        self._ready = False
        try:
            self._conn = psycopg2.connect(dsn, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg2.Error as exc:
            raise self._service_error("cannot connect", exc) from None
        self._conn.autocommit = False
        with self._conn.cursor() as cur:
            # Timestamps come back in UTC, like the Delta sink's.
            cur.execute("SET TIME ZONE 'UTC'")
        self._conn.commit()
        psycopg2.extras.register_default_jsonb(
            self._conn, loads=partial(json.loads, parse_float=Decimal))

    def _service_error(self, what: str, exc: BaseException) -> ServiceError:
        message = str(exc).strip()
        if self._secret:
            message = message.replace(self._secret, "***")
        return ServiceError(f"postgres sink {self.table!r} at {self.dsn_masked}: {what}: "
                            f"{mask_dsn(message)}")

    # -- DDL ------------------------------------------------------------------

    def _ensure_tables(self, cur: Any) -> None:
        if self._ready:
            return
        ident = sql.Identifier
        columns = sql.SQL(", ").join(
            sql.SQL("{} {}").format(ident(f.name), sql.SQL(self._pg_types[f.name]))
            for f in self.current)
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))").format(
            ident(self.table), columns,
            sql.SQL(", ").join(ident(k) for k in self.key_columns)))
        log_columns = sql.SQL(", ").join(
            sql.SQL("{} {}").format(ident(f.name), sql.SQL(self._pg_types[f.name]))
            for f in self.schema)
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            ident(self.changelog_table), log_columns))
        cur.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (job text PRIMARY KEY, batch_id bigint NOT NULL, "
            "commit_seq bigint, updated_at timestamptz DEFAULT now())").format(
                ident(PROGRESS_TABLE)))
        self._ready = True

    def _exists(self, cur: Any, table: str) -> bool:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (psycopg2.extensions.quote_ident(
            table, cur),))
        return bool(cur.fetchone()[0])

    # -- Sink protocol ----------------------------------------------------------

    def last_applied_batch(self) -> int | None:
        """The job's batch id in ``txjoin_progress``."""
        try:
            with self._conn, self._conn.cursor() as cur:
                if not self._exists(cur, PROGRESS_TABLE):
                    return None
                cur.execute(sql.SQL("SELECT batch_id FROM {} WHERE job = %s").format(
                    sql.Identifier(PROGRESS_TABLE)), (self.job,))
                row = cur.fetchone()
                return None if row is None else int(row[0])
        except psycopg2.OperationalError as exc:
            raise self._service_error("cannot read progress", exc) from None

    def write(self, batch_id: int, changes: pa.Table) -> bool:
        """Apply one micro-batch and its progress in one transaction; False on replay."""
        changes = conform(changes, self.schema, f"postgres sink {self.table!r}", batch_id)
        try:
            with self._conn, self._conn.cursor() as cur:
                self._ensure_tables(cur)
                # Serialises writers of one job even before its progress row exists.
                cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.job,))
                cur.execute(sql.SQL("SELECT batch_id FROM {} WHERE job = %s FOR UPDATE").format(
                    sql.Identifier(PROGRESS_TABLE)), (self.job,))
                row = cur.fetchone()
                if row is not None and batch_id <= row[0]:
                    return False
                self._apply(cur, changes)
                seqs = changes.column(COMMIT_SEQ)
                commit_seq = None if changes.num_rows == 0 else seqs[changes.num_rows - 1].as_py()
                cur.execute(sql.SQL(
                    "INSERT INTO {} AS p (job, batch_id, commit_seq, updated_at) "
                    "VALUES (%s, %s, %s, now()) ON CONFLICT (job) DO UPDATE SET "
                    "batch_id = EXCLUDED.batch_id, "
                    "commit_seq = COALESCE(EXCLUDED.commit_seq, p.commit_seq), "
                    "updated_at = now()").format(sql.Identifier(PROGRESS_TABLE)),
                    (self.job, batch_id, commit_seq))
            return True
        except psycopg2.OperationalError as exc:
            self._ready = False  # the DDL may have been rolled back with the batch
            raise self._service_error(f"batch {batch_id} not written", exc) from None

    def _rows(self, table: pa.Table, columns: list[str]) -> list[tuple]:
        converted = [list(map(_to_pg(table.schema.field(c).type), table.column(c).to_pylist()))
                     for c in columns]
        return list(zip(*converted, strict=True))

    def _template(self, columns: list[str]) -> str:
        # Typed placeholders: VALUES lists otherwise guess text for every literal.
        return "(" + ", ".join(f"%s::{self._pg_types[c]}" for c in columns) + ")"

    def _apply(self, cur: Any, changes: pa.Table) -> None:
        if changes.num_rows == 0:
            return
        ident = sql.Identifier
        log_columns = self.schema.names
        psycopg2.extras.execute_values(
            cur, sql.SQL("INSERT INTO {} ({}) VALUES %s").format(
                ident(self.changelog_table),
                sql.SQL(", ").join(ident(c) for c in log_columns)).as_string(cur),
            self._rows(changes, log_columns), template=self._template(log_columns),
            page_size=_PAGE_SIZE)

        last = last_change_per_key(changes, self.key_columns)
        is_delete = [op == OP_DELETE for op in last.column(OP).to_pylist()]
        deletes = last.filter(pa.array(is_delete))
        upserts = last.filter(pa.array([not d for d in is_delete]))
        if deletes.num_rows:
            keys = self.key_columns
            psycopg2.extras.execute_values(
                cur, sql.SQL("DELETE FROM {} AS t USING (VALUES %s) AS v ({}) WHERE {}").format(
                    ident(self.table), sql.SQL(", ").join(ident(k) for k in keys),
                    sql.SQL(" AND ").join(
                        sql.SQL("t.{k} = v.{k}").format(k=ident(k)) for k in keys),
                ).as_string(cur),
                self._rows(deletes, keys), template=self._template(keys), page_size=_PAGE_SIZE)
        if upserts.num_rows:
            columns = self.current.names
            updates = [c for c in columns if c not in self.key_columns]
            psycopg2.extras.execute_values(
                cur, sql.SQL("INSERT INTO {} ({}) VALUES %s ON CONFLICT ({}) DO UPDATE SET {}")
                .format(ident(self.table), sql.SQL(", ").join(ident(c) for c in columns),
                        sql.SQL(", ").join(ident(k) for k in self.key_columns),
                        sql.SQL(", ").join(sql.SQL("{c} = EXCLUDED.{c}").format(c=ident(c))
                                           for c in updates)).as_string(cur),
                self._rows(upserts, columns), template=self._template(columns),
                page_size=_PAGE_SIZE)

    def _read(self, table: str, schema: pa.Schema, order: list[str]) -> list[dict]:
        try:
            with self._conn, self._conn.cursor() as cur:
                if not self._exists(cur, table):
                    return []
                cur.execute(sql.SQL("SELECT {} FROM {}").format(
                    sql.SQL(", ").join(sql.Identifier(c) for c in schema.names),
                    sql.Identifier(table)))
                rows = cur.fetchall()
        except psycopg2.OperationalError as exc:
            raise self._service_error(f"cannot read {table!r}", exc) from None
        types = [f.type for f in schema]
        result = [{name: (_from_json(v, t) if _is_nested(t) else _from_pg(v, t))
                   for name, v, t in zip(schema.names, row, types, strict=True)}
                  for row in rows]
        return sort_rows(result, order)

    def read_current(self) -> list[dict]:
        """Current rows ordered by key."""
        return self._read(self.table, self.current, self.key_columns)

    def read_changelog(self) -> list[dict]:
        """Every change ordered by ``_commit_seq`` (then key)."""
        return self._read(self.changelog_table, self.schema, [COMMIT_SEQ, *self.key_columns])

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()
