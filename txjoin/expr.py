"""SQL expressions in jobs: filters (``where=``) and computed output columns.

An expression is PostgreSQL text over the job's aliases (``o.quantity * p.price``),
parsed with sqlglot (PostgreSQL dialect) and compiled once, at job load, into

- its type, derived from the declared column types (the output column's type in both
  sinks: ``numeric(p,s)`` where PostgreSQL's result scale is fixed, else as PostgreSQL
  types the result);
- a Python evaluator over one binding (alias -> row dict or None), with PostgreSQL's
  meaning: NULL propagates, three-valued AND/OR/NOT, exact numeric arithmetic with
  PostgreSQL's result scales (division: ``select_div_scale``), integer division
  truncating toward zero, ``||`` on text, CASE/COALESCE/NULLIF/CAST, the text, number
  and time functions of ``FUNCTIONS``;
- the same expression as PostgreSQL SQL with the aliases renamed as the caller says
  (``txjoin verify`` asks PostgreSQL the same question).

Two deliberate departures, rendered the same way in the SQL so PostgreSQL agrees:
division (and ``%``) by zero is NULL (``x / NULLIF(y, 0)``; PostgreSQL raises an error, which would
stop a streaming job for good), and text is compared by code point (``COLLATE "C"``, as
Python compares), not by the database's collation.

A value PostgreSQL refuses while evaluating, txjoin refuses in its words: an integer result
outside its type (``integer out of range``), a ``numeric(p,s)`` cast that overflows
(``numeric field overflow``), text ``CAST`` cannot read. The evaluator raises
:class:`~txjoin.errors.ExpressionValueError` naming the column, the sub-expression and the
row's values (a literal is refused at load time).

An output column or a job's ``having`` may read aggregates of a listed alias's elements
(``CASE WHEN max(l.qty) > 4 THEN 'heavy' ELSE 'light' END``): each aggregate call is handed
to the caller's :class:`AggregateScope`, which computes it beside the job's
:class:`~txjoin.job.Aggregate` columns; the expression reads its value from the binding
(``AGGREGATED``) and its SQL is the caller's rendering of that aggregate.

Anything outside this is an :class:`ExprError` at load time naming what is supported.
Child rows, aggregates and ``job from-sql`` (issue 37) build on :func:`compile_expr`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal, localcontext
from typing import TYPE_CHECKING, Any, Protocol

from txjoin.errors import ExpressionValueError
from txjoin.ingest.types import DECIMAL_TYPE, column_kind

if TYPE_CHECKING:
    from sqlglot import exp

Binding = Mapping[str, Any]
"""alias -> its row (a dict) or None (a left lookup that matched nothing)."""
Evaluator = Callable[[Binding], Any]
ColumnSql = Callable[[str, str], str]
"""(alias, column) -> how the caller's SQL names that column."""

FUNCTIONS = ("coalesce", "nullif", "upper", "lower", "length", "trim", "substring", "round",
             "abs", "date_trunc", "extract", "cast")
SUPPORTED = ("column references alias.column; literals (numbers, 'text', true/false, NULL, "
             "interval 'N unit', date '...', timestamp '...'); + - * / % || and unary -; "
             "= <> < <= > >= BETWEEN IN (...) IS [NOT] NULL AND OR NOT; CASE; "
             "functions " + ", ".join(FUNCTIONS))

AGGREGATED = "#aggregated"
"""The binding's entry holding the values of the aggregates an expression reads (aggregate
key -> value), and the alias a :data:`ColumnSql` is asked for them by (column: the key);
no alias of a job can be named so."""
AGGREGATE_FUNCTIONS = ("count", "sum", "min", "max", "avg", "bool_and", "bool_or",
                       "string_agg")


class AggregateScope(Protocol):
    """Where an expression may read aggregates: the caller computes each one."""

    def aggregate(self, func: str, arg: str, separator: str | None) -> tuple[str, str]:
        """The key and result type of ``func(arg[, separator])`` (``arg``: PostgreSQL SQL
        over one element's columns); raises :class:`ExprError` (without a location) when
        it is not one the scope computes."""
        ...

    def element_of(self, ref: str) -> str | None:
        """The listed alias (child rows, array lookup) whose elements ``ref`` is a column
        of, or None."""
        ...


_CTX = Context(prec=1000, rounding=ROUND_HALF_UP)
_MAX_DECIMAL = 38  # Arrow decimal128: a wider result is declared plain numeric (text in Delta)
_INT_PRECISION = {"smallint": 5, "int": 10, "bigint": 19}
_DATE_TRUNC = ("microseconds", "milliseconds", "second", "minute", "hour", "day", "week",
               "month", "quarter", "year")
_EXTRACT_DATE = ("year", "quarter", "month", "week", "day", "dow", "isodow", "doy", "epoch")
_EXTRACT_TS = (*_EXTRACT_DATE, "hour", "minute", "second")
_INTERVAL_UNIT = {"microsecond": 1, "millisecond": 1000, "second": 1_000_000,
                  "minute": 60_000_000, "hour": 3_600_000_000, "day": 86_400_000_000,
                  "week": 7 * 86_400_000_000}


class ExprError(ValueError):
    """An expression txjoin cannot compile (the message says what and what is supported)."""


_INT_LIMIT = {"smallint": 2**15, "int": 2**31, "bigint": 2**63}
_PG_NAMES = {"int": "integer", "double": "double precision", "bool": "boolean"}
"""PostgreSQL's name of a type whose name in a job differs (in SQL and in its messages)."""
_AS_WRITTEN: ColumnSql = lambda alias, col: f"{alias}.{col}"  # noqa: E731


class _Refused(Exception):
    """A value PostgreSQL refuses while evaluating (its own words, e.g. ``integer out of
    range``) and the sub-expression that produced it; :func:`compile_expr`'s evaluator turns
    it into an :class:`~txjoin.errors.ExpressionValueError` naming the column and the row."""

    def __init__(self, message: str, sql: Callable[[ColumnSql], str]) -> None:
        super().__init__(message)
        self.message, self.sql = message, sql


def _int_range(t: str, f: Callable[..., Any], sql: Callable[[ColumnSql], str]
               ) -> Callable[..., Any]:
    """``f``, refusing a result outside the integer type ``t`` as PostgreSQL does
    (``integer out of range``); ``f`` itself for any other type (arithmetic, negation and
    abs() on a numeric(p,s) stay within the type txjoin derives for them)."""
    if t not in _INT_LIMIT:
        return f
    limit, message = _INT_LIMIT[t], f"{_pg_name(t)} out of range"

    def ranged(*args: Any) -> Any:
        v = f(*args)
        if v is None or -limit <= v < limit:  # None: a division by zero
            return v
        raise _Refused(message, sql)
    return ranged


