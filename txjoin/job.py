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

import functools
import importlib.util
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from txjoin.errors import JobError, did_you_mean
from txjoin.expr import (
    AGGREGATE_FUNCTIONS,
    AGGREGATED,
    Compiled,
    ExprError,
    compile_expr,
    is_plain_ref,
)
from txjoin.ingest.debezium import (
    BINARY_HANDLING_MODES,
    DECIMAL_HANDLING_MODES,
    DEFAULT_BINARY_HANDLING_MODE,
    DEFAULT_DECIMAL_HANDLING_MODE,
    DEFAULT_TIME_PRECISION_MODE,
    TIME_PRECISION_MODES,
    Modes,
    SchemaRow,
    table_topic,
    transaction_topic,
)
from txjoin.ingest.types import FAST_TYPES, SCHEMA_MODE, check_type, column_kind, convert

Semantics = Literal["as_of_fact", "current"]
SEMANTICS: tuple[str, ...] = ("as_of_fact", "current")

DEFAULT_SOURCE = "default"
"""The name of the one implicit source of a job that declares no sources."""
TRANSACTION_STREAM = "transaction"
"""The transaction topic's stream name in ``caught_up`` for a job that declares no sources."""


@dataclass(frozen=True)
class Table:
    """A captured source table: its name (``schema.table``), columns and primary key.

    ``defaults`` makes columns optional: a column listed there may be missing
    from the source's rows (dropped at the source, or not added yet) and reads as
    the given value, e.g. ``defaults={"nickname": None}``. Every other declared
    column must be present in every row image. Columns the source has and the
    job does not declare are ignored (logged once per table and column).

    ``source`` names the job's :class:`Source` (source database) the table is
    captured from; required when the job declares sources, else left unset.

    ``decimal_handling_mode``, ``time_precision_mode`` and ``binary_handling_mode`` are
    set by the :class:`Job` (its own settings), not by hand.
    """

    name: str
    columns: Mapping[str, str]
    key: Sequence[str] = ("id",)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    source: str | None = None
    decimal_handling_mode: str | None = field(default=None, repr=False)
    time_precision_mode: str | None = field(default=None, repr=False)
    binary_handling_mode: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", dict(self.columns))
        object.__setattr__(self, "key", tuple(self.key))
        object.__setattr__(self, "defaults", dict(self.defaults))

    def convert_row(self, raw: Mapping[str, Any], *, where: str = "", complete: bool = False,
                    modes: Modes | None = None) -> dict[str, Any]:
        """Turn a Debezium JSON row into typed Python values (Decimal, datetime, list...).

        Columns the job does not declare are ignored: the source may add columns
        without stopping the job (seed 000). A declared column missing from a
        ``complete`` row (an ``after`` image always carries every column of the
        table) is an error unless it has a default: the source dropped or renamed
        it, and reading on would silently turn its values into nulls. ``where``
        prefixes every message (the record's position). ``modes`` overrides the table's
        connector settings (``Modes()`` for values written by hand: decimals as text,
        bytea as base64).
        """
        if len(raw) != len(self.columns) or not self.columns.keys() <= raw.keys():
            self._check_columns(raw, where, complete)
        modes = self._modes(raw, modes)
        row: dict[str, Any] = {}
        for col, sql_type, fast in self._readers:
            if col not in raw:
                if col in self.defaults and complete:
                    row[col] = self.defaults[col]
                # A key-only `before` (no REPLICA IDENTITY FULL) lacks the other columns.
                continue
            value = raw[col]
            if fast is not None and type(value) is fast:
                row[col] = value  # already the right Python type: the common case
            else:
                row[col] = convert(value, sql_type, f"{where} {self.name}.{col}", modes)
        return row

    @functools.cached_property
    def _readers(self) -> tuple[tuple[str, str, type | None], ...]:
        """Per column: its name, its type, and the Python type its JSON value already has
        when it needs no conversion (``FAST_TYPES``), gathered once, not per row."""
        return tuple((col, sql_type, FAST_TYPES.get(sql_type))
                     for col, sql_type in self.columns.items())

    def _modes(self, raw: Mapping[str, Any], override: Modes | None) -> Modes:
        """How ``raw``'s values read: ``override`` or the job's connector settings; a row
        with its schema takes its decimals' form from the schema."""
        modes = override or self.read_modes
        return modes._replace(decimal=SCHEMA_MODE) if isinstance(raw, SchemaRow) else modes

    @functools.cached_property
    def read_modes(self) -> Modes:
        """How its values read unless a row says otherwise (gathered once, not per row)."""
        return Modes(self.decimal_handling_mode or DEFAULT_DECIMAL_HANDLING_MODE,
                     self.time_precision_mode or DEFAULT_TIME_PRECISION_MODE,
                     self.binary_handling_mode or DEFAULT_BINARY_HANDLING_MODE)

    def _check_columns(self, raw: Mapping[str, Any], where: str, complete: bool) -> None:
        for col in raw:
            if col not in self.columns:
                _ignored_column(self.name, col, where)
        if not complete:
            return
        missing = [c for c in self.columns if c not in raw and c not in self.defaults]
        if missing:
            col = missing[0]
            raise JobError(
                f"{where} {self.name}.{col}: the job declares column {col!r} but the source "
                f"row has no such column (dropped or renamed at the source?); columns: "
                f"{sorted(raw)}. Give it a default in the job's Table (defaults={{{col!r}: "
                f"None}}) or stop using it, then restart the job on the same checkpoint."
            )

    def convert_key(self, raw: Mapping[str, Any], *, where: str = "") -> tuple[Any, ...]:
        """Only the primary key of a Debezium JSON row (enough for a `before`)."""
        key = []
        modes = None
        for k in self.key:
            value, sql_type = raw.get(k), self.columns[k]
            fast = FAST_TYPES.get(sql_type)
            if fast is not None and type(value) is fast:
                key.append(value)  # already the right Python type: the common case
                continue
            modes = modes or self._modes(raw, None)
            key.append(convert(value, sql_type, f"{where} {self.name}.{k}", modes))
        return tuple(key)

    def key_of(self, row: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(row.get(k) for k in self.key)


_IGNORED: set[tuple[str, str]] = set()
_log = logging.getLogger("txjoin.schema")


def _ignored_column(table: str, column: str, where: str) -> None:
    if (table, column) in _IGNORED:
        return
    _IGNORED.add((table, column))
    _log.warning("%s %s has column %r that the job does not declare: ignored (declare it in "
                 "the job's Table to use it)", where.rstrip(":") or "source:", table, column)




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
    yields one element per array element, in array order, duplicates kept. With
    ``distinct=True`` as well it yields each matching row once, in the order of its
    value's first occurrence in the array, NULL elements skipped: PostgreSQL's ``JOIN t
    ON t.id = ANY(o.col)`` (which matches each row once, in no set order); inner only.

    ``where``: a SQL predicate over this alias's own columns (``"p.available"``): only
    rows of ``table`` for which it is true match (before ``pick`` chooses among them);
    with ``how="left"`` a filtered-out match reads as NULL (txjoin/expr.py).
    """

    alias: str
    table: str
    parent: str
    on: Mapping[str, str]
    how: Literal["inner", "left"] = "inner"
    array: bool = False
    pick: Pick | None = None
    where: str | None = None
    distinct: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "on", dict(self.on))

    def elements(self, array: Any) -> list[Any]:
        """The values an array lookup matches, in order: the array's elements (all of
        them, or with ``distinct`` each non-NULL value once, at its first occurrence)."""
        if not isinstance(array, list):
            return []
        if not self.distinct:
            return array
        return list(dict.fromkeys(v for v in array if v is not None))

    @property
    def listed(self) -> bool:
        """Whether the alias binds a list of elements (an array lookup, or child rows)
        that only a :class:`Collect` or an :class:`Aggregate` reads."""
        return self.array


@dataclass(frozen=True)
class Children(Lookup):
    """One-to-many: ``alias`` = the rows of ``table`` that reference the fact.

    ``on`` maps columns of the child ``table`` to columns of the parent (the fact alias):
    ``Children("l", "public.order_lines", "o", {"order_id": "id"}, order_by="line_no")``.
    The child table has its own key; every child row whose ``on`` columns equal the
    fact's is an element, ordered by ``order_by`` (ascending, NULLs last) then by the
    child's key. A fact with no child rows keeps its output row (an empty list, a count
    of 0: a LEFT JOIN). A child row may have many-to-one lookups of its own
    (``Lookup(..., parent="l")``). Read the elements with :class:`Collect` or
    :class:`Aggregate`. ``where`` filters which child rows count.
    """

    how: Literal["inner", "left"] = "left"
    order_by: Sequence[str] | str = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        order = (self.order_by,) if isinstance(self.order_by, str) else tuple(self.order_by)
        object.__setattr__(self, "order_by", order)

    @property
    def listed(self) -> bool:
        return True


AGGREGATES: tuple[str, ...] = AGGREGATE_FUNCTIONS


@dataclass(frozen=True)
class Aggregate:
    """An output column aggregating the elements of a listed alias (child rows or an array
    lookup), with PostgreSQL's meaning: ``func`` over the SQL expression ``expr`` (over the
    element's aliases), NULLs ignored; ``count`` without ``expr`` counts the elements
    (``count(*)``), of none 0; ``sum``/``avg``/``min``/``max``/``bool_and``/``bool_or``/
    ``string_agg`` of no (non-NULL) value are NULL. ``string_agg`` joins with ``separator``
    in the elements' order. Types as PostgreSQL gives them (``sum`` of int: bigint, of
    bigint or numeric: numeric; ``avg`` of an integer or numeric: numeric at PostgreSQL's
    division scale).
    """

    alias: str
    func: str
    expr: str | None = None
    separator: str | None = None


@dataclass(frozen=True)
class Collect:
    """Aggregate the elements of an array lookup (or of child rows) into a list of structs,
    in array order (child rows: in their ``order_by``)."""

    alias: str
    fields: Mapping[str, str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", dict(self.fields))


Projection = str | Collect | Aggregate


@dataclass(frozen=True)
class Output:
    """The output table: its name, key columns (from the fact) and value columns.

    A value column is ``alias.column``, a :class:`Collect`, an :class:`Aggregate`, or a SQL
    expression over the aliases' columns (``"o.quantity * p.price"``), computed with
    PostgreSQL's meaning; its type is derived from the declared column types
    (txjoin/expr.py). An expression may read aggregates of a listed alias's elements, as an
    :class:`Aggregate` computes them: ``"CASE WHEN max(l.qty) > 4 THEN 'heavy' ELSE 'light'
    END"``, ``"sum(l.amount) / nullif(count(l.id), 0)"`` (each call's argument reads one
    element's columns; ``count`` counts a column, e.g. the key: ``count(l.id)``).
    """

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
class Source:
    """A source database: its own Debezium connector, topic prefix and transaction topic.

    Transactions of one source are applied in its commit order; there is no commit
    order across sources (docs/writing-jobs.md, "Two source databases"). ``prefix`` is the
    connector's ``topic.prefix`` (``txjoin run --topic-prefix NAME=PREFIX`` overrides it).
    """

    name: str
    prefix: str | None = None


@dataclass(frozen=True)
class Job:
    """A validated job: fact table, lookup tree, output and semantics.

    ``sources``: the source databases, when the tables come from several (each
    :class:`Table` then names its ``source``). Empty: one implicit source named
    ``default`` whose prefix is ``txjoin run --topic-prefix``.

    ``where``: a SQL predicate over any (non-array) alias's columns; a fact whose
    joined row does not satisfy it (false or NULL) has no output row.

    ``having``: a SQL predicate over the fact's group, evaluated after ``where``: its
    columns and aggregates of its listed aliases' elements, as an output column reads them
    (``"count(l.id) > 0"``, ``"sum(l.amount) >= o.minimum"``); a fact whose group does not
    satisfy it has no output row (a delete when it stops satisfying it, an insert when it
    starts), in both semantics.
    """

    name: str
    tables: Sequence[Table]
    fact: str
    fact_alias: str
    lookups: Sequence[Lookup]
    output: Output
    semantics: Semantics = "as_of_fact"
    source_file: str = "<inline>"
    decimal_handling_mode: str | None = None
    """The connector's ``decimal.handling.mode`` when records carry no schema
    (``precise``, ``string`` or ``double``); ``None``: txjoin's shipped setting,
    ``string``. ``txjoin run --decimal-handling-mode`` overrides it."""
    time_precision_mode: str | None = None
    """The connector's ``time.precision.mode`` when records carry no schema (``adaptive``,
    ``adaptive_time_microseconds`` or ``connect``); ``None``: ``adaptive``, Debezium's
    default. ``txjoin run --time-precision-mode`` overrides it."""
    binary_handling_mode: str | None = None
    """The connector's ``binary.handling.mode`` (``bytes``, ``base64``, ``base64-url-safe``
    or ``hex``); ``None``: ``bytes``, Debezium's default. ``txjoin run
    --binary-handling-mode`` overrides it."""
    sources: Sequence[Source] = ()
    where: str | None = None
    having: str | None = None
    _by_name: dict[str, Table] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        modes = {"decimal_handling_mode": (self.decimal_handling_mode,
                                           DEFAULT_DECIMAL_HANDLING_MODE, DECIMAL_HANDLING_MODES),
                 "time_precision_mode": (self.time_precision_mode, DEFAULT_TIME_PRECISION_MODE,
                                         TIME_PRECISION_MODES),
                 "binary_handling_mode": (self.binary_handling_mode,
                                          DEFAULT_BINARY_HANDLING_MODE, BINARY_HANDLING_MODES)}
        chosen: dict[str, Any] = {}
        for name, (given, default, allowed) in modes.items():
            if (given or default) not in allowed:
                _fail(self, f"{name} {given!r} is not one of {allowed}")
            chosen[name] = given or default
        object.__setattr__(self, "tables", tuple(
            t if all(getattr(t, k) == v for k, v in chosen.items()) else replace(t, **chosen)
            for t in self.tables))
        object.__setattr__(self, "lookups", tuple(self.lookups))
        object.__setattr__(self, "sources", tuple(self.sources))
        object.__setattr__(self, "_by_name", {t.name: t for t in self.tables})
        validate(self)

    def with_modes(self, *, decimal: str | None = None, time_precision: str | None = None,
                   binary: str | None = None) -> Job:
        """This job reading values as the connector's settings say (``None``: unchanged)."""
        return replace(self, decimal_handling_mode=decimal or self.decimal_handling_mode,
                       time_precision_mode=time_precision or self.time_precision_mode,
                       binary_handling_mode=binary or self.binary_handling_mode)

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

    def output_types(self) -> dict[str, str | dict[str, str]]:
        """Output column -> its column type, or for a ``Collect`` field -> column type."""
        return {name: ({f: self.column_type(ref) for f, ref in proj.fields.items()}
                       if isinstance(proj, Collect) else self.projection_type(name))
                for name, proj in [*self.output.key.items(), *self.output.columns.items()]}

    # -- expressions (txjoin/expr.py) --------------------------------------------------

    @property
    def expressions(self) -> Expressions:
        """The job's compiled filters and computed columns (compiled once, at load)."""
        cached = self.__dict__.get("_expressions")
        if cached is None:
            cached = _compile_expressions(self)
            object.__setattr__(self, "_expressions", cached)
        return cached

    def projection_type(self, name: str) -> str:
        """The type of a non-Collect output column: its column's, its expression's, or its
        aggregate's (PostgreSQL's result type)."""
        proj = {**self.output.key, **self.output.columns}[name]
        if isinstance(proj, Aggregate):
            return self.aggregate_result_type(name)
        assert isinstance(proj, str)
        compiled = self.expressions.columns.get(name)
        return compiled.type if compiled is not None else self.column_type(proj)

    def aggregate_result_type(self, name: str) -> str:
        """The type of an aggregate: an :class:`Aggregate` output column, or one an
        expression reads (by its key in ``expressions.nested``)."""
        agg = self.expressions.nested.get(name) or self.output.columns[name]
        assert isinstance(agg, Aggregate)
        arg = self.expressions.aggregates.get(name)
        return aggregate_type(agg.func, None if arg is None else arg.type)

    def element_aliases(self, listed: str) -> list[str]:
        """The aliases an element of the listed alias ``listed`` binds: itself and its
        lookups (none of them listed: validate refuses a list under a list of child rows)."""
        out = [listed]
        for alias in out:
            out.extend(lk.alias for lk in self.children(alias) if not lk.listed)
        return out

    def __getstate__(self) -> dict[str, Any]:
        # Compiled evaluators are closures: a pickled job (shipped to Spark's workers)
        # compiles its expressions again where it is used.
        return {k: v for k, v in self.__dict__.items() if k != "_expressions"}

    # -- sources ---------------------------------------------------------------------

    @property
    def source_names(self) -> list[str]:
        """The sources in declared order (``["default"]`` when none is declared)."""
        return [s.name for s in self.sources] or [DEFAULT_SOURCE]

    def source_of(self, table: str) -> str:
        """The source a table is captured from."""
        return self.table(table).source or DEFAULT_SOURCE

    def tables_of(self, source: str) -> list[str]:
        """The tables captured from ``source``, in declared order."""
        return [t.name for t in self.tables if (t.source or DEFAULT_SOURCE) == source]

    def transaction_stream(self, source: str) -> str:
        """The name of ``source``'s transaction topic in ``caught_up``.

        ``transaction`` for a job without declared sources (unchanged), else
        ``transaction:<source>``: two sources' transaction topics never share a name.
        """
        return TRANSACTION_STREAM if not self.sources else f"{TRANSACTION_STREAM}:{source}"

    def source_prefixes(self, default_prefix: str,
                        overrides: Mapping[str, str] | None = None) -> dict[str, str]:
        """Source name -> topic prefix: ``overrides``, else the Source's prefix.

        A job without declared sources has one source, ``default``, whose prefix is
        ``default_prefix`` (``txjoin run --topic-prefix``).
        """
        overrides = dict(overrides or {})
        names = self.source_names
        unknown = sorted(set(overrides) - set(names))
        if unknown:
            _fail(self, f"topic prefix given for unknown source {unknown[0]!r}; the job's "
                        f"sources: {', '.join(names)} (use --topic-prefix NAME=PREFIX)")
        if not self.sources:
            return {DEFAULT_SOURCE: overrides.get(DEFAULT_SOURCE, default_prefix)}
        out: dict[str, str] = {}
        for src in self.sources:
            prefix = overrides.get(src.name) or src.prefix or ""
            if not prefix:
                _fail(self, f"source {src.name!r} has no topic prefix; set Source("
                            f"{src.name!r}, prefix=...) or pass --topic-prefix "
                            f"{src.name}=PREFIX")
            out[src.name] = prefix
        if len(set(out.values())) != len(out):
            _fail(self, f"two sources share a topic prefix: {out}; each source database "
                        f"needs its own connector topic.prefix")
        return out

    def with_source_prefixes(self, prefixes: Mapping[str, str]) -> Job:
        """This job with each declared source's prefix set from ``prefixes`` (see
        :meth:`source_prefixes`); a job without declared sources is returned as is."""
        if not self.sources:
            return self
        sources = [replace(s, prefix=prefixes.get(s.name, s.prefix)) for s in self.sources]
        return replace(self, sources=sources)

    def topics(self, prefix: str | Mapping[str, str]) -> list[str]:
        """The table topics: ``<prefix>.<schema>.<table>``, each with its source's prefix.

        ``prefix``: one prefix (a job without declared sources) or source -> prefix.
        """
        prefixes = self._prefix_map(prefix)
        return [table_topic(prefixes[self.source_of(t)], t) for t in self.table_names]

    def transaction_topics(self, prefix: str | Mapping[str, str]) -> dict[str, str]:
        """Source name -> its transaction topic ``<prefix>.transaction``."""
        prefixes = self._prefix_map(prefix)
        return {s: transaction_topic(prefixes[s]) for s in self.source_names}

    def all_topics(self, prefix: str | Mapping[str, str]) -> list[str]:
        """Every topic a run subscribes to: the table topics, then the transaction topics."""
        return [*self.topics(prefix), *self.transaction_topics(prefix).values()]

    def streams(self, prefix: str | Mapping[str, str]) -> dict[str, str]:
        """Topic -> stream name as ``caught_up`` takes it (a table, or a transaction stream)."""
        prefixes = self._prefix_map(prefix)
        out = {table_topic(prefixes[self.source_of(t)], t): t for t in self.table_names}
        for source, topic in self.transaction_topics(prefixes).items():
            out[topic] = self.transaction_stream(source)
        return out

    def _prefix_map(self, prefix: str | Mapping[str, str]) -> dict[str, str]:
        if isinstance(prefix, str):
            if len(self.source_names) > 1:
                _fail(self, f"one topic prefix {prefix!r} given for a job with sources "
                            f"{', '.join(self.source_names)}; give one per source")
            return dict.fromkeys(self.source_names, prefix)
        return dict(prefix)


