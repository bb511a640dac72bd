"""The peer comparison's prefix hashes and changelog replay, against the scanning oracle."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from txjoin.job import load_job
from txjoin.join.oracle import outputs_after_each
from txjoin.peers.consistency import (
    MOD,
    PRIME,
    ChangelogReplay,
    grouped_prefix_hashes,
    grouped_row_hash,
    prefix_hashes,
    row_hash,
)
from txjoin.scenarios.workload import pizzeria_workload

ORDERS = Path(__file__).resolve().parents[2] / "jobs" / "orders.py"


def multiset_hash(rows: dict, ordered: bool = True) -> int:
    return sum(row_hash(r, ordered) for r in rows.values()) % MOD


@pytest.mark.parametrize("semantics", ["as_of_fact", "current"])
@pytest.mark.parametrize("ordered", [True, False])
def test_incremental_prefix_hashes_equal_the_oracles_output_after_every_transaction(
        semantics: str, ordered: bool) -> None:
    job = replace(load_job(ORDERS), semantics=semantics)
    snapshot, txs = pizzeria_workload(150, seed=4)
    expected = [multiset_hash(out, ordered) for out in outputs_after_each(job, snapshot, txs)]
    assert prefix_hashes(job, snapshot, txs, ordered) == expected


@pytest.mark.parametrize("seed", [4, 11])
def test_grouped_hashes_follow_price_changes_without_visiting_orders_and_equal_the_oracles(
        seed: int) -> None:
    job = replace(load_job(ORDERS), semantics="current")
    snapshot, txs = pizzeria_workload(150, seed=seed)
    expected = [sum(grouped_row_hash(r, "pizzas") for r in out.values()) % PRIME
                for out in outputs_after_each(job, snapshot, txs)]
    assert grouped_prefix_hashes(job, snapshot, txs) == expected


def test_grouped_hash_ignores_element_order_but_not_elements() -> None:
    row = {"order_id": 1, "client_name": "a", "table_name": "T1",
           "pizzas": [{"pizza": "A", "price": Decimal("9.40")}, {"pizza": "B", "price": 8}]}
    swapped = dict(row, pizzas=list(reversed(row["pizzas"])))
    fewer = dict(row, pizzas=row["pizzas"][:1])
    assert grouped_row_hash(row, "pizzas") == grouped_row_hash(swapped, "pizzas")
    assert grouped_row_hash(row, "pizzas") != grouped_row_hash(fewer, "pizzas")


def test_the_two_semantics_differ_once_a_price_changes() -> None:
    job = load_job(ORDERS)
    snapshot, txs = pizzeria_workload(150, seed=4)
    assert (prefix_hashes(job, snapshot, txs, semantics="current")[-1]
            != prefix_hashes(job, snapshot, txs, semantics="as_of_fact")[-1])


def test_partial_snapshots_and_retraction_gaps_are_inconsistent_states() -> None:
    other = {"order_id": 2, "client_name": "c", "table_name": "T2",
             "pizzas": [{"pizza": "Diavola", "price": "9.00"}]}
    before = {"order_id": 1, "client_name": "a", "table_name": "T1",
              "pizzas": [{"pizza": "Margherita", "price": "8.50"}]}
    after = dict(before, client_name="b")
    hashes = [(row_hash(other) + row_hash(before)) % MOD, (row_hash(other) + row_hash(after)) % MOD]
    replay = ChangelogReplay(hashes)
    for op, row in [("+", other), ("+", before), ("-", before), ("+", after)]:
        (replay.add if op == "+" else replay.retract)(row)
        replay.observe()
    assert replay.result.observed_states == 4
    assert replay.result.inconsistent_states == 2  # half the snapshot; between -U and +U
    assert replay.result.furthest_prefix == 1 and replay.result.final_equals(hashes)


def test_unordered_comparison_ignores_array_order_and_decimal_spelling() -> None:
    a = {"order_id": 1,
         "pizzas": [{"pizza": "A", "price": Decimal("9.40")}, {"pizza": "B", "price": 8}]}
    b = {"order_id": 1, "pizzas": [{"pizza": "B", "price": 8.0}, {"pizza": "A", "price": 9.4}]}
    assert row_hash(a, ordered=False) == row_hash(b, ordered=False)
    assert row_hash(a) != row_hash(b)
