"""Job validation and loading: every mistake names the job file and the lookup or column."""

from __future__ import annotations

import base64
import json
import logging
import textwrap
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import txjoin.job as job_module
from tests.unit.delivery import Pipeline, insert, only, update
from txjoin.errors import DecodeError, JobError
from txjoin.ingest.debezium import (
    DEFAULT_BINARY_HANDLING_MODE,
    DEFAULT_DECIMAL_HANDLING_MODE,
    DEFAULT_TIME_PRECISION_MODE,
    DEFAULT_TOPIC_PREFIX,
    ChangeEvent,
    Position,
    decode,
)
from txjoin.ingest.types import convert_value
from txjoin.job import Collect, Job, Lookup, Output, Pick, Table, load_job
from txjoin.join.oracle import outputs_after_each

JOBS = Path(__file__).resolve().parents[2] / "jobs"
ORDERS = load_job(JOBS / "orders.py")
FILE = "jobs/broken.py"

TABLES = [
    Table("public.clients", {"id": "int", "name": "text"}),
    Table("public.pizzas", {"id": "int", "name": "text", "price": "numeric(10,2)"}),
    Table("public.table_assignment", {"id": "int", "client_id": "int"}),
    Table("public.orders", {"id": "int", "table_assignment_id": "int", "pizzas": "int[]"}),
    Table("public.favourites", {"id": "int", "client_id": "int", "pizza_id": "int"}),
]
TA = Lookup("ta", "public.table_assignment", parent="o", on={"id": "table_assignment_id"})
C = Lookup("c", "public.clients", parent="ta", on={"id": "client_id"})
P = Lookup("p", "public.pizzas", parent="o", on={"id": "pizzas"}, array=True)
OUTPUT = Output("out", key={"order_id": "o.id"},
                columns={"client": "c.name",
                         "pizzas": Collect("p", {"pizza": "p.name", "price": "p.price"})})


def make_job(**overrides: Any) -> Job:
    spec: dict[str, Any] = dict(name="broken", tables=TABLES, fact="public.orders",
                                fact_alias="o", lookups=[TA, C, P], output=OUTPUT,
                                source_file=FILE)
    spec.update(overrides)
    return Job(**spec)


def test_the_reference_job_is_valid() -> None:
    job = make_job()
    assert [lk.alias for lk in job.children("o")] == ["ta", "p"]
    assert job.column_type("p.price") == "numeric(10,2)"


def _replace(lookups: list[Lookup], alias: str, **changes: Any) -> list[Lookup]:
    def changed(lk: Lookup) -> Lookup:
        if lk.alias != alias:
            return lk
        spec = dict(alias=lk.alias, table=lk.table, parent=lk.parent, on=lk.on, how=lk.how,
                    array=lk.array, pick=lk.pick)
        spec.update(changes)
        return Lookup(**spec)
    return [changed(lk) for lk in lookups]


