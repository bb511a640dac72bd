"""Write a job file from a PostgreSQL catalog (``txjoin job init``).

Reads ``pg_catalog`` for the tables a user names: each table's columns with
their types (mapped to txjoin's column types: enums read as ``text``, a domain
as its base type), its primary key, and its foreign keys. From the fact table
it follows foreign keys to the other named tables, breadth first, and proposes
one lookup per foreign key that references the looked-up table's primary key
(``left`` when a referencing column is nullable, else ``inner``). The output is
the fact's columns plus every looked-up column, named ``<alias>_<column>``: a
starting point the user edits. The file it writes loads with
:func:`txjoin.job.load_job` and runs unchanged.

This is a tool for writing jobs, not part of a job's data flow: nothing at run
time imports it.
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg2

from txjoin.errors import ConfigError, ServiceError, did_you_mean

if TYPE_CHECKING:
    from txjoin.job import Table

# format_type() spelling -> txjoin column type, for types whose spelling differs.
_SAME = {"smallint", "bigint", "text", "date", "interval", "uuid", "json", "jsonb", "bytea",
         "real", "money", "numeric"}
_RENAMED = {"integer": "int", "boolean": "bool", "double precision": "double",
            "character varying": "varchar", '"char"': "text",
            "name": "text", "citext": "text", "inet": "text", "cidr": "text",
            "macaddr": "text", "xml": "text"}
def _precision(m: re.Match[str]) -> str:
    # No precision written means the default: leave it off (timestamp, not timestamp(6)).
    return f"({m.group(1)})" if m.group(1) else ""


_PARAMETRIZED: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = [
    (re.compile(r"^numeric\((\d+),(\d+)\)$"), lambda m: f"numeric({m[1]},{m[2]})"),
    (re.compile(r"^character varying\((\d+)\)$"), lambda m: f"varchar({m[1]})"),
    (re.compile(r"^character\((\d+)\)$"), lambda m: f"char({m[1]})"),
    (re.compile(r"^timestamp(?:\((\d)\))? without time zone$"),
     lambda m: "timestamp" + _precision(m)),
    (re.compile(r"^timestamp(?:\((\d)\))? with time zone$"),
     lambda m: "timestamptz" + _precision(m)),
    (re.compile(r"^time(?:\((\d)\))? without time zone$"), lambda m: "time" + _precision(m)),
    (re.compile(r"^time(?:\((\d)\))? with time zone$"), lambda m: "timetz" + _precision(m)),
    (re.compile(r"^interval\b.*$"), lambda m: "interval"),
]


def column_type(formatted: str) -> str | None:
    """txjoin's column type for a scalar ``format_type()`` spelling; ``None``: unsupported."""
    if formatted in _SAME:
        return formatted
    if formatted in _RENAMED:
        return _RENAMED[formatted]
    for pattern, spell in _PARAMETRIZED:
        m = pattern.match(formatted)
        if m:
            return spell(m)
    return None


@dataclass
class ForeignKey:
    """``columns`` of the referencing table reference ``ref_columns`` of ``ref_table``."""

    name: str
    columns: list[str]
    ref_table: str
    ref_columns: list[str]


@dataclass
class CatalogTable:
    """One table as the catalog describes it."""

    name: str  # schema.table
    columns: dict[str, str]  # supported columns, in table order
    unsupported: dict[str, str]  # column -> format_type() spelling
    nullable: set[str]
    key: list[str]
    foreign_keys: list[ForeignKey] = field(default_factory=list)
    unique: list[frozenset[str]] = field(default_factory=list)  # PRIMARY KEY, UNIQUE

    @property
    def bare(self) -> str:
        return self.name.split(".", 1)[1]


@contextmanager
def _connect(dsn: str) -> Iterator[Any]:
    from txjoin.sinks.postgres import mask_dsn

    try:
        conn = psycopg2.connect(dsn, connect_timeout=10)
    except psycopg2.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ServiceError(f"cannot connect to {mask_dsn(dsn)}: {first}") from exc
    try:
        conn.set_session(readonly=True, autocommit=True)
        yield conn
    finally:
        conn.close()


