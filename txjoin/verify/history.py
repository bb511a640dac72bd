"""verify's own record of a source database's history, for ``as_of_fact`` jobs.

An ``as_of_fact`` job's row for a fact is the job evaluated as of the commit that last
changed that fact (DESIGN §1): only the database's history can say what the looked-up
rows were then. Workloads txjoin writes leave that answer in ``<fact>_expected``; for a
workload verify did not write, this module keeps the history itself, from PostgreSQL's
logical decoding, independent of txjoin's engine and of Debezium:

- ``verify --record`` creates the slot ``txjoin_verify`` (plugin ``test_decoding``,
  shipped with PostgreSQL) over the replication protocol, exporting the slot's snapshot,
  and copies the job's tables at exactly that snapshot: the state S_0 the slot's first
  change applies to.
- Each verify reads the slot's new transactions (``pg_logical_slot_peek_changes``),
  appends them to the record file (fsynced), and only then advances the slot
  (``pg_replication_slot_advance``): a verify that dies in between reads the same
  transactions again and skips those already whole in the file (by xid). One that died
  in the middle of an append left a transaction without its COMMIT line (or a line cut
  short) at the file's end: the next verify cuts it off and appends it again, whole,
  from the slot, which was not advanced past it.

The record is a JSON-lines file in the stack directory (``<dir>/verify/``), not a table
in the source database: verify writes nothing into the user's database but its slot
(a table there would be decoded by the slot itself and, with a ``FOR ALL TABLES``
publication, captured by Debezium too), and the file survives the stack's restarts. The
raw ``test_decoding`` lines are kept, so a decoding fix applies to old records too.

Beside it, ``<record>.parsed`` keeps the record as parsed (:class:`ParsedRecord`, plain
data in :mod:`marshal`) up to its last whole transaction, with that prefix's length and
SHA-256 and the SHA-256 of this module's source: a later verify parses only the lines
appended since (parsing the whole file was most of an ``as_of_fact`` verify's time:
issue 73). It is a cache, never the record: any mismatch (the record rewritten, cut, or
started again; this module changed; the cache torn or of another version; tables it did
not decode) and it is rebuilt from the record.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import marshal
import os
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, NamedTuple

import psycopg2
import psycopg2.extensions
import psycopg2.extras

from txjoin import crashpoints
from txjoin.errors import ConfigError
from txjoin.verify.source_tables import CHANGE_LOG, COMMIT_LOG

SLOT = "txjoin_verify"
"""verify's logical replication slot in a recorded source database."""
PLUGIN = "test_decoding"
RECORD_DIR = "verify"
"""Under the stack directory: one record file per recorded database."""

# Our session's settings are the decoding's (the plugin runs the types' output functions in
# the calling backend): timestamps in UTC, intervals in ISO 8601, as verify reads them.
_SESSION = "SET TIME ZONE 'UTC'; SET intervalstyle = 'iso_8601'; SET datestyle = 'ISO'"

Column = tuple[str, str | None]
"""(PostgreSQL type name as test_decoding prints it, value text or None for NULL)."""


# -- test_decoding's text format ------------------------------------------------------------
# (contrib/test_decoding: "table SCHEMA.NAME: OP: col[type]:value ..."; a value is
# `null`, an unquoted literal for numbers and booleans, else single-quoted with '' for '.
# An UPDATE of a table with an old tuple prints "old-key: ... new-tuple: ...".)

_TABLE = re.compile(r"table (?P<table>.+?): (?P<op>INSERT|UPDATE|DELETE|TRUNCATE):(?: |$)")
_COLUMN = re.compile(r' *(?P<name>"(?:[^"]|"")+"|[^\[\s]+)\[(?P<type>[^\]]+(?:\[\])*)\]:'
                     r"(?:'(?P<quoted>(?:[^']|'')*)'|(?P<bare>[^ ]*))")


class DecodedChange(NamedTuple):
    """One row change as test_decoding printed it (a tuple: a record holds one per row
    change, made again from the parsed record at each verify)."""

    table: str
    op: str
    """INSERT, UPDATE, DELETE or TRUNCATE."""
    old: dict[str, Column] | None
    """The old tuple (old-key: the replica identity, nulls left out), if printed."""
    new: dict[str, Column] | None