INVALID: dict[str, tuple[Callable[[], Job], list[str]]] = {
    "lookups forming a cycle": (
        lambda: make_job(lookups=[*_replace([TA], "ta", parent="c", on={"id": "id"}), C, P]),
        ["must form a tree", "'c'", "'ta'"]),
    "a lookup with two parents": (
        lambda: make_job(lookups=[TA, C, P, Lookup("c", "public.clients", parent="o",
                                                   on={"id": "table_assignment_id"})]),
        ["alias is used twice", "'c'"]),
    "an unknown parent": (
        lambda: make_job(lookups=_replace([TA, C, P], "c", parent="seat")),
        ["lookup 'c' (public.clients)", "parent alias 'seat' does not exist"]),
    "an undeclared table": (
        lambda: make_job(lookups=_replace([TA, C, P], "c", table="public.customers")),
        ["lookup 'c' (public.customers)", "'public.customers' is not declared"]),
    "an undeclared lookup column": (
        lambda: make_job(lookups=_replace([TA, C, P], "c", on={"client_no": "client_id"})),
        ["lookup 'c' (public.clients)", "column 'client_no' is not declared on public.clients"]),
    "an undeclared parent column": (
        lambda: make_job(lookups=_replace([TA, C, P], "c", on={"id": "customer_id"})),
        ["lookup 'c' (public.clients)", "ta.customer_id is not declared"]),
    "an array column without array=True": (
        lambda: make_job(lookups=_replace([TA, C, P], "p", array=False)),
        ["lookup 'p' (public.pizzas)", "o.pizzas is an array; set array=True"]),
    "array=True on a scalar column": (
        lambda: make_job(lookups=_replace([TA, C, P], "c", array=True)),
        ["lookup 'c' (public.clients)", "is not an array; set array=False"]),
    "distinct=True without array=True": (
        lambda: make_job(lookups=_replace([TA, C, P], "c", distinct=True)),
        ["lookup 'c' (public.clients)", "distinct=True applies to an array lookup"]),
    "a left distinct array lookup": (
        lambda: make_job(lookups=_replace([TA, C, P], "p", distinct=True, how="left")),
        ["lookup 'p' (public.pizzas)", "a distinct array lookup is inner"]),
    "a non-key lookup without pick": (
        lambda: make_job(lookups=[TA, C, P, Lookup("fav", "public.favourites", parent="c",
                                                   on={"client_id": "id"}, how="left")]),
        ["lookup 'fav' (public.favourites)", "not the primary key", "pick=Pick"]),
    "a pick column that is not declared": (
        lambda: make_job(lookups=[TA, C, P, Lookup("fav", "public.favourites", parent="c",
                                                   on={"client_id": "id"},
                                                   pick=Pick("added_at"))]),
        ["lookup 'fav' (public.favourites)", "pick column 'added_at'"]),
    "a column under an array lookup without Collect": (
        lambda: make_job(output=Output("out", key={"order_id": "o.id"},
                                       columns={"pizza": "p.name"})),
        ["output column 'pizza'", "under array lookup 'p'", "Collect('p'"]),
    "Collect of a lookup that is not an array": (
        lambda: make_job(output=Output("out", key={"order_id": "o.id"},
                                       columns={"who": Collect("c", {"n": "c.name"})})),
        ["output column 'who'", "needs an array lookup"]),
    "an output column on an undeclared column": (
        lambda: make_job(output=Output("out", key={"order_id": "o.id"},
                                       columns={"client": "c.email"})),
        ["output column 'client'", "column 'email' is not declared on public.clients"]),
    "an output key that is not the fact's primary key": (
        lambda: make_job(output=Output("out", key={"seat": "o.table_assignment_id"},
                                       columns={"client": "c.name"})),
        ["output key", "fact's primary key", "o.id"]),
    "unknown semantics": (
        lambda: make_job(semantics="eventually"),
        ["semantics 'eventually'", "as_of_fact", "current"]),
    "an unknown column type": (
        lambda: make_job(tables=[*TABLES[:-1], Table("public.favourites", {
            "id": "int", "client_id": "int", "pizza_id": "geometry"})]),
        ["public.favourites.pizza_id", "unknown column type 'geometry'"]),
    "an undeclared fact table": (
        lambda: make_job(fact="public.order"), ["fact table 'public.order'"]),
    "a default for an undeclared column": (
        lambda: make_job(tables=[*TABLES[:-1], Table("public.favourites", {
            "id": "int", "client_id": "int", "pizza_id": "int"}, defaults={"colour": None})]),
        ["public.favourites", "default for 'colour', which is not a declared column"]),
    "a default for a key column": (
        lambda: make_job(tables=[*TABLES[:-1], Table("public.favourites", {
            "id": "int", "client_id": "int", "pizza_id": "int"}, defaults={"id": 0})]),
        ["public.favourites", "key column 'id' cannot have a default"]),
}


@pytest.mark.parametrize("mistake", sorted(INVALID))
def test_invalid_job_names_the_file_and_the_culprit(mistake: str) -> None:
    build, fragments = INVALID[mistake]
    with pytest.raises(JobError) as exc:
        build()
    message = str(exc.value)
    assert f"job 'broken' ({FILE})" in message, message
    for fragment in fragments:
        assert fragment in message, message


# -- loading job files -------------------------------------------------------------------


def _write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_loading_a_file_without_job_says_what_to_define(tmp_path: Path) -> None:
    path = _write(tmp_path, "empty.py", "from txjoin.job import Job\nJOB = None\n")
    with pytest.raises(JobError, match=r"empty\.py: defines no module-level `job = Job"):
        load_job(path)


