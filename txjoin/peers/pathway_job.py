"""The Pathway peer: the seed's enrichment query over archived Debezium files, in Pathway.

Runs in an interpreter that has ``pathway`` (``scripts/pathway-env.sh``: its own venv,
never txjoin's) and imports nothing but pathway and the standard library::

    python -m txjoin.peers.pathway_job --archive DIR --prefix shop --out changes.jsonl \\
        --summary S.json [--autocommit-ms 1500]

Each table is read by its own ``pw.io.python.read`` subject (an upsert session keyed
by the table's primary key) from ``DIR/<prefix>.<schema>.<table>/partition=0``, its
files in offset order: a record's ``after`` is an upsert, a delete's ``before`` a
deletion, tombstones are skipped. That is what ``pw.io.debezium.read`` does with a
topic, which it reads only from Kafka (and only in the ``{"payload": ...}`` envelope
of ``schemas.enable=true``): here every system reads the same archived files. Like
``pw.io.debezium.read``, each reader ignores the transaction topic and commits what
it has read every ``autocommit_duration_ms`` (Pathway's default 1,500 ms, or
``--autocommit-ms``), each table on its own timer.

The query is seed 001's in Pathway's API: ``flatten`` of the pizzas array, inner
joins to pizzas, table_assignment, clients and tables, grouped per (order, client,
table) with a tuple of (pizza, price) per element (no defined order, like Flink's
``JSON_ARRAYAGG``). ``pw.io.jsonlines.write`` writes every change of the result with
Pathway's ``time`` (the engine's logical time: one per commit of its inputs, a
timestamp in ms) and ``diff`` (+1 / -1) to ``--out``; ``txjoin.peers.pathway``
replays it. Timings go to the ``--summary`` JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

# (table, {column: Python type}, primary key); time columns are left out (the query does
# not use them); prices stay strings (Debezium's decimal.handling.mode=string, exact).
TABLES: dict[str, tuple[dict[str, type], str]] = {
    "clients": ({"id": int, "name": str}, "id"),
    "pizzas": ({"id": int, "name": str, "price": str}, "id"),
    "tables": ({"id": int, "name": str}, "id"),
    "table_assignment": ({"id": int, "client_id": int, "table_id": int}, "id"),
    "orders": ({"id": int, "table_assignment_id": int, "pizzas": tuple}, "id"),
}

# Pathway reserves ``id`` for a row's own pointer: a table's ``id`` column is read as ``pk``.
COLUMN = {"id": "pk"}

DEFAULT_AUTOCOMMIT_MS = 1500  # pw.io.python.read's and pw.io.debezium.read's default


def table_files(archive: str, prefix: str, table: str) -> list[str]:
    """``public.<table>``'s archived files (its only partition), in offset order."""
    folder = os.path.join(archive, f"{prefix}.public.{table}", "partition=0")
    if not os.path.isdir(folder):
        return []
    names = [n for n in os.listdir(folder) if n.endswith(".json")]
    names.sort(key=lambda n: int(n.rsplit("+", 1)[1].split(".", 1)[0]))
    return [os.path.join(folder, n) for n in names]


def changes(paths: list[str], columns: dict[str, type]) -> Any:
    """``(op, row)`` of each Debezium record in ``paths``: ``("upsert", after)`` for
    c/r/u, ``("delete", before)`` for d; tombstones (``null``) skipped; ``id`` as ``pk``."""
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                record = json.loads(line)
                if record is None:
                    continue
                if "payload" in record and "op" not in record:
                    record = record["payload"]  # schemas.enable=true
                if record["op"] == "d":
                    op, row = "delete", record["before"]
                else:
                    op, row = "upsert", record["after"]
                # a NULL array unnests to no rows, as an empty one does
                yield op, {COLUMN.get(c, c): (tuple(row[c] or ()) if t is tuple else row[c])
                           for c, t in columns.items()}


def lag_summary(lags: list[float]) -> dict[str, float]:
    """p50, p99 and max of the per-time lags, in ms (nearest rank; none: empty)."""
    if not lags:
        return {}
    ordered = sorted(lags)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"times": len(ordered), "p50": round(rank(0.5), 1), "p99": round(rank(0.99), 1),
            "max": round(ordered[-1], 1)}


