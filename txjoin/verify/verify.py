"""``txjoin verify``: compare a job's sinks with PostgreSQL's own answer.

The oracle depends on the job's semantics (DESIGN §1):

- ``as_of_fact``: the uncaptured table ``<fact>_expected`` (``public.orders_expected`` for
  the pizzeria), which the workload generator fills in the same transaction as every
  change of a fact row. Rows with ``present`` are expected, by key; a key whose last
  answer is ``present = false`` must be absent. Only PostgreSQL can say what a row
  looked like *as of* an old commit, so a plain query on today's state would be wrong.
  Without that table (a workload txjoin did not write): verify's own record of the
  database's history, from a logical decoding slot (:mod:`txjoin.verify.history`).
- ``current``: the job compiled to SQL (:func:`job_query`) and run on the source
  database. It is the answer after the last committed transaction, so compare once the
  pipeline has caught up (``txjoin run --until-idle`` after the writers stopped).

A job that declares its sources (``Job.sources``) is answered by PostgreSQL too: with one
source, the same query on that database; with several (no SQL spans two databases), the
query on a copy of each source's tables, taken at one snapshot per source into temporary
tables of one session (:func:`expected_rows_sources`). Its changelogs get a per-source
prefix check (:func:`prefix_violations`): each transaction's changes sit at exactly one
``_commit_seq``, and each source's transactions appear in that source's commit order, as
its commit trigger recorded it in ``public.txjoin_commits``. Then txjoin's own oracle
(:mod:`txjoin.join.oracle`) checks every state the changelog passes through against the
source's states rebuilt from ``public.txjoin_changes`` (:func:`state_violations`): SQL
has no answer for "the job on some state of each source". ``VerifyResult.referees`` says
which referee answered which check.

Both the PostgreSQL sink and the Delta current table are compared, values by value
(``Decimal("9.00")`` equals the JSON number ``9.0``; lists in order), and each sink's
changelog must not hold a key twice at one ``_commit_seq`` (exactly once).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
import struct
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
import psycopg2.extras

from txjoin.errors import ConfigError, TxjoinError
from txjoin.expr import AGGREGATED
from txjoin.ingest.debezium import Modes
from txjoin.ingest.types import FAST_TYPES, ColumnValueError, column_kind, convert_value
from txjoin.job import Aggregate, Children, Collect, Job, Lookup
from txjoin.sinks import COMMIT_SEQ, READ_BATCH_ROWS, XID, Sink, without_metadata
from txjoin.sinks.build import SinkPlaces, build_sinks
from txjoin.sinks.columns import TupleColumns
from txjoin.verify.diff import RowDiff, diff_rows, row_key, rows_match, show
from txjoin.verify.history import SLOT, AsOfAnswer, expected_as_of, read_record
from txjoin.verify.own_query import OwnQuery, OwnQueryCheck, check_own_query
from txjoin.verify.source_tables import CHANGE_LOG, COMMIT_LOG, pg_type

Row = dict[str, Any]

PRESENT_COLUMN = "present"


# -- the oracle ---------------------------------------------------------------------------


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _qualified(table: str) -> str:
    return ".".join(_ident(part) for part in table.split(".", 1))


def _ref(ref: str) -> str:
    alias, column = ref.split(".", 1)
    return f"{_ident(alias)}.{_ident(column)}"


Relations = Mapping[str, str]
"""Table name -> the SQL relation the job's query reads it from (default: the table)."""


def _relation(table: str, relations: Relations | None) -> str:
    return relations[table] if relations is not None else _qualified(table)


def _order(job: Job, table_name: str, column: str, direction: str) -> str:
    # Text in code point order, as txjoin (Python) compares it, not the database's collation
    # (an enum, declared as text, by its label as txjoin reads it, not its position).
    if _kind_of(job.table(table_name).columns[column]) == "text":
        return f"x.{_ident(column)}::text COLLATE \"C\" {direction}"
    return f"x.{_ident(column)} {direction}"


def _kind_of(sql_type: str) -> str | None:
    try:  # array types have no kind: not ordered by collation
        return column_kind(sql_type)[0]
    except ValueError:
        return None


def _lookup_join(job: Job, lookup: Lookup, parent_expr: Mapping[str, str],
                 relations: Relations | None) -> str:
    """``[LEFT] JOIN (the looked-up table, one row per match key) AS alias ON ...`` for a
    non-array lookup.

    ``Pick``: per value of the ``on`` columns, the match with the greatest (least) value;
    a NULL only when every match has one; ties to the greatest (least) key of the
    looked-up table (README, "Jobs"): ``DISTINCT ON``, one sort of the table, joined by
    hash or merge. Not a ``LATERAL ... LIMIT 1`` per parent row, which without an index
    on the ``on`` columns is one scan of the looked-up table per row (issue 71). Without
    a pick every match joins, as the engine's lookup of a key does.
    """
    table = job.table(lookup.table)
    columns = ", ".join(f"x.{_ident(c)}" for c in table.columns)
    where = ""
    if lookup.alias in job.expressions.lookups:  # the lookup's filter, on the row itself
        where = f" WHERE {job.expressions.lookups[lookup.alias].render(_x_column)} IS TRUE"
    source = f"{_relation(lookup.table, relations)} AS x{where}"
    if lookup.pick is None:
        rows = f"SELECT {columns} FROM {source}"
    else:
        direction = "DESC" if lookup.pick.order == "max" else "ASC"
        match = [f"x.{_ident(mine)}" for mine in lookup.on]
        terms = [*match, f"{_order(job, lookup.table, lookup.pick.column, direction)} "
                         f"NULLS LAST"]
        terms += [_order(job, lookup.table, k, direction) for k in table.key]
        rows = (f"SELECT DISTINCT ON ({', '.join(match)}) {columns} FROM {source} "
                f"ORDER BY {', '.join(terms)}")
    on = " AND ".join(f"{_ident(lookup.alias)}.{_ident(mine)} = {parent_expr[mine]}"
                      for mine in lookup.on)
    join = "LEFT JOIN" if lookup.how == "left" else "JOIN"
    return f"{join} ({rows}) AS {_ident(lookup.alias)} ON {on}"


def _x_column(_alias: str, column: str) -> str:
    return f"x.{_ident(column)}"


def _alias_column(alias: str, column: str) -> str:
    return f"{_ident(alias)}.{_ident(column)}"


def _joins_under(job: Job, alias: str, relations: Relations | None) -> list[str]:
    """The joins of every non-array lookup below ``alias`` (parents before children)."""
    joins = []
    for child in job.children(alias):
        if child.listed:
            continue
        parent_expr = {mine: _ref(f"{alias}.{theirs}") for mine, theirs in child.on.items()}
        joins.append(_lookup_join(job, child, parent_expr, relations))
        joins += _joins_under(job, child.alias, relations)
    return joins


GROUP_KEY = "__k"
"""Prefix of a listed alias's grouped table's match columns (``__k0``, ``__k1``, ...)."""
GROUP_FOUND = "__found"
"""A listed alias's grouped table's column that is true where a parent has an element."""


def _grouped(alias: str) -> str:
    """The SQL alias of ``alias``'s grouped table (:func:`_listed_join`)."""
    return _ident(f"{alias}__g")


