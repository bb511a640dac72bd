"""Synthesize the records Debezium's PostgreSQL connector would write for given transactions.

The records match the connector with the settings txjoin documents
(``plugin.name=pgoutput``, ``provide.transaction.metadata=true``,
``decimal.handling.mode=string``, adaptive time precision, JSON converter with
``schemas.enable=false``, ``REPLICA IDENTITY FULL``), or with another
``decimal.handling.mode`` and ``schemas.enable=true`` (the schema of each row
as Debezium writes it, decimals as Kafka Connect's ``Decimal`` with its scale): the envelope with
``before``/``after``/``source``/``op``/``ts_ms``/``transaction``, a tombstone
after each delete, BEGIN/END on ``<prefix>.transaction`` whose ids carry
different LSNs, snapshot rows with ``op=r`` and the ``source.snapshot``
markers. Used by the replay harness and the property tests.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from txjoin.ingest.debezium import (
    DEFAULT_BINARY_HANDLING_MODE,
    DEFAULT_DECIMAL_HANDLING_MODE,
    DEFAULT_TIME_PRECISION_MODE,
    DEFAULT_TOPIC_PREFIX,
    Modes,
    table_topic,
    transaction_topic,
)
from txjoin.ingest.types import DECIMAL_TYPE
from txjoin.job import Job
from txjoin.join.oracle import SourceTransaction

CONNECTOR_VERSION = "3.6.3.Final"


@dataclass(frozen=True)
class Produced:
    """One record written to a topic, with what it stands for (for selectors)."""

    topic: str
    key: str | None
    value: str | None
    tx: str  # transaction name, or "snapshot"
    kind: str  # begin | end | data | tombstone | snapshot
    table: str | None = None
    index: int | None = None  # i-th event of `tx` on `table`
    offset: int = -1


_COMPACT = json.JSONEncoder(separators=(",", ":"))  # json.dumps would build one per call


def _json(doc: Any) -> str:
    return _COMPACT.encode(doc)


def _micros(value: Any) -> Any:
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        return delta.days * 86_400_000_000 + delta.seconds * 1_000_000 + delta.microseconds
    return value


def encode_value(value: Any, sql_type: str, modes: Modes = Modes()) -> Any:  # noqa: B008
    """A Python/scenario value as Debezium's JSON converter writes it under ``modes``
    (values of other types stay in their readable form, which every mode reads)."""
    if value is None:
        return None
    if sql_type.endswith("[]"):
        return [encode_value(v, sql_type[:-2], modes) for v in value]
    if sql_type in ("timestamp", "timestamptz"):
        # connect: Connect's Timestamp, milliseconds (finer digits are lost, as there)
        return _micros(value) // (1000 if modes.time_precision == "connect" else 1)
    if sql_type == "bytea" and isinstance(value, str | bytes):
        raw = value if isinstance(value, bytes) else base64.b64decode(value)  # scenario text
        if modes.binary == "hex":
            return raw.hex()
        if modes.binary == "base64-url-safe":
            return base64.urlsafe_b64encode(raw).decode("ascii")
        return base64.b64encode(raw).decode("ascii")
    decimal_handling_mode = modes.decimal
    m = DECIMAL_TYPE.match(sql_type)
    if m:
        exact = Decimal(str(value)).quantize(Decimal(1).scaleb(-int(m.group(2))))
        if decimal_handling_mode == "precise":  # base64 of the big-endian unscaled value
            unscaled = int(exact.scaleb(int(m.group(2))))
            raw = unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True)
            return base64.b64encode(raw).decode("ascii")
        if decimal_handling_mode == "double":
            return float(exact)
        return str(exact)
    return value


_CONNECT_TYPES = {"int": "int32", "bigint": "int64", "smallint": "int16", "text": "string",
                  "bool": "boolean", "double": "double"}


def field_schema(sql_type: str, modes: Modes = Modes()) -> dict[str, Any]:  # noqa: B008
    """The Kafka Connect schema Debezium gives a column of ``sql_type`` under ``modes``."""
    if sql_type.endswith("[]"):
        return {"type": "array", "optional": True, "items": field_schema(sql_type[:-2], modes)}
    if sql_type in ("timestamp", "timestamptz"):
        name = ("org.apache.kafka.connect.data.Timestamp" if modes.time_precision == "connect"
                else "io.debezium.time.MicroTimestamp")
        return {"type": "int64", "optional": True, "name": name, "version": 1}
    if sql_type == "bytea":
        return {"type": "bytes" if modes.binary == "bytes" else "string", "optional": True}
    decimal_handling_mode = modes.decimal
    m = DECIMAL_TYPE.match(sql_type)
    if m and decimal_handling_mode == "precise":
        return {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
                "version": 1, "parameters": {"scale": m.group(2),
                                             "connect.decimal.precision": m.group(1)}}
    if m:
        return {"type": "double" if decimal_handling_mode == "double" else "string",
                "optional": True}
    return {"type": _CONNECT_TYPES[sql_type], "optional": True}


class Synthesizer:
    """Keeps a model of the source tables and the topics; appends records as transactions commit."""

    def __init__(self, job: Job, prefix: str = DEFAULT_TOPIC_PREFIX, schemas_enable: bool = False,
                 first_xid: int = 1000, start_ms: int = 1_695_510_000_000,
                 decimal_handling_mode: str | None = None,
                 tables: Sequence[str] | None = None) -> None:
        self.job = job
        self.prefix = prefix
        # The tables this connector captures (one source of a job over several); default all.
        self.tables = list(job.table_names if tables is None else tables)
        self.schemas_enable = schemas_enable
        # By default what the job's connector writes.
        self.modes = Modes(decimal_handling_mode or job.decimal_handling_mode
                           or DEFAULT_DECIMAL_HANDLING_MODE,
                           job.time_precision_mode or DEFAULT_TIME_PRECISION_MODE,
                           job.binary_handling_mode or DEFAULT_BINARY_HANDLING_MODE)
        self.xid = first_xid
        self.lsn = 30_000_000
        self.now_ms = start_ms
        self.topics: dict[str, list[Produced]] = {self.tx_topic: []}
        for t in self.tables:
            self.topics[self.topic(t)] = []
        self.db: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {t: {} for t in
                                                                    self.tables}
        self.last_commit_lsn = self.lsn

    @property
    def tx_topic(self) -> str:
        return transaction_topic(self.prefix)

    def topic(self, table: str) -> str:
        return table_topic(self.prefix, table)

    # -- helpers -----------------------------------------------------------------

    def _wrap(self, payload: dict[str, Any] | None, table: str | None = None) -> str | None:
        if payload is None:
            return None
        if self.schemas_enable:
            schema: dict[str, Any] = {"type": "struct", "optional": False,
                                      "name": "txjoin.synthesized.Envelope"}
            if table is not None:
                # The row schemas; source, transaction and the rest are left out.
                columns = self.job.table(table).columns
                row = {"type": "struct", "optional": True, "name": f"{self.prefix}.{table}.Value",
                       "fields": [{**field_schema(t, self.modes), "field": c}
                                  for c, t in columns.items()]}
                schema["fields"] = [{**row, "field": "before"}, {**row, "field": "after"},
                                    {"type": "string", "optional": False, "field": "op"}]
            return _json({"schema": schema, "payload": payload})
        return _json(payload)

    def _encode_row(self, table: str, row: Mapping[str, Any]) -> dict[str, Any]:
        cols = self.job.table(table).columns
        return {c: encode_value(row.get(c), cols[c], self.modes)
                for c in cols if c in row}

    def _key(self, table: str, row: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(row.get(k) for k in self.job.table(table).key)

    def _append(self, rec: Produced) -> Produced:
        records = self.topics.setdefault(rec.topic, [])
        rec = replace(rec, offset=len(records))
        records.append(rec)
        return rec

    def _source(self, table: str, ts_ms: int, snapshot: str, xid: int | None,
                lsn: int) -> dict[str, Any]:
        schema, name = table.split(".", 1)
        return {"version": CONNECTOR_VERSION, "connector": "postgresql", "name": self.prefix,
                "ts_ms": ts_ms, "snapshot": snapshot, "db": "shop",
                "sequence": _json([str(self.last_commit_lsn), str(lsn)]),
                "ts_us": ts_ms * 1000, "ts_ns": ts_ms * 1_000_000,
                "schema": schema, "table": name, "txId": xid, "lsn": lsn, "xmin": None}

    # -- snapshot -------------------------------------------------------------------

    def snapshot(self, rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Produced]:
        """The initial snapshot (op=r), tables in the given order, with Debezium's markers."""
        out: list[Produced] = []
        tables = [t for t, r in rows.items() if r]
        total = sum(len(rows[t]) for t in tables)
        n = 0
        snap_lsn = self.lsn
        for table in tables:
            for i, row in enumerate(rows[table]):
                n += 1
                last_of_table = i == len(rows[table]) - 1
                if n == total:
                    marker = "last"
                elif last_of_table:
                    marker = "last_in_data_collection"
                elif n == 1:
                    marker = "first"
                elif i == 0:
                    marker = "first_in_data_collection"
                else:
                    marker = "true"
                encoded = self._encode_row(table, row)
                self.db[table][self._key(table, row)] = encoded
                payload = {"before": None, "after": encoded,
                           "source": self._source(table, self.now_ms, marker, None, snap_lsn),
                           "transaction": None, "op": "r", "ts_ms": self.now_ms}
                key = _json({k: encoded.get(k) for k in self.job.table(table).key})
                out.append(self._append(Produced(self.topic(table), key,
                                                 self._wrap(payload, table),
                                                 "snapshot", "snapshot", table, i)))
        self.now_ms += 1000
        return out

    def incremental(self, table: str, rows: Sequence[Mapping[str, Any]]) -> list[Produced]:
        """Rows of an incremental snapshot chunk (Debezium's ``execute-snapshot``), written
        now into ``table``'s topic: ``op: "r"``, ``source.snapshot: "incremental"``, no
        transaction block. They are the source's rows from now on (a row that differs from
        what the events said stands for a change the capture missed)."""
        out: list[Produced] = []
        for i, row in enumerate(rows):
            encoded = self._encode_row(table, row)
            self.db[table][self._key(table, row)] = encoded
            payload = {"before": None, "after": encoded,
                       "source": self._source(table, self.now_ms, "incremental", None,
                                              self.lsn),
                       "transaction": None, "op": "r", "ts_ms": self.now_ms}
            key = _json({k: encoded.get(k) for k in self.job.table(table).key})
            out.append(self._append(Produced(self.topic(table), key, self._wrap(payload, table),
                                             "incremental", "snapshot", table, i)))
        return out

    # -- streaming ----------------------------------------------------------------

    def transaction(self, tx: SourceTransaction,
                    restart: tuple[int, int] | None = None) -> list[Produced]:
        """Commit ``tx``; append its BEGIN, events (+ tombstones) and END.

        ``restart=(i, j)`` reproduces a connector restart inside the transaction
        as Debezium < 3.7 does it: events ``[0, i)`` are written, then BEGIN again,
        events ``[j, n)`` renumbered from 1, and an END counting only those.
        """
        self.xid += 1
        xid = self.xid
        self.now_ms += 1000
        ts = self.now_ms
        self.lsn += 8
        begin_lsn = self.lsn
        events: list[tuple[str, str, dict[str, Any] | None, dict[str, Any] | None]] = []
        for change in tx.changes:
            table = change.table
            encoded = self._encode_row(table, change.row)
            key = self._key(table, encoded)
            old = self.db[table].get(key)
            if change.op == "insert":
                events.append((table, "c", None, encoded))
                self.db[table][key] = encoded
            elif change.op == "update":
                full = {**(old or {}), **encoded}
                events.append((table, "u", old, full))
                self.db[table][key] = full
            else:
                events.append((table, "d", old if old is not None else encoded, None))
                self.db[table].pop(key, None)
        lsns = []
        for _ in events:
            self.lsn += 8
            lsns.append(self.lsn)
        self.lsn += 8
        commit_lsn = self.lsn

        out: list[Produced] = []

        def begin() -> None:
            doc = {"status": "BEGIN", "id": f"{xid}:{begin_lsn}", "event_count": None,
                   "data_collections": None, "ts_ms": ts}
            out.append(self._append(Produced(self.tx_topic, _json({"id": f"{xid}:{begin_lsn}"}),
                                             self._wrap(doc), tx.name, "begin")))

        def emit(segment: range) -> dict[str, int]:
            counts: dict[str, int] = {}
            per_table_index: dict[str, int] = {}
            for i, (table, op, before, after) in enumerate(events):
                per_table_index[table] = per_table_index.get(table, -1) + 1
                if i not in segment:
                    continue
                counts[table] = counts.get(table, 0) + 1
                total = sum(counts.values())
                payload = {"before": before, "after": after,
                           "source": self._source(table, ts, "false", xid, lsns[i]),
                           "transaction": {"id": f"{xid}:{lsns[i]}", "total_order": total,
                                           "data_collection_order": counts[table]},
                           "op": op, "ts_ms": ts + 5, "ts_us": (ts + 5) * 1000,
                           "ts_ns": (ts + 5) * 1_000_000}
                row = after if after is not None else before
                assert row is not None
                key = _json({k: row.get(k) for k in self.job.table(table).key})
                topic = self.topic(table)
                idx = per_table_index[table]
                out.append(self._append(Produced(topic, key, self._wrap(payload, table),
                                                 tx.name, "data", table, idx)))
                if op == "d":
                    out.append(self._append(Produced(topic, key, None, tx.name, "tombstone",
                                                     table, idx)))
            return counts

        begin()
        if restart is not None:
            i, j = restart
            emit(range(0, i))
            begin()
            counts = emit(range(j, len(events)))
        else:
            counts = emit(range(len(events)))
        end = {"status": "END", "id": f"{xid}:{commit_lsn}", "event_count": sum(counts.values()),
               "data_collections": [{"data_collection": t, "event_count": n}
                                    for t, n in counts.items()], "ts_ms": ts}
        out.append(self._append(Produced(self.tx_topic, _json({"id": f"{xid}:{commit_lsn}"}),
                                         self._wrap(end), tx.name, "end")))
        self.last_commit_lsn = commit_lsn
        return out

    def resend(self, records: Sequence[Produced]) -> list[Produced]:
        """Write records again, unchanged (the connector's at-least-once redelivery)."""
        return [self._append(replace(r, offset=-1)) for r in records]