def test_loading_an_invalid_job_file_names_the_file_and_the_lookup(tmp_path: Path) -> None:
    path = _write(tmp_path, "cyclic.py", """
        from txjoin.job import Job, Lookup, Output, Table
        job = Job(
            name="cyclic",
            tables=[Table("public.a", {"id": "int", "b_id": "int"}),
                    Table("public.b", {"id": "int", "a_id": "int"})],
            fact="public.a", fact_alias="a",
            lookups=[Lookup("b", "public.b", parent="bb", on={"id": "a_id"}),
                     Lookup("bb", "public.b", parent="b", on={"id": "id"})],
            output=Output("out", key={"id": "a.id"}, columns={}),
        )
    """)
    with pytest.raises(JobError) as exc:
        load_job(path)
    message = str(exc.value)
    assert str(path) in message and "must form a tree" in message
    assert "('b', 'bb')" in message and "('bb', 'b')" in message


def test_loading_a_file_that_fails_to_import_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "typo.py", "from txjoin.job import Jobb\n")
    with pytest.raises(JobError, match=r"typo\.py: failed to import: ImportError"):
        load_job(path)
    with pytest.raises(JobError, match="does not exist"):
        load_job(tmp_path / "missing.py")


def test_a_loaded_job_remembers_its_file() -> None:
    assert ORDERS.source_file.endswith("jobs/orders.py")


# -- errors at processing time -----------------------------------------------------------


def _shop(job: Job = ORDERS, **options: Any) -> Pipeline:
    pipe = Pipeline(job, **options)
    pipe.snapshot({
        "clients": [{"id": 1, "name": "Ann"}],
        "pizzas": [{"id": 1, "name": "Margherita", "price": "8.50"}],
        "tables": [{"id": 1, "name": "T1"}],
        "table_assignment": [{"id": 1, "client_id": 1, "table_id": 1,
                              "time_in": "2023-09-23T22:00:00", "time_out": None}],
        "orders": [],
    })
    pipe.deliver_rest()
    return pipe


@pytest.fixture(autouse=True)
def _forget_ignored_columns() -> None:
    """Each test sees the once-per-column warnings afresh."""
    job_module._IGNORED.clear()


def test_a_new_source_column_is_ignored_and_logged_once_per_table_and_column(
        caplog: pytest.LogCaptureFixture) -> None:
    # Seed 000: ALTER TABLE users ADD new_column; the Flink query keeps running.
    pipe = _shop()
    first = pipe.commit("after ALTER TABLE", insert("clients", id=2, name="Bob"))
    second = pipe.commit("another", insert("clients", id=3, name="Cy"))
    pipe.commit("order", insert("orders", id=1, table_assignment_id=1,
                                order_time="2023-09-23T22:30:00", pizzas=[1]))

    def add_email(payload: dict[str, Any]) -> None:
        payload["after"]["email"] = "someone@example.com"

    for records in (first, second):
        pipe.rewrite(only(records, kind="data")[0], add_email)
    with caplog.at_level(logging.WARNING, logger="txjoin.schema"):
        pipe.deliver_rest()
    assert pipe.matches_oracle_prefix() and pipe.output[(1,)]["client_name"] == "Ann"
    warnings = [r.getMessage() for r in caplog.records if r.name == "txjoin.schema"]
    assert len(warnings) == 1, warnings
    assert "public.clients has column 'email' that the job does not declare: ignored" in \
        warnings[0]
    assert "shop.public.clients[0]@" in warnings[0]


def test_a_dropped_source_column_stops_processing_instead_of_emitting_nulls() -> None:
    # Seed 000: ALTER TABLE users DROP COLUMN full_name, then an insert: Flink fails.
    pipe = _shop()
    records = pipe.commit("after ALTER TABLE ... DROP COLUMN name", insert("clients", id=2,
                                                                            name="Bob"))

    def drop_name(payload: dict[str, Any]) -> None:
        del payload["after"]["name"]

    event = pipe.rewrite(only(records, kind="data")[0], drop_name)
    with pytest.raises(DecodeError) as exc:
        pipe.deliver_rest()
    message = str(exc.value)
    assert "\n" not in message
    assert f"shop.public.clients[0]@{event.offset}" in message
    assert "public.clients.name" in message and "dropped or renamed" in message
    assert "defaults={'name': None}" in message and "same checkpoint" in message