def _resolve_type(cur: Any, oid: int, typmod: int, where: str) -> tuple[str | None, str]:
    """(txjoin type or None, format_type spelling): arrays, domains and enums unwrapped."""
    cur.execute("SELECT typtype, typelem, typbasetype, typtypmod, typcategory, "
                "format_type(oid, %s) FROM pg_type WHERE oid = %s", (typmod, oid))
    typtype, elem, base, base_mod, category, spelled = cur.fetchone()
    if category == "A" and elem:
        inner, _ = _resolve_type(cur, elem, typmod, where)
        if inner is None or inner.endswith("[]"):
            return None, spelled
        return inner + "[]", spelled
    if typtype == "d":  # a domain reads as its base type
        return _resolve_type(cur, base, base_mod, where)
    if typtype == "e":  # an enum: Debezium sends its label
        return "text", spelled
    return column_type(spelled), spelled


def read_table(cur: Any, name: str) -> CatalogTable:
    """Columns, primary key and foreign keys of table ``name`` (``schema.table`` or bare)."""
    cur.execute("SELECT n.nspname, c.relname, c.oid FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)",
                (name,))
    found = cur.fetchone()
    if found is None:
        raise ConfigError(f"table {name!r} does not exist in the database (name it "
                          f"schema.table, or check the DSN's database and search_path)")
    schema, relname, oid = found
    qualified = f"{schema}.{relname}"
    cur.execute("SELECT attname, atttypid, atttypmod, NOT attnotnull FROM pg_attribute "
                "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                (oid,))
    columns: dict[str, str] = {}
    unsupported: dict[str, str] = {}
    nullable: set[str] = set()
    for col, type_oid, typmod, is_nullable in cur.fetchall():
        typ, spelled = _resolve_type(cur, type_oid, typmod, f"{qualified}.{col}")
        if typ is None:
            unsupported[col] = spelled
        else:
            columns[col] = typ
        if is_nullable:
            nullable.add(col)
    cur.execute("SELECT a.attname FROM pg_index i "
                "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
                "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
                "WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord", (oid,))
    key = [r[0] for r in cur.fetchall()]
    if not key:
        raise ConfigError(f"table {qualified} has no primary key; txjoin keys every table "
                          f"by its primary key: add one (ALTER TABLE {qualified} ADD PRIMARY "
                          f"KEY (...)) or leave the table out")
    bad_key = [c for c in key if c in unsupported]
    if bad_key:
        raise ConfigError(f"{qualified}.{bad_key[0]}: primary-key column of type "
                          f"{unsupported[bad_key[0]]}, which txjoin cannot read; leave the "
                          f"table out")
    cur.execute(
        "SELECT con.conname, rn.nspname || '.' || rc.relname, "
        "  array(SELECT attname FROM unnest(con.conkey) WITH ORDINALITY k(n, o) "
        "        JOIN pg_attribute ON attrelid = con.conrelid AND attnum = k.n ORDER BY k.o), "
        "  array(SELECT attname FROM unnest(con.confkey) WITH ORDINALITY k(n, o) "
        "        JOIN pg_attribute ON attrelid = con.confrelid AND attnum = k.n ORDER BY k.o) "
        "FROM pg_constraint con JOIN pg_class rc ON rc.oid = con.confrelid "
        "JOIN pg_namespace rn ON rn.oid = rc.relnamespace "
        "WHERE con.conrelid = %s AND con.contype = 'f' ORDER BY con.conname", (oid,))
    fks = [ForeignKey(n, list(cols), ref, list(ref_cols))
           for n, ref, cols, ref_cols in cur.fetchall()]
    # Unique column sets (a whole-table unique index: no predicate, no expression), which
    # tell `job from-sql` where a Pick or an order_by tie can never apply.
    cur.execute("SELECT array(SELECT a.attname FROM unnest(i.indkey) k(n) JOIN pg_attribute "
                "a ON a.attrelid = i.indrelid AND a.attnum = k.n) FROM pg_index i WHERE "
                "i.indrelid = %s AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS "
                "NULL", (oid,))
    unique = [frozenset(r[0]) for r in cur.fetchall()]
    return CatalogTable(qualified, columns, unsupported, nullable, key, fks, unique)


def read_catalog(dsn: str, tables: Sequence[str]) -> list[CatalogTable]:
    """The named tables as the catalog at ``dsn`` describes them, in the given order."""
    with _connect(dsn) as conn, conn.cursor() as cur:
        out = [read_table(cur, name) for name in tables]
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"a table is named twice: {names}")
    return out


