"""`verify` compares every column type by value: PostgreSQL's answer equals the sinks' rows.

For each type a value is stored in a real PostgreSQL and read back the way
verify reads its oracle (its own connection settings), both as a column and as
a field of ``jsonb_build_object`` (how a collected lookup arrives); the same
value, as txjoin decodes it, goes through the Arrow table the sinks write and
back to Python (what the Delta table returns). verify's comparison must call
them equal, and must still tell a different value apart.
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pytest

from tests.fixtures.postgres import new_database
from txjoin.job import Job, Output, Table
from txjoin.join.output import changes_to_table, output_schema
from txjoin.join.temporal import OutputChange
from txjoin.sinks.postgres import PostgresSink
from txjoin.verify.diff import values_equal
from txjoin.verify.verify import _connect, _fetch, comparable

MONTH_US = int(365.25 / 12 * 86_400_000_000)  # Debezium's MicroDuration month
UTC = dt.UTC

# sql type -> (SQL literal, the value txjoin decodes from Debezium's record of it)
VALUES: dict[str, tuple[str, Any]] = {
    "date": ("'2024-02-29'", dt.date(2024, 2, 29)),
    "time(3)": ("'10:15:30.123'", dt.time(10, 15, 30, 123000)),
    "time": ("'23:59:59.999999'", dt.time(23, 59, 59, 999999)),
    "timetz": ("'10:15:30+02:00'", dt.time(8, 15, 30)),
    "timestamp(0)": ("'2024-05-01 10:00:01'", dt.datetime(2024, 5, 1, 10, 0, 1, tzinfo=UTC)),
    "timestamptz(3)": ("'2024-05-01 12:00:00.5+02'",
                       dt.datetime(2024, 5, 1, 10, 0, 0, 500000, tzinfo=UTC)),
    "interval": ("'1 year 2 mons 3 days 04:05:06.5'",
                 dt.timedelta(microseconds=14 * MONTH_US)
                 + dt.timedelta(days=3, hours=4, minutes=5, seconds=6.5)),
    "uuid": ("'8C7E3F5A-1B2C-4D5E-8F90-1234567890AB'", "8c7e3f5a-1b2c-4d5e-8f90-1234567890ab"),
    "json": ("'{\"a\": 1.5, \"b\": [true]}'", '{"a": 1.5, "b": [true]}'),
    "jsonb": ("'{\"a\": 1.5}'", '{"a": 1.5}'),
    "bytea": ("'\\x00ff10'", b"\x00\xff\x10"),
    "real": ("1.1", 1.1),
    "money": ("'-1234.5'", Decimal("-1234.50")),
    "numeric": ("12.3450", "12.3450"),
    "varchar(10)": ("'abc'", "abc"),
    "char(3)": ("'ab'", "ab "),
    "date[]": ("ARRAY['2024-01-01'::date, NULL]", [dt.date(2024, 1, 1), None]),
    "uuid[]": ("ARRAY['8c7e3f5a-1b2c-4d5e-8f90-1234567890ab'::uuid]",
               ["8c7e3f5a-1b2c-4d5e-8f90-1234567890ab"]),
    "interval[]": ("ARRAY['PT1S'::interval]", [dt.timedelta(seconds=1)]),
}
DIFFERENT: dict[str, Any] = {"date": dt.date(2024, 3, 1), "interval": dt.timedelta(days=420),
                             "bytea": b"\x00", "real": 1.2, "json": '{"a": 2}',
                             "uuid": str(uuid.uuid4()), "timetz": dt.time(10, 15, 30)}


def _pg_type(sql_type: str) -> str:
    return sql_type.replace("timestamptz(3)", "timestamp(3) with time zone")


@pytest.fixture(scope="module")
def dsn(pg_server: str) -> str:
    """A database of its own on the session's PostgreSQL server (tests/conftest.py)."""
    return new_database(pg_server, "verify_types")


@pytest.fixture(scope="module")
def from_postgres(dsn: str) -> dict[str, tuple[Any, Any]]:
    """sql type -> (the column as verify reads it, the same value as a jsonb field)."""
    with _connect(dsn, "source") as conn:
        out = {}
        for sql_type, (literal, _) in VALUES.items():
            cast = f"{literal}::{_pg_type(sql_type)}"
            row = _fetch(conn, f"SELECT {cast} AS v, jsonb_build_object('f', {cast}) AS j")[0]
            out[sql_type] = (row["v"], row["j"]["f"])
        return out


