"""Which looked-up tables the staged engine can split (``txjoin/join/placement.py``), and the
owner hash Spark must compute alike."""

from __future__ import annotations

import dataclasses
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txjoin.errors import JobError
from txjoin.job import load_job
from txjoin.join.placement import Placement, owner_of, splittable

JOBS = Path(__file__).resolve().parents[2] / "jobs"
ORDERS = load_job(JOBS / "orders.py")


def test_lookups_on_a_whole_integer_key_below_the_fact_or_a_split_alias_can_be_split() -> None:
    assert splittable(ORDERS) == ["ta", "c", "t", "p"]


def test_children_a_pick_and_what_is_below_them_stay_copied() -> None:
    # order_lines: Children l (copied) and p below it; users_colors: a Pick
    assert splittable(load_job(JOBS / "order_lines.py")) == []
    assert splittable(load_job(JOBS / "users_colors.py")) == []


def test_a_key_whose_text_is_not_its_json_text_stays_copied() -> None:
    """A numeric key (Debezium may send it as base64 bytes) cannot be placed by the JVM
    without typing it, so a lookup of one is copied."""
    clients = ORDERS.table("public.clients")
    numeric = dataclasses.replace(clients, columns={**clients.columns, "id": "numeric(10,0)"})
    job = dataclasses.replace(ORDERS, tables=[numeric if t.name == clients.name else t
                                              for t in ORDERS.tables])
    assert splittable(job) == ["ta", "t", "p"]


def test_an_alias_below_a_copied_one_stays_copied() -> None:
    placement = Placement(ORDERS, ["c", "t", "p"])  # ta copied: c and t below it too
    assert placement.split == ["p"]
    assert placement.depths == 1
    full = Placement(ORDERS, ["ta", "c", "t", "p"])
    assert full.depth == {"ta": 1, "c": 2, "t": 2, "p": 1}
    assert [lk.alias for lk in full.below["ta"]] == ["c", "t"]


def test_splitting_an_unknown_lookup_is_refused() -> None:
    with pytest.raises(JobError, match="no lookup named"):
        Placement(ORDERS, ["nope"])


@given(key=st.tuples(st.one_of(st.integers(-(2**63), 2**63 - 1), st.text())),
       n=st.integers(1, 64))
def test_the_owner_is_a_crc32_of_the_values_text(key: tuple, n: int) -> None:
    """The hash Spark computes from the JSON text: ``pmod(crc32(concat_ws(U+001F, ...)), n)``
    (an integer's JSON text is its decimal digits, a string's its characters)."""
    expected = 0 if n == 1 else zlib.crc32("\x1f".join(str(v) for v in key).encode()) % n
    assert owner_of(key, n) == expected
    assert 0 <= owner_of(key, n) < n
