"""The row diff: expected rows against a sink's, compared by value.

Values compare by value: numbers numerically whatever their type (``Decimal("9.50")``
equals ``9.5``; a string is never a number), timestamps as instants (a ``datetime`` or an
ISO string; naive means UTC), lists in order, and only the columns (and struct fields) the
expected row lists. Rows compare in any order, paired by key when every expected row has
one. ``txjoin verify`` diffs a sink against PostgreSQL's answer with it; the scenario
harness (``txjoin/scenarios/checks.py``) diffs its runs with it.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

Row = dict[str, Any]

_ISO_TS = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")
SHOW_ROWS = 5


# -- values -------------------------------------------------------------------------------------


def _unwrap(value: Any) -> Any:
    """numpy scalars and arrays (pandas readers) -> Python values."""
    module = type(value).__module__
    if module == "numpy" and hasattr(value, "tolist"):
        return value.tolist()
    return value


def _number(value: Any) -> Decimal | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | Decimal):
        return Decimal(value)
    if isinstance(value, float):
        try:
            return Decimal(repr(value))
        except InvalidOperation:
            return None
    return None


def _instant(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, str) and _ISO_TS.match(value):
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    return None


def values_equal(expected: Any, actual: Any) -> bool:
    """Compare by value; a dict compares only the keys ``expected`` lists."""
    expected, actual = _unwrap(expected), _unwrap(actual)
    if expected is None or actual is None:
        return expected is None and actual is None
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    a, b = _number(expected), _number(actual)
    if a is not None or b is not None:
        return a is not None and b is not None and a == b
    if isinstance(expected, dt.datetime) or isinstance(actual, dt.datetime):
        ta, tb = _instant(expected), _instant(actual)
        return ta is not None and tb is not None and ta == tb
    if isinstance(expected, str) and isinstance(actual, str):
        if expected == actual:
            return True
        ta, tb = _instant(expected), _instant(actual)
        return ta is not None and tb is not None and ta == tb
    if isinstance(expected, list | tuple):
        return (isinstance(actual, list | tuple) and len(expected) == len(actual)
                and all(values_equal(e, x) for e, x in zip(expected, actual, strict=True)))
    if isinstance(expected, Mapping):
        return isinstance(actual, Mapping) and rows_match(expected, actual)
    return bool(expected == actual)


_SAME_TYPES = frozenset({str, int, bool, Decimal, type(None)})


def surely_equal(expected: Any, actual: Any) -> bool:
    """True only where :func:`values_equal` is: both values of the same type at every level
    (str, int, bool, Decimal, None; lists; dicts with the same keys) and equal. False says
    nothing: ask :func:`values_equal`. A tenth of its cost on the usual pair (issue 71: a
    million collected lists compared per sink)."""
    kind = type(expected)
    if kind is not type(actual):
        return False
    if kind is list:
        return len(expected) == len(actual) and all(map(surely_equal, expected, actual))
    if kind is dict:
        return (expected.keys() == actual.keys()
                and all(surely_equal(v, actual[k]) for k, v in expected.items()))
    return kind in _SAME_TYPES and bool(expected == actual)


def rows_match(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> bool:
    """The columns ``expected`` lists are present in ``actual`` with equal values."""
    return all(c in actual and values_equal(v, actual[c]) for c, v in expected.items())


def canonical(value: Any) -> Any:
    """A hashable form such that values equal by :func:`values_equal` (all fields) hash equal."""
    value = _unwrap(value)
    if value is None or isinstance(value, bool):
        return value
    n = _number(value)
    if n is not None:
        return n
    t = _instant(value)
    if t is not None:
        return t
    if isinstance(value, list | tuple):
        return tuple(canonical(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((k, canonical(v)) for k, v in value.items()))
    return value


def show(value: Any) -> str:
    """A compact, YAML-like rendering for messages."""
    value = _unwrap(value)
    if value is None:
        return "null"
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return str(value)


# -- row sets -------------------------------------------------------------------------------------


@dataclass
class RowDiff:
    """Expected vs actual rows: missing, extra, and pairs that differ."""

    missing: list[Row] = field(default_factory=list)
    extra: list[Row] = field(default_factory=list)
    different: list[tuple[Row, Row]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.different)

    @property
    def size(self) -> int:
        return len(self.missing) + len(self.extra) + len(self.different)

    def format(self, indent: str = "  ") -> str:
        """The diff, a few rows of each kind."""
        lines = []
        for title, rows in (("missing (expected, not in the output)", self.missing),
                            ("extra (in the output, not expected)", self.extra)):
            if rows:
                lines.append(f"{indent}{title}:")
                lines += [f"{indent}  {show(r)}" for r in rows[:SHOW_ROWS]]
                if len(rows) > SHOW_ROWS:
                    lines.append(f"{indent}  ... and {len(rows) - SHOW_ROWS} more")
        if self.different:
            lines.append(f"{indent}different:")
            for exp, act in self.different[:SHOW_ROWS]:
                lines.append(f"{indent}  expected {show(exp)}")
                lines.append(f"{indent}  actual   {show({c: act.get(c) for c in exp})}")
            if len(self.different) > SHOW_ROWS:
                lines.append(f"{indent}  ... and {len(self.different) - SHOW_ROWS} more")
        return "\n".join(lines)


def row_key(row: Mapping[str, Any], key_columns: Sequence[str]) -> tuple[Any, ...]:
    return tuple(canonical(row.get(c)) for c in key_columns)


def diff_rows(expected: Sequence[Mapping[str, Any]], actual: Sequence[Mapping[str, Any]],
              key_columns: Sequence[str] = ()) -> RowDiff:
    """Compare row sets in any order, on the columns each expected row lists.

    When every expected row lists the key columns, rows pair up by key (so a
    changed value shows as *different*); otherwise each expected row takes the
    first unused actual row it matches.
    """
    diff = RowDiff()
    exp = [dict(r) for r in expected]
    act = [dict(r) for r in actual]
    if key_columns and all(all(c in r for c in key_columns) for r in exp):
        by_key: dict[tuple[Any, ...], list[Row]] = {}
        for row in act:
            by_key.setdefault(row_key(row, key_columns), []).append(row)
        used: set[int] = set()
        for row in exp:
            candidates = [a for a in by_key.get(row_key(row, key_columns), []) if id(a) not in used]
            if not candidates:
                diff.missing.append(row)
                continue
            hit = next((a for a in candidates if rows_match(row, a)), None)
            if hit is None:
                diff.different.append((row, candidates[0]))
                used.add(id(candidates[0]))
            else:
                used.add(id(hit))
        diff.extra = [a for a in act if id(a) not in used]
        return diff
    free = list(act)
    for row in exp:
        at = next((i for i, a in enumerate(free) if rows_match(row, a)), None)
        if at is None:
            diff.missing.append(row)
        else:
            free.pop(at)
    diff.extra = free
    return diff
