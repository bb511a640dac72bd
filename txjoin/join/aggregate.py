"""The engine's aggregates over a listed alias's elements (child rows, array elements).

PostgreSQL's meaning (txjoin.job.Aggregate): NULLs are ignored; ``count(*)`` counts the
elements and ``count`` of none is 0; every other aggregate of no non-NULL value is NULL;
``sum`` of integers is exact (bigint, numeric for bigint), of numerics exact; ``avg`` of
integers and numerics is the exact sum divided at PostgreSQL's numeric division scale;
an unbounded ``numeric`` result is its text, as txjoin holds a ``numeric`` column
without a scale (ingest/types.py); ``sum``/``avg`` of doubles add in the elements'
order (verify's SQL aggregates in the same order); ``min``/``max`` of text compare by
code point (verify: ``COLLATE "C"``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Context, Decimal, localcontext
from typing import Any

from txjoin.expr import numeric_divide

_EXACT = Context(prec=2000)  # a numeric sum is exact in PostgreSQL


def aggregator(func: str, result_type: str, separator: str | None
               ) -> Callable[[Sequence[Any]], Any]:
    """The function of the argument values (one per element, NULLs included; for
    ``count(*)`` one True per element) that computes ``func`` of type ``result_type``."""
    if func == "count":
        return lambda values: sum(1 for v in values if v is not None)
    if func in ("sum", "avg"):
        numeric = result_type == "numeric"

        def total(values: Sequence[Any]) -> Any:
            present = [v for v in values if v is not None]
            if not present:
                return None
            if numeric or any(isinstance(v, Decimal) for v in present):
                with localcontext(_EXACT):
                    acc: Any = sum((Decimal(v) for v in present), Decimal(0))
            elif isinstance(present[0], float):
                acc = 0.0
                for v in present:  # in order, as float8pl accumulates
                    acc += v
            else:
                acc = sum(present)
            if isinstance(acc, float):
                return acc if func == "sum" else acc / len(present)
            result = acc if func == "sum" else numeric_divide(acc, Decimal(len(present)))
            # An unbounded numeric is its text, as txjoin holds such a column (ingest/types.py)
            return format(result, "f") if numeric and result is not None else result
        return total
    if func in ("min", "max"):
        pick = min if func == "min" else max
        if result_type == "numeric":  # held as its text: compared as numbers
            def extreme(values: Sequence[Any]) -> Any:
                found = pick((Decimal(v) for v in values if v is not None), default=None)
                return None if found is None else format(found, "f")
            return extreme
        return lambda values: pick((v for v in values if v is not None), default=None)
    if func in ("bool_and", "bool_or"):
        test = all if func == "bool_and" else any

        def logic(values: Sequence[Any]) -> Any:
            present = [v for v in values if v is not None]
            return test(present) if present else None
        return logic
    if func == "string_agg":
        sep = separator or ""

        def joined(values: Sequence[Any]) -> Any:
            present = [v for v in values if v is not None]
            return sep.join(present) if present else None
        return joined
    raise ValueError(f"unknown aggregate {func!r}")
