"""Job specification: which tables a job reads, how they join, what it outputs.

A job is a Python file in ``jobs/`` that defines a module-level ``job = Job(...)``.
The join is a tree of lookups rooted at the driving (fact) table::

    orders (o) --table_assignment_id--> table_assignment (ta) --client_id--> clients (c)
               \\                                          \\--table_id--> tables (t)
                \\--pizzas[] (array, one element per entry)--> pizzas (p)

Each lookup says which columns of the looked-up table match which columns of its
parent (``on={"id": "table_assignment_id"}``), whether it is ``inner`` or
``left``, whether the parent column is an array (one element per array element,
in array order, duplicates kept), and, when the matched columns are not the
looked-up table's primary key, how several matches resolve (``pick``).

The job is validated when it is loaded: the lookup graph must be a tree rooted at
the fact table (checked with networkx), every referenced table and column must be
declared. Errors name the job file and the lookup.
"""

from __future__ import annotations

import base64
import datetime as dt
import importlib.util
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal

import networkx as nx

from txjoin.errors import JobError

Semantics = Literal["as_of_fact", "current"]
SEMANTICS: tuple[str, ...] = ("as_of_fact", "current")

# Debezium's placeholder for an unchanged TOASTed value it did not receive.
UNAVAILABLE = "__debezium_unavailable_value"

_DECIMAL = re.compile(r"^(?:numeric|decimal)\((\d+),\s*(\d+)\)$")
# JSON already yields these Python types for these SQL types.
_FAST: dict[str, type] = {"int": int, "bigint": int, "smallint": int, "text": str, "bool": bool,
                          "double": float}
_SCALARS = {"int", "bigint", "smallint", "text", "bool", "double", "timestamp", "timestamptz"}


def _check_type(sql_type: str, where: str) -> None:
    base = sql_type[:-2] if sql_type.endswith("[]") else sql_type
    if base not in _SCALARS and not _DECIMAL.match(base):
        raise JobError(
            f"{where}: unknown column type {sql_type!r}; use one of "
            f"{sorted(_SCALARS)}, numeric(p,s), or any of them followed by []"
        )


@dataclass(frozen=True)
class Table:
    """A captured source table: its name (``schema.table``), columns and primary key."""

    name: str
    columns: Mapping[str, str]
    key: Sequence[str] = ("id",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", dict(self.columns))
        object.__setattr__(self, "key", tuple(self.key))

    def convert_row(self, raw: Mapping[str, Any], *,
                    where: str = "", complete: bool = False) -> dict[str, Any]:
        """Turn a Debezium JSON row into typed Python values (Decimal, datetime, list...).

        Unknown columns mean the source schema changed: that is an error, not
        something to drop silently. So are missing ones when ``complete`` (an
        ``after`` image always carries every column of the table).
        """
        unknown = set(raw) - set(self.columns)
        if unknown:
            raise JobError(
                f"{where}: {self.name} has column(s) {sorted(unknown)} that the job does not "
                f"declare (source schema change?). Declare them in the job's Table "
                f"and restart from a checkpoint taken before the change, or from scratch."
            )
        missing = [c for c in self.columns if c not in raw] if complete else []
        if missing:
            raise JobError(
                f"{where}: {self.name} row lacks declared column(s) {missing} (source schema "
                f"change: column dropped or renamed?). Remove them from the job's Table and "
                f"restart from a checkpoint taken before the change, or from scratch."
            )
        row: dict[str, Any] = {}
        for col, sql_type in self.columns.items():
            if col not in raw:
                # A key-only `before` (no REPLICA IDENTITY FULL) lacks the other columns.
                continue
            value = raw[col]
            fast = _FAST.get(sql_type)
            if fast is not None and type(value) is fast:
                row[col] = value  # already the right Python type: the common case
            else:
                row[col] = convert_value(value, sql_type, where=f"{where} {self.name}.{col}")
        return row

    def convert_key(self, raw: Mapping[str, Any], *, where: str = "") -> tuple[Any, ...]:
        """Only the primary key of a Debezium JSON row (enough for a `before`)."""
        return tuple(convert_value(raw.get(k), self.columns[k], where=f"{where} {self.name}.{k}")
                     for k in self.key)

    def key_of(self, row: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(row.get(k) for k in self.key)


def convert_value(value: Any, sql_type: str, *, where: str = "") -> Any:
    """Convert one JSON value as Debezium writes it into a Python value of ``sql_type``.

    The documented converter settings are ``decimal.handling.mode=string`` and
    the default ``time.precision.mode=adaptive`` (``timestamp`` = microseconds
    since the epoch). Floats and ISO strings are accepted too.
    """
    if value is None or value == UNAVAILABLE:
        return value
    if sql_type.endswith("[]"):
        if value == [UNAVAILABLE]:
            return UNAVAILABLE
        if not isinstance(value, list):
            raise JobError(f"{where}: expected a JSON array for {sql_type}, got {value!r}")
        return [convert_value(v, sql_type[:-2], where=where) for v in value]
    try:
        if sql_type in ("int", "bigint", "smallint"):
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise ValueError
            return int(value)
        if sql_type == "text":
            return str(value)
        if sql_type == "bool":
            return bool(value)
        if sql_type == "double":
            return float(value)
        if sql_type in ("timestamp", "timestamptz"):
            if isinstance(value, int):
                return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=value)
            parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
        m = _DECIMAL.match(sql_type)
        if m:
            scale = int(m.group(2))
            if isinstance(value, dict) and "value" in value:  # VariableScaleDecimal
                return Decimal(int.from_bytes(base64.b64decode(value["value"]), "big", signed=True)
                               ).scaleb(-int(value["scale"]))
            if isinstance(value, str) and not re.fullmatch(r"[-+]?[0-9.eE+-]+", value):
                # decimal.handling.mode=precise with schemas disabled: base64 bytes, scale lost.
                raw = base64.b64decode(value, validate=True)
                return Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale)
            return Decimal(str(value)).quantize(Decimal(1).scaleb(-scale))
    except (ValueError, TypeError, InvalidOperation) as exc:
        raise JobError(f"{where}: cannot read {value!r} as {sql_type} "
                       f"(is decimal.handling.mode=string set on the connector?)") from exc
    raise JobError(f"{where}: unsupported type {sql_type}")


