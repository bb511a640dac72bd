"""Hand-chosen deliveries for example tests: synthesize Debezium records, feed them in batches.

A :class:`Pipeline` couples a :class:`Synthesizer` (what Debezium would have
written to each topic) with an :class:`Engine` (what txjoin makes of it). A test
commits source transactions, then delivers exactly the records it chooses, batch
by batch, the way a Kafka source could: each topic read in offset order, topics
at any lag relative to each other, records read again after a rewind.

``caught_up`` is computed as a real source would report it: a table whose topic
has no produced record beyond what has been delivered. Tests that play a source
lagging behind pass it explicitly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from txjoin.job import Job
from txjoin.join.engine import Engine
from txjoin.join.oracle import RowChange, SourceTransaction, outputs_after_each
from txjoin.join.sharded import ShardedEngine
from txjoin.join.temporal import OutputChange
from txjoin.scenarios.synthesize import Produced, Synthesizer
from txjoin.sequence.assembly import IncompletePolicy

Key = tuple[Any, ...]
Row = dict[str, Any]


def _table(name: str) -> str:
    return name if "." in name else f"public.{name}"


def insert(table: str, **row: Any) -> RowChange:
    """``INSERT INTO table`` with ``row``."""
    return RowChange("insert", _table(table), row)


def update(table: str, **row: Any) -> RowChange:
    """``UPDATE table`` to ``row`` (key columns included; others merge with the old row)."""
    return RowChange("update", _table(table), row)


def delete(table: str, **key: Any) -> RowChange:
    """``DELETE FROM table`` the row with ``key``."""
    return RowChange("delete", _table(table), key)


def only(records: Iterable[Produced], *, kind: str | None = None,
         table: str | None = None, tx: str | None = None) -> list[Produced]:
    """The records of a kind (begin/end/data/tombstone/snapshot), a table and/or a transaction."""
    return [r for r in records
            if (kind is None or r.kind == kind)
            and (table is None or r.table == _table(table))
            and (tx is None or r.tx == tx)]


def without(records: Iterable[Produced], excluded: Iterable[Produced]) -> list[Produced]:
    """``records`` minus ``excluded`` (compared by topic and offset)."""
    gone = {(r.topic, r.offset) for r in excluded}
    return [r for r in records if (r.topic, r.offset) not in gone]


class Pipeline:
    """A synthesized source, an engine, and the output as a sink would hold it."""

    def __init__(self, job: Job, policy: IncompletePolicy | None = None, *,
                 schemas_enable: bool = False, decimal_handling_mode: str | None = None) -> None:
        self.job = job
        self.synth = Synthesizer(job, schemas_enable=schemas_enable,
                                 decimal_handling_mode=decimal_handling_mode)
        self.engine = Engine(job, policy)
        self.snapshot_rows: dict[str, list[Row]] = {}
        self.transactions: list[SourceTransaction] = []
        self.produced: dict[str, list[Produced]] = {}
        self.xids: dict[str, int] = {}
        self.delivered: set[tuple[str, int]] = set()
        self.output: dict[Key, Row] = {}  # the change stream applied, as a sink holds it
        self.changes: list[OutputChange] = []
        # The source tables as the scenario wrote them: an update names only what it
        # changes, the synthesizer and the oracle both get the whole new row.
        self.model: dict[str, dict[Key, Row]] = {t: {} for t in job.table_names}

    def _key(self, table: str, row: Row) -> Key:
        return tuple(row[k] for k in self.job.table(table).key)

    def _whole(self, change: RowChange) -> RowChange:
        rows, key = self.model[change.table], self._key(change.table, dict(change.row))
        if change.op == "delete":
            rows.pop(key, None)
            return change
        row = {**rows.get(key, {}), **change.row} if change.op == "update" else dict(change.row)
        rows[key] = row
        return RowChange(change.op, change.table, row)

    # -- the source ------------------------------------------------------------------

    def snapshot(self, rows: dict[str, list[Row]]) -> list[Produced]:
        """The initial snapshot of ``rows`` (tables in the given order, op=r)."""
        rows = {_table(t): r for t, r in rows.items()}
        self.snapshot_rows.update(rows)
        for table, table_rows in rows.items():
            self.model[table] = {self._key(table, r): dict(r) for r in table_rows}
        self.produced["snapshot"] = self.synth.snapshot(rows)
        return self.produced["snapshot"]

    def commit(self, name: str, *changes: RowChange,
               restart: tuple[int, int] | None = None) -> list[Produced]:
        """Commit one source transaction; its records (BEGIN, events, tombstones, END)."""
        tx = SourceTransaction(name, [self._whole(c) for c in changes])
        self.transactions.append(tx)
        self.produced[name] = self.synth.transaction(tx, restart=restart)
        self.xids[name] = self.synth.xid
        return self.produced[name]

    def rewrite(self, record: Produced, edit: Callable[[dict[str, Any]], None]) -> Produced:
        """Change a produced record's JSON value in place (what the synthesizer never writes)."""
        assert record.value is not None
        doc = json.loads(record.value)
        payload = doc["payload"] if "payload" in doc and "schema" in doc else doc
        edit(payload)
        new = replace(record, value=json.dumps(doc))
        self.synth.topics[record.topic][record.offset] = new
        for records in self.produced.values():
            records[:] = [new if (r.topic, r.offset) == (record.topic, record.offset) else r
                          for r in records]
        return new

    def all_records(self) -> list[Produced]:
        """Everything produced so far, topic by topic in offset order."""
        return [r for topic in self.synth.topics.values() for r in topic]

    def undelivered(self) -> list[Produced]:
        """Produced records never delivered yet."""
        return [r for r in self.all_records() if (r.topic, r.offset) not in self.delivered]

    def expected(self) -> list[dict[Key, Row]]:
        """The oracle: output after the snapshot, after T1, after T2, ..."""
        return outputs_after_each(self.job, self.snapshot_rows, self.transactions)

    # -- the delivery -----------------------------------------------------------------

    def caught_up_tables(self) -> set[str]:
        """Tables whose topic has been delivered up to the last produced record."""
        return {t for t in self.job.table_names
                if all((r.topic, r.offset) in self.delivered
                       for r in self.synth.topics[self.synth.topic(t)])}

    def deliver(self, records: Sequence[Produced] = (),
                caught_up: Iterable[str] | None = None) -> list[OutputChange]:
        """Hand one batch to the engine; apply its changes to :attr:`output`."""
        for r in records:
            assert r.offset >= 0, "deliver records as produced (with offsets)"
        self.delivered |= {(r.topic, r.offset) for r in records}
        tables = self.caught_up_tables() if caught_up is None else {_table(t)
                                                                    for t in caught_up}
        changes = self.engine.process([(r.topic, 0, r.offset, r.value) for r in records],
                                      caught_up=tables)
        for ch in changes:
            if ch.row is None:
                del self.output[ch.key]
            else:
                self.output[ch.key] = ch.row
        self.changes.extend(changes)
        assert self.output == self.engine.outputs(), "change stream disagrees with the state"
        return changes

    def deliver_rest(self) -> list[OutputChange]:
        """Deliver every record not delivered yet, in one batch."""
        return self.deliver(self.undelivered())

    def matches_oracle_prefix(self) -> bool:
        """The output equals the oracle's after the last released transaction."""
        return self.output == self.expected()[self.engine.commit_seq]


