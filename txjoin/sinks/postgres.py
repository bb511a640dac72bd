"""PostgreSQL sink: a current table keyed by the output key, a changelog, and a progress ledger.

One database transaction per micro-batch applies the batch and moves the job's
row in ``txjoin_progress``, so readers see whole batches and a replayed batch
(same ``batch_id`` of the same checkpoint after a crash) is skipped. The batch
is COPYed into its UNLOGGED staging table (:class:`Stage`; in the pipeline by the
Spark tasks that hold its rows, each its part), then applied with one changelog
append, one delete and one upsert (the last change of each key decides), in the
transaction that moves the progress and drops the stage. The progress row
is keyed by the ``job`` string: give each sink its own job name (e.g.
``<job>.<table>`` when a job writes several tables to one database). It holds
``last_batch_id``, ``frontier_commit_seq`` (last released commit sequence),
``last_change_commit_seq``/``last_change_xid`` (the last output change applied),
``checkpoint_id`` (the lineage, see ``txjoin.sinks.lineage``) and ``output_table``
(the table it writes: a second job writing it is refused before it starts).

Every batch first checks the tables' columns against the declared types, so a
table altered underneath fails with the table and column named and nothing of
the batch written. A rebuild writes tables of the same names in schema
``txjoin_rebuild`` and swaps them in (DROP + ALTER TABLE ... SET SCHEMA) in one
transaction with the progress row.

Types: scalars map to native columns; lists, structs and maps become ``jsonb``
with decimals written as JSON numbers (exact, ``numeric`` inside jsonb) and
timestamps as ISO text. Reads convert back by the declared Arrow type, so both
sinks return the same Python values (``Decimal`` for decimals, aware datetimes).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import math
import re
import sys
import time as time_module
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from functools import partial
from typing import Any
from uuid import UUID

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras
import pyarrow as pa
import pyarrow.csv as pa_csv
from psycopg2 import sql

from txjoin import crashpoints
from txjoin.errors import ConfigError, LineageError, ServiceError, SinkSchemaError
from txjoin.join.output import PG_TYPE
from txjoin.sinks import (
    COMMIT_SEQ,
    DEFAULT_RETRY_TIMEOUT_S,
    OP,
    OP_DELETE,
    READ_BATCH_ROWS,
    XID,
    StagedPart,
    Upkeep,
    check_changes_schema,
    conform,
    current_schema,
    sort_rows,
)
from txjoin.sinks.columns import TupleColumns
from txjoin.sinks.lineage import Held, Lineage, short

PROGRESS_TABLE = "txjoin_progress"
CONNECT_TIMEOUT_S = 10


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


def field_pg_type(f: pa.Field) -> str:
    """PostgreSQL column type for an output field: the source's own type where the job's
    output schema names it (``txjoin.join.output.PG_TYPE``: uuid, json, jsonb, numeric
    held as Arrow text), else :func:`pg_type` of its Arrow type."""
    native = (f.metadata or {}).get(PG_TYPE)
    return native.decode() if native else pg_type(f.type, f.name)


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
    if pa.types.is_duration(t):
        return "interval"
    raise ConfigError(f"postgres sink: column {column!r} has type {t}, which has no "
                      "PostgreSQL mapping; cast it in the job's output")


# -- jsonb encoding, driven by the Arrow type --------------------------------


def _json_text(value: Any, t: pa.DataType) -> str:
    """JSON text of ``value``; decimals stay exact JSON numbers (json.dumps cannot)."""
    return _json_encoder(t)(value)


def _scalar_json(value: Any) -> str:
    if isinstance(value, Decimal):
        return format(value, "f") if value.is_finite() else "null"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else "null"
    if isinstance(value, datetime | date | time):
        return json.dumps(value.isoformat())
    if isinstance(value, bytes):
        return json.dumps(base64.b64encode(value).decode("ascii"))
    if isinstance(value, timedelta):  # microseconds, exact (as Debezium's MicroDuration)
        return str(value // timedelta(microseconds=1))
    return json.dumps(value)


def _json_encoder(t: pa.DataType) -> Callable[[Any], str]:
    """An encoder for values of type ``t``, with the type dispatch done once, not per value."""
    if pa.types.is_struct(t):
        fields = [(json.dumps(t.field(i).name) + ":", t.field(i).name,
                   _json_encoder(t.field(i).type)) for i in range(t.num_fields)]

        def struct(value: Any) -> str:
            if value is None:
                return "null"
            return "{" + ",".join(prefix + encode(value.get(name))
                                  for prefix, name, encode in fields) + "}"
        return struct
    if pa.types.is_map(t):
        key, item = _json_encoder(t.key_type), _json_encoder(t.item_type)

        def mapping(value: Any) -> str:
            if value is None:
                return "null"
            return "[" + ",".join("[" + key(k) + "," + item(v) + "]" for k, v in value) + "]"
        return mapping
    if _is_nested(t):
        element = _json_encoder(t.value_type)

        def listing(value: Any) -> str:
            if value is None:
                return "null"
            return "[" + ",".join(map(element, value)) + "]"
        return listing
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return lambda v: "null" if v is None else json.dumps(v)
    return lambda v: "null" if v is None else _scalar_json(v)


def _exact(t: pa.DataType) -> type | None:
    """The Python type psycopg2's values of a column of Arrow type ``t`` have when they are
    already what :func:`_reader` gives (None: every value is read)."""
    if _is_nested(t):
        return None
    return (int if pa.types.is_integer(t) else str if pa.types.is_string(t)
            or pa.types.is_large_string(t) else None)


def _reader(t: pa.DataType) -> Callable[[Any], Any]:
    """:func:`_from_pg` (or :func:`_from_json`) for one column's type, chosen once: a
    million-row read (verify's) otherwise spends most of its time choosing per value.
    psycopg2's own int and str values are already what Arrow would give."""
    if _is_nested(t):
        return partial(_from_json, t=t)
    exact = _exact(t)
    if exact is None:
        return partial(_from_pg, t=t)
    return lambda v: v if v is None or type(v) is exact else _from_pg(v, t)


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
    if pa.types.is_duration(t) and isinstance(value, int):
        return timedelta(microseconds=value)
    if isinstance(value, memoryview):
        return value.tobytes()
    if pa.types.is_string(t) and not isinstance(value, str):
        # a uuid, json/jsonb or numeric column (field_pg_type) read back as Arrow's text
        return str(value) if isinstance(value, Decimal | UUID) else _document_text(value)
    return value


def _document_text(value: Any) -> str:
    """A parsed json/jsonb document (numbers as Decimal) as text, spaced as PostgreSQL
    prints jsonb."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_document_text(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_document_text(v) for v in value) + "]"
    return _scalar_json(value)


MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1
RETRY_FIRST_DELAY_S, RETRY_MAX_DELAY_S = 0.5, 5.0


class _Lost(Exception):
    """The connection broke during a batch (rolled back): worth a retry."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


REBUILD_SCHEMA = "txjoin_rebuild"
"""Schema of the shadow tables a rebuild writes (same names as the sink's own tables)."""
STAGE_PREFIX = "txjoin_stage_"
"""Name prefix of the UNLOGGED tables the tasks COPY a micro-batch into (:class:`Stage`)."""
_PART, _ROW = "__txjoin_part", "__txjoin_row"

# format_type() spellings of the types pg_type() declares, to check a table against them.
_CATALOG_NAMES = {"timestamptz": "timestamp with time zone",
                  "timestamp": "timestamp without time zone",
                  "time": "time without time zone"}


def _copy_value(t: pa.DataType) -> Callable[[Any], Any] | None:
    """Per-value text for COPY where Arrow's CSV writer has none (``None``: Arrow's is right)."""
    if _is_nested(t):
        encode = _json_encoder(t)
        return lambda v: None if v is None else encode(v)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return lambda v: None if v is None else "\\x" + bytes(v).hex()
    if pa.types.is_duration(t):
        return lambda v: None if v is None else f"{v // timedelta(microseconds=1)} microseconds"
    return None


def connect(dsn: str) -> Any:
    """A connection as the sink uses one: not autocommitting, timestamps in UTC (like the
    Delta sink's), jsonb numbers read as exact decimals."""
    conn = psycopg2.connect(dsn, connect_timeout=CONNECT_TIMEOUT_S)
    conn.autocommit = False
    with conn.cursor() as cur:
        cur.execute("SET TIME ZONE 'UTC'")
    conn.commit()
    psycopg2.extras.register_default_jsonb(conn, loads=partial(json.loads, parse_float=Decimal))
    return conn


@contextlib.contextmanager
def _lost_is_retried(conn: Any) -> Iterator[None]:
    """A connection that broke inside the block (the transaction rolled back) as
    :class:`_Lost`; any other error as it was."""
    try:
        yield
    except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
        if conn.closed or isinstance(exc, psycopg2.InterfaceError):
            # Rolling back on a closed connection replaces the cause: report the cause.
            cause = exc.__context__ if isinstance(exc.__context__, psycopg2.Error) else exc
            raise _Lost(cause) from None
        raise


def _retried(attempt: Callable[[], Any], batch_id: int, where: str, timeout_s: float,
             error: Callable[[str, BaseException], ServiceError]) -> Any:
    """``attempt()``, again on a new connection with bounded exponential backoff while
    PostgreSQL is unreachable, for up to ``timeout_s`` seconds; then ``error``'s one line.
    ``attempt`` reconnects when its connection is closed."""
    deadline = time_module.monotonic() + timeout_s
    delay, warned = RETRY_FIRST_DELAY_S, False
    while True:
        try:
            return attempt()
        except _Lost as lost:
            cause: BaseException = lost.cause
            if not warned:
                print(f"{where}: {cause.__class__.__name__} ({_first_line(cause)}); retrying "
                      f"batch {batch_id} for up to {timeout_s:.0f}s", file=sys.stderr, flush=True)
                warned = True
        except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
            cause = exc  # reconnecting failed: the server is still away
        if time_module.monotonic() + delay > deadline:
            raise error(f"unreachable for {timeout_s:.0f}s, batch {batch_id} not written (the "
                        "checkpoint keeps it: run again once PostgreSQL is back, or raise "
                        "--postgres-retry-timeout)", cause) from None
        time_module.sleep(delay)
        delay = min(delay * 2, RETRY_MAX_DELAY_S)


def stage_name(job: str, checkpoint_id: str | None, batch_id: int) -> str:
    """The staging table of ``job``'s micro-batch ``batch_id`` of checkpoint
    ``checkpoint_id``: digests keep it within PostgreSQL's 63-byte identifiers, and a
    re-run of the batch (same input, same checkpoint) finds the same name."""
    return (f"{STAGE_PREFIX}{_digest(job, 12)}_{_digest(checkpoint_id or '', 8)}_"
            f"{batch_id}")


def _digest(text: str, chars: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:chars]


_TASK_CONNECTIONS: dict[str, Any] = {}
"""A Spark Python worker's connections, by DSN: a worker runs many tasks (reused workers)."""


@dataclass(frozen=True)
class Stage:
    """One micro-batch's staging table, which the tasks holding the batch's output COPY into
    (:meth:`copy`, in a Spark task: picklable, no connection held) and the sink applies to
    its tables with its progress in one transaction (:meth:`PostgresSink.apply`). UNLOGGED:
    written once, read once, dropped in the transaction that applies it."""

    dsn: str
    schema: str
    name: str
    batch_id: int
    table: str  # the sink's table, for messages
    changes: pa.Schema
    pg_types: dict[str, str]
    retry_timeout_s: float

    @property
    def ident(self) -> sql.Composable:
        return sql.Identifier(self.schema, self.name)

    def where(self) -> str:
        return f"postgres sink {self.table!r} (staging table {self.schema}.{self.name})"

    def _error(self, what: str, exc: BaseException) -> ServiceError:
        secret = _password(self.dsn)
        message = str(exc).strip()
        if secret:
            message = message.replace(secret, "***")
        return ServiceError(f"{self.where()} at {mask_dsn(self.dsn)}: {what}: "
                            f"{mask_dsn(message).splitlines()[0] if message else ''}")

    def copy(self, part: int, changes: pa.Table) -> StagedPart:
        """COPY ``changes`` (in commit order) as part ``part`` of the batch, replacing what
        an earlier attempt of the same task wrote; retried like the sink's own writes."""
        changes = conform(changes, self.changes, f"postgres sink {self.table!r}",
                          self.batch_id)
        n = changes.num_rows
        staged = StagedPart(part, n, None if n == 0 else changes.column(COMMIT_SEQ)[n - 1].as_py(),
                            None if n == 0 else changes.column(XID)[n - 1].as_py())
        if n == 0:
            return staged

        def attempt() -> None:
            conn = _TASK_CONNECTIONS.get(self.dsn)
            if conn is None or conn.closed:
                conn = _TASK_CONNECTIONS[self.dsn] = connect(self.dsn)
            try:
                with _lost_is_retried(conn), conn, conn.cursor() as cur:
                    # Two attempts of one task (a retry, a speculative copy) take turns.
                    cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s), %s)",
                                (self.name, part))
                    cur.execute(sql.SQL("DELETE FROM {} WHERE {} = %s").format(
                        self.ident, sql.Identifier(_PART)), (part,))
                    copy_rows(cur, self.ident, self.changes, changes, part)
            except psycopg2.errors.UndefinedTable:
                raise ServiceError(
                    f"{self.where()}: the staging table is gone (dropped by upkeep or another "
                    f"run of this job?); nothing of batch {self.batch_id} was applied; run "
                    "again: the checkpoint re-runs the batch") from None
            except psycopg2.OperationalError as exc:
                raise self._error(f"batch {self.batch_id} not staged", exc) from None

        _retried(attempt, self.batch_id, f"postgres sink {self.table!r}", self.retry_timeout_s,
                 self._error)
        return staged


