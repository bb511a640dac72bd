"""Decoding Debezium's JSON envelope into uniform change events and transaction markers.

Accepts the JSON converter with ``schemas.enable`` false (the documented
setting) or true (``{"schema": ..., "payload": ...}``). Tombstones (null values
after a delete) decode to ``None``. A malformed record raises
:class:`~txjoin.errors.DecodeError` naming topic, partition and offset.

Facts this relies on (docs/how-it-works.md, "Debezium facts"): the xid is the part of
``transaction.id`` before the colon (the LSN part differs between BEGIN, data events and END);
snapshot rows have ``op: "r"`` and ``transaction: null``; ``source.ts_ms`` is
the commit time.
"""

from __future__ import annotations

import datetime as dt
import json
import operator
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, TypeVar

import orjson

from txjoin.errors import ConfigError, DecodeError

# The connector settings that decide how a value reads when its record has no schema.
DECIMAL_HANDLING_MODES: tuple[str, ...] = ("precise", "string", "double")
DEFAULT_DECIMAL_HANDLING_MODE = "string"
"""What ``config/debezium-postgres.properties`` sets (a unit test keeps them equal)."""
TIME_PRECISION_MODES: tuple[str, ...] = ("adaptive", "adaptive_time_microseconds", "connect")
DEFAULT_TIME_PRECISION_MODE = "adaptive"
"""Debezium's default, which ``config/debezium-postgres.properties`` keeps."""
BINARY_HANDLING_MODES: tuple[str, ...] = ("bytes", "base64", "base64-url-safe", "hex")
DEFAULT_BINARY_HANDLING_MODE = "bytes"
"""Debezium's default, which ``config/debezium-postgres.properties`` keeps (through the JSON
converter, bytes are base64 text)."""


class Modes(NamedTuple):
    """The connector settings that decide how a value without a schema reads:
    ``decimal.handling.mode``, ``time.precision.mode`` and ``binary.handling.mode``."""

    decimal: str = DEFAULT_DECIMAL_HANDLING_MODE
    time_precision: str = DEFAULT_TIME_PRECISION_MODE
    binary: str = DEFAULT_BINARY_HANDLING_MODE


DEFAULT_TOPIC_PREFIX = "shop"
"""The ``topic.prefix`` of the connector txjoin ships (config/debezium-postgres.properties;
a unit test keeps them equal): a job without declared sources reads it by default."""


def transaction_topic(prefix: str) -> str:
    """The topic of a connector's BEGIN/END markers (``provide.transaction.metadata``)."""
    return f"{prefix}.transaction"


def table_topic(prefix: str, table: str) -> str:
    """The change topic of ``table`` (``schema.table``) of a connector with ``prefix``."""
    return f"{prefix}.{table}"


_T = TypeVar("_T")


def _pickled_by_fields(cls: type[_T]) -> type[_T]:
    """Pickle a frozen slotted dataclass as its constructor and field values.

    The shards pickle their state every batch, an open transaction's events with it, and
    the dataclass default (``__getstate__`` calling ``dataclasses.fields`` per object) was
    most of that: 200,000 events pickled in 3.7 s, 1.25 s this way. Pickles written the
    default way still load (their ``__setstate__`` is kept)."""
    values = operator.attrgetter(*(f.name for f in fields(cls)))  # type: ignore[arg-type]

    def __reduce__(self: _T) -> tuple[type[_T], tuple[Any, ...]]:
        return cls, values(self)

    cls.__reduce__ = __reduce__  # type: ignore[assignment,method-assign]
    return cls


