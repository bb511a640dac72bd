"""A job from a SQL query (``txjoin job from-sql``).

A ``SELECT`` (alone, or in ``INSERT INTO t SELECT ...``, which names the output table, or
``CREATE [MATERIALIZED] VIEW t AS SELECT ...``, whose ``t`` does not: the job's name does,
unless ``--output-table`` says otherwise) compiles into a job file that loads with
:func:`txjoin.job.load_job` and runs unchanged:

- the ``FROM`` table is the fact; ``JOIN`` / ``LEFT JOIN ... ON`` equalities to one table
  joined before are lookups (a join on columns that are not the looked-up table's primary
  key takes the match with the greatest key: ``Pick(key, "max")``, said in the file);
  other conditions on the joined table's own columns are the lookup's ``where``;
- ``CROSS JOIN unnest(o.col) [WITH ORDINALITY] AS u(x[, n])`` (PostgreSQL) or ``CROSS JOIN
  UNNEST(o.col) AS u(x)`` (Flink SQL), then a join on ``u.x``, is an array lookup, and
  ``json_agg`` / ``jsonb_agg`` / ``JSON_ARRAYAGG`` of an object over it with ``GROUP BY``
  the fact's key is a :class:`~txjoin.job.Collect` (in array order: ``ORDER BY n``);
- ``JOIN t ON t.id = ANY(o.col)`` is a distinct array lookup (``distinct=True``): each
  matching row once, as PostgreSQL matches it, listed in the order of its value's first
  occurrence in the array (PostgreSQL's own order is unspecified);
- ``WHERE`` is the job's filter, other select items its computed columns
  (txjoin/expr.py);
- ``FOR SYSTEM_TIME AS OF <fact>.<column>`` on every lookup (Flink SQL's temporal join) is
  ``as_of_fact``; plain joins are ``current``.

One parser reads both dialects: sqlglot's PostgreSQL dialect, which already parses Flink
SQL's ``FOR SYSTEM_TIME AS OF`` (as a table version), ``CROSS JOIN UNNEST(...) AS u(x)``,
``JSON_ARRAYAGG`` and ``JSON_OBJECT(k VALUE v)``; sqlglot has no Flink dialect, and the
PostgreSQL one keeps PostgreSQL's meaning for every expression (txjoin/expr.py uses it too).

What a job cannot keep transaction-consistent, or txjoin does not support yet, is a
:class:`~txjoin.errors.JobError` naming the construct with ``FILE:LINE:COLUMN`` and why:
a join not rooted at one fact key, window functions, ``DISTINCT ON``, aggregates across
facts, subqueries, ``= ANY(array)`` outside a join's ``ON``, anything that reads the
clock.

With ``GROUP BY`` the fact's key, a join from the fact on columns that are not the joined
table's key, read inside aggregates, is the fact's child rows (:class:`~txjoin.job.Children`,
one child table per job): ``count``/``sum``/``avg``/``min``/``max``/``bool_and``/``bool_or``/
``string_agg`` over them (and their lookups) are :class:`~txjoin.job.Aggregate` columns, and
``json_agg`` of an object over an inner join of them a ``Collect``; an aggregate's ``ORDER
BY`` of child columns is the child rows' ``order_by``. Those aggregates may be part of a
select item's expression (``CASE WHEN max(l.qty) > 4 THEN ...``, ``sum(l.amount) /
nullif(count(l.id), 0)``) and of ``HAVING``, the job's ``having`` (each fact is its own
group: a filter on it after ``WHERE``).

Column types come from the catalog as ``txjoin job init`` reads them
(:func:`txjoin.catalog.read_catalog`), or from the tables of an existing job file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NoReturn

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from txjoin.errors import JobError, did_you_mean
from txjoin.expr import ExprError, compile_expr
from txjoin.job import (
    Aggregate,
    Children,
    Collect,
    ElementAggregates,
    Job,
    Lookup,
    Output,
    Pick,
    Source,
    Table,
    load_job,
)

DIALECT = "postgres"

CLOCK_NODES: tuple[type[exp.Expr], ...] = (
    exp.CurrentTimestamp, exp.CurrentDate, exp.CurrentTime, exp.Localtimestamp,
    exp.Localtime, exp.Rand)
CLOCK_FUNCTIONS = ("clock_timestamp", "statement_timestamp", "transaction_timestamp",
                   "timeofday", "proctime", "current_row_timestamp", "current_watermark",
                   "gen_random_uuid", "random")
CLOCK_WORDS = ("current_timestamp", "now", "localtimestamp", "current_date", "current_time",
               "localtime", "rand", "random", *CLOCK_FUNCTIONS)
COLLECTING = ("json_agg", "jsonb_agg", "json_arrayagg")
OBJECTS = ("json_build_object", "jsonb_build_object", "json_object")


@dataclass
class _Unnest:
    name: str
    parent: str
    column: str
    element: str
    ordinality: str | None
    node: exp.Expr
    used_by: str | None = None


@dataclass
class SqlJob:
    """A compiled query: the job, its file's source, and notes for the user."""

    job: Job
    source: str
    notes: list[str] = field(default_factory=list)


TableSource = Callable[[list[str]], Mapping[str, Table]]
"""Written table names -> the declared :class:`Table` of each (from a catalog or a job)."""