@dataclass(frozen=True)
class Expressions:
    """A job's compiled expressions: the output filter, each lookup's filter (by alias) and
    each computed output column (by name; plain ``alias.column`` columns are not here)."""

    where: Compiled | None
    lookups: Mapping[str, Compiled]
    columns: Mapping[str, Compiled]
    aggregates: Mapping[str, Compiled] = field(default_factory=dict)
    """Output column (or key in ``nested``) -> the compiled argument of its
    :class:`Aggregate` (none for count(*))."""
    having: Compiled | None = None
    nested: Mapping[str, Aggregate] = field(default_factory=dict)
    """The aggregates the computed columns and ``having`` read, by key (an expression reads
    its value as ``binding[AGGREGATED][key]``); the same call twice is one aggregate."""


class ElementAggregates:
    """The aggregates an output column or ``having`` may read (txjoin.expr.AggregateScope):
    of one listed alias's elements, each computed as an :class:`Aggregate` column is.

    ``top``: the columns a fact's joined row has (``alias.column`` -> type); ``elements``:
    per listed alias, the columns of one element; ``taken``: names no key may have (the
    output columns). ``found`` and ``args``: each aggregate read so far and its argument,
    by key; the same call twice is one aggregate.
    """

    def __init__(self, top: Mapping[str, str], elements: Mapping[str, Mapping[str, str]],
                 taken: Sequence[str] = ()) -> None:
        self.top = dict(top)
        self.elements = {alias: dict(types) for alias, types in elements.items()}
        self.every = {ref: t for types in self.elements.values() for ref, t in types.items()}
        self.taken = set(taken)
        self.found: dict[str, Aggregate] = {}
        self.args: dict[str, Compiled] = {}
        self._keys: dict[Aggregate, str] = {}

    @classmethod
    def of(cls, job: Job) -> ElementAggregates:
        """The scope of ``job``'s output columns and ``having``."""
        return cls(_column_types(job, _top_aliases(job)),
                   {lk.alias: _column_types(job, job.element_aliases(lk.alias))
                    for lk in job.lookups if lk.listed}, list(job.output.columns))

    def element_of(self, ref: str) -> str | None:
        return next((alias for alias, types in self.elements.items() if ref in types), None)

    def aggregate(self, func: str, arg: str, separator: str | None) -> tuple[str, str]:
        compiled = compile_expr(arg, {**self.top, **self.every}, "its argument",
                                no_aggregate="an aggregate inside an aggregate's argument is "
                                             "not supported")
        owners = {ref: self.element_of(ref) for ref in sorted(compiled.refs)}
        outside = [ref for ref, owner in owners.items() if owner is None]
        if outside:
            raise ExprError(f"reads {outside[0]}, which is not a column of child rows or of "
                            f"array elements: an aggregate's argument reads one element's "
                            f"columns (use {outside[0]} outside the aggregate)")
        listed = sorted({owner for owner in owners.values() if owner is not None})
        if not listed:
            raise ExprError(f"reads no column of child rows or of array elements; aggregate "
                            f"a column of theirs ({func}({next(iter(self.every))}))"
                            if self.every else "the job has no child rows (Children) or "
                            "array lookup whose elements it could aggregate")
        if len(listed) > 1:
            raise ExprError(f"reads the elements of {listed[0]} and of {listed[1]}; an "
                            f"aggregate is over one listed alias's elements")
        t = aggregate_type(func, compiled.type)
        # Valid by construction: a listed alias, a known function, a separator with
        # string_agg only (txjoin/expr.py reads them from the call).
        agg = Aggregate(listed[0], func, compiled.text, separator)
        key = self._keys.get(agg)
        if key is None:
            n = len(self._keys) + 1
            while f"#{n}" in self.taken or f"#{n}" in self.found:
                n += 1
            key = self._keys[agg] = f"#{n}"
            self.found[key], self.args[key] = agg, compiled
        return key, t