DATA_OPS = frozenset({"c", "u", "d", "r", "t"})
SNAPSHOT_CLOSING = frozenset({"last", "last_in_data_collection"})
INCREMENTAL = "incremental"
"""``source.snapshot`` of a row an incremental snapshot read (``op: "r"``, no transaction
block, interleaved with streaming events): Debezium's ``execute-snapshot`` signal."""


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class Position:
    """Where a record was read: topic, partition, offset."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One row change of a captured table (rows are still raw JSON values)."""

    table: str
    op: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    xid: int | None  # None for snapshot rows
    lsn: int | None
    commit_ts_ms: int | None
    snapshot: str | None  # source.snapshot: first/.../last, "false" when streaming
    data_collection_order: int | None
    position: Position
    # Digest of the row image, set when the event travels without its rows (a shard that
    # does not own the row still counts the event and must recognise it again).
    digest: bytes | None = None
    # Set by routing on a fact event whose ``after`` row belongs to another shard (a
    # primary-key change that moves the fact): this shard removes ``before``, that one
    # inserts ``after`` (``txjoin/join/routing.py``).
    after_elsewhere: bool = False

    def routed(self, digest: bytes | None, after_elsewhere: bool,
               rows: bool = True) -> ChangeEvent:
        """This event as routing hands it to a shard: with the row image's ``digest``,
        ``after_elsewhere``, and without its rows unless ``rows``. (What
        ``dataclasses.replace`` would give, at half its cost: it runs once per event.)"""
        return ChangeEvent(self.table, self.op, self.before if rows else None,
                           self.after if rows else None, self.xid, self.lsn,
                           self.commit_ts_ms, self.snapshot, self.data_collection_order,
                           self.position, digest, after_elsewhere)

    @property
    def is_snapshot(self) -> bool:
        return self.op == "r"

    @property
    def identity(self) -> tuple[Any, ...]:
        """Content identity used for deduplication.

        Not ``total_order``: before Debezium 3.7 a restart inside a transaction
        renumbers the events it sends again. Nor the envelope ``ts_ms``, which is
        the connector's processing time and changes on a resend. The change's WAL
        position (``source.lsn``), table, op and row image identify it: the LSN
        alone does not (snapshot rows share one; a primary-key update is a delete
        and a create at the same LSN; a multi-row insert record gives several rows
        one LSN). The row image is compared as written (Debezium writes columns in
        table order), which is cheaper than canonical JSON.
        """
        if self.digest is not None:
            return (self.table, self.op, self.lsn, self.digest)
        return (self.table, self.op, self.lsn, repr(self.after if self.after is not None
                                                      else self.before))


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class TxMarker:
    """A BEGIN or END event from ``<prefix>.transaction``."""

    status: str  # "BEGIN" | "END"
    xid: int
    id: str
    commit_lsn: int | None
    event_count: int | None
    counts: dict[str, int] | None  # per data collection, END only
    ts_ms: int | None
    position: Position


Decoded = ChangeEvent | TxMarker | None


class SchemaRow(dict[str, Any]):
    """A row image from a record that carried its schema (``schemas.enable=true``).

    Decoding has already turned every ``Decimal``-typed value into the
    ``{"scale", "value"}`` form, so a string in a decimal column is a decimal
    literal (``decimal.handling.mode=string``) whatever the job says
    (:meth:`txjoin.job.Table.convert_row`).
    """

    __slots__ = ()


def _loads(value: str | bytes) -> Any:
    """Parse JSON with orjson (several times faster than ``json``, bytes without decoding).

    orjson refuses ``NaN`` and ``Infinity``, which Jackson may write for doubles:
    such records go through ``json``, whose error message is the one reported
    when both refuse (so messages are those of ``json``). Integers beyond 64 bits
    would become floats, but Debezium writes none (``numeric`` arrives as a
    string, base64 bytes or a double, per ``decimal.handling.mode``).
    """
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return json.loads(value)


ONE_PARTITION = (
    "a transaction topic must have exactly 1 partition: commit order is read from its "
    "order, which Kafka keeps only within a partition. Recreate it with 1 partition before "
    "Debezium writes to it, and snapshot again")
"""Why a transaction topic with several partitions is refused, and what to do."""

UNDECLARED_PARTITIONS = (
    "the source did not declare this partition of the table topic: the topic gained "
    "partitions while the job ran (txjoin reads the partition counts when the query starts; "
    "restart the job), or a files/replay source's folders do not name it")
"""Why a record from an undeclared partition is refused, and what to do."""


def raise_partitioned(pos: Position, transaction_topic: bool = False) -> None:
    """Refuse a record from partition > 0 of a transaction topic, or of a table topic the
    source did not declare partitioned."""
    why = ONE_PARTITION if transaction_topic else UNDECLARED_PARTITIONS
    raise ConfigError(f"{pos.topic} has a record in partition {pos.partition} "
                      f"(offset {pos.offset}); {why}")


_ID_TYPES = (str, int)


def split_transaction_id(tx_id: Any, pos: Position) -> tuple[int, int | None]:
    """Split Debezium's ``"<xid>:<lsn>"`` transaction id into (xid, lsn)."""
    if not isinstance(tx_id, _ID_TYPES) or tx_id == "":  # (a tuple: `str | int` is built
        # anew at every call, and this runs for every BEGIN and END in every shard)
        raise DecodeError(f"transaction id {tx_id!r} is not a string",
                          topic=pos.topic, partition=pos.partition, offset=pos.offset)
    head, _, tail = (tx_id if type(tx_id) is str else str(tx_id)).partition(":")
    try:
        return int(head), (int(tail) if tail else None)
    except ValueError:
        raise DecodeError(f"transaction id {tx_id!r} is not '<xid>:<lsn>'",
                          topic=pos.topic, partition=pos.partition, offset=pos.offset) from None


