"""Every PostgreSQL column type txjoin declares, as Debezium's connector writes it, reads back.

The encoders below follow Debezium's documented PostgreSQL mapping with the
connector's defaults (``time.precision.mode=adaptive``,
``decimal.handling.mode=string`` as txjoin ships it, ``binary.handling.mode=bytes``
= base64 through the JSON converter, ``interval.handling.mode=numeric``), written
from the documentation, not from txjoin's readers. Invariants: a value encoded as
Debezium encodes it decodes to the original Python value; that value survives
txjoin's JSON transport between stages and goes into its Arrow column; a value
that does not fit is one line naming ``table.column`` and ``topic[partition]@offset``.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from txjoin.errors import JobError, TxjoinError
from txjoin.ingest.types import convert_value, type_fits
from txjoin.job import Job, Output, Table
from txjoin.join.engine import Engine
from txjoin.join.output import arrow_type, changes_to_table, row_from_json, row_to_json
from txjoin.join.temporal import OutputChange

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
UTC_TIMES = st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30),
                         timezones=st.just(dt.UTC))


def _micros(delta: dt.timedelta) -> int:
    return delta // dt.timedelta(microseconds=1)


def _at_precision(value: dt.datetime | dt.time, precision: int) -> Any:
    step = 10 ** (6 - precision)
    return value.replace(microsecond=value.microsecond // step * step)


def _float32_text(value: float) -> float:
    # Jackson writes a Java float with Float.toString: the shortest text that reads back
    # as that float32; PostgreSQL's own text for a real is the same digits.
    return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))


def _timestamp_case(precision: int) -> tuple[st.SearchStrategy[Any], Callable[[Any], Any]]:
    millis = precision <= 3  # io.debezium.time.Timestamp, else MicroTimestamp
    return (UTC_TIMES.map(lambda v: _at_precision(v, precision)),
            lambda v: _micros(v - EPOCH) // (1000 if millis else 1))


def _time_case(precision: int, millis: bool | None = None
               ) -> tuple[st.SearchStrategy[Any], Callable[[Any], Any]]:
    if millis is None:
        millis = precision <= 3  # io.debezium.time.Time (int32 ms), else MicroTime (int64 us)
    return (st.times().map(lambda v: _at_precision(v, min(precision, 3) if millis else precision)),
            lambda v: (v.hour * 3600 + v.minute * 60 + v.second) * 10 ** (3 if millis else 6)
            + v.microsecond // (1000 if millis else 1))


# "<type> <setting>": the connector setting's value -> the job's setting that says it
SETTINGS = {"base64-url-safe": {"binary_handling_mode": "base64-url-safe"},
            "base64": {"binary_handling_mode": "base64"}, "hex": {"binary_handling_mode": "hex"},
            "connect": {"time_precision_mode": "connect"},
            "adaptive_time_microseconds": {"time_precision_mode": "adaptive_time_microseconds"}}


def _declared(case: str) -> tuple[str, dict[str, str]]:
    """The declared type of a case and the job settings of its connector setting."""
    sql_type, _, setting = case.partition(" ")
    return sql_type, SETTINGS[setting] if setting else {}


# type -> (natural Python values, the JSON value Debezium writes for one)
CASES: dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], Any]]] = {
    "date": (st.dates(), lambda v: (v - dt.date(1970, 1, 1)).days),  # io.debezium.time.Date
    **{f"timestamp({p})": _timestamp_case(p) for p in range(7)},
    "timestamp": _timestamp_case(6),
    # ZonedTimestamp: ISO-8601 text in UTC
    "timestamptz": (UTC_TIMES, lambda v: v.isoformat().replace("+00:00", "Z")),
    "timestamptz(3)": (UTC_TIMES.map(lambda v: _at_precision(v, 3)),
                       lambda v: v.isoformat().replace("+00:00", "Z")),
    **{f"time({p})": _time_case(p) for p in (0, 3, 4, 6)},
    "time": _time_case(6),
    # ZonedTime: ISO text in UTC; read as the time of day in UTC (Arrow times have no zone)
    "timetz": (st.times(), lambda v: v.isoformat() + "Z"),
    # MicroDuration with interval.handling.mode=numeric
    "interval": (st.timedeltas(min_value=dt.timedelta(days=-10**6),
                               max_value=dt.timedelta(days=10**6)), _micros),
    "uuid": (st.uuids().map(str), lambda v: v),  # io.debezium.data.Uuid: canonical text
    "json": (st.sampled_from(['{"a": 1}', "[]", '"x"', "null"]), lambda v: v),
    "jsonb": (st.sampled_from(['{"a": [1, 2.5]}', "{}"]), lambda v: v),
    "bytea": (st.binary(max_size=40), lambda v: base64.b64encode(v).decode()),
    # "<type> <setting>": the same declared type under another connector setting
    "bytea base64-url-safe": (st.binary(max_size=40),
                              lambda v: base64.urlsafe_b64encode(v).decode()),
    "bytea base64": (st.binary(max_size=40), lambda v: base64.b64encode(v).decode()),
    "bytea hex": (st.binary(max_size=40), lambda v: v.hex()),
    # time.precision.mode=connect: Connect's Time and Timestamp, milliseconds at every
    # precision (values finer than a millisecond are lost: drawn at 3 digits)
    "timestamp(6) connect": (UTC_TIMES.map(lambda v: _at_precision(v, 3)),
                             lambda v: _micros(v - EPOCH) // 1000),
    "timestamp(1) connect": _timestamp_case(1),
    "time(6) connect": _time_case(6, millis=True),
    # adaptive_time_microseconds: MicroTime at every precision; timestamps as adaptive
    "time(2) adaptive_time_microseconds": _time_case(2, millis=False),
    "timestamp(2) adaptive_time_microseconds": _timestamp_case(2),
    "real": (st.floats(width=32, allow_nan=False, allow_infinity=False).map(_float32_text),
             lambda v: json.loads(repr(v))),
    "varchar(20)": (st.text(max_size=20), lambda v: v),
    "char(3)": (st.text(min_size=3, max_size=3), lambda v: v),
    "text": (st.text(), lambda v: v),  # also enums (their label) and text domains
    # decimal.handling.mode=string: money at money.fraction.digits=2, numeric as written
    "money": (st.decimals(min_value=-10**15, max_value=10**15, places=2), str),
    "numeric(10,2)": (st.decimals(min_value=-10**7, max_value=10**7, places=2), str),
    # numeric without scale reads as its exact decimal text (no Arrow decimal holds it)
    "numeric": (st.decimals(allow_nan=False, allow_infinity=False).map(str), lambda v: v),
}


# each case's arrays, built once (Hypothesis checks every strategy it has not seen before)
ARRAYS = {case: st.lists(st.one_of(st.none(), values), max_size=3)
          for case, (values, _encode) in CASES.items()}


@pytest.mark.parametrize("sql_type", sorted(CASES))
@given(data=st.data())
def test_a_value_encoded_as_debezium_encodes_it_decodes_to_the_original(
        sql_type: str, data: st.DataObject) -> None:
    values, encode = CASES[sql_type]
    arrays = ARRAYS[sql_type]
    sql_type, modes = _declared(sql_type)  # "<type> <connector setting>"
    value = data.draw(values)
    wire = json.loads(json.dumps(encode(value)))  # through JSON, as the converter writes it
    assert convert_value(wire, sql_type, **modes) == value
    # the readable form too
    assert convert_value(wire, sql_type, **modes) == convert_value(value, sql_type, **modes)
    array = data.draw(arrays)
    wire_array = json.loads(json.dumps([None if v is None else encode(v) for v in array]))
    assert convert_value(wire_array, f"{sql_type}[]", **modes) == array


@pytest.mark.parametrize("sql_type", sorted(CASES))
@given(data=st.data())
def test_a_decoded_value_survives_transport_and_fits_its_arrow_column(
        sql_type: str, data: st.DataObject) -> None:
    values, encode = CASES[sql_type]
    sql_type, modes = _declared(sql_type)
    value = convert_value(json.loads(json.dumps(encode(data.draw(values)))), sql_type, **modes)
    row = {"v": value, "vs": [value, None]}
    assert row_from_json(row_to_json(row)) == row
    table = changes_to_table(_one_column_job(sql_type), [OutputChange(
        key=(1,), op="c", row={"id": 1, **row}, commit_seq=1, xid=5, commit_ts_ms=0)])
    assert table.schema.field("v").type == arrow_type(sql_type)
    assert pa.types.is_list(table.schema.field("vs").type)


@functools.cache  # one per type, not per example
def _one_column_job(sql_type: str) -> Job:
    return Job(name="t", tables=[Table("public.t", {"id": "int", "v": sql_type,
                                                    "vs": f"{sql_type}[]"})],
               fact="public.t", fact_alias="t", lookups=[],
               output=Output("out", {"id": "t.id"}, {"v": "t.v", "vs": "t.vs"}))


def test_interval_string_mode_equals_numeric_mode() -> None:
    # interval.handling.mode=string writes ISO 8601; numeric counts a month 365.25/12 days.
    month_us = int(365.25 / 12 * 86_400_000_000)
    assert convert_value("P1Y2M3DT4H5M6.78S", "interval") == convert_value(
        14 * month_us + _micros(dt.timedelta(days=3, hours=4, minutes=5, seconds=6.78)),
        "interval")
    assert convert_value("P0D", "interval") == dt.timedelta(0)
    assert convert_value("-PT1.5S", "interval") == dt.timedelta(seconds=-1.5)


def test_variable_scale_numeric_reads_its_own_scale_in_every_mode() -> None:
    # numeric without scale is a VariableScaleDecimal: {scale, value: base64 unscaled}
    wire = {"scale": 3, "value": base64.b64encode((-12345).to_bytes(2, "big", signed=True))
            .decode()}
    assert convert_value(wire, "numeric", decimal_handling_mode="precise") == "-12.345"
    assert convert_value("12.3450", "numeric") == "12.3450"


def test_timetz_reads_in_utc_and_uuid_in_canonical_text() -> None:
    assert convert_value("10:15:30+02:00", "timetz") == dt.time(8, 15, 30)
    assert convert_value("8C7E3F5A-1B2C-4D5E-8F90-1234567890AB", "uuid") == (
        "8c7e3f5a-1b2c-4d5e-8f90-1234567890ab")


@pytest.mark.parametrize(("sql_type", "bad"), [
    ("date", "31/12/2024"), ("uuid", "not-a-uuid"), ("bytea", "@@"), ("interval", "1 day"),
    ("time", 86_400_000_000), ("numeric", "twelve"), ("money", "1.234"), ("json", 5),
])
def test_a_value_that_does_not_fit_is_one_line_naming_column_and_position(
        sql_type: str, bad: Any) -> None:
    job = Job(name="t", tables=[Table("public.t", {"id": "int", "v": sql_type})],
              fact="public.t", fact_alias="t", lookups=[],
              output=Output("out", {"id": "t.id"}, {"v": "t.v"}))
    event = {"before": None, "after": {"id": 1, "v": bad}, "op": "c", "ts_ms": 2,
             "source": {"schema": "public", "table": "t", "txId": 7, "lsn": 10, "ts_ms": 1,
                        "snapshot": "false"},
             "transaction": {"id": "7:10", "total_order": 1, "data_collection_order": 1}}
    begin = {"status": "BEGIN", "id": "7:9", "event_count": None, "ts_ms": 1}
    end = {"status": "END", "id": "7:11", "event_count": 1, "ts_ms": 1,
           "data_collections": [{"data_collection": "public.t", "event_count": 1}]}
    records = [("shop.transaction", 0, 0, json.dumps(begin)),
               ("shop.public.t", 0, 3, json.dumps(event)),
               ("shop.transaction", 0, 1, json.dumps(end))]
    with pytest.raises(TxjoinError) as caught:
        Engine(job).process(records, caught_up={"public.t", "transaction"})
    message = str(caught.value)
    assert "\n" not in message
    assert "public.t.v" in message and "shop.public.t[0]@3" in message, message
    assert f"as {sql_type}" in message


TYPES_JOB = '''
from txjoin.job import Collect, Job, Lookup, Output, Table

job = Job(
    name="types",
    tables=[
        Table("public.visits", {
            "id": "uuid", "day": "date", "at": "time(3)", "at_tz": "timetz",
            "stay": "interval", "sig": "bytea", "doc": "jsonb", "fee": "money",
            "ratio": "numeric", "label": "varchar(8)", "seen": "timestamp(3)",
            "days": "date[]", "places": "int[]"}),
        Table("public.places", {"id": "int", "opened": "date", "code": "char(2)"}),
    ],
    fact="public.visits",
    fact_alias="v",
    lookups=[Lookup("p", "public.places", parent="v", on={"id": "places"}, array=True)],
    output=Output("visits_out", key={"id": "v.id"}, columns={
        "day": "v.day", "at": "v.at", "at_tz": "v.at_tz", "stay": "v.stay", "sig": "v.sig",
        "doc": "v.doc", "fee": "v.fee", "ratio": "v.ratio", "label": "v.label",
        "seen": "v.seen", "days": "v.days",
        "places": Collect("p", {"opened": "p.opened", "code": "p.code"})}),
)
'''

TYPES_SCENARIO = '''
name: every_type
about: Values of every new column type, written as a scenario writer would, reach the output.
job: types_job.py
snapshot:
  public.places:
    - {id: 1, opened: 2020-02-29, code: MI}
transactions:
  - name: t1
    ops:
      - insert: public.visits
        row: {id: 8c7e3f5a-1b2c-4d5e-8f90-1234567890ab, day: 2024-05-01, at: "10:15:30.123",
              at_tz: "10:15:30+02:00", stay: P1DT2H, sig: AP8Q, doc: '{"a": 1}', fee: "12.50",
              ratio: "3.14159", label: short, seen: "2024-05-01T10:00:00.5",
              days: [2024-05-01, null], places: [1, 1]}
expect:
  final:
    - {id: 8c7e3f5a-1b2c-4d5e-8f90-1234567890ab, day: 2024-05-01, at: "10:15:30.123",
       at_tz: "08:15:30Z", stay: PT26H, sig: AP8Q, doc: '{"a": 1}', fee: 12.5,
       ratio: 3.14159, label: short, seen: "2024-05-01T10:00:00.500Z",
       days: [2024-05-01, null],
       places: [{opened: 2020-02-29, code: MI}, {opened: 2020-02-29, code: MI}]}
'''


@pytest.mark.parametrize("settings", [
    "", 'binary_handling_mode="hex", time_precision_mode="connect"',
    'binary_handling_mode="base64-url-safe", time_precision_mode="adaptive_time_microseconds"'])
def test_a_scenario_file_takes_every_new_type(tmp_path: Path, settings: str) -> None:
    """Under each connector setting the job declares: the replay spells the values as that
    connector does (bytea in hex, say), the job reads them back to the scenario's values."""
    from txjoin.scenarios.core_runner import run_scenario_file_core

    job = TYPES_JOB.replace('    name="types",', f'    name="types", {settings},' if settings
                            else '    name="types",')
    (tmp_path / "types_job.py").write_text(job)
    (tmp_path / "every_type.yaml").write_text(TYPES_SCENARIO)
    report = run_scenario_file_core(tmp_path / "every_type.yaml")
    assert report.passed, report.failures