@dataclass(frozen=True)
class Pick:
    """How a many-valued lookup resolves: the match with the greatest/least ``column``."""

    column: str
    order: Literal["max", "min"] = "max"


@dataclass(frozen=True)
class Lookup:
    """One edge of the lookup tree: ``alias`` = rows of ``table`` matching its parent.

    ``on`` maps columns of ``table`` to columns of the parent alias. With
    ``array=True`` the (single) parent column holds an array and the lookup
    yields one element per array element, in array order, duplicates kept.
    """

    alias: str
    table: str
    parent: str
    on: Mapping[str, str]
    how: Literal["inner", "left"] = "inner"
    array: bool = False
    pick: Pick | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "on", dict(self.on))


@dataclass(frozen=True)
class Collect:
    """Aggregate the elements of an array lookup into a list of structs, in array order."""

    alias: str
    fields: Mapping[str, str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", dict(self.fields))


Projection = str | Collect


@dataclass(frozen=True)
class Output:
    """The output table: its name, key columns (from the fact) and value columns."""

    table: str
    key: Mapping[str, str]
    columns: Mapping[str, Projection]

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", dict(self.key))
        object.__setattr__(self, "columns", dict(self.columns))

    @property
    def column_names(self) -> list[str]:
        return [*self.key, *self.columns]


@dataclass(frozen=True)
class Job:
    """A validated job: fact table, lookup tree, output and semantics."""

    name: str
    tables: Sequence[Table]
    fact: str
    fact_alias: str
    lookups: Sequence[Lookup]
    output: Output
    semantics: Semantics = "as_of_fact"
    source_file: str = "<inline>"
    _by_name: dict[str, Table] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(self, "lookups", tuple(self.lookups))
        object.__setattr__(self, "_by_name", {t.name: t for t in self.tables})
        validate(self)

    def table(self, name: str) -> Table:
        return self._by_name[name]

    @property
    def table_names(self) -> list[str]:
        return [t.name for t in self.tables]

    def alias_table(self, alias: str) -> Table:
        if alias == self.fact_alias:
            return self.table(self.fact)
        return self.table(self.lookup(alias).table)

    def lookup(self, alias: str) -> Lookup:
        for lk in self.lookups:
            if lk.alias == alias:
                return lk
        raise KeyError(alias)

    def children(self, alias: str) -> list[Lookup]:
        return [lk for lk in self.lookups if lk.parent == alias]

    def column_type(self, ref: str) -> str:
        alias, col = ref.split(".", 1)
        return self.alias_table(alias).columns[col]

    def topics(self, prefix: str) -> list[str]:
        return [f"{prefix}.{t}" for t in self.table_names]


def _fail(job: Job, what: str) -> None:
    raise JobError(f"job {job.name!r} ({job.source_file}): {what}")


def validate(job: Job) -> None:
    """Check the lookup graph is a tree rooted at the fact and every reference resolves."""
    if job.semantics not in SEMANTICS:
        _fail(job, f"semantics {job.semantics!r} is not one of {SEMANTICS}")
    names = [t.name for t in job.tables]
    if len(set(names)) != len(names):
        _fail(job, f"a table is declared twice: {names}")
    for t in job.tables:
        if "." not in t.name:
            _fail(job, f"table {t.name!r} must be named schema.table")
        for col in t.key:
            if col not in t.columns:
                _fail(job, f"table {t.name}: key column {col!r} is not declared")
        for col, typ in t.columns.items():
            _check_type(typ, f"job {job.name!r} ({job.source_file}): {t.name}.{col}")
    if job.fact not in job._by_name:
        _fail(job, f"fact table {job.fact!r} is not declared in tables")
    aliases = [job.fact_alias, *(lk.alias for lk in job.lookups)]
    if len(set(aliases)) != len(aliases):
        _fail(job, f"an alias is used twice: {aliases}")

    graph = nx.DiGraph()
    graph.add_node(job.fact_alias)
    for lk in job.lookups:
        where = f"lookup {lk.alias!r} ({lk.table})"
        if lk.table not in job._by_name:
            _fail(job, f"{where}: table {lk.table!r} is not declared in tables")
        if lk.parent not in aliases:
            _fail(job, f"{where}: parent alias {lk.parent!r} does not exist")
        if lk.how not in ("inner", "left"):
            _fail(job, f"{where}: how={lk.how!r}, expected 'inner' or 'left'")
        if not lk.on:
            _fail(job, f"{where}: `on` is empty")
        parent_table = job.alias_table(lk.parent)
        table = job.table(lk.table)
        for mine, theirs in lk.on.items():
            if mine not in table.columns:
                _fail(job, f"{where}: column {mine!r} is not declared on {lk.table}")
            if theirs not in parent_table.columns:
                _fail(job, f"{where}: parent column {lk.parent}.{theirs} is not declared "
                           f"on {parent_table.name}")
            is_array = parent_table.columns[theirs].endswith("[]")
            if is_array != lk.array:
                _fail(job, f"{where}: parent column {lk.parent}.{theirs} is "
                           f"{'an array' if is_array else 'not an array'}; set array="
                           f"{is_array}")
        if lk.array and len(lk.on) != 1:
            _fail(job, f"{where}: an array lookup matches exactly one column")
        if set(lk.on) != set(table.key) and lk.pick is None:
            _fail(job, f"{where}: matches on {sorted(lk.on)}, not the primary key "
                       f"{list(table.key)} of {lk.table}, so several rows can match; say how "
                       f"they resolve with pick=Pick(column, 'max'|'min')")
        if lk.pick is not None and lk.pick.column not in table.columns:
            _fail(job, f"{where}: pick column {lk.pick.column!r} is not declared")
        graph.add_edge(lk.parent, lk.alias)
    if not nx.is_arborescence(graph) or [n for n, d in graph.in_degree() if d == 0] != [
        job.fact_alias
    ]:
        _fail(job, "the lookups must form a tree rooted at the fact alias "
                   f"{job.fact_alias!r}; got edges {sorted(graph.edges)}")

    fact = job.table(job.fact)
    key_refs = list(job.output.key.values())
    if sorted(key_refs) != sorted(f"{job.fact_alias}.{k}" for k in fact.key):
        _fail(job, f"output key {job.output.key} must map exactly the fact's primary key "
                   f"{[f'{job.fact_alias}.{k}' for k in fact.key]}")
    array_aliases = {lk.alias for lk in job.lookups if lk.array}

    def under_array(alias: str) -> str | None:
        while alias != job.fact_alias:
            if alias in array_aliases:
                return alias
            alias = job.lookup(alias).parent
        return None

    def check_ref(ref: str, where: str, inside: str | None) -> None:
        if "." not in ref:
            _fail(job, f"{where}: {ref!r} must be alias.column")
        alias, col = ref.split(".", 1)
        if alias not in aliases:
            _fail(job, f"{where}: unknown alias {alias!r}")
        if col not in job.alias_table(alias).columns:
            _fail(job, f"{where}: column {col!r} is not declared on "
                       f"{job.alias_table(alias).name}")
        arr = under_array(alias)
        if arr is not None and arr != inside:
            _fail(job, f"{where}: {ref} lies under array lookup {arr!r}; wrap it in "
                       f"Collect({arr!r}, ...)")
        if inside is not None and arr != inside:
            _fail(job, f"{where}: {ref} is not under the collected lookup {inside!r}")

    for name, proj in [*job.output.key.items(), *job.output.columns.items()]:
        where = f"output column {name!r}"
        if isinstance(proj, Collect):
            if proj.alias not in array_aliases:
                _fail(job, f"{where}: Collect({proj.alias!r}) needs an array lookup alias")
            for fname, ref in proj.fields.items():
                check_ref(ref, f"{where} field {fname!r}", proj.alias)
        else:
            check_ref(proj, where, None)


def load_job(path: str | Path) -> Job:
    """Load ``job`` from a job file, with errors naming the file."""
    path = Path(path)
    if not path.is_file():
        raise JobError(f"job file {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"txjoin_job_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise JobError(f"job file {path} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except JobError as exc:
        raise JobError(f"{path}: {exc}") from exc
    except Exception as exc:
        raise JobError(f"{path}: failed to import: {type(exc).__name__}: {exc}") from exc
    job = getattr(module, "job", None)
    if not isinstance(job, Job):
        raise JobError(f"{path}: defines no module-level `job = Job(...)`")
    if job.source_file == "<inline>":
        object.__setattr__(job, "source_file", str(path))
    return job
