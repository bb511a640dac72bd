"""``txjoin verify --against-sql FILE``: the user's own query as a further referee.

verify's own SQL (:func:`txjoin.verify.verify.job_query`) answers with txjoin's rules
written out; the query a job was compiled from (``txjoin job from-sql``) answers with
PostgreSQL's, and the two part where the job's documented rules decide what the query
leaves open (issue 73):

- a ``Pick``: a lookup matched on columns that are not the looked-up table's key keeps
  one match (the greatest or least ``pick`` column, ties by key), where the query joins
  every match and so has a row for each: the sink's row must be one of the query's rows
  of its key, the rows differing only in columns read from that lookup (or below it);
- the order of a fact's elements: child rows with equal ``order_by`` (or no ``order_by``)
  are listed by their key as well, and a ``JOIN t ON t.id = ANY(o.col)`` lists each row at
  its value's first occurrence in the array, where PostgreSQL's order among them is
  unspecified: the sink's list (``Collect``) or ``string_agg`` must hold the query's
  elements, in another order.

Every other difference is a mismatch. The comparison is of today's state: a ``current``
job's, after ``txjoin run --until-idle`` once the writers stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2

from txjoin.errors import ConfigError
from txjoin.expr import AGGREGATED
from txjoin.job import Aggregate, Children, Collect, Job
from txjoin.sinks import Sink
from txjoin.verify.diff import row_key, show, values_equal

Row = dict[str, Any]


@dataclass(frozen=True)
class OwnQuery:
    """The user's query: the file it is in, its SELECT as PostgreSQL text, and the column
    names a ``CREATE VIEW v (a, b) AS`` gives it (None: the SELECT's own)."""

    path: str
    select: str
    columns: list[str] | None = None


def read_own_query(path: str) -> OwnQuery:
    """The SELECT of a query file, as ``txjoin job from-sql`` reads it (alone, in ``INSERT
    INTO t SELECT`` or ``CREATE VIEW t AS SELECT``)."""
    from txjoin.sql_job import query_select

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--against-sql {path}: cannot read it: {exc.strerror}") from None
    select, columns = query_select(text, path)
    return OwnQuery(path, select, columns)


@dataclass(frozen=True)
class Rule:
    """A documented rule of the job that decides what the user's query leaves open."""

    kind: str
    """``pick`` or ``order``."""
    alias: str
    text: str
    """The rule in words, for the report's line."""


@dataclass
class Explained:
    """The keys where one rule explains the difference, each with one line of detail."""

    rule: Rule
    lines: list[str] = field(default_factory=list)


@dataclass
class OwnQueryCheck:
    """One sink's current rows against the user's query."""

    sink: str
    query_rows: int
    query_keys: int
    explained: list[Explained] = field(default_factory=list)
    missing: list[Row] = field(default_factory=list)
    """Keys in the query's rows (the first row of each), not in the sink."""
    extra: list[Row] = field(default_factory=list)
    """Sink rows whose key the query has no row for."""
    different: list[tuple[list[Row], Row]] = field(default_factory=list)
    """(the query's rows of a key, the sink's row): no documented rule explains them."""

    @property
    def mismatches(self) -> int:
        return len(self.missing) + len(self.extra) + len(self.different)

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    def format(self, show_rows: int, indent: str = "    ") -> list[str]:
        """A line for the counts, then per rule a line with its count and one line per key
        (the first ``show_rows``), then the mismatches."""
        explained = sum(len(e.lines) for e in self.explained)
        lines = [f"{indent}{self.sink}: {explained} key(s) differ by txjoin's documented "
                 f"rules, {self.mismatches} mismatches"]
        for e in self.explained:
            lines.append(f"{indent}  {len(e.lines)} by {e.rule.text}")
            lines += [f"{indent}    {line}" for line in e.lines[:show_rows]]
        for title, rows in ((f"missing ({len(self.missing)}): in your query, not in the sink",
                             self.missing),
                            (f"extra ({len(self.extra)}): in the sink, not in your query",
                             self.extra)):
            if rows:
                lines.append(f"{indent}  {title}")
                lines += [f"{indent}    {show(r)}" for r in rows[:show_rows]]
        if self.different:
            lines.append(f"{indent}  different ({len(self.different)}): no documented rule "
                         f"explains them")
            for yours, sink in self.different[:show_rows]:
                for row in yours:
                    lines.append(f"{indent}    yours {show(row)}")
                lines.append(f"{indent}    sink  {show({c: sink.get(c) for c in yours[0]})}")
        return lines


# -- the rules, from the job ----------------------------------------------------------------


def rules(job: Job) -> dict[str, Rule]:
    """Alias -> the rule deciding what a query leaves open there: each non-listed lookup
    with a ``pick`` (``pick``), each child-rows alias and each ``= ANY`` array lookup whose
    element order a query cannot fix (``order``)."""
    out = {}
    for lk in job.lookups:
        table = job.table(lk.table)
        if lk.pick is not None and not lk.listed:
            most = "greatest" if lk.pick.order == "max" else "least"
            out[lk.alias] = Rule("pick", lk.alias, (
                f"a Pick: {lk.alias} ({lk.table}) matched on {', '.join(sorted(lk.on))}, "
                f"where several rows match: your query has a row for each, the job the "
                f"one with the {most} {lk.pick.column}"))
        elif isinstance(lk, Children):
            ties = (f"equal {', '.join(lk.order_by)}" if lk.order_by else "any order_by")
            out[lk.alias] = Rule("order", lk.alias, (
                f"the order of ties: {lk.alias} ({lk.table}) child rows of {ties} are "
                f"listed by {', '.join(table.key)} as well (PostgreSQL's order among them "
                f"is unspecified)"))
        elif lk.array and lk.distinct:
            out[lk.alias] = Rule("order", lk.alias, (
                f"the order of = ANY: {lk.alias} ({lk.table}) rows are listed at their "
                f"value's first occurrence in the array (PostgreSQL's order is "
                f"unspecified)"))
    return out


def _subtree(job: Job, alias: str) -> set[str]:
    below = {alias}
    for child in job.children(alias):
        below |= _subtree(job, child.alias)
    return below


def column_aliases(job: Job) -> dict[str, set[str] | None]:
    """Output column -> the aliases its value is read from (None: an expression over
    aggregates, whose aliases are not traced)."""
    out: dict[str, set[str] | None] = {}
    for name, projection in [*job.output.key.items(), *job.output.columns.items()]:
        if isinstance(projection, Collect | Aggregate):
            out[name] = {projection.alias}
            continue
        compiled = job.expressions.columns.get(name)
        refs = compiled.refs if compiled is not None else frozenset({projection})
        aliases = {ref.split(".", 1)[0] for ref in refs}
        out[name] = None if AGGREGATED in aliases else aliases
    return out


# -- the comparison -------------------------------------------------------------------------


def _same_elements(a: Any, b: Any, separator: str | None) -> bool:
    """Whether two lists (or ``string_agg`` texts) hold the same elements in any order."""
    if isinstance(a, str) and isinstance(b, str):
        if separator:
            a, b = a.split(separator), b.split(separator)
        else:
            a, b = list(a), list(b)
    if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
        return False
    left = list(b)
    for item in a:
        match = next((i for i, other in enumerate(left) if values_equal(item, other)), None)
        if match is None:
            return False
        left.pop(match)
    return True


class _Judge:
    """The rules of one job applied to the rows of one key."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.rules = rules(job)
        self.aliases = column_aliases(job)
        self.columns = job.output.column_names
        # column -> (rule, separator) where only the order of its elements is open
        self.ordered: dict[str, tuple[Rule, str | None]] = {}
        for name, projection in job.output.columns.items():
            rule = (self.rules.get(projection.alias)
                    if isinstance(projection, Collect | Aggregate) else None)
            if rule is None or rule.kind != "order":
                continue
            if isinstance(projection, Collect):
                self.ordered[name] = (rule, None)
            elif isinstance(projection, Aggregate) and projection.func == "string_agg":
                self.ordered[name] = (rule, projection.separator)
        self.picks = {alias: _subtree(job, alias) for alias, r in self.rules.items()
                      if r.kind == "pick"}

    def reorderings(self, yours: Row, sink: Row) -> list[Rule] | None:
        """The order rules that explain every column where ``yours`` and ``sink`` differ
        ([] when they are equal); None when some difference is not an order's."""
        found: list[Rule] = []
        for column in self.columns:
            if values_equal(yours.get(column), sink.get(column)):
                continue
            ordered = self.ordered.get(column)
            if ordered is None or not _same_elements(yours.get(column), sink.get(column),
                                                     ordered[1]):
                return None
            if ordered[0] not in found:
                found.append(ordered[0])
        return found

    def varying(self, yours: Sequence[Row]) -> list[str]:
        """The columns where the query's rows of one key differ (a list or ``string_agg``
        whose elements are the same, in another order, does not)."""
        def differs(column: str, row: Row) -> bool:
            a, b = yours[0].get(column), row.get(column)
            if values_equal(a, b):
                return False
            ordered = self.ordered.get(column)
            return ordered is None or not _same_elements(a, b, ordered[1])

        return [c for c in self.columns if any(differs(c, r) for r in yours[1:])]

    def pick_of(self, yours: Sequence[Row]) -> list[Rule] | None:
        """The picks whose several matches explain the query's rows of one key (they
        differ only in columns read from below those picks), None if none does."""
        if not self.picks:
            return None
        varying = self.varying(yours)
        if not varying:  # the same row again: some pick's matches, none of it shown
            return [self.rules[a] for a in self.picks]
        causes = []
        for column in varying:
            aliases = self.aliases.get(column)
            owners = [a for a, below in self.picks.items()
                      if aliases is not None and aliases and aliases <= below]
            if not owners:
                return None
            causes += [self.rules[a] for a in owners if self.rules[a] not in causes]
        return causes


def _key_text(job: Job, row: Row) -> str:
    return ", ".join(f"{k}={show(row.get(k))}" for k in job.output.key)


def compare_own_rows(job: Job, sink_name: str, yours: Sequence[Row], sink: Sequence[Row]
                     ) -> OwnQueryCheck:
    """The sink's current rows against the user's query's rows (both read by the job's
    types, :func:`txjoin.verify.verify.comparable_rows`), key by key."""
    keys = list(job.output.key)
    judge = _Judge(job)
    by_key: dict[tuple[Any, ...], list[Row]] = {}
    for row in yours:
        by_key.setdefault(row_key(row, keys), []).append(row)
    check = OwnQueryCheck(sink_name, len(yours), len(by_key))
    explained: dict[Rule, Explained] = {}

    def explain(rule: Rule, line: str) -> None:
        explained.setdefault(rule, Explained(rule)).lines.append(line)

    seen = set()
    for row in sink:
        key = row_key(row, keys)
        seen.add(key)
        mine = by_key.get(key)
        if mine is None:
            check.extra.append(row)
            continue
        orders = [judge.reorderings(r, row) for r in mine]
        held = next((i for i, o in enumerate(orders) if o is not None), None)
        picks = judge.pick_of(mine) if len(mine) > 1 else []
        if held is None or picks is None:
            check.different.append((mine, row))
            continue
        if picks:
            varying = judge.varying(mine)
            values = "; ".join(f"{c}: " + " | ".join(show(r.get(c)) for r in mine)
                               for c in varying)
            kept = ", ".join(f"{c} {show(row.get(c))}" for c in varying)
            explain(picks[0], f"{_key_text(job, row)}: {len(mine)} rows in your query"
                              + (f" ({values}); the sink has {kept}" if varying else
                                 " (equal ones); the sink has one"))
        for rule in orders[held] or ():
            columns = [c for c, (r, _) in judge.ordered.items()
                       if r == rule and not values_equal(mine[held].get(c), row.get(c))]
            explain(rule, f"{_key_text(job, row)}: " + "; ".join(
                f"{c}: yours {show(mine[held].get(c))}, the sink {show(row.get(c))}"
                for c in columns))
    check.missing = [rows[0] for key, rows in by_key.items() if key not in seen]
    check.explained = list(explained.values())
    return check


def query_rows(conn: Any, query: OwnQuery, job: Job) -> list[Row]:
    """The user's query's rows on ``conn`` (a connection set up as verify's), each with the
    job's output columns; a ConfigError when it fails or lacks one of them."""
    try:
        with conn.cursor() as cur:
            cur.execute(query.select)
            names = query.columns or [d[0] for d in cur.description or ()]
            rows = [dict(zip(names, r, strict=False)) for r in cur.fetchall()]
    except psycopg2.Error as exc:
        raise ConfigError(f"--against-sql {query.path}: your query failed on the source "
                          f"database: {' '.join(str(exc).split())} (it runs as PostgreSQL "
                          f"SQL)") from None
    finally:
        conn.rollback()
    lacking = [c for c in [*job.output.key, *job.output.column_names] if c not in names]
    if lacking:
        raise ConfigError(f"--against-sql {query.path}: your query has no column(s) "
                          f"{', '.join(lacking)} of job {job.name!r}'s output (it has "
                          f"{', '.join(names)}); name each select item as the job's column "
                          f"(AS name)")
    wanted = [*job.output.key, *job.output.column_names]
    return [{c: r[c] for c in dict.fromkeys(wanted)} for r in rows]


def check_own_query(job: Job, query: OwnQuery, conn: Any,
                    sinks: Sequence[tuple[Sink, str, str | None]]) -> list[OwnQueryCheck]:
    """Every sink (with a table: ``note`` None) against the user's query on ``conn``."""
    from txjoin.verify.verify import comparable_rows

    yours = comparable_rows(job, query_rows(conn, query, job))
    checks = []
    for sink, _, note in sinks:
        if note is not None:
            continue
        current = comparable_rows(job, sink.read_current())
        checks.append(compare_own_rows(job, sink.name, yours, current))
    return checks