def _columns(text: str) -> tuple[dict[str, Column], str]:
    """Parse ``name[type]:value ...`` from the start of ``text``; the rest unparsed. One
    match per column, its value included (a quoted one with ``''`` for ``'``): the record's
    every line is parsed at each verify."""
    columns: dict[str, Column] = {}
    pos = 0
    while (m := _COLUMN.match(text, pos)) is not None:
        name = m["name"]
        if name.startswith('"'):
            name = name[1:-1].replace('""', '"')
        quoted = m["quoted"]
        value = (quoted.replace("''", "'") if quoted is not None
                 else None if m["bare"] == "null" else m["bare"])
        columns[name] = (m["type"], value)
        pos = m.end()
    return columns, text[pos:].strip()


def decode_change(data: str, tables: Collection[str] | None = None) -> DecodedChange | None:
    """One line of test_decoding's output; None for BEGIN/COMMIT and other lines, and for
    a change of a table not in ``tables`` (given), whose columns are then not parsed."""
    m = _TABLE.match(data)
    if m is None:
        return None
    table, op, rest = m["table"], m["op"], data[m.end():]
    if tables is not None and table not in tables:
        return None
    if op == "TRUNCATE" or rest.startswith("(no-tuple-data)"):
        return DecodedChange(table, op, None, None)
    old = None
    if rest.startswith("old-key: "):
        old, rest = _columns(rest[len("old-key: "):])
        if not rest.startswith("new-tuple: "):
            raise ValueError(f"test_decoding line without new-tuple: {data[:200]!r}")
        rest = rest[len("new-tuple: "):]
    row, _ = _columns(rest)
    if op == "DELETE":
        return DecodedChange(table, op, row, None)
    return DecodedChange(table, op, old, row)


def parse_array(text: str) -> list[str | None]:
    """A one-dimensional PostgreSQL array literal (``{a,"b,c",NULL}``) as its elements' text."""
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"not an array literal: {text!r}")
    body, pos = text[1:-1], 0
    items: list[str | None] = []
    if not body:
        return []
    while pos <= len(body):
        if body.startswith('"', pos):
            chars, pos = [], pos + 1
            while body[pos] != '"':
                if body[pos] == "\\":
                    pos += 1
                chars.append(body[pos])
                pos += 1
            items.append("".join(chars))
            pos += 1
        else:
            end = body.find(",", pos)
            end = len(body) if end < 0 else end
            token = body[pos:end]
            items.append(None if token == "NULL" else token)
            pos = end
        pos += 1  # the comma
    return items


_INTEGERS = frozenset({"smallint", "integer", "bigint"})
_NUMBERS = frozenset({"numeric", "real", "double precision"})


def column_value(pg_type: str, text: str | None) -> Any:
    """A value's text as ``to_jsonb`` gives it to verify (the change log's form, which
    verify's readers take): numbers and booleans as such, arrays as lists, json parsed,
    everything else (dates, times, money, bytea's ``\\x`` hex, uuids, enums) as its text."""
    if text is None:
        return None
    if pg_type.endswith("[]"):
        return [column_value(pg_type[:-2], item) for item in parse_array(text)]
    if pg_type == "boolean":
        return text in ("true", "t")
    if pg_type in _INTEGERS:
        return int(text)
    if pg_type in _NUMBERS:
        return Decimal(text)
    if pg_type in ("json", "jsonb"):
        return json.loads(text, parse_float=Decimal)
    return text


def row_values(columns: Mapping[str, Column] | None) -> dict[str, Any] | None:
    """A decoded tuple as a row of values (see :func:`column_value`)."""
    if columns is None:
        return None
    return {name: column_value(typ, text) for name, (typ, text) in columns.items()}


# -- the record ------------------------------------------------------------------------------


def record_path(directory: Path, dsn: str) -> Path:
    """Where verify keeps its record of the database ``dsn`` names."""
    params = psycopg2.extensions.parse_dsn(dsn)
    name = "-".join(str(params.get(k, "")) for k in ("host", "port", "dbname"))
    return Path(directory) / RECORD_DIR / (re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".jsonl")


