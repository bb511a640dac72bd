"""verify's column-wise comparison (issue 71) reports exactly what the row-by-row merge
reports: the same missing, extra and different rows, in the same order, over random rows
of the supported types (ints, text, bools, floats with NaN and -0.0, Decimals, timestamps
with and without a zone, JSON documents, lists), random differences, missing and extra
keys, int and text keys, both batch kinds (psycopg2's tuples, Arrow's record batches)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from txjoin.sinks.columns import ArrowColumns, TupleColumns
from txjoin.verify.columnar import ChunkComparer, NotColumnar, merge_columns
from txjoin.verify.diff import surely_equal, values_equal
from txjoin.verify.verify import KeyedRows, SinkMerge

NAMES = ["v_int", "v_text", "v_bool", "v_float", "v_dec", "v_ts", "v_json", "v_list"]

utc = st.datetimes(min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2030, 1, 1),
                   timezones=st.sampled_from([None, dt.UTC, dt.timezone(dt.timedelta(hours=2))]))
VALUES = {
    "v_int": st.one_of(st.none(), st.integers(-3, 3), st.integers(-2**70, 2**70)),
    "v_text": st.one_of(st.none(), st.sampled_from(["a", "b", "", "2024-01-01 00:00",
                                                    "2024-01-01T00:00"]), st.text(max_size=3)),
    "v_bool": st.one_of(st.none(), st.booleans()),
    "v_float": st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.5, float("nan"),
                                                     float("inf")]), st.floats()),
    "v_dec": st.one_of(st.none(), st.sampled_from([Decimal("9.00"), Decimal("9.0"), 9,
                                                   9.0, Decimal("1.10")])),
    "v_ts": st.one_of(st.none(), utc),
    "v_json": st.one_of(st.none(), st.dictionaries(
        st.sampled_from(["x", "y"]), st.one_of(st.integers(0, 2), st.text(max_size=1)),
        max_size=2)),
    "v_list": st.one_of(st.none(), st.lists(st.integers(0, 2), max_size=3)),
}
row_values = st.fixed_dictionaries(VALUES)


def _mutated(row: dict[str, Any], draw: Any) -> dict[str, Any]:
    out = dict(row)
    for name in draw(st.lists(st.sampled_from(NAMES), max_size=2)):
        out[name] = draw(VALUES[name])
    return out


@st.composite
def sides(draw: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    text_keys = draw(st.booleans())
    pool = (st.text(alphabet="abcxyz", min_size=1, max_size=4) if text_keys
            else st.integers(-60, 60))
    keys = sorted(set(draw(st.lists(pool, max_size=40))))
    expected, actual = [], []
    for key in keys:
        row = {"id": key, **draw(row_values)}
        where = draw(st.sampled_from(["both", "both", "both", "expected", "actual"]))
        if where in ("both", "expected"):
            expected.append(row)
        if where in ("both", "actual"):
            twin = _mutated(row, draw) if draw(st.booleans()) else dict(row)
            twin["_commit_seq"] = 1
            actual.append(twin)
    return expected, actual, text_keys


def tuple_batches(rows: list[dict[str, Any]], names: list[str], size: int) -> list[TupleColumns]:
    tuples = [tuple(r[n] for n in names) for r in rows]
    return [TupleColumns(names, tuples[i:i + size]) for i in range(0, len(tuples), size)]


def arrow_batches(rows: list[dict[str, Any]], names: list[str], size: int,
                  text_keys: bool) -> list[ArrowColumns]:
    """The sink's rows as a Delta table holds them: the plain columns as Arrow types."""
    schema = pa.schema([("id", pa.string() if text_keys else pa.int32()),
                        ("v_int", pa.int64()), ("v_text", pa.string()), ("v_bool", pa.bool_()),
                        ("v_float", pa.float64()), ("_commit_seq", pa.int64())])
    out = []
    for i in range(0, len(rows), size):
        part = rows[i:i + size]
        out.append(ArrowColumns(pa.RecordBatch.from_pylist(
            [{n: r[n] for n in names} for r in part], schema=schema)))
    return out


