"""The current table's sorted merge (``delta_current._merge_sorted``) against the plain
apply-then-sort (``apply_changes`` and a sort by key): same rows, same order; and the staged
changes a work item reads for its key range (``delta_current.StagedChanges``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from txjoin.sinks import OP, apply_changes, last_change_per_key
from txjoin.sinks.delta_current import StagedChanges, _merge_sorted
from txjoin.sinks.delta_stage import write_parquet

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


@given(batches=st.lists(st.dictionaries(st.integers(0, 40), st.sampled_from(["c", "u", "d"]),
                                        min_size=1), min_size=1, max_size=4),
       bounds=st.tuples(st.integers(-2, 42), st.integers(-2, 42)))
def test_staged_changes_of_a_key_range_are_the_last_change_of_each_key_in_it(
        tmp_path_factory: pytest.TempPathFactory, batches: list[dict[int, str]],
        bounds: tuple[int, int]) -> None:
    # Each batch's staged file (sorted by key, small row groups, as delta_stage writes it),
    # in batch order: a key range reads the last change of each of its keys, and only those.
    folder = tmp_path_factory.mktemp("staged")
    schema = SCHEMA.append(pa.field(OP, pa.string()))
    files = []
    for b, changed in enumerate(batches):
        rows = _table(sorted(changed), f"b{b}-").append_column(
            OP, pa.array([changed[k] for k in sorted(changed)], pa.string()))
        files.append(str(folder / f"{b}.parquet"))
        write_parquet(rows, Path(files[-1]), row_group_rows=3)
    staged = StagedChanges(tuple(files), schema, ("k",))
    everything = last_change_per_key(pa.concat_tables(pq.read_table(f) for f in files), ["k"])
    assert sorted(staged.keys()["k"].to_pylist()) == sorted(everything["k"].to_pylist())
    low, high = min(bounds), max(bounds)
    inside = everything.filter(pc.and_(pc.greater_equal(everything["k"], low),
                                       pc.less_equal(everything["k"], high)))
    got = staged.between(low, high, inside.num_rows).read()
    assert got.sort_by("k").to_pylist() == inside.sort_by("k").to_pylist()
    with pytest.raises(RuntimeError, match="staged files changed under a commit"):
        staged.between(low, high, inside.num_rows + 1).read()