def _top_aliases(job: Job) -> list[str]:
    """The aliases an output expression may read: those not under an array lookup."""
    out = [job.fact_alias]
    for lk in job.lookups:
        alias: str | None = lk.alias
        while alias is not None and alias != job.fact_alias:
            if job.lookup(alias).listed:
                break
            alias = job.lookup(alias).parent
        else:
            out.append(lk.alias)
    return out


def _column_types(job: Job, aliases: Sequence[str]) -> dict[str, str]:
    return {f"{alias}.{col}": typ for alias in aliases
            for col, typ in job.alias_table(alias).columns.items()}


def _compile_expressions(job: Job) -> Expressions:
    top = _column_types(job, _top_aliases(job))
    scope = ElementAggregates.of(job)
    try:
        where = None if job.where is None else compile_expr(
            job.where, top, "where", no_aggregate="where= filters a fact's joined row before "
            "aggregating; filter on aggregates with having=")
        lookups = {lk.alias: compile_expr(lk.where, _column_types(job, [lk.alias]),
                                          f"lookup {lk.alias!r} where",
                                          no_aggregate="a lookup's where= filters its own "
                                          "rows; filter on aggregates with the job's having=")
                   for lk in job.lookups if lk.where is not None}
        columns = {name: compile_expr(proj, top, f"output column {name!r}", scope)
                   for name, proj in job.output.columns.items()
                   if isinstance(proj, str) and not is_plain_ref(proj)}
        having = None if job.having is None else compile_expr(job.having, top, "having",
                                                              scope)
        aggregates = {name: compile_expr(proj.expr, _column_types(
                          job, job.element_aliases(proj.alias)), f"output column {name!r}",
                          no_aggregate="an aggregate inside an aggregate's argument is not "
                          "supported")
                      for name, proj in job.output.columns.items()
                      if isinstance(proj, Aggregate) and proj.expr is not None}
    except ExprError as exc:
        _fail(job, str(exc))
        raise  # unreachable: _fail raises
    for what, compiled in [("where", where), ("having", having),
                           *((f"lookup {a!r} where", c) for a, c in lookups.items())]:
        if compiled is not None and compiled.type != "bool":
            _fail(job, f"{what}: {compiled.text!r} is {compiled.type}, not a boolean "
                       f"predicate; compare it (e.g. {compiled.text} IS NOT NULL)")
    for name, arg in aggregates.items():
        agg = job.output.columns[name]
        assert isinstance(agg, Aggregate)
        try:
            aggregate_type(agg.func, arg.type)
        except ExprError as exc:
            _fail(job, f"output column {name!r}: {exc}")
    return Expressions(where, lookups, columns, {**aggregates, **scope.args}, having,
                       scope.found)