class _Compiler:
    def __init__(self, text: str, path: str) -> None:
        self.text = text
        self.path = path
        try:
            self.tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(text)
            statements = [s for s in sqlglot.parse(text, read=DIALECT) if s is not None]
        except ParseError as exc:
            first = exc.errors[0] if exc.errors else {}
            line, col = first.get("line", 1), first.get("col", 1)
            desc = str(first.get("description", exc)).splitlines()[0]
            raise JobError(f"{path}:{line}:{col}: cannot parse the query: {desc}") from None
        except TokenError as exc:
            raise JobError(f"{path}: cannot parse the query: {exc}") from None
        if len(statements) != 1:
            raise JobError(f"{path}: expected one SELECT statement, found {len(statements)}; "
                           f"keep one query per file")
        self.statement = statements[0]

    # -- positions ----------------------------------------------------------------------

    def _start(self, node: exp.Expr) -> int | None:
        starts = [n.meta["start"] for n in node.walk() if "start" in n.meta]
        return min(starts) if starts else None

    def locate(self, node: exp.Expr | None, words: Sequence[str] = ()
               ) -> tuple[int | None, str | None]:
        """(offset, token text) of ``node``: its own position; else, given the ``words`` a
        node of its kind starts with, the last such word before its first positioned token,
        or (no positioned token) the same-numbered such word in the query; else the first
        positioned token of it or of its nearest ancestor that has one."""
        if node is None:
            return None, None
        if "start" in node.meta:
            start = node.meta["start"]
            token = next((t.text for t in self.tokens if t.start == start), None)
            return start, token
        if words:
            hits = [t for t in self.tokens if t.text.lower() in words]
            inner = self._start(node)
            if inner is not None:
                before = [t for t in hits if t.start <= inner]
                if before:
                    return before[-1].start, before[-1].text
            else:
                same = [n for n in self.statement.walk(bfs=False)
                        if "start" not in n.meta and self._start(n) is None
                        and self._word(n) in words]
                index = next((i for i, n in enumerate(same) if n is node), 0)
                if hits:
                    hit = hits[min(index, len(hits) - 1)]
                    return hit.start, hit.text
        start = self._start(node)
        parent = node.parent
        while start is None and parent is not None:
            start = self._start(parent)
            parent = parent.parent
        return start, None

    def at(self, node: exp.Expr | None, words: Sequence[str] = ()) -> str:
        """``FILE:LINE:COLUMN`` of ``node`` (:meth:`locate`)."""
        start, _ = self.locate(node, words)
        if start is None:
            return f"{self.path}:1:1"
        line = self.text.count("\n", 0, start) + 1
        col = start - (self.text.rfind("\n", 0, start) + 1) + 1
        return f"{self.path}:{line}:{col}"

    @staticmethod
    def _word(node: exp.Expr) -> str:
        if isinstance(node, exp.Anonymous):
            return str(node.this).lower()
        return node.sql(dialect=DIALECT).split("(")[0].strip().lower()

    def fail(self, node: exp.Expr | None, what: str, words: Sequence[str] = ()) -> NoReturn:
        raise JobError(f"{self.at(node, words)}: {what}")

    # -- the statement ----------------------------------------------------------------

    def select(self) -> tuple[exp.Select, str | None, list[str] | None]:
        """The SELECT, the output table the statement names, its column list."""
        stmt = self.statement
        target: str | None = None
        columns: list[str] | None = None
        if isinstance(stmt, exp.Create) and \
                str(stmt.args.get("kind", "")).upper() not in ("VIEW", "TABLE"):
            self.fail(stmt, f"CREATE {stmt.args.get('kind')}: expected a SELECT, INSERT "
                            f"INTO t SELECT or CREATE VIEW t AS SELECT")
        if isinstance(stmt, (exp.Insert, exp.Create)):  # INSERT INTO t / CREATE VIEW t AS
            this = stmt.this
            if isinstance(this, exp.Schema):
                columns = [i.name for i in this.expressions]
                this = this.this
            target = this.name if isinstance(this, exp.Table) else None
            stmt = stmt.expression
        if not isinstance(stmt, exp.Select):
            kind = type(stmt).__name__.upper() if stmt is not None else "nothing"
            self.fail(stmt, f"{kind}: expected a SELECT (or INSERT INTO t SELECT / CREATE "
                            f"VIEW t AS SELECT); a job is one SELECT over the source tables")
        return stmt, target, columns

    def refuse_anywhere(self, select: exp.Select) -> None:
        """What no part of a job can be, wherever it appears, in query order."""
        for node in select.walk(bfs=False):
            if isinstance(node, exp.With):
                self.fail(node, "WITH (a common table expression) is a subquery: a job reads "
                                "each fact's row and the rows its lookups name, not another "
                                "query's result; write the joins in the one SELECT",
                          ("with",))
            if node is not select and isinstance(node, (exp.Select, exp.Subquery, exp.Union,
                                                        exp.Exists)):
                self.fail(node, "a subquery: a job reads each fact's row and the rows its "
                                "lookups name, not another query's result, so a change "
                                "could not be traced to the facts it affects; not supported "
                                "(join the table instead)", ("select", "exists"))
            if isinstance(node, exp.Window):
                self.fail(node, f"window function {self._word(node.this)}(...) OVER: its "
                                f"value depends on other facts' rows, which a change to one "
                                f"fact does not re-evaluate; not supported", ("over",))
            if isinstance(node, exp.Distinct) and node.args.get("on") is not None:
                self.fail(node, "DISTINCT ON keeps one of several rows by an order across "
                                "the whole result; not supported (the output already has one "
                                "row per fact key: drop it)", ("distinct",))
            if isinstance(node, CLOCK_NODES) or (
                    isinstance(node, exp.Anonymous) and self._word(node) in CLOCK_FUNCTIONS):
                word = self.locate(node, CLOCK_WORDS)[1] or self._word(node)
                self.fail(node, f"{word} reads the clock (or a random source): the output "
                                f"would not be a function of the committed state, and a "
                                f"replay would give another answer; compare with a column or "
                                f"a literal instead (o.order_time > timestamp '2024-01-01')",
                          CLOCK_WORDS)
            if isinstance(node, exp.Any) and not (
                    isinstance(node.parent, exp.EQ) and node.find_ancestor(exp.Join)):
                self.fail(node, "= ANY(array) outside a JOIN's ON: a membership test is not "
                                "supported yet; as a lookup write JOIN t ON t.id = "
                                "ANY(o.col) (each matching row once) or CROSS JOIN "
                                "unnest(o.col) WITH ORDINALITY AS u(x, n) JOIN t ON t.id = u.x "
                                "(every element, in array order)", ("any",))
        if select.args.get("qualify") is not None:
            self.fail(select.args["qualify"], "QUALIFY filters on window functions, which "
                                              "are not supported", ("qualify",))
        for key in ("limit", "offset", "fetch"):
            if select.args.get(key) is not None:
                self.fail(select.args[key], f"{key.upper()}: keeps a part of the result by an "
                                            f"order across facts; a job's output has a row for "
                                            f"every fact that qualifies: drop it", (key,))
        if select.args.get("distinct") is not None:
            self.fail(select.args["distinct"], "DISTINCT: not supported (the output already "
                                               "has one row per fact key: drop it)",
                      ("distinct",))


def query_select(text: str, path: str) -> tuple[str, list[str] | None]:
    """The SELECT of a query file (alone, or in ``INSERT INTO t SELECT`` / ``CREATE VIEW t
    AS SELECT``) as PostgreSQL text, and the column list the statement gives its rows
    (``CREATE VIEW t (a, b) AS``; None: the SELECT's own names): what ``txjoin verify
    --against-sql`` runs."""
    select, _, columns = _Compiler(text, path).select()
    return select.sql(dialect=DIALECT), columns


def _conjuncts(node: exp.Expr) -> list[exp.Expr]:
    node = node.unnest() if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.And):
        return [*_conjuncts(node.this), *_conjuncts(node.expression)]
    return [node]