def _in_range(t: str, f: Callable[..., Any], sql: Callable[[ColumnSql], str]
              ) -> Callable[..., Any]:
    """A CAST to ``t``: ``f``, refusing a result outside ``t`` as PostgreSQL does: an
    integer type's range, the integer digits of ``numeric(p,s)`` (``numeric field
    overflow``); ``f`` itself for any other type."""
    if t in _INT_LIMIT:
        return _int_range(t, f, sql)
    shape = _numeric_shape(t) if t.startswith("numeric(") else None
    if shape is None:
        return f
    bound = Decimal(10) ** (shape[0] - shape[1])

    def fits(*args: Any) -> Any:
        v = f(*args)
        if v is None or abs(v) < bound:
            return v
        raise _Refused("numeric field overflow", sql)
    return fits


_BOOL_TEXT = {"true": True, "t": True, "false": False, "f": False, "yes": True, "no": False,
              "1": True, "0": False}


def _finite(d: Decimal) -> Decimal:
    """``d``, or ValueError for NaN and the infinities (no ``numeric(p,s)`` holds them)."""
    if not d.is_finite():
        raise ValueError("not finite")
    return d


def _pg_name(t: str) -> str:
    """PostgreSQL's name of a type as a job writes it (``int`` -> ``integer``)."""
    return _PG_NAMES.get(t, t)


def _shown(text: str) -> str:
    """A value as an error line shows it: on one line, the first 60 characters."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= 60 else text[:57] + "..."


def _parsed(target: str, parse: Callable[[Any], Any], sql: Callable[[ColumnSql], str]
            ) -> Callable[[Any], Any]:
    """``parse`` over a text (or double) value, refusing what it cannot read as PostgreSQL
    does (``invalid input syntax for type integer: "x"``; a double that is NaN or infinite
    has no integer: ``integer out of range``)."""
    name = _pg_name(target).split("(")[0]  # numeric(8,2): "type numeric"

    def read(v: Any) -> Any:
        try:
            return parse(v)
        except (ValueError, KeyError, ArithmeticError):  # Decimal's InvalidOperation too
            if isinstance(v, str):
                raise _Refused(f'invalid input syntax for type {name}: "{_shown(v)}"',
                               sql) from None
            raise _Refused(f"{name} out of range", sql) from None
    return read


@dataclass(frozen=True)
class Compiled:
    """A compiled expression: its type, evaluator, SQL and the columns it reads."""

    text: str
    type: str
    evaluate: Evaluator
    render: Callable[[ColumnSql], str]
    refs: frozenset[str]

    @property
    def plain_ref(self) -> str | None:
        """``alias.column`` when the expression is just that column, else None."""
        return self.text.strip() if is_plain_ref(self.text) else None


_PLAIN_REF = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")


def is_plain_ref(text: str) -> bool:
    """Whether ``text`` is just ``alias.column`` (an output column that needs no expression)."""
    return bool(_PLAIN_REF.match(text.strip()))


@dataclass(frozen=True)
class _Node:
    type: str  # a declared column type ("bigint", "numeric(12,2)", "text"...) or "unknown"
    fn: Evaluator
    sql: Callable[[ColumnSql], str]
    const: Any = None  # the value of a literal (for round's places, date_trunc's unit)
    is_const: bool = False


# -- types ------------------------------------------------------------------------------


def _kind(t: str) -> str:
    """A coarse kind: int, numeric, double, text, bool, timestamp, timestamptz, date, time,
    interval, unknown (NULL), or the column kind (uuid, json, bytea, array...)."""
    if t == "unknown":
        return t
    if t.endswith("[]"):
        return "array"
    kind, _ = column_kind(t)
    if kind in ("int", "bigint", "smallint"):
        return "int"
    if kind in ("decimal", "numeric", "money"):
        return "numeric"
    if kind in ("double", "real"):
        return "double"
    return kind


def _numeric_shape(t: str) -> tuple[int, int] | None:
    """(precision, scale) of an int or numeric(p,s) type; None for plain numeric."""
    if t in _INT_PRECISION:
        return _INT_PRECISION[t], 0
    if t == "money":
        return 19, 2
    m = DECIMAL_TYPE.match(t)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _numeric(p: int, s: int) -> str:
    return f"numeric({p},{s})" if p <= _MAX_DECIMAL and s <= p else "numeric"


_NUMBERS = ("int", "numeric", "double")


def _common(types: list[str], what: str) -> str:
    """PostgreSQL's common type of CASE/COALESCE branches (numbers widen)."""
    known = [t for t in types if t != "unknown"]
    if not known:
        return "text"  # PostgreSQL resolves an all-NULL CASE to text
    kinds = {_kind(t) for t in known}
    if kinds <= set(_NUMBERS):
        if "double" in kinds:
            return "double"
        if kinds == {"int"}:
            return "bigint" if any(t != "smallint" and t != "int" for t in known) or len(
                set(known)) > 1 else known[0]
        shapes = [_numeric_shape(t) for t in known]
        if any(s is None for s in shapes):
            return "numeric"
        scale = max(s for _, s in shapes)  # type: ignore[misc]
        whole = max(p - s for p, s in shapes)  # type: ignore[misc]
        return _numeric(whole + scale, scale)
    if kinds == {"timestamp", "timestamptz"}:
        return "timestamptz"
    if len(kinds) > 1:
        raise ExprError(f"{what} mixes types {sorted(set(known))}")
    return known[0] if len(set(known)) == 1 else {"text": "text"}.get(kinds.pop(), known[0])


def _coerce(value: Any, target: str) -> Any:
    """A branch's value as the common type's Python value."""
    if value is None:
        return None
    kind = _kind(target)
    if kind == "numeric" and not isinstance(value, Decimal):
        return Decimal(value)
    if kind == "double" and not isinstance(value, float):
        return float(value)
    return value


# -- evaluation helpers ------------------------------------------------------------------


def _text_of(value: Any) -> str:
    """PostgreSQL's text output of a value (the types ``||`` and ``CAST AS text`` take)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value.isoformat()
    return str(value)


def _div_scale(a: Decimal, b: Decimal) -> int:
    """PostgreSQL's ``select_div_scale``: at least 16 significant digits, at least the
    operands' display scales."""
    def weight_digit(v: Decimal) -> tuple[int, int]:
        if v == 0:
            return 0, 0
        w = v.copy_abs().adjusted() // 4
        return w, int(v.copy_abs().scaleb(-4 * w, _CTX))
    w1, d1 = weight_digit(a)
    w2, d2 = weight_digit(b)
    q = w1 - w2 - (1 if d1 <= d2 else 0)
    scale = max(16 - q * 4, _scale(a), _scale(b), 0)
    return min(scale, 1000)