_SUM_TYPE = {"smallint": "bigint", "int": "bigint", "bigint": "numeric"}
_MIN_MAX_KINDS = frozenset({"int", "bigint", "smallint", "decimal", "numeric", "double", "real",
                            "text", "timestamp", "timestamptz", "date", "time", "interval"})


def aggregate_type(func: str, arg: str | None) -> str:
    """PostgreSQL's result type of ``func`` over a value of type ``arg`` (None: count(*)).

    Raises ExprError naming what ``func`` accepts when ``arg`` is not one of them.
    """
    if func == "count":
        return "bigint"
    assert arg is not None
    base = "" if arg.endswith("[]") else arg
    try:
        kind = column_kind(base)[0] if base else "array"
    except ValueError:
        kind = "unknown"
    if func in ("sum", "avg"):
        if kind in ("int", "bigint", "smallint"):
            return _SUM_TYPE[kind] if func == "sum" else "numeric"
        if kind in ("decimal", "numeric"):
            return "numeric"
        if kind == "double" or (kind == "real" and func == "avg"):
            return "double"
        if kind == "real":  # PostgreSQL adds reals in single precision
            raise ExprError("sum() of real is not supported; sum a double: "
                            "sum(CAST(x AS double precision))")
        raise ExprError(f"{func}() takes an integer, numeric, real or double value, not {arg}")
    if func in ("min", "max"):
        if kind not in _MIN_MAX_KINDS:
            raise ExprError(f"{func}() takes a number, text, date, time, timestamp or "
                            f"interval value, not {arg}")
        return arg
    if func in ("bool_and", "bool_or"):
        if kind != "bool":
            raise ExprError(f"{func}() takes a boolean value, not {arg}")
        return "bool"
    if func == "string_agg":
        if kind != "text":
            raise ExprError(f"string_agg() takes a text value (CAST it: CAST(x AS text)), "
                            f"not {arg}")
        return "text"
    raise ExprError(f"unknown aggregate {func!r}; use one of {', '.join(AGGREGATES)}")