def _through_arrow(value: Any, sql_type: str) -> Any:
    """The value as a sink holds it: txjoin's Arrow column, read back to Python."""
    job = Job(name="t", tables=[Table("public.t", {"id": "int", "v": sql_type})],
              fact="public.t", fact_alias="t", lookups=[],
              output=Output("out", {"id": "t.id"}, {"v": "t.v"}))
    table = changes_to_table(job, [OutputChange((1,), "c", {"id": 1, "v": value}, 1, 5, 0)])
    return table.column("v").to_pylist()[0]


@pytest.mark.parametrize("sql_type", sorted(VALUES))
def test_postgres_answer_equals_the_decoded_value_as_sinks_hold_it(
        sql_type: str, from_postgres: dict[str, tuple[Any, Any]]) -> None:
    column, field = from_postgres[sql_type]
    decoded = VALUES[sql_type][1]
    sink = comparable(_through_arrow(decoded, sql_type), sql_type)
    assert values_equal(comparable(column, sql_type), sink), (column, sink)
    assert values_equal(comparable(field, sql_type), sink), (field, sink)
    assert values_equal(comparable(decoded, sql_type), sink)
    if sql_type in DIFFERENT:
        other = comparable(_through_arrow(DIFFERENT[sql_type], sql_type), sql_type)
        assert not values_equal(comparable(column, sql_type), other)


def test_every_type_lands_in_the_postgres_sink_and_reads_back_equal(dsn: str) -> None:
    columns = {f"c{i}": t for i, t in enumerate(VALUES)}
    job = Job(name="types", tables=[Table("public.t", {"id": "int", **columns})],
              fact="public.t", fact_alias="t", lookups=[],
              output=Output("types_out", {"id": "t.id"}, {c: f"t.{c}" for c in columns}))
    row = {"id": 1, **{c: VALUES[t][1] for c, t in columns.items()}}
    changes = changes_to_table(job, [OutputChange((1,), "c", row, 1, 5, 0)])
    sink = PostgresSink(dsn, "types_out", "types", ["id"], output_schema(job))
    try:
        assert sink.write(0, changes)
        (read,) = sink.read_current()
    finally:
        sink.close()
    for c, t in columns.items():
        assert values_equal(comparable(read[c], t), comparable(row[c], t)), (t, read[c])
    with _connect(dsn, "sink") as conn:
        declared = {r["attname"]: r["type"] for r in _fetch(
            conn, "SELECT attname, format_type(atttypid, atttypmod) AS type FROM pg_attribute "
                  "WHERE attrelid = 'types_out'::regclass AND attnum > 0")}
    assert {t: declared[c] for c, t in columns.items()} == {
        "date": "date", "time(3)": "time without time zone", "time": "time without time zone",
        "timetz": "time without time zone", "timestamp(0)": "timestamp with time zone",
        "timestamptz(3)": "timestamp with time zone", "interval": "interval", "uuid": "uuid",
        "json": "json", "jsonb": "jsonb", "bytea": "bytea", "real": "real",
        "money": "numeric(19,2)", "numeric": "numeric", "varchar(10)": "text",
        "char(3)": "text", "date[]": "jsonb", "uuid[]": "jsonb", "interval[]": "jsonb"}


CHANGE_LOG_EXTRA: dict[str, tuple[str, Any]] = {
    "double": ("3.14", 3.14), "real[]": ("ARRAY[0.1, NULL]::real[]", [0.1, None]),
    "money[]": ("ARRAY['1.5'::numeric::money]", [Decimal("1.50")]),
    "bytea[]": ("ARRAY['\\x01'::bytea]", [b"\x01"]),
    "interval(neg)": ("'-1 days +02:00:00.25'",
                      dt.timedelta(days=-1, hours=2, microseconds=250000)),
}