def _scale(v: Decimal) -> int:
    return max(0, -v.as_tuple().exponent)  # type: ignore[operator]


def _quantize(v: Decimal, scale: int) -> Decimal:
    with localcontext(_CTX):
        return v.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP)


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _trunc_mod(a: int, b: int) -> int:
    return a - b * _trunc_div(a, b)


def _dec(v: Any) -> Decimal:
    return v if isinstance(v, Decimal) else Decimal(v)


def _arith(op: str, lk: str, rk: str) -> Callable[[Any, Any], Any]:
    if "double" in (lk, rk):
        ops: dict[str, Callable[[Any, Any], Any]] = {
            "+": lambda a, b: float(a) + float(b), "-": lambda a, b: float(a) - float(b),
            "*": lambda a, b: float(a) * float(b),
            "/": lambda a, b: None if b == 0 else float(a) / float(b),
            "%": lambda a, b: None}
        return ops[op]
    if lk == rk == "int":
        return {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
                "/": lambda a, b: None if b == 0 else _trunc_div(a, b),
                "%": lambda a, b: None if b == 0 else _trunc_mod(a, b)}[op]

    def numeric(a: Any, b: Any) -> Any:
        a, b = _dec(a), _dec(b)
        with localcontext(_CTX):
            if op == "+":
                return a + b
            if op == "-":
                return a - b
            if op == "*":
                return a * b
            if b == 0:
                return None
            if op == "%":
                return _quantize(a % b, max(_scale(a), _scale(b)))
            return (a / b).quantize(Decimal(1).scaleb(-_div_scale(a, b)),
                                    rounding=ROUND_HALF_UP)
    return numeric


def numeric_divide(a: Any, b: Any) -> Decimal | None:
    """``a / b`` as PostgreSQL divides numerics (``select_div_scale``: at least 16
    significant digits); None when ``b`` is 0 (where PostgreSQL raises)."""
    result: Decimal | None = _arith("/", "numeric", "numeric")(a, b)
    return result


def _cmp(op: str) -> Callable[[Any, Any], bool]:
    return {"=": lambda a, b: a == b, "<>": lambda a, b: a != b, "<": lambda a, b: a < b,
            "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
            ">=": lambda a, b: a >= b}[op]


def _as_ts(v: Any) -> dt.datetime:
    if isinstance(v, dt.datetime):
        return v
    return dt.datetime(v.year, v.month, v.day, tzinfo=dt.UTC)


