"""PostgreSQL is the referee of txjoin's expressions (txjoin/expr.py) and of verify's SQL.

The pizzeria's tables, with hand-picked rows (NULLs, several times, names with spaces),
live in a database of the session's PostgreSQL server. For a job with filters and
computed columns, verify's ``job_query`` (the job rendered as SQL) is run there, and
its rows must equal, value for value, the oracle's output on the same rows (which
evaluates the expressions in Python): numerics with the same value AND scale, times,
intervals, text and NULLs. Random jobs (filters on the output, on a left lookup and on
the array lookup; computed columns of every kind) and a table of the expressions the
issue lists.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import replace
from decimal import Decimal
from typing import Any

import psycopg2.errors
import pytest
from hypothesis import HealthCheck, given, settings

from tests.fixtures.postgres import new_database
from tests.unit.test_expressions import (
    SNAPSHOT,
    USERS,
    filtered_jobs,
    filtered_users_jobs,
    orders_with,
)
from txjoin.errors import ExpressionValueError
from txjoin.job import Job, Output, Table
from txjoin.join.oracle import Oracle
from txjoin.verify.source_tables import pg_type
from txjoin.verify.verify import _connect, _fetch, comparable, job_query

ROWS: dict[str, list[dict[str, Any]]] = {
    **SNAPSHOT,
    "public.clients": [{"id": 1, "name": "Ann"}, {"id": 2, "name": "Bob"},
                       {"id": 3, "name": " cid "}],
    "public.table_assignment": [
        *SNAPSHOT["public.table_assignment"],
        {"id": 3, "client_id": 3, "table_id": 1, "time_in": "2023-09-24T00:30:00",
         "time_out": "2023-09-24T02:15:00"},
        {"id": 4, "client_id": 9, "table_id": 1, "time_in": "2023-09-23T23:00:00",
         "time_out": None}],
    "public.orders": [
        *SNAPSHOT["public.orders"],
        {"id": 12, "table_assignment_id": 3, "order_time": "2023-09-24T01:05:30",
         "pizzas": [1, 1]},
        {"id": 13, "table_assignment_id": 4, "order_time": "2023-09-23T22:00:00",
         "pizzas": [2, 1]},
        {"id": 14, "table_assignment_id": None, "order_time": "2023-09-24T00:30:00",
         "pizzas": [1]}],
}


def _load(dsn: str, job: Job, rows: dict[str, list[dict[str, Any]]]) -> None:
    with _connect(dsn, "source") as conn, conn.cursor() as cur:
        for table in job.tables:
            cols = ", ".join(f'"{c}" {pg_type(t[:-2]) + "[]" if t.endswith("[]") else pg_type(t)}'
                             for c, t in table.columns.items())
            cur.execute(f"DROP TABLE IF EXISTS {table.name}")
            cur.execute(f"CREATE TABLE {table.name} ({cols}, PRIMARY KEY (id))")
            for row in rows.get(table.name, []):
                names = list(table.columns)
                cur.execute(f"INSERT INTO {table.name} ({', '.join(names)}) VALUES "
                            f"({', '.join(['%s'] * len(names))})", [row[n] for n in names])
        conn.commit()


USERS_ROWS: dict[str, list[dict[str, Any]]] = {
    "public.users": [{"id": 1, "full_name": "Ann Lee"}, {"id": 2, "full_name": "Bo Wu"},
                     {"id": 3, "full_name": "Cy"}, {"id": 4, "full_name": "Di Ng"}],
    "public.users_favorite_color": [
        {"id": 1, "user_id": 1, "favorite_color": "blue"},
        {"id": 2, "user_id": 1, "favorite_color": "red"},
        {"id": 3, "user_id": 2, "favorite_color": "green"},
        {"id": 4, "user_id": 2, "favorite_color": "blue"},
        {"id": 5, "user_id": 3, "favorite_color": "red"},
        {"id": 6, "user_id": None, "favorite_color": "green"}],
}


@pytest.fixture(scope="module")
def dsn(pg_server: str) -> str:
    dsn = new_database(pg_server, "expressions")
    _load(dsn, orders_with(None, None, None, {}, "current"), ROWS)
    _load(dsn, USERS, USERS_ROWS)
    return dsn


def _same(pg: Any, py: Any, sql_type: str) -> bool:
    """Equal as PostgreSQL means it, numerics to the scale (12.50 is not 12.5)."""
    if pg is None or py is None:
        return pg is None and py is None
    kind = sql_type.split("(")[0]
    if kind == "numeric":
        pg = Decimal(pg) if isinstance(pg, str) else pg
        return bool(pg == py) and pg.as_tuple().exponent == py.as_tuple().exponent
    if kind == "double":
        return math.isclose(float(pg), py, rel_tol=1e-12)
    if kind in ("timestamp", "timestamptz") and isinstance(pg, dt.datetime):
        return (pg if pg.tzinfo else pg.replace(tzinfo=dt.UTC)) == py
    return bool(comparable(pg, sql_type) == py)


REFUSALS = (psycopg2.errors.NumericValueOutOfRange, psycopg2.errors.InvalidTextRepresentation)
"""What PostgreSQL raises for a value its type cannot hold (``integer out of range``,
``numeric field overflow``) or text that is not a number; txjoin raises ExpressionValueError."""


def _compare(dsn: str, job: Job, rows: dict[str, list[dict[str, Any]]]) -> int | None:
    """verify's SQL on PostgreSQL vs the oracle on the same rows; the rows compared.

    When PostgreSQL refuses a value, txjoin must refuse it too, in PostgreSQL's words, and
    the other way round (None: no rows to compare)."""
    refused: str | None = None
    with _connect(dsn, "source") as conn:
        try:
            answer = {r["order_id" if "order_id" in r else "id"]: r
                      for r in _fetch(conn, job_query(job))}
        except REFUSALS as exc:
            refused = str(exc).splitlines()[0]
    oracle = Oracle(job)
    try:
        oracle.load_snapshot({t: rows.get(t, []) for t in job.table_names})
    except ExpressionValueError as exc:
        assert refused is not None and f": {refused} in " in str(exc), (
            f"txjoin refused what PostgreSQL answered ({refused!r}): {exc}")
        return None
    assert refused is None, (f"PostgreSQL refused ({refused}) what txjoin answered: "
                             f"{job_query(job)}")
    mine = {key[0]: row for key, row in oracle.output.items()}
    assert sorted(answer) == sorted(mine), (job.where, job_query(job))
    types = job.output_types()
    for key, row in mine.items():
        for name, value in row.items():
            typ = types[name]
            if isinstance(typ, dict):
                continue  # a Collect: compared by verify's own tests
            assert _same(answer[key][name], value, typ), (
                f"{name} = {job.output.columns.get(name)!r} ({typ}) on {key}: PostgreSQL "
                f"{answer[key][name]!r}, txjoin {value!r}")
    return len(mine)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(job=filtered_jobs("current"))
def test_random_filters_and_computed_columns_equal_postgresqls_answer(dsn: str, job: Job
                                                                      ) -> None:
    _compare(dsn, job, ROWS)
    # The random filter often leaves no row: the computed columns on every joined row too
    # (unless both refuse a column's value).
    unfiltered = _compare(dsn, replace(job, where=None), ROWS)
    assert unfiltered is None or unfiltered >= 2


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(job=filtered_users_jobs("current"))
def test_a_filtered_picked_lookup_equals_postgresqls_answer(dsn: str, job: Job) -> None:
    """verify's LATERAL: the lookup's filter in its WHERE, before ORDER BY ... LIMIT 1."""
    _compare(dsn, job, USERS_ROWS)
    assert _compare(dsn, replace(job, where=None), USERS_ROWS) == 4  # a left lookup


# The expressions issue 37 lists, over one row of each kind of value (and a row of NULLs).
EXPRESSIONS = [
    "x.q * x.price", "x.price / x.q", "x.q / 3", "x.q % 3", "(-x.q) / 2", "x.price + 0.005",
    "x.price * x.price", "x.f * 2", "x.first || ' ' || x.last", "x.first || x.q",
    "x.first < x.last", "x.price >= 10", "x.at > timestamptz '2024-01-01 00:00:00+00'",
    "CASE WHEN x.q > 2 THEN 'many' WHEN x.q > 0 THEN 'some' ELSE 'none' END",
    "CASE x.q WHEN 4 THEN x.price ELSE 0 END", "COALESCE(x.last, x.first, 'n/a')",
    "NULLIF(x.q, 4)", "CAST(x.price AS int)", "CAST(x.q AS numeric(6,3))",
    "CAST(x.price AS text)", "x.price::numeric(8,1)", "CAST(x.at AS date)",
    "upper(x.first)", "lower(x.last)", "substring(x.first, 2, 3)",
    "substring(x.first FROM 0 FOR 2)", "length(x.first)", "trim(x.last)",
    "trim(LEADING 'A' FROM x.first)", "round(x.price)", "round(x.price, 1)",
    "round(x.price, -1)", "abs(x.price - 100)", "round(x.f)",
    "date_trunc('day', x.at)", "date_trunc('month', x.ts)", "date_trunc('week', x.ts)",
    "date_trunc('quarter', x.at)", "extract(year FROM x.at)", "extract(dow FROM x.d)",
    "extract(epoch FROM x.ts)", "extract(second FROM x.at)", "extract(doy FROM x.d)",
    "x.at + interval '1 day 2 hours'", "x.ts - interval '90 minutes'", "x.d + 7",
    "x.d - date '2024-01-01'", "x.d + interval '3 hours'", "x.at - x.at2",
    "x.ok AND x.q > 1", "x.ok OR x.q IS NULL", "NOT x.ok", "x.q IN (1, 4, NULL)",
    "x.q NOT IN (1, 2)", "x.q BETWEEN 2 AND 4", "x.last IS NOT NULL", "x.ok IS TRUE",
]
X = Table("public.x", {"id": "int", "q": "int", "price": "numeric(10,2)", "f": "double",
                       "first": "text", "last": "text", "at": "timestamptz",
                       "at2": "timestamptz", "ts": "timestamp", "d": "date", "ok": "bool"})
X_ROWS = [
    {"id": 1, "q": 4, "price": "12.35", "f": 2.5, "first": "Ada", "last": " Lovelace ",
     "at": "2024-02-29T23:59:58.5Z", "at2": "2024-02-27T10:00:00Z",
     "ts": "2024-05-19T13:04:05.123456", "d": "2024-03-03", "ok": True},
    {"id": 2, "q": -7, "price": "-0.05", "f": -3.5, "first": "Émile", "last": "Zola",
     "at": "2023-12-31T00:00:00Z", "at2": "2024-01-02T06:30:00Z",
     "ts": "2023-01-01T00:00:00", "d": "2023-12-31", "ok": False},
    {"id": 3, "q": None, "price": None, "f": None, "first": None, "last": None, "at": None,
     "at2": None, "ts": None, "d": None, "ok": None},
]


def test_the_issues_expressions_equal_postgresqls_answer(dsn: str) -> None:
    job = Job(name="x", tables=[X], fact="public.x", fact_alias="x", lookups=[],
              output=Output("out", {"id": "x.id"},
                            {f"e{i}": e for i, e in enumerate(EXPRESSIONS)}),
              semantics="current")
    _load(dsn, job, {"public.x": X_ROWS})
    assert _compare(dsn, job, {"public.x": X_ROWS}) == len(X_ROWS)
    filtered = Job(name="x", tables=[X], fact="public.x", fact_alias="x", lookups=[],
                   output=Output("out", {"id": "x.id"}, {"p": "x.price * x.q"}),
                   semantics="current", where="x.price * x.q > 0 OR x.ok")
    assert _compare(dsn, filtered, {"public.x": X_ROWS}) == 2  # 12.35*4 > 0, -0.05*-7 > 0


# Values at their type's edges: what PostgreSQL refuses, txjoin refuses in its words.
EDGE = Table("public.edge", {"id": "int", "n": "smallint", "i": "int", "i2": "int",
                             "b": "bigint", "s": "text", "at": "timestamptz"})
EDGE_ROWS = [
    {"id": 1, "n": 32767, "i": 2147483647, "i2": -2147483648, "b": 2**63 - 1, "s": "12x",
     "at": "2023-09-24T01:05:30Z"},
    {"id": 2, "n": -3, "i": 7, "i2": 0, "b": 5, "s": " 7 ", "at": None},
]
REFUSED = {
    "e.i + 1": "integer out of range", "e.i2 - 1": "integer out of range",
    "e.i * 2": "integer out of range", "(-e.i2)": "integer out of range",
    "abs(e.i2)": "integer out of range", "e.i2 / (-1)": "integer out of range",
    "e.n * e.n": "smallint out of range", "e.b + 1": "bigint out of range",
    "CAST((extract(epoch FROM e.at) * e.id) * 2 AS int)": "integer out of range",
    "CAST(e.i AS smallint)": "smallint out of range",
    "CAST(e.i AS numeric(8,2))": "numeric field overflow",
    "CAST(e.s AS int)": 'invalid input syntax for type integer: "12x"',
    "CAST(e.s AS numeric)": 'invalid input syntax for type numeric: "12x"',
    "CAST(e.s AS double precision)": 'invalid input syntax for type double precision: "12x"',
}
ACCEPTED = ["e.i - 1 + 1", "e.i2 + 1", "CAST(e.i AS bigint) + 1", "CAST(e.b AS numeric) + 1",
            "e.n + 0", "e.n * 2", "CAST(extract(epoch FROM e.at) AS int)",
            "CAST(e.n AS numeric(5,0))",
            "CASE WHEN e.id = 2 THEN CAST(e.s AS int) END", "e.b / 2 * 2"]


def _edge_job(expression: str) -> Job:
    return Job(name="edge", tables=[EDGE], fact="public.edge", fact_alias="e", lookups=[],
               output=Output("out", {"id": "e.id"}, {"v": expression}), semantics="current")


@pytest.mark.parametrize("expression", sorted(REFUSED))
def test_a_value_postgresql_refuses_txjoin_refuses_in_its_words(dsn: str, expression: str
                                                                ) -> None:
    job = _edge_job(expression)
    _load(dsn, job, {"public.edge": EDGE_ROWS})
    with _connect(dsn, "source") as conn, pytest.raises(REFUSALS, match=REFUSED[expression]):
        _fetch(conn, job_query(job))
    assert _compare(dsn, job, {"public.edge": EDGE_ROWS}) is None
    with pytest.raises(ExpressionValueError) as caught:
        Oracle(job).load_snapshot({"public.edge": EDGE_ROWS})
    message = str(caught.value)
    assert message.startswith(f"output column 'v': {REFUSED[expression]} in ")
    assert "\n" not in message and "nothing of this batch was written" in message
    assert "e.id 1" in message or "e.id" not in expression  # the row's values


@pytest.mark.parametrize("expression", ACCEPTED)
def test_values_at_the_edge_of_their_type_pass_as_in_postgresql(dsn: str, expression: str
                                                                ) -> None:
    job = _edge_job(expression)
    _load(dsn, job, {"public.edge": EDGE_ROWS})
    assert _compare(dsn, job, {"public.edge": EDGE_ROWS}) == len(EDGE_ROWS)