@dataclass
class ProposedLookup:
    alias: str
    table: CatalogTable
    parent: str
    on: dict[str, str]  # looked-up column -> parent column
    how: str


@dataclass
class Proposal:
    """What the job file will hold."""

    tables: list[CatalogTable]
    fact: CatalogTable
    fact_alias: str
    lookups: list[ProposedLookup]
    skipped: list[str]  # foreign keys not proposed, with why


def _identifier(text: str) -> str:
    name = re.sub(r"\W", "_", text).strip("_") or "t"
    if name[0].isdigit() or keyword.iskeyword(name):
        name = "t_" + name
    return name


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{name}{n}", n + 1
    taken.add(candidate)
    return candidate


def _reach(tables: dict[str, CatalogTable], start: str) -> int:
    seen, todo = {start}, [start]
    while todo:
        for fk in tables[todo.pop()].foreign_keys:
            if fk.ref_table in tables and fk.ref_table not in seen:
                seen.add(fk.ref_table)
                todo.append(fk.ref_table)
    return len(seen)


def propose(tables: list[CatalogTable], fact: str | None = None) -> Proposal:
    """The lookup tree from ``fact`` (default: the table reaching most others by FKs).

    Breadth first from the fact, one lookup per foreign key into a named table that
    references that table's primary key; a table's own foreign keys are followed
    the first time it is looked up only, so the tree is finite.
    """
    by_name = {t.name: t for t in tables}
    if fact is None:
        fact_table = max(tables, key=lambda t: _reach(by_name, t.name))  # first on ties
    else:
        matches = [t for t in tables if fact in (t.name, t.bare)]
        if not matches:
            raise ConfigError(f"--fact {fact!r} is not one of --tables {list(by_name)}")
        fact_table = matches[0]
    taken: set[str] = set()
    fact_alias = _unique(_identifier(fact_table.bare), taken)
    lookups: list[ProposedLookup] = []
    skipped: list[str] = []
    expanded = {fact_table.name}
    queue = [(fact_alias, fact_table)]
    while queue:
        parent_alias, parent = queue.pop(0)
        for fk in parent.foreign_keys:
            target = by_name.get(fk.ref_table)
            if target is None:
                continue
            if sorted(fk.ref_columns) != sorted(target.key):
                skipped.append(f"{parent.name} {fk.name}: references {fk.ref_columns}, not "
                               f"the primary key {target.key} of {target.name}")
                continue
            if any(c not in parent.columns for c in fk.columns):
                skipped.append(f"{parent.name} {fk.name}: a column's type is not supported")
                continue
            # Named after the referencing column (client_id -> client): two foreign keys
            # into one table (billing_address_id, shipping_address_id) stay apart.
            stem = fk.columns[0].removesuffix("_id") if len(fk.columns) == 1 else target.bare
            alias = _unique(_identifier(stem), taken)
            how = "left" if any(c in parent.nullable for c in fk.columns) else "inner"
            lookups.append(ProposedLookup(alias, target, parent_alias,
                                          dict(zip(fk.ref_columns, fk.columns, strict=True)),
                                          how))
            if target.name not in expanded:
                expanded.add(target.name)
                queue.append((alias, target))
    return Proposal(tables, fact_table, fact_alias, lookups, skipped)


def _q(text: str) -> str:
    return json.dumps(text)  # a double-quoted Python string literal, as ruff formats them


def _dict(items: dict[str, str], indent: str, prefix: int = 0, width: int = 96) -> str:
    """A dict literal: on one line when it fits after ``prefix`` characters, else one item
    a line."""
    one_line = "{" + ", ".join(f"{_q(k)}: {_q(v)}" for k, v in items.items()) + "}"
    if len(indent) + prefix + len(one_line) < width:
        return one_line
    inner = indent + "    "
    return "{\n" + "".join(f"{inner}{_q(k)}: {_q(v)},\n" for k, v in items.items()) + indent + "}"