@contextlib.contextmanager
def _connect(dsn: str, **kwargs: Any) -> Iterator[Any]:
    try:
        conn = psycopg2.connect(dsn, connect_timeout=5, **kwargs)
    except psycopg2.OperationalError as exc:
        raise ConfigError(f"cannot connect to the source database for verify's record: "
                          f"{' '.join(str(exc).split())}; is the DSN right?") from None
    try:
        yield conn
    finally:
        conn.close()


def _slot_exists(cur: Any) -> bool:
    cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND database = "
                "current_database()", (SLOT,))
    return cur.fetchone() is not None


def start_record(dsn: str, directory: Path, tables: Sequence[str]) -> Path:
    """Create verify's slot on ``dsn`` and copy ``tables`` at the slot's own snapshot.

    The replication protocol's ``CREATE_REPLICATION_SLOT ... EXPORT_SNAPSHOT`` gives the
    snapshot the slot's first decoded transaction follows, so the copy plus the decoded
    transactions is the whole history from then on (a plain ``pg_create_logical_
    replication_slot`` and a copy would race with writers in between).
    """
    path = record_path(directory, dsn)
    with _connect(dsn) as conn, conn.cursor() as cur:
        if _slot_exists(cur):
            raise ConfigError(f"the source database already has verify's slot {SLOT}: it is "
                              f"recording (its record: {path}); `txjoin verify JOB "
                              f"--drop-record` first to start a new one")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection
                  ) as repl, repl.cursor() as rcur:
        try:
            rcur.execute(f"CREATE_REPLICATION_SLOT {SLOT} LOGICAL {PLUGIN} EXPORT_SNAPSHOT")
        except psycopg2.Error as exc:
            raise ConfigError(f"cannot create verify's slot {SLOT} on the source database: "
                              f"{' '.join(str(exc).split())}; the user needs REPLICATION and "
                              f"the server wal_level=logical and a free max_replication_slots"
                              ) from None
        _slot, lsn, snapshot, _plugin = rcur.fetchone()
        snap: dict[str, list[dict[str, Column]]] = {}
        try:
            with _connect(dsn) as conn, conn.cursor() as cur:
                cur.execute(_SESSION)
                conn.commit()
                cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
                for table in tables:
                    snap[table] = _table_rows(cur, table)
                conn.rollback()
        except BaseException:
            rcur.execute(f"DROP_REPLICATION_SLOT {SLOT}")
            raise
    parsed_path(path).unlink(missing_ok=True)  # of an earlier record (never read: its digest)
    with path.open("w") as out:
        out.write(json.dumps({"slot": SLOT, "lsn": lsn, "snapshot": snap}) + "\n")
        out.flush()
        os.fsync(out.fileno())  # whole before a verify appends to it
    return path



def _entries(data: bytes, pos: int) -> Iterator[tuple[dict[str, Any], int]]:
    """The record's JSON lines from byte ``pos``, each with the byte after it; a last line
    cut short (no newline: an append killed in the middle) is not one."""
    while (end := data.find(b"\n", pos)) >= 0:
        yield json.loads(data[pos:end]), end + 1
        pos = end + 1


def _whole_transactions(path: Path, start: int | None = None) -> set[int]:
    """The xids of the record's whole transactions (BEGIN ... COMMIT) from byte ``start``
    (the end of a whole transaction; default: the header's end), after cutting off what
    follows its last COMMIT: a verify killed in the middle of an append left there a
    transaction without its COMMIT, or a line cut short. The slot was not advanced past
    that transaction (the advance follows a whole append), so it is read again whole."""
    data = path.read_bytes()
    # the header: written whole before the slot is used
    whole = data.index(b"\n") + 1 if start is None else start
    seen: set[int] = set()
    for entry, pos in _entries(data, whole):
        if entry["data"].startswith("COMMIT"):
            seen.add(int(entry["xid"]))
            whole = pos
    if whole < len(data):
        with path.open("r+b") as out:
            out.truncate(whole)
            out.flush()
            os.fsync(out.fileno())
    return seen