class _Query:
    """The query's tables, aliases and lookups, built join by join."""

    def __init__(self, c: _Compiler, select: exp.Select, tables: Mapping[str, Table]) -> None:
        self.c = c
        self.select = select
        self.tables = tables
        self.aliases: dict[str, Table] = {}
        self.unnests: dict[str, _Unnest] = {}
        self.lookups: list[Lookup] = []
        self.array_aliases: set[str] = set()  # unnested arrays' lookups and child rows
        self.any_joins: dict[str, exp.Expr] = {}  # alias -> its `= ANY(array)` condition
        self.child_aliases: set[str] = set()
        self.temporal: list[tuple[exp.Expr, bool]] = []
        self.notes: list[str] = []
        self.comments: dict[str, str] = {}
        self.used_tables: list[Table] = []
        self.fact_alias = ""

    def table(self, node: exp.Table) -> tuple[str, Table]:
        name = _written(node)
        table = self.tables[name]
        alias = node.alias_or_name
        if alias in self.aliases or alias in self.unnests:
            self.c.fail(node, f"alias {alias!r} is used twice; give each table its own alias")
        self.aliases[alias] = table
        if table not in self.used_tables:
            self.used_tables.append(table)
        return alias, table

    def under_array(self, alias: str) -> bool:
        while alias in self.parent_of:
            if alias in self.array_aliases:
                return True
            alias = self.parent_of[alias]
        return False

    def lookup(self, alias: str) -> Lookup:
        return next(lk for lk in self.lookups if lk.alias == alias)

    @property
    def parent_of(self) -> dict[str, str]:
        return {lk.alias: lk.parent for lk in self.lookups}

    def qualify(self, node: exp.Expr) -> None:
        """Give every column its alias (an unqualified name must be one alias's column)."""
        for col in list(node.find_all(exp.Column)):
            if col.table:
                known = col.table in self.aliases or col.table in self.unnests
                if not known:
                    hint = did_you_mean(col.table, [*self.aliases, *self.unnests])
                    self.c.fail(col, f"{col.sql(dialect=DIALECT)}: no table or unnest named "
                                     f"{col.table!r} is in FROM or joined before this point"
                                     f"{hint}")
                if col.table in self.aliases and col.name not in self.aliases[col.table].columns:
                    table = self.aliases[col.table]
                    self.c.fail(col, f"{col.sql(dialect=DIALECT)}: {table.name} has no "
                                     f"(supported) column {col.name!r}"
                                     f"{did_you_mean(col.name, table.columns)}")
                continue
            owners = [a for a, t in self.aliases.items() if col.name in t.columns]
            owners += [u.name for u in self.unnests.values()
                       if col.name in (u.element, u.ordinality)]
            if len(owners) != 1:
                what = "no table has" if not owners else f"{', '.join(owners)} all have"
                self.c.fail(col, f"column {col.name!r}: {what} a column of that name; "
                                 f"qualify it (alias.{col.name})")
            col.set("table", exp.to_identifier(owners[0]))

    def unnest_join(self, join: exp.Join, node: exp.Unnest) -> None:
        side = str(join.args.get("side") or "").upper()
        on = join.args.get("on")
        if side or (on is not None and not (isinstance(on, exp.Boolean) and on.this)):
            self.c.fail(node, "unnest(...) joins as CROSS JOIN unnest(o.col) AS u(x): an "
                              "outer or conditional join of an unnest is not supported yet",
                        ("unnest",))
        args = node.expressions
        alias = node.args.get("alias")
        if len(args) != 1 or not isinstance(args[0], exp.Column) or alias is None:
            self.c.fail(node, "unnest: expected unnest(alias.array_column) [WITH ORDINALITY] "
                              "AS u(element[, n])", ("unnest",))
        self.qualify(args[0])
        parent, column = args[0].table, args[0].name
        if parent in self.unnests or self.under_array(parent):
            self.c.fail(node, "unnest of an array inside an unnested array: nested array "
                              "lookups are not supported yet", ("unnest",))
        if not self.aliases[parent].columns[column].endswith("[]"):
            self.c.fail(args[0], f"unnest({parent}.{column}): {column} is "
                                 f"{self.aliases[parent].columns[column]}, not an array")
        names = [i.name for i in alias.args.get("columns") or []]
        offset = node.args.get("offset")
        ordinality = offset.name if isinstance(offset, exp.Expr) else None
        if ordinality is None and offset and len(names) == 2:
            names, ordinality = names[:1], names[1]
        if len(names) != 1:
            self.c.fail(node, f"unnest AS {alias.name}(...): name the element column "
                              f"(and the ordinality's), e.g. AS {alias.name or 'u'}(x, n)",
                        ("unnest",))
        name = alias.name
        if name in self.aliases or name in self.unnests:
            self.c.fail(node, f"alias {name!r} is used twice", ("unnest",))
        self.unnests[name] = _Unnest(name, parent, column, names[0], ordinality, node)

    def table_join(self, join: exp.Join, node: exp.Table) -> None:
        side = str(join.args.get("side") or "").upper()
        kind = str(join.args.get("kind") or "").upper()
        if side not in ("", "LEFT") or kind not in ("", "INNER", "OUTER"):
            what = " ".join(w for w in (side, kind) if w) or "a comma"
            self.c.fail(node, f"{what} JOIN {node.name}: a join not rooted at one fact key "
                              f"(it keeps or multiplies rows without a fact); only JOIN and "
                              f"LEFT JOIN ... ON are lookups")
        if join.args.get("using"):
            self.c.fail(node, f"JOIN {node.name} USING (...): write the join as ON "
                              f"{node.alias_or_name}.col = parent.col")
        on = join.args.get("on")
        if on is None:
            self.c.fail(node, f"JOIN {node.name} without ON: a cross join is not rooted at one "
                              f"fact key; join on the looked-up table's columns (ON "
                              f"{node.alias_or_name}.id = o.{node.name}_id)")
        version = node.args.get("version")
        alias, table = self.table(node)
        self.temporal.append((node, version is not None))
        if version is not None:
            when = version.args.get("expression")
            if isinstance(when, exp.Column) and when.name.lower() == "proctime" and \
                    "proctime" not in self.aliases[self.fact_alias].columns:
                self.c.fail(when, f"FOR SYSTEM_TIME AS OF {when.sql(dialect=DIALECT)}: "
                                  f"processing time reads the clock: the output would not be "
                                  f"a function of the committed state; join AS OF the fact's "
                                  f"own time column (as_of_fact) or plainly (current)")
            if isinstance(when, exp.Column):
                self.qualify(when)
            if not (isinstance(when, exp.Column) and when.table == self.fact_alias):
                self.c.fail(version, f"FOR SYSTEM_TIME AS OF {when.sql(dialect=DIALECT)}: "
                                     f"txjoin joins as of the commit that last changed the "
                                     f"fact, so the time must be a column of the fact "
                                     f"{self.fact_alias!r} (FOR SYSTEM_TIME AS OF "
                                     f"{self.fact_alias}.<time column>)", ("system_time",))
        self.qualify(on)
        links: list[tuple[str, str, str, exp.Expr]] = []  # mine, parent, theirs, node
        filters: list[exp.Expr] = []
        any_part: exp.Expr | None = None
        for part in _conjuncts(on):
            cols = list(part.find_all(exp.Column))
            if isinstance(part, exp.EQ) and isinstance(part.expression, exp.Any):
                a, b = part.this, part.expression.this
                b = b.unnest() if isinstance(b, exp.Paren) else b
                if not (isinstance(a, exp.Column) and a.table == alias and
                        isinstance(b, exp.Column) and b.table != alias):
                    self.c.fail(part, f"JOIN {node.name} ON {part.sql(dialect=DIALECT)}: "
                                      f"expected {alias}.col = ANY(parent.array_column)",
                                ("any",))
                links.append((a.name, b.table, b.name, part))
                any_part = part
                continue
            if isinstance(part, exp.EQ) and all(isinstance(s, exp.Column)
                                                for s in (part.this, part.expression)):
                a, b = part.this, part.expression
                if a.table == alias and b.table != alias:
                    links.append((a.name, b.table, b.name, part))
                    continue
                if b.table == alias and a.table != alias:
                    links.append((b.name, a.table, a.name, part))
                    continue
            if cols and all(col.table == alias for col in cols):
                filters.append(part)
                continue
            self.c.fail(part, f"JOIN {node.name} ON {part.sql(dialect=DIALECT)}: a join not "
                              f"rooted at one fact key; a join's condition equates "
                              f"{alias}'s columns with columns of one table joined before "
                              f"(and may filter {alias}'s own columns)")
        if not links:
            self.c.fail(on, f"JOIN {node.name}: its ON does not equate a column of {alias} "
                            f"with a column of a table joined before")
        parents = {p for _, p, _, _ in links}
        if len(parents) != 1:
            self.c.fail(on, f"JOIN {node.name}: a join not rooted at one fact key: {alias} "
                            f"is matched to {', '.join(sorted(parents))} at once; a lookup "
                            f"hangs from one table joined before")
        (parent,) = parents
        array = distinct = False
        if any_part is not None:
            if len(links) != 1:
                self.c.fail(on, f"JOIN {node.name}: an = ANY(array) join matches on the "
                                f"array alone ({alias}.col = ANY({parent}.array_column))")
            mine, _, theirs, _ = links[0]
            if parent in self.unnests or not self.aliases[parent].columns[theirs] \
                    .endswith("[]"):
                self.c.fail(any_part, f"JOIN {node.name}: {parent}.{theirs} is not an array "
                                      f"column; = ANY(...) joins on an array", ("any",))
            if self.under_array(parent) or parent in self.array_aliases:
                self.c.fail(any_part, f"JOIN {node.name}: = ANY of an array inside an array "
                                      f"lookup: nested array lookups are not supported yet",
                            ("any",))
            on_map = {mine: theirs}
            array = distinct = True
            self.any_joins[alias] = any_part
        elif parent in self.unnests:
            unnest = self.unnests[parent]
            if len(links) != 1 or links[0][2] != unnest.element:
                self.c.fail(on, f"JOIN {node.name}: join an unnested array on its element "
                                f"alone ({alias}.col = {parent}.{unnest.element})")
            if unnest.used_by is not None:
                self.c.fail(node, f"JOIN {node.name}: unnest {parent!r} is joined already "
                                  f"({unnest.used_by}); one lookup per unnested array")
            unnest.used_by = alias
            on_map = {links[0][0]: unnest.column}
            parent = unnest.parent
            array = True
        else:
            on_map = {}
            for mine, _, theirs, part in links:
                if mine in on_map:
                    self.c.fail(part, f"JOIN {node.name}: {alias}.{mine} is matched twice")
                on_map[mine] = theirs
            parent_table = self.aliases[parent]
            for theirs in on_map.values():
                if parent_table.columns[theirs].endswith("[]"):
                    self.c.fail(on, f"JOIN {node.name}: {parent}.{theirs} is an array; "
                                    f"unnest it first (CROSS JOIN unnest({parent}.{theirs}) "
                                    f"WITH ORDINALITY AS u(x, n)) and join on u.x")
        pick = None
        if set(on_map) != set(table.key):
            pick = Pick(table.key[0], "max")
            self.comments[alias] = (f"{alias}: matched on {', '.join(sorted(on_map))}, not "
                                    f"its key: the greatest {table.key[0]} wins (edit pick=)")
            self.notes.append(
                f"{self.c.at(node)}: {alias} ({table.name}) is matched on "
                f"{', '.join(sorted(on_map))}, not its primary key "
                f"({', '.join(table.key)}): where several rows match, the job takes the one "
                f"with the greatest {table.key[0]} (the latest added); edit pick= to choose "
                f"otherwise")
        where = None
        if filters:
            where = " AND ".join(f.sql(dialect=DIALECT) for f in filters)
            try:
                compile_expr(where, {f"{alias}.{col}": typ for col, typ in
                                     table.columns.items()}, f"JOIN {node.name} ON")
            except ExprError as exc:
                self.c.fail(filters[0], str(exc))
        how = "left" if str(join.args.get("side") or "").upper() == "LEFT" else "inner"
        if distinct and how == "left":
            self.c.fail(node, f"LEFT JOIN {node.name} ON ... = ANY(...): PostgreSQL keeps one "
                              f"row of NULLs for an array that matches nothing, which a list "
                              f"of elements cannot say; use JOIN")
        if array and how == "left":
            self.c.fail(node, f"LEFT JOIN {node.name} on an unnested array: not supported "
                              f"yet (an element that matches nothing)")
        self.lookups.append(Lookup(alias, table.name, parent=parent, on=on_map,
                                   how=how, array=array, pick=pick, where=where,  # type: ignore[arg-type]
                                   distinct=distinct))
        if array:
            self.array_aliases.add(alias)