def row_by_row(expected: list[dict[str, Any]], actual: list[dict[str, Any]], size: int
               ) -> SinkMerge:
    merge = SinkMerge(iter([actual[i:i + size] for i in range(0, len(actual), size)]), dict,
                      ["id"])
    answer = KeyedRows(iter([expected[i:i + size] for i in range(0, len(expected), size)]),
                       dict, ["id"])
    while answer.head is not None:
        merge.offer(*answer.head)
        answer.advance()
    merge.finish()
    return merge


COMPARER = ChunkComparer(dict, lambda _name, value: value, lambda _name: True)


@given(sides(), st.integers(1, 9), st.integers(1, 9), st.booleans())
def test_the_column_wise_merge_reports_what_the_row_merge_reports(
        data: tuple[list[dict[str, Any]], list[dict[str, Any]], bool], esize: int,
        asize: int, arrow_sink: bool) -> None:
    expected, actual, text_keys = data
    names = ["id", *NAMES]
    if arrow_sink:  # a Delta table holds the plain columns only (and a row lacks the rest)
        plain = ["id", "v_int", "v_text", "v_bool", "v_float", "_commit_seq"]
        if any(not isinstance(r["v_int"], int | None) or (r["v_int"] is not None
               and abs(r["v_int"]) >= 2**63) or not isinstance(r["v_float"], float | None)
               for r in actual):
            return
        actual = [{n: r[n] for n in plain} for r in actual]
        sink = iter(arrow_batches(actual, plain, asize, text_keys))
    else:
        sink = iter(tuple_batches(actual, [*names, "_commit_seq"], asize))
    try:
        wanted = row_by_row(expected, actual, min(esize, asize)).diff
    except Exception:  # the row merge noticed keys it cannot stream (a text key as a time)
        wanted = None
    try:
        count, [(diff, rows)] = merge_columns("id", iter(tuple_batches(expected, names, esize)),
                                              [sink], COMPARER)
    except NotColumnar:
        return  # verify then runs the row-by-row merge itself
    assert wanted is not None
    assert count == len(expected) and rows == len(actual)
    # repr: the same values (a NaN is no value's equal, its own included)
    assert shown(diff.missing) == shown(wanted.missing)
    assert shown(diff.extra) == shown(wanted.extra)
    assert ([(shown([e]), shown([a])) for e, a in diff.different]
            == [(shown([e]), shown([a])) for e, a in wanted.different])


def shown(rows: list[dict[str, Any]]) -> str:
    """The rows' values, column by column (the test's dicts list columns in any order)."""
    return repr([sorted(r.items()) for r in rows])


@pytest.mark.parametrize("keys", [[2, 1], [1, 1], ["2024-01-02 00:00", "b"], ["a", None]],
                         ids=["descending", "repeated", "a text key as a time", "a NULL key"])
def test_keys_the_column_merge_cannot_promise_are_refused(keys: list[Any]) -> None:
    batch = TupleColumns(["id", "v"], [(k, 1) for k in keys])
    with pytest.raises(NotColumnar):
        merge_columns("id", iter([batch]), [iter([])], COMPARER)


scalars = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from(
    [Decimal("1"), Decimal("1.0"), Decimal("NaN"), 1.0, -0.0, float("nan"), "1", "a",
     "2024-01-01 00:00", "2024-01-01T00:00"]), st.text(max_size=2),
    st.decimals(allow_nan=False, places=2, min_value=-5, max_value=5))
nested = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(["pizza", "price", "x"]), inner, max_size=3)), max_leaves=8)


@given(nested, nested)
def test_surely_equal_says_equal_only_where_values_equal_does(a: Any, b: Any) -> None:
    for x, y in ((a, b), (a, a), (b, b)):
        if surely_equal(x, y):
            assert values_equal(x, y)