def _fail(job: Job, what: str) -> None:
    # A job built inside a job file is validated before load_job knows the file's path;
    # load_job then puts the path in front of the message.
    where = "" if job.source_file == "<inline>" else f" ({job.source_file})"
    raise JobError(f"job {job.name!r}{where}: {what}")


def validate(job: Job) -> None:
    """Check the lookup graph is a tree rooted at the fact and every reference resolves."""
    if job.semantics not in SEMANTICS:
        _fail(job, f"semantics {job.semantics!r} is not one of {SEMANTICS}")
    names = [t.name for t in job.tables]
    if len(set(names)) != len(names):
        _fail(job, f"a table is declared twice: {names}")
    _validate_sources(job)
    for t in job.tables:
        if "." not in t.name:
            _fail(job, f"table {t.name!r} must be named schema.table")
        for col in t.key:
            if col not in t.columns:
                _fail(job, f"table {t.name}: key column {col!r} is not declared"
                           f"{did_you_mean(col, t.columns)}")
        for col, typ in t.columns.items():
            where = "" if job.source_file == "<inline>" else f" ({job.source_file})"
            check_type(typ, f"job {job.name!r}{where}: {t.name}.{col}")
        for col in t.defaults:
            if col not in t.columns:
                _fail(job, f"table {t.name}: default for {col!r}, which is not a declared column")
            if col in t.key:
                _fail(job, f"table {t.name}: key column {col!r} cannot have a default")
    if job.fact not in job._by_name:
        _fail(job, f"fact table {job.fact!r} is not declared in tables"
                   f"{did_you_mean(job.fact, names)}")
    aliases = [job.fact_alias, *(lk.alias for lk in job.lookups)]
    if len(set(aliases)) != len(aliases):
        _fail(job, f"an alias is used twice: {aliases}")
    if AGGREGATED in aliases:  # the binding's entry of the aggregates expressions read
        _fail(job, f"alias {AGGREGATED!r} is reserved; name the table otherwise")

    import networkx as nx  # here: unpickling a job (every Spark query's start) needs none

    graph = nx.DiGraph()
    graph.add_node(job.fact_alias)
    for lk in job.lookups:
        where = f"lookup {lk.alias!r} ({lk.table})"
        if lk.table not in job._by_name:
            _fail(job, f"{where}: table {lk.table!r} is not declared in tables"
                       f"{did_you_mean(lk.table, names)}")
        if lk.parent not in aliases:
            _fail(job, f"{where}: parent alias {lk.parent!r} does not exist"
                       f"{did_you_mean(lk.parent, aliases)}")
        if lk.how not in ("inner", "left"):
            _fail(job, f"{where}: how={lk.how!r}, expected 'inner' or 'left'")
        if not lk.on:
            _fail(job, f"{where}: `on` is empty")
        parent_table = job.alias_table(lk.parent)
        table = job.table(lk.table)
        for mine, theirs in lk.on.items():
            if mine not in table.columns:
                _fail(job, f"{where}: column {mine!r} is not declared on {lk.table}"
                           f"{did_you_mean(mine, table.columns)}")
            if theirs not in parent_table.columns:
                _fail(job, f"{where}: parent column {lk.parent}.{theirs} is not declared "
                           f"on {parent_table.name}{did_you_mean(theirs, parent_table.columns)}")
            is_array = parent_table.columns[theirs].endswith("[]")
            if is_array != lk.array:
                _fail(job, f"{where}: parent column {lk.parent}.{theirs} is "
                           f"{'an array' if is_array else 'not an array'}; set array="
                           f"{is_array}")
        if lk.array and len(lk.on) != 1:
            _fail(job, f"{where}: an array lookup matches exactly one column")
        if lk.distinct and not lk.array:
            _fail(job, f"{where}: distinct=True applies to an array lookup (array=True)")
        if lk.distinct and lk.how != "inner":
            _fail(job, f"{where}: a distinct array lookup is inner (PostgreSQL's LEFT JOIN "
                       f"... = ANY(...) keeps one row of NULLs for an array that matches "
                       f"nothing, not one per element); drop how='left' or distinct=True")
        if isinstance(lk, Children):
            _validate_children(job, lk, where)
        elif set(lk.on) != set(table.key) and lk.pick is None:
            _fail(job, f"{where}: matches on {sorted(lk.on)}, not the primary key "
                       f"{list(table.key)} of {lk.table}, so several rows can match; say how "
                       f"they resolve with pick=Pick(column, 'max'|'min')")
        if lk.pick is not None and lk.pick.column not in table.columns:
            _fail(job, f"{where}: pick column {lk.pick.column!r} is not declared"
                       f"{did_you_mean(lk.pick.column, table.columns)}")
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
    array_aliases = {lk.alias for lk in job.lookups if lk.listed}
    for lk in job.lookups:
        above = job.lookup(lk.parent) if lk.parent != job.fact_alias else None
        while above is not None:
            if isinstance(above, Children) and lk.listed:
                _fail(job, f"lookup {lk.alias!r} ({lk.table}): a list (array lookup or "
                           f"Children) under the child rows {above.alias!r} is not supported; "
                           f"a child row's own lookups must be many-to-one")
            above = job.lookup(above.parent) if above.parent != job.fact_alias else None

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
            _fail(job, f"{where}: unknown alias {alias!r}{did_you_mean(alias, aliases)}")
        if col not in job.alias_table(alias).columns:
            _fail(job, f"{where}: column {col!r} is not declared on "
                       f"{job.alias_table(alias).name}"
                       f"{did_you_mean(col, job.alias_table(alias).columns)}")
        arr = under_array(alias)
        if arr is not None and arr != inside:
            under = (f"lies under child rows {arr!r}" if isinstance(job.lookup(arr), Children)
                     else f"lies under array lookup {arr!r}")
            _fail(job, f"{where}: {ref} {under}; wrap it in Collect({arr!r}, ...) or "
                       f"Aggregate({arr!r}, ...)")
        if inside is not None and arr != inside:
            _fail(job, f"{where}: {ref} is not under the collected lookup {inside!r}")

    for name, proj in [*job.output.key.items(), *job.output.columns.items()]:
        where = f"output column {name!r}"
        if isinstance(proj, Collect):
            if proj.alias not in array_aliases:
                _fail(job, f"{where}: Collect({proj.alias!r}) needs an array lookup or "
                           f"Children alias{did_you_mean(proj.alias, sorted(array_aliases))}")
            for fname, ref in proj.fields.items():
                check_ref(ref, f"{where} field {fname!r}", proj.alias)
        elif isinstance(proj, Aggregate):
            if name in job.output.key:
                _fail(job, f"{where}: an output key column cannot be an Aggregate")
            _validate_aggregate(job, name, proj, array_aliases)
        elif not isinstance(proj, str):
            _fail(job, f"{where}: {proj!r} is neither 'alias.column', a SQL expression, "
                       f"Collect(...) nor Aggregate(...)")
        elif is_plain_ref(proj) or name in job.output.key:
            check_ref(proj, where, None)
    job.expressions  # noqa: B018 - compiles (and so checks) every expression at load