def _written(node: exp.Table) -> str:
    return ".".join(p for p in (node.catalog, node.db, node.name) if p)


def _table_nodes(select: exp.Select) -> list[exp.Table]:
    out: list[exp.Table] = []
    from_ = select.args.get("from_") or select.args.get("from")
    if from_ is not None and isinstance(from_.this, exp.Table):
        out.append(from_.this)
    for join in select.args.get("joins") or []:
        if isinstance(join.this, exp.Table):
            out.append(join.this)
    return out


def _output_name(item: exp.Expr) -> str | None:
    if isinstance(item, exp.Alias):
        return item.alias
    if isinstance(item, exp.Column):
        return item.name
    if isinstance(item, exp.Anonymous):
        return str(item.this).lower()
    if isinstance(item, exp.Func):
        return _Compiler._word(item)
    return None


def _collected(node: exp.Expr) -> tuple[exp.Expr, list[exp.Ordered]] | None:
    """(the aggregated object, the ORDER BY terms) of json_agg/JSON_ARRAYAGG(obj [ORDER BY])."""
    if isinstance(node, exp.JSONArrayAgg):
        inner = node.this
        ordered = node.args.get("order")
        order = list(ordered.expressions) if ordered is not None else []
    elif isinstance(node, exp.Anonymous) and str(node.this).lower() in COLLECTING and \
            len(node.expressions) == 1:
        inner, order = node.expressions[0], []
    else:
        return None
    if isinstance(inner, exp.Order):
        order = list(inner.expressions)
        inner = inner.this
    return inner, order


def _object_fields(node: exp.Expr) -> list[tuple[exp.Expr, exp.Expr]] | None:
    """The (key, value) pairs of json_build_object(k, v, ...) / JSON_OBJECT(k VALUE v, ...)."""
    if isinstance(node, exp.JSONObject):
        pairs = []
        for kv in node.expressions:
            if not isinstance(kv, exp.JSONKeyValue):
                return None
            pairs.append((kv.this, kv.expression))
        return pairs
    if isinstance(node, exp.Anonymous) and str(node.this).lower() in OBJECTS:
        args = node.expressions
        if len(args) % 2:
            return None
        return [(args[i], args[i + 1]) for i in range(0, len(args), 2)]
    return None


