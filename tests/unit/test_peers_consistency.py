"""The peer comparison's prefix hashes and changelog replays, against the scanning oracle;
the Pathway job's reading of the archive (its module imports pathway only in ``main``)."""

from __future__ import annotations

import json
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
from txjoin.peers.pathway import replay_changes
from txjoin.peers.pathway_job import TABLES as PATHWAY_TABLES
from txjoin.peers.pathway_job import changes, table_files
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


def _pathway_line(time: int, diff: int, row: dict) -> str:
    pizzas = [[p["pizza"], p["price"]] for p in row["pizzas"]]
    return json.dumps({"order_id": row["order_id"], "client_name": row["client_name"],
                       "table_name": row["table_name"], "pizzas": pizzas, "time": time,
                       "diff": diff}) + "\n"


def test_pathway_output_is_observed_after_each_time_and_at_every_row(tmp_path: Path) -> None:
    one = {"order_id": 1, "client_name": "a", "table_name": "T1",
           "pizzas": [{"pizza": "Margherita", "price": "8.50"}]}
    two = {"order_id": 2, "client_name": "c", "table_name": "T2",
           "pizzas": [{"pizza": "Diavola", "price": "9.00"}, {"pizza": "Margherita",
                                                              "price": "8.50"}]}
    moved = dict(one, client_name="b")
    typed = [{**r, "pizzas": [dict(p, price=Decimal(p["price"])) for p in r["pizzas"]]}
             for r in (one, two, moved)]
    h1, h2, h3 = (grouped_row_hash(r, "pizzas") for r in typed)
    # the oracle: S0 = {one, two}; after T1, one moved to client b
    hashes = [(h1 + h2) % PRIME, (h2 + h3) % PRIME]
    changes = tmp_path / "changes.jsonl"
    changes.write_text(
        _pathway_line(2, 1, one) + _pathway_line(2, 1, two)  # the snapshot in one time
        + _pathway_line(4, -1, one) + _pathway_line(4, 1, moved)  # T1 in one time
        + _pathway_line(6, 1, moved))  # a duplicate: a state no prefix has
    replay = replay_changes(changes, hashes)
    assert (replay.rows, replay.times) == (5, 3)
    assert (replay.per_time.observed_states, replay.per_time.inconsistent_states) == (3, 1)
    # inside the times: half the snapshot, the gap between -1 and +1, and the duplicate
    assert (replay.every_row.observed_states, replay.every_row.inconsistent_states) == (5, 3)
    assert not replay.per_time.final_equals(hashes) and replay.per_time.furthest_prefix == 1


def test_pathway_job_reads_upserts_deletes_and_skips_tombstones(tmp_path: Path) -> None:
    folder = tmp_path / "shop.public.pizzas" / "partition=0"
    folder.mkdir(parents=True)
    created = {"op": "c", "before": None, "after": {"id": 1, "name": "A", "price": "8.50"}}
    deleted = {"op": "d", "before": {"id": 1, "name": "A", "price": "8.50"}, "after": None}
    wrapped = {"schema": {}, "payload": {"op": "u", "before": None,
                                         "after": {"id": 2, "name": "B", "price": "9.00"}}}
    (folder / "shop.public.pizzas+0+2.json").write_text(json.dumps(wrapped) + "\n")
    (folder / "shop.public.pizzas+0+0.json").write_text(
        json.dumps(created) + "\n" + json.dumps(deleted) + "\nnull\n")
    paths = table_files(str(tmp_path), "shop", "pizzas")
    assert [Path(p).name for p in paths] == ["shop.public.pizzas+0+0.json",
                                             "shop.public.pizzas+0+2.json"]
    columns, _ = PATHWAY_TABLES["pizzas"]
    assert list(changes(paths, columns)) == [
        ("upsert", {"pk": 1, "name": "A", "price": "8.50"}),
        ("delete", {"pk": 1, "name": "A", "price": "8.50"}),
        ("upsert", {"pk": 2, "name": "B", "price": "9.00"})]
    orders, _ = PATHWAY_TABLES["orders"]
    order = {"op": "r", "before": None,
             "after": {"id": 5, "table_assignment_id": 3, "order_time": 0, "pizzas": [1, 1]}}
    line = tmp_path / "o.json"
    line.write_text(json.dumps(order) + "\n")
    assert list(changes([str(line)], orders)) == [
        ("upsert", {"pk": 5, "table_assignment_id": 3, "pizzas": (1, 1)})]