def _date_trunc(unit: str, v: dt.datetime) -> dt.datetime:
    if unit == "microseconds":
        return v
    if unit == "milliseconds":
        return v.replace(microsecond=v.microsecond // 1000 * 1000)
    order = ("second", "minute", "hour", "day", "month", "year")
    if unit == "week":
        day = v.replace(hour=0, minute=0, second=0, microsecond=0)
        return day - dt.timedelta(days=day.weekday())
    if unit == "quarter":
        return v.replace(month=(v.month - 1) // 3 * 3 + 1, day=1, hour=0, minute=0, second=0,
                         microsecond=0)
    fields: dict[str, int] = {"microsecond": 0}
    for name, zero in zip(("second", "minute", "hour", "day", "month"), (0, 0, 0, 1, 1),
                          strict=True):
        if order.index(unit) > order.index(name):
            fields[name] = zero
    return v.replace(**fields)  # type: ignore[arg-type]


def _extract(field: str, v: Any) -> Decimal:
    if isinstance(v, dt.datetime):
        if field == "second":
            return Decimal(v.second * 1_000_000 + v.microsecond).scaleb(-6)
        if field == "epoch":
            delta = v - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
            return Decimal(delta // dt.timedelta(microseconds=1)).scaleb(-6)
        if field in ("hour", "minute"):
            return Decimal(getattr(v, field))
    if field == "epoch":
        return Decimal((v - dt.date(1970, 1, 1)).days * 86400)
    iso = v.isocalendar()
    value = {"year": v.year, "quarter": (v.month - 1) // 3 + 1, "month": v.month,
             "week": iso[1], "day": v.day, "dow": (v.weekday() + 1) % 7, "isodow": iso[2],
             "doy": v.timetuple().tm_yday}[field]
    return Decimal(value)


def _interval(text: str, where: str) -> dt.timedelta:
    parts = text.lower().split()
    if not parts or len(parts) % 2:
        raise ExprError(f"{where}: interval {text!r}: write 'N unit [N unit ...]' with units "
                        f"{', '.join(_INTERVAL_UNIT)} (months and years are not supported)")
    us = 0
    for number, unit in zip(parts[::2], parts[1::2], strict=True):
        unit = unit.rstrip("s")
        if unit not in _INTERVAL_UNIT or not re.match(r"^-?\d+$", number):
            raise ExprError(f"{where}: interval {text!r}: write 'N unit [N unit ...]' with "
                            f"units {', '.join(_INTERVAL_UNIT)} (months and years are not "
                            f"supported)")
        us += int(number) * _INTERVAL_UNIT[unit]
    return dt.timedelta(microseconds=us)


def _strict(f: Callable[..., Any], *args: _Node) -> Evaluator:
    """f over the arguments' values, NULL when any is NULL."""
    fns = [a.fn for a in args]
    if len(fns) == 1:
        (g,) = fns

        def one(b: Binding) -> Any:
            v = g(b)
            return None if v is None else f(v)
        return one
    if len(fns) == 2:
        g, h = fns

        def two(b: Binding) -> Any:
            x = g(b)
            if x is None:
                return None
            y = h(b)
            return None if y is None else f(x, y)
        return two

    def many(b: Binding) -> Any:
        values = [g(b) for g in fns]
        return None if any(v is None for v in values) else f(*values)
    return many


def _lit_sql(value: Any, t: str) -> Callable[[ColumnSql], str]:
    if value is None:
        return lambda c: "NULL"
    if isinstance(value, bool):
        return lambda c: "true" if value else "false"
    if isinstance(value, str):
        quoted = "'" + value.replace("'", "''") + "'"
        return lambda c: quoted
    if isinstance(value, dt.timedelta):
        us = value // dt.timedelta(microseconds=1)
        return lambda c: f"interval '{us} microseconds'"
    if isinstance(value, dt.datetime):
        cast = "timestamptz" if t == "timestamptz" else "timestamp"
        return lambda c: f"'{value.isoformat()}'::{cast}"
    if isinstance(value, dt.date):
        return lambda c: f"DATE '{value.isoformat()}'"
    text = format(value, "f") if isinstance(value, Decimal) else str(value)
    if text.startswith("-"):
        text = f"({text})"  # never "--": that starts a comment
    return lambda c: text


# -- the compiler -------------------------------------------------------------------------

_AGGREGATE_NODES: dict[type, str] = {}
"""sqlglot's node of each aggregate -> its name (filled with sqlglot's first import)."""


class _Compiler:
    def __init__(self, types: Mapping[str, str], where: str, scope: AggregateScope | None,
                 no_aggregate: str) -> None:
        self.types = types
        self.where = where
        self.refs: set[str] = set()
        self.scope = scope
        self.no_aggregate = no_aggregate
        self.calls: dict[str, str] = {}  # aggregate key -> the call as written

    def fail(self, what: str) -> ExprError:
        return ExprError(f"{self.where}: {what}; supported: {SUPPORTED}")

    def node(self, e: exp.Expression) -> _Node:
        if isinstance(e, exp.Paren):
            inner = self.node(e.this)
            return _Node(inner.type, inner.fn, lambda c: f"({inner.sql(c)})", inner.const,
                         inner.is_const)
        if isinstance(e, exp.Column):
            return self.column(e)
        if isinstance(e, exp.Null):
            return _Node("unknown", lambda b: None, lambda c: "NULL", None, True)
        if isinstance(e, exp.Boolean):
            v = bool(e.this)
            return _Node("bool", lambda b: v, _lit_sql(v, "bool"), v, True)
        if isinstance(e, exp.Literal):
            return self.literal(e)
        if isinstance(e, exp.Interval):
            text = e.this.name if isinstance(e.this, exp.Literal) else e.this.sql()
            unit = e.args.get("unit")
            td = _interval(f"{text} {unit.name}" if unit is not None else text, self.where)
            return _Node("interval", lambda b: td, _lit_sql(td, "interval"), td, True)
        if isinstance(e, exp.Neg):
            a = self.node(e.this)
            if _kind(a.type) not in (*_NUMBERS, "interval"):
                raise self.fail(f"cannot negate {a.type}")
            if a.is_const and a.const is not None:
                v = -a.const
                return _Node(a.type, lambda b: v, lambda c: f"(- {a.sql(c)})", v, True)
            neg_sql: Callable[[ColumnSql], str] = lambda c: f"(- {a.sql(c)})"  # noqa: E731
            return _Node(a.type, _strict(_int_range(a.type, lambda v: -v, neg_sql), a), neg_sql)
        if isinstance(e, exp.Add | exp.Sub | exp.Mul | exp.Div | exp.Mod):
            return self.arith(e)
        if isinstance(e, exp.DPipe):
            return self.concat(e)
        if isinstance(e, exp.EQ | exp.NEQ | exp.LT | exp.LTE | exp.GT | exp.GTE):
            op = {exp.EQ: "=", exp.NEQ: "<>", exp.LT: "<", exp.LTE: "<=", exp.GT: ">",
                  exp.GTE: ">="}[type(e)]
            return self.compare(op, self.node(e.this), self.node(e.expression))
        if isinstance(e, exp.And | exp.Or):
            return self.logic(e)
        if isinstance(e, exp.Not):
            a = self.boolean(e.this, "NOT")
            return _Node("bool", lambda b: None if (v := a.fn(b)) is None else not v,
                         lambda c: f"(NOT {a.sql(c)})")
        if isinstance(e, exp.Is):
            return self.is_(e)
        if isinstance(e, exp.Between):
            a, lo, hi = self.node(e.this), self.node(e.args["low"]), self.node(e.args["high"])
            ge, le = self.compare(">=", a, lo), self.compare("<=", a, hi)
            both = self.and_or("AND", ge, le)
            return _Node("bool", both.fn, lambda c: f"({a.sql(c)} BETWEEN {lo.sql(c)} AND "
                                                     f"{hi.sql(c)})")
        if isinstance(e, exp.In):
            return self.in_(e)
        if isinstance(e, exp.Case):
            return self.case(e)
        if isinstance(e, exp.Coalesce):
            return self.coalesce([self.node(e.this), *map(self.node, e.expressions)])
        if isinstance(e, exp.Nullif):
            a, b2 = self.node(e.this), self.node(e.expression)
            eq = self.compare("=", a, b2)
            return _Node(a.type, lambda b: None if eq.fn(b) else a.fn(b),
                         lambda c: f"NULLIF({a.sql(c)}, {b2.sql(c)})")
        if isinstance(e, exp.Cast):
            return self.cast(e)
        if isinstance(e, exp.Upper | exp.Lower):
            a = self.text_arg(e.this, type(e).__name__.lower())
            f = str.upper if isinstance(e, exp.Upper) else str.lower
            name = "upper" if isinstance(e, exp.Upper) else "lower"
            return _Node("text", _strict(f, a), lambda c: f"{name}({a.sql(c)})")
        if isinstance(e, exp.Length):
            a = self.text_arg(e.this, "length")
            return _Node("int", _strict(len, a), lambda c: f"length({a.sql(c)})")
        if isinstance(e, exp.Trim):
            return self.trim(e)
        if isinstance(e, exp.Substring):
            return self.substring(e)
        if isinstance(e, exp.Round):
            return self.round(e)
        if isinstance(e, exp.Abs):
            a = self.node(e.this)
            if _kind(a.type) not in _NUMBERS:
                raise self.fail(f"abs() takes a number, not {a.type}")
            abs_sql: Callable[[ColumnSql], str] = lambda c: f"abs({a.sql(c)})"  # noqa: E731
            return _Node(a.type, _strict(_int_range(a.type, abs, abs_sql), a), abs_sql)
        if isinstance(e, exp.TimestampTrunc | exp.DateTrunc):
            return self.date_trunc(e)
        if isinstance(e, exp.Extract):
            return self.extract(e)
        if type(e) in _AGGREGATE_NODES:
            return self.aggregate(e)
        if isinstance(e, exp.Filter) and type(e.this) in _AGGREGATE_NODES:
            raise self.fail(f"{_AGGREGATE_NODES[type(e.this)]}(...) FILTER (WHERE ...) is not "
                            f"supported; filter the elements in their lookup's where=")
        if isinstance(e, exp.Anonymous | exp.Func):
            name = e.name if isinstance(e, exp.Anonymous) else e.sql_name().lower()
            raise self.fail(f"unknown function {name}()")
        raise self.fail(f"unsupported construct {e.sql(dialect='postgres')!r}")

    def aggregate(self, e: exp.Expression) -> _Node:
        """An aggregate call: its value is the scope's, computed over the elements."""
        func = _AGGREGATE_NODES[type(e)]
        if self.scope is None:
            raise ExprError(f"{self.where}: {func}() is an aggregate: {self.no_aggregate}")
        arg = e.this
        if isinstance(arg, exp.Star):
            raise ExprError(f"{self.where}: {func}(*) inside an expression: count a column "
                            f"of the elements that is never NULL, e.g. their key "
                            f"(count(l.id))")
        if isinstance(arg, exp.Distinct):
            raise ExprError(f"{self.where}: {func}(DISTINCT ...) is not supported")
        if isinstance(arg, exp.Order):
            raise ExprError(f"{self.where}: {func}(... ORDER BY ...) inside an expression: "
                            f"the elements are aggregated in their own order (child rows: "
                            f"Children(order_by=...); an array: its order); drop the ORDER BY")
        if e.args.get("expressions"):
            raise ExprError(f"{self.where}: {func}() takes one argument here "
                            f"({e.sql(dialect='postgres')})")
        separator = None
        if func == "string_agg":
            sep = e.args.get("separator")
            if not (isinstance(sep, exp.Literal) and sep.is_string):
                raise ExprError(f"{self.where}: string_agg(x, separator): the separator must "
                                f"be a text literal")
            separator = sep.this
        try:
            key, t = self.scope.aggregate(func, arg.sql(dialect="postgres"), separator)
        except ExprError as exc:
            raise ExprError(f"{self.where}: {e.sql(dialect='postgres')}: {exc}") from None
        numeric = _kind(t) == "numeric"
        written = e.sql(dialect="postgres")
        self.calls[key] = written

        def get(b: Binding) -> Any:
            v = b[AGGREGATED][key]
            # An unbounded numeric aggregate is held as its text (txjoin/join/aggregate.py).
            return Decimal(v) if numeric and isinstance(v, str) else v

        def sql(c: ColumnSql) -> str:
            return written if c is _AS_WRITTEN else c(AGGREGATED, key)  # an error: the call
        return _Node(t, get, sql)

    def column(self, e: exp.Column) -> _Node:
        alias, col = e.table, e.name
        if not alias:
            raise self.fail(f"column {col!r} must be written alias.column")
        ref = f"{alias}.{col}"
        listed = self.scope.element_of(ref) if self.scope is not None else None
        if ref not in self.types and listed is not None:
            raise ExprError(f"{self.where}: {ref} is a column of the elements of {listed} "
                            f"(one value per element), read outside an aggregate; aggregate "
                            f"it: max({ref}), sum({ref}), count({ref}), ...")
        if ref not in self.types:
            aliases = sorted({r.split('.', 1)[0] for r in self.types})
            raise self.fail(f"unknown column {ref} (aliases here: {', '.join(aliases)})")
        self.refs.add(ref)

        def get(b: Binding) -> Any:
            row = b.get(alias)
            return None if row is None else row.get(col)
        return _Node(self.types[ref], get, lambda c: c(alias, col))

    def literal(self, e: exp.Literal) -> _Node:
        if e.is_string:
            v: Any = e.this
            return _Node("text", lambda b: v, _lit_sql(v, "text"), v, True)
        text = str(e.this)
        if re.match(r"^\d+$", text):
            n = int(text)
            t = "int" if n < 2**31 else "bigint" if n < 2**63 else _numeric(len(text), 0)
            v = n if t != "numeric" and not t.startswith("numeric") else Decimal(n)
            return _Node(t, lambda b: v, _lit_sql(v, t), v, True)
        d = Decimal(text)
        if not d.is_finite():
            raise self.fail(f"number {text!r}")
        t = _numeric(max(len(d.as_tuple().digits), _scale(d)), _scale(d))
        return _Node(t, lambda b: d, _lit_sql(d, t), d, True)

    def text_arg(self, e: exp.Expression, fn: str) -> _Node:
        a = self.node(e)
        if _kind(a.type) not in ("text", "unknown"):
            raise self.fail(f"{fn}() takes text, not {a.type} (CAST it AS text)")
        return a

    def boolean(self, e: exp.Expression, what: str) -> _Node:
        a = self.node(e)
        if _kind(a.type) not in ("bool", "unknown"):
            raise self.fail(f"{what} takes a boolean, not {a.type}")
        return a

    def arith(self, e: exp.Expression) -> _Node:
        ops: dict[type, str] = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/",
                                exp.Mod: "%"}
        op = ops[type(e)]
        a, b2 = self.node(e.this), self.node(e.expression)
        ka, kb = _kind(a.type), _kind(b2.type)
        sql_l, sql_r = a.sql, b2.sql
        if op in "/%":
            def sql(c: ColumnSql) -> str:
                return f"({sql_l(c)} {op} NULLIF({sql_r(c)}, 0))"
        else:
            def sql(c: ColumnSql) -> str:
                return f"({sql_l(c)} {op} {sql_r(c)})"
        if "unknown" in (ka, kb):
            return _Node(a.type if kb == "unknown" else b2.type, lambda b: None, sql)
        temporal = {"timestamp", "timestamptz", "date", "interval"}
        if ka in temporal or kb in temporal:
            return self.time_arith(op, a, b2, ka, kb, sql)
        if ka not in _NUMBERS or kb not in _NUMBERS:
            raise self.fail(f"{a.type} {op} {b2.type} is not defined")
        if ka == "double" or kb == "double":
            if op == "%":
                raise self.fail("% is not defined on double")
            t = "double"
        elif ka == kb == "int":
            t = "bigint" if "bigint" in (a.type, b2.type) else a.type if a.type == b2.type \
                else "int" if "int" in (a.type, b2.type) else "smallint"
        else:
            sa, sb = _numeric_shape(a.type), _numeric_shape(b2.type)
            if sa is None or sb is None or op == "/":
                t = "numeric"
            elif op in ("+", "-"):
                scale = max(sa[1], sb[1])
                t = _numeric(max(sa[0] - sa[1], sb[0] - sb[1]) + 1 + scale, scale)
            elif op == "*":
                t = _numeric(sa[0] + sb[0], sa[1] + sb[1])
            else:
                scale = max(sa[1], sb[1])
                t = _numeric(max(sa[0] - sa[1], sb[0] - sb[1]) + scale, scale)
        return _Node(t, _strict(_int_range(t, _arith(op, ka, kb), sql), a, b2), sql)

    def time_arith(self, op: str, a: _Node, b2: _Node, ka: str, kb: str,
                   sql: Callable[[ColumnSql], str]) -> _Node:
        pair = (ka, op, kb)
        ts = ("timestamp", "timestamptz")
        if ka in ts and op in "+-" and kb == "interval":
            f = (lambda x, y: x + y) if op == "+" else (lambda x, y: x - y)
            return _Node(a.type if ka == "timestamptz" else "timestamp", _strict(f, a, b2), sql)
        if ka == "interval" and op == "+" and kb in ts:
            return _Node(b2.type, _strict(lambda x, y: x + y, a, b2), sql)
        if ka == "date" and op in "+-" and kb == "interval":
            f = ((lambda x, y: _as_ts(x) + y) if op == "+" else (lambda x, y: _as_ts(x) - y))
            return _Node("timestamp", _strict(f, a, b2), sql)
        if ka in ts and op == "-" and kb in ts:
            return _Node("interval", _strict(lambda x, y: x - y, a, b2), sql)
        if ka == kb == "interval" and op in "+-":
            f = (lambda x, y: x + y) if op == "+" else (lambda x, y: x - y)
            return _Node("interval", _strict(f, a, b2), sql)
        if ka == kb == "date" and op == "-":
            return _Node("int", _strict(lambda x, y: (x - y).days, a, b2), sql)
        if ka == "date" and op in "+-" and kb == "int":
            f = ((lambda x, y: x + dt.timedelta(days=y)) if op == "+"
                 else (lambda x, y: x - dt.timedelta(days=y)))
            return _Node("date", _strict(f, a, b2), sql)
        raise self.fail(f"{a.type} {op} {b2.type} is not defined ({pair[0]} {op} {pair[2]})")

    def concat(self, e: exp.DPipe) -> _Node:
        a, b2 = self.node(e.this), self.node(e.expression)
        for side in (a, b2):
            if _kind(side.type) not in ("text", "int", "numeric", "bool", "date", "unknown"):
                raise self.fail(f"|| takes text, numbers, booleans or dates, not {side.type} "
                                f"(CAST it AS text)")
        if "text" not in (_kind(a.type), _kind(b2.type)) and "unknown" not in (a.type, b2.type):
            raise self.fail(f"{a.type} || {b2.type}: one side must be text")
        return _Node("text", _strict(lambda x, y: _text_of(x) + _text_of(y), a, b2),
                     lambda c: f"({a.sql(c)} || {b2.sql(c)})")

    def compare(self, op: str, a: _Node, b2: _Node) -> _Node:
        ka, kb = _kind(a.type), _kind(b2.type)
        dates = {"timestamp", "timestamptz", "date"}
        ok = (ka == kb or {ka, kb} <= set(_NUMBERS) or {ka, kb} <= dates or "unknown" in (ka, kb))
        if not ok or ka in ("array", "json") or kb in ("array", "json"):
            raise self.fail(f"cannot compare {a.type} {op} {b2.type}")
        f = _cmp(op)
        if {ka, kb} <= dates and ka != kb:
            g = f
            f = (lambda x, y: g(_as_ts(x), _as_ts(y)))  # noqa: E731
        elif "double" in (ka, kb) and ka != kb:
            g2 = f
            f = (lambda x, y: g2(float(x), float(y)))  # noqa: E731
        collate = ' COLLATE "C"' if ka == "text" and op not in ("=", "<>") else ""
        return _Node("bool", _strict(f, a, b2),
                     lambda c: f"({a.sql(c)}{collate} {op} {b2.sql(c)}{collate})")

    def logic(self, e: exp.Expression) -> _Node:
        word = "AND" if isinstance(e, exp.And) else "OR"
        return self.and_or(word, self.boolean(e.this, word), self.boolean(e.expression, word))

    @staticmethod
    def and_or(word: str, a: _Node, b2: _Node) -> _Node:
        """Three-valued AND/OR: the operator's dominant value (False for AND, True for OR)
        on either side decides; otherwise NULL on either side gives NULL."""
        f, g = a.fn, b2.fn
        dominant = word == "OR"

        def fn(b: Binding) -> Any:
            x = f(b)
            if x is dominant:
                return dominant
            y = g(b)
            if y is dominant:
                return dominant
            return None if x is None or y is None else not dominant
        return _Node("bool", fn, lambda c: f"({a.sql(c)} {word} {b2.sql(c)})")

    def is_(self, e: exp.Is) -> _Node:
        a = self.node(e.this)
        target = e.expression
        negate = bool(e.args.get("negate"))
        if isinstance(target, exp.Null):
            f = a.fn
            return _Node("bool", (lambda b: f(b) is not None) if negate else
                         (lambda b: f(b) is None),
                         lambda c: f"({a.sql(c)} IS {'NOT ' if negate else ''}NULL)")
        if isinstance(target, exp.Boolean):
            want = bool(target.this)
            f = a.fn
            return _Node("bool", (lambda b: f(b) is not want) if negate else
                         (lambda b: f(b) is want),
                         lambda c: f"({a.sql(c)} IS {'NOT ' if negate else ''}"
                                   f"{'TRUE' if want else 'FALSE'})")
        raise self.fail("IS takes NULL, TRUE or FALSE")

    def in_(self, e: exp.In) -> _Node:
        if e.args.get("query") is not None or not e.expressions:
            raise self.fail("IN takes a list of values (no subqueries)")
        a = self.node(e.this)
        items = [self.compare("=", a, self.node(x)) for x in e.expressions]
        fns = [i.fn for i in items]

        def fn(b: Binding) -> Any:
            unknown = False
            for g in fns:
                v = g(b)
                if v is True:
                    return True
                unknown = unknown or v is None
            return None if unknown else False
        values = [self.node(x) for x in e.expressions]
        return _Node("bool", fn, lambda c: f"({a.sql(c)} IN "
                                           f"({', '.join(v.sql(c) for v in values)}))")

    def case(self, e: exp.Case) -> _Node:
        subject = self.node(e.this) if e.this is not None else None
        conds, results = [], []
        for branch in e.args.get("ifs") or []:
            cond = (self.compare("=", subject, self.node(branch.this)) if subject is not None
                    else self.boolean(branch.this, "CASE WHEN"))
            conds.append(cond)
            results.append(self.node(branch.args["true"]))
        default = self.node(e.args["default"]) if e.args.get("default") is not None else None
        t = _common([r.type for r in results] + ([default.type] if default else []), "CASE")
        pairs = [(c.fn, r.fn) for c, r in zip(conds, results, strict=True)]
        dfn = default.fn if default is not None else (lambda b: None)

        def fn(b: Binding) -> Any:
            for cf, rf in pairs:
                if cf(b) is True:
                    return _coerce(rf(b), t)
            return _coerce(dfn(b), t)

        def sql(c: ColumnSql) -> str:
            whens = " ".join(f"WHEN {cd.sql(c)} THEN {r.sql(c)}"
                             for cd, r in zip(conds, results, strict=True))
            tail = f" ELSE {default.sql(c)}" if default is not None else ""
            return f"(CASE {whens}{tail} END)"
        return _Node(t, fn, sql)

    def coalesce(self, args: list[_Node]) -> _Node:
        t = _common([a.type for a in args], "COALESCE")
        fns = [a.fn for a in args]

        def fn(b: Binding) -> Any:
            for g in fns:
                v = g(b)
                if v is not None:
                    return _coerce(v, t)
            return None
        return _Node(t, fn, lambda c: f"COALESCE({', '.join(a.sql(c) for a in args)})")

    def cast(self, e: exp.Cast) -> _Node:
        a = self.node(e.this)
        to = e.args["to"]
        target = self.target_type(to)
        ka, kt = _kind(a.type), _kind(target)
        render = _pg_name(target)

        def sql(c: ColumnSql) -> str:
            return f"CAST({a.sql(c)} AS {render})"
        f: Callable[[Any], Any] | None = None
        if ka == "unknown":
            f = None
        elif kt == "int" and ka in _NUMBERS:
            f = (lambda v: int(_quantize(_dec(v), 0))) if ka == "numeric" else \
                _parsed(target, round, sql) if ka == "double" else (lambda v: v)
        elif kt == "int" and ka == "text":
            f = _parsed(target, lambda v: int(v.strip()), sql)
        elif kt == "numeric" and ka in (*_NUMBERS, "text"):
            shape = _numeric_shape(target)
            conv: Callable[[Any], Decimal] = (
                _parsed(target, lambda v: _finite(Decimal(v.strip())), sql) if ka == "text"
                else _parsed(target, lambda v: _finite(Decimal(repr(v))), sql)
                if ka == "double" else _dec)
            f = conv if shape is None else (lambda v: _quantize(conv(v), shape[1]))
        elif kt == "double" and ka in (*_NUMBERS, "text"):
            f = _parsed(target, float, sql) if ka == "text" else float
        elif kt == "text" and ka in ("text", "int", "numeric", "bool", "date"):
            f = _text_of
        elif kt == "bool" and ka == "text":
            f = _parsed(target, lambda v: _BOOL_TEXT[v.strip().lower()], sql)
        elif kt == "bool" and ka in ("bool",):
            f = lambda v: v  # noqa: E731
        elif kt == "date" and ka in ("timestamp", "timestamptz", "date"):
            f = lambda v: v.date() if isinstance(v, dt.datetime) else v  # noqa: E731
        elif kt == "date" and ka == "text" and a.is_const:
            f = lambda v: dt.date.fromisoformat(v.strip())  # noqa: E731
        elif kt in ("timestamp", "timestamptz") and ka in ("timestamp", "timestamptz", "date"):
            f = _as_ts
        elif kt in ("timestamp", "timestamptz") and ka == "text" and a.is_const:
            def f(v: Any) -> Any:
                parsed = dt.datetime.fromisoformat(v.strip())
                return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
        else:
            raise self.fail(f"CAST from {a.type} to {target} is not supported")
        if f is None:
            return _Node(target, lambda b: None, sql)
        node = _Node(target, _strict(_in_range(target, f, sql), a), sql)
        if a.is_const:  # a typed literal: fold it (date '2024-01-01')
            try:
                v = node.fn({})
            except _Refused as exc:
                raise ExprError(f"{self.where}: {exc.message} in "
                                f"{exc.sql(_AS_WRITTEN)}") from None
            return _Node(target, lambda b: v, _lit_sql(v, target) if v is not None else sql,
                         v, True)
        return node

    def target_type(self, to: exp.DataType) -> str:
        t = to.this
        D = exp.DataType.Type
        simple = {D.INT: "int", D.BIGINT: "bigint", D.SMALLINT: "smallint", D.TEXT: "text",
                  D.VARCHAR: "text", D.BOOLEAN: "bool", D.DOUBLE: "double", D.FLOAT: "double",
                  D.DATE: "date", D.TIMESTAMP: "timestamp", D.TIMESTAMPTZ: "timestamptz"}
        if t in simple:
            return simple[t]
        if t == D.DECIMAL:
            params = [int(p.this.name) for p in to.expressions]
            if len(params) == 2:
                return f"numeric({params[0]},{params[1]})"
            if len(params) == 1:
                return f"numeric({params[0]},0)"
            return "numeric"
        raise self.fail(f"CAST to {to.sql(dialect='postgres')} is not supported (int, bigint, "
                        f"smallint, numeric[(p,s)], double precision, text, boolean, date, "
                        f"timestamp, timestamptz)")

    def trim(self, e: exp.Trim) -> _Node:
        a = self.text_arg(e.this, "trim")
        chars_node = self.text_arg(e.expression, "trim") if e.expression is not None else None
        if chars_node is not None and not chars_node.is_const:
            raise self.fail("trim()'s characters must be a literal")
        chars = chars_node.const if chars_node is not None else " "
        position = (e.args.get("position") or "BOTH").upper()
        f = {"BOTH": lambda v: v.strip(chars), "LEADING": lambda v: v.lstrip(chars),
             "TRAILING": lambda v: v.rstrip(chars)}[position]
        quoted = "'" + chars.replace("'", "''") + "'"
        return _Node("text", _strict(f, a),
                     lambda c: f"trim({position} {quoted} FROM {a.sql(c)})")

    def substring(self, e: exp.Substring) -> _Node:
        a = self.text_arg(e.this, "substring")
        start = self.node(e.args["start"])
        length = self.node(e.args["length"]) if e.args.get("length") is not None else None
        for n in (start, *([length] if length else [])):
            if _kind(n.type) != "int":
                raise self.fail(f"substring() positions are integers, not {n.type}")

        def sub(s: str, begin: int, count: int | None = None) -> str | None:
            lo = max(begin, 1)
            if count is None:
                return s[lo - 1:]
            if count < 0:
                return None  # PostgreSQL raises an error
            hi = begin + count
            return s[lo - 1:max(hi - 1, lo - 1)]
        args = [a, start, *([length] if length else [])]
        return _Node("text", _strict(sub, *args),
                     lambda c: f"substring({a.sql(c)} FROM {start.sql(c)}"
                               + (f" FOR {length.sql(c)})" if length else ")"))

    def round(self, e: exp.Round) -> _Node:
        a = self.node(e.this)
        ka = _kind(a.type)
        places_e = e.args.get("decimals")
        if ka not in _NUMBERS:
            raise self.fail(f"round() takes a number, not {a.type}")
        if places_e is None:
            if ka == "double":
                return _Node("double", _strict(lambda v: float(round(v)), a),
                             lambda c: f"round({a.sql(c)})")
            shape = _numeric_shape(a.type)
            t = _numeric(shape[0] - shape[1] + 1, 0) if shape else "numeric"
            return _Node(t, _strict(lambda v: _quantize(_dec(v), 0), a),
                         lambda c: f"round({a.sql(c)})")
        places = self.node(places_e)
        if ka == "double":
            raise self.fail("round(double precision, n) does not exist in PostgreSQL; CAST "
                            "the value AS numeric first")
        if not places.is_const or not isinstance(places.const, int):
            raise self.fail("round()'s places must be an integer literal")
        n = places.const
        shape = _numeric_shape(a.type)
        scale = max(n, 0)
        t = _numeric(max(shape[0] - shape[1], 1) + 1 + scale, scale) if shape else "numeric"

        def rnd(v: Any) -> Decimal:
            d = _dec(v)
            if n >= 0:
                return _quantize(d, n)
            with localcontext(_CTX):
                step = Decimal(1).scaleb(-n)
                return _quantize((d / step).quantize(Decimal(1), rounding=ROUND_HALF_UP)
                                 * step, 0)
        return _Node(t, _strict(rnd, a), lambda c: f"round({a.sql(c)}, {n})")

    def date_trunc(self, e: exp.Expression) -> _Node:
        unit_node = e.args.get("unit")
        unit = (unit_node.name if unit_node is not None else "").lower()
        a = self.node(e.this)
        if _kind(a.type) not in ("timestamp", "timestamptz"):
            raise self.fail(f"date_trunc() takes a timestamp, not {a.type}")
        if unit not in _DATE_TRUNC:
            raise self.fail(f"date_trunc unit {unit!r} is not one of {', '.join(_DATE_TRUNC)}")
        return _Node(a.type, _strict(lambda v: _date_trunc(unit, v), a),
                     lambda c: f"date_trunc('{unit}', {a.sql(c)})")

    def extract(self, e: exp.Extract) -> _Node:
        field = e.this.name.lower()
        a = self.node(e.expression)
        ka = _kind(a.type)
        allowed = _EXTRACT_TS if ka in ("timestamp", "timestamptz") else \
            _EXTRACT_DATE if ka == "date" else None
        if allowed is None:
            raise self.fail(f"extract() takes a timestamp or a date, not {a.type}")
        if field not in allowed:
            raise self.fail(f"extract field {field!r} on {a.type} is not one of "
                            f"{', '.join(allowed)}")
        t = ("numeric(8,6)" if field == "second" else
             "numeric(18,6)" if field == "epoch" and ka != "date" else "numeric(12,0)")
        return _Node(t, _strict(lambda v: _extract(field, v), a),
                     lambda c: f"extract({field} FROM {a.sql(c)})")


NO_AGGREGATE = ("an aggregate is read by an output column or a job's having=, over child "
                "rows or an array lookup's elements")


def compile_expr(text: str, types: Mapping[str, str], where: str,
                 scope: AggregateScope | None = None, no_aggregate: str = NO_AGGREGATE
                 ) -> Compiled:
    """Compile ``text`` over the columns ``types`` (``alias.column`` -> declared type).

    ``where`` prefixes every error (the job file and the column). ``scope``: the aggregates
    the expression may read (none without it: an aggregate call is refused, saying
    ``no_aggregate``).
    """
    if not isinstance(text, str) or not text.strip():
        raise ExprError(f"{where}: an expression must be non-empty SQL text, got {text!r}")
    # sqlglot on first use (binding this module's ``exp`` for _Compiler): it was 0.2 s of the
    # start of every process that unpickles a job (Spark's Python workers, the shards'
    # hosts, each query's pre-init process), most of which never compile an expression.
    global exp, _AGGREGATE_NODES
    import sqlglot
    from sqlglot import exp

    if not _AGGREGATE_NODES:
        _AGGREGATE_NODES = dict(zip((exp.Count, exp.Sum, exp.Min, exp.Max, exp.Avg,
                                     exp.LogicalAnd, exp.LogicalOr, exp.GroupConcat),
                                    AGGREGATE_FUNCTIONS, strict=True))

    try:
        tree = sqlglot.parse_one(text, read="postgres")
    except sqlglot.errors.ParseError as exc:
        first = str(exc).splitlines()[0]
        raise ExprError(f"{where}: cannot parse {text!r}: {first}") from None
    compiler = _Compiler(types, where, scope, no_aggregate)
    node = compiler.node(tree)  # type: ignore[arg-type]
    t = "text" if node.type == "unknown" else node.type
    inner = node.fn
    refs = sorted(compiler.refs)
    coerce = _kind(t) in ("numeric", "double")

    calls = compiler.calls

    def fn(b: Binding) -> Any:
        try:
            v = inner(b)
        except _Refused as exc:
            raise _refusal(where, exc, refs, b, calls) from None
        return _coerce(v, t) if coerce else v
    return Compiled(text, t, fn, node.sql, frozenset(compiler.refs))


def _refusal(where: str, exc: _Refused, refs: list[str], b: Binding,
             calls: Mapping[str, str]) -> ExpressionValueError:
    """The one-line error of a value PostgreSQL would refuse: what, in which sub-expression,
    on which values (columns, then the aggregates read), and what to do."""
    def value(ref: str) -> str:
        alias, col = ref.split(".", 1)
        row = b.get(alias)
        if row is None:
            return f"{ref} NULL (no {alias} row)"
        v = row.get(col)
        return f"{ref} {'NULL' if v is None else _shown(_text_of(v))}"
    def aggregated(key: str) -> str:
        v = b.get(AGGREGATED, {}).get(key)
        return f"{calls[key]} {'NULL' if v is None else _shown(_text_of(v))}"
    values = ", ".join([*map(value, refs), *map(aggregated, calls)]) or "no columns"
    fix = ("the source row or the expression" if exc.message.startswith("invalid input")
           else "the expression (a wider type: CAST(... AS bigint) or numeric)")
    return ExpressionValueError(
        f"{where}: {exc.message} in {exc.sql(_AS_WRITTEN)} with {values}, as PostgreSQL would "
        f"refuse it; nothing of this batch was written: change {fix} and run the job again "
        f"(with --rebuild if the column's type changes)")
