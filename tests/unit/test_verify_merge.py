"""verify's comparison in key order (issue 71): merged a batch at a time, it finds what
pairing every row in memory (``diff_rows``) finds, and a side whose keys do not ascend
is noticed, so that comparison is done in memory instead."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txjoin.verify.diff import diff_rows, row_key
from txjoin.verify.verify import KeyedRows, OutOfOrder, SinkMerge

KEYS = ["id"]


def batches(rows: list[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
    return [rows[i:i + size] for i in range(0, len(rows), size)]


def merged(expected: list[dict[str, Any]], actual: list[dict[str, Any]], size: int) -> SinkMerge:
    merge = SinkMerge(iter(batches(actual, size)), dict, KEYS)
    answer = KeyedRows(iter(batches(expected, size)), dict, KEYS)
    while answer.head is not None:
        merge.offer(*answer.head)
        answer.advance()
    merge.finish()
    return merge


def ids(rows: list[dict[str, Any]]) -> list[int]:
    return sorted(r["id"] for r in rows)


rows = st.dictionaries(st.integers(-50, 50), st.sampled_from(["a", "b", None]), max_size=40)


@given(rows, rows, st.integers(1, 7))
def test_the_merge_in_key_order_finds_what_the_in_memory_diff_finds(
        expected: dict[int, str | None], actual: dict[int, str | None], size: int) -> None:
    exp = [{"id": k, "v": v} for k, v in sorted(expected.items())]
    act = [{"id": k, "v": v, "_commit_seq": 1} for k, v in sorted(actual.items())]
    merge = merged(exp, act, size)
    whole = diff_rows(exp, act, KEYS)
    assert ids(merge.diff.missing) == ids(whole.missing)
    assert ids(merge.diff.extra) == ids(whole.extra)
    assert (sorted((e["id"], a["v"]) for e, a in merge.diff.different)
            == sorted((e["id"], a["v"]) for e, a in whole.different))
    assert merge.rows.count == len(act)


@pytest.mark.parametrize("keys", [[2, 1], [1, 1], [1, None], ["2024-01-02 00:00", "b"]],
                         ids=["descending", "repeated", "a NULL key", "a str and a timestamp"])
def test_keys_that_do_not_ascend_are_noticed(keys: list[Any]) -> None:
    """PostgreSQL's order and Python's disagree (or a key repeats): never a wrong diff."""
    with pytest.raises(OutOfOrder):
        rows = KeyedRows(iter([[{"id": k} for k in keys]]), dict, KEYS)
        while rows.head is not None:
            rows.advance()


def test_the_canonical_key_is_what_pairs_rows() -> None:
    """9 and Decimal 9.0 are one key (as the in-memory diff pairs them)."""
    from decimal import Decimal

    merge = merged([{"id": 9, "v": "a"}], [{"id": Decimal("9.0"), "v": "a"}], 1)
    assert merge.diff.ok and row_key({"id": 9}, KEYS) == row_key({"id": Decimal("9.0")}, KEYS)
