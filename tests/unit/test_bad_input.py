"""Bad input, fuzzed: decoding and column conversion fail only with txjoin errors saying where.

Random JSON, and valid Debezium records with one part replaced by something of
another type, go through ``decode`` and then the job's ``Table.convert_row``:
either they are read, or a ``DecodeError`` names the record's position, or a
``JobError`` names the column. No other exception escapes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from txjoin.errors import DecodeError, JobError
from txjoin.ingest.debezium import ChangeEvent, Position, decode
from txjoin.ingest.types import convert_value
from txjoin.job import load_job

ORDERS = load_job(Path(__file__).resolve().parents[2] / "jobs" / "orders.py")
HERE = Position("shop.public.orders", 2, 17)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)

ORDER_EVENT: dict[str, Any] = {
    "before": None,
    "after": {"id": 100, "table_assignment_id": 4, "order_time": 1695510000000000,
              "pizzas": [1, 2]},
    "source": {"schema": "public", "table": "orders", "txId": 2238, "lsn": 72261064,
               "ts_ms": 1, "snapshot": "false"},
    "transaction": {"id": "2238:72261064", "total_order": 1, "data_collection_order": 1},
    "op": "c", "ts_ms": 2}
END = {"status": "END", "id": "2238:72261448", "event_count": 1,
       "data_collections": [{"data_collection": "public.orders", "event_count": 1}], "ts_ms": 1}


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_records(draw: st.DrawFn) -> str:
    doc = json.loads(json.dumps(draw(st.sampled_from([ORDER_EVENT, END]))))
    path = draw(st.sampled_from(_paths(doc)[1:]))
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    if draw(st.booleans()) and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(json_values)
    return json.dumps(doc)


def _read(value: str | bytes) -> None:
    try:
        item = decode(value, HERE)
    except DecodeError as exc:
        assert (exc.topic, exc.partition, exc.offset) == ("shop.public.orders", 2, 17)
        assert "shop.public.orders[2]@17" in str(exc)
        return
    if isinstance(item, ChangeEvent) and item.table in ORDERS.table_names:
        table = ORDERS.table(item.table)
        for row in (item.before, item.after):
            if row is not None:
                try:
                    table.convert_row(row, where=f"{HERE}:", complete=row is item.after)
                except JobError as exc:
                    assert str(exc).startswith(f"{HERE}: public.orders."), exc


@given(mutated_records())
def test_a_mutated_record_is_read_or_rejected_naming_its_position(value: str) -> None:
    _read(value)


@given(json_values.map(json.dumps) | st.binary(max_size=40) | st.text(max_size=40))
def test_random_input_is_read_or_rejected_naming_its_position(value: str | bytes) -> None:
    _read(value)


@example(2**70, "timestamp", "string")  # beyond datetime's range: OverflowError
@example("1e999999999", "numeric(10,2)", "string")
@example({"scale": 10**20, "value": "AQ=="}, "numeric(10,2)", "precise")
@given(json_values, st.sampled_from(["int", "bigint", "text", "bool", "double", "timestamp",
                                     "timestamptz", "numeric(10,2)", "int[]", "numeric(4,1)[]"]),
       st.sampled_from(["string", "precise", "double"]))
def test_any_value_of_any_type_converts_or_names_the_column(value: Any, sql_type: str,
                                                            mode: str) -> None:
    try:
        convert_value(value, sql_type, where="public.t.c", decimal_handling_mode=mode)
    except JobError as exc:
        assert str(exc).startswith("public.t.c: ")