def _table_rows(cur: Any, table: str) -> list[dict[str, Column]]:
    """Every row of ``table`` as (type, text) per column, spelled as test_decoding does."""
    cur.execute("SELECT a.attname, format_type(a.atttypid, NULL) FROM pg_attribute a "
                "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped "
                "ORDER BY a.attnum", (table,))
    columns = cur.fetchall()
    if not columns:
        raise ConfigError(f"table {table} not found in the source database; is the job's "
                          f"table name right?")
    # format('%s') is the type's output function, as test_decoding prints it (a ::text
    # cast would strip char(n)'s padding).
    quoted = ['"' + c.replace('"', '""') + '"' for c, _ in columns]
    names = ", ".join(f"CASE WHEN {q} IS NULL THEN NULL ELSE format('%s', {q}) END"
                      for q in quoted)
    schema, _, name = table.rpartition(".")
    relation = (f'"{schema}".' if schema else "") + '"' + name.replace('"', '""') + '"'
    cur.execute(f"SELECT {names} FROM {relation}")
    return [{c: (t, v) for (c, t), v in zip(columns, row, strict=True)}
            for row in cur.fetchall()]


def drop_record(dsn: str, directory: Path) -> tuple[bool, Path | None]:
    """Drop verify's slot (it keeps WAL while unread) and its record file; what existed."""
    path = record_path(directory, dsn)
    with _connect(dsn) as conn, conn.cursor() as cur:
        dropped = _slot_exists(cur)
        if dropped:
            cur.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
            conn.commit()
    parsed_path(path).unlink(missing_ok=True)
    if path.exists():
        path.unlink()
        return dropped, path
    return dropped, None


@dataclass
class Record:
    """What verify recorded of one database: S_0 and the transactions after it."""

    snapshot: dict[str, list[dict[str, Any]]]
    """table -> rows at the slot's snapshot."""
    transactions: list[tuple[int, list[DecodedChange]]]
    """(xid, its row changes in statement order), in commit order."""


_OWN_LOGS = tuple(f"table {t}: " for t in (CHANGE_LOG, COMMIT_LOG))
"""How test_decoding starts a line of txjoin's own logs, which a ``txjoin up --job``
database's triggers write in every transaction: never a job's table, not kept."""

PARSED_LAYOUT = 1
"""The layout of ``<record>.parsed`` (:class:`ParsedRecord`); another is rebuilt."""


def parsed_path(path: Path) -> Path:
    """Where the parsed form of the record file ``path`` is kept."""
    return path.with_suffix(".parsed")


