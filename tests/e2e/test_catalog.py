"""`txjoin job init`: a job written from a real PostgreSQL catalog loads and runs unchanged.

Two schemas: the pizzeria the stack ships (no foreign keys: the written tables
must equal the hand-written jobs/orders.py's), and one of our own with composite
keys, foreign keys (one composite, two into one table, one nullable, one from a
looked-up table), an enum, a domain, arrays and types beyond the pizzeria's. The
written job is loaded and run through the pure core against the oracle.
"""

from __future__ import annotations

from pathlib import Path

import psycopg2
import pytest
from click.testing import CliRunner

from tests.fixtures.postgres import new_database
from tests.unit.strategies import Workload, produce
from txjoin.cli import main
from txjoin.job import Job, load_job
from txjoin.join.engine import Engine
from txjoin.join.oracle import RowChange, SourceTransaction, outputs_after_each

ROOT = Path(__file__).resolve().parents[2]
PIZZERIA = ["public.orders", "public.table_assignment", "public.clients", "public.tables",
            "public.pizzas"]

OWN_SCHEMA = """
CREATE SCHEMA shop2;
CREATE TYPE shop2.status AS ENUM ('new', 'paid', 'sent');
CREATE DOMAIN shop2.amount AS numeric(12, 2) CHECK (VALUE >= 0);
CREATE TABLE shop2.warehouses (code char(3) PRIMARY KEY, city text NOT NULL);
CREATE TABLE shop2.customers (
    region text, id int, name varchar(40) NOT NULL, since date,
    PRIMARY KEY (region, id));
CREATE TABLE shop2.products (
    sku uuid PRIMARY KEY, title text, price shop2.amount, tags text[],
    made_in char(3) REFERENCES shop2.warehouses);
CREATE TABLE shop2.orders (
    id bigint, line smallint,
    customer_region text NOT NULL, customer_id int NOT NULL,
    product_sku uuid NOT NULL REFERENCES shop2.products (sku),
    ship_from char(3) REFERENCES shop2.warehouses,
    return_to char(3) REFERENCES shop2.warehouses,
    status shop2.status, placed_at timestamptz(3), amount shop2.amount, notes jsonb,
    spot point,
    PRIMARY KEY (id, line),
    FOREIGN KEY (customer_region, customer_id) REFERENCES shop2.customers (region, id));
CREATE TABLE shop2.coupons (id int PRIMARY KEY, code text UNIQUE);
CREATE TABLE shop2.redemptions (
    id int PRIMARY KEY, coupon_code text REFERENCES shop2.coupons (code));
CREATE TABLE shop2.audit (at timestamptz, what text);
"""