def pizzeria_rows(job: Job, transactions: int, seed: int, key_changes: int = 0
                  ) -> list[tuple[str, int, int, str | None]]:
    """The generated pizzeria workload (snapshot, then ``transactions``) as the records a
    one-partition source reads: (topic, partition, offset, value); then ``key_changes``
    transactions that each move an order to a new key (``strategies.key_change``)."""
    from tests.unit.strategies import key_change
    from txjoin.scenarios.workload import pizzeria_workload

    snapshot, txs = pizzeria_workload(transactions, seed=seed)
    orders = {r["id"]: dict(r) for r in snapshot.get("public.orders", [])}
    for tx in txs:
        for change in tx.changes:
            if change.table == "public.orders" and change.op == "delete":
                orders.pop(change.row["id"], None)
            elif change.table == "public.orders":
                orders[change.row["id"]] = {**orders.get(change.row["id"], {}), **change.row}
    next_id = max(orders, default=0) + 1
    for n, old in enumerate(sorted(orders)[:key_changes]):
        txs.append(SourceTransaction(f"move{n}", key_change("public.orders", orders[old],
                                                            next_id + n)))
    synth = Synthesizer(job)
    records = list(synth.snapshot(snapshot))
    for tx in txs:
        records.extend(synth.transaction(tx))
    return [(r.topic, 0, r.offset, r.value) for r in records]


def continue_older_layout(job: Job, records: list, chunk: int, layout: int,
                          older_state: Callable[..., dict[str, Any]],
                          monkeypatch: Any, older: Sequence[tuple[Any, str, Any]] = ()
                          ) -> ShardedEngine:
    """Two 2-shard engines fed ``records`` ``chunk`` at a time: the first three chunks with
    ``older_state`` as ``Assembler.state`` and each (object, name, value) of ``older`` set
    (pytest's ``monkeypatch``), the shard logs
    marked ``layout``, the rest as now, the older one
    restored from its log every batch; asserts they give the same changes batch by batch,
    and that the older log says the current layout from its next segment on. Returns the
    continued engine (for the test's own checks of its outputs)."""
    from txjoin.join.state_log import LAYOUT_VERSION
    from txjoin.sequence.assembly import Assembler

    every = [*job.table_names, "transaction"]
    chunks = [records[start:start + chunk] for start in range(0, len(records), chunk)]
    steady, old = ShardedEngine(job, 2), ShardedEngine(job, 2)
    with monkeypatch.context() as patch:
        patch.setattr(Assembler, "state", older_state)
        for target, name, value in older:
            patch.setattr(target, name, value)
        for part in chunks[:3]:
            steady.process(part, every)
            old.process(part, every)
    for store in old.stores:
        assert store.meta is not None
        store.meta["layout"] = layout
    for part in chunks[3:]:
        assert steady.process(part, every) == old.process(part, every, drop_cache=range(2))
        assert [s.meta["layout"] for s in old.stores if s.meta] == [LAYOUT_VERSION] * 2
    assert steady.commit_seq == old.commit_seq and steady.outputs() == old.outputs()
    return old