def main(argv: list[str] | None = None) -> int:
    """Run the query to the end of the files; write the changes; write the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", required=True)
    parser.add_argument("--prefix", default="shop")
    parser.add_argument("--out", required=True)
    parser.add_argument("--summary", required=True)
    parser.add_argument("--autocommit-ms", type=int, default=DEFAULT_AUTOCOMMIT_MS)
    args = parser.parse_args(argv)

    started = time.monotonic()
    import pathway as pw

    class TableSubject(pw.io.python.ConnectorSubject):
        """One table's archived records as upserts and deletions by primary key."""

        def __init__(self, paths: list[str], columns: dict[str, type]) -> None:
            super().__init__(session_type="upsert")
            self.paths, self.columns = paths, columns
            self.read_s = 0.0

        def run(self) -> None:
            begun = time.monotonic()
            for op, row in changes(self.paths, self.columns):
                if op == "delete":
                    self.delete(**row)
                else:
                    self.next(**row)
            self.read_s = time.monotonic() - begun  # how long the Python side fed the engine

    read: dict[str, Any] = {}
    subjects: list[TableSubject] = []
    for table, (columns, key) in TABLES.items():
        schema = pw.schema_from_dict(
            {COLUMN.get(c, c): {"dtype": (list[int] if t is tuple else t if c == key
                                          else t | None), "primary_key": c == key}
             for c, t in columns.items()},
            name=f"{table}_schema")
        subjects.append(TableSubject(table_files(args.archive, args.prefix, table), columns))
        read[table] = pw.io.python.read(subjects[-1], schema=schema,
                                        autocommit_duration_ms=args.autocommit_ms, name=table)

    orders, pizzas, assignments = read["orders"], read["pizzas"], read["table_assignment"]
    clients, tables = read["clients"], read["tables"]
    # CROSS JOIN UNNEST(orders.pizzas): one row per element, duplicates kept
    elements = orders.select(order_id=pw.this.pk, ta_id=pw.this.table_assignment_id,
                             pizza_id=pw.this.pizzas).flatten(pw.this.pizza_id)
    priced = elements.join(pizzas, elements.pizza_id == pizzas.pk).select(
        elements.order_id, elements.ta_id, pizza=pizzas.name, price=pizzas.price)
    seated = priced.join(assignments, priced.ta_id == assignments.pk).select(
        priced.order_id, priced.pizza, priced.price, assignments.client_id,
        assignments.table_id)
    named = seated.join(clients, seated.client_id == clients.pk).select(
        seated.order_id, seated.pizza, seated.price, seated.table_id,
        client_name=clients.name)
    placed = named.join(tables, named.table_id == tables.pk).select(
        named.order_id, named.pizza, named.price, named.client_name, table_name=tables.name)
    enriched = placed.groupby(pw.this.order_id, pw.this.client_name, pw.this.table_name).reduce(
        pw.this.order_id, pw.this.client_name, pw.this.table_name,
        pizzas=pw.reducers.tuple(pw.make_tuple(pw.this.pizza, pw.this.price)))
    pw.io.jsonlines.write(enriched, args.out)
    # Pathway's time is the wall clock (ms) of its inputs' commit; a time ends at a subscriber
    # once the whole dataflow has passed it. The subscriber watches a one-row count of the
    # result, not the result: a Python call per output row would slow Pathway down.
    lags: list[float] = []
    pw.io.subscribe(enriched.reduce(rows=pw.reducers.count()), on_change=lambda **_: None,
                    on_time_end=lambda t: lags.append(time.time() * 1000 - t))

    ready = time.monotonic()
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    finished = time.monotonic()
    with open(args.summary, "w", encoding="utf-8") as fh:
        json.dump({"setup_s": ready - started, "query_s": finished - ready,
                   "autocommit_ms": args.autocommit_ms,
                   "commit_to_output_ms": lag_summary(lags),
                   "read_s": max(s.read_s for s in subjects),
                   "pathway_version": pw.__version__}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