class SourcesSynthesizer:
    """One :class:`Synthesizer` per source of a job: each with its own prefix, topics,
    transaction topic, xids and LSNs (two databases: the same xid can occur in both)."""

    def __init__(self, job: Job, prefixes: Mapping[str, str], **options: Any) -> None:
        self.job = job
        self.sources = {s: Synthesizer(job, prefix=prefixes[s], tables=job.tables_of(s),
                                       **options) for s in job.source_names}

    @property
    def topics(self) -> dict[str, list[Produced]]:
        return {t: recs for synth in self.sources.values() for t, recs in synth.topics.items()}

    def snapshot(self, rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Produced]:
        """Each source's snapshot of its tables, in declared source order."""
        out: list[Produced] = []
        for source, synth in self.sources.items():
            mine = set(self.job.tables_of(source))
            out.extend(synth.snapshot({t: r for t, r in rows.items() if t in mine}))
        return out

    def transaction(self, tx: SourceTransaction,
                    restart: tuple[int, int] | None = None) -> list[Produced]:
        """Commit ``tx`` in its source (``tx.source``)."""
        return self.sources[tx.source or self.job.source_names[0]].transaction(tx, restart)

    def incremental(self, table: str, rows: Sequence[Mapping[str, Any]]) -> list[Produced]:
        """``Synthesizer.incremental`` in the table's source."""
        return self.sources[self.job.source_of(table)].incremental(table, rows)

    def resend(self, records: Sequence[Produced]) -> list[Produced]:
        out: list[Produced] = []
        for synth in self.sources.values():
            mine = [r for r in records if r.topic in synth.topics]
            if mine:
                out.extend(synth.resend(mine))
        return out