def compile_sql(text: str, path: str, name: str, tables_for: TableSource,
                sources: Sequence[Source] = (), modes: Mapping[str, str | None] | None = None,
                semantics: str | None = None, output_table: str | None = None,
                unique: Mapping[str, Sequence[frozenset[str]]] | None = None) -> SqlJob:
    """Compile the query ``text`` (read from ``path``) into the job named ``name``.

    ``semantics``: the job's, over what the joins say (``FOR SYSTEM_TIME AS OF`` the
    fact: ``as_of_fact``, else ``current``); PostgreSQL has no syntax for a join as of
    the fact's commit. ``output_table``: the table the job writes; default the one an
    ``INSERT INTO t`` names (a write target, as in Flink SQL), else ``name``. A ``CREATE
    VIEW t`` does not name it: ``t`` is the query's name in the source database, and two
    jobs compiled from one view (one per semantics) would otherwise write one table.
    ``unique``: each table's unique column sets as the catalog has them (filled by
    ``tables_for``; None: not known), which decide where a documented rule will apply
    (:func:`_rule_notes`)."""
    c = _Compiler(text, path)
    select, target, renames = c.select()
    if isinstance(c.statement, exp.Create):
        target = None
    c.refuse_anywhere(select)
    from_ = select.args.get("from_") or select.args.get("from")
    if from_ is None or not isinstance(from_.this, exp.Table):
        c.fail(from_ or select, "FROM: expected one source table, the fact (FROM orders o)")
    written = []
    for node in _table_nodes(select):
        if _written(node) not in written:
            written.append(_written(node))
    tables = tables_for(written)
    q = _Query(c, select, tables)
    q.fact_alias, fact = q.table(from_.this)
    if from_.this.args.get("version") is not None:
        c.fail(from_.this, "FOR SYSTEM_TIME AS OF on the fact: put it on the joined tables",
               ("system_time",))
    for join in select.args.get("joins") or []:
        node = join.this
        if isinstance(node, exp.Lateral) and isinstance(node.this, exp.Unnest):
            lateral = node.this
            if node.args.get("alias") is not None and lateral.args.get("alias") is None:
                lateral.set("alias", node.args["alias"])
            q.unnest_join(join, lateral)
        elif isinstance(node, exp.Unnest):
            q.unnest_join(join, node)
        elif isinstance(node, exp.Table):
            q.table_join(join, node)
        else:
            c.fail(node, f"JOIN {node.sql(dialect=DIALECT)[:40]}: expected a table or "
                         f"unnest(alias.array_column)")
    for unnest in q.unnests.values():
        if unnest.used_by is None:
            c.fail(unnest.node, f"unnest({unnest.parent}.{unnest.column}) AS {unnest.name}: "
                                f"no table is joined on {unnest.name}.{unnest.element}; an "
                                f"unnested array is a lookup (JOIN t ON t.id = "
                                f"{unnest.name}.{unnest.element})", ("unnest",))
    _child_joins(c, q, select)
    temporal = {flag for _, flag in q.temporal}
    if len(temporal) > 1:
        plain = next(node for node, flag in q.temporal if not flag)
        c.fail(plain, f"JOIN {plain.name}: some joins are FOR SYSTEM_TIME AS OF the fact and "
                      f"this one is not; a job joins every lookup one way (as_of_fact or "
                      f"current): write it on every join or on none")
    if semantics is None:
        semantics = "as_of_fact" if temporal == {True} else "current"

    top = {f"{a}.{col}": typ for a, t in q.aliases.items() if not q.under_array(a)
           for col, typ in t.columns.items()}

    def under_array(node: exp.Expr) -> str | None:
        """An element's column read outside an aggregate (inside one, an aggregate reads
        it)."""
        for col in node.find_all(exp.Column):
            if col.find_ancestor(*_AGGREGATES) is not None:
                continue
            if col.table in q.unnests:
                return f"{col.table}.{col.name}"
            if q.under_array(col.table):
                return f"{col.table}.{col.name}"
        return None

    def expression(node: exp.Expr, what: str) -> str:
        aggregates = [n for n in node.walk()
                      if isinstance(n, exp.AggFunc) or _collected(n) is not None]
        scope = None
        if aggregates:
            agg = aggregates[0]
            word = _Compiler._word(agg)
            if select.args.get("group") is None:
                c.fail(agg, f"{word}(...) in {what} without GROUP BY the fact's key: an "
                            f"aggregate across facts, which one fact's change cannot "
                            f"re-evaluate; a job has one output row per fact", (word,))
            if _collected(agg) is not None or type(agg) not in _AGGREGATES \
                    or not q.child_aliases:
                c.fail(agg, f"{word}(...) in {what}: not supported here; txjoin computes "
                            f"count, sum, avg, min, max, bool_and, bool_or and string_agg "
                            f"over child rows (a table joined from the fact on a column that "
                            f"is not its key), GROUP BY the fact's key, as a select item, "
                            f"inside one's expression or in HAVING; json_agg/JSON_ARRAYAGG of "
                            f"an object over an unnested array or child rows as a whole "
                            f"select item", (word,))
            scope = _child_scope(q, top)
        place = c.at(node)  # before the aggregates are rewritten (they lose their places)
        sql = (_canonical_aggregates(c, q, node) if scope is not None else node).sql(
            dialect=DIALECT)
        try:
            compile_expr(sql, top, what, scope)
        except ExprError as exc:
            raise JobError(f"{place}: {exc}") from None
        return sql

    # -- WHERE
    where_text = None
    where = select.args.get("where")
    if where is not None:
        q.qualify(where.this)
        inside = under_array(where.this)
        if inside is not None:
            c.fail(where, f"WHERE reads {inside}, an element of an unnested array: not "
                          f"supported yet; filter the elements in their JOIN's ON (JOIN t ON "
                          f"t.id = u.x AND t.col ...)", ("where",))
        where_text = expression(where.this, "WHERE")

    # -- GROUP BY
    group = select.args.get("group")
    fact_keys = {f"{q.fact_alias}.{k}" for k in fact.key}
    if group is not None:
        grouped = []
        for item in group.expressions:
            q.qualify(item)
            inside = under_array(item)
            if inside is not None:
                c.fail(item, f"GROUP BY {item.sql(dialect=DIALECT)}: grouping by an array "
                             f"element gives several rows per fact; not supported")
            grouped.append(item.sql(dialect=DIALECT))
        missing = sorted(fact_keys - set(grouped))
        if missing:
            c.fail(group, f"GROUP BY without the fact's key {', '.join(missing)}: an "
                          f"aggregate across facts, which one fact's change cannot "
                          f"re-evaluate; GROUP BY the fact's primary key", ("group",))

    # -- the SELECT list
    key: dict[str, str] = {}
    columns: dict[str, str | Collect | Aggregate] = {}
    items = list(select.expressions)
    if renames is not None and len(renames) != len(items):
        c.fail(c.statement, f"the output table names {len(renames)} columns and the SELECT "
                            f"lists {len(items)}")
    for i, item in enumerate(items):
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column)
                                          and isinstance(item.this, exp.Star)):
            c.fail(item, "SELECT *: name the output columns (alias.column AS name)", ("*",))
        out = renames[i] if renames is not None else _output_name(item)
        body = item.this if isinstance(item, exp.Alias) else item
        if out is None:
            c.fail(item, f"{body.sql(dialect=DIALECT)[:40]}: name this output column "
                         f"(... AS name)")
        if out in key or out in columns:
            c.fail(item, f"output column {out!r} is named twice; rename one with AS")
        if type(body) in _AGGREGATES and q.child_aliases:
            columns[out] = _child_aggregate(c, q, body)
            continue
        collected = _collected(body)
        if collected is not None:
            if group is None:
                c.fail(body, f"{_Compiler._word(body)}(...) without GROUP BY the fact's key: "
                             f"an aggregate across facts; GROUP BY "
                             f"{', '.join(sorted(fact_keys))}", (_Compiler._word(body),))
            columns[out] = _collect(c, q, body, *collected)
            continue
        q.qualify(body)
        inside = under_array(body)
        if inside is not None and _child_of(q, inside) is not None:
            c.fail(body, f"{body.sql(dialect=DIALECT)}: reads {inside}, a column of the child "
                         f"rows {_child_of(q, inside)}, outside an aggregate: that is one "
                         f"output row per child row, and a job has one per fact; aggregate "
                         f"it (max({inside}), sum({inside}), count({inside}), ...)")
        if inside is not None:
            c.fail(body, f"{body.sql(dialect=DIALECT)}: reads {inside}, an array element, "
                         f"outside an aggregate: that is one output row per element, and a "
                         f"job has one per fact; collect them (json_agg(json_build_object"
                         f"(...)) ... GROUP BY the fact's key)")
        projection = expression(body, f"output column {out!r}")
        if projection in fact_keys and projection not in key.values():
            key[out] = projection
        else:
            columns[out] = projection
    # -- HAVING: one group per fact, so a filter on the fact's group after WHERE
    having_text = None
    having = select.args.get("having")
    if having is not None:
        if group is None:
            c.fail(having, "HAVING without GROUP BY the fact's key: a filter on aggregates "
                           "across facts; GROUP BY the fact's primary key", ("having",))
        q.qualify(having.this)
        inside = under_array(having.this)
        if inside is not None:
            what = (f"a column of the child rows {_child_of(q, inside)}"
                    if _child_of(q, inside) is not None else "an array element")
            c.fail(having, f"HAVING reads {inside}, {what}, outside an aggregate: one value "
                           f"per element, where HAVING filters the fact's group; aggregate "
                           f"it (max({inside}), count({inside}), ...)", ("having",))
        having_text = expression(having.this, "HAVING")
    missing = [k for k in sorted(fact_keys) if k not in key.values()]
    if missing:
        c.fail(select, f"the SELECT does not list the fact's primary key "
                       f"{', '.join(missing)}: the output is keyed by it; add it "
                       f"({missing[0]} AS ...)", ("select",))
    collected_aliases = {p.alias for p in columns.values() if isinstance(p, Collect)}
    for lk in q.lookups:
        if lk.array and lk.alias not in collected_aliases and lk.alias in q.any_joins:
            c.fail(q.any_joins[lk.alias], f"the table joined on = ANY(...) ({lk.alias}) is "
                                          f"not aggregated: a job has one row per fact; "
                                          f"collect it with json_agg(json_build_object(...)) "
                                          f"and GROUP BY the fact's key", ("any",))
        if lk.array and lk.alias not in collected_aliases:
            unnest = next(u for u in q.unnests.values() if u.used_by == lk.alias)
            c.fail(unnest.node, f"the unnested array {unnest.parent}.{unnest.column} "
                                f"({lk.alias}) is not aggregated: a job has one row per fact; "
                                f"collect it with json_agg(json_build_object(...)) and GROUP "
                                f"BY the fact's key", ("unnest",))
    used_sources = {t.source for t in q.used_tables if t.source is not None}
    job_sources = [s for s in sources if s.name in used_sources]
    modes = modes or {}
    try:
        job = Job(name=name, tables=q.used_tables, fact=fact.name, fact_alias=q.fact_alias,
                  lookups=q.lookups,
                  output=Output(table=output_table or target or name, key=key,
                                columns=columns),
                  semantics=semantics,  # type: ignore[arg-type]
                  where=where_text, having=having_text, sources=job_sources,
                  decimal_handling_mode=modes.get("decimal_handling_mode"),
                  time_precision_mode=modes.get("time_precision_mode"),
                  binary_handling_mode=modes.get("binary_handling_mode"))
    except JobError as exc:
        raise JobError(f"{path}: the job compiled from the query does not validate: "
                       f"{exc}") from None
    return SqlJob(job, render(job, text, path, q.comments), _rule_notes(q, unique))


