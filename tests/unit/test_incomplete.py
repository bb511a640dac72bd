"""IncompletePolicy: what happens to a transaction that never completes.

The clock is the source's commit time: a transaction is overdue once every
stream has been read past ``timeout_s`` after it (a topic read to its end counts
as current; one that is merely behind holds the clock back) while it is still
incomplete. A lost event is one that was never written: its topic is read to
its end without it. ``fail`` (default) stops naming the xid and what is missing,
``skip`` drops it and lets later ones pass, ``wait`` waits.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.unit.delivery import Pipeline, insert, only, without
from txjoin.errors import IncompleteTransactionError
from txjoin.job import load_job
from txjoin.sequence.assembly import IncompletePolicy

ORDERS = load_job(Path(__file__).resolve().parents[2] / "jobs" / "orders.py")
T_IN = "2023-09-23T22:00:00"
TEN_MINUTES_MS = 600_000
EVERY_STREAM = {*ORDERS.table_names, "transaction"}


def shop(policy: IncompletePolicy | None = None) -> Pipeline:
    pipe = Pipeline(ORDERS, policy)
    pipe.snapshot({
        "clients": [{"id": 1, "name": "Ann"}],
        "pizzas": [{"id": 1, "name": "Margherita", "price": "8.50"}],
        "tables": [{"id": 1, "name": "T1"}],
        "table_assignment": [{"id": 1, "client_id": 1, "table_id": 1, "time_in": T_IN,
                              "time_out": None}],
        "orders": [],
    })
    pipe.deliver_rest()
    return pipe


def order(id: int, ta: int = 1) -> dict[str, Any]:
    return {"id": id, "table_assignment_id": ta, "order_time": T_IN, "pizzas": [1]}


def enriched(id: int, client: str = "Ann") -> dict[str, Any]:
    return {"order_id": id, "client_name": client, "table_name": "T1",
            "pizzas": [{"pizza": "Margherita", "price": Decimal("8.50")}]}


def short_of_a_client(pipe: Pipeline, later_after_ms: int) -> list[Any]:
    """T1 seats new client 3 and orders; its client event is lost. T2 orders later.

    Returns T1's lost client event. Delivers everything else.
    """
    t1 = pipe.commit("T1", insert("clients", id=3, name="Cid"),
                     insert("table_assignment", id=3, client_id=3, table_id=1, time_in=T_IN,
                            time_out=None),
                     insert("orders", **order(101, ta=3)))
    pipe.synth.now_ms += later_after_ms - 1000  # each commit adds 1 s of its own
    pipe.commit("T2", insert("orders", **order(102)))
    lost = only(t1, table="clients")
    # The event was never written: every topic is read to its end without it.
    pipe.deliver(without(pipe.undelivered(), lost), caught_up=EVERY_STREAM)
    return lost


def test_default_policy_is_fail_after_five_minutes() -> None:
    assert IncompletePolicy() == IncompletePolicy("fail", 300.0)


def test_fail_names_the_xid_and_the_table_short_of_its_count() -> None:
    pipe = shop()
    with pytest.raises(IncompleteTransactionError) as exc:
        short_of_a_client(pipe, later_after_ms=TEN_MINUTES_MS)
    message = str(exc.value)
    assert f"xid {pipe.xids['T1']}" in message
    assert "public.clients has 0 of 1" in message
    assert "--on-incomplete skip" in message


def test_fail_names_the_xid_whose_end_was_never_read() -> None:
    pipe = shop()
    t1 = pipe.commit("T1", insert("orders", **order(101)))
    pipe.synth.now_ms += TEN_MINUTES_MS
    t2 = pipe.commit("T2", insert("orders", **order(102)))
    with pytest.raises(IncompleteTransactionError) as exc:
        pipe.deliver([*without(t1, only(t1, kind="end")), *t2])
    message = str(exc.value)
    assert f"xid {pipe.xids['T1']}" in message
    assert "END marker was never read" in message and "public.orders: 1" in message


def test_transaction_incomplete_but_not_overdue_just_waits() -> None:
    pipe = shop()
    lost = short_of_a_client(pipe, later_after_ms=60_000)
    assert pipe.output == {} and pipe.engine.commit_seq == 0 and pipe.engine.waiting == 2

    pipe.deliver(lost)
    assert pipe.output == {(101,): enriched(101, client="Cid"), (102,): enriched(102)}
    assert pipe.engine.commit_seq == 2 and pipe.matches_oracle_prefix()


def test_overdue_means_strictly_later_than_the_timeout() -> None:
    pipe = shop(IncompletePolicy("fail", timeout_s=60))
    short_of_a_client(pipe, later_after_ms=60_000)  # T2 exactly at the limit: T1 waits
    assert pipe.engine.waiting == 2 and pipe.output == {}
    with pytest.raises(IncompleteTransactionError, match=f"xid {pipe.xids['T1']}"):
        pipe.deliver(pipe.commit("T3", insert("orders", **order(103))),  # 61 s after T1
                     caught_up=EVERY_STREAM)


def test_skip_drops_the_overdue_transaction_and_later_ones_flow() -> None:
    pipe = shop(IncompletePolicy("skip", timeout_s=300))
    lost = short_of_a_client(pipe, later_after_ms=TEN_MINUTES_MS)
    assert pipe.output == {(102,): enriched(102)}
    assert pipe.engine.frontier.skipped == [pipe.xids["T1"]]
    assert [(c.key, c.commit_seq) for c in pipe.changes] == [((102,), 1)]

    # The lost event turns up after all, in a rewind that reads the whole of T1 again:
    # the skipped transaction stays skipped.
    assert lost[0] in pipe.produced["T1"]
    assert pipe.deliver(pipe.produced["T1"]) == []
    assert pipe.engine.waiting == 0
    pipe.deliver(pipe.commit("T3", insert("orders", **order(103))))
    assert pipe.output == {(102,): enriched(102), (103,): enriched(103)}
    assert pipe.engine.commit_seq == 2


def test_a_topic_that_is_only_behind_does_not_make_a_transaction_overdue() -> None:
    """Catch-up split by --max-events-per-trigger: the orders topic lags far behind."""
    pipe = shop(IncompletePolicy("fail", timeout_s=60))
    t1 = pipe.commit("T1", insert("orders", **order(101)))
    pipe.synth.now_ms += TEN_MINUTES_MS
    t2 = pipe.commit("T2", insert("clients", id=7, name="Dee"))
    # everything but T1's order: the transaction topic and clients are 10 minutes ahead
    pipe.deliver(without([*t1, *t2], only(t1, table="orders")),
                 caught_up={"transaction", "public.clients"})
    assert pipe.engine.waiting == 2 and pipe.output == {}
    pipe.deliver(only(t1, table="orders"), caught_up=EVERY_STREAM)
    assert pipe.output == {(101,): enriched(101)} and pipe.engine.commit_seq == 2


def test_wait_holds_later_transactions_behind_the_incomplete_one_however_long() -> None:
    pipe = shop(IncompletePolicy("wait", timeout_s=1))
    lost = short_of_a_client(pipe, later_after_ms=TEN_MINUTES_MS)
    pipe.synth.now_ms += 24 * 3600 * 1000
    pipe.deliver(pipe.commit("T3", insert("orders", **order(103))))
    assert pipe.output == {} and pipe.engine.commit_seq == 0 and pipe.engine.waiting == 3

    pipe.deliver(lost)
    assert sorted(pipe.output) == [(101,), (102,), (103,)]
    assert [c.commit_seq for c in pipe.changes] == [1, 2, 3]
    assert pipe.matches_oracle_prefix()
