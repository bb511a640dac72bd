"""The shard tasks' input frames (txjoin.join.spark.input_frames) against PySpark's own.

PySpark 4.2's ``TransformWithStateInPandasSerializer.load_stream`` is run on the same
Arrow stream as its replacement: every key's rows, values, column names and dtypes
must be the same, for the routed rows' schema with nulls wherever routing leaves
them, keys in runs across Arrow batches, and records- and bytes-per-batch limits.
"""

from __future__ import annotations

import io

import pandas as pd
import pyarrow as pa
import pyspark
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.serializers import TransformWithStateInPandasSerializer

from txjoin.join.spark import input_frames

input_frames.install()  # as importing the shards does (other tests may have done it)
# PySpark's own (the class keeps it where install() does not apply: the pin test says why)
ORIGINAL = (input_frames.PYSPARK_LOAD_STREAM
            or [TransformWithStateInPandasSerializer.load_stream])[0]

# The routed rows (txjoin.join.spark.routing.ROUTED_COLUMNS) as Spark sends them: the
# grouping key, then the data columns.
SCHEMA = pa.schema([
    ("shard", pa.int32()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("value", pa.binary()), ("counted", pa.bool_()),
    ("routed", pa.bool_()), ("op", pa.string()), ("tbl", pa.string()), ("xid", pa.string()),
    ("lsn", pa.string()), ("ts_ms", pa.string()), ("snapshot", pa.string()),
    ("dco", pa.string()), ("digest", pa.binary()), ("after_elsewhere", pa.bool_()),
])
NULLABLE = {"value", "op", "tbl", "xid", "lsn", "ts_ms", "snapshot", "dco", "digest"}
"""The routed columns that can be null (routing's integers and flags never are). A nullable
boolean or integer column would keep the batch's dtype here where PySpark infers each
frame's from its values (object or bool, float or int): the values are the same."""


def _value(field: pa.Field, i: int, null: bool) -> object:
    if null and field.name in NULLABLE:
        return None
    if pa.types.is_boolean(field.type):
        return i % 2 == 0
    if pa.types.is_integer(field.type):
        return i
    if pa.types.is_binary(field.type):
        return f"{{\"id\": {i}}}".encode()
    return f"{field.name}-{i}"


def _stream(keys: list[list[int]], nulls: list[list[bool]]) -> bytes:
    """An Arrow stream of one record batch per list of keys (a row per key)."""
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        row = 0
        for batch_keys, batch_nulls in zip(keys, nulls, strict=True):
            columns = []
            for field in SCHEMA:
                values = [k if field.name == "shard" else _value(field, row + j, null)
                          for j, (k, null) in enumerate(zip(batch_keys, batch_nulls,
                                                            strict=True))]
                columns.append(pa.array(values, type=field.type))
            writer.write_batch(pa.record_batch(columns, schema=SCHEMA))
            row += len(batch_keys)
    return sink.getvalue()


def _serializer(max_records: int, max_bytes: int) -> TransformWithStateInPandasSerializer:
    ser = TransformWithStateInPandasSerializer(
        timezone="UTC", safecheck=False, assign_cols_by_name=True, prefer_int_ext_dtype=False,
        arrow_max_records_per_batch=max_records, arrow_max_bytes_per_batch=max_bytes,
        int_to_decimal_coercion_enabled=False)
    ser.key_offsets = [0]
    return ser


def _groups(load_stream, data: bytes, max_records: int, max_bytes: int
            ) -> list[tuple[object, object, list[pd.DataFrame]]]:
    """What the worker takes from ``load_stream``: (mode, key, the key's frames)."""
    out = []
    for mode, key, frames in load_stream(_serializer(max_records, max_bytes), io.BytesIO(data)):
        out.append((mode, key, None if frames is None else [f for _, f in frames]))
    return out


def _same(data: bytes, max_records: int = 0, max_bytes: int = 2**31 - 1) -> None:
    theirs = _groups(ORIGINAL, data, max_records, max_bytes)
    ours = _groups(input_frames.load_stream, data, max_records, max_bytes)
    assert [(m, k) for m, k, _ in ours] == [(m, k) for m, k, _ in theirs]
    for (_, key, our_frames), (_, _, their_frames) in zip(ours, theirs, strict=True):
        if their_frames is None:
            assert our_frames is None
            continue
        assert all(type(v) is int for v in key)  # Python scalars, as itertuples gives them
        limit = max_records if max_records > 0 else 2**31 - 1
        assert all(len(f) <= limit for f in our_frames)
        for f in our_frames:
            assert isinstance(f.index, pd.RangeIndex) and f.index.start == 0
        pd.testing.assert_frame_equal(pd.concat(our_frames, ignore_index=True),
                                      pd.concat(their_frames, ignore_index=True))
        # each frame's dtypes as PySpark's, not only those of the concatenation
        for f in our_frames:
            assert list(f.dtypes) == list(their_frames[0].dtypes)


def test_installed_for_the_pinned_pyspark_only() -> None:
    assert pyspark.__version__ == input_frames.PYSPARK_VERSION, (
        "PySpark moved: compare its TransformWithStateInPandasSerializer.load_stream with "
        "txjoin.join.spark.input_frames before pinning the new version there")
    assert input_frames.install()
    assert TransformWithStateInPandasSerializer.load_stream is input_frames.load_stream
    assert ORIGINAL.__module__ == "pyspark.sql.pandas.serializers"


def test_runs_across_batches_with_nulls() -> None:
    keys = [[0, 0, 0, 1], [1, 1], [], [1, 0, 0]]
    nulls = [[False, True, False, True], [True, False], [], [False, True, True]]
    _same(_stream(keys, nulls))
    _same(_stream(keys, nulls), max_records=2)


def test_every_row_null_where_it_can_be() -> None:
    keys = [[0, 0, 1]]
    _same(_stream(keys, [[True, True, True]]))


@settings(deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 2), st.booleans()), max_size=12),
                min_size=1, max_size=4),
       st.sampled_from([0, 1, 3, 10_000]), st.sampled_from([2**31 - 1, 200, 5_000]))
def test_same_frames_as_pyspark(batches: list[list[tuple[int, bool]]], max_records: int,
                                max_bytes: int) -> None:
    keys = [[k for k, _ in b] for b in batches]
    nulls = [[n for _, n in b] for b in batches]
    _same(_stream(keys, nulls), max_records, max_bytes)


def test_other_pyspark_keeps_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TransformWithStateInPandasSerializer, "load_stream", ORIGINAL)
    monkeypatch.setattr(pyspark, "__version__", "4.3.0")
    assert not input_frames.install()
    assert TransformWithStateInPandasSerializer.load_stream is ORIGINAL