@pytest.mark.parametrize("case", sorted(VALUES.keys() | CHANGE_LOG_EXTRA.keys()))
def test_a_value_as_the_change_log_holds_it_reads_as_debezium_s(case: str, dsn: str) -> None:
    """Issue 33: verify's state check reads ``public.txjoin_changes``, where a trigger wrote
    ``to_jsonb(NEW)`` in the writer's session (money with its sign, bytea as \\x hex, an
    interval in the postgres style) and verify parses numbers as Decimal: every type must
    read to the value txjoin decodes from Debezium's record of it."""
    import contextlib
    import json

    import psycopg2

    from txjoin.verify.source_tables import pg_type
    from txjoin.verify.verify import _read_logged

    literal, decoded = {**VALUES, **CHANGE_LOG_EXTRA}[case]
    sql_type = case.split("(neg)")[0] if case.startswith("interval(") else case
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT to_jsonb(r)::text FROM (SELECT 1 AS id, "
                    f"{literal}::{pg_type(_pg_type(sql_type))} AS v) AS r")
        logged = json.loads(cur.fetchone()[0], parse_float=Decimal)
    job = Job(name="t", tables=[Table("public.t", {"id": "int", "v": sql_type})],
              fact="public.t", fact_alias="t", lookups=[],
              output=Output("out", {"id": "t.id"}, {"v": "t.v"}))
    read = _read_logged(job, "public.t", logged, "log:")
    assert read is not None
    assert values_equal(comparable(read["v"], sql_type), comparable(decoded, sql_type)), (
        logged, read)


def test_verify_s_copy_of_several_databases_keeps_every_value(dsn: str) -> None:
    """Issue 39: for a job over several databases verify copies each source's tables (COPY
    text, money as numeric) into temporary tables and asks PostgreSQL there; every type
    must arrive as the source holds it."""
    import contextlib

    import psycopg2

    from txjoin.job import Lookup, Source
    from txjoin.stack.postgres import table_ddl
    from txjoin.verify.source_tables import pg_type
    from txjoin.verify.verify import expected_rows, expected_rows_sources

    columns = {f"c{i}": t for i, t in enumerate(VALUES)}
    facts = Table("public.t", {"id": "int", "other": "int", **columns}, source="a")
    others = Table("public.o", {"id": "int", "tag": "text"}, source="b")
    base = dsn.rsplit("/", 1)[0]
    with contextlib.closing(psycopg2.connect(dsn)) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            for db in ("copy_a", "copy_b"):
                cur.execute(f"DROP DATABASE IF EXISTS {db}")
                cur.execute(f"CREATE DATABASE {db}")
    for db, table, values in (("copy_a", facts, ["1", "7", *(
            f"{VALUES[t][0]}::{pg_type(_pg_type(t))}" for t in columns.values())]),
            ("copy_b", others, ["7", "'x'"])):
        with contextlib.closing(psycopg2.connect(f"{base}/{db}")) as conn, conn, \
                conn.cursor() as cur:
            cur.execute(table_ddl(table))
            cur.execute(f"INSERT INTO {table.name} VALUES ({', '.join(values)})")
            cur.execute(f"INSERT INTO {table.name} (id) VALUES (2)")  # NULLs too
    job = Job(name="copy", sources=[Source("a", prefix="a"), Source("b", prefix="b")],
              tables=[facts, others], fact="public.t", fact_alias="t",
              lookups=[Lookup("o", "public.o", parent="t", on={"id": "other"}, how="left")],
              output=Output("copy_out", {"id": "t.id"},
                            {"tag": "o.tag", **{c: f"t.{c}" for c in columns}}),
              semantics="current")
    copied, _, oracle = expected_rows_sources(
        job, {"a": f"{base}/copy_a", "b": f"{base}/copy_b"}, dsn)
    assert oracle.startswith("the job's query on a copy of a's database and b's database")
    single = Job(name="single", tables=[Table("public.t", facts.columns)], fact="public.t",
                 fact_alias="t", lookups=[],
                 output=Output("o", {"id": "t.id"}, {c: f"t.{c}" for c in columns}),
                 semantics="current")
    direct, _, _ = expected_rows(single, f"{base}/copy_a")
    by_id = {r["id"]: r for r in copied}
    assert by_id[1]["tag"] == "x" and by_id[2]["tag"] is None
    for row in direct:
        for c, t in columns.items():
            assert values_equal(comparable(by_id[row["id"]][c], t), comparable(row[c], t)), (
                t, by_id[row["id"]][c], row[c])
