"""A seeded pizzeria workload in memory: for the benchmark and the pipeline tests.

Mixed transaction sizes (about 5 events on average): seating a client and
ordering at once, rapid updates of one order, price changes between orders,
deletes and re-inserts, and ``public.tables`` idle after the snapshot.
"""

from __future__ import annotations

import random
from typing import Any

from txjoin.join.oracle import RowChange, SourceTransaction

PIZZAS = [("Margherita", "8.50"), ("Diavola", "9.00"), ("Napoli", "9.50"), ("Quattro", "11.25")]


def pizzeria_workload(n_transactions: int, seed: int = 0, snapshot_orders: int = 0
                      ) -> tuple[dict[str, list[dict[str, Any]]], list[SourceTransaction]]:
    """(snapshot rows, transactions) of a random but reproducible pizzeria day.

    ``snapshot_orders``: orders already in the database when the snapshot is
    taken (with a quarter as many clients and table assignments), so that the
    state a job carries can be made realistic before the first transaction.
    """
    rnd = random.Random(seed)
    snapshot: dict[str, list[dict[str, Any]]] = {
        "public.pizzas": [{"id": i + 1, "name": n, "price": p} for i, (n, p) in enumerate(PIZZAS)],
        "public.tables": [{"id": i, "name": f"T{i}"} for i in range(1, 9)],
        "public.clients": [{"id": i, "name": f"client-{i}"} for i in range(1, 4)],
        "public.table_assignment": [
            {"id": i, "client_id": i, "table_id": i, "time_in": "2023-09-23T20:00:00",
             "time_out": None} for i in range(1, 4)],
        "public.orders": [],
    }
    prices = {i + 1: p for i, (_, p) in enumerate(PIZZAS)}
    next_id = {"clients": 4, "table_assignment": 4, "orders": 1}
    orders: dict[int, dict[str, Any]] = {}
    assignments = [1, 2, 3]
    extra = snapshot_orders // 4
    for i in range(4, 4 + extra):
        snapshot["public.clients"].append({"id": i, "name": f"client-{i}"})
        snapshot["public.table_assignment"].append({
            "id": i, "client_id": i, "table_id": rnd.randint(1, 8),
            "time_in": "2023-09-22T20:00:00", "time_out": "2023-09-22T22:00:00"})
    next_id["clients"] = next_id["table_assignment"] = 4 + extra
    for oid in range(1, snapshot_orders + 1):
        row = {"id": oid, "table_assignment_id": rnd.randint(1, 3 + extra),
               "order_time": "2023-09-22T21:00:00",
               "pizzas": [rnd.randint(1, len(PIZZAS)) for _ in range(rnd.randint(1, 4))]}
        orders[oid] = row
        snapshot["public.orders"].append(row)
    next_id["orders"] = snapshot_orders + 1
    txs: list[SourceTransaction] = []
    minute = 0

    def when() -> str:
        return f"2023-09-23T{20 + minute // 60 % 4:02d}:{minute % 60:02d}:00"

    def new_order(ta: int) -> RowChange:
        oid = next_id["orders"]
        next_id["orders"] += 1
        row = {"id": oid, "table_assignment_id": ta, "order_time": when(),
               "pizzas": [rnd.randint(1, len(PIZZAS)) for _ in range(rnd.randint(1, 4))]}
        orders[oid] = row
        return RowChange("insert", "public.orders", row)

    for n in range(n_transactions):
        minute += 1
        kind = rnd.random()
        changes: list[RowChange] = []
        if kind < 0.25:  # seat a client and order at once (torn-transaction risk)
            cid, ta = next_id["clients"], next_id["table_assignment"]
            next_id["clients"] += 1
            next_id["table_assignment"] += 1
            changes.append(RowChange("insert", "public.clients", {"id": cid,
                                                                 "name": f"client-{cid}"}))
            changes.append(RowChange("insert", "public.table_assignment", {
                "id": ta, "client_id": cid, "table_id": rnd.randint(1, 8),
                "time_in": when(), "time_out": None}))
            assignments.append(ta)
            for _ in range(rnd.randint(2, 7)):
                changes.append(new_order(ta))
        elif kind < 0.55 and orders:  # rapid successive updates of one order (lookup race)
            oid = rnd.choice(list(orders))
            for _ in range(rnd.randint(3, 8)):
                row = dict(orders[oid], pizzas=[rnd.randint(1, len(PIZZAS))
                                                for _ in range(rnd.randint(1, 4))])
                orders[oid] = row
                changes.append(RowChange("update", "public.orders", row))
        elif kind < 0.65:  # price change between orders
            pid = rnd.randint(1, len(PIZZAS))
            prices[pid] = f"{rnd.randint(700, 1400) / 100:.2f}"
            changes.append(RowChange("update", "public.pizzas", {
                "id": pid, "name": PIZZAS[pid - 1][0], "price": prices[pid]}))
            changes.append(new_order(rnd.choice(assignments)))
        elif kind < 0.75 and orders:  # delete and re-insert
            oid = rnd.choice(list(orders))
            row = orders[oid]
            changes.append(RowChange("delete", "public.orders", {"id": oid}))
            changes.append(RowChange("insert", "public.orders", dict(row, order_time=when())))
        elif kind < 0.8:  # a transaction touching no captured table
            pass
        else:  # a batch of new orders
            ta = rnd.choice(assignments)
            for _ in range(rnd.randint(4, 10)):
                changes.append(new_order(ta))
        txs.append(SourceTransaction(f"t{n + 1}", changes))
    return snapshot, txs
