"""The snapshot (transaction 0) is released only once every job table has settled.

See the docstring of ``txjoin/sequence/assembly.py``: a table settles on its closing
row (``last_in_data_collection`` / ``last``), on a streaming event of it, or when
the source reports its topic read to the end after the snapshot visibly finished.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.unit.delivery import Pipeline, insert, only
from txjoin.errors import OrderingError
from txjoin.job import load_job

JOBS = Path(__file__).resolve().parents[2] / "jobs"
ORDERS = load_job(JOBS / "orders.py")
USERS = load_job(JOBS / "users_colors.py")
T_IN = "2023-09-23T22:00:00"

PIZZERIA = {  # orders last: its closing row is the snapshot's `last`
    "clients": [{"id": 1, "name": "Ann"}, {"id": 2, "name": "Bob"}],
    "pizzas": [{"id": 1, "name": "Margherita", "price": "8.50"},
               {"id": 2, "name": "Diavola", "price": "9.00"}],
    "tables": [{"id": 1, "name": "T1"}],
    "table_assignment": [{"id": 1, "client_id": 2, "table_id": 1, "time_in": T_IN,
                          "time_out": None}],
    "orders": [{"id": 10, "table_assignment_id": 1, "order_time": T_IN, "pizzas": [1, 2]}],
}
ORDER_10 = {"order_id": 10, "client_name": "Bob", "table_name": "T1",
            "pizzas": [{"pizza": "Margherita", "price": Decimal("8.50")},
                       {"pizza": "Diavola", "price": Decimal("9.00")}]}


def snapshot_of(pipe: Pipeline, table: str) -> list[Any]:
    return only(pipe.produced["snapshot"], table=table)


def test_snapshot_markers_are_what_debezium_writes() -> None:
    pipe = Pipeline(ORDERS)
    pipe.snapshot(PIZZERIA)
    markers = [(r.table, json.loads(r.value or "")["source"]["snapshot"])
               for r in pipe.produced["snapshot"]]
    assert markers == [
        ("public.clients", "first"), ("public.clients", "last_in_data_collection"),
        ("public.pizzas", "first_in_data_collection"),
        ("public.pizzas", "last_in_data_collection"),
        ("public.tables", "last_in_data_collection"),
        ("public.table_assignment", "last_in_data_collection"),
        ("public.orders", "last")]


def test_snapshot_waits_for_every_table_whatever_order_their_rows_arrive_in() -> None:
    pipe = Pipeline(ORDERS)
    pipe.snapshot(PIZZERIA)
    # The `last` row (orders) arrives first, with the first client: nothing is complete.
    pipe.deliver([*snapshot_of(pipe, "orders"), snapshot_of(pipe, "clients")[0]])
    assert pipe.output == {} and not pipe.engine.assembler.snapshot.done
    # The rest of the clients and all the pizzas: tables and assignments still missing.
    pipe.deliver([snapshot_of(pipe, "clients")[1], *snapshot_of(pipe, "pizzas")])
    assert pipe.output == {} and not pipe.engine.assembler.snapshot.done
    pipe.deliver(snapshot_of(pipe, "table_assignment"))
    assert pipe.output == {}
    pipe.deliver(snapshot_of(pipe, "tables"))
    assert pipe.output == {(10,): ORDER_10}
    assert pipe.engine.snapshot_released and pipe.engine.commit_seq == 0


def test_a_table_is_not_settled_by_its_first_rows_only() -> None:
    pipe = Pipeline(ORDERS)
    pipe.snapshot(PIZZERIA)
    first_pizza = snapshot_of(pipe, "pizzas")[0]
    pipe.deliver([r for r in pipe.produced["snapshot"] if r != snapshot_of(pipe, "pizzas")[1]],
                 caught_up=())
    assert pipe.output == {}
    assert first_pizza.offset == 0
    pipe.deliver([snapshot_of(pipe, "pizzas")[1]])
    assert pipe.output == {(10,): ORDER_10}


def test_empty_table_settles_when_its_topic_is_caught_up_after_the_snapshot_finished() -> None:
    pipe = Pipeline(USERS)
    pipe.snapshot({"users": [{"id": 1, "full_name": "Ann Lee"}],
                   "users_favorite_color": []})
    # Caught up before anything shows the snapshot finished: proves nothing yet.
    pipe.deliver([], caught_up={"users_favorite_color"})
    pipe.deliver(pipe.produced["snapshot"], caught_up=())
    assert pipe.output == {} and not pipe.engine.assembler.snapshot.done

    pipe.deliver([], caught_up={"users_favorite_color"})
    assert pipe.output == {(1,): {"id": 1, "full_name": "Ann Lee", "favorite_color": None}}


def test_empty_table_settles_on_caught_up_once_a_transaction_marker_was_read() -> None:
    pipe = Pipeline(USERS)
    pipe.snapshot({"users": [{"id": 1, "full_name": "Ann Lee"}, {"id": 2, "full_name": "Bo"}]})
    records = pipe.commit("rename", insert("users", id=3, full_name="Cy"))
    users = [r for r in pipe.all_records() if r.table == "public.users"]
    # Ann's row, but not Bo's closing `last` row; the transaction topic is read.
    pipe.deliver([users[0], *only(records, kind="begin")], caught_up={"users_favorite_color"})
    assert pipe.output == {}
    pipe.deliver([*users[1:], *only(records, kind="end")])
    assert sorted(pipe.output) == [(1,), (2,), (3,)]
    assert pipe.engine.commit_seq == 1


def test_streaming_transaction_waits_until_the_snapshot_is_complete() -> None:
    pipe = Pipeline(ORDERS)
    pipe.snapshot(PIZZERIA)
    records = pipe.commit("order 11", insert("orders", id=11, table_assignment_id=1,
                                             order_time=T_IN, pizzas=[2]))
    # Everything but the pizzas' snapshot: order 11 is complete, the snapshot is not.
    pipe.deliver([*without_table(pipe.produced["snapshot"], "public.pizzas"), *records])
    assert pipe.output == {} and pipe.engine.commit_seq == 0 and pipe.engine.waiting == 1

    pipe.deliver(snapshot_of(pipe, "pizzas"))
    assert pipe.engine.commit_seq == 1
    assert pipe.output[(11,)]["pizzas"] == [{"pizza": "Diavola", "price": Decimal("9.00")}]
    assert pipe.output == pipe.expected()[1]
    assert [(c.key, c.commit_seq) for c in pipe.changes] == [((10,), 0), ((11,), 1)]


def without_table(records: list[Any], table: str) -> list[Any]:
    return [r for r in records if r.table != table]


def test_a_streaming_event_settles_its_table() -> None:
    pipe = Pipeline(ORDERS)
    snapshot = {**PIZZERIA, "orders": []}
    pipe.snapshot(snapshot)
    records = pipe.commit("order 11", insert("orders", id=11, table_assignment_id=1,
                                             order_time=T_IN, pizzas=[1]))
    # The orders topic has no snapshot row; its first streaming event settles it.
    pipe.deliver([*pipe.produced["snapshot"], *records], caught_up=())
    assert sorted(pipe.output) == [(11,)] and pipe.engine.commit_seq == 1


def test_late_snapshot_row_after_completion_is_an_ordering_error() -> None:
    pipe = Pipeline(ORDERS)
    pipe.snapshot(PIZZERIA)
    pipe.deliver_rest()
    assert pipe.engine.snapshot_released

    # Rewound delivery of rows already applied is fine...
    assert pipe.deliver(snapshot_of(pipe, "pizzas")) == []
    # ...a row the snapshot never had is not.
    late = pipe.synth.snapshot({"public.pizzas": [{"id": 3, "name": "Napoli",
                                                   "price": "12.25"}]})
    with pytest.raises(OrderingError) as exc:
        pipe.deliver(late)
    message = str(exc.value)
    assert "public.pizzas" in message and f"shop.public.pizzas[0]@{late[0].offset}" in message
    assert "after the snapshot was complete" in message


def test_an_incremental_snapshot_row_before_the_initial_snapshot_stops_the_job_in_one_line(
        ) -> None:
    """A table whose initial snapshot txjoin has not read yet (a table added to a running
    capture) is refused: applying it would need releases held until its incremental
    snapshot completes (tests/unit/test_incremental_snapshots.py: the rest)."""
    pipe = Pipeline(ORDERS)
    pipe.snapshot(PIZZERIA)
    row = pipe.synth.incremental("public.pizzas", PIZZERIA["pizzas"][:1])[0]
    before = sorted(pipe.output)
    with pytest.raises(OrderingError) as exc:
        pipe.deliver([row])
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith(f"incremental snapshot row of public.pizzas at "
                              f"shop.public.pizzas[0]@{row.offset} (Debezium's "
                              f"execute-snapshot signal) before txjoin has the table's initial "
                              f"snapshot")
    assert "new topic prefix) and run with --rebuild" in message
    assert sorted(pipe.output) == before