def _rule_notes(q: _Query, unique: Mapping[str, Sequence[frozenset[str]]] | None
                ) -> list[str]:
    """The notes, with where txjoin's documented rules will decide rows that the user's
    query leaves to PostgreSQL: a ``Pick`` among several matching rows (kept only where no
    UNIQUE on the matched columns rules it out), and a tie in a child table's ``order_by``
    (broken by the child's key; PostgreSQL's order among equal rows is unspecified), said
    where no UNIQUE on (parent link, order_by) rules it out. These are the rows a
    comparison with the query itself can differ in (issue 73)."""
    def ruled_out(table: str, columns: set[str]) -> bool:
        return unique is not None and any(u <= columns for u in unique.get(table, ()))

    notes = []
    for note in q.notes:
        lk = next((lk for lk in q.lookups if lk.pick is not None
                   and f": {lk.alias} ({lk.table}) is matched on" in note), None)
        if lk is not None and ruled_out(lk.table, set(lk.on)):
            continue  # UNIQUE: at most one row matches
        if lk is not None and unique is not None:
            note += f" (the catalog has no UNIQUE on {lk.table} ({', '.join(sorted(lk.on))}))"
        notes.append(note)
    for lk in q.lookups:
        if not isinstance(lk, Children) or not lk.order_by:
            continue
        if ruled_out(lk.table, {*lk.on, *lk.order_by}):
            continue
        table = q.aliases[lk.alias]
        why = (f"the catalog has no UNIQUE on {lk.table} ({', '.join([*lk.on, *lk.order_by])})"
               if unique is not None else "the job's tables do not say it is unique")
        notes.append(f"{lk.alias} ({lk.table}): child rows of one fact with equal "
                     f"{', '.join(lk.order_by)} are listed by {', '.join(table.key)} as well "
                     f"(txjoin's tie rule; PostgreSQL's order among them is unspecified): "
                     f"{why}")
    return notes


def _collect(c: _Compiler, q: _Query, node: exp.Expr, obj: exp.Expr,
             order: list[exp.Ordered]) -> Collect:
    fields = _object_fields(obj)
    word = _Compiler._word(node)
    if fields is None:
        c.fail(obj, f"{word}({obj.sql(dialect=DIALECT)[:40]}): a list of a plain value is "
                    f"not supported yet; aggregate an object (json_build_object('k', t.col, "
                    f"...) / JSON_OBJECT('k' VALUE t.col, ...))", (word,))
    out: dict[str, str] = {}
    aliases = set()
    for k, v in fields:
        if not (isinstance(k, exp.Literal) and k.is_string):
            c.fail(k, f"{word}: an object's keys must be string literals")
        if not isinstance(v, exp.Column):
            c.fail(v, f"{word}: field {k.this!r} is {v.sql(dialect=DIALECT)[:40]}; a listed "
                      f"field is a column (alias.column): expressions in a list are not "
                      f"supported yet")
        q.qualify(v)
        aliases.add(v.table)
        out[k.this] = f"{v.table}.{v.name}"
    arrays = {a for a in q.array_aliases
              if any(a == al or _ancestor(q, a, al) for al in aliases)}
    if arrays and arrays <= q.child_aliases and len(arrays) == 1:
        (alias,) = arrays
        if q.lookup(alias).how == "left":
            c.fail(node, f"{word}(...) over LEFT JOIN {q.lookup(alias).table}: PostgreSQL lists "
                         f"one object of NULLs for a fact without child rows, txjoin an empty "
                         f"list; collect over JOIN (facts without child rows then have no "
                         f"row), or aggregate them (count, sum, ...)", (word,))
        _order_children(c, q, alias, order, word)
        return Collect(alias, out)
    if len(arrays) != 1 or any(not q.under_array(a) for a in aliases):
        c.fail(obj, f"{word}: every field must come from the one table joined on an unnested "
                    f"array (or its lookups); an aggregate of other rows is not supported yet",
               (word,))
    (alias,) = arrays
    if alias in q.any_joins:
        if order:
            c.fail(order[0], f"{word}(... ORDER BY {order[0].sql(dialect=DIALECT)}) over = "
                             f"ANY(...): txjoin lists each matching row once in the order of "
                             f"its first occurrence in the array (PostgreSQL's own order is "
                             f"unspecified); drop the ORDER BY, or unnest WITH ORDINALITY "
                             f"and ORDER BY the ordinality for every element in array order",
                   (word,))
        return Collect(alias, out)
    unnest = next(u for u in q.unnests.values() if u.used_by == alias)
    for term in order:
        col = term.this
        if not (isinstance(col, exp.Column) and not term.args.get("desc") and
                col.name == unnest.ordinality and col.table in ("", unnest.name)):
            c.fail(term, f"{word}(... ORDER BY {term.sql(dialect=DIALECT)}): the list keeps "
                         f"the array's order; only ORDER BY the unnest's ordinality "
                         f"({unnest.name}.{unnest.ordinality or 'n'}) is supported")
    return Collect(alias, out)