def decode(value: str | bytes | None, pos: Position) -> Decoded:
    """Decode one record value. ``None`` for tombstones."""
    if value is None:
        return None

    def bad(what: str) -> DecodeError:
        return DecodeError(what, topic=pos.topic, partition=pos.partition, offset=pos.offset)

    try:
        doc = _loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"value is not JSON ({exc}); is the JSON converter configured?") from None
    if not isinstance(doc, dict):
        raise bad(f"value is a JSON {type(doc).__name__}, expected an object")
    schema: Any = None
    if "payload" in doc and "schema" in doc:  # schemas.enable=true
        schema, doc = doc["schema"], doc["payload"]
        if doc is None:
            return None
        if not isinstance(doc, dict):
            raise bad("`payload` is not an object")

    if "status" in doc:
        return _decode_marker(doc, pos, bad)
    if "op" in doc:
        if schema is not None:
            _apply_schema(schema, doc, bad)
        return _decode_change(doc, pos, bad)
    raise bad(f"neither a change event (`op`) nor a transaction marker (`status`); "
              f"keys: {sorted(doc)[:8]}")


def row_columns(value: str | bytes | None, pos: Position) -> list[str] | None:
    """The column names of a change record's row (``after``, else ``before``), as the
    connector sends them; None for a tombstone, a transaction marker, a truncate or a record
    that does not decode (the run reports those itself, at their position)."""
    try:
        decoded = decode(value, pos)
    except DecodeError:
        return None
    if not isinstance(decoded, ChangeEvent):
        return None
    row = decoded.after if decoded.after is not None else decoded.before
    return None if row is None else list(row)


def _decode_marker(doc: dict[str, Any], pos: Position, bad: Any) -> TxMarker:
    status = doc.get("status")
    if status not in ("BEGIN", "END"):
        raise bad(f"transaction marker status {status!r} is not BEGIN or END")
    xid, lsn = split_transaction_id(doc.get("id"), pos)
    counts: dict[str, int] | None = None
    event_count = doc.get("event_count")
    if status == "END":
        if not isinstance(event_count, int):
            raise bad(f"END of {doc.get('id')} has event_count {event_count!r}, expected an int")
        collections = doc.get("data_collections") or []
        if not isinstance(collections, list):
            raise bad("END `data_collections` is not a list")
        counts = {}
        for item in collections:
            if (not isinstance(item, dict) or not isinstance(item.get("data_collection"), str)
                    or not isinstance(item.get("event_count"), int)):
                raise bad(f"END data_collections entry {item!r} lacks data_collection/event_count")
            counts[item["data_collection"]] = counts.get(item["data_collection"], 0) + int(
                item["event_count"])
        if sum(counts.values()) != event_count:
            raise bad(f"END of {doc.get('id')}: event_count {event_count} differs from the sum "
                      f"of data_collections {sum(counts.values())}")
    return TxMarker(status=status, xid=xid, id=str(doc["id"]), commit_lsn=lsn,
                    event_count=event_count, counts=counts,
                    ts_ms=_timestamp(doc.get("ts_ms"), "ts_ms", bad), position=pos)


def _timestamp(value: Any, name: str, bad: Any) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise bad(f"`{name}` is {value!r}, expected milliseconds since the epoch")


DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"


def _apply_schema(schema: Any, doc: dict[str, Any], bad: Any) -> None:
    """Mark ``before``/``after`` as :class:`~txjoin.job.SchemaRow`, make decimals exact and
    times unit-free.

    With ``decimal.handling.mode=precise`` a ``Decimal`` value is base64 of the
    unscaled number and only the schema's ``scale`` parameter says where the
    point goes: rewrite it as Debezium's variable-scale form ``{"scale", "value"}``,
    which reads the same in every mode. ``VariableScaleDecimal`` already has that
    form; strings (``string`` mode) and numbers (``double``) need nothing. A time or
    timestamp number's unit depends on ``time.precision.mode`` and the column's
    precision; its schema name says which, so it is rewritten as ISO text.
    """
    fields = schema.get("fields") if isinstance(schema, dict) else None
    if not isinstance(fields, list):
        return  # no row schemas to go by: read the rows like schemaless ones
    by_name = {f.get("field"): f for f in fields if isinstance(f, dict)}
    for name in ("before", "after"):
        envelope_field, row = by_name.get(name), doc.get(name)
        if not isinstance(envelope_field, dict) or not isinstance(row, dict):
            continue
        columns = envelope_field.get("fields")
        for column in columns if isinstance(columns, list) else ():
            if not isinstance(column, dict) or not isinstance(column.get("field"), str) \
                    or column["field"] not in row:
                continue
            col = column["field"]
            scale = _decimal_scale(column, bad, f"{name}.{col}")
            if scale is not None:
                row[col] = _with_scale(row[col], scale, bad, f"{name}.{col}")
            elif column.get("name") in _TEMPORAL:
                row[col] = _iso(row[col], column["name"])
            elif column.get("type") == "array" and isinstance(column.get("items"), dict):
                items = column["items"]
                scale = _decimal_scale(items, bad, f"{name}.{col}[]")
                if scale is not None and isinstance(row[col], list):
                    row[col] = [_with_scale(v, scale, bad, f"{name}.{col}[]") for v in row[col]]
                elif items.get("name") in _TEMPORAL and isinstance(row[col], list):
                    row[col] = [_iso(v, items["name"]) for v in row[col]]
        doc[name] = SchemaRow(row)