def test_a_dropped_column_with_a_default_reads_as_the_default() -> None:
    clients = Table("public.clients", {"id": "int", "name": "text"},
                    defaults={"name": "(unknown)"})
    job = replace_table(ORDERS, clients)
    pipe = _shop(job)
    records = pipe.commit("after DROP COLUMN name", insert("clients", id=1, name="Ann"))
    pipe.commit("order", insert("orders", id=1, table_assignment_id=1,
                                order_time="2023-09-23T22:30:00", pizzas=[1]))

    def drop_name(payload: dict[str, Any]) -> None:
        del payload["after"]["name"]

    pipe.rewrite(only(records, kind="data")[0], drop_name)
    pipe.deliver_rest()
    assert pipe.output[(1,)]["client_name"] == "(unknown)"
    # A key-only or partial `before` is not completed with defaults.
    assert clients.convert_row({"id": 1}) == {"id": 1}
    assert clients.convert_row({"id": 1}, complete=True) == {"id": 1, "name": "(unknown)"}


def replace_table(job: Job, table: Table) -> Job:
    return Job(name=job.name, tables=[table if t.name == table.name else t for t in job.tables],
               fact=job.fact, fact_alias=job.fact_alias, lookups=job.lookups, output=job.output,
               semantics=job.semantics, source_file=job.source_file,
               decimal_handling_mode=job.decimal_handling_mode)


TYPE_CHANGES = {
    "int column now text": ("clients", "id", "B-2", "public.clients.id", "as int"),
    "text column now json": ("clients", "name", {"first": "Bob"}, "public.clients.name",
                             "as text"),
    "timestamp column now a date string": ("table_assignment", "time_in", "23.09.2023",
                                           "public.table_assignment.time_in", "as timestamp"),
    "array column now a scalar": ("orders", "pizzas", 1, "public.orders.pizzas", "int[]"),
}


@pytest.mark.parametrize("change", sorted(TYPE_CHANGES))
def test_a_value_not_of_the_declared_type_stops_processing_naming_where(change: str) -> None:
    table, column, value, named, what = TYPE_CHANGES[change]
    pipe = _shop()
    row: dict[str, Any] = {
        "clients": dict(id=2, name="Bob"),
        "table_assignment": dict(id=2, client_id=1, table_id=1, time_in="2023-09-23T22:00:00",
                                 time_out=None),
        "orders": dict(id=1, table_assignment_id=1, order_time="2023-09-23T22:30:00",
                       pizzas=[1]),
    }[table]
    records = pipe.commit("after ALTER COLUMN ... TYPE", insert(table, **row))

    def retype(payload: dict[str, Any]) -> None:
        payload["after"][column] = value

    event = pipe.rewrite(only(records, kind="data")[0], retype)
    with pytest.raises(DecodeError) as exc:
        pipe.deliver_rest()
    message = str(exc.value)
    assert "\n" not in message
    assert f"shop.public.{table}[0]@{event.offset}" in message
    assert named in message
    assert (f"cannot read {value!r} {what}" in message
            or f"expected a JSON array for {what}, got {value!r}" in message)
    assert "source column type changed?" in message and "same checkpoint" in message


# -- decimals in every decimal.handling.mode ----------------------------------------------


def _precise(value: Decimal, scale: int) -> str:
    """decimal.handling.mode=precise with schemas.enable=false: base64 of the unscaled value."""
    unscaled = int(value.scaleb(scale))
    return base64.b64encode(unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big",
                                              signed=True)).decode()


def test_the_default_decimal_mode_is_the_shipped_connector_setting() -> None:
    from txjoin.stack.debezium import CONNECTOR_PROPERTIES, parse_properties

    settings = parse_properties(CONNECTOR_PROPERTIES.read_text())
    shipped = settings["decimal.handling.mode"]
    assert shipped == DEFAULT_DECIMAL_HANDLING_MODE
    assert ORDERS.table("public.pizzas").decimal_handling_mode == shipped
    # Debezium's defaults for the others: the shipped file leaves them unset.
    assert "time.precision.mode" not in settings and "binary.handling.mode" not in settings
    assert (DEFAULT_TIME_PRECISION_MODE, DEFAULT_BINARY_HANDLING_MODE) == ("adaptive", "bytes")
    # A job without sources reads the shipped connector's topics by default.
    assert settings["topic.prefix"] == DEFAULT_TOPIC_PREFIX


