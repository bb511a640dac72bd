"""The failure modes of the seeds, one example each, delivered in hand-chosen batches.

Each test commits a few source transactions on the pizzeria (``jobs/orders.py``)
or the users/colours job (``jobs/users_colors.py``), delivers Debezium's records
the way a Kafka source could, and checks the output after every batch.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.unit.delivery import Pipeline, delete, insert, only, update, without
from txjoin.errors import DecodeError
from txjoin.ingest.types import UNAVAILABLE
from txjoin.job import Job, load_job
from txjoin.scenarios.synthesize import Produced

JOBS = Path(__file__).resolve().parents[2] / "jobs"
ORDERS = load_job(JOBS / "orders.py")
USERS = load_job(JOBS / "users_colors.py")
T_IN = "2023-09-23T22:00:00"


def with_semantics(job: Job, semantics: str) -> Job:
    return Job(name=job.name, tables=job.tables, fact=job.fact, fact_alias=job.fact_alias,
               lookups=job.lookups, output=job.output, semantics=semantics,  # type: ignore[arg-type]
               source_file=job.source_file)


ORDERS_CURRENT = with_semantics(ORDERS, "current")


def pizzeria(job: Job = ORDERS, orders: list[dict[str, Any]] | None = None,
             **kwargs: Any) -> Pipeline:
    """Ann at table T1 (assignment 1), Bob not seated; three pizzas; snapshot delivered."""
    pipe = Pipeline(job, **kwargs)
    pipe.snapshot({
        "clients": [{"id": 1, "name": "Ann"}, {"id": 2, "name": "Bob"}],
        "pizzas": [{"id": 1, "name": "Margherita", "price": "8.50"},
                   {"id": 2, "name": "Diavola", "price": "9.00"},
                   {"id": 3, "name": "Napoli", "price": "12.25"}],
        "tables": [{"id": 1, "name": "T1"}, {"id": 2, "name": "Patio"}],
        "table_assignment": [
            {"id": 1, "client_id": 1, "table_id": 1, "time_in": T_IN, "time_out": None},
            {"id": 2, "client_id": 2, "table_id": 2, "time_in": T_IN, "time_out": None}],
        "orders": orders or [],
    })
    pipe.deliver_rest()
    pipe.changes.clear()  # tests look at what their transactions emit
    return pipe


def order(id: int, pizzas: list[int], ta: int = 1) -> dict[str, Any]:
    return {"id": id, "table_assignment_id": ta, "order_time": T_IN, "pizzas": pizzas}


PRICES = {1: ("Margherita", "8.50"), 2: ("Diavola", "9.00"), 3: ("Napoli", "12.25")}


def enriched(id: int, pizzas: list[int], client: str = "Ann", table: str = "T1",
             prices: dict[int, tuple[str, str]] | None = None) -> dict[str, Any]:
    menu = {**PRICES, **(prices or {})}
    return {"order_id": id, "client_name": client, "table_name": table,
            "pizzas": [{"pizza": menu[p][0], "price": Decimal(menu[p][1])} for p in pizzas]}


def marker(record: Produced) -> str:
    return f"{record.kind} of {record.tx}"


# -- lookup race (seed 001, scenario 3) --------------------------------------------------


def test_lookup_race_order_updated_fast_never_shows_the_insert_with_the_later_state() -> None:
    pipe = pizzeria()
    pipe.commit("insert", insert("orders", **order(100, [2, 3, 3])))
    pipe.commit("update", update("orders", id=100, pizzas=[1, 1, 1]))
    orders_topic = only(pipe.all_records(), table="orders", kind="data")

    # The orders topic runs ahead: both versions of order 100 are read before any END.
    pipe.deliver([*only(pipe.all_records(), kind="begin", tx="insert"), *orders_topic])
    assert pipe.output == {}
    assert pipe.matches_oracle_prefix()

    pipe.deliver(only(pipe.all_records(), kind="end", tx="insert"))
    assert pipe.output == {(100,): enriched(100, [2, 3, 3])}
    assert pipe.engine.commit_seq == 1 and pipe.matches_oracle_prefix()

    pipe.deliver_rest()
    assert pipe.output == {(100,): enriched(100, [1, 1, 1])}
    assert pipe.engine.commit_seq == 2 and pipe.matches_oracle_prefix()
    assert [(c.op, c.commit_seq, c.row) for c in pipe.changes] == [
        ("c", 1, enriched(100, [2, 3, 3])), ("u", 2, enriched(100, [1, 1, 1]))]


def test_lookup_race_both_transactions_in_one_batch_still_emit_the_insert_as_it_was() -> None:
    pipe = pizzeria()
    pipe.commit("insert", insert("orders", **order(100, [2, 3, 3])))
    pipe.commit("rename", update("clients", id=1, name="Anna"))
    pipe.deliver_rest()
    # as_of_fact: the order keeps the client name it was placed with.
    assert [(c.op, c.commit_seq, c.row) for c in pipe.changes] == [
        ("c", 1, enriched(100, [2, 3, 3]))]
    assert pipe.matches_oracle_prefix()


# -- torn transaction --------------------------------------------------------------------


def test_torn_transaction_waits_for_every_topic_then_emits_the_enriched_order() -> None:
    pipe = pizzeria()
    pipe.commit("seat Cid", insert("clients", id=3, name="Cid"),
                insert("table_assignment", id=3, client_id=3, table_id=2, time_in=T_IN,
                       time_out=None),
                insert("orders", **order(101, [1], ta=3)))
    records = pipe.all_records()

    pipe.deliver([*only(records, table="orders"), *only(records, kind="begin"),
                  *only(records, kind="end")])
    assert pipe.output == {} and pipe.engine.commit_seq == 0 and pipe.engine.waiting == 1

    pipe.deliver(only(records, table="clients", tx="seat Cid"))
    assert pipe.output == {} and pipe.engine.commit_seq == 0

    pipe.deliver(only(records, table="table_assignment", tx="seat Cid"))
    assert pipe.output == {(101,): enriched(101, [1], client="Cid", table="Patio")}
    assert pipe.engine.commit_seq == 1 and pipe.matches_oracle_prefix()


def test_torn_transaction_changing_a_lookup_and_the_fact_is_never_seen_half_applied() -> None:
    pipe = pizzeria(orders=[order(100, [1])])
    pipe.commit("rename and add", update("clients", id=1, name="Ann-Marie"),
                update("orders", id=100, pizzas=[1, 2]))
    records = pipe.all_records()

    # The fact's half first: a torn read would emit [1, 2] with the old name "Ann".
    pipe.deliver([*only(records, table="orders", kind="data", tx="rename and add"),
                  *only(records, kind="begin"), *only(records, kind="end")])
    assert pipe.output == {(100,): enriched(100, [1])}
    assert pipe.changes == [] and pipe.engine.commit_seq == 0

    pipe.deliver_rest()
    assert pipe.output == {(100,): enriched(100, [1, 2], client="Ann-Marie")}
    assert pipe.matches_oracle_prefix()


# -- commit order ------------------------------------------------------------------------


def test_commit_order_blocks_a_complete_later_transaction_behind_an_incomplete_one() -> None:
    pipe = pizzeria()
    pipe.commit("T1 price", update("pizzas", id=1, price="9.99"))
    pipe.commit("T2 order", insert("orders", **order(102, [1])))
    records = pipe.all_records()

    # T2 is complete (END + its order); T1's pizza event lags in the pizzas topic.
    pipe.deliver([*only(records, kind="begin"), *only(records, kind="end"),
                  *only(records, table="orders", tx="T2 order")])
    assert pipe.output == {} and pipe.engine.commit_seq == 0 and pipe.engine.waiting == 2

    changes = pipe.deliver(only(records, table="pizzas", tx="T1 price"))
    assert pipe.engine.commit_seq == 2
    # Released after T1: the order sees T1's price, not the one before it.
    assert [(c.key, c.commit_seq, c.row) for c in changes] == [
        ((102,), 2, enriched(102, [1], prices={1: ("Margherita", "9.99")}))]
    assert pipe.matches_oracle_prefix()


def test_commit_order_releases_both_transactions_in_order_under_current_semantics() -> None:
    pipe = pizzeria(ORDERS_CURRENT, orders=[order(100, [1])])
    pipe.commit("T1 price", update("pizzas", id=1, price="9.99"))
    pipe.commit("T2 order", insert("orders", **order(102, [1, 2])))
    records = pipe.all_records()
    pipe.deliver([*only(records, kind="begin"), *only(records, kind="end"),
                  *only(records, table="orders", tx="T2 order")])
    assert pipe.engine.commit_seq == 0

    changes = pipe.deliver_rest()
    new_price = {1: ("Margherita", "9.99")}
    assert [(c.key, c.op, c.commit_seq, c.row) for c in changes] == [
        ((100,), "u", 1, enriched(100, [1], prices=new_price)),
        ((102,), "c", 2, enriched(102, [1, 2], prices=new_price)),
    ]


# -- idle looked-up table ----------------------------------------------------------------


def test_idle_looked_up_table_does_not_delay_output() -> None:
    # public.tables never changes after the snapshot, and no source ever reports any
    # topic caught up: every order is still released as soon as its transaction is in.
    pipe = Pipeline(ORDERS)
    pipe.snapshot({
        "tables": [{"id": 1, "name": "T1"}],
        "clients": [{"id": 1, "name": "Ann"}],
        "table_assignment": [{"id": 1, "client_id": 1, "table_id": 1, "time_in": T_IN,
                              "time_out": None}],
        "pizzas": [{"id": 1, "name": "Margherita", "price": "8.50"}],
        "orders": [order(1, [1])],
    })
    pipe.deliver(pipe.produced["snapshot"], caught_up=())
    assert pipe.output == {(1,): enriched(1, [1])}
    for n in range(2, 6):
        records = pipe.commit(f"order {n}", insert("orders", **order(n, [1] * n)))
        changes = pipe.deliver(records, caught_up=())
        assert [(c.key, c.row) for c in changes] == [((n,), enriched(n, [1] * n))]
        assert pipe.engine.waiting == 0
    assert pipe.output == pipe.expected()[-1]


# -- as-of versus current ----------------------------------------------------------------


@pytest.mark.parametrize("job", [ORDERS, ORDERS_CURRENT], ids=["as_of_fact", "current"])
def test_price_change_between_two_orders(job: Job) -> None:
    pipe = pizzeria(job)
    pipe.commit("order A", insert("orders", **order(1, [1, 2])))
    pipe.commit("price", update("pizzas", id=1, price="10.00"))
    pipe.commit("order B", insert("orders", **order(2, [1])))
    pipe.deliver_rest()

    new = {1: ("Margherita", "10.00")}
    a_at_placement = enriched(1, [1, 2])
    if job.semantics == "as_of_fact":
        # Order A keeps the price it was placed at; B gets the new one.
        assert pipe.output == {(1,): a_at_placement, (2,): enriched(2, [1], prices=new)}
        assert [(c.key, c.commit_seq) for c in pipe.changes] == [((1,), 1), ((2,), 3)]
    else:
        # A consistent view: the price change re-emits A with the new price.
        assert pipe.output == {(1,): enriched(1, [1, 2], prices=new),
                               (2,): enriched(2, [1], prices=new)}
        assert [(c.key, c.op, c.commit_seq, c.row) for c in pipe.changes] == [
            ((1,), "c", 1, a_at_placement),
            ((1,), "u", 2, enriched(1, [1, 2], prices=new)),
            ((2,), "c", 3, enriched(2, [1], prices=new)),
        ]
    assert pipe.output == pipe.expected()[-1]


# -- delete and re-insert ----------------------------------------------------------------


def test_order_deleted_and_reinserted_comes_back_with_its_new_content() -> None:
    pipe = pizzeria()
    pipe.commit("place", insert("orders", **order(100, [1])))
    pipe.commit("cancel", delete("orders", id=100))
    pipe.commit("place again", insert("orders", **order(100, [3, 3], ta=2)))
    assert len(only(pipe.all_records(), kind="tombstone")) == 1

    seen = []
    for name in ("place", "cancel", "place again"):
        pipe.deliver(pipe.produced[name])
        seen.append(dict(pipe.output))
        assert pipe.matches_oracle_prefix()
    assert seen == [{(100,): enriched(100, [1])}, {},
                    {(100,): enriched(100, [3, 3], client="Bob", table="Patio")}]
    assert [c.op for c in pipe.changes] == ["c", "d", "c"]


def test_client_deleted_and_reinserted_drops_then_restores_orders_under_current() -> None:
    pipe = pizzeria(ORDERS_CURRENT, orders=[order(100, [1])])
    pipe.commit("forget Ann", delete("clients", id=1))
    pipe.commit("order meanwhile", insert("orders", **order(101, [2])))
    pipe.commit("Ann is back", insert("clients", id=1, name="Annie"))

    pipe.deliver(pipe.produced["forget Ann"])
    assert pipe.output == {}  # inner lookup of the client finds nothing
    pipe.deliver(pipe.produced["order meanwhile"])
    assert pipe.output == {}
    pipe.deliver(pipe.produced["Ann is back"])
    assert pipe.output == {(100,): enriched(100, [1], client="Annie"),
                           (101,): enriched(101, [2], client="Annie")}
    assert [(c.key, c.op) for c in pipe.changes] == [
        ((100,), "d"), ((100,), "c"), ((101,), "c")]
    assert pipe.matches_oracle_prefix()


def test_client_deleted_and_reinserted_does_not_rewrite_orders_under_as_of_fact() -> None:
    pipe = pizzeria(orders=[order(100, [1])])
    pipe.commit("forget Ann", delete("clients", id=1))
    pipe.commit("order meanwhile", insert("orders", **order(101, [2])))
    pipe.commit("Ann is back", insert("clients", id=1, name="Annie"))
    pipe.commit("order 101 changed", update("orders", id=101, pizzas=[2, 3]))
    pipe.deliver_rest()
    # 100 keeps the client it was placed with; 101 had no client when placed, and
    # gets Annie once it changes after her return.
    assert pipe.output == {(100,): enriched(100, [1]),
                           (101,): enriched(101, [2, 3], client="Annie")}
    assert [(c.key, c.op, c.commit_seq) for c in pipe.changes] == [((101,), "c", 4)]
    assert pipe.matches_oracle_prefix()


# -- empty transactions ------------------------------------------------------------------


def test_empty_transaction_advances_the_frontier() -> None:
    pipe = pizzeria()
    empty = pipe.commit("touches nothing captured")
    end = json.loads(only(empty, kind="end")[0].value or "")
    assert end["event_count"] == 0 and end["data_collections"] == []

    assert pipe.deliver(empty) == []
    assert pipe.engine.commit_seq == 1 and pipe.engine.waiting == 0

    pipe.commit("order", insert("orders", **order(5, [2])))
    pipe.deliver_rest()
    assert pipe.engine.commit_seq == 2
    assert [(c.key, c.commit_seq) for c in pipe.changes] == [((5,), 2)]


def test_transaction_counting_only_a_table_the_job_does_not_read_is_not_waited_for() -> None:
    pipe = pizzeria()
    audit = pipe.commit("audit only")

    def count_audit_row(end: dict[str, Any]) -> None:
        end["event_count"] = 1
        end["data_collections"] = [{"data_collection": "public.audit", "event_count": 1}]

    pipe.rewrite(only(audit, kind="end")[0], count_audit_row)
    pipe.commit("order", insert("orders", **order(5, [2])))
    pipe.deliver_rest()
    assert pipe.engine.commit_seq == 2
    assert pipe.output == {(5,): enriched(5, [2])}


# -- duplicates --------------------------------------------------------------------------


def test_whole_transaction_redelivered_before_release_is_applied_once() -> None:
    pipe = pizzeria()
    first = pipe.commit("two orders", insert("orders", **order(1, [1])),
                        insert("orders", **order(2, [2])))
    again = pipe.synth.resend(first)
    # Order 1's event twice, order 2's not yet: a count of events would call it complete.
    pipe.deliver([*only(first, kind="begin"), *only(first, kind="end"),
                  only(first, kind="data")[0], *only(again, kind="begin"),
                  only(again, kind="data")[0]])
    assert pipe.output == {} and pipe.engine.commit_seq == 0

    pipe.deliver_rest()
    assert pipe.output == {(1,): enriched(1, [1]), (2,): enriched(2, [2])}
    assert pipe.engine.commit_seq == 1
    assert [c.key for c in pipe.changes] == [(1,), (2,)]


def test_transaction_redelivered_after_release_changes_nothing() -> None:
    pipe = pizzeria()
    placed = pipe.commit("place", insert("orders", **order(1, [1])))
    pipe.commit("change", update("orders", id=1, pizzas=[2]))
    pipe.deliver(placed)
    pipe.deliver(pipe.produced["change"])
    assert pipe.output == {(1,): enriched(1, [2])}

    # The connector sends "place" again after a restart: re-applying it would revert order 1.
    assert pipe.deliver(pipe.synth.resend(placed)) == []
    assert pipe.output == {(1,): enriched(1, [2])} and pipe.engine.commit_seq == 2
    # A consumer rewind (the same offsets read again) is a no-op as well.
    assert pipe.deliver(placed) == []
    assert pipe.output == {(1,): enriched(1, [2])} and pipe.engine.commit_seq == 2
    assert pipe.engine.waiting == 0, "a released transaction's events were buffered again"


# -- pre-3.7 restart pattern -------------------------------------------------------------


def test_restart_inside_a_transaction_waits_for_the_renumbered_run() -> None:
    pipe = pizzeria()
    # Debezium < 3.7 restarts after sending 2 of 3 events, resends from the 2nd,
    # numbered from 1 again, and ENDs with a count of 2 for public.orders.
    records = pipe.commit("three orders", insert("orders", **order(1, [1])),
                          insert("orders", **order(2, [2])),
                          insert("orders", **order(3, [3])), restart=(2, 1))
    assert [r.kind for r in records if r.topic.endswith("transaction")] == [
        "begin", "begin", "end"]
    end = json.loads(only(records, kind="end")[0].value or "")
    assert end["data_collections"] == [{"data_collection": "public.orders", "event_count": 2}]
    data = only(records, kind="data")
    assert len(data) == 4

    # The first run (numbered 1, 2) looks like END's 2 events; the renumbered run lags.
    pipe.deliver([*only(records, kind="begin"), *only(records, kind="end"), *data[:2]])
    assert pipe.output == {} and pipe.engine.commit_seq == 0

    pipe.deliver(data[2:])
    assert pipe.output == {(1,): enriched(1, [1]), (2,): enriched(2, [2]),
                           (3,): enriched(3, [3])}
    assert pipe.engine.commit_seq == 1 and pipe.matches_oracle_prefix()


def test_restart_whose_renumbered_run_is_in_another_table_waits_for_its_topic_end() -> None:
    pipe = pizzeria()
    # Restart after the client and the assignment; only the order is sent again, and
    # END counts only it. Its number 1 cannot tell a first run from a renumbered one.
    records = pipe.commit("seat Cid", insert("clients", id=3, name="Cid"),
                          insert("table_assignment", id=3, client_id=3, table_id=2,
                                 time_in=T_IN, time_out=None),
                          insert("orders", **order(101, [1], ta=3)), restart=(2, 2))
    end = json.loads(only(records, kind="end")[0].value or "")
    assert end["data_collections"] == [{"data_collection": "public.orders", "event_count": 1}]

    pipe.deliver(records, caught_up=())
    assert pipe.output == {} and pipe.engine.commit_seq == 0

    pipe.deliver([])  # the source now reports every topic read to its end
    assert pipe.output == {(101,): enriched(101, [1], client="Cid", table="Patio")}
    assert pipe.engine.commit_seq == 1


# -- arrays ------------------------------------------------------------------------------


def test_array_lookup_keeps_array_order_and_duplicates() -> None:
    pipe = pizzeria()
    pipe.commit("place", insert("orders", **order(7, [3, 1, 3, 3, 2, 1])))
    pipe.commit("reorder", update("orders", id=7, pizzas=[2, 2, 3]))
    pipe.deliver(pipe.produced["place"])
    assert [p["pizza"] for p in pipe.output[(7,)]["pizzas"]] == [
        "Napoli", "Margherita", "Napoli", "Napoli", "Diavola", "Margherita"]
    pipe.deliver(pipe.produced["reorder"])
    assert pipe.output == {(7,): enriched(7, [2, 2, 3])}
    assert pipe.matches_oracle_prefix()


# -- users and favourite colours (seed 000) ----------------------------------------------


def test_users_left_join_colour_null_then_greatest_id_then_fallback() -> None:
    pipe = Pipeline(USERS)
    pipe.snapshot({"users": [{"id": 1, "full_name": "Ann Lee"},
                             {"id": 2, "full_name": "Bo Wu"}]})
    pipe.deliver(pipe.produced["snapshot"])  # the colours topic is empty: caught up
    bo = {"id": 2, "full_name": "Bo Wu", "favorite_color": None}
    assert pipe.output == {(1,): {"id": 1, "full_name": "Ann Lee", "favorite_color": None},
                           (2,): bo}

    pipe.commit("red", insert("users_favorite_color", id=10, user_id=1, favorite_color="red"))
    pipe.commit("blue", insert("users_favorite_color", id=11, user_id=1, favorite_color="blue"))
    pipe.commit("green (older id)",
                insert("users_favorite_color", id=5, user_id=1, favorite_color="green"))
    pipe.commit("drop blue", delete("users_favorite_color", id=11))
    ann_colours = []
    for name in ("red", "blue", "green (older id)", "drop blue"):
        pipe.deliver(pipe.produced[name])
        assert pipe.output[(2,)] == bo and pipe.matches_oracle_prefix()
        ann_colours.append(pipe.output[(1,)]["favorite_color"])
    assert ann_colours == ["red", "blue", "blue", "red"]


# -- unchanged TOAST values --------------------------------------------------------------


def _toasted(columns: list[str]) -> Any:
    """Edit an update event as Debezium sends it without REPLICA IDENTITY FULL."""
    def edit(payload: dict[str, Any]) -> None:
        payload["before"] = None
        for col in columns:
            value = payload["after"][col]
            payload["after"][col] = [UNAVAILABLE] if isinstance(value, list) else UNAVAILABLE
    return edit


def test_unchanged_toast_placeholder_takes_the_previous_text_value() -> None:
    pipe = Pipeline(USERS)
    pipe.snapshot({"users": [{"id": 1, "full_name": "Ann Lee"}, {"id": 2, "full_name": "Bo Wu"}],
                   "users_favorite_color": [{"id": 10, "user_id": 1, "favorite_color": "red"}]})
    moved = pipe.commit("give colour to Bo", update("users_favorite_color", id=10, user_id=2))
    pipe.rewrite(only(moved, kind="data")[0], _toasted(["favorite_color"]))
    pipe.deliver_rest()
    assert pipe.output == {(1,): {"id": 1, "full_name": "Ann Lee", "favorite_color": None},
                           (2,): {"id": 2, "full_name": "Bo Wu", "favorite_color": "red"}}
    assert pipe.matches_oracle_prefix()


def test_unchanged_toast_placeholder_in_an_array_column_takes_the_previous_array() -> None:
    pipe = pizzeria(orders=[order(100, [2, 3, 3])])
    moved = pipe.commit("move to the patio", update("orders", id=100, table_assignment_id=2))
    pipe.rewrite(only(moved, kind="data")[0], _toasted(["pizzas"]))
    pipe.deliver_rest()
    assert pipe.output == {(100,): enriched(100, [2, 3, 3], client="Bob", table="Patio")}


def test_toast_placeholder_without_a_previous_version_is_a_clear_error() -> None:
    pipe = pizzeria()
    records = pipe.commit("odd", insert("orders", **order(100, [1])))
    event = pipe.rewrite(only(records, kind="data")[0], _toasted(["pizzas"]))
    with pytest.raises(DecodeError) as exc:
        pipe.deliver_rest()
    message = str(exc.value)
    assert f"{event.topic}[0]@{event.offset}" in message
    assert "REPLICA IDENTITY FULL" in message and "public.orders" in message


# -- truncate ----------------------------------------------------------------------------


def _truncate(pipe: Pipeline, name: str, table: str, rows: list[dict[str, Any]]) -> None:
    """TRUNCATE ``table`` (holding ``rows``): one ``op: t`` event counted in END.

    Synthesized as a delete of the first row, rewritten into the truncate event
    Debezium sends (no before/after, no tombstone); the oracle sees the deletes.
    """
    table = f"public.{table}"
    key = pipe.job.table(table).key
    records = pipe.commit(name, *(delete(table, **{k: r[k] for k in key}) for r in rows[:1]))
    pipe.transactions[-1].changes.extend(
        delete(table, **{k: r[k] for k in key}) for r in rows[1:])
    pipe.synth.db[table].clear()

    def to_truncate(payload: dict[str, Any]) -> None:
        payload.update(op="t", before=None, after=None)

    pipe.rewrite(only(records, kind="data")[0], to_truncate)
    tombstone = only(records, kind="tombstone")[0]
    assert pipe.synth.topics[tombstone.topic][-1] == tombstone
    pipe.synth.topics[tombstone.topic].pop()
    pipe.produced[name] = without(pipe.produced[name], [tombstone])


def test_truncate_of_the_fact_table_deletes_every_output_row() -> None:
    orders = [order(1, [1]), order(2, [2])]
    pipe = pizzeria(orders=orders)
    _truncate(pipe, "truncate orders", "orders", orders)
    pipe.commit("new order", insert("orders", **order(3, [3])))
    assert len(pipe.output) == 2

    pipe.deliver(pipe.produced["truncate orders"])
    assert pipe.output == {}
    assert sorted((c.key, c.op) for c in pipe.changes) == [((1,), "d"), ((2,), "d")]
    pipe.deliver_rest()
    assert pipe.output == {(3,): enriched(3, [3])} and pipe.matches_oracle_prefix()


def test_truncate_of_a_looked_up_table_drops_the_orders_needing_it_under_current() -> None:
    pipe = pizzeria(ORDERS_CURRENT, orders=[order(1, [1])])
    _truncate(pipe, "truncate pizzas", "pizzas", [{"id": 1}, {"id": 2}, {"id": 3}])
    pipe.deliver_rest()
    assert pipe.output == {}
    assert [(c.key, c.op) for c in pipe.changes] == [((1,), "d")]
    assert pipe.matches_oracle_prefix()


# -- schemas.enable=true -----------------------------------------------------------------


def test_schemas_enable_true_envelope_is_accepted() -> None:
    pipe = pizzeria(schemas_enable=True, orders=[order(1, [1])])
    assert json.loads(pipe.produced["snapshot"][0].value or "").keys() == {"schema", "payload"}
    pipe.commit("place", insert("orders", **order(2, [2, 2])))
    pipe.commit("cancel", delete("orders", id=1))
    pipe.deliver_rest()
    assert pipe.output == {(2,): enriched(2, [2, 2])}
    assert pipe.engine.commit_seq == 2 and pipe.matches_oracle_prefix()