# Semantic time types whose number's unit only the schema says (time.precision.mode adaptive,
# adaptive_time_microseconds or connect): name -> (microseconds = value * mul // div, a time
# of day rather than a timestamp).
_TEMPORAL: dict[str, tuple[int, int, bool]] = {
    "io.debezium.time.Time": (1000, 1, True), "io.debezium.time.MicroTime": (1, 1, True),
    "io.debezium.time.NanoTime": (1, 1000, True),
    "org.apache.kafka.connect.data.Time": (1000, 1, True),
    "io.debezium.time.Timestamp": (1000, 1, False),
    "io.debezium.time.MicroTimestamp": (1, 1, False),
    "io.debezium.time.NanoTimestamp": (1, 1000, False),
    "org.apache.kafka.connect.data.Timestamp": (1000, 1, False),
}
_MIDNIGHT = dt.datetime(1970, 1, 1)


def _iso(value: Any, name: str) -> Any:
    """A schema-typed time or timestamp number as ISO text, which reads the same whatever
    the column's declared precision (left as is when it is not a number: the job's reader
    reports it)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return value
    mul, div, time_of_day = _TEMPORAL[name]
    try:
        moment = _MIDNIGHT + dt.timedelta(microseconds=value * mul // div)
    except OverflowError:
        return value
    return moment.time().isoformat() if time_of_day else moment.isoformat()


def _decimal_scale(field_schema: dict[str, Any], bad: Any, where: str) -> int | None:
    if field_schema.get("name") != DECIMAL:
        return None
    params = field_schema.get("parameters")
    try:
        return int(params["scale"])  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        raise bad(f"{where}: Decimal schema without a `scale` parameter: {params!r}") from None


def _with_scale(value: Any, scale: int, bad: Any, where: str) -> Any:
    if value is None or isinstance(value, dict):
        return value
    if not isinstance(value, str):
        raise bad(f"{where}: Decimal value {value!r} is not base64 bytes")
    return {"scale": scale, "value": value}


def _decode_change(doc: dict[str, Any], pos: Position, bad: Any) -> ChangeEvent:
    op = doc.get("op")
    if not isinstance(op, str) or op not in DATA_OPS:
        raise bad(f"unknown op {op!r} (expected one of c, u, d, r, t; 'm' messages "
                  f"are not supported)")
    source = doc.get("source")
    if not isinstance(source, dict):
        raise bad("`source` block missing")
    schema, table = source.get("schema"), source.get("table")
    if not isinstance(schema, str) or not isinstance(table, str):
        raise bad("`source` lacks schema/table")
    before, after = doc.get("before"), doc.get("after")
    for name, row in (("before", before), ("after", after)):
        if row is not None and not isinstance(row, dict):
            raise bad(f"`{name}` is not an object")
    if op in ("c", "r", "u") and after is None:
        raise bad(f"op {op!r} without `after`")
    if op == "d" and before is None:
        raise bad("delete without `before` (set REPLICA IDENTITY on the table)")
    tx = doc.get("transaction")
    snapshot = source.get("snapshot")
    snapshot = None if snapshot is None else str(snapshot).lower()
    xid: int | None = None
    dco: int | None = None
    if op == "r":
        if tx is not None:
            raise bad("snapshot row (op=r) carries a transaction block")
    elif tx is None:
        raise bad(f"op {op!r} without a `transaction` block; set "
                  f"provide.transaction.metadata=true on the connector")
    else:
        if not isinstance(tx, dict):
            raise bad("`transaction` is not an object")
        xid, _ = split_transaction_id(tx.get("id"), pos)
        tx_id = source.get("txId")
        if tx_id is not None and (not isinstance(tx_id, int | str) or str(tx_id) != str(xid)):
            raise bad(f"transaction.id {tx.get('id')} disagrees with source.txId {tx_id!r}")
        dco = tx.get("data_collection_order")
    lsn = source.get("lsn")
    return ChangeEvent(
        table=f"{schema}.{table}", op=op, before=before, after=after, xid=xid,
        lsn=int(lsn) if isinstance(lsn, int | str) and str(lsn).isdigit() else None,
        commit_ts_ms=_timestamp(source.get("ts_ms"), "source.ts_ms", bad), snapshot=snapshot,
        data_collection_order=dco if isinstance(dco, int) else None, position=pos,
    )