def render_job(proposal: Proposal) -> str:
    """The job file's Python source."""
    fact, fa = proposal.fact, proposal.fact_alias
    out_key = {c: f"{fa}.{c}" for c in fact.key}
    out_cols = {c: f"{fa}.{c}" for c in fact.columns if c not in fact.key}
    names = set(out_key) | set(out_cols)
    for lk in proposal.lookups:
        for col in lk.table.columns:
            if col in lk.on:  # equals the parent's column
                continue
            out_cols[_unique(_identifier(f"{lk.alias}_{col}"), names)] = f"{lk.alias}.{col}"
    ind = " " * 8
    lines = [
        f'"""{fact.name} with its lookups, written by `txjoin job init` from the catalog.',
        "",
        "Lookups follow the foreign keys from the fact table; the output holds every column",
        "of the fact and of each lookup: keep what you need, rename, set how/semantics.",
        '"""',
        "",
        "from txjoin.job import Job, Lookup, Output, Table",
        "",
        "job = Job(",
        f"    name={_q(_identifier(fact.bare))},",
        "    tables=[",
    ]
    for t in proposal.tables:
        for col, spelled in t.unsupported.items():
            lines.append(f"{ind}# {t.name}.{col}: type {spelled} is not supported, left out")
        keys = ", ".join(_q(k) for k in t.key) + ("," if len(t.key) == 1 else "")
        key = "" if t.key == ["id"] else f", key=({keys})"
        head = f"Table({_q(t.name)}, "
        lines.append(f"{ind}{head}{_dict(t.columns, ind, len(head) + len(key) + 2)}{key}),")
    lines += ["    ],", f"    fact={_q(fact.name)},", f"    fact_alias={_q(fa)},", "    lookups=["]
    for note in proposal.skipped:
        lines.append(f"{ind}# not proposed: {note}")
    if not proposal.lookups and len(proposal.tables) > 1:
        lines += [f"{ind}# No foreign key joins these tables in the catalog. Name the joins",
                  f"{ind}# with `txjoin job init ... --lookup loans.member_id=members.id`",
                  f"{ind}# (repeatable), or add Lookup(alias, table, parent=..., on={{...}})."]
    for lk in proposal.lookups:
        how = "" if lk.how == "inner" else f", how={_q(lk.how)}"
        head = f"Lookup({_q(lk.alias)}, {_q(lk.table.name)}, parent={_q(lk.parent)},"
        on = f"on={_dict(lk.on, ind + '    ', 3)}{how}),"
        if len(ind) + len(head) + 1 + len(on) <= 100:
            lines.append(f"{ind}{head} {on}")
        else:
            lines += [f"{ind}{head}", f"{ind}       {on}"]
    lines += [
        "    ],",
        "    output=Output(",
        f"        table={_q(_identifier(fact.bare) + '_enriched')},",
        f"        key={_dict(out_key, ind, 4)},",
        f"        columns={_dict(out_cols, ind, 8)},",
        "    ),",
        '    semantics="as_of_fact",',
        ")",
        "",
    ]
    return "\n".join(lines)


def parse_lookup(text: str) -> tuple[str, list[str], str, list[str]]:
    """``--lookup loans.member_id=members.id`` -> (``loans``, [``member_id``], ``members``,
    [``id``]): the referencing table and columns, the referenced table and columns. Tables
    may be schema-qualified (``public.loans.member_id``); several columns are joined with
    ``+`` (``a.x+y=b.p+q``)."""
    def side(part: str) -> tuple[str, list[str]]:
        table, _, cols = part.strip().rpartition(".")
        columns = [c.strip() for c in cols.split("+")]
        if not table or not all(columns):
            raise ConfigError(f"--lookup {text!r}: expected TABLE.COLUMN=TABLE.COLUMN, e.g. "
                              f"loans.member_id=members.id")
        return table, columns

    if text.count("=") != 1:
        raise ConfigError(f"--lookup {text!r}: expected TABLE.COLUMN=TABLE.COLUMN, e.g. "
                          f"loans.member_id=members.id")
    left, right = text.split("=")
    (table, columns), (ref_table, ref_columns) = side(left), side(right)
    if len(columns) != len(ref_columns):
        raise ConfigError(f"--lookup {text!r}: {len(columns)} column(s) on the left, "
                          f"{len(ref_columns)} on the right")
    return table, columns, ref_table, ref_columns


def _named(tables: Sequence[CatalogTable], name: str, what: str) -> CatalogTable:
    matches = [t for t in tables if name in (t.name, t.bare)]
    if not matches:
        hint = did_you_mean(name, [t.bare for t in tables])
        raise ConfigError(f"--lookup {what}: table {name!r} is not one of --tables "
                          f"{[t.name for t in tables]}{hint}")
    return matches[0]