def _elements(job: Job, alias: str, relations: Relations | None
              ) -> tuple[str, str, list[str], list[str]]:
    """The elements of a listed alias for every parent at once: ``FROM ... [WHERE ...]``,
    the ORDER BY that puts one parent's elements in the engine's order, the expressions
    that identify the parent (grouped by), and what each is equal to in the parent.

    Child rows: the child table's rows (passing its filter), identified by their ``on``
    columns, in ``order_by`` then key order, ascending, NULLs last, text by code point. An
    array lookup: each distinct array of the parent's table, ``unnest(...) WITH
    ORDINALITY`` once, in array order (a distinct one: each value once, at its first
    occurrence, NULLs skipped), identified by the array itself.
    """
    lookup = job.lookup(alias)
    nested = " ".join(_joins_under(job, alias, relations))
    if isinstance(lookup, Children):
        table = job.table(lookup.table)
        where = ""
        if alias in job.expressions.lookups:
            where = f" WHERE {job.expressions.lookups[alias].render(_alias_column)} IS TRUE"
        order = ", ".join(
            (f"{_ref(f'{alias}.{col}')}::text COLLATE \"C\"" if _kind_of(table.columns[col])
             == "text" else _ref(f"{alias}.{col}")) + " ASC NULLS LAST"
            for col in (*lookup.order_by, *table.key))
        return (f"FROM {_relation(lookup.table, relations)} AS {_ident(alias)} {nested}{where}",
                order, [_ref(f"{alias}.{mine}") for mine in lookup.on],
                [_ref(f"{lookup.parent}.{theirs}") for theirs in lookup.on.values()])
    ((mine, theirs),) = lookup.on.items()
    # Every distinct array of the parent's table (a superset of the parents' arrays: the
    # parent's filter and pick do not matter, the join below picks each parent's own).
    parent_table = job.alias_table(lookup.parent).name
    arrays = _ident(f"{alias}__arrays")
    distinct = (f"(SELECT DISTINCT p.{_ident(theirs)} AS v FROM "
                f"{_relation(parent_table, relations)} AS p) AS {arrays}")
    item = _ident(f"{alias}__item")
    element = _lookup_join(job, lookup, {mine: f"{item}.v"}, relations)
    array = f"unnest({arrays}.v) WITH ORDINALITY"
    if lookup.distinct:  # = ANY(array): each value once, ordered by its first occurrence
        source = (f"FROM (SELECT {arrays}.v AS a, u.v, min(u.ord) AS ord FROM {distinct} "
                  f"CROSS JOIN LATERAL {array} AS u(v, ord) WHERE u.v IS NOT NULL "
                  f"GROUP BY {arrays}.v, u.v) AS {item} {element} {nested}")
    else:
        source = (f"FROM (SELECT {arrays}.v AS a, u.v, u.ord FROM {distinct} CROSS JOIN "
                  f"LATERAL {array} AS u(v, ord)) AS {item} {element} {nested}")
    return source, f"{item}.ord", [f"{item}.a"], [_ref(f"{lookup.parent}.{theirs}")]


def _collect(job: Job, collect: Collect) -> str:
    """The listed alias's elements as a JSON list, in their order (in its grouped table)."""
    _, order, _, _ = _elements(job, collect.alias, None)
    fields = ", ".join(f"'{name}', {_ref(ref)}" for name, ref in collect.fields.items())
    return f"jsonb_agg(jsonb_build_object({fields}) ORDER BY {order})"


def _aggregate_call(job: Job, name: str, agg: Aggregate) -> str:
    """PostgreSQL's own aggregate over the listed alias's elements (in its grouped table),
    in the elements' order where the order can change the answer (string_agg; sum and
    avg of doubles)."""
    _, order, _, _ = _elements(job, agg.alias, None)
    arg = job.expressions.aggregates.get(name)
    if arg is None:
        return "count(*)"
    value = arg.render(_alias_column)
    if agg.func in ("min", "max") and _kind_of(arg.type) == "text":
        value = f"({value})::text COLLATE \"C\""  # by code point, as txjoin compares
    if agg.func == "string_agg":
        separator = "'" + (agg.separator or "").replace("'", "''") + "'"
        return f"string_agg({value}, {separator} ORDER BY {order})"
    if agg.func in ("sum", "avg"):
        return f"{agg.func}({value} ORDER BY {order})"
    return f"{agg.func}({value})"


def _aggregate(job: Job, name: str, agg: Aggregate) -> str:
    """The aggregate's value for the outer query's row, from its alias's grouped table:
    over no element count 0, the others NULL (no group joined)."""
    value = f"{_grouped(agg.alias)}.{_ident(name)}"
    return f"coalesce({value}, 0)" if agg.func == "count" else value


def listed_columns(job: Job) -> dict[str, dict[str, Collect | Aggregate]]:
    """Listed alias -> the output columns that read it (Collect or Aggregate), by name: what
    its grouped table computes. Every listed alias has an entry (an inner one no column
    reads still decides which facts have a row)."""
    out: dict[str, dict[str, Collect | Aggregate]] = {
        lk.alias: {} for lk in job.lookups if lk.listed}
    for name, projection in job.output.columns.items():
        if isinstance(projection, Collect | Aggregate):
            out[projection.alias][name] = projection
    # the aggregates computed columns and HAVING read (keys never an output column's name)
    for key, agg in job.expressions.nested.items():
        out[agg.alias][key] = agg
    return out


def _listed_join(job: Job, alias: str, columns: Mapping[str, Collect | Aggregate],
                 relations: Relations | None) -> str:
    """``LEFT JOIN (alias's elements grouped by parent, each column aggregated) AS
    <alias>__g ON (its parent's match)``: one pass over the elements for all parents, in
    place of a correlated subquery per fact row (issue 71)."""
    source, _, group, parent = _elements(job, alias, relations)
    select = [f"{g} AS {_ident(f'{GROUP_KEY}{i}')}" for i, g in enumerate(group)]
    select.append(f"true AS {_ident(GROUP_FOUND)}")
    for name, projection in columns.items():
        call = (_collect(job, projection) if isinstance(projection, Collect)
                else _aggregate_call(job, name, projection))
        select.append(f"{call} AS {_ident(name)}")
    on = " AND ".join(f"{_grouped(alias)}.{_ident(f'{GROUP_KEY}{i}')} = {p}"
                      for i, p in enumerate(parent))
    return (f"LEFT JOIN (SELECT {', '.join(select)} {source} GROUP BY "
            f"{', '.join(group)}) AS {_grouped(alias)} ON {on}")


def job_query(job: Job, relations: Relations | None = None) -> str:
    """The job as one PostgreSQL query over the source tables (its ``current`` answer).

    Set-based whatever indexes the tables have (issue 71): a non-array lookup joins its
    table reduced to one row per match (``DISTINCT ON`` for a ``pick``), a listed alias
    (child rows, an array lookup) joins its elements grouped and aggregated per parent, an
    array as ``unnest(...) WITH ORDINALITY`` in array order, duplicates kept (DESIGN §1:
    not the seed's ``= ANY(...)``, which loses both). A left listed alias without element
    collects an empty list (the engine's answer, where jsonb_agg of no rows is NULL);
    an inner one leaves no output row, as the engine does. ``relations`` reads tables
    from elsewhere (verify's copies of several databases' tables).
    """
    listed = listed_columns(job)
    for lookup in job.lookups:
        if lookup.array and not listed[lookup.alias]:
            raise ConfigError(f"job {job.name!r}: verify can only compile array lookups that "
                              f"an output column collects or aggregates; {lookup.alias!r} is "
                              f"neither")
        parent = lookup.parent
        while parent != job.fact_alias:
            if job.lookup(parent).array and any(lk.array for lk in job.children(parent)):
                raise ConfigError(f"job {job.name!r}: verify cannot compile nested array "
                                  f"lookups ({lookup.alias!r})")
            parent = job.lookup(parent).parent
    select = [f"{_ref(ref)} AS {_ident(name)}" for name, ref in job.output.key.items()]
    conditions = []

    def column(alias: str, name: str) -> str:
        # An aggregate a computed column or HAVING reads: its value from its alias's grouped
        # table (listed_columns computes it there), as an Aggregate column's.
        if alias == AGGREGATED:
            return _aggregate(job, name, job.expressions.nested[name])
        return _alias_column(alias, name)

    for name, projection in job.output.columns.items():
        if isinstance(projection, Collect):
            collected = f"{_grouped(projection.alias)}.{_ident(name)}"
            if job.lookup(projection.alias).how == "left":
                collected = f"coalesce({collected}, '[]'::jsonb)"
            select.append(f"{collected} AS {_ident(name)}")
        elif isinstance(projection, Aggregate):
            select.append(f"{_aggregate(job, name, projection)} AS {_ident(name)}")
        elif name in job.expressions.columns:  # a computed column, as PostgreSQL computes it
            select.append(f"{job.expressions.columns[name].render(column)} AS "
                          f"{_ident(name)}")
        else:
            select.append(f"{_ref(projection)} AS {_ident(name)}")
    joins = _joins_under(job, job.fact_alias, relations)
    joins += [_listed_join(job, alias, columns, relations) for alias, columns in listed.items()]
    query = (f"SELECT {', '.join(select)} FROM {_relation(job.fact, relations)} AS "
             f"{_ident(job.fact_alias)} {' '.join(joins)}")
    if job.expressions.where is not None:
        conditions.append(f"{job.expressions.where.render(_alias_column)} IS TRUE")
    if job.expressions.having is not None:  # one group per fact: HAVING is a filter on it
        conditions.append(f"{job.expressions.having.render(column)} IS TRUE")
    # An inner listed alias: a fact without an element has no row.
    conditions += [f"{_grouped(lk.alias)}.{_ident(GROUP_FOUND)} IS TRUE"
                   for lk in job.lookups if lk.listed and lk.how == "inner"]
    if conditions:
        query += f" WHERE {' AND '.join(conditions)}"
    return query


