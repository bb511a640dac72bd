"""The output table's shape, and output changes as JSON (for transport) and Arrow (for sinks).

Column types follow the source columns they project (``_ARROW``): ints -> int64,
text -> string, numeric(p,s) -> decimal128(p,s), timestamp -> timestamp[us, UTC],
date -> date32, time -> time64[us], interval -> duration[us], bytea -> binary,
arrays -> lists, a ``Collect`` -> list<struct<...>>. Metadata columns are
``_op``, ``_commit_seq``, ``_xid``, ``_commit_ts``, and for a job that declares
sources (``Job.sources``) also ``_source``: the source of the transaction that
produced the change (null for the initial snapshot, applied as commit 0).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa

from txjoin.ingest.types import DECIMAL_TYPE, column_kind
from txjoin.job import Collect, Job
from txjoin.join.temporal import OutputChange

META = [("_op", pa.string()), ("_commit_seq", pa.int64()), ("_xid", pa.int64()),
        ("_commit_ts", pa.timestamp("us", tz="UTC"))]
SOURCE_COLUMN = "_source"


_ARROW: dict[str, pa.DataType] = {
    "int": pa.int64(), "bigint": pa.int64(), "smallint": pa.int64(), "text": pa.string(),
    "bool": pa.bool_(), "double": pa.float64(), "real": pa.float32(),
    "timestamp": pa.timestamp("us", tz="UTC"), "timestamptz": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(), "time": pa.time64("us"), "timetz": pa.time64("us"),
    "interval": pa.duration("us"), "uuid": pa.string(), "json": pa.string(),
    "bytea": pa.binary(), "money": pa.decimal128(19, 2), "numeric": pa.string(),
}
"""Arrow type per column kind. ``timetz`` is held in UTC (Arrow times have no zone);
``numeric`` without a scale (no fixed Arrow decimal holds every value) as text."""


def arrow_type(sql_type: str) -> pa.DataType:
    if sql_type.endswith("[]"):
        return pa.list_(arrow_type(sql_type[:-2]))
    kind, scale = column_kind(sql_type)
    if kind == "decimal":
        return pa.decimal128(int(DECIMAL_TYPE.match(sql_type).group(1)), scale)  # type: ignore[union-attr]
    return _ARROW[kind]


PG_TYPE = b"txjoin.pg_type"
"""Field metadata: the PostgreSQL sink's column type where the Arrow type alone loses it."""
_PG_NATIVE = {"uuid": "uuid", "json": "json", "jsonb": "jsonb", "numeric": "numeric"}
"""Source types held as Arrow text that the PostgreSQL sink keeps as the source has them."""


def output_schema(job: Job) -> pa.Schema:
    """Schema of a changes table for ``job``: key, value columns, then metadata."""
    fields = []
    for name, proj in [*job.output.key.items(), *job.output.columns.items()]:
        if isinstance(proj, Collect):
            struct = pa.struct([(f, arrow_type(job.column_type(ref)))
                                for f, ref in proj.fields.items()])
            fields.append(pa.field(name, pa.list_(struct)))
        else:
            sql_type = job.projection_type(name)
            native = _PG_NATIVE.get(sql_type)
            fields.append(pa.field(name, arrow_type(sql_type), nullable=name not in job.output.key,
                                   metadata=None if native is None else {PG_TYPE: native}))
    meta = [*META, (SOURCE_COLUMN, pa.string())] if job.sources else META
    return pa.schema(fields + [pa.field(n, t) for n, t in meta])


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return {"$dec": str(value)}
    if isinstance(value, dt.datetime):
        return {"$ts": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, dt.time):
        return {"$time": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {"$us": value // dt.timedelta(microseconds=1)}
    if isinstance(value, bytes):
        return {"$b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


_TYPED: dict[str, Callable[[Any], Any]] = {
    "$dec": Decimal, "$ts": dt.datetime.fromisoformat, "$date": dt.date.fromisoformat,
    "$time": dt.time.fromisoformat, "$us": lambda us: dt.timedelta(microseconds=us),
    "$b64": base64.b64decode,
}


def _typed(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1:
            (tag, inner), = value.items()
            if tag in _TYPED:
                return _TYPED[tag](inner)
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return value


def row_to_json(row: dict[str, Any] | None) -> str | None:
    """An output row as JSON that round-trips every column type's Python value exactly."""
    return None if row is None else json.dumps(_plain(row), separators=(",", ":"))


def row_from_json(text: str | None) -> dict[str, Any] | None:
    return None if text is None else _typed(json.loads(text))


def key_row(job: Job, key: tuple[Any, ...]) -> dict[str, Any]:
    """The output key columns of a fact key (in the fact table's primary-key order)."""
    fact_key = list(job.table(job.fact).key)
    return {name: key[fact_key.index(ref.split(".", 1)[1])]
            for name, ref in job.output.key.items()}


def changes_to_table(job: Job, changes: Iterable[OutputChange],
                     rows: Sequence[dict[str, Any] | None] | None = None) -> pa.Table:
    """Output changes as the Arrow table the sinks take (rows in the given order)."""
    schema = output_schema(job)
    with_source = bool(job.sources)
    # An unbounded numeric is text in Arrow; computed (a division, an aggregate), it is a
    # Decimal: written as PostgreSQL prints it (no exponent, its scale kept).
    as_text = [f.name for f in schema if f.type == pa.string()
               and (f.metadata or {}).get(PG_TYPE) == b"numeric"]
    changes = list(changes)
    records = []
    for n, ch in enumerate(changes):
        row = rows[n] if rows is not None else ch.row
        record = dict(row) if row is not None else key_row(job, ch.key)
        for name in as_text:
            value = record.get(name)
            if isinstance(value, Decimal):
                record[name] = format(value, "f")
        record["_op"] = ch.op
        record["_commit_seq"] = ch.commit_seq
        record["_xid"] = ch.xid
        record["_commit_ts"] = (None if ch.commit_ts_ms is None else
                                dt.datetime.fromtimestamp(ch.commit_ts_ms / 1000, dt.UTC))
        if with_source:
            record[SOURCE_COLUMN] = ch.source
        records.append(record)
    return pa.Table.from_pylist(records, schema=schema)