def copy_rows(cur: Any, target: sql.Composable, schema: pa.Schema, changes: pa.Table,
              part: int) -> None:
    """COPY ``changes`` (of ``schema``) into the staging table ``target`` as part ``part``,
    each row with its position in the part (the order the last change per key follows)."""
    ident = sql.Identifier
    columns = []
    for f in schema:
        column = changes.column(f.name)
        convert = _copy_value(f.type)
        if convert is not None:
            column = pa.array([convert(v) for v in column.to_pylist()], pa.string())
        columns.append(column)
    columns.append(pa.array([part] * changes.num_rows, pa.int32()))
    columns.append(pa.array(range(changes.num_rows), pa.int64()))
    staged = pa.Table.from_arrays(columns, names=[*schema.names, _PART, _ROW])
    buffer = io.BytesIO()
    pa_csv.write_csv(staged, buffer, pa_csv.WriteOptions(include_header=False,
                                                         quoting_style="needed"))
    buffer.seek(0)
    cur.copy_expert(sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv)").format(
        target, sql.SQL(", ").join(ident(c) for c in staged.column_names)).as_string(cur),
        buffer)


def read_progress(dsn: str, schema: str = "public") -> list[dict[str, Any]]:
    """Every job's row of ``txjoin_progress`` in ``schema`` (empty when there is none),
    newest first: what ``txjoin status`` shows of the jobs writing this database."""
    try:
        with contextlib.closing(psycopg2.connect(dsn, connect_timeout=3)) as conn, \
                conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)", (f"{schema}.{PROGRESS_TABLE}",))
            if cur.fetchone()[0] is None:
                return []
            cur.execute(sql.SQL(
                "SELECT job, last_batch_id, frontier_commit_seq, last_change_xid, updated_at, "
                "now() - updated_at FROM {} ORDER BY updated_at DESC").format(
                    sql.Identifier(schema, PROGRESS_TABLE)))
            names = ("job", "last_batch_id", "frontier_commit_seq", "last_change_xid",
                     "updated_at", "age")
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    except psycopg2.Error as exc:
        raise ServiceError(f"cannot read {PROGRESS_TABLE} at {mask_dsn(dsn)}: "
                           f"{_first_line(exc)}") from None