def test_a_job_reads_bytea_and_times_as_its_connector_settings_say() -> None:
    table = Table("public.t", {"id": "int", "b": "bytea", "t": "time(3)", "ts": "timestamp"})
    job = Job(name="modes", tables=[table], fact="public.t", fact_alias="t", lookups=[],
              output=Output("out", {"id": "t.id"}, {"b": "t.b"}),
              binary_handling_mode="hex", time_precision_mode="adaptive_time_microseconds")
    row = job.table("public.t").convert_row({"id": 1, "b": "00ff10", "t": 36930123000,
                                             "ts": 1714557600500000})
    assert row == {"id": 1, "b": b"\x00\xff\x10", "t": dt.time(10, 15, 30, 123000),
                   "ts": dt.datetime(2024, 5, 1, 10, 0, 0, 500000, tzinfo=dt.UTC)}
    connect = job.with_modes(time_precision="connect").table("public.t")
    assert connect.convert_row({"id": 1, "b": "", "t": 36930123, "ts": 1714557600500}) == {
        **row, "b": b""}
    with pytest.raises(JobError, match="binary_handling_mode 'octal' is not one of"):
        job.with_modes(binary="octal")


@pytest.mark.parametrize(("declared", "schema_name", "wire", "value"), [
    # time.precision.mode=connect: every time is Connect's Time (ms), every timestamp ms
    ("time", "org.apache.kafka.connect.data.Time", 36930123, dt.time(10, 15, 30, 123000)),
    ("timestamp", "org.apache.kafka.connect.data.Timestamp", 1714557600500,
     dt.datetime(2024, 5, 1, 10, 0, 0, 500000, tzinfo=dt.UTC)),
    # adaptive_time_microseconds: time(3) arrives as MicroTime
    ("time(3)", "io.debezium.time.MicroTime", 36930123000, dt.time(10, 15, 30, 123000)),
    ("timestamp(6)", "io.debezium.time.NanoTimestamp", 1714557600500000000,
     dt.datetime(2024, 5, 1, 10, 0, 0, 500000, tzinfo=dt.UTC)),
])
def test_with_schemas_the_time_unit_comes_from_the_schema_not_the_declared_precision(
        declared: str, schema_name: str, wire: int, value: Any) -> None:
    from txjoin.ingest.debezium import ChangeEvent, Position, decode

    column = {"type": "int64", "optional": True, "name": schema_name, "field": "v"}
    row_schema = {"type": "struct", "optional": True,
                  "fields": [{"type": "int32", "optional": False, "field": "id"}, column]}
    record = {"schema": {"type": "struct", "fields": [{**row_schema, "field": "before"},
                                                      {**row_schema, "field": "after"}]},
              "payload": {"before": None, "after": {"id": 1, "v": wire}, "op": "r",
                          "ts_ms": 1, "transaction": None,
                          "source": {"schema": "public", "table": "t", "snapshot": "true",
                                     "lsn": 5, "ts_ms": 1}}}
    event = decode(json.dumps(record), Position("shop.public.t", 0, 0))
    assert isinstance(event, ChangeEvent) and event.after is not None
    table = Table("public.t", {"id": "int", "v": declared})
    assert table.convert_row(event.after)["v"] == value