_AGGREGATES: dict[type[exp.Expr], str] = {
    exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max",
    exp.LogicalAnd: "bool_and", exp.LogicalOr: "bool_or", exp.GroupConcat: "string_agg"}
"""The aggregates over child rows (GROUP BY the fact's key) a job computes."""


def _child_joins(c: _Compiler, q: _Query, select: exp.Select) -> None:
    """With GROUP BY, a join from the fact on columns that are not the joined table's key,
    read inside aggregates, is the fact's child rows (:class:`~txjoin.job.Children`)."""
    if select.args.get("group") is None:
        return
    read: set[str] = set()
    having = select.args.get("having")
    for item in [*select.expressions, *([having] if having is not None else [])]:
        for node in item.walk():
            if isinstance(node, tuple(_AGGREGATES)) or _collected(node) is not None:
                q.qualify(node)
                read |= {col.table for col in node.find_all(exp.Column)}
    for i, lk in enumerate(q.lookups):
        if lk.parent != q.fact_alias or lk.array or lk.pick is None:
            continue
        if not any(a == lk.alias or _ancestor(q, lk.alias, a) for a in read):
            continue
        q.lookups[i] = Children(lk.alias, lk.table, lk.parent, lk.on, how=lk.how,
                                where=lk.where)
        q.comments.pop(lk.alias, None)
        q.notes = [n for n in q.notes if f": {lk.alias} ({lk.table}) is matched on" not in n]
        q.child_aliases.add(lk.alias)
        q.array_aliases.add(lk.alias)
    if len(q.child_aliases) > 1:
        c.fail(select, f"child rows of {', '.join(sorted(q.child_aliases))} joined at once: "
                       f"each multiplies the other's rows in every aggregate; aggregate one "
                       f"child table per job", ("select",))


def _order_children(c: _Compiler, q: _Query, alias: str, order: list[exp.Ordered],
                    word: str) -> None:
    """The child rows' order, from an aggregate's ORDER BY (the same in every aggregate)."""
    columns = []
    for term in order:
        col = term.this
        if not (isinstance(col, exp.Column) and col.table == alias) or term.args.get("desc") \
                or term.args.get("nulls_first"):
            c.fail(term, f"{word}(... ORDER BY {term.sql(dialect=DIALECT)}): child rows are "
                         f"listed by their own columns ascending, NULLs last ({alias}.col)")
        columns.append(col.name)
    if not columns:
        return
    lk = q.lookup(alias)
    assert isinstance(lk, Children)
    if lk.order_by and list(lk.order_by) != columns:
        c.fail(order[0], f"{word}(... ORDER BY ...): another aggregate orders {alias}'s rows "
                         f"by {', '.join(lk.order_by)}; the child rows have one order")
    q.lookups[q.lookups.index(lk)] = replace(lk, order_by=columns)


def _child_aggregate(c: _Compiler, q: _Query, node: exp.Expr) -> Aggregate:
    """count/sum/avg/min/max/bool_and/bool_or/string_agg over the fact's child rows."""
    func = _AGGREGATES[type(node)]
    arg = node.this
    separator = None
    order: list[exp.Ordered] = []
    if isinstance(node, exp.GroupConcat):
        sep = node.args.get("separator")
        if not (isinstance(sep, exp.Literal) and sep.is_string):
            c.fail(node, "string_agg(x, separator): the separator must be a text literal",
                   ("string_agg",))
        separator = sep.this
    if isinstance(arg, exp.Order):
        order, arg = list(arg.expressions), arg.this
    if isinstance(arg, exp.Distinct):
        c.fail(node, f"{func}(DISTINCT ...): not supported yet", (func,))
    (alias,) = q.child_aliases
    lk = q.lookup(alias)
    if isinstance(arg, exp.Star):
        if func != "count" or lk.how == "left":
            c.fail(node, f"count(*) over LEFT JOIN {lk.table}: PostgreSQL counts the row of "
                         f"NULLs a fact without child rows joins to (1, not 0); count a column "
                         f"of the child: count({alias}.{q.aliases[alias].key[0]})", ("count",))
        return Aggregate(alias, "count")
    q.qualify(arg)
    inner = next((n for n in arg.walk() if type(n) in _AGGREGATES), None)
    if inner is not None:
        c.fail(inner, f"{func}({arg.sql(dialect=DIALECT)}): an aggregate inside an "
                      f"aggregate's argument is not supported", (_Compiler._word(inner),))
    for col in arg.find_all(exp.Column):
        if col.table != alias and not _ancestor(q, alias, col.table):
            c.fail(col, f"{func}(...) reads {col.table}.{col.name}, which is not a column of "
                        f"the child rows {alias} or of their lookups; aggregate {alias}'s "
                        f"rows only", (func,))
    _order_children(c, q, alias, order, func)
    return Aggregate(alias, func, arg.sql(dialect=DIALECT), separator)


def _canonical_aggregates(c: _Compiler, q: _Query, node: exp.Expr) -> exp.Expr:
    """``node`` with each aggregate over the child rows as a job's expression reads it
    (checked and ordered as a whole-item aggregate is: :func:`_child_aggregate`; its ORDER
    BY is the child rows' ``order_by``; ``count(*)`` over an inner join is the count of the
    child's key)."""
    outer = [n for n in node.walk() if type(n) in _AGGREGATES
             and n.find_ancestor(*_AGGREGATES) is None]
    for agg_node in outer:
        agg = _child_aggregate(c, q, agg_node)
        arg = agg.expr if agg.expr is not None else \
            f"{agg.alias}.{q.aliases[agg.alias].key[0]}"
        sep = "" if agg.separator is None else \
            ", '" + agg.separator.replace("'", "''") + "'"
        call = sqlglot.parse_one(f"{agg.func}({arg}{sep})", read=DIALECT)
        if agg_node is node:
            node = call
        else:
            agg_node.replace(call)
    return node


def _child_of(q: _Query, ref: str) -> str | None:
    """The child rows' alias whose element ``ref`` (alias.column) is a column of, or None."""
    alias = ref.split(".", 1)[0]
    return next((a for a in q.child_aliases if a == alias or _ancestor(q, a, alias)), None)


def _child_scope(q: _Query, top: Mapping[str, str]) -> ElementAggregates:
    """The aggregates an expression over the child rows may read, as the job reads them."""
    elements = {alias: {f"{a}.{col}": typ for a, t in q.aliases.items()
                        if a == alias or _ancestor(q, alias, a) for col, typ in t.columns.items()}
                for alias in q.child_aliases}
    return ElementAggregates(top, elements)


def _ancestor(q: _Query, ancestor: str, alias: str) -> bool:
    parents = q.parent_of
    while alias in parents:
        alias = parents[alias]
        if alias == ancestor:
            return True
    return False


