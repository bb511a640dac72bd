"""The Flink SQL peer: the seed's enrichment query over archived Debezium files, in PyFlink.

Runs in an interpreter that has ``apache-flink`` (``scripts/flink-env.sh``; pyflink pins
older numpy/pandas/pyarrow/py4j than pyspark 4.2, so it lives in its own venv) and
imports nothing but pyflink and the standard library::

    python -m txjoin.peers.flink_job --archive DIR --prefix shop --summary S.json > changelog.txt

Each table is a ``filesystem`` source with ``format = 'debezium-json'`` over
``DIR/<prefix>.<schema>.<table>/partition=0`` (one file per table: Flink's file
source does not read several files of a directory in offset order). The query is
seed 001's, in Flink's dialect (``CROSS JOIN UNNEST``, regular joins, grouped per
order), run in streaming mode into Flink's ``print`` sink with one subtask, so
every changelog row it emits reaches stdout in emission order as
``txjoin-peer> +I[order_id, client_name, table_name, pizzas JSON]`` (kinds +I,
-U, +U, -D; ``parse_line`` reads it back). The print sink costs far less than
``TableResult.collect()`` (one py4j round trip per row: 3x slower here). Timings
go to the ``--summary`` JSON file.

Tombstone lines (``null``) make Flink's debezium-json format fail ("Corrupt
Debezium JSON message 'null'"), so parse errors are ignored: that skips exactly
the tombstones here, because txjoin's file source checks every other line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# (table, column DDL, primary key); time columns stay BIGINT (Debezium's micros):
# the query does not use them.
TABLES = {
    "clients": ("`id` INT, `name` STRING", "id"),
    "pizzas": ("`id` INT, `name` STRING, `price` DECIMAL(10, 2)", "id"),
    "tables": ("`id` INT, `name` STRING", "id"),
    "table_assignment": ("`id` INT, `client_id` INT, `table_id` INT, `time_in` BIGINT, "
                         "`time_out` BIGINT", "id"),
    "orders": ("`id` INT, `table_assignment_id` INT, `order_time` BIGINT, "
               "`pizzas` ARRAY<INT>", "id"),
}

QUERY = """
SELECT
    src_orders.id AS order_id,
    src_clients.name AS client_name,
    src_tables.name AS table_name,
    JSON_ARRAYAGG(JSON_OBJECT('pizza' VALUE src_pizzas.name,
                              'price' VALUE src_pizzas.price)) AS pizzas
FROM src_orders CROSS JOIN UNNEST(src_orders.pizzas) AS pizza_unnest(pizza_id)
    JOIN src_pizzas ON src_pizzas.id = pizza_unnest.pizza_id
    JOIN src_table_assignment ON src_orders.table_assignment_id = src_table_assignment.id
    JOIN src_clients ON src_table_assignment.client_id = src_clients.id
    JOIN src_tables ON src_table_assignment.table_id = src_tables.id
GROUP BY src_orders.id, src_clients.name, src_tables.name
"""


IDENTIFIER = "txjoin-peer"


def parse_line(line: str) -> tuple[str, int, str, str, str] | None:
    """``(kind, order_id, client_name, table_name, pizzas JSON)`` of a print-sink line, or None.

    The sink prints ``Row.toString()``: fields joined by ", ", no quoting; names here
    never contain ", " and the pizzas JSON is last, so a bounded split is exact.
    """
    head = IDENTIFIER + "> "
    if not line.startswith(head):
        return None
    body = line[len(head):].rstrip("\n")
    kind, fields = body[:2], body[3:-1]
    order_id, client, table, pizzas = fields.split(", ", 3)
    return kind, int(order_id), client, table, pizzas


def table_folder(archive: str, prefix: str, table: str) -> str:
    """Where the archive keeps ``public.<table>``'s only partition."""
    return os.path.join(archive, f"{prefix}.public.{table}", "partition=0")


def main(argv: list[str] | None = None) -> int:
    """Run the query to the end of the files; write the changelog; print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", required=True)
    parser.add_argument("--prefix", default="shop")
    parser.add_argument("--summary", required=True)
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args(argv)

    from pyflink.table import EnvironmentSettings, TableEnvironment

    started = time.monotonic()
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    env.get_config().set("parallelism.default", str(args.parallelism))
    for table, (columns, key) in TABLES.items():
        folder = table_folder(args.archive, args.prefix, table)
        if not os.path.isdir(folder):
            os.makedirs(folder)  # an empty table: an empty folder is an empty source
        env.execute_sql(f"""
            CREATE TABLE src_{table} ({columns}, PRIMARY KEY (`{key}`) NOT ENFORCED)
            WITH ('connector' = 'filesystem', 'path' = 'file://{os.path.abspath(folder)}',
                  'format' = 'debezium-json',
                  'debezium-json.ignore-parse-errors' = 'true')""")
    env.execute_sql(f"""
        CREATE TABLE enriched (order_id INT, client_name STRING, table_name STRING,
                               pizzas STRING,
                               PRIMARY KEY (order_id, client_name, table_name) NOT ENFORCED)
        WITH ('connector' = 'print', 'print-identifier' = '{IDENTIFIER}',
              'sink.parallelism' = '1')""")
    ready = time.monotonic()
    env.execute_sql("INSERT INTO enriched " + QUERY).wait()
    finished = time.monotonic()
    with open(args.summary, "w", encoding="utf-8") as fh:
        json.dump({"setup_s": ready - started, "query_s": finished - ready,
                   "parallelism": args.parallelism}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