# -- a declared type against the source's (issue 73 item 2: checked before the run starts) --

ALL_TYPES = ["smallint", "int", "bigint", "numeric(3,2)", "numeric(12,2)", "numeric(12,0)",
             "numeric", "double", "real", "text", "varchar(20)", "char(3)", "bool", "date",
             "timestamp", "timestamp(3)", "timestamptz", "time", "time(3)", "timetz",
             "interval", "uuid", "json", "jsonb", "bytea", "money", "int[]", "text[]"]


@given(st.sampled_from(ALL_TYPES), st.sampled_from([None, "adaptive", "connect"]))
def test_a_type_always_fits_itself(sql_type: str, mode: str | None) -> None:
    assert type_fits(sql_type, sql_type, mode)


@pytest.mark.parametrize(("declared", "actual"), [
    ("int", "numeric(3,2)"),  # the fare: '3.60' cannot read as int
    ("int", "bigint"), ("smallint", "int"),  # can overflow
    ("numeric(12,1)", "numeric(12,2)"), ("numeric(4,2)", "numeric(6,2)"),
    ("timestamp", "timestamp(3)"),  # milliseconds would read as microseconds
    ("time(3)", "time"), ("timestamp", "timestamptz"), ("date", "timestamp"),
    ("bool", "int"), ("int", "text"), ("int[]", "int"), ("int", "int[]"),
])
def test_a_declared_type_that_misreads_the_source_does_not_fit(declared: str,
                                                                actual: str) -> None:
    assert not type_fits(declared, actual)


