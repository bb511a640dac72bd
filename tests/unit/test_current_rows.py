"""The Delta sink's rewrite of a small current table (``txjoin.sinks.apply_changes``)
equals applying each key's last change to a dict of rows, whatever the key and payload."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from txjoin.sinks import OP, apply_changes

pytestmark = pytest.mark.unit

CURRENT = pa.schema([pa.field("k1", pa.int64(), nullable=False),
                     pa.field("k2", pa.string(), nullable=False),
                     ("v", pa.list_(pa.struct([("x", pa.int32())]))), ("t", pa.string())])
CHANGES = CURRENT.append(pa.field(OP, pa.string()))

keys = st.tuples(st.integers(0, 4), st.sampled_from(["a", "b", "é"]))
payload = st.tuples(st.one_of(st.none(), st.lists(st.fixed_dictionaries(
    {"x": st.one_of(st.none(), st.integers(-5, 5))}), max_size=2)),
    st.one_of(st.none(), st.text(max_size=3)))


@given(st.dictionaries(keys, payload), st.dictionaries(keys, st.tuples(
    st.sampled_from(["c", "u", "d", "r"]), payload)))
def test_rewrite_equals_applying_each_keys_last_change(
        rows: dict[tuple[int, str], tuple], changes: dict[tuple[int, str], tuple]) -> None:
    current = pa.Table.from_pylist(
        [{"k1": k[0], "k2": k[1], "v": v, "t": t} for k, (v, t) in rows.items()], CURRENT)
    last = pa.Table.from_pylist(
        [{"k1": k[0], "k2": k[1], "v": v, "t": t, OP: op}
         for k, (op, (v, t)) in changes.items()], CHANGES)
    expected = dict(rows)
    for key, (op, value) in changes.items():
        if op == "d":
            expected.pop(key, None)
        else:
            expected[key] = value
    after = apply_changes(current, last, ["k1", "k2"])
    assert after.schema == CURRENT  # the table's own schema, key columns NOT NULL
    got = {(r["k1"], r["k2"]): (r["v"], r["t"]) for r in after.to_pylist()}
    assert after.num_rows == len(got)  # one row per key
    assert got == expected


def test_a_rewrite_of_an_empty_table_and_of_no_change() -> None:
    empty = CURRENT.empty_table()
    last = pa.Table.from_pylist([{"k1": 1, "k2": "a", "v": None, "t": "x", OP: "c"}], CHANGES)
    assert apply_changes(empty, last, ["k1", "k2"]).to_pylist() == [
        {"k1": 1, "k2": "a", "v": None, "t": "x"}]
    assert apply_changes(empty, CHANGES.empty_table(), ["k1", "k2"]).num_rows == 0
