"""verify's comparison in key order, column by column in Arrow (issue 71).

The same merge as :class:`~txjoin.verify.verify.SinkMerge` (every expected row paired
with the sink's row of its key, the sink's rows no key asked for extra), on batches
(:class:`~txjoin.sinks.columns.Columns`): keys paired by Arrow's ``index_in``, and each
column of the pairs compared at once where Arrow's equality implies
:func:`~txjoin.verify.diff.values_equal`'s (int, str, bool and float values on both
sides, read as verify reads them). A pair Arrow does not find equal, and every column of
another type, is compared as before in Python (:func:`~txjoin.verify.diff.rows_match`
on the rows read by :func:`~txjoin.verify.verify.comparable_reader`), so the diff and
its wording are exactly the row-by-row merge's. Keys must be one int or text column,
non-NULL, strictly ascending on each side, and text that cannot read as a timestamp;
otherwise :class:`NotColumnar` is raised and verify compares row by row instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txjoin.sinks.columns import Columns
from txjoin.verify.diff import RowDiff, rows_match, surely_equal, values_equal

Row = dict[str, Any]

KEY_KINDS = frozenset({"int", "bigint", "smallint", "text"})
"""Declared kinds of an output key the column-wise merge takes."""

# A superset of what diff's _ISO_TS matches (any characters where it wants digits): such a
# text key may read as a timestamp (canonical), so its order and equality are not its text's.
_MAY_BE_INSTANT = r"^.{4}-.{2}-.{2}[T ].{2}:.{2}"


class NotColumnar(Exception):
    """The column-wise merge cannot promise the row-by-row merge's answer for these keys."""


class _Side:
    """One side's batches in key order, a batch at a time, checked as they come."""

    def __init__(self, batches: Iterator[Columns], key: str, kinds: list[pa.DataType]) -> None:
        self.batches, self.key, self.kinds = batches, key, kinds
        self.current: Columns | None = None
        self.keys: pa.Array | None = None
        self.last: Any = None
        self.count = 0
        self.done = False

    def fill(self) -> None:
        while not self.done and (self.current is None or self.current.num_rows == 0):
            batch = next(self.batches, None)
            if batch is None:
                self.done = True
                break
            if batch.num_rows == 0:
                continue
            keys = batch.arrow(self.key)
            if keys is None or keys.null_count:
                raise NotColumnar
            if not self.kinds:
                self.kinds.append(keys.type)
            if keys.type != self.kinds[0]:
                raise NotColumnar
            if pa.types.is_string(keys.type) and pc.any(
                    pc.match_substring_regex(keys, _MAY_BE_INSTANT)).as_py():
                raise NotColumnar
            if len(keys) > 1 and not pc.all(pc.less(keys[:-1], keys[1:])).as_py():
                raise NotColumnar
            first = keys[0].as_py()
            if self.last is not None and not self.last < first:
                raise NotColumnar
            self.last = keys[-1].as_py()
            self.count += len(keys)
            self.current, self.keys = batch, keys

    @property
    def has_rows(self) -> bool:
        return self.current is not None and self.current.num_rows > 0

    def take(self, bound: Any) -> tuple[Columns | None, pa.Array | None]:
        """This side's rows with keys up to ``bound`` (None: all it holds)."""
        if self.current is None or self.keys is None or not self.has_rows:
            return None, None
        n = (len(self.keys) if bound is None
             else int(pc.sum(pc.less_equal(self.keys, pa.scalar(bound, self.keys.type)))
                      .as_py() or 0))
        batch, keys = self.current.slice(0, n), self.keys.slice(0, n)
        self.current = self.current.slice(n, self.current.num_rows)
        self.keys = self.keys.slice(n)
        return batch, keys


def _plain(job_types: dict[str, Any], name: str, retyped: frozenset[str]) -> bool:
    """Whether verify reads the column's values as they are (comparable is the identity)."""
    from txjoin.ingest.types import column_kind

    typ = job_types.get(name)
    if typ is None:
        return True
    if not isinstance(typ, str) or typ.endswith("[]"):
        return False
    try:
        return column_kind(typ)[0] not in retyped
    except ValueError:
        return False


