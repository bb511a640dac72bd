"""A shard task's input rows as pandas frames, a batch at a time rather than a row at a time.

``transformWithStateInPandas`` hands a task's rows to the Python worker as Arrow
record batches, and PySpark 4.2's serializer (``TransformWithStateInPandasSerializer``
in ``pyspark/sql/pandas/serializers.py``) turns each batch into a pandas frame, then
walks it row by row (``itertuples``), groups the rows by key with ``itertools.groupby``
and builds a new frame from the row tuples: every value goes through a Python object
twice before the shard sees it. In ``txjoin bench`` that was half of the Python
workers' CPU (py-spy, 2026-11-29); on 30,000 routed rows 114 ms against 40 ms here.

:func:`install` replaces that serializer's ``load_stream`` with one that cuts each
converted frame at its key changes and yields slices of it. It yields what PySpark's
does: the same (mode, key, frames) items in the same order, each key a tuple of Python
scalars, each frame the same columns (named as ``itertuples`` names them), values,
dtypes for the routed rows' types (integers and floats widened as pandas infers them
from Python numbers; a nullable boolean or integer column keeps the batch's dtype,
where PySpark's depends on whether a frame holds a null), and a fresh index, of at
most PySpark's records-per-batch (and bytes-per-batch) limit. A key's frames may be
cut at Arrow batch boundaries where PySpark's joined rows across them; the shard
concatenates its frames either way. ``tests/unit/test_input_frames.py`` compares
both on the routed rows' schema.

It applies to the PySpark version it was written against only (``PYSPARK_VERSION``);
with any other, PySpark's own serializer runs. Run in Spark's Python workers, where
:mod:`txjoin.join.spark.shards` is imported to unpickle the shard processor, before
the worker reads its first batch.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Iterator
from typing import IO, Any

PYSPARK_VERSION = "4.2.0"
"""The PySpark whose ``TransformWithStateInPandasSerializer.load_stream`` this replaces."""

_UNLIMITED = 2**31 - 1  # PySpark's "no limit" for records and bytes per batch
_WIDE = {"i": "int64", "f": "float64"}  # numpy kind -> what pandas infers


def install() -> bool:
    """Replace PySpark's row-at-a-time ``load_stream`` (once); False where it does not
    apply (another PySpark)."""
    import pyspark
    from pyspark.sql.pandas.serializers import TransformWithStateInPandasSerializer

    if pyspark.__version__ != PYSPARK_VERSION:
        return False
    current = TransformWithStateInPandasSerializer.load_stream
    if current is not load_stream:
        PYSPARK_LOAD_STREAM.append(current)
        TransformWithStateInPandasSerializer.load_stream = load_stream  # type: ignore[method-assign]
    return True


PYSPARK_LOAD_STREAM: list[Any] = []
"""PySpark's own ``load_stream``, once :func:`install` replaced it (for the tests)."""


def load_stream(self: Any, stream: IO[bytes]) -> Iterator[tuple[Any, Any, Any]]:
    """``TransformWithStateInPandasSerializer.load_stream``, a frame slice per key run."""
    from pyspark.sql.pandas.serializers import ArrowStreamPandasSerializer
    from pyspark.sql.streaming.stateful_processor_util import (
        TransformWithStateInPandasFuncMode,
    )

    batches = super(ArrowStreamPandasSerializer, self).load_stream(stream)
    for key, chunks in itertools.groupby(key_frames(self, batches), key=lambda c: c[0]):
        yield (TransformWithStateInPandasFuncMode.PROCESS_DATA, key, chunks)
    yield (TransformWithStateInPandasFuncMode.PROCESS_TIMER, None, None)
    yield (TransformWithStateInPandasFuncMode.COMPLETE, None, None)


def key_frames(ser: Any, batches: Iterator[Any]) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(key, frame) for each run of equal keys in each Arrow batch, in order, in frames of
    at most the serializer's records (and bytes) per batch."""
    import pandas as pd
    from pyspark.sql.conversion import ArrowBatchTransformer

    for batch in batches:
        ser._update_batch_size_stats(batch)
        if batch.num_rows == 0:
            continue
        frame = pd.concat(ArrowBatchTransformer.to_pandas(
            batch, timezone=ser._timezone, schema=ser._input_type,
            struct_in_pandas=ser._struct_in_pandas, ndarray_as_list=ser._ndarray_as_list,
            prefer_int_ext_dtype=ser._prefer_int_ext_dtype,
            df_for_struct=ser._df_for_struct), axis=1)
        # PySpark rebuilt the frame from itertuples' namedtuples: their field names, and
        # the dtypes pandas infers from Python ints and floats
        frame.columns = _row_fields(list(frame.columns))
        widened = {name: _WIDE[dtype.kind] for name, dtype in frame.dtypes.items()
                   if dtype.kind in _WIDE and dtype != _WIDE[dtype.kind]}
        if widened:
            frame = frame.astype(widened)
        # the keys as itertuples gives them (Python scalars), compared as groupby compares
        keys = list(frame.iloc[:, list(ser.key_offsets)].itertuples(index=False, name=None))
        limit = _rows_per_frame(ser)
        start = 0
        for key, run in itertools.groupby(keys):
            stop = start + sum(1 for _ in run)
            for lo in range(start, stop, limit):
                yield key, frame.iloc[lo:min(lo + limit, stop)].reset_index(drop=True)
            start = stop


def _row_fields(columns: list[Any]) -> tuple[str, ...]:
    """The field names ``itertuples`` gives rows of these columns (invalid or repeated
    names become positional ones)."""
    make: Any = collections.namedtuple
    return tuple(make("Pandas", columns, rename=True)._fields)


def _rows_per_frame(ser: Any) -> int:
    """PySpark cut a key's rows into frames once they reached the records-per-batch limit,
    or that many rows times the average row size reached the bytes-per-batch limit."""
    limit = ser.arrow_max_records_per_batch
    if ser.arrow_max_bytes_per_batch != _UNLIMITED and ser.average_arrow_row_size > 0:
        limit = min(limit, math.ceil(ser.arrow_max_bytes_per_batch / ser.average_arrow_row_size))
    return max(1, min(limit, _UNLIMITED))