_PARSER = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
"""This module's source as imported (it decodes the record): a decoding fix rebuilds the
parse kept."""


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Without the cyclic collector: a parsed record is hundreds of thousands of acyclic
    containers, which it would walk again and again while they are made (twice the load's
    time, issue 73)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class ParsedRecord:
    """A record file parsed up to byte ``length`` (the end of its last whole transaction
    parsed), in plain data: what ``<record>.parsed`` holds."""

    tables: list[str] | None
    """The tables whose changes were decoded (sorted; None: all)."""
    length: int = 0
    digest: str = ""
    """SHA-256 of the file's first ``length`` bytes."""
    snapshot: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """The header's snapshot as written: table -> rows of column -> [type, text]."""
    order: list[int] = field(default_factory=list)
    """xids, in commit order."""
    changes: dict[int, list[tuple[str, str, dict[str, Column] | None,
                                  dict[str, Column] | None]]] = field(default_factory=dict)
    """xid -> its decoded changes of ``tables``, as (table, op, old, new)."""

    def covers(self, tables: Collection[str] | None) -> bool:
        return self.tables is None or (tables is not None and set(tables) <= set(self.tables))

    def parse(self, data: bytes, progress: Callable[[str], None] | None = None) -> None:
        """Parse ``data`` (the record file, whose first ``length`` bytes are parsed) on from
        ``length``, up to the end of its last whole transaction. ``progress`` gets a line
        every few seconds."""
        import time

        from txjoin.verify.verify import PROGRESS_SECONDS

        last_progress = time.monotonic()
        start = parsed = self.length
        if start == 0:
            start = data.index(b"\n") + 1
            self.snapshot = json.loads(data[:start])["snapshot"]
            self.length = start
        tables = None if self.tables is None else set(self.tables)
        # since the last COMMIT: kept once a COMMIT follows (test_decoding prints one
        # transaction at a time), else left for the verify that cuts them off
        begun: dict[int, list[tuple[str, str, dict[str, Column] | None,
                                    dict[str, Column] | None]]] = {}
        for entry, pos in _entries(data, start):
            xid, line = int(entry["xid"]), entry["data"]
            if line.startswith("BEGIN"):
                begun[xid] = []
            elif line.startswith("COMMIT"):
                self.order.extend(begun)
                self.changes.update(begun)
                begun = {}
                self.length = pos
                if progress is not None and time.monotonic() - last_progress >= PROGRESS_SECONDS:
                    last_progress = time.monotonic()
                    progress(f"verify: reading the record: {(pos - parsed) / 1e6:,.1f} of "
                             f"{(len(data) - parsed) / 1e6:,.1f} MB new since the last verify")
            elif (change := decode_change(line, tables)) is not None:
                (begun if xid in begun else self.changes).setdefault(xid, []).append(
                    (change.table, change.op, change.old, change.new))
        if self.length != parsed:
            self.digest = hashlib.sha256(data[:self.length]).hexdigest()

    def record(self, tables: Collection[str] | None) -> Record:
        """The record, with the changes of ``tables`` (None: all this holds)."""
        wanted = None if tables is None else set(tables)
        with _no_cyclic_gc():
            snapshot = {t: [row_values(r) or {} for r in rows]
                        for t, rows in self.snapshot.items()}
            transactions = [(x, [DecodedChange._make(c) for c in self.changes.get(x, [])
                                 if wanted is None or c[0] in wanted]) for x in self.order]
        return Record(snapshot, transactions)

    def save(self, path: Path) -> None:
        """Write to ``path`` whole or not at all (a torn one would be rebuilt anyway)."""
        part = path.with_suffix(f".parsed-part-{os.getpid()}")  # two verifies at once
        with part.open("wb") as out:
            marshal.dump({"layout": PARSED_LAYOUT, "parser": _PARSER,
                          "tables": self.tables,
                          "length": self.length, "digest": self.digest,
                          "snapshot": self.snapshot, "order": self.order,
                          "changes": self.changes}, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(part, path)

    @classmethod
    def load(cls, path: Path, data: bytes) -> ParsedRecord | None:
        """The parse kept at ``path``, if it is of a prefix of ``data`` (the record file) by
        this parser in this layout; else None."""
        try:
            with _no_cyclic_gc():
                kept = marshal.loads(path.read_bytes())
            parsed = cls(kept["tables"], kept["length"], kept["digest"], kept["snapshot"],
                         kept["order"], kept["changes"])
            current = (kept["layout"] == PARSED_LAYOUT and kept["parser"] == _PARSER
                       and 0 < parsed.length <= len(data) and parsed.digest
                       == hashlib.sha256(data[:parsed.length]).hexdigest())
        except (OSError, EOFError, ValueError, TypeError, KeyError):
            return None  # none, torn, or not ours
        return parsed if current else None


def read_record(dsn: str, directory: Path, tables: Collection[str] | None = None,
                progress: Callable[[str], None] | None = None) -> Record | None:
    """Bring the record of ``dsn`` up to date from verify's slot and read it; None when
    this database is not recorded (no record file in ``directory``). ``tables``: the
    tables whose changes are read (default: all the record holds). ``progress`` gets a
    line every few seconds of the parse."""
    path = record_path(directory, dsn)
    if not path.exists():
        return None
    kept = ParsedRecord.load(parsed_path(path), path.read_bytes())
    seen = _whole_transactions(path, None if kept is None else kept.length)
    if kept is not None:
        seen.update(kept.order)
    with _connect(dsn) as conn, conn.cursor() as cur:
        if not _slot_exists(cur):
            raise ConfigError(f"verify's record {path} has no slot {SLOT} on the source "
                              f"database any more (dropped, or the database was rebuilt): "
                              f"its history is incomplete; `txjoin verify JOB --drop-record`, "
                              f"then `--record` again before the next workload")
        cur.execute(_SESSION)
        cur.execute("SELECT lsn::text, xid::text::bigint, data FROM "
                    "pg_logical_slot_peek_changes(%s, NULL, NULL, 'skip-empty-xacts', '1')",
                    (SLOT,))
        fetched = cur.fetchall()
        last_commit = next((lsn for lsn, _, data in reversed(fetched)
                            if data.startswith("COMMIT")), None)
        new = [(lsn, xid, data) for lsn, xid, data in fetched
               if xid not in seen and not data.startswith(_OWN_LOGS)]
        with path.open("a") as out:
            for i, (lsn, xid, data) in enumerate(new):
                if i == len(new) // 2 and crashpoints.armed(crashpoints.VERIFY_APPEND):
                    out.flush()  # tests only: a kill with half the new lines in the record
                    os.fsync(out.fileno())
                    crashpoints.reached(crashpoints.VERIFY_APPEND, None)
                out.write(json.dumps({"lsn": lsn, "xid": xid, "data": data}) + "\n")
            out.flush()
            os.fsync(out.fileno())  # in the record before the slot forgets them
        crashpoints.reached(crashpoints.VERIFY_APPENDED, None)  # tests only
        if last_commit is not None:
            conn.commit()
            cur.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (SLOT, last_commit))
            conn.commit()
    return parse_record(path, tables, kept, progress)