class ChunkComparer:
    """Compares chunks of expected and sink rows with the same key range into a diff."""

    def __init__(self, read_row: Callable[[Row], Row], read_value: Callable[[str, Any], Any],
                 plain: Callable[[str], bool]) -> None:
        self.read_row, self.read_value, self.plain = read_row, read_value, plain

    def compare(self, expected: Columns | None, ekeys: pa.Array | None, actual: Columns | None,
                akeys: pa.Array | None, diff: RowDiff) -> None:
        if actual is None or akeys is None or not len(akeys):
            if expected is not None and expected.num_rows:
                diff.missing += [self.read_row(r) for r in
                                 expected.rows(range(expected.num_rows))]
            return
        if expected is None or ekeys is None or not len(ekeys):
            diff.extra += [self.read_row(r) for r in actual.rows(range(actual.num_rows))]
            return
        found = pc.index_in(ekeys, value_set=akeys)
        valid = pc.is_valid(found).to_numpy(zero_copy_only=False)
        missing = np.flatnonzero(~valid)
        e_pos = np.flatnonzero(valid)
        a_pos = found.filter(pc.is_valid(found)).to_numpy(zero_copy_only=False).astype(np.int64)
        asked = pc.is_in(akeys, value_set=ekeys).to_numpy(zero_copy_only=False)
        extra = np.flatnonzero(~asked)
        diff.missing += [self.read_row(r) for r in expected.rows(missing.tolist())]
        certified = np.ones(len(e_pos), dtype=bool)
        actual_names = set(actual.names)
        for name in expected.names:
            if not certified.any():
                break
            if name not in actual_names:
                certified[:] = False
                break
            ea = expected.arrow(name) if self.plain(name) else None
            aa = actual.arrow(name) if ea is not None else None
            if ea is not None and aa is not None and ea.type == aa.type:
                et, at = ea.take(pa.array(e_pos)), aa.take(pa.array(a_pos))
                same = pc.or_(pc.fill_null(pc.equal(et, at), False),
                              pc.and_(pc.is_null(et), pc.is_null(at)))
                certified &= same.to_numpy(zero_copy_only=False)
                continue
            evalues, avalues = expected.column(name), actual.column(name)
            for n in np.flatnonzero(certified).tolist():
                e = self.read_value(name, evalues[e_pos[n]])
                a = self.read_value(name, avalues[a_pos[n]])
                if not (surely_equal(e, a) or values_equal(e, a)):
                    certified[n] = False
        doubtful = np.flatnonzero(~certified)
        if len(doubtful):
            exp_rows = expected.rows(e_pos[doubtful].tolist())
            act_rows = actual.rows(a_pos[doubtful].tolist())
            for exp, act in zip(exp_rows, act_rows, strict=True):
                exp, act = self.read_row(exp), self.read_row(act)
                if not rows_match(exp, act):
                    diff.different.append((exp, act))
        diff.extra += [self.read_row(r) for r in actual.rows(extra.tolist())]


def merge_columns(key: str, expected: Iterator[Columns], sinks: Sequence[Iterator[Columns]],
                  comparer: ChunkComparer, progress: Callable[[int, list[int]], None] | None = None,
                  every: float = 5.0) -> tuple[int, list[tuple[RowDiff, int]]]:
    """The expected rows merged with each sink's by ``key``, a chunk of keys at a time:
    (expected rows, [(diff, sink rows) per sink]). Raises :class:`NotColumnar`."""
    kinds: list[pa.DataType] = []
    answer = _Side(expected, key, kinds)
    sides = [_Side(s, key, kinds) for s in sinks]
    diffs = [RowDiff() for _ in sides]
    everyone = [answer, *sides]
    last = time.monotonic()
    while True:
        for side in everyone:
            side.fill()
        if not any(side.has_rows for side in everyone):
            break
        open_ = [side.last for side in everyone if not side.done]
        bound = min(open_) if open_ else None
        ebatch, ekeys = answer.take(bound)
        for side, diff in zip(sides, diffs, strict=True):
            abatch, akeys = side.take(bound)
            comparer.compare(ebatch, ekeys, abatch, akeys, diff)
        if progress is not None and time.monotonic() - last >= every:
            last = time.monotonic()
            progress(answer.count, [s.count for s in sides])
    return answer.count, [(d, s.count) for d, s in zip(diffs, sides, strict=True)]
