"""The current table's sorted merge (``delta_current._merge_sorted``) against the plain
apply-then-sort (``apply_changes`` and a sort by key): same rows, same order."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from txjoin.sinks import OP, apply_changes
from txjoin.sinks.delta_current import _merge_sorted

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string()),
                    ("items", pa.list_(pa.struct([("n", pa.int32())])))])


def _table(keys: list[int], tag: str) -> pa.Table:
    return pa.Table.from_pylist([{"k": k, "v": f"{tag}{k}", "items": [{"n": k}] * (k % 3)}
                                 for k in keys], schema=SCHEMA)


@given(held=st.sets(st.integers(0, 60)),
       changed=st.dictionaries(st.integers(-5, 70), st.sampled_from(["c", "u", "d"])))
def test_the_sorted_merge_is_apply_changes_then_a_sort(held: set[int],
                                                       changed: dict[int, str]) -> None:
    data = _table(sorted(held), "old")
    changes = _table(list(changed), "new").append_column(
        OP, pa.array(list(changed.values()), pa.string()))
    merged = _merge_sorted(data, changes, "k")
    assert merged is not None
    rows, touched = merged
    expected = apply_changes(data, changes, ["k"]).sort_by([("k", "ascending")])
    assert rows.to_pylist() == expected.to_pylist()
    assert touched == (bool(held & set(changed)) or any(op != "d" for op in changed.values()))


def test_a_file_not_sorted_by_key_is_left_to_apply_changes() -> None:
    changes = _table([2], "new").append_column(OP, pa.array(["u"], pa.string()))
    assert _merge_sorted(_table([3, 1, 2], "old"), changes, "k") is None
    assert _merge_sorted(_table([1, 1], "old"), changes, "k") is None  # a key twice