def expected_table(job: Job) -> str:
    """Where the generator records PostgreSQL's as-of answer for an ``as_of_fact`` job."""
    return f"{job.fact}_expected"


@contextlib.contextmanager
def _connect(dsn: str, what: str) -> Iterator[psycopg2.extensions.connection]:
    try:
        conn = psycopg2.connect(dsn, connect_timeout=5)
    except psycopg2.OperationalError as exc:
        # libpq's messages span lines: keep the error on one.
        reason = " ".join(str(exc).split())
        raise ConfigError(f"cannot connect to the {what} database: {reason}; is the stack up "
                          f"(`txjoin status`), or is the DSN right?") from None
    try:
        # jsonb numbers as Decimal, like the sinks' numeric values.
        psycopg2.extras.register_default_jsonb(conn, loads=partial(json.loads,
                                                                   parse_float=Decimal))
        # Intervals as ISO 8601 text, read as Debezium counts months (365.25/12 days), not
        # as psycopg2's timedelta (30 days).
        as_text = psycopg2.extensions.new_type((1186,), "TXJOIN_INTERVAL",
                                               lambda value, _cur: value)
        psycopg2.extensions.register_type(as_text, conn)
        psycopg2.extras.register_uuid(conn_or_curs=conn)  # uuid[] too (else one string)
        psycopg2.extensions.register_type(
            psycopg2.extensions.new_array_type((1187,), "TXJOIN_INTERVAL[]", as_text), conn)
        with conn.cursor() as cur:
            cur.execute("SET TIME ZONE 'UTC'")
            cur.execute("SET intervalstyle = 'iso_8601'")
            # Arrays of the database's own types (enums, domains) come back as their text
            # ('{happy,sad}') unless registered: as lists of text, each element then read by
            # its declared type.
            cur.execute("SELECT coalesce(array_agg(a.oid), '{}') FROM pg_type a JOIN pg_type e "
                        "ON a.typelem = e.oid AND e.typarray = a.oid "
                        "WHERE e.typtype IN ('e', 'd')")
            own_arrays = tuple(cur.fetchone()[0])
        if own_arrays:
            psycopg2.extensions.register_type(psycopg2.extensions.new_array_type(
                own_arrays, "TXJOIN_OWN_TYPE[]", psycopg2.STRING), conn)
        yield conn
    finally:
        conn.close()


