"""A batch of rows column by column, as verify compares them (issue 71).

Each side of verify's comparison (PostgreSQL's answer, each sink's current rows) hands its
rows in key order a batch at a time; these hold one batch and give it as Python values
(exactly the values of the rows :meth:`~txjoin.sinks.Sink.read_current_batches` gives) or,
for a column whose values are all of one plain type (int, str, bool, float), as an Arrow
array equal value for value to those Python values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import pyarrow as pa

_PLAIN = {int: pa.int64(), str: pa.string(), bool: pa.bool_(), float: pa.float64()}
_NONE = type(None)


class Columns(Protocol):
    """One batch of rows, column by column."""

    names: list[str]

    @property
    def num_rows(self) -> int: ...

    def column(self, name: str) -> Sequence[Any]:
        """The column's Python values."""
        ...

    def arrow(self, name: str) -> pa.Array | None:
        """The column as int64, string, bool or float64 Arrow values equal to
        :meth:`column`'s; None when its values are not all of one such type."""
        ...

    def rows(self, at: Sequence[int]) -> list[dict[str, Any]]:
        """The rows at these positions, as dicts of every column."""
        ...

    def slice(self, start: int, stop: int) -> Columns: ...


class _Transposed:
    def __init__(self, names: list[str], tuples: Sequence[tuple[Any, ...]],
                 readers: Sequence[tuple[type | None, Callable[[Any], Any]] | None]) -> None:
        self.names, self.tuples, self.readers = names, tuples, readers
        self.at = {n: i for i, n in enumerate(names)}
        self._raw: list[tuple[Any, ...]] | None = None
        self._read: dict[str, Sequence[Any]] = {}
        self._arrow: dict[str, pa.Array | None] = {}

    def column(self, name: str) -> Sequence[Any]:
        found = self._read.get(name)
        if found is None:
            if self._raw is None:
                self._raw = list(zip(*self.tuples, strict=True)) or [() for _ in self.names]
            k = self.at[name]
            values: Sequence[Any] = self._raw[k]
            reader = self.readers[k]
            if reader is not None:
                exact, read = reader
                if exact is None or not set(map(type, values)) <= {exact, _NONE}:
                    values = [read(v) for v in values]
            self._read[name] = found = values
        return found

    def arrow(self, name: str) -> pa.Array | None:
        if name not in self._arrow:
            values = self.column(name)
            kinds = set(map(type, values)) - {_NONE}
            array = None
            if len(kinds) == 1 and (kind := kinds.pop()) in _PLAIN:
                try:
                    array = pa.array(values, _PLAIN[kind])
                except (pa.ArrowException, OverflowError, TypeError, ValueError):
                    array = None
            self._arrow[name] = array
        return self._arrow[name]

    def row(self, i: int) -> dict[str, Any]:
        raw = self.tuples[i]
        out = {}
        for k, name in enumerate(self.names):
            reader = self.readers[k]
            value = raw[k]
            out[name] = value if reader is None else reader[1](value)
        return out


class TupleColumns:
    """Rows as psycopg2 returns them (tuples), each column read by its reader (``(exact
    type, read)``: values of the exact type are kept as they are; None: kept)."""

    def __init__(self, names: list[str], tuples: Sequence[tuple[Any, ...]],
                 readers: Sequence[tuple[type | None, Callable[[Any], Any]] | None] | None = None,
                 *, _full: _Transposed | None = None, _start: int = 0,
                 _stop: int | None = None) -> None:
        self._full = _full or _Transposed(names, tuples, readers or [None] * len(names))
        self.names = self._full.names
        self._start = _start
        self._stop = len(self._full.tuples) if _stop is None else _stop

    @property
    def num_rows(self) -> int:
        return self._stop - self._start

    def column(self, name: str) -> Sequence[Any]:
        return self._full.column(name)[self._start:self._stop]

    def arrow(self, name: str) -> pa.Array | None:
        array = self._full.arrow(name)
        return None if array is None else array.slice(self._start, self.num_rows)

    def rows(self, at: Sequence[int]) -> list[dict[str, Any]]:
        return [self._full.row(self._start + int(i)) for i in at]

    def slice(self, start: int, stop: int) -> TupleColumns:
        return TupleColumns(self.names, (), _full=self._full, _start=self._start + start,
                            _stop=self._start + stop)


class ArrowColumns:
    """An Arrow record batch (the Delta table's rows); Python values are its ``to_pylist``."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        self.batch = batch
        self.names = list(batch.schema.names)

    @property
    def num_rows(self) -> int:
        return int(self.batch.num_rows)

    def column(self, name: str) -> Sequence[Any]:
        return self.batch.column(name).to_pylist()

    def arrow(self, name: str) -> pa.Array | None:
        array = self.batch.column(name)
        t = array.type
        target = (pa.int64() if pa.types.is_integer(t) else pa.string()
                  if pa.types.is_string(t) or pa.types.is_large_string(t)
                  else pa.bool_() if pa.types.is_boolean(t)
                  else pa.float64() if t in (pa.float32(), pa.float64()) else None)
        if target is None:
            return None
        try:
            return array if t == target else array.cast(target)
        except pa.ArrowException:
            return None

    def rows(self, at: Sequence[int]) -> list[dict[str, Any]]:
        if not len(at):
            return []
        return self.batch.take(pa.array(at, pa.int64())).to_pylist()

    def slice(self, start: int, stop: int) -> ArrowColumns:
        return ArrowColumns(self.batch.slice(start, stop - start))