def test_precise_decimal_without_schema_decodes_with_the_declared_scale() -> None:
    assert _precise(Decimal("8.50"), 2) == "A1I="
    assert convert_value("A1I=", "numeric(10,2)", decimal_handling_mode="precise") == \
        Decimal("8.50")
    assert convert_value(["A1I=", None], "numeric(10,2)[]", decimal_handling_mode="precise") == \
        [Decimal("8.50"), None]


def test_precise_decimal_that_looks_like_a_number_is_not_misread() -> None:
    # -26 588.24 at scale 2: unscaled -2 658 824 is 0xd76df8, base64 "1234".
    assert _precise(Decimal("-26588.24"), 2) == "1234"
    assert convert_value("1234", "numeric(10,2)", decimal_handling_mode="precise") == \
        Decimal("-26588.24")
    assert convert_value("1234", "numeric(10,2)", decimal_handling_mode="string") == \
        Decimal("1234.00")


DECIMALS_BY_MODE = {
    "string": [("8.50", "8.50"), ("-0.01", "-0.01"), ("12", "12.00"), ("NaN", "NaN")],
    "precise": [(_precise(Decimal("8.50"), 2), "8.50"), (_precise(Decimal("-0.01"), 2), "-0.01"),
                (_precise(Decimal("123456789.99"), 2), "123456789.99")],
    "double": [(8.5, "8.50"), (0.1 + 0.2, "0.30"), (12, "12.00"), (-0.01, "-0.01")],
}


@pytest.mark.parametrize("mode", sorted(DECIMALS_BY_MODE))
def test_each_decimal_mode_reads_exact_decimals(mode: str) -> None:
    for raw, expected in DECIMALS_BY_MODE[mode]:
        got = convert_value(raw, "numeric(12,2)", decimal_handling_mode=mode)
        assert str(got) == expected, (raw, got)


@pytest.mark.parametrize("mode", ["string", "precise", "double"])
def test_variable_scale_decimals_keep_their_own_scale_in_every_mode(mode: str) -> None:
    # io.debezium.data.VariableScaleDecimal: numeric columns without a declared scale.
    value = {"scale": 3, "value": base64.b64encode((12345).to_bytes(2, "big")).decode()}
    assert convert_value(value, "numeric(10,2)", decimal_handling_mode=mode) == Decimal("12.345")
    minus_five = base64.b64encode((-5).to_bytes(1, "big", signed=True)).decode()
    negative = {"scale": 0, "value": minus_five}
    assert convert_value(negative, "numeric(10,2)", decimal_handling_mode=mode) == Decimal(-5)


MISREADS = {
    "base64 under string mode": ("A1I=", "string", "looks like base64 (precise mode)"),
    "more places than declared": ("8.505", "string", "decimal.handling.mode=string"),
    "not base64 under precise mode": ("8.50", "precise", "decimal.handling.mode=precise"),
    "a boolean": (True, "double", "decimal.handling.mode=double"),
    "a broken variable-scale struct": ({"scale": "x", "value": "AA=="}, "string",
                                       "decimal.handling.mode=string"),
}


@pytest.mark.parametrize("case", sorted(MISREADS))
def test_a_decimal_that_does_not_fit_the_mode_is_an_error_not_a_guess(case: str) -> None:
    value, mode, hint = MISREADS[case]
    with pytest.raises(JobError) as exc:
        convert_value(value, "numeric(10,2)", where="here", decimal_handling_mode=mode)
    assert f"here: cannot read {value!r} as numeric(10,2)" in str(exc.value)
    assert hint in str(exc.value) and "--decimal-handling-mode" in str(exc.value)