@pytest.fixture(scope="module")
def dsn(pg_server: str) -> str:
    """A database of its own on the session's PostgreSQL server (tests/conftest.py)."""
    url = new_database(pg_server, "catalog")
    conn = psycopg2.connect(url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute((ROOT / "txjoin/stack/schema.sql").read_text())
        cur.execute(OWN_SCHEMA)
    conn.close()
    return url


def _init(dsn: str, tables: list[str], tmp_path: Path, *extra: str) -> Job:
    out = tmp_path / "job.py"
    result = CliRunner().invoke(main, ["job", "init", "--dsn", dsn, "--tables", ",".join(tables),
                                       "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    return load_job(out)


def _run_through_core(job: Job, workload: Workload) -> None:
    """Every record in one batch: the engine's output equals the oracle's after the last tx."""
    production = produce(job, workload)
    engine = Engine(job)
    engine.process([(r.topic, 0, r.offset, r.value) for r in production.records],
                   caught_up=set(job.streams("shop").values()))
    expected = outputs_after_each(job, workload.snapshot, workload.transactions)
    assert engine.outputs() == expected[-1]
    assert expected[-1], "the workload should produce output rows"


def test_pizzeria_job_has_the_hand_written_tables_and_runs(dsn: str, tmp_path: Path) -> None:
    job = _init(dsn, PIZZERIA, tmp_path, "--fact", "orders")
    hand_written = load_job(ROOT / "jobs/orders.py")
    assert {t.name: (t.columns, t.key) for t in job.tables} == {
        t.name: (t.columns, t.key) for t in hand_written.tables}
    assert job.fact == "public.orders"
    assert job.lookups == ()  # the pizzeria declares no foreign keys
    assert job.output.key == {"id": "orders.id"}
    assert list(job.output.columns) == ["table_assignment_id", "order_time", "pizzas"]
    t = "2023-09-23T23:00:00"
    _run_through_core(job, Workload(
        snapshot={"public.orders": [
            {"id": 1, "table_assignment_id": 2, "order_time": t, "pizzas": [1, 1]}]},
        transactions=[SourceTransaction("t1", [
            RowChange("insert", "public.orders",
                      {"id": 2, "table_assignment_id": None, "order_time": t, "pizzas": None}),
            RowChange("update", "public.orders",
                      {"id": 1, "table_assignment_id": 3, "order_time": t, "pizzas": [4]}),
        ])]))


OWN = ["shop2.orders", "shop2.customers", "shop2.products", "shop2.warehouses"]


def test_own_schema_keys_types_and_lookups_from_foreign_keys(dsn: str, tmp_path: Path) -> None:
    job = _init(dsn, OWN, tmp_path)  # no --fact: orders reaches every other table
    assert job.fact == "shop2.orders"
    tables = {t.name: t for t in job.tables}
    assert tables["shop2.orders"].key == ("id", "line")
    assert tables["shop2.customers"].key == ("region", "id")
    assert tables["shop2.orders"].columns == {
        "id": "bigint", "line": "smallint", "customer_region": "text", "customer_id": "int",
        "product_sku": "uuid", "ship_from": "char(3)", "return_to": "char(3)",
        "status": "text", "placed_at": "timestamptz(3)", "amount": "numeric(12,2)",
        "notes": "jsonb"}  # spot (point) is left out, with a comment
    assert tables["shop2.customers"].columns == {
        "region": "text", "id": "int", "name": "varchar(40)", "since": "date"}
    assert tables["shop2.products"].columns["tags"] == "text[]"
    assert "spot: type point is not supported" in Path(job.source_file).read_text()
    lookups = {lk.alias: (lk.table, lk.parent, lk.on, lk.how) for lk in job.lookups}
    assert lookups == {
        "customers": ("shop2.customers", "orders",
                            {"region": "customer_region", "id": "customer_id"}, "inner"),
        "product_sku": ("shop2.products", "orders", {"sku": "product_sku"}, "inner"),
        "ship_from": ("shop2.warehouses", "orders", {"code": "ship_from"}, "left"),
        "return_to": ("shop2.warehouses", "orders", {"code": "return_to"}, "left"),
        "made_in": ("shop2.warehouses", "product_sku", {"code": "made_in"}, "left"),
    }
    assert job.output.key == {"id": "orders.id", "line": "orders.line"}
    assert job.output.columns["ship_from_city"] == "ship_from.city"
    assert job.output.columns["made_in_city"] == "made_in.city"

    sku = "8c7e3f5a-1b2c-4d5e-8f90-1234567890ab"
    order = {"id": 7, "line": 1, "customer_region": "eu", "customer_id": 3, "product_sku": sku,
             "ship_from": "MIL", "return_to": None, "status": "new",
             "placed_at": "2024-05-01T10:00:00.123Z", "amount": "19.90",
             "notes": '{"gift": true}'}
    _run_through_core(job, Workload(
        snapshot={
            "shop2.warehouses": [{"code": "MIL", "city": "Milan"},
                                 {"code": "TOR", "city": "Turin"}],
            "shop2.customers": [{"region": "eu", "id": 3, "name": "Ann", "since": "2020-02-29"}],
            "shop2.products": [{"sku": sku, "title": "Tile", "price": "9.95",
                                "tags": ["blue", "floor"], "made_in": "TOR"}],
        },
        transactions=[
            SourceTransaction("t1", [RowChange("insert", "shop2.orders", order)]),
            SourceTransaction("t2", [
                RowChange("update", "shop2.warehouses", {"code": "MIL", "city": "Milano"}),
                RowChange("insert", "shop2.orders", {**order, "line": 2, "status": "paid"})]),
        ]))


def test_unknown_fact_and_missing_table_are_one_line_errors(dsn: str, tmp_path: Path) -> None:
    for args, words in (
        (["--tables", "shop2.orders,shop2.nope"], "table 'shop2.nope' does not exist"),
        (["--tables", "shop2.orders", "--fact", "clients"], "--fact 'clients' is not one of"),
    ):
        result = CliRunner().invoke(main, ["job", "init", "--dsn", dsn, *args])
        assert result.exit_code == 2, result.output
        assert words in result.output



def test_a_foreign_key_to_a_non_primary_key_is_a_comment_not_a_lookup(
        dsn: str, tmp_path: Path) -> None:
    job = _init(dsn, ["shop2.redemptions", "shop2.coupons"], tmp_path)
    assert job.lookups == ()
    assert "# not proposed: shop2.redemptions redemptions_coupon_code_fkey: references " \
           "['code'], not the primary key ['id']" in Path(job.source_file).read_text()


def test_a_table_without_primary_key_is_refused_saying_what_to_do(dsn: str) -> None:
    result = CliRunner().invoke(main, ["job", "init", "--dsn", dsn, "--tables", "shop2.audit"])
    assert result.exit_code == 2
    assert "shop2.audit has no primary key" in result.output
    assert "ADD PRIMARY KEY" in result.output


def test_declared_types_are_checked_against_the_catalog_before_anything_starts(
        dsn: str, tmp_path: Path) -> None:
    # Issue 73 item 2: a numeric column declared int failed ~18 s into the run, behind
    # Spark's traces. The job init writes from this catalog (every type of the own schema,
    # the pizzeria's too) passes the check; one wrong type is one line naming it.
    from dataclasses import replace

    from txjoin.catalog import check_declared_columns
    from txjoin.errors import ConfigError

    for tables in (PIZZERIA, ["shop2.orders", "shop2.customers", "shop2.products",
                              "shop2.warehouses"]):
        (tmp_path / tables[0]).mkdir()
        job = _init(dsn, tables, tmp_path / tables[0])
        check_declared_columns(dsn, job.tables, job.source_file)
    orders = next(t for t in job.tables if t.name == "shop2.orders")
    for column, declared, actual in (("amount", "int", "numeric(12,2)"),
                                     ("placed_at", "date", "timestamptz(3)"),
                                     ("id", "int", "bigint")):
        wrong = replace(orders, columns={**orders.columns, column: declared})
        with pytest.raises(ConfigError) as caught:
            check_declared_columns(dsn, [wrong], "trips.py")
        line = str(caught.value)
        assert "\n" not in line
        assert line.startswith(f"trips.py: table shop2.orders column {column!r} is declared "
                               f"{declared!r}, but the source database has it as "), line
        assert f"(txjoin type {actual!r})" in line and f"declare it {actual!r}" in line
    wider = replace(orders, columns={**orders.columns, "line": "bigint", "amount": "numeric"})
    check_declared_columns(dsn, [wider], "trips.py")  # every value still reads