def parse_record(path: Path, tables: Collection[str] | None = None,
                 kept: ParsedRecord | None = None,
                 progress: Callable[[str], None] | None = None) -> Record:
    """The record file ``path`` as read (whole transactions only; ``tables``' changes, by
    default all), from its parse kept beside it (``kept``: already loaded) and the lines
    after it, the parse then kept for the next verify: always what a parse of the whole
    file gives."""
    data = path.read_bytes()
    if kept is None:
        kept = ParsedRecord.load(parsed_path(path), data)
    if kept is not None and kept.covers(tables):
        parsed, length = kept, kept.length
    else:  # the tables it decoded and these (jobs on one database share it)
        held = [] if kept is None else kept.tables
        parsed, length = ParsedRecord(
            None if tables is None or held is None else sorted({*held, *tables})), -1
    parsed.parse(data, progress)
    if parsed.length != length:
        parsed.save(parsed_path(path))
    return parsed.record(tables)


# -- the job as of each fact's last commit -----------------------------------------------------


@dataclass
class AsOfAnswer:
    """The recorded history's answer for an ``as_of_fact`` job."""

    present: list[dict[str, Any]]
    absent: set[tuple[Any, ...]]
    """Output keys whose fact's last change deleted it, or left no row (an inner lookup)."""
    unchecked: list[tuple[Any, ...]]
    """Output keys of facts last changed before the record began: their lookups' state at
    that commit is not in the record."""
    transactions: int


class Grouped:
    """One table's rows grouped by the values of some of their columns, kept up to date
    as the replay changes the table; None in place of the groups once a value cannot be
    hashed (an array): the caller then scans the table."""

    def __init__(self, table: str, columns: Sequence[str]) -> None:
        self.table, self.columns = table, tuple(columns)
        self.groups: dict[tuple[Any, ...], dict[tuple[Any, ...], dict[str, Any]]] | None = {}

    def add(self, key: tuple[Any, ...], row: dict[str, Any]) -> None:
        if self.groups is not None:
            try:
                self.groups.setdefault(tuple(row.get(c) for c in self.columns), {})[key] = row
            except TypeError:
                self.groups = None

    def remove(self, key: tuple[Any, ...], row: dict[str, Any] | None) -> None:
        if self.groups is not None and row is not None:
            group = self.groups.get(tuple(row.get(c) for c in self.columns))
            if group is not None:
                group.pop(key, None)

    def clear(self) -> None:
        if self.groups is not None:
            self.groups = {}

    def rows_with(self, values: Iterator[tuple[Any, ...]] | Sequence[tuple[Any, ...]]
                  ) -> dict[tuple[Any, ...], dict[str, Any]] | None:
        """The rows (by key) whose columns hold one of ``values``; None: not grouped."""
        if self.groups is None:
            return None
        found: dict[tuple[Any, ...], dict[str, Any]] = {}
        for value in values:
            found.update(self.groups.get(value, {}))
        return found


