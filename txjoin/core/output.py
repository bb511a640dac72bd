"""The output table's shape, and output changes as JSON (for transport) and Arrow (for sinks).

Column types follow the source columns they project: ints -> int64, text ->
string, numeric(p,s) -> decimal128(p,s), timestamp -> timestamp[us, UTC],
arrays -> lists, a ``Collect`` -> list<struct<...>>. Metadata columns are
``_op``, ``_commit_seq``, ``_xid``, ``_commit_ts``, and for a job that declares
sources (``Job.sources``) also ``_source``: the source of the transaction that
produced the change (null for the initial snapshot, applied as commit 0).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa

from txjoin.core.join import OutputChange
from txjoin.job import _DECIMAL, Collect, Job

META = [("_op", pa.string()), ("_commit_seq", pa.int64()), ("_xid", pa.int64()),
        ("_commit_ts", pa.timestamp("us", tz="UTC"))]
SOURCE_COLUMN = "_source"


def arrow_type(sql_type: str) -> pa.DataType:
    if sql_type.endswith("[]"):
        return pa.list_(arrow_type(sql_type[:-2]))
    if sql_type in ("int", "bigint", "smallint"):
        return pa.int64()
    if sql_type == "text":
        return pa.string()
    if sql_type == "bool":
        return pa.bool_()
    if sql_type == "double":
        return pa.float64()
    if sql_type in ("timestamp", "timestamptz"):
        return pa.timestamp("us", tz="UTC")
    m = _DECIMAL.match(sql_type)
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    raise ValueError(sql_type)


def output_schema(job: Job) -> pa.Schema:
    """Schema of a changes table for ``job``: key, value columns, then metadata."""
    fields = []
    for name, proj in [*job.output.key.items(), *job.output.columns.items()]:
        if isinstance(proj, Collect):
            struct = pa.struct([(f, arrow_type(job.column_type(ref)))
                                for f, ref in proj.fields.items()])
            fields.append(pa.field(name, pa.list_(struct)))
        else:
            fields.append(pa.field(name, arrow_type(job.column_type(proj)),
                                   nullable=name not in job.output.key))
    meta = [*META, (SOURCE_COLUMN, pa.string())] if job.sources else META
    return pa.schema(fields + [pa.field(n, t) for n, t in meta])


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return {"$dec": str(value)}
    if isinstance(value, dt.datetime):
        return {"$ts": value.isoformat()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _typed(value: Any) -> Any:
    if isinstance(value, dict):
        if "$dec" in value and len(value) == 1:
            return Decimal(value["$dec"])
        if "$ts" in value and len(value) == 1:
            return dt.datetime.fromisoformat(value["$ts"])
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return value


def row_to_json(row: dict[str, Any] | None) -> str | None:
    """An output row as JSON that round-trips Decimal and datetime exactly."""
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
    changes = list(changes)
    records = []
    for n, ch in enumerate(changes):
        row = rows[n] if rows is not None else ch.row
        record = dict(row) if row is not None else key_row(job, ch.key)
        record["_op"] = ch.op
        record["_commit_seq"] = ch.commit_seq
        record["_xid"] = ch.xid
        record["_commit_ts"] = (None if ch.commit_ts_ms is None else
                                dt.datetime.fromtimestamp(ch.commit_ts_ms / 1000, dt.UTC))
        if with_source:
            record[SOURCE_COLUMN] = ch.source
        records.append(record)
    return pa.Table.from_pylist(records, schema=schema)