class PostgresSink:
    """Output tables in PostgreSQL via psycopg2; see the module docstring."""

    name = "postgres"

    def __init__(self, dsn: str, table: str, job: str, key_columns: list[str],
                 schema: pa.Schema, retry_timeout_s: float = DEFAULT_RETRY_TIMEOUT_S) -> None:
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
        self.where = repr(table)
        self.key_columns = list(key_columns)
        self.schema = schema
        self.current = current_schema(schema)
        self._pg_types = {f.name: field_pg_type(f) for f in schema}
        self._ready: set[str] = set()
        self._rebuild_id: str | None = None
        self._dsn = dsn
        self.retry_timeout_s = retry_timeout_s
        try:
            self._conn = self._connect()
        except psycopg2.Error as exc:
            raise self._service_error("cannot connect", exc) from None
        with self._conn.cursor() as cur:
            cur.execute("SELECT current_schema()")
            self._home: str = cur.fetchone()[0] or "public"
        self._conn.commit()
        self._target = self._home  # REBUILD_SCHEMA while rebuilding

    def _connect(self) -> Any:
        return connect(self._dsn)

    def _service_error(self, what: str, exc: BaseException) -> ServiceError:
        message = str(exc).strip()
        if self._secret:
            message = message.replace(self._secret, "***")
        return ServiceError(f"postgres sink {self.table!r} at {self.dsn_masked}: {what}: "
                            f"{mask_dsn(message).splitlines()[0] if message else ''}")

    def _id(self, schema: str, table: str) -> sql.Composable:
        return sql.Identifier(schema, table)

    # -- DDL ------------------------------------------------------------------

    def _ensure_tables(self, cur: Any, schema: str) -> None:
        if schema in self._ready:
            return
        ident = sql.Identifier
        if schema != self._home:
            cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident(schema)))
        columns = sql.SQL(", ").join(
            sql.SQL("{} {}").format(ident(f.name), sql.SQL(self._pg_types[f.name]))
            for f in self.current)
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))").format(
            self._id(schema, self.table), columns,
            sql.SQL(", ").join(ident(k) for k in self.key_columns)))
        log_columns = sql.SQL(", ").join(
            sql.SQL("{} {}").format(ident(f.name), sql.SQL(self._pg_types[f.name]))
            for f in self.schema)
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            self._id(schema, self.changelog_table), log_columns))
        self._ensure_progress(cur, schema)
        self._ready.add(schema)

    def _ensure_progress(self, cur: Any, schema: str) -> None:
        progress = self._id(schema, PROGRESS_TABLE)
        cur.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (job text PRIMARY KEY, last_batch_id bigint NOT NULL, "
            "frontier_commit_seq bigint, last_change_commit_seq bigint, last_change_xid bigint, "
            "checkpoint_id text, updated_at timestamptz DEFAULT now())").format(progress))
        cur.execute("SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = %s AND table_name = %s", (schema, PROGRESS_TABLE))
        existing = {r[0] for r in cur.fetchall()}
        # The first layout's names: batch_id, and commit_seq (of the last output change).
        for old, new in (("batch_id", "last_batch_id"), ("commit_seq", "last_change_commit_seq")):
            if old in existing and new not in existing:
                cur.execute(sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}").format(
                    progress, sql.Identifier(old), sql.Identifier(new)))
        for column in ("frontier_commit_seq bigint", "last_change_xid bigint",
                       "checkpoint_id text", "output_table text", "output_types text"):
            cur.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS " + column).format(
                progress))

    def _exists(self, cur: Any, schema: str, table: str) -> bool:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (
            psycopg2.extensions.quote_ident(schema, cur) + "."
            + psycopg2.extensions.quote_ident(table, cur),))
        return bool(cur.fetchone()[0])

    def check_tables(self) -> None:
        """The check every write makes (:meth:`_check_columns`), before a run starts Spark:
        the sink's tables, once they exist, hold every declared column with its type."""
        try:
            with self._conn, self._conn.cursor() as cur:
                if all(self._exists(cur, self._home, t)
                       for t in (self.table, self.changelog_table)):
                    self._check_columns(cur, self._home, "nothing was written")
        except psycopg2.OperationalError as exc:
            raise self._service_error("cannot read the sink's tables", exc) from None

    def _check_columns(self, cur: Any, schema: str,
                       nothing: str = "nothing of this batch was written") -> None:
        """Every declared column present with its declared type, else a one-line error."""
        for table, fields in ((self.table, self.current), (self.changelog_table, self.schema)):
            cur.execute("SELECT a.attname, format_type(a.atttypid, a.atttypmod) "
                        "FROM pg_attribute a WHERE a.attrelid = %s::regclass "
                        "AND a.attnum > 0 AND NOT a.attisdropped",
                        (psycopg2.extensions.quote_ident(schema, cur) + "."
                         + psycopg2.extensions.quote_ident(table, cur),))
            actual = dict(cur.fetchall())
            for f in fields:
                declared = self._pg_types[f.name]
                expected = _CATALOG_NAMES.get(declared, declared)
                found = actual.get(f.name)
                if found == expected:
                    continue
                if found is not None and self._wrote_as(cur, schema, f.name) == found:
                    # The sink is as this job's runs made it: the job's types changed.
                    raise SinkSchemaError(
                        f"postgres sink table {schema}.{table}: column {f.name!r} has type "
                        f"{found}, as this job wrote it, and the job now writes {expected}: "
                        f"the job's declared types changed, not the sink; {nothing}; run "
                        f"with --rebuild to rewrite the sink's tables with the new types, or "
                        f"declare the type as before in the job file")
                what = ("is missing" if found is None
                        else f"has type {found}, the job writes {expected}")
                raise SinkSchemaError(
                    f"postgres sink table {schema}.{table}: column {f.name!r} {what}; "
                    f"{nothing}; restore the column (ALTER TABLE) and run "
                    f"again, or run with --rebuild to recreate the sink's tables")

    def _written_types(self) -> str:
        """The columns' types as the catalog spells them, recorded with the progress: what a
        later check tells a changed job from a sink altered underneath with."""
        return json.dumps({c: _CATALOG_NAMES.get(t, t) for c, t in self._pg_types.items()},
                          sort_keys=True)

    def _wrote_as(self, cur: Any, schema: str, column: str) -> str | None:
        """The type this job's last write recorded for ``column`` (None: not recorded)."""
        self._ensure_progress(cur, schema)
        cur.execute(sql.SQL("SELECT output_types FROM {} WHERE job = %s").format(
            self._id(schema, PROGRESS_TABLE)), (self.job,))
        row = cur.fetchone()
        if row is None or row[0] is None:
            return None
        return json.loads(row[0]).get(column)

    # -- Sink protocol ----------------------------------------------------------

    def _progress_row(self, query: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The first row of ``query`` (``{}``: the progress table) over ``txjoin_progress``,
        brought to today's columns first; None without a progress table or a row."""
        try:
            with self._conn, self._conn.cursor() as cur:
                if not self._exists(cur, self._home, PROGRESS_TABLE):
                    return None
                self._ensure_progress(cur, self._home)
                cur.execute(sql.SQL(query).format(self._id(self._home, PROGRESS_TABLE)),
                            params)
                row = cur.fetchone()
        except psycopg2.OperationalError as exc:
            raise self._service_error("cannot read progress", exc) from None
        return None if row is None else tuple(row)

    def held(self) -> Held | None:
        """The job's row in ``txjoin_progress``."""
        row = self._progress_row(
            "SELECT last_batch_id, frontier_commit_seq, last_change_xid, checkpoint_id "
            "FROM {} WHERE job = %s", (self.job,))
        if row is None:
            return None
        return Held(checkpoint_id=row[3], last_batch_id=int(row[0]),
                    frontier_commit_seq=row[1], last_change_xid=row[2])

    def other_owner(self) -> tuple[str, str] | None:
        """Another job whose row in ``txjoin_progress`` records this sink's table as its
        output (rows written before the table was recorded name none)."""
        row = self._progress_row(
            "SELECT job FROM {} WHERE output_table = %s AND job <> %s "
            "ORDER BY updated_at DESC LIMIT 1", (self.table, self.job))
        if row is None:
            return None
        tables = f"{self._home}.{self.table}, {self._home}.{self.changelog_table}"
        return str(row[0]), (f"DROP TABLE {tables}; DELETE FROM {self._home}.{PROGRESS_TABLE} "
                             f"WHERE job = '{row[0]}'")

    def last_applied_batch(self) -> int | None:
        """The job's last batch id in ``txjoin_progress``."""
        held = self.held()
        return None if held is None or held.last_batch_id < 0 else held.last_batch_id

    def write(self, batch_id: int, changes: pa.Table, lineage: Lineage | None = None) -> bool:
        """Apply one micro-batch and its progress in one transaction; False on replay.

        The same steps as a batch the pipeline's tasks write (:meth:`stage`, the stage's
        ``copy``, :meth:`apply`), with the rows COPYed from here. A lost connection
        (PostgreSQL restarting, a network cut) rolls the step back; it is retried on a new
        connection with bounded exponential backoff for up to ``retry_timeout_s`` seconds.
        A commit whose acknowledgement was lost is found in the progress row and not
        applied twice.
        """
        stage = self.stage(batch_id, None if lineage is None else lineage.checkpoint_id)
        if stage is None:
            return False
        return self.apply(stage, [stage.copy(0, changes)], lineage)

    def _retried(self, attempt: Callable[[], Any], batch_id: int) -> Any:
        def again() -> Any:
            if self._conn.closed:
                self._conn = self._connect()
                self._ready.clear()
            try:
                with _lost_is_retried(self._conn):
                    return attempt()
            except _Lost:
                self._ready.clear()  # the DDL may have been rolled back with the batch
                raise
        return _retried(again, batch_id, f"postgres sink {self.table!r}", self.retry_timeout_s,
                        self._service_error)

    def _locked_progress(self, cur: Any, schema: str, batch_id: int,
                         checkpoint: str | None) -> bool:
        """Inside a transaction: the job's progress row locked; whether the sink holds
        ``batch_id`` already (a replay); a sink of another checkpoint refused."""
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.job,))
        cur.execute(sql.SQL("SELECT last_batch_id, checkpoint_id FROM {} WHERE job = %s "
                            "FOR UPDATE").format(self._id(schema, PROGRESS_TABLE)), (self.job,))
        row = cur.fetchone()
        if row is not None and checkpoint and row[1] and row[1] != checkpoint:
            held = self._held_in(cur, schema)
            raise LineageError(
                f"postgres sink {self.table!r} holds {held.describe()}, not of this run's "
                f"checkpoint {short(checkpoint)}; nothing written; run with "
                "--rebuild, or restore the checkpoint the sink was written with")
        return row is not None and batch_id <= row[0]

    def stage(self, batch_id: int, checkpoint_id: str | None) -> Stage | None:
        """The staging table of micro-batch ``batch_id`` (created empty, replacing one a
        killed run of the batch left), for the tasks to COPY the batch into; ``None`` when
        the sink holds the batch already (Spark re-ran it): nothing to stage."""
        schema = self._target
        stage = Stage(self._dsn, schema, stage_name(self.job, checkpoint_id, batch_id), batch_id,
                      self.table, self.schema, self._pg_types, self.retry_timeout_s)
        ident = sql.Identifier

        def attempt() -> Stage | None:
            with self._conn, self._conn.cursor() as cur:
                self._ensure_tables(cur, schema)
                if self._locked_progress(cur, schema, batch_id, checkpoint_id):
                    return None
                cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(stage.ident))
                cur.execute(sql.SQL("CREATE UNLOGGED TABLE {} ({}, {} integer, {} bigint)").format(
                    stage.ident, sql.SQL(", ").join(
                        sql.SQL("{} {}").format(ident(f.name), sql.SQL(self._pg_types[f.name]))
                        for f in self.schema), ident(_PART), ident(_ROW)))
            return stage

        try:
            result: Stage | None = self._retried(attempt, batch_id)
            return result
        except psycopg2.OperationalError as exc:
            raise self._service_error(f"batch {batch_id} not staged", exc) from None

    def apply(self, stage: Stage, staged: list[StagedPart], lineage: Lineage | None) -> bool:
        """Apply the staged batch (its changelog append, one delete and one upsert) and the
        sink's progress in one transaction, which drops the staging table: a reader sees the
        batch whole or not at all. ``staged``: what the tasks COPYed (checked against the
        table: PostgreSQL empties UNLOGGED tables when it recovers from a crash). False, with
        the stage dropped, when the sink holds the batch already."""
        batch_id, schema = stage.batch_id, stage.schema
        crashpoints.reached(crashpoints.POSTGRES_STAGED, batch_id)  # tests only
        rows = sum(p.rows for p in staged)
        last = max((p for p in staged if p.rows), default=None,
                   key=lambda p: (p.last_commit_seq, p.part))

        def attempt() -> bool:
            with self._conn, self._conn.cursor() as cur:
                self._ensure_tables(cur, schema)
                if self._locked_progress(cur, schema, batch_id,
                                         None if lineage is None else lineage.checkpoint_id):
                    cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(stage.ident))
                    return False
                self._check_columns(cur, schema)
                cur.execute(sql.SQL("SELECT count(*) FROM {}").format(stage.ident))
                (found,) = cur.fetchone()
                if found != rows:
                    raise ServiceError(
                        f"{stage.where()} holds {found} rows, the tasks staged {rows} (an "
                        "UNLOGGED table is emptied when PostgreSQL recovers from a crash); "
                        f"nothing of batch {batch_id} was applied; run again: the checkpoint "
                        "re-runs the batch")
                if rows:
                    self._apply(cur, schema, stage.ident)
                crashpoints.reached(crashpoints.POSTGRES_APPLIED, batch_id)  # tests only
                cur.execute(sql.SQL(
                    "INSERT INTO {} AS p (job, last_batch_id, frontier_commit_seq, "
                    "last_change_commit_seq, last_change_xid, checkpoint_id, output_table, "
                    "output_types, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, now()) "
                    "ON CONFLICT (job) DO UPDATE SET output_table = EXCLUDED.output_table, "
                    "output_types = EXCLUDED.output_types, "
                    "last_batch_id = EXCLUDED.last_batch_id, "
                    "frontier_commit_seq = COALESCE(EXCLUDED.frontier_commit_seq, "
                    "p.frontier_commit_seq), "
                    "last_change_commit_seq = COALESCE(EXCLUDED.last_change_commit_seq, "
                    "p.last_change_commit_seq), "
                    "last_change_xid = COALESCE(EXCLUDED.last_change_xid, p.last_change_xid), "
                    "checkpoint_id = COALESCE(EXCLUDED.checkpoint_id, p.checkpoint_id), "
                    "updated_at = now()").format(self._id(schema, PROGRESS_TABLE)),
                    (self.job, batch_id,
                     None if lineage is None else lineage.frontier_commit_seq,
                     None if last is None else last.last_commit_seq,
                     None if last is None else last.last_xid,
                     None if lineage is None else lineage.checkpoint_id,
                     self.table, self._written_types()))
                cur.execute(sql.SQL("DROP TABLE {}").format(stage.ident))
            return True

        try:
            applied: bool = self._retried(attempt, batch_id)
            return applied
        except psycopg2.OperationalError as exc:
            raise self._service_error(f"batch {batch_id} not written", exc) from None
        except (psycopg2.errors.UndefinedColumn, psycopg2.errors.DatatypeMismatch,
                psycopg2.errors.UndefinedTable) as exc:
            self._ready.clear()
            raise SinkSchemaError(
                f"postgres sink table {self.table!r} does not match the job's output: "
                f"{str(exc).splitlines()[0]}; nothing of batch {batch_id} was written; repair "
                "the table or run with --rebuild") from None

    def _held_in(self, cur: Any, schema: str) -> Held:
        cur.execute(sql.SQL(
            "SELECT last_batch_id, frontier_commit_seq, last_change_xid, checkpoint_id "
            "FROM {} WHERE job = %s").format(self._id(schema, PROGRESS_TABLE)), (self.job,))
        row = cur.fetchone()
        return Held(row[3], int(row[0]), row[1], row[2])

    def _apply(self, cur: Any, schema: str, stage: sql.Composable) -> None:
        """Changelog append, one delete and one upsert, all from the staged batch, in one
        statement (the last change per key sorted out once; the deleted and the upserted
        keys are apart, so neither part needs to see the other's effect). Commit order:
        ``_commit_seq``, then part, then position; a key's changes are in one part."""
        ident = sql.Identifier
        join = sql.SQL(", ")
        log_columns = join.join(ident(c) for c in self.schema.names)
        keys = join.join(ident(k) for k in self.key_columns)
        columns = self.current.names
        updates = [c for c in columns if c not in self.key_columns]
        on_conflict = (sql.SQL("DO UPDATE SET {}").format(join.join(
            sql.SQL("{c} = EXCLUDED.{c}").format(c=ident(c)) for c in updates))
            if updates else sql.SQL("DO NOTHING"))
        # The last change of each key decides: a delete deletes, anything else upserts.
        cur.execute(sql.SQL(
            "WITH last AS MATERIALIZED (SELECT DISTINCT ON ({keys}) * FROM {stage} "
            "ORDER BY {keys}, {seq} DESC, {row} DESC), "
            "logged AS (INSERT INTO {log} ({log_columns}) SELECT {log_columns} FROM {stage} "
            "ORDER BY {seq}, {part}, {row}), "
            "deleted AS (DELETE FROM {current} AS t USING last AS s WHERE s.{op} = %s AND {on}) "
            "INSERT INTO {current} ({columns}) SELECT {values} FROM last AS s WHERE s.{op} <> %s "
            "ON CONFLICT ({keys}) {on_conflict}").format(
                keys=keys, stage=stage, seq=ident(COMMIT_SEQ), row=ident(_ROW),
                part=ident(_PART), log=self._id(schema, self.changelog_table),
                log_columns=log_columns, current=self._id(schema, self.table), op=ident(OP),
                on=sql.SQL(" AND ").join(sql.SQL("t.{k} = s.{k}").format(k=ident(k))
                                         for k in self.key_columns),
                columns=join.join(ident(c) for c in columns),
                values=join.join(sql.SQL("s.{}").format(ident(c)) for c in columns),
                on_conflict=on_conflict), (OP_DELETE, OP_DELETE))

    # -- rebuild ----------------------------------------------------------------

    def begin_rebuild(self, checkpoint_id: str) -> None:
        """Write into empty tables of the same names in schema ``txjoin_rebuild``."""
        try:
            with self._conn, self._conn.cursor() as cur:
                cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                    sql.Identifier(REBUILD_SCHEMA)))
                cur.execute(sql.SQL("DROP TABLE IF EXISTS {}, {}").format(
                    self._id(REBUILD_SCHEMA, self.table),
                    self._id(REBUILD_SCHEMA, self.changelog_table)))
                if self._exists(cur, REBUILD_SCHEMA, PROGRESS_TABLE):
                    cur.execute(sql.SQL("DELETE FROM {} WHERE job = %s").format(
                        self._id(REBUILD_SCHEMA, PROGRESS_TABLE)), (self.job,))
        except psycopg2.OperationalError as exc:
            raise self._service_error("cannot start the rebuild", exc) from None
        self._ready.discard(REBUILD_SCHEMA)
        self._target, self._rebuild_id = REBUILD_SCHEMA, checkpoint_id

    def finish_rebuild(self) -> None:
        """Swap the shadow tables in and move their progress row, in one transaction."""
        if self._rebuild_id is None:
            return
        home, shadow = self._home, REBUILD_SCHEMA
        try:
            with self._conn, self._conn.cursor() as cur:
                self._ensure_tables(cur, shadow)  # a source with nothing yet still swaps
                cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.job,))
                cur.execute(sql.SQL(
                    "SELECT last_batch_id, frontier_commit_seq, last_change_commit_seq, "
                    "last_change_xid, checkpoint_id FROM {} WHERE job = %s").format(
                        self._id(shadow, PROGRESS_TABLE)), (self.job,))
                row = cur.fetchone() or (-1, None, None, None, self._rebuild_id)
                # Readers of the old tables finish first (DROP waits for their locks);
                # readers after the commit see only the new tables.
                cur.execute(sql.SQL("DROP TABLE IF EXISTS {}, {}").format(
                    self._id(home, self.table), self._id(home, self.changelog_table)))
                for table in (self.table, self.changelog_table):
                    cur.execute(sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(
                        self._id(shadow, table), sql.Identifier(home)))
                self._ensure_progress(cur, home)
                cur.execute(sql.SQL(
                    "INSERT INTO {} (job, last_batch_id, frontier_commit_seq, "
                    "last_change_commit_seq, last_change_xid, checkpoint_id, output_table, "
                    "output_types, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, now()) "
                    "ON CONFLICT (job) DO UPDATE SET "
                    "last_batch_id = EXCLUDED.last_batch_id, "
                    "frontier_commit_seq = EXCLUDED.frontier_commit_seq, "
                    "last_change_commit_seq = EXCLUDED.last_change_commit_seq, "
                    "last_change_xid = EXCLUDED.last_change_xid, "
                    "checkpoint_id = EXCLUDED.checkpoint_id, "
                    "output_table = EXCLUDED.output_table, "
                    "output_types = EXCLUDED.output_types, updated_at = now()").format(
                        self._id(home, PROGRESS_TABLE)),
                    (self.job, *row, self.table, self._written_types()))
                cur.execute(sql.SQL("DELETE FROM {} WHERE job = %s").format(
                    self._id(shadow, PROGRESS_TABLE)), (self.job,))
        except psycopg2.OperationalError as exc:
            raise self._service_error("rebuild not swapped in", exc) from None
        self._ready.clear()
        self._target, self._rebuild_id = home, None

    # -- reads ------------------------------------------------------------------

    def _read(self, table: str, schema: pa.Schema, order: list[str]) -> list[dict]:
        try:
            with self._conn, self._conn.cursor() as cur:
                if not self._exists(cur, self._home, table):
                    return []
                cur.execute(sql.SQL("SELECT {} FROM {}").format(
                    sql.SQL(", ").join(sql.Identifier(c) for c in schema.names),
                    self._id(self._home, table)))
                rows = cur.fetchall()
        except psycopg2.OperationalError as exc:
            raise self._service_error(f"cannot read {table!r}", exc) from None
        return sort_rows(self._rows_of(schema, rows), order)

    def read_current(self) -> list[dict]:
        """Current rows ordered by key."""
        return self._read(self.table, self.current, self.key_columns)

    def read_changelog(self) -> list[dict]:
        """Every change ordered by ``_commit_seq`` (then key)."""
        return self._read(self.changelog_table, self.schema, [COMMIT_SEQ, *self.key_columns])

    def _rows_of(self, schema: pa.Schema, rows: list[tuple[Any, ...]]) -> list[dict]:
        """Rows as read from PostgreSQL -> the Python values :meth:`read_current` gives."""
        readers = [_reader(f.type) for f in schema]
        names = schema.names
        return [{name: read(v) for name, read, v in zip(names, readers, row, strict=True)}
                for row in rows]

    def _current_tuples(self, rows: int) -> Iterator[list[tuple[Any, ...]]]:
        """The current table's rows in key order, as psycopg2 returns them."""
        order = sql.SQL(", ").join(
            sql.SQL("{} COLLATE \"C\"" if field_pg_type(self.current.field(k)) == "text"
                    else "{}").format(sql.Identifier(k)) for k in self.key_columns)
        try:
            with self._conn:
                with self._conn.cursor() as cur:
                    if not self._exists(cur, self._home, self.table):
                        return
                with self._conn.cursor(name="txjoin_verify_current") as cur:
                    cur.itersize = rows
                    cur.execute(sql.SQL("SELECT {} FROM {} ORDER BY {}").format(
                        sql.SQL(", ").join(sql.Identifier(c) for c in self.current.names),
                        self._id(self._home, self.table), order))
                    while batch := cur.fetchmany(rows):
                        yield batch
        except psycopg2.OperationalError as exc:
            raise self._service_error(f"cannot read {self.table!r}", exc) from None

    def read_current_batches(self, rows: int = READ_BATCH_ROWS) -> Iterator[list[dict]]:
        """Current rows in key order (text by code point, NULLs last), ``rows`` at a time
        from a server-side cursor: the table never sits whole in Python."""
        for batch in self._current_tuples(rows):
            yield self._rows_of(self.current, batch)

    def read_current_columns(self, rows: int = READ_BATCH_ROWS) -> Iterator[TupleColumns]:
        """What :meth:`read_current_batches` gives, a batch at a time column by column."""
        readers = [(_exact(f.type), _reader(f.type)) for f in self.current]
        for batch in self._current_tuples(rows):
            yield TupleColumns(list(self.current.names), batch, readers)

    def changelog_repeats(self) -> tuple[int, list[tuple[Any, ...]]]:
        """The changelog's rows, and its (key..., ``_commit_seq``) held more than once,
        counted by PostgreSQL."""
        columns = [*self.key_columns, COMMIT_SEQ]
        listed = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        try:
            with self._conn, self._conn.cursor() as cur:
                if not self._exists(cur, self._home, self.changelog_table):
                    return 0, []
                table = self._id(self._home, self.changelog_table)
                cur.execute(sql.SQL("SELECT count(*) FROM {}").format(table))
                (total,) = cur.fetchone()
                cur.execute(sql.SQL("SELECT {} FROM {} GROUP BY {} HAVING count(*) > 1").format(
                    listed, table, listed))
                repeated = cur.fetchall()
        except psycopg2.OperationalError as exc:
            raise self._service_error(f"cannot read {self.changelog_table!r}", exc) from None
        schema = pa.schema([self.schema.field(c) for c in columns])
        return int(total), sorted(tuple(r[c] for c in columns)
                                  for r in self._rows_of(schema, repeated))

    def maintain(self, retention_hours: float | None = None) -> list[Upkeep]:
        """Drop the staging tables killed runs of this job left (killed after their tasks
        staged a batch, before it was applied: a run re-running that batch replaces its
        own), in the sink's schema and the rebuild's; one :class:`Upkeep` counting them.
        Run between batches (no batch of the job staged meanwhile). PostgreSQL's autovacuum
        reclaims what the upserts leave behind."""
        started = time_module.monotonic()
        prefix = f"{STAGE_PREFIX}{_digest(self.job, 12)}_"
        try:
            with self._conn, self._conn.cursor() as cur:
                cur.execute("SELECT schemaname, tablename FROM pg_tables WHERE schemaname IN "
                            "(%s, %s) AND starts_with(tablename, %s)",
                            (self._home, REBUILD_SCHEMA, prefix))
                left = cur.fetchall()
                for schema, table in left:
                    cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(
                        self._id(schema, table)))
        except psycopg2.OperationalError as exc:
            raise self._service_error("cannot drop staging tables", exc) from None
        return [Upkeep(f"postgres {self._home}.{self.table}", 0, 0, len(left), 0,
                       time_module.monotonic() - started, kind="staging tables")]

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()