class ReplayIndex:
    """Per child-rows alias, its table's rows grouped by the fact they reference and the
    facts grouped by the values their child rows reference them by: the replay finds the
    facts a changed child row belongs to, and hands the oracle only the evaluated facts'
    child rows, without a scan of either table per transaction. Handed every child row
    after every transaction, the oracle grouped all of them again each time (its grouping
    lasts until its tables change): transactions x child rows (issue 73)."""

    def __init__(self, job: Any) -> None:
        self.children = [lk for lk in job.lookups if lk.listed and not lk.array]
        self.child_rows = {lk.alias: Grouped(lk.table, list(lk.on)) for lk in self.children}
        self.facts = {lk.alias: Grouped(job.fact, list(lk.on.values()))
                      for lk in self.children}
        self._all = [*self.child_rows.values(), *self.facts.values()]

    def add(self, table: str, key: tuple[Any, ...], row: dict[str, Any]) -> None:
        """``row`` (of ``table``) is held under ``key`` now."""
        for grouped in self._all:
            if grouped.table == table:
                grouped.add(key, row)

    def remove(self, table: str, key: tuple[Any, ...], row: dict[str, Any] | None) -> None:
        """The row held under ``key`` (``row``; None: none) is no longer."""
        for grouped in self._all:
            if grouped.table == table:
                grouped.remove(key, row)

    def clear(self, table: str) -> None:
        for grouped in self._all:
            if grouped.table == table:
                grouped.clear()

    def rows_of(self, table: str, facts: Sequence[Mapping[str, Any]],
                every: Mapping[tuple[Any, ...], dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows of child ``table`` that any of ``facts`` reference (``every``: the whole
        table, where an alias on it is not grouped)."""
        found: dict[tuple[Any, ...], dict[str, Any]] = {}
        for lk in self.children:
            if lk.table != table:
                continue
            rows = self.child_rows[lk.alias].rows_with(
                [tuple(fact.get(c) for c in lk.on.values()) for fact in facts])
            if rows is None:
                return list(every.values())
            found.update(rows)
        return list(found.values())


def expected_as_of(job: Any, record: Record, source: str,
                   progress: Callable[[str], None] | None = None) -> AsOfAnswer:
    """Each fact's row: the job evaluated on the state at the commit that last changed it.

    Replays the record's transactions in commit order over S_0 (rows read by the job's
    column types, as the change log's replay reads them) and, after each, evaluates the
    facts it changed with txjoin's oracle (:class:`txjoin.join.oracle.Oracle`, which
    shares no code with the engine). ``progress`` gets a line every few seconds.
    """
    import time

    from txjoin.ingest.types import ColumnValueError
    from txjoin.join.oracle import Oracle
    from txjoin.verify.verify import PROGRESS_SECONDS, _read_logged

    def typed(table: str, row: dict[str, Any] | None, where: str) -> dict[str, Any] | None:
        try:
            return _read_logged(job, table, row, where)
        except ColumnValueError as exc:  # the job declares the column otherwise
            raise ConfigError(f"{exc.reason}; declare the column's type in the job's Table as "
                              f"that database has it, then verify again (verify read the "
                              f"database itself: the run is not affected)") from None

    def key_of(table: str, row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(row.get(k) for k in job.table(table).key)

    tables: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {t: {} for t in job.table_names}
    index = ReplayIndex(job)
    for table, snapshot_rows in record.snapshot.items():
        if table in tables:
            where = f"verify, reading {source}'s {table} as recorded:"
            for row in snapshot_rows:
                new = typed(table, row, where)
                assert new is not None
                key = key_of(table, new)
                tables[table][key] = new
                index.add(table, key, new)
    oracle = Oracle(job)
    children = index.children
    child_tables = {lk.table for lk in children}
    # handed to the oracle in part: tables only child rows are read from
    handed_in_part = child_tables - {job.fact} - {lk.table for lk in job.lookups
                                                  if lk not in children}
    from_snapshot = dict(tables[job.fact])
    # fact key -> (output key, the job's row or None: deleted, or no row by an inner lookup)
    touched: dict[tuple[Any, ...], tuple[tuple[Any, ...], dict[str, Any] | None]] = {}
    last_progress = time.monotonic()
    for done, (xid, changes) in enumerate(record.transactions):
        if progress is not None and time.monotonic() - last_progress >= PROGRESS_SECONDS:
            last_progress = time.monotonic()
            progress(f"verify: replaying the record: {done:,} of {len(record.transactions):,} "
                     f"transactions, {len(touched):,} facts evaluated")
        where = f"verify, replaying {SLOT} of {source} (xid {xid}):"
        facts: dict[tuple[Any, ...], dict[str, Any]] = {}  # fact key -> its last row
        child_versions: list[tuple[str, dict[str, Any]]] = []  # every changed child's versions
        for change in changes:
            if change.table not in tables:
                continue
            rows = tables[change.table]
            if change.op == "TRUNCATE":
                if change.table == job.fact:
                    facts.update(tables[change.table])
                if change.table in child_tables:
                    child_versions.extend((change.table, r) for r in rows.values())
                rows.clear()
                index.clear(change.table)
                continue
            old = typed(change.table, row_values(change.old), where)
            new = typed(change.table, row_values(change.new), where)
            old_key = None if old is None else key_of(change.table, old)
            new_key = None if new is None else key_of(change.table, new)
            if change.table in child_tables:  # the versions as held (an old-key has no more)
                held = [rows.get(k) for k in (old_key, new_key) if k is not None]
                child_versions.extend((change.table, r) for r in [*held, new] if r is not None)
            if old is not None and old_key is not None:
                index.remove(change.table, old_key, rows.pop(old_key, None))
                if change.table == job.fact:
                    facts[old_key] = old
            if new is not None and new_key is not None:
                index.remove(change.table, new_key, rows.get(new_key))
                rows[new_key] = new
                index.add(change.table, new_key, new)
                if change.table == job.fact:
                    facts[new_key] = new
        # A change to a child row is a change to the facts it references (before or after):
        # found by the changed children's link values, in the facts grouped by theirs
        # (else one pass over the facts; a scan of every fact per changed child made this
        # step the replay's cost: issue 73, 4 min 50 s against 8.6 s).
        for lk in children:
            mine, theirs = list(lk.on), list(lk.on.values())
            links = [tuple(child.get(c) for c in mine) for table, child in child_versions
                     if table == lk.table and all(child.get(c) is not None for c in mine)]
            if not links:
                continue
            try:
                wanted: set[tuple[Any, ...]] | list[tuple[Any, ...]] = set(links)
            except TypeError:  # an unhashable link value: compare each with ==
                wanted = links
            referenced = (index.facts[lk.alias].rows_with(list(wanted))
                          if isinstance(wanted, set) else None)
            if referenced is not None:
                facts.update((k, f) for k, f in referenced.items() if k not in facts)
                continue
            facts.update((key, fact) for key, fact in tables[job.fact].items()
                         if key not in facts and tuple(fact.get(c) for c in theirs) in wanted)
        if not facts:
            continue
        evaluated = [f for f in (tables[job.fact].get(k) for k in facts) if f is not None]
        oracle.tables = {t: (index.rows_of(t, evaluated, rows) if t in handed_in_part
                             else list(rows.values())) for t, rows in tables.items()}
        for fact_key, last in facts.items():
            fact = tables[job.fact].get(fact_key)
            touched[fact_key] = (oracle._out_key(fact or last),
                                 None if fact is None else oracle.evaluate(fact))
    present: list[dict[str, Any]] = []
    absent: set[tuple[Any, ...]] = set()
    for out_key, out in touched.values():
        if out is None:
            absent.add(out_key)
        else:
            present.append(out)
    unchecked = sorted((oracle._out_key(row) for key, row in from_snapshot.items()
                        if key not in touched), key=repr)
    return AsOfAnswer(present, absent, unchecked, len(record.transactions))