def _validate_children(job: Job, lk: Children, where: str) -> None:
    """A Children lookup: from the fact, matching by plain columns, ordered by its columns."""
    if lk.array or lk.pick is not None:
        _fail(job, f"{where}: Children take neither array= nor pick= (every referencing row "
                   f"is an element)")
    if lk.parent != job.fact_alias:
        _fail(job, f"{where}: Children must hang from the fact alias {job.fact_alias!r}, not "
                   f"{lk.parent!r} (child rows of a lookup are not supported yet)")
    if lk.table == job.fact:
        _fail(job, f"{where}: the child table cannot be the fact table {job.fact}")
    table = job.table(lk.table)
    for col in lk.order_by:
        if col not in table.columns:
            _fail(job, f"{where}: order_by column {col!r} is not declared on {lk.table}"
                       f"{did_you_mean(col, table.columns)}")


def _validate_aggregate(job: Job, name: str, agg: Aggregate, listed: set[str]) -> None:
    where = f"output column {name!r}"
    if agg.alias not in listed:
        _fail(job, f"{where}: Aggregate({agg.alias!r}, ...) needs an array lookup or Children "
                   f"alias{did_you_mean(agg.alias, sorted(listed))}")
    if agg.func not in AGGREGATES:
        _fail(job, f"{where}: unknown aggregate {agg.func!r}; use one of "
                   f"{', '.join(AGGREGATES)}{did_you_mean(agg.func, AGGREGATES)}")
    if agg.expr is None and agg.func != "count":
        _fail(job, f"{where}: {agg.func}() needs an expression: Aggregate({agg.alias!r}, "
                   f"{agg.func!r}, 'alias.column')")
    if (agg.separator is None) != (agg.func != "string_agg"):
        _fail(job, f"{where}: " + ("string_agg() needs separator=', ' (or another text)"
                                   if agg.func == "string_agg" else
                                   f"separator= is for string_agg(), not {agg.func}()"))


def _validate_sources(job: Job) -> None:
    sources = list(job.sources)
    for src in sources:
        if not isinstance(src, Source):
            _fail(job, f"sources must be Source(name, prefix=...) objects, got {src!r}")
        if not isinstance(src.name, str) or not src.name.strip():
            _fail(job, f"source name {src.name!r} must be a non-empty string")
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        _fail(job, f"a source name is declared twice: {names}")
    prefixes = [s.prefix for s in sources if s.prefix is not None]
    if len(set(prefixes)) != len(prefixes):
        _fail(job, f"two sources share a topic prefix: {prefixes}; each source database "
                   f"needs its own connector topic.prefix")
    for t in job.tables:
        if not sources and t.source is not None:
            _fail(job, f"table {t.name} names source {t.source!r} but the job declares no "
                       f"sources; add sources=[Source({t.source!r}, prefix=...)] or drop it")
        if sources and t.source not in names:
            what = "names no source" if t.source is None else f"names source {t.source!r}"
            _fail(job, f"table {t.name} {what}; with sources declared every table needs "
                       f"source= one of {names}")


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