def test_precision_is_only_a_unit_under_the_adaptive_mode() -> None:
    assert type_fits("timestamp", "timestamp(3)", "connect")
    assert not type_fits("time", "time(3)", "adaptive")
    assert type_fits("time", "time(3)", "adaptive_time_microseconds")


NUMBERS = ["smallint", "int", "bigint", "numeric(3,2)", "numeric(12,2)", "numeric(20,0)",
           "numeric", "double"]
_RANGES = {"smallint": 2**15 - 1, "int": 2**31 - 1, "bigint": 2**63 - 1}


@st.composite
def _source_number(draw: st.DrawFn) -> tuple[str, Any]:
    """A source type and one of its values, as Debezium writes it (decimals as text)."""
    actual = draw(st.sampled_from(NUMBERS))
    if actual in _RANGES:
        return actual, draw(st.integers(-_RANGES[actual], _RANGES[actual]))
    if actual == "double":
        return actual, draw(st.floats(allow_nan=False, allow_infinity=False, width=32))
    digits, scale = (20, 4) if actual == "numeric" else map(
        int, actual[len("numeric("):-1].split(","))
    unscaled = draw(st.integers(-(10**digits - 1), 10**digits - 1))
    return actual, str(Decimal(unscaled).scaleb(-scale))


@given(_source_number(), st.sampled_from(NUMBERS))
def test_every_source_value_reads_as_a_declared_type_that_fits(
        source: tuple[str, Any], declared: str) -> None:
    actual, value = source
    if not type_fits(declared, actual):
        return
    read = convert_value(value, declared, where="t.c")
    if declared in _RANGES:
        assert -_RANGES[declared] - 1 <= read <= _RANGES[declared]
    assert Decimal(str(read)) == Decimal(str(value)) or declared in ("double", "real")
