"""The oracle: the executable specification of a job's output.

It applies source transactions serially to an in-memory model of the tables and
evaluates the job by scanning them, the way the SQL in the seeds reads. It
shares no code path with the engine (no Debezium events, no assembly, no
incremental fan-out), so the property tests compare two independent answers.
Keep it short and obviously right. (A lookup's scan is remembered, grouped by the
looked-up values, until its table changes: :meth:`Oracle._matching`.)
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Context, Decimal, localcontext
from typing import Any, Literal

from txjoin.expr import AGGREGATED, numeric_divide
from txjoin.ingest.debezium import Modes
from txjoin.job import Aggregate, Children, Collect, Job, Lookup

Row = dict[str, Any]


@dataclass(frozen=True)
class RowChange:
    """One statement's effect on one row: insert/update carry the full new row, delete the key."""

    op: Literal["insert", "update", "delete"]
    table: str
    row: Mapping[str, Any]


@dataclass
class SourceTransaction:
    """A source transaction as the database committed it."""

    name: str
    changes: list[RowChange] = field(default_factory=list)
    source: str | None = None  # the source database (None: a job without declared sources)


class Oracle:
    """Serial application + evaluation by scanning."""

    def __init__(self, job: Job) -> None:
        self.job = job
        # (table, columns) -> the table's rows grouped by those columns' values, in table
        # order; None: a value is unhashable (an array or JSON column), scan every time.
        self._scans: dict[tuple[str, tuple[str, ...]],
                          dict[tuple[Any, ...], list[Row]] | None] = {}
        self.tables = {t: [] for t in job.table_names}
        self.output: dict[tuple[Any, ...], Row] = {}

    @property
    def tables(self) -> dict[str, list[Row]]:
        return self._tables

    @tables.setter
    def tables(self, tables: dict[str, list[Row]]) -> None:
        """The tables' rows, replaced whole (verify's replay sets them): forgets the scans."""
        self._tables = tables
        self._scans.clear()

    def _typed(self, table: str, row: Mapping[str, Any]) -> Row:
        # Rows as the database holds them, written by hand (not as a connector spells them).
        return self.job.table(table).convert_row(dict(row), where="oracle", modes=Modes())

    def _same_key(self, table: str, a: Row, b: Mapping[str, Any]) -> bool:
        return all(a.get(k) == b.get(k) for k in self.job.table(table).key)

    def load_snapshot(self, rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        for table, table_rows in rows.items():
            self.tables[table] = [self._typed(table, r) for r in table_rows]
        self._scans.clear()
        self.output = {}
        for fact in self.tables[self.job.fact]:
            self._refresh(fact)

    def apply(self, tx: SourceTransaction) -> None:
        self._scans.clear()
        touched: list[Row] = []
        child_versions: list[tuple[Children, Row]] = []  # every version of a changed child row
        for change in tx.changes:
            if change.table not in self.tables:
                continue
            typed = self._typed(change.table, change.row)
            rows = self.tables[change.table]
            old = [r for r in rows if self._same_key(change.table, r, typed)]
            rows[:] = [r for r in rows if not self._same_key(change.table, r, typed)]
            if change.op != "delete":
                rows.append(typed)
            if change.table == self.job.fact:
                touched.extend(old or [typed])
            for lk in self.job.lookups:
                if isinstance(lk, Children) and lk.table == change.table:
                    child_versions += [(lk, r) for r in [*old, typed]]
        # A change to a child row is a change to the facts it references, before or after.
        for lk, child in child_versions:
            touched += [f for f in self.tables[self.job.fact] if all(
                child.get(mine) is not None and f.get(theirs) == child.get(mine)
                for mine, theirs in lk.on.items())]
        if self.job.semantics == "current":
            self.output = {}
            for fact in self.tables[self.job.fact]:
                self._refresh(fact)
            return
        for fact in touched:
            key = self._out_key(fact)
            self.output.pop(key, None)
            current = [r for r in self.tables[self.job.fact] if self._same_key(self.job.fact,
                                                                               r, fact)]
            for row in current:
                self._refresh(row)

    def _out_key(self, fact: Row) -> tuple[Any, ...]:
        return tuple(fact.get(ref.split(".", 1)[1]) for ref in self.job.output.key.values())

    def _refresh(self, fact: Row) -> None:
        out = self.evaluate(fact)
        key = self._out_key(fact)
        if out is None:
            self.output.pop(key, None)
        else:
            self.output[key] = out

    # -- evaluation by scanning ---------------------------------------------------

    def _matching(self, table: str, wanted: Mapping[str, Any]) -> list[Row]:
        """The rows of ``table`` whose columns equal ``wanted``'s values, in table order.

        The scan of the table is done once per set of columns and remembered, grouped by
        their values, until the table changes (``apply``, ``load_snapshot``): evaluating
        every fact of a state is then linear in the state, not quadratic (``txjoin verify``
        evaluates the job on every state a reader could see). The group found by a value's
        hash is filtered with ``==`` again, so the rows are exactly the scan's."""
        columns = tuple(wanted)
        key = (table, columns)
        if key not in self._scans:
            grouped: dict[tuple[Any, ...], list[Row]] = {}
            try:
                for r in self.tables[table]:
                    grouped.setdefault(tuple(r.get(c) for c in columns), []).append(r)
                self._scans[key] = grouped
            except TypeError:  # an unhashable value: no grouping, scan each time
                self._scans[key] = None
        groups = self._scans[key]
        candidates = self.tables[table]
        if groups is not None:
            with contextlib.suppress(TypeError):  # an unhashable wanted value: scan
                candidates = groups.get(tuple(wanted.values()), [])
        return [r for r in candidates if all(r.get(c) == v for c, v in wanted.items())]

    def _find(self, lk: Lookup, parent: Row | None, value: Any = None) -> Row | None:
        if parent is None:
            return None
        wanted = {mine: (value if lk.array else parent.get(theirs))
                  for mine, theirs in lk.on.items()}
        if any(v is None for v in wanted.values()):
            return None
        hits = self._matching(lk.table, wanted)
        where = self.job.expressions.lookups.get(lk.alias)
        if where is not None:  # the lookup's filter: which rows of its table match at all
            hits = [r for r in hits if where.evaluate({lk.alias: r}) is True]
        if not hits:
            return None
        if lk.pick is None:
            return hits[0]
        # PostgreSQL's rule, stated here on its own (not the engine's code): the greatest
        # (max) or least (min) value wins; a NULL never does while any match has a value;
        # among equals, the greatest (max) or least (min) key of the looked-up table.
        col, key = lk.pick.column, self.job.table(lk.table).key
        hits.sort(key=lambda r: [r.get(k) for k in key], reverse=lk.pick.order == "max")
        values = [r[col] for r in hits if r.get(col) is not None]
        if not values:
            return hits[0]
        best = max(values) if lk.pick.order == "max" else min(values)
        return next(r for r in hits if r.get(col) is not None and r[col] == best)

    def _join(self, alias: str, row: Row | None) -> dict[str, Any] | None:
        """All bindings reachable from ``alias``; None when an inner lookup fails."""
        env: dict[str, Any] = {alias: row}
        for lk in self.job.lookups:
            if lk.parent != alias:
                continue
            if isinstance(lk, Children):
                env[lk.alias] = self._children(lk, row)
                if not env[lk.alias] and lk.how == "inner":
                    return None
                continue
            if lk.array:
                array = row.get(next(iter(lk.on.values()))) if row is not None else None
                if lk.distinct:  # = ANY(array): each value once, first occurrence first
                    seen: list[Any] = []
                    for value in array or []:
                        if value is not None and value not in seen:
                            seen.append(value)
                    array = seen
                elements = []
                for value in array or []:
                    match = self._find(lk, row, value)
                    if match is None and lk.how == "inner":
                        continue
                    sub = self._join(lk.alias, match)
                    if sub is not None:
                        elements.append(sub)
                if not elements and lk.how == "inner":
                    return None
                env[lk.alias] = elements
                continue
            match = self._find(lk, row)
            if match is None and lk.how == "inner":
                return None
            sub = self._join(lk.alias, match)
            if sub is None:
                return None
            env.update(sub)
        return env

    def _children(self, lk: Children, parent: Row | None) -> list[dict[str, Any]]:
        """The rows of the child table whose ``on`` columns equal the parent's, filtered,
        sorted as ``ORDER BY order_by, key`` (ascending, NULLs last), each with its lookups."""
        if parent is None:
            return []
        wanted = {mine: parent.get(theirs) for mine, theirs in lk.on.items()}
        if any(v is None for v in wanted.values()):
            return []
        where = self.job.expressions.lookups.get(lk.alias)
        rows = [r for r in self._matching(lk.table, wanted)
                if where is None or where.evaluate({lk.alias: r}) is True]
        # Stable sorts, least significant column first; NULLs after every value.
        for col in reversed([*lk.order_by, *self.job.table(lk.table).key]):
            valued = sorted((r for r in rows if r.get(col) is not None), key=lambda r: r[col])
            rows = valued + [r for r in rows if r.get(col) is None]
        elements = []
        for r in rows:
            sub = self._join(lk.alias, r)
            if sub is not None:
                elements.append(sub)
        return elements

    def evaluate(self, fact: Row) -> Row | None:
        env = self._join(self.job.fact_alias, fact)
        if env is None:
            return None
        # Filter and computed columns on the whole joined row (WHERE, then SELECT).
        expressions = self.job.expressions
        if expressions.where is not None and expressions.where.evaluate(env) is not True:
            return None
        # The aggregates computed columns and HAVING read, then HAVING on the fact's group.
        env[AGGREGATED] = {
            key: _aggregate(agg, self.job.aggregate_result_type(key),
                            [expressions.aggregates[key].evaluate(e) for e in env[agg.alias]])
            for key, agg in expressions.nested.items()}
        if expressions.having is not None and expressions.having.evaluate(env) is not True:
            return None

        def get(scope: dict[str, Any], ref: str) -> Any:
            alias, col = ref.split(".", 1)
            r = scope.get(alias)
            return None if r is None else r.get(col)

        out: Row = {}
        for name, proj in [*self.job.output.key.items(), *self.job.output.columns.items()]:
            if isinstance(proj, Collect):
                out[name] = [{f: get(e, ref) for f, ref in proj.fields.items()}
                             for e in env[proj.alias]]
            elif isinstance(proj, Aggregate):
                arg = expressions.aggregates.get(name)
                values = [True if arg is None else arg.evaluate(e) for e in env[proj.alias]]
                out[name] = _aggregate(proj, self.job.projection_type(name), values)
            elif name in expressions.columns:
                out[name] = expressions.columns[name].evaluate(env)
            else:
                out[name] = get(env, proj)
        return out


def _aggregate(agg: Aggregate, result_type: str, values: list[Any]) -> Any:
    """PostgreSQL's aggregate of ``values`` (one per element; NULLs ignored)."""
    present = [v for v in values if v is not None]
    if agg.func == "count":
        return len(present)
    if not present:
        return None  # every other aggregate of no value is NULL
    if agg.func == "string_agg":
        return (agg.separator or "").join(present)
    if agg.func == "bool_and":
        return False not in present
    if agg.func == "bool_or":
        return True in present
    if agg.func in ("min", "max") and result_type == "numeric":
        best = (min if agg.func == "min" else max)(Decimal(v) for v in present)
        return format(best, "f")  # an unbounded numeric, as its column reads: text
    if agg.func == "min":
        return min(present)
    if agg.func == "max":
        return max(present)
    if isinstance(present[0], float):  # double precision: added in order, then divided
        total: Any = 0.0
        for v in present:
            total += v
        return total if agg.func == "sum" else total / len(present)
    with localcontext(Context(prec=4000)):  # numeric and integer sums are exact
        total = sum(Decimal(v) for v in present)
    if result_type != "numeric":
        return int(total)
    result = numeric_divide(total, len(present)) if agg.func == "avg" else total
    return None if result is None else format(result, "f")  # as a numeric column reads


def outputs_after_each(job: Job, snapshot: Mapping[str, Sequence[Mapping[str, Any]]],
                       transactions: Iterable[SourceTransaction]) -> list[dict[Any, Row]]:
    """[output after the snapshot, after T1, after T2, ...]."""
    oracle = Oracle(job)
    oracle.load_snapshot(snapshot)
    result = [dict(oracle.output)]
    for tx in transactions:
        oracle.apply(tx)
        result.append(dict(oracle.output))
    return result


def outputs_by_source_prefixes(job: Job, snapshot: Mapping[str, Sequence[Mapping[str, Any]]],
                               transactions: Iterable[SourceTransaction]
                               ) -> dict[tuple[int, ...], dict[Any, Row]]:
    """For a job over several sources: (k1, k2, ...) -> the output on (S1 after its k1-th
    transaction, S2 after its k2-th, ...), counts in ``job.source_names`` order.

    These are every state a reader may observe (docs/writing-jobs.md, "Two source databases").
    Sources own disjoint tables, so with ``current`` semantics the output depends
    only on the counts. (With ``as_of_fact`` it depends on the interleaving too:
    each source's transactions are applied here in source order.)
    """
    per_source: dict[str, list[SourceTransaction]] = {s: [] for s in job.source_names}
    for tx in transactions:
        per_source[tx.source or job.source_names[0]].append(tx)
    lists = [per_source[s] for s in job.source_names]
    out: dict[tuple[int, ...], dict[Any, Row]] = {}
    for counts in itertools.product(*(range(len(txs) + 1) for txs in lists)):
        oracle = Oracle(job)
        oracle.load_snapshot(snapshot)
        for txs, k in zip(lists, counts, strict=True):
            for tx in txs[:k]:
                oracle.apply(tx)
        out[counts] = dict(oracle.output)
    return out