@pytest.mark.parametrize("schemas_enable", [False, True], ids=["schemaless", "with schemas"])
@pytest.mark.parametrize("mode", ["string", "precise", "double"])
def test_the_pipeline_reads_prices_exactly_in_every_mode(mode: str, schemas_enable: bool) -> None:
    job = ORDERS.with_modes(decimal=mode)
    pipe = _shop(job, schemas_enable=schemas_enable, decimal_handling_mode=mode)
    # 0xd76df8: the precise encoding of -26588.24 reads "1234" (also a decimal literal).
    pipe.commit("price", update("pizzas", id=1, price="-26588.24"))
    pipe.commit("order", insert("orders", id=1, table_assignment_id=1,
                                order_time="2023-09-23T22:30:00", pizzas=[1]))
    pipe.deliver_rest()
    # The oracle reads the scenario's own values, decimals as text: the shipped mode.
    assert pipe.output == outputs_after_each(ORDERS, pipe.snapshot_rows, pipe.transactions)[-1]
    assert pipe.output[(1,)]["pizzas"] == [{"pizza": "Margherita", "price": Decimal("-26588.24")}]


def test_with_schemas_the_record_decides_whatever_the_job_says() -> None:
    # The connector writes precise decimals with their schema, the job expects strings.
    job = ORDERS.with_modes(decimal="string")
    pipe = _shop(job, schemas_enable=True, decimal_handling_mode="precise")
    pipe.commit("price", update("pizzas", id=1, price="-26588.24"))
    pipe.commit("order", insert("orders", id=1, table_assignment_id=1,
                                order_time="2023-09-23T22:30:00", pizzas=[1]))
    pipe.deliver_rest()
    assert pipe.output[(1,)]["pizzas"][0]["price"] == Decimal("-26588.24")
    # ... and the other way round: string decimals with a schema, a job set to precise.
    job = ORDERS.with_modes(decimal="precise")
    pipe = _shop(job, schemas_enable=True, decimal_handling_mode="string")
    pipe.commit("price", update("pizzas", id=1, price="1234"))
    pipe.commit("order", insert("orders", id=1, table_assignment_id=1,
                                order_time="2023-09-23T22:30:00", pizzas=[1]))
    pipe.deliver_rest()
    assert pipe.output[(1,)]["pizzas"][0]["price"] == Decimal("1234.00")


def test_with_schemas_a_double_decimal_is_rounded_to_the_declared_scale() -> None:
    doc = {"schema": {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [
        {"field": "price", "type": "double", "optional": True}]}]},
        "payload": {"before": None, "after": {"id": 1, "price": 0.1 + 0.2}, "op": "r",
                    "source": {"schema": "public", "table": "pizzas"}, "transaction": None}}
    event = decode(json.dumps(doc), Position("shop.public.pizzas", 0, 7))
    assert isinstance(event, ChangeEvent) and event.after is not None
    pizzas = ORDERS.with_modes(decimal="string").table("public.pizzas")
    assert pizzas.convert_row(event.after)["price"] == Decimal("0.30")


def test_a_schema_decimal_without_a_scale_is_a_decode_error() -> None:
    doc = {"schema": {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [
        {"field": "price", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal"}]}]},
        "payload": {"before": None, "after": {"id": 1, "price": "A1I="}, "op": "r",
                    "source": {"schema": "public", "table": "pizzas"}, "transaction": None}}
    with pytest.raises(DecodeError, match=r"shop\.public\.pizzas\[0\]@7: after\.price: "
                                          r"Decimal schema without a `scale`"):
        decode(json.dumps(doc), Position("shop.public.pizzas", 0, 7))


def test_a_job_names_an_unknown_decimal_mode() -> None:
    with pytest.raises(JobError, match="decimal_handling_mode 'exact' is not one of"):
        make_job(decimal_handling_mode="exact")


def test_an_unreadable_decimal_is_a_clear_error_naming_the_column() -> None:
    pipe = _shop()
    records = pipe.commit("price", update("pizzas", id=1, price="9.99"))

    def garble(payload: dict[str, Any]) -> None:
        payload["after"]["price"] = "9,99 €"

    pipe.rewrite(only(records, kind="data")[0], garble)
    with pytest.raises(DecodeError) as exc:
        pipe.deliver_rest()
    message = str(exc.value)
    assert "public.pizzas.price" in message and "'9,99 €'" in message
    assert "decimal.handling.mode=string" in message
    assert "shop.public.pizzas[0]@" in message
