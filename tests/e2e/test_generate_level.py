"""``txjoin generate --level``: the racing workload with live rows held level, on PostgreSQL
(the session's server; without a server: tests/unit/test_generate_level.py)."""

from __future__ import annotations

import psycopg2

from tests.fixtures.postgres import new_database
from txjoin.stack.generate import generate
from txjoin.stack.postgres import SCHEMA_SQL


def counts(dsn: str) -> dict[str, int]:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        found = {}
        for table in ("clients", "table_assignment", "orders", "users", "users_favorite_color"):
            cur.execute(f"SELECT count(*) FROM public.{table}")
            found[table] = cur.fetchone()[0]
        # PostgreSQL's own answer must not keep a forgotten order, nor an order its visit lost
        cur.execute("SELECT count(*) FROM public.orders_expected e WHERE e.present AND NOT "
                    "EXISTS (SELECT 1 FROM public.orders o WHERE o.id = e.order_id)")
        found["present_but_gone"] = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM public.orders o WHERE NOT EXISTS (SELECT 1 FROM "
                    "public.table_assignment a WHERE a.id = o.table_assignment_id)")
        found["orphan_orders"] = cur.fetchone()[0]
    conn.close()
    return found


def test_level_keeps_clients_and_users_bounded_and_the_answer_consistent(pg_server: str) -> None:
    dsn = new_database(pg_server, "generate_level")  # on the session's server (tests/conftest.py)
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(SCHEMA_SQL.read_text())
    conn.close()
    level = 12
    result = generate(dsn, rate_tx_per_s=5_000, duration_s=4, seed=3, writers=2,
                      level=level)
    found = counts(dsn)
    # Without a level the same workload keeps adding clients and users.
    grown = generate(dsn, rate_tx_per_s=5_000, duration_s=2, seed=4, writers=2)
    after = counts(dsn)
    assert result.transactions_by_kind["forget_visit"] > 0
    assert result.transactions_by_kind["forget_user"] > 0
    assert result.transactions > 10 * level  # far more than the level was written
    # a forget runs before the next transaction: at most one over, per writer
    assert found["clients"] <= level + 2 and found["users"] <= level + 2
    assert found["present_but_gone"] == 0 and found["orphan_orders"] == 0
    assert grown.transactions_by_kind["forget_visit"] == 0
    assert after["clients"] > found["clients"]