def add_lookups(tables: Sequence[CatalogTable], lookups: Sequence[str]) -> None:
    """Declare each ``--lookup`` (:func:`parse_lookup`) as a foreign key of its referencing
    table, for :func:`propose` to follow as it follows the catalog's own."""
    for text in lookups:
        name, columns, ref_name, ref_columns = parse_lookup(text)
        table, ref = _named(tables, name, text), _named(tables, ref_name, text)
        for t, cols in ((table, columns), (ref, ref_columns)):
            for col in cols:
                if col not in t.columns and col not in t.unsupported:
                    hint = did_you_mean(col, t.columns)
                    raise ConfigError(f"--lookup {text}: {t.name} has no column {col!r}{hint}")
        if sorted(ref_columns) != sorted(ref.key):
            raise ConfigError(f"--lookup {text}: {', '.join(ref_columns)} is not the primary "
                              f"key ({', '.join(ref.key)}) of {ref.name}; a lookup names one "
                              f"row of the looked-up table")
        table.foreign_keys.append(ForeignKey(f"--lookup {text}", columns, ref.name,
                                             ref_columns))


def init_job(dsn: str, tables: Sequence[str], fact: str | None = None,
             lookups: Sequence[str] = ()) -> str:
    """Read the catalog at ``dsn`` and return a job file's source for ``tables``, with the
    catalog's foreign keys and ``lookups`` (``--lookup``) as the joins."""
    if not tables:
        raise ConfigError("--tables names no table")
    catalog = read_catalog(dsn, tables)
    add_lookups(catalog, lookups)
    return render_job(propose(catalog, fact))


def check_declared_columns(dsn: str, tables: Sequence[Table], job_file: str) -> None:
    """ConfigError (one line per problem, with a "did you mean") unless every table and
    column the job declares exists in the source database at ``dsn`` with a type its
    declared one reads (:func:`txjoin.ingest.types.type_fits`): a typo or a wrong type in a
    job file is found when the run starts, not when the first record of the table arrives
    (behind Spark's start and its traces)."""
    from txjoin.ingest.types import type_fits
    from txjoin.sinks.postgres import mask_dsn

    problems = []
    with _connect(dsn) as conn, conn.cursor() as cur:
        for table in tables:
            cur.execute("SELECT ARRAY(SELECT attname::text FROM pg_attribute WHERE attrelid = "
                        "c.oid AND attnum > 0 AND NOT attisdropped ORDER BY attnum), c.oid "
                        "FROM pg_class c WHERE c.oid = to_regclass(%s)", (table.name,))
            row = cur.fetchone()
            where = f"{job_file}: table {table.name}"
            if row is None:
                cur.execute("SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN "
                            "pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN "
                            "('r', 'p') AND n.nspname NOT IN ('pg_catalog', "
                            "'information_schema')")
                hint = did_you_mean(table.name, [r[0] for r in cur.fetchall()])
                problems.append(f"{where} does not exist in the source database "
                                f"{mask_dsn(dsn)}{hint}; fix the Table name in the job file")
                continue
            columns = row[0]
            for col in table.columns:
                if col not in columns:
                    hint = did_you_mean(col, columns)
                    problems.append(
                        f"{where} has no column {col!r} in the source database "
                        f"{mask_dsn(dsn)}{hint}; its columns: {', '.join(columns)}. Fix the "
                        f"job file's Table columns (nothing was read or written)")
            cur.execute("SELECT attname, atttypid, atttypmod FROM pg_attribute WHERE attrelid "
                        "= %s AND attnum > 0 AND NOT attisdropped", (row[1],))
            for col, type_oid, typmod in cur.fetchall():
                declared = table.columns.get(col)
                if declared is None:
                    continue
                actual, spelled = _resolve_type(cur, type_oid, typmod, f"{table.name}.{col}")
                if actual is None or type_fits(declared, actual, table.time_precision_mode):
                    continue
                problems.append(
                    f"{where} column {col!r} is declared {declared!r}, but the source database "
                    f"has it as {spelled} (txjoin type {actual!r}), which {declared!r} does not "
                    f"read; declare it {actual!r} in the job file's Table (nothing was read or "
                    f"written)")
    if problems:
        raise ConfigError("\n".join(problems))