def _fetch(conn: psycopg2.extensions.connection, query: str, args: tuple[Any, ...] = ()
           ) -> list[Row]:
    with conn.cursor() as cur:
        # No arguments: the query as it is (a job's expression may hold a % of its own).
        cur.execute(query, args or None)
        names = [d[0] for d in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _job_file(job: Job) -> str:
    return "JOB" if job.source_file == "<inline>" else job.source_file


def _answer_query(job: Job, conn: psycopg2.extensions.connection) -> tuple[str, str]:
    """The query whose rows are PostgreSQL's answer on ``conn`` (an ``as_of_fact`` job's
    with its ``present`` column), and the oracle's description. Raises ConfigError when an
    ``as_of_fact`` job's ``<fact>_expected`` is not there or lacks a column."""
    if job.semantics != "as_of_fact":
        return job_query(job), "the job's query on the source"
    columns = job.output.column_names
    table = expected_table(job)
    found = _fetch(conn, "SELECT to_regclass(%s) IS NOT NULL AS found", (table,))
    if not found[0]["found"]:
        raise ConfigError(
            f"job {job.name!r} has as_of_fact semantics, which verify checks against the "
            f"table {table} (written by `txjoin generate`) or its own record of the source "
            f"database's history; there is neither: run `txjoin verify {_job_file(job)} "
            f"--record` before the workload (docs/verify.md), or verify the job with "
            f"semantics=\"current\" (checked on the job's query)")
    have = {r["column_name"] for r in _fetch(
        conn, "SELECT column_name FROM information_schema.columns "
              "WHERE table_schema || '.' || table_name = %s", (table,))}
    lacking = [c for c in (*columns, PRESENT_COLUMN) if c not in have]
    if lacking:
        raise ConfigError(f"{table} lacks the column(s) {lacking} of job {job.name!r}'s "
                          f"output; it has {sorted(have)}")
    return (f"SELECT {', '.join(_ident(c) for c in (*columns, PRESENT_COLUMN))} "
            f"FROM {_qualified(table)}", table)


def _query_failed(job: Job, exc: psycopg2.Error) -> ConfigError:
    return ConfigError(f"job {job.name!r}: its query failed on the source database: "
                       f"{str(exc).strip()}")


def expected_rows(job: Job, source_dsn: str) -> tuple[list[Row], set[tuple[Any, ...]], str]:
    """PostgreSQL's answer: (rows expected, keys that must be absent, oracle description)."""
    keys = list(job.output.key)
    columns = job.output.column_names
    with _connect(source_dsn, "source") as conn:
        query, oracle = _answer_query(job, conn)
        try:
            rows = _fetch(conn, query)
        except psycopg2.Error as exc:
            raise _query_failed(job, exc) from None
    if job.semantics != "as_of_fact":
        return rows, set(), oracle
    present = [{c: r[c] for c in columns} for r in rows if r[PRESENT_COLUMN]]
    absent = {tuple(r[k] for k in keys) for r in rows if not r[PRESENT_COLUMN]}
    return present, absent, oracle


@dataclass
class StreamedAnswer:
    """PostgreSQL's answer read in key order (:func:`answer_in_key_order`): what it
    counted once read through."""

    oracle: str
    present: int = 0
    absent: int = 0


def _answer_tuples(job: Job, conn: psycopg2.extensions.connection,
                   answer: StreamedAnswer | None = None, rows: int = READ_BATCH_ROWS
                   ) -> Generator[tuple[list[str], list[tuple[Any, ...]]], None, None]:
    """What :func:`answer_in_key_order` yields, as (column names, psycopg2's tuples)."""
    types = job.output_types()
    keys = list(job.output.key)
    def by(key: str) -> str:
        kind = types.get(key)
        if isinstance(kind, str) and _kind_of(kind) == "text":
            return f"q.{_ident(key)}::text COLLATE \"C\""
        return f"q.{_ident(key)}"

    order = ", ".join(by(k) for k in keys)
    query, oracle = _answer_query(job, conn)
    if answer is None:
        answer = StreamedAnswer(oracle)
    answer.oracle = oracle
    columns = job.output.column_names
    try:
        with conn, conn.cursor(name="txjoin_verify_answer") as cur:
            cur.itersize = rows
            cur.execute(f"SELECT * FROM ({query}) AS q ORDER BY {order}")
            while batch := cur.fetchmany(rows):
                names = [d[0] for d in cur.description or ()]
                if job.semantics == "as_of_fact":
                    at = [names.index(c) for c in columns]
                    present = names.index(PRESENT_COLUMN)
                    kept = [tuple(row[i] for i in at) for row in batch if row[present]]
                    answer.absent += len(batch) - len(kept)
                    names, batch = list(columns), kept
                answer.present += len(batch)
                yield names, batch
    except psycopg2.Error as exc:
        raise _query_failed(job, exc) from None


def answer_in_key_order(job: Job, conn: psycopg2.extensions.connection,
                        answer: StreamedAnswer | None = None,
                        rows: int = READ_BATCH_ROWS) -> Generator[list[Row], None, None]:
    """PostgreSQL's answer in output key order (text by code point, NULLs last, as the
    sinks read theirs: :meth:`~txjoin.sinks.Sink.read_current_batches`), ``rows`` at a
    time from a server-side cursor; an ``as_of_fact`` job's absent keys are counted in
    ``answer``, not yielded. One transaction: one snapshot of the source."""
    batches = _answer_tuples(job, conn, answer, rows)
    try:
        for names, batch in batches:
            yield [dict(zip(names, row, strict=True)) for row in batch]
    finally:
        batches.close()


def recorded_answer(job: Job, source_dsn: str, record_dir: str | os.PathLike[str],
                    progress: Callable[[str], None] | None = None) -> AsOfAnswer | None:
    """An ``as_of_fact`` job's answer from verify's record of the source's history
    (:mod:`txjoin.verify.history`); None when the generator's ``<fact>_expected``
    answers instead, or the database is not recorded. ``progress``: a line every few
    seconds of the record's parse and of its replay."""
    with _connect(source_dsn, "source") as conn:
        if _fetch(conn, "SELECT to_regclass(%s) IS NOT NULL AS found",
                  (expected_table(job),))[0]["found"]:
            return None
    record = read_record(source_dsn, Path(record_dir), set(job.table_names), progress)
    if record is None:
        return None
    return expected_as_of(job, record, "the source", progress)


# -- several source databases -----------------------------------------------------------

SOURCE_COLUMN = "_source"
"""The metadata column naming the source of each changelog row (multi-source jobs)."""


def evaluate_on_states(job: Job, rows_by_table: Mapping[str, Sequence[Row]]) -> list[Row]:
    """The job's output on the given table states (one state per source, read separately)."""
    from txjoin.join.oracle import Oracle

    oracle = Oracle(job)
    oracle.load_snapshot({t: rows_by_table.get(t, []) for t in job.table_names})
    return list(oracle.output.values())


def _scratch_type(sql_type: str) -> str:
    """The PostgreSQL type of a declared column in verify's copy (money as numeric: its
    text depends on each server's lc_monetary)."""
    base, array = (sql_type[:-2], "[]") if sql_type.endswith("[]") else (sql_type, "")
    return pg_type("numeric" if base == "money" else base) + array


def _copied(column: str, sql_type: str) -> str:
    if sql_type in ("money", "money[]"):
        return f"{_ident(column)}::{sql_type.replace('money', 'numeric')}"
    return _ident(column)


def expected_rows_sources(job: Job, source_dsns: Mapping[str, str], scratch_dsn: str,
                          scratch_name: str = "scratch"
                          ) -> tuple[list[Row], set[tuple[Any, ...]], str]:
    """PostgreSQL's answer for a job that declares its sources, as for :func:`expected_rows`.

    One source: the job's query on it, as for a plain job. Several (no SQL spans two
    databases): each source's tables are copied, at one snapshot per source (``REPEATABLE
    READ``), into temporary tables of one session on ``scratch_dsn``, and the job's query
    runs there. The session's transaction is rolled back: nothing stays in that database
    (``scratch_name`` names it in errors).
    """
    missing = [s.name for s in job.sources if not source_dsns.get(s.name)]
    if missing:
        raise ConfigError(f"job {job.name!r}: no database for source(s) {missing}; have "
                          f"{sorted(n for n, d in source_dsns.items() if d)}: start the stack "
                          f"with `txjoin up --job {job.source_file}` or pass --source-dsn "
                          f"{missing[0]}=DSN")
    if len(job.sources) == 1:
        (source,) = job.sources
        return expected_rows(job, source_dsns[source.name])
    copies = {t.name: f"pg_temp.{_ident(f'txjoin_verify_{n}')}"
              for n, t in enumerate(job.tables)}
    with _connect(scratch_dsn, scratch_name) as scratch, scratch.cursor() as into:
        try:
            for table in job.tables:
                columns = ", ".join(f"{_ident(c)} {_scratch_type(t)}"
                                    for c, t in table.columns.items())
                into.execute(f"CREATE TEMPORARY TABLE {copies[table.name]} ({columns})")
            for source in job.sources:
                _copy_source(job, source.name, source_dsns[source.name], into, copies)
            for copy in copies.values():  # autovacuum never analyzes a temporary table:
                into.execute(f"ANALYZE {copy}")  # without statistics, no sound join plan
            into.execute(job_query(job, copies))
            names = [d[0] for d in into.description or ()]
            rows = [dict(zip(names, row, strict=True)) for row in into.fetchall()]
        except psycopg2.Error as exc:
            raise ConfigError(f"job {job.name!r}: its query failed on verify's copy of the "
                              f"sources' tables: {' '.join(str(exc).split())}") from None
        finally:
            scratch.rollback()
    return rows, set(), ("the job's query on a copy of " + " and ".join(
        f"{s.name}'s database" for s in job.sources) + " (one snapshot each)")


def _copy_source(job: Job, source: str, dsn: str, into: Any, copies: Mapping[str, str]) -> None:
    """Copy ``source``'s tables of ``job`` into ``copies``, all at one snapshot of it."""
    with _connect(dsn, f"{source!r} source") as conn:
        conn.commit()  # keep _connect's session settings; the copy is a transaction of its own
        try:
            with conn.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                for table in job.tables_of(source):
                    table_def = job.table(table)
                    columns = ", ".join(_copied(c, t) for c, t in table_def.columns.items())
                    buffer = io.BytesIO()
                    cur.copy_expert(f"COPY (SELECT {columns} FROM {_qualified(table)}) TO STDOUT",
                                    buffer)
                    buffer.seek(0)
                    into.copy_expert(f"COPY {copies[table]} FROM STDIN", buffer)
        except psycopg2.Error as exc:
            raise ConfigError(f"cannot copy the tables of source {source!r} for verify: "
                              f"{' '.join(str(exc).split())}") from None
        finally:
            conn.rollback()


def commit_order(dsn: str) -> dict[int, int] | None:
    """xid -> position in commit order, from the generator's log (None if there is none)."""
    with _connect(dsn, "source") as conn:
        if not _fetch(conn, "SELECT to_regclass(%s) IS NOT NULL AS found",
                      (COMMIT_LOG,))[0]["found"]:
            return None
        return {int(r["xid"]): int(r["seq"]) for r in _fetch(
            conn, f"SELECT xid, seq FROM {COMMIT_LOG}")}


def prefix_violations(changelog: Sequence[Row],
                      orders: Mapping[str, Mapping[int, int] | None]) -> list[str]:
    """Per-source prefix consistency of a multi-source changelog, one line per violation.

    ``orders``: per source name, xid -> its place in that source's commit order (None:
    unknown, only the grouping is checked). A transaction's changes must share one
    ``_commit_seq`` and a ``_commit_seq`` must hold one transaction (never part of one);
    ordered by ``_commit_seq``, each source's transactions must follow its commit order
    (its k never goes back). The snapshot's rows (no ``_source``) are not transactions.
    """
    if changelog and SOURCE_COLUMN not in changelog[0]:
        return [f"the changelog has no {SOURCE_COLUMN} column: it is not a multi-source "
                f"job's output"]
    violations = []
    tx_seqs: dict[tuple[str, int], set[int]] = {}
    seq_txs: dict[int, set[tuple[str, int]]] = {}
    for row in changelog:
        if row.get(XID) is None or row.get(SOURCE_COLUMN) is None:
            continue  # the snapshot: _source null (and _xid 0 as the engine writes it)
        tx = (str(row[SOURCE_COLUMN]), int(row[XID]))
        seq = int(row[COMMIT_SEQ])
        tx_seqs.setdefault(tx, set()).add(seq)
        seq_txs.setdefault(seq, set()).add(tx)
    for (source, xid), seqs in sorted(tx_seqs.items()):
        if len(seqs) > 1:
            violations.append(f"source {source!r} xid {xid} is split across _commit_seq "
                              f"{sorted(seqs)}")
    for seq, txs in sorted(seq_txs.items()):
        if len(txs) > 1:
            violations.append(f"_commit_seq {seq} mixes transactions "
                              + ", ".join(f"{s}:{x}" for s, x in sorted(txs)))
    for source in sorted({s for s, _ in tx_seqs}):
        if source not in orders:
            violations.append(f"source {source!r} in the changelog is not a source of the job "
                              f"({sorted(orders)})")
            continue
        order = orders[source]
        if order is None:
            continue
        applied = sorted((min(seqs), xid) for (s, xid), seqs in tx_seqs.items() if s == source)
        previous: tuple[int, int, int] | None = None  # (_commit_seq, xid, commit position)
        for seq, xid in applied:
            position = order.get(xid)
            if position is None:
                continue  # not the generator's (e.g. set-up before it ran): no order known
            if previous is not None and position < previous[2]:
                violations.append(
                    f"source {source!r}: xid {xid} (commit #{position}) applied at _commit_seq "
                    f"{seq}, after xid {previous[1]} (commit #{previous[2]}) at _commit_seq "
                    f"{previous[0]}: its commit order went back")
            previous = (seq, xid, position)
    return violations


@dataclass
class SourceHistory:
    """One source database's generated transactions: commit order and row changes."""

    order: list[int]
    """xids in commit order."""
    changes: dict[int, list[tuple[str, Row | None, Row | None]]]
    """xid -> (table, old row, new row) in statement order."""

    @property
    def unordered(self) -> int:
        """Transactions that changed rows but have no place in the commit order (written
        to a database created before txjoin recorded every writer's commits)."""
        return len(set(self.changes) - set(self.order))


def read_history(dsn: str) -> SourceHistory | None:
    """The change log a ``txjoin up --job`` database keeps (None if it has none)."""
    with _connect(dsn, "source") as conn:
        if not _fetch(conn, "SELECT to_regclass(%s) IS NOT NULL AS found",
                      (CHANGE_LOG,))[0]["found"]:
            return None
        order = [int(r["xid"]) for r in _fetch(conn, f"SELECT xid FROM {COMMIT_LOG} ORDER BY seq")]
        changes: dict[int, list[tuple[str, Row | None, Row | None]]] = {}
        for r in _fetch(conn, f"SELECT xid, tbl, old_row, new_row FROM {CHANGE_LOG} ORDER BY id"):
            changes.setdefault(int(r["xid"]), []).append((r["tbl"], r["old_row"], r["new_row"]))
    return SourceHistory(order, changes)


_PG_INTERVAL = re.compile(
    r"(?:(?P<years>[-+]?\d+) years? ?)?(?:(?P<months>[-+]?\d+) mons? ?)?"
    r"(?:(?P<days>[-+]?\d+) days? ?)?(?:(?P<sign>[-+])?(?P<hours>\d+):(?P<minutes>\d\d):"
    r"(?P<seconds>\d\d(?:\.\d+)?))?")


def _as_captured(value: Any, sql_type: str) -> Any:
    """A value as ``to_jsonb`` wrote it into the change log, in the form Debezium sends it
    (the readers' form), where the two differ: money with its currency sign, bytea as
    ``\\x`` hex, an interval in the writer's ``postgres`` IntervalStyle."""
    if value is None:
        return None
    if sql_type.endswith("[]"):
        return ([_as_captured(v, sql_type[:-2]) for v in value] if isinstance(value, list)
                else value)
    if not isinstance(value, str):
        return value
    kind = _kind_of(sql_type)
    if kind == "money":  # '-$1,234.50' (lc_monetary)
        return re.sub(r"[^0-9.-]", "", value)
    if kind == "bytea" and value.startswith("\\x"):
        return bytes.fromhex(value[2:])
    if kind == "interval" and not value.startswith(("P", "-P")):
        m = _PG_INTERVAL.fullmatch(value.strip())
        if m is None or not value.strip():
            return value  # the reader says it cannot read it
        sign = "-" if m["sign"] == "-" else ""
        return (f"P{m['years'] or 0}Y{m['months'] or 0}M{m['days'] or 0}DT"
                f"{sign}{m['hours'] or 0}H{sign}{m['minutes'] or 0}M{sign}{m['seconds'] or 0}S")
    return value


def _read_logged(job: Job, table: str, row: Row | None, where: str) -> Row | None:
    """One row of the change log read by the job's column types."""
    if row is None:
        return None
    declared = job.table(table)
    columns = declared.columns
    # Every column declared, each value already its type's (an int, a text...): what the
    # two steps below leave (neither changes such a value), without them. The common
    # case, and a replay reads one row per row change (issue 73).
    if len(row) == len(columns) and all(type(row.get(c, row)) is FAST_TYPES.get(t)
                                        for c, t in columns.items()):
        return {c: row[c] for c in columns}
    captured = {c: _as_captured(v, columns[c]) if c in columns else v for c, v in row.items()}
    return declared.convert_row(captured, where=where, modes=Modes())


def typed_history(job: Job, source: str, history: SourceHistory) -> SourceHistory:
    """``history`` with every row read by the job's column types, as the oracle reads rows.

    A value that does not read as its declared type is a ConfigError saying what verify was
    reading: the job declares the column unlike the source database has it.
    """
    changes: dict[int, list[tuple[str, Row | None, Row | None]]] = {}
    for xid, row_changes in history.changes.items():
        where = f"verify, replaying {CHANGE_LOG} of source {source!r} (xid {xid}):"
        typed = changes.setdefault(xid, [])
        for table, old, new in row_changes:
            if table not in job.table_names:
                continue
            try:
                typed.append((table, _read_logged(job, table, old, where),
                              _read_logged(job, table, new, where)))
            except ColumnValueError as exc:
                raise ConfigError(f"{exc.reason}; declare the column's type in the job's "
                                  f"Table as that database has it, then verify again (verify "
                                  f"read the database itself: the run is not affected)"
                                  ) from None
    return SourceHistory(history.order, changes)


def _states_after_each(job: Job, history: SourceHistory) -> list[dict[str, list[Row]]]:
    """[state before the first transaction, after T1, after T2, ...] of one source."""
    tables: dict[str, dict[tuple[Any, ...], Row]] = {}
    states = [{}]  # type: list[dict[str, list[Row]]]
    for xid in history.order:
        for table, old, new in history.changes.get(xid, []):
            rows = tables.setdefault(table, {})
            if old is not None:
                rows.pop(tuple(old[k] for k in job.table(table).key), None)
            if new is not None:
                rows[tuple(new[k] for k in job.table(table).key)] = new
        states.append({t: list(rows.values()) for t, rows in tables.items()})
    return states


class StateAnswers:
    """Every state of each source (from its history, built once), and the job's output on
    each combination of them evaluated so far: shared by the sinks' state checks (their
    changelogs pass through the same states, and one evaluation is the oracle on every
    table: most of verify's time). Keeps at most ``max_rows`` output rows; beyond that it
    evaluates without keeping."""

    def __init__(self, job: Job, histories: Mapping[str, SourceHistory],
                 max_rows: int = 2_000_000) -> None:
        self.job, self.histories = job, histories
        self.names = sorted(histories)  # a combination's order
        self.states = {s: _states_after_each(job, histories[s]) for s in self.names}
        self._answers: dict[tuple[int, ...], list[Row]] = {}
        self._rows = 0
        self.max_rows = max_rows

    def get(self, combo: tuple[int, ...]) -> list[Row]:
        """The job's output (comparable rows) with source ``names[i]`` after its
        transaction ``combo[i]``."""
        answer = self._answers.get(combo)
        if answer is None:
            tables: dict[str, list[Row]] = {}
            for s, k in zip(self.names, combo, strict=True):
                tables.update(self.states[s][k])
            answer = comparable_rows(self.job, evaluate_on_states(self.job, tables))
            if self._rows + len(answer) <= self.max_rows:
                self._answers[combo] = answer
                self._rows += len(answer)
        return answer


def state_violations(job: Job, changelog: Sequence[Row],
                     histories: Mapping[str, SourceHistory], max_tries: int = 64,
                     answers: StateAnswers | None = None) -> list[str]:
    """Every state a reader of the sink could observe, checked against the job's output.

    Replays the changelog ``_commit_seq`` by ``_commit_seq``; after each, the sink must
    equal the job evaluated on (source 1 after some T1_k, source 2 after some T2_m, ...),
    where k is at least the last transaction of that source the changelog shows and
    below the next one it shows (transactions that changed no output leave no row).
    One line per state that matches none. ``answers``: the states and evaluations shared
    with the other sinks' checks (built from the same ``histories``).
    """
    if answers is None:
        answers = StateAnswers(job, histories)
    elif answers.histories is not histories or answers.job is not job:
        raise ValueError("state_violations: answers were built for other histories or job")
    keys = list(job.output.key)
    names, states = answers.names, answers.states
    position = {s: {xid: i + 1 for i, xid in enumerate(histories[s].order)} for s in names}
    groups: dict[int, list[Row]] = {}
    for row in changelog:
        groups.setdefault(int(row[COMMIT_SEQ]), []).append(row)
    shown: dict[str, list[int]] = {s: [] for s in names}  # positions, in changelog order
    seq_tx: dict[int, tuple[str, int]] = {}
    for seq in sorted(groups):
        tx = next(((str(r[SOURCE_COLUMN]), position.get(str(r[SOURCE_COLUMN]), {}).get(
            int(r[XID]), 0)) for r in groups[seq] if r.get(XID) is not None), None)
        if tx is not None and tx[0] in shown and tx[1]:
            seq_tx[seq] = tx
            shown[tx[0]].append(tx[1])
    violations = []
    # The sink's rows by key, as the final rows are compared (by value: a Delta real is a
    # float32 widened), each read once when the changelog sets it.
    sink: dict[tuple[Any, ...], Row] = {}
    read = comparable_reader(job)
    at = {s: 0 for s in names}
    nth = {s: 0 for s in names}
    for seq in sorted(groups):
        for row in groups[seq]:
            key = tuple(row[k] for k in keys)
            if row.get("_op") == "d":
                sink.pop(key, None)
            else:
                sink[key] = read({c: v for c, v in without_metadata(row).items()
                                  if c != SOURCE_COLUMN})
        if seq in seq_tx:
            source, pos = seq_tx[seq]
            at[source] = pos
            nth[source] += 1
        ranges = []
        for s in names:
            following = shown[s][nth[s]] if nth[s] < len(shown[s]) else len(states[s])
            ranges.append(range(at[s], max(at[s] + 1, following)))
        actual = list(sink.values())
        best: RowDiff | None = None
        matched = False
        for combo in itertools.islice(itertools.product(*ranges), max_tries):
            diff = diff_rows(answers.get(combo), actual, keys)
            best = best or diff
            if diff.size == 0:
                matched = True
                break
        if best is not None and not matched:
            where = ", ".join(f"{s} after #{at[s]}" for s in names)
            violations.append(
                f"after _commit_seq {seq} the sink equals no state of the sources ({where}, or "
                f"later ones it shows no row of): {len(best.missing)} missing, "
                f"{len(best.extra)} extra, {len(best.different)} different rows")
    return violations


# -- the comparison -----------------------------------------------------------------------


@dataclass
class SinkCheck:
    """One sink against the oracle."""

    sink: str
    where: str
    rows: int
    diff: RowDiff
    changelog_rows: int = 0
    changelog_duplicates: list[tuple[Any, ...]] = field(default_factory=list)
    note: str | None = None
    prefix_violations: list[str] = field(default_factory=list)
    state_violations: list[str] = field(default_factory=list)

    @property
    def mismatches(self) -> int:
        return (self.diff.size + len(self.changelog_duplicates) + len(self.prefix_violations)
                + len(self.state_violations))

    @property
    def ok(self) -> bool:
        return self.mismatches == 0


@dataclass
class VerifyResult:
    """A job's sinks compared with PostgreSQL's answer."""

    job: str
    semantics: str
    oracle: str
    expected: int
    absent: int
    sinks: list[SinkCheck]
    note: str | None = None
    """What verify could not check, and why (one line; not a mismatch)."""
    referees: list[tuple[str, str]] = field(default_factory=list)
    """(check, who answered it): PostgreSQL, or txjoin's own oracle for the state check."""
    own_query: list[OwnQueryCheck] | None = None
    """Each sink against the user's own query (``--against-sql``; None: not asked)."""

    @property
    def ok(self) -> bool:
        return (bool(self.sinks) and all(s.ok for s in self.sinks)
                and all(c.ok for c in self.own_query or ()))

    @property
    def mismatches(self) -> int:
        return (sum(s.mismatches for s in self.sinks)
                + sum(c.mismatches for c in self.own_query or ()))

    def summary(self) -> str:
        """One line: the verdict and the counts per sink."""
        parts = [f"{s.sink} {s.rows} rows, {s.mismatches} mismatches" for s in self.sinks]
        verdict = "OK" if self.ok else "MISMATCH"
        return (f"{verdict} {self.job} ({self.semantics}) vs {self.oracle}: {self.expected} "
                f"expected rows, {self.absent} absent keys; " + "; ".join(parts))

    def format(self, show_rows: int = 5) -> str:
        """The summary, then each sink's mismatches (the first ``show_rows`` of each kind)."""
        lines = [self.summary()]
        if self.referees:
            lines.append("  checked by: " + "; ".join(f"{c}: {r}" for c, r in self.referees))
        if self.note:
            lines.append(f"  note: {self.note}")
        for s in self.sinks:
            lines.append(f"  {s.sink} ({s.where}): {s.rows} current rows, "
                         f"{s.changelog_rows} changelog rows")
            if s.note:
                lines.append(f"    note: {s.note}")
            lines += _diff_lines(s.diff, show_rows, "    ")
            if s.changelog_duplicates:
                dup = s.changelog_duplicates
                lines.append(f"    changelog: {len(dup)} (key, _commit_seq) written more than "
                             f"once: " + ", ".join(show(list(d)) for d in dup[:show_rows])
                             + (" ..." if len(dup) > show_rows else ""))
            if s.prefix_violations:
                lines.append(f"    prefix: {len(s.prefix_violations)} violation(s)")
                lines += [f"      {v}" for v in s.prefix_violations[:show_rows]]
            if s.state_violations:
                lines.append(f"    states: {len(s.state_violations)} observable state(s) "
                             f"that are no combination of the sources' states")
                lines += [f"      {v}" for v in s.state_violations[:show_rows]]
        if self.own_query is not None:
            first = self.own_query[0] if self.own_query else None
            lines.append("  your query: " + (f"{first.query_rows} rows, {first.query_keys} "
                                             f"keys" if first else "no sink to compare"))
            for check in self.own_query:
                lines += check.format(show_rows)
        return "\n".join(lines)


def _diff_lines(diff: RowDiff, limit: int, indent: str) -> list[str]:
    lines = []
    for title, rows in ((f"missing ({len(diff.missing)}): expected, not in the sink",
                         diff.missing),
                        (f"extra ({len(diff.extra)}): in the sink, not expected", diff.extra)):
        if rows:
            lines.append(f"{indent}{title}")
            lines += [f"{indent}  {show(without_metadata(r))}" for r in rows[:limit]]
    if diff.different:
        lines.append(f"{indent}different ({len(diff.different)}):")
        for exp, act in diff.different[:limit]:
            lines.append(f"{indent}  expected {show(exp)}")
            lines.append(f"{indent}  actual   {show({c: act.get(c) for c in exp})}")
    return lines


def _duplicates(changelog: Sequence[Row], keys: Sequence[str]) -> list[tuple[Any, ...]]:
    counts = Counter((*(r[k] for k in keys), r[COMMIT_SEQ]) for r in changelog)
    return sorted(k for k, n in counts.items() if n > 1)


# Kinds whose values PostgreSQL, the Delta table and the PostgreSQL sink spell differently
# (jsonb text vs parsed, bytea as memoryview or \\x hex in jsonb, uuid as text, real as a
# float32 widened or not, money with its currency sign): both sides are read to the job's
# own Python value before comparing. Other kinds already compare by value.
_RETYPED = frozenset({"date", "time", "timetz", "interval", "uuid", "json", "bytea", "real",
                      "money", "numeric"})


def comparable(value: Any, sql_type: str) -> Any:
    """``value`` (as PostgreSQL or a sink returned it) as txjoin reads a ``sql_type`` value;
    unchanged when it cannot be read (the diff then shows it as it is)."""
    if value is None:
        return None
    if sql_type.endswith("[]"):
        return ([comparable(v, sql_type[:-2]) for v in value] if isinstance(value, list)
                else value)
    kind, _ = column_kind(sql_type)
    if kind not in _RETYPED:
        return value
    if isinstance(value, memoryview):
        value = value.tobytes()
    try:
        if kind == "bytea" and isinstance(value, str) and value.startswith("\\x"):
            return bytes.fromhex(value[2:])
        if kind == "real" and isinstance(value, int | float | Decimal):
            return struct.unpack("f", struct.pack("f", float(value)))[0]
        if kind == "money" and isinstance(value, str):  # '-$1,234.50' (lc_monetary)
            value = re.sub(r"[^0-9.-]", "", value)
        if kind == "json":
            return json.loads(value, parse_float=Decimal) if isinstance(value, str) else value
        if kind == "numeric":  # read as its text; compared as a number (12.30 = 12.3)
            return Decimal(convert_value(value, sql_type))
        return convert_value(value, sql_type)
    except (TxjoinError, ValueError, OverflowError):
        return value


def comparable_rows(job: Job, rows: Sequence[Row]) -> list[Row]:
    """Output rows with every column (and collected field) read by its declared type."""
    read = comparable_reader(job)
    return [read(row) for row in rows]


def comparable_reader(job: Job) -> Callable[[Row], Row]:
    """What :func:`comparable_rows` does to one row, the job's output types looked up once."""
    one = comparable_value_reader(job)
    return lambda row: {c: one(c, v) for c, v in row.items()}


def comparable_value_reader(job: Job) -> Callable[[str, Any], Any]:
    """What :func:`comparable_reader` does to one column's value."""
    types = job.output_types()

    def one(name: str, value: Any) -> Any:
        typ = types.get(name)
        if isinstance(typ, dict) and isinstance(value, list):
            return [{f: comparable(v, typ[f]) if f in typ else v for f, v in item.items()}
                    if isinstance(item, dict) else item for item in value]
        return comparable(value, typ) if isinstance(typ, str) else value

    return one


def check_sink(sink: Sink, where: str, keys: Sequence[str], expected: Sequence[Row],
               note: str | None = None,
               orders: Mapping[str, Mapping[int, int] | None] | None = None,
               job: Job | None = None,
               histories: Mapping[str, SourceHistory] | None = None,
               skipped: set[tuple[Any, ...]] | None = None,
               answers: StateAnswers | None = None) -> SinkCheck:
    """Compare one sink's current table (and its changelog's uniqueness) with ``expected``.

    With ``orders`` (a multi-source job: per source, xid -> commit position) its changelog
    gets the per-source prefix check as well; with ``job`` and ``histories`` (every
    source's transactions) each state the changelog passes through is checked too. Rows
    whose key is in ``skipped`` are left out of the current table's comparison;
    ``answers``: the state check's evaluations, shared between sinks.
    """
    current = sink.read_current()
    changelog = sink.read_changelog()
    if skipped:  # rows verify cannot answer for (see VerifyResult.note)
        current = [r for r in current if tuple(r[k] for k in keys) not in skipped]
    if job is not None:
        expected, current = comparable_rows(job, expected), comparable_rows(job, current)
    diff = diff_rows(expected, current, keys)
    violations = [] if orders is None else prefix_violations(changelog, orders)
    states = ([] if job is None or histories is None or violations
              else state_violations(job, changelog, histories, answers=answers))
    return SinkCheck(sink.name, where, len(current), diff, len(changelog),
                     _duplicates(changelog, keys), note, violations, states)


class OutOfOrder(Exception):
    """A stream's keys are not ascending by Python's comparison of their canonical values
    (PostgreSQL's or Arrow's order differs for this key type, or a key repeats): that
    comparison falls back to pairing rows in memory (:func:`diff_rows`)."""


class KeyedRows:
    """One side's rows in key order, read one at a time, each checked to come after the
    one before (else :class:`OutOfOrder`)."""

    def __init__(self, batches: Iterator[list[Row]], read: Callable[[Row], Row],
                 keys: Sequence[str]) -> None:
        self._batches = batches
        self._rows = (row for batch in batches for row in batch)
        self._read, self._keys = read, keys
        self.count = 0
        self.head: tuple[tuple[Any, ...], Row] | None = None
        self.advance()

    def advance(self) -> None:
        """Move ``head`` to the next row (None after the last)."""
        raw = next(self._rows, None)
        if raw is None:
            self.head = None
            return
        row = self._read(raw)
        key = row_key(row, self._keys)
        if self.head is not None and not _before(self.head[0], key):
            raise OutOfOrder
        self.count += 1
        self.head = (key, row)

    def close(self) -> None:
        """Stop reading (a sink's server-side cursor is closed before its rows are read
        again another way)."""
        self._rows.close()
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()


def _before(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    try:
        return bool(a < b)
    except (TypeError, ArithmeticError):  # None against a value, a str against a number
        raise OutOfOrder from None


class SinkMerge:
    """A sink's current rows merged with the expected rows by key: the diff, built one
    expected row at a time, as :func:`diff_rows` pairs them (rows of one key paired, the
    sink's rows no key asked for extra)."""

    def __init__(self, batches: Iterator[list[Row]], read: Callable[[Row], Row],
                 keys: Sequence[str]) -> None:
        self.diff = RowDiff()
        self.rows = KeyedRows(batches, read, keys)

    def offer(self, key: tuple[Any, ...], expected: Row) -> None:
        """Pair the next expected row (keys ascending) with the sink's row of its key."""
        while self.rows.head is not None and _before(self.rows.head[0], key):
            self.diff.extra.append(self.rows.head[1])
            self.rows.advance()
        head = self.rows.head
        if head is not None and head[0] == key:
            if not rows_match(expected, head[1]):
                self.diff.different.append((expected, head[1]))
            self.rows.advance()
        else:
            self.diff.missing.append(expected)

    def finish(self) -> None:
        """The sink's rows after the last expected key are extra."""
        while self.rows.head is not None:
            self.diff.extra.append(self.rows.head[1])
            self.rows.advance()


PROGRESS_SECONDS = 5.0
"""How often a long comparison says how far it got (``progress``)."""


def streamed_checks(job: Job, source_dsn: str, sinks: Sequence[tuple[Sink, str, str | None]],
                    progress: Callable[[str], None] | None = None
                    ) -> tuple[StreamedAnswer, list[SinkCheck]]:
    """Every sink compared with PostgreSQL's answer in one pass in key order: the answer
    (a server-side cursor) and each sink's current rows (its own key order) merged, a
    batch at a time, so neither is ever whole in Python (issue 71). ``sinks``: (sink,
    where, note). A side whose keys do not come in ascending order (a key type the two
    orders disagree on, a repeated key) is compared in memory instead, as before.
    ``progress`` gets a line every :data:`PROGRESS_SECONDS` (rows compared, per sink)."""
    columnar = _columnar_checks(job, source_dsn, sinks, progress)
    if columnar is not None:
        return columnar
    keys = list(job.output.key)
    read = comparable_reader(job)
    merges: dict[int, SinkMerge | None] = {}
    answer = StreamedAnswer("")
    for i, (sink, _, _) in enumerate(sinks):
        try:
            merges[i] = SinkMerge(sink.read_current_batches(), read, keys)
        except OutOfOrder:
            merges[i] = None

    def drop(i: int) -> None:
        merge = merges[i]
        if merge is not None:
            merge.rows.close()
        merges[i] = None

    last_progress = time.monotonic()
    with _connect(source_dsn, "source") as conn:
        stream = answer_in_key_order(job, conn, answer)
        try:
            expected = KeyedRows(stream, read, keys)
            while expected.head is not None:
                key, row = expected.head
                for i, merge in merges.items():
                    if merge is None:
                        continue
                    try:
                        merge.offer(key, row)
                    except OutOfOrder:
                        drop(i)
                expected.advance()
                if progress is not None and time.monotonic() - last_progress >= PROGRESS_SECONDS:
                    last_progress = time.monotonic()
                    progress(f"verify: {expected.count:,} expected rows compared; " + ", ".join(
                        f"{sinks[i][0].name} {m.rows.count:,} rows" for i, m in merges.items()
                        if m is not None))
        except OutOfOrder:  # the answer's own keys: every sink compared in memory
            stream.close()
            for i in merges:
                drop(i)
    for i, merge in merges.items():
        if merge is not None:
            try:
                merge.finish()
            except OutOfOrder:
                drop(i)
    checks = []
    fallback: list[Row] | None = None
    for i, (sink, where, note) in enumerate(sinks):
        merge = merges[i]
        total, repeats = sink.changelog_repeats()
        if merge is None:
            if fallback is None:
                rows_found, absent, answer.oracle = expected_rows(job, source_dsn)
                fallback = comparable_rows(job, rows_found)
                answer.present, answer.absent = len(rows_found), len(absent)
            current = comparable_rows(job, sink.read_current())
            diff, rows = diff_rows(fallback, current, keys), len(current)
        else:
            diff, rows = merge.diff, merge.rows.count
        checks.append(SinkCheck(sink.name, where, rows, diff, total, repeats, note))
    return answer, checks


COLUMNAR_BATCH_ROWS = 50_000
"""Rows of each side compared at a time column by column (:func:`_columnar_checks`)."""


def _columnar_checks(job: Job, source_dsn: str, sinks: Sequence[tuple[Sink, str, str | None]],
                     progress: Callable[[str], None] | None = None
                     ) -> tuple[StreamedAnswer, list[SinkCheck]] | None:
    """:func:`streamed_checks`' answer, with the rows compared column by column in Arrow
    (:mod:`txjoin.verify.columnar`); None where that cannot promise the same diff (a key
    of several columns or of another type, a NULL key, a text key that may read as a
    timestamp, keys that do not ascend): then verify compares row by row."""
    from txjoin.verify.columnar import KEY_KINDS, ChunkComparer, NotColumnar, _plain, merge_columns

    keys = list(job.output.key)
    types = job.output_types()
    key_type = types.get(keys[0]) if len(keys) == 1 else None
    if not isinstance(key_type, str) or _kind_of(key_type) not in KEY_KINDS:
        return None
    readers = [getattr(sink, "read_current_columns", None) for sink, _, _ in sinks]
    if any(r is None for r in readers):
        return None
    answer = StreamedAnswer("")
    comparer = ChunkComparer(comparable_reader(job), comparable_value_reader(job),
                             lambda name: _plain(types, name, _RETYPED))

    def said(expected: int, counts: list[int]) -> None:
        if progress is not None:
            progress(f"verify: {expected:,} expected rows compared; " + ", ".join(
                f"{sink.name} {n:,} rows" for (sink, _, _), n in zip(sinks, counts,
                                                                     strict=True)))

    streams = [r(COLUMNAR_BATCH_ROWS) for r in readers]  # type: ignore[misc]
    with _connect(source_dsn, "source") as conn:
        tuples = _answer_tuples(job, conn, answer, COLUMNAR_BATCH_ROWS)
        expected = (TupleColumns(names, batch) for names, batch in tuples)
        try:
            _, merged = merge_columns(keys[0], expected, streams, comparer,
                                      said if progress is not None else None,
                                      PROGRESS_SECONDS)
        except NotColumnar:
            return None
        finally:
            tuples.close()
            for stream in streams:
                stream.close()
    checks = []
    for (sink, where, note), (diff, rows) in zip(sinks, merged, strict=True):
        total, repeats = sink.changelog_repeats()
        checks.append(SinkCheck(sink.name, where, rows, diff, total, repeats, note))
    return answer, checks


def verify_job(job: Job, dsns: tuple[str, str | None],
               output_dir: str | os.PathLike[str],
               source_dsns: Mapping[str, str] | None = None,
               check_states: bool = True,
               record_dir: str | os.PathLike[str] | None = None,
               progress: Callable[[str], None] | None = None,
               own_query: OwnQuery | None = None) -> VerifyResult:
    """Compare ``job``'s PostgreSQL sink and Delta current table with PostgreSQL's answer.

    ``dsns`` is ``(source_dsn, sink_dsn)`` (``sink_dsn`` None: check the Delta tables
    only). A job that declares its sources reads each one from ``source_dsns`` (source
    name -> DSN: the caller's, e.g. the local stack's, since verify knows no stack); with
    several, PostgreSQL answers on a copy of their tables in the sink database (else in
    ``source_dsn``'s). Such a job's changelogs get the per-source prefix check, and
    (``check_states``, when the databases keep a change log) txjoin's own check that every
    state the changelog passes through is the job on some state of each source. Raises
    ConfigError when the oracle or a database cannot be reached; mismatches are in the
    result, never raised. ``VerifyResult.referees`` says who answered each check.
    ``record_dir``: where verify's record of the source's history is kept (an
    ``as_of_fact`` job without ``<fact>_expected`` is checked against it). A job of one
    database answered by PostgreSQL is compared in key order, a batch at a time
    (:func:`streamed_checks`); ``progress`` gets a line every few seconds of that, and of
    the replay of verify's record.
    ``own_query``: the user's own query, run on the source as a further referee of each
    sink's current rows (:mod:`txjoin.verify.own_query`; a ``current`` job of one
    database).
    """
    source_dsn, sink_dsn = dsns
    if own_query is not None:
        own_dsn = _own_query_dsn(job, own_query, source_dsn, source_dsns)
    streamed = False
    unchecked: str | None = None  # what could not be checked, for VerifyResult.note
    skipped: set[tuple[Any, ...]] = set()  # output keys left out of the comparison
    orders: dict[str, Mapping[int, int] | None] | None = None
    histories: dict[str, SourceHistory] | None = None
    if job.sources:
        if source_dsns is None:
            raise ConfigError(f"job {job.name!r} declares its sources: give each one's "
                              f"database (--source-dsn NAME=DSN)")
        first = job.sources[0].name
        scratch, scratch_name = ((sink_dsn, "sink") if sink_dsn else (source_dsn, "source")
                                 if source_dsn else (source_dsns.get(first, ""),
                                                     f"{first!r} source"))
        expected, absent, oracle = expected_rows_sources(job, source_dsns, scratch, scratch_name)
        orders = {name: commit_order(dsn) for name, dsn in source_dsns.items()}
        found = {name: read_history(dsn) for name, dsn in source_dsns.items()}
        lacking = sorted(n for n, h in found.items() if h is None)
        unplaced = {n: h.unordered for n, h in found.items() if h is not None and h.unordered}
        if not check_states:
            unchecked = "states not checked: --no-state-check"
        elif lacking:
            unchecked = ("states not checked: " + ", ".join(lacking) + " keep(s) no change "
                         f"log ({CHANGE_LOG}, which `txjoin up --job` databases keep); final "
                         "rows and commit order are checked")
        elif unplaced:
            # Their states cannot be rebuilt in order: say so instead of counting mismatches.
            unchecked = ("states not checked: " + ", ".join(
                f"{n} has {k} transaction(s) with no recorded commit order"
                for n, k in sorted(unplaced.items()))
                + " (its database predates txjoin's commit-order trigger: `txjoin down "
                  "--wipe` and `txjoin up --job` rebuild it); final rows and commit order "
                  "of the recorded ones are checked")
        else:
            histories = {n: typed_history(job, n, h) for n, h in found.items()
                         if h is not None}
    else:
        recorded = (None if job.semantics != "as_of_fact" or record_dir is None
                    else recorded_answer(job, source_dsn, record_dir, progress))
        streamed = recorded is None  # PostgreSQL's answer, read with the sinks' rows below
        if recorded is None:
            expected, absent, oracle = [], set(), ""
        else:
            expected, absent = recorded.present, recorded.absent
            skipped = set(recorded.unchecked)
            # txjoin's Python oracle evaluates the record's states, not PostgreSQL (issue 73).
            oracle = (f"txjoin's own oracle (txjoin/join/oracle.py): the job as of each fact's "
                      f"last commit, replayed from verify's record ({recorded.transactions} "
                      f"transactions decoded by slot {SLOT})")
            if recorded.unchecked:
                unchecked = (f"{len(recorded.unchecked)} fact(s) not checked: last changed "
                             f"before verify's record began, so their lookups' state at that "
                             f"commit is unknown: " + ", ".join(
                                 show(list(k)) for k in recorded.unchecked[:5])
                             + (" ..." if len(recorded.unchecked) > 5 else ""))
    keys = list(job.output.key)
    config = SinkPlaces(output_dir=str(output_dir), postgres_dsn=sink_dsn)
    try:
        sinks = build_sinks(job, config)
    except TxjoinError as exc:
        raise ConfigError(f"cannot open the sinks of job {job.name!r}: {exc}") from None
    checks: list[SinkCheck] = []
    # Both sinks' changelogs pass through the same states: evaluated once for both.
    answers = None if histories is None else StateAnswers(job, histories)
    places = []
    for sink in sinks:
        if sink.name == "delta":
            where = str(Path(output_dir) / job.output.table)
            note = None if (Path(where) / "current" / "_delta_log").is_dir() else (
                f"no Delta table at {where}/current: has the job run with this "
                f"--output-dir?")
        else:
            where = f"table {job.output.table}"
            note = None
        places.append((sink, where, note))
    expected_count, absent_count = len(expected), len(absent)
    try:
        if streamed:
            try:
                answer, checks = streamed_checks(job, source_dsn, places, progress)
            except psycopg2.Error as exc:
                raise ConfigError(f"cannot read the sinks: {' '.join(str(exc).split())}"
                                  ) from None
            oracle, expected_count, absent_count = answer.oracle, answer.present, answer.absent
        for sink, where, note in places if not streamed else ():
            try:
                checks.append(check_sink(sink, where, keys, expected, note, orders, job,
                                         histories, skipped, answers))
            except psycopg2.Error as exc:
                raise ConfigError(f"cannot read the {sink.name} sink: {exc}") from None
        own = None
        if own_query is not None:
            with _connect(own_dsn, "source") as conn:
                try:
                    own = check_own_query(job, own_query, conn, places)
                except psycopg2.Error as exc:
                    raise ConfigError(f"cannot read the sinks: {' '.join(str(exc).split())}"
                                      ) from None
    finally:
        for sink in sinks:
            sink.close()
    referees = [("rows", oracle if oracle.startswith("txjoin's") else f"PostgreSQL: {oracle}"),
                ("exactly once", "each changelog: no key twice at one _commit_seq")]
    if orders is not None:
        referees.append(("commit order", f"each source's {COMMIT_LOG} (its commit trigger)"))
        referees.append(("every state", "txjoin's own oracle (txjoin/join/oracle.py) on each "
                         f"source's {CHANGE_LOG}" if histories is not None
                         else "not checked (see note)"))
    if own_query is not None:
        referees.append(("your query", f"PostgreSQL: {own_query.path} on the source"))
    return VerifyResult(job.name, job.semantics, oracle, expected_count, absent_count, checks,
                        unchecked, referees, own)


def _own_query_dsn(job: Job, own_query: OwnQuery, source_dsn: str,
                   source_dsns: Mapping[str, str] | None) -> str:
    """The database the user's query runs on; a ConfigError where it cannot referee."""
    if job.semantics != "current":
        raise ConfigError(
            f"--against-sql {own_query.path}: job {job.name!r} has as_of_fact semantics, "
            f"whose rows keep each lookup as of the fact's last change, and your query "
            f"answers today's state; compile a current job from it (`txjoin job from-sql "
            f"{own_query.path} --semantics current --name {job.name}_now`) and verify that "
            f"one against it")
    if len(job.sources) > 1:
        raise ConfigError(f"--against-sql {own_query.path}: job {job.name!r} reads "
                          f"{len(job.sources)} databases, and one query runs on one")
    if job.sources and source_dsns is not None:
        return source_dsns[job.sources[0].name]
    return source_dsn
