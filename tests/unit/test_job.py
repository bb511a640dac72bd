"""Job validation and loading: every mistake names the job file and the lookup or column."""

from __future__ import annotations

import base64
import textwrap
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.unit.delivery import Pipeline, insert, only, update
from txjoin.errors import DecodeError, JobError
from txjoin.job import Collect, Job, Lookup, Output, Pick, Table, convert_value, load_job

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
            "id": "int", "client_id": "int", "pizza_id": "uuid"})]),
        ["public.favourites.pizza_id", "unknown column type 'uuid'"]),
    "an undeclared fact table": (
        lambda: make_job(fact="public.order"), ["fact table 'public.order'"]),
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


def _shop() -> Pipeline:
    pipe = Pipeline(ORDERS)
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


def test_a_new_source_column_stops_processing_naming_the_table_and_column() -> None:
    pipe = _shop()
    records = pipe.commit("after ALTER TABLE", insert("clients", id=2, name="Bob"))

    def add_email(payload: dict[str, Any]) -> None:
        payload["after"]["email"] = "bob@example.com"

    event = pipe.rewrite(only(records, kind="data")[0], add_email)
    with pytest.raises(DecodeError) as exc:
        pipe.deliver_rest()
    message = str(exc.value)
    assert "public.clients" in message and "['email']" in message
    assert "does not declare" in message and "source schema change" in message
    assert f"shop.public.clients[0]@{event.offset}" in message


def test_a_dropped_source_column_stops_processing_instead_of_emitting_nulls() -> None:
    pipe = _shop()
    records = pipe.commit("after ALTER TABLE ... DROP COLUMN name", insert("clients", id=2,
                                                                            name="Bob"))

    def drop_name(payload: dict[str, Any]) -> None:
        del payload["after"]["name"]

    event = pipe.rewrite(only(records, kind="data")[0], drop_name)
    with pytest.raises(DecodeError) as exc:
        pipe.deliver_rest()
    message = str(exc.value)
    assert "public.clients" in message and "['name']" in message
    assert "source schema change" in message
    assert f"shop.public.clients[0]@{event.offset}" in message


def _precise(value: Decimal, scale: int) -> str:
    """decimal.handling.mode=precise with schemas.enable=false: base64 of the unscaled value."""
    unscaled = int(value.scaleb(scale))
    return base64.b64encode(unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big",
                                              signed=True)).decode()


def test_precise_decimal_without_schema_decodes_with_the_declared_scale() -> None:
    assert _precise(Decimal("8.50"), 2) == "A1I="
    assert convert_value("A1I=", "numeric(10,2)") == Decimal("8.50")
    pipe = _shop()
    records = pipe.commit("price", update("pizzas", id=1, price="9.99"))
    pipe.commit("order", insert("orders", id=1, table_assignment_id=1,
                                order_time="2023-09-23T22:30:00", pizzas=[1]))

    def as_precise(payload: dict[str, Any]) -> None:
        payload["after"]["price"] = _precise(Decimal("9.99"), 2)

    pipe.rewrite(only(records, kind="data")[0], as_precise)
    pipe.deliver_rest()
    assert pipe.output[(1,)]["pizzas"] == [{"pizza": "Margherita", "price": Decimal("9.99")}]


def test_variable_scale_decimal_decodes_with_its_own_scale() -> None:
    value = {"scale": 3, "value": base64.b64encode((12345).to_bytes(2, "big")).decode()}
    assert convert_value(value, "numeric(10,2)") == Decimal("12.345")


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


@pytest.mark.xfail(strict=True, reason=(
    "without the schema, a precise (base64) decimal whose text is also a decimal literal "
    "is read as a string decimal; nothing declares the connector's decimal.handling.mode"))
def test_precise_decimal_that_looks_like_a_number_is_not_misread() -> None:
    # -26 588.24 at scale 2: unscaled -2 658 824 is 0xd76df8, base64 "1234".
    assert _precise(Decimal("-26588.24"), 2) == "1234"
    assert convert_value("1234", "numeric(10,2)") == Decimal("-26588.24")