# -- the job file ---------------------------------------------------------------------


def _q(text: str) -> str:
    from txjoin.catalog import _q as quote

    return quote(text)


def _dict(items: Mapping[str, str], indent: str, prefix: int, width: int = 96) -> str:
    from txjoin.catalog import _dict as render_dict

    return render_dict(dict(items), indent, prefix, width)


def render(job: Job, query: str, path: str, comments: Mapping[str, str] | None = None) -> str:
    """The job file's Python source (it rebuilds ``job`` when loaded); ``comments``: a
    line above a lookup, by alias."""
    quoted = query.strip().replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    body = "\n".join(("    " + line).rstrip() for line in quoted.splitlines())
    imports = ["Job", "Lookup", "Output", "Table"]
    if any(isinstance(p, Collect) for p in job.output.columns.values()):
        imports.append("Collect")
    if any(lk.pick is not None for lk in job.lookups):
        imports.append("Pick")
    if any(isinstance(lk, Children) for lk in job.lookups):
        imports.append("Children")
    if any(isinstance(p, Aggregate) for p in job.output.columns.values()):
        imports.append("Aggregate")
    if job.sources:
        imports.append("Source")
    ind = " " * 8
    lines = [f'"""Written by `txjoin job from-sql {Path(path).name}` from::', "", body, '"""',
             "", f"from txjoin.job import {', '.join(sorted(imports))}", "", "job = Job(",
             f"    name={_q(job.name)},"]
    if job.sources:
        lines.append("    sources=[")
        for src in job.sources:
            prefix = "" if src.prefix is None else f", prefix={_q(src.prefix)}"
            lines.append(f"{ind}Source({_q(src.name)}{prefix}),")
        lines.append("    ],")
    lines.append("    tables=[")
    for t in job.tables:
        extra = ""
        if t.key != ("id",):
            extra += f", key=({', '.join(_q(k) for k in t.key)}{',' if len(t.key) == 1 else ''})"
        if t.defaults:
            extra += f", defaults={t.defaults!r}"
        if t.source is not None:
            extra += f", source={_q(t.source)}"
        head = f"Table({_q(t.name)}, "
        lines.append(f"{ind}{head}{_dict(t.columns, ind, len(head) + len(extra) + 2)}"
                     f"{extra}),")
    lines += ["    ],", f"    fact={_q(job.fact)},", f"    fact_alias={_q(job.fact_alias)},",
              "    lookups=["]
    for lk in job.lookups:
        if comments and lk.alias in comments:
            lines.append(f"{ind}# {comments[lk.alias]}")
        parts = [_q(lk.alias), _q(lk.table), f"parent={_q(lk.parent)}",
                 f"on={_dict(lk.on, ind, 0, width=1000)}"]
        kind = "Children" if isinstance(lk, Children) else "Lookup"
        if lk.how != ("left" if isinstance(lk, Children) else "inner"):
            parts.append(f"how={_q(lk.how)}")
        if isinstance(lk, Children) and lk.order_by:
            parts.append(f"order_by={_q(lk.order_by[0])}" if len(lk.order_by) == 1 else
                         f"order_by=[{', '.join(_q(c) for c in lk.order_by)}]")
        if lk.array:
            parts.append("array=True")
        if lk.distinct:
            parts.append("distinct=True")
        if lk.pick is not None:
            parts.append(f"pick=Pick({_q(lk.pick.column)}, {_q(lk.pick.order)})")
        if lk.where is not None:
            parts.append(f"where={_q(lk.where)}")
        one = f"{ind}{kind}({', '.join(parts)}),"
        if len(one) <= 100:
            lines.append(one)
        else:
            pad = " " * (len(kind) + 1)
            lines += [f"{ind}{kind}({', '.join(parts[:3])},",
                      *(f"{ind}{pad}{part}," for part in parts[3:-1]),
                      f"{ind}{pad}{parts[-1]}),"]
    lines += ["    ],", "    output=Output(", f"        table={_q(job.output.table)},",
              f"        key={_dict(job.output.key, ind, 4)},", "        columns={"]
    for col, proj in job.output.columns.items():
        if isinstance(proj, Collect):
            value = f"Collect({_q(proj.alias)}, {_dict(proj.fields, ind + '    ', 30)})"
        elif isinstance(proj, Aggregate):
            args = [_q(proj.alias), _q(proj.func), *([] if proj.expr is None else
                                                     [_q(proj.expr)])]
            if proj.separator is not None:
                args.append(f"separator={_q(proj.separator)}")
            value = f"Aggregate({', '.join(args)})"
        else:
            value = _q(proj)
        lines.append(f"{ind}    {_q(col)}: {value},")
    lines += ["        },", "    ),"]
    if job.where is not None:
        lines.append(f"    where={_q(job.where)},")
    if job.having is not None:
        lines.append(f"    having={_q(job.having)},")
    lines.append(f"    semantics={_q(job.semantics)},")
    for mode in ("decimal_handling_mode", "time_precision_mode", "binary_handling_mode"):
        value = getattr(job, mode)
        if value is not None:
            lines.append(f"    {mode}={_q(value)},")
    lines += [")", ""]
    return "\n".join(lines)


# -- where the tables come from -------------------------------------------------------


def _match(written: str, declared: Sequence[Table], origin: str) -> Table:
    found = [t for t in declared if written in (t.name, t.name.split(".", 1)[1])]
    if len(found) != 1:
        names = [t.name for t in declared]
        what = "declares no table" if not found else "declares several tables"
        hint = did_you_mean(written, [*names, *(n.split(".", 1)[1] for n in names)])
        raise JobError(f"{origin} {what} named {written!r} (it declares {', '.join(names)})"
                       f"{hint}; name it schema.table in the query")
    return found[0]


def from_sql(query_file: str | Path, name: str, *, dsn: str | None = None,
             job_file: str | Path | None = None, semantics: str | None = None,
             output_table: str | None = None) -> SqlJob:
    """Compile ``query_file`` into the job ``name`` writing ``output_table``
    (:func:`compile_sql`): column types from the catalog at ``dsn`` (as ``txjoin job init``
    reads them) or from the tables ``job_file`` declares."""
    path = Path(query_file)
    if not path.is_file():
        raise JobError(f"query file {path} does not exist")
    text = path.read_text()
    if (dsn is None) == (job_file is None):
        raise JobError("give the tables' declarations with --dsn DSN (the catalog) or "
                       "--job FILE (an existing job's tables), one of them")
    if job_file is not None:
        declared = load_job(job_file)

        def from_job(names: list[str]) -> dict[str, Table]:
            return {n: _match(n, declared.tables, f"--job {job_file}") for n in names}

        modes = {m: getattr(declared, m) for m in ("decimal_handling_mode",
                                                   "time_precision_mode",
                                                   "binary_handling_mode")}
        return compile_sql(text, str(path), name, from_job, declared.sources, modes,
                           semantics, output_table)

    def from_catalog(names: list[str]) -> dict[str, Table]:
        from txjoin.catalog import read_catalog

        assert dsn is not None
        catalog = read_catalog(dsn, names)
        unique.update({t.name: t.unique for t in catalog})
        return {n: Table(t.name, t.columns, key=t.key) for n, t in zip(names, catalog,
                                                                       strict=True)}

    unique: dict[str, Sequence[frozenset[str]]] = {}
    return compile_sql(text, str(path), name, from_catalog, semantics=semantics,
                       output_table=output_table, unique=unique)

