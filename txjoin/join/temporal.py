"""Temporal join: apply released transactions to the current rows, evaluate the job.

State is the current row of every key of every table the job reads, plus the
last output row per output key (packed: a tuple of its values in the output's
column order, a collected list as a tuple of tuples; a third of the dictionaries'
memory, and the last outputs are the largest part of a shard), plus indexes over
the join columns. No history
is kept: transactions arrive in commit order, so "as of the commit that last
changed the fact" is simply "now, right after applying that transaction".

- ``as_of_fact``: only facts changed by a transaction are (re)evaluated; a
  later change of a looked-up row does not rewrite earlier facts.
- ``current``: facts changed by the transaction and every fact whose lookup
  tree reaches a changed row (found through the indexes) are re-evaluated.

A change is emitted only when the output row differs from the last emitted
one, so the changelog holds one entry per real version of an output row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from txjoin.errors import DecodeError, JobError
from txjoin.expr import AGGREGATED
from txjoin.ingest.debezium import ChangeEvent
from txjoin.ingest.types import UNAVAILABLE
from txjoin.job import Aggregate, Children, Collect, Job, Lookup, Pick
from txjoin.join.aggregate import aggregator
from txjoin.join.routing import is_metadata_only
from txjoin.join.state import restore_fields, save_fields
from txjoin.sequence.assembly import Transaction
from txjoin.sequence.spill import drain

Key = tuple[Any, ...]
Row = dict[str, Any]
Packed = tuple[Any, ...]


@dataclass(frozen=True)
class OutputChange:
    """One emitted version of an output row (``row`` is None for a delete)."""

    key: Key
    op: str  # "c" insert, "u" update, "d" delete
    row: Row | None
    commit_seq: int
    xid: int
    commit_ts_ms: int | None
    source: str | None = None  # source of the transaction (None: the initial snapshot)


class ColumnIndex:
    """value tuple -> primary keys of the rows holding it (array columns: per element)."""

    def __init__(self, columns: tuple[str, ...], array: bool) -> None:
        self.columns = columns
        self.array = array
        self.entries: dict[Key, set[Key]] = defaultdict(set)

    def values(self, row: Row) -> list[Key]:
        if self.array:
            arr = row.get(self.columns[0])
            return [(v,) for v in arr] if isinstance(arr, list) else []
        return [tuple(row.get(c) for c in self.columns)]

    def add(self, pk: Key, row: Row) -> None:
        for v in self.values(row):
            self.entries[v].add(pk)

    def remove(self, pk: Key, row: Row) -> None:
        for v in self.values(row):
            found = self.entries.get(v)
            if found is not None:
                found.discard(pk)
                if not found:
                    del self.entries[v]

    def get(self, value: Key) -> set[Key]:
        return self.entries.get(value, set())


def _merge_unavailable(new: Row, old: Row | None, event: ChangeEvent) -> Row:
    """Replace Debezium's unchanged-TOAST placeholder with the previous value."""
    missing = [c for c, v in new.items() if v == UNAVAILABLE]
    if not missing:
        return new
    if old is None:
        raise DecodeError(f"{event.table}: columns {missing} arrived as "
                          f"{UNAVAILABLE} but no previous version of the row is known; set "
                          f"REPLICA IDENTITY FULL on the table",
                          topic=event.position.topic, partition=event.position.partition,
                          offset=event.position.offset)
    return {**new, **{c: old.get(c) for c in missing}}


class TemporalJoin:
    """Current rows + indexes + last outputs; turns transactions into output changes."""

    def __init__(self, job: Job) -> None:
        self.job = job
        # When a list: every row put or removed, in order (table, pk, row or None).
        self.journal: list[tuple[str, Key, Row | None]] | None = None
        self.rows: dict[str, dict[Key, Row]] = {t: {} for t in job.table_names}
        # Output key -> its last emitted row, packed (``pack``).
        self.outputs: dict[Key, Packed] = {}
        output = job.output
        self._columns = output.column_names
        # Compiled filters and computed columns (txjoin/expr.py).
        expressions = job.expressions
        self._where = None if expressions.where is None else expressions.where.evaluate
        self._lookup_where = {a: c.evaluate for a, c in expressions.lookups.items()}
        self._computed = {n: c.evaluate for n, c in expressions.columns.items()}
        # Aggregate columns: (listed alias, argument evaluator or None for count(*), function).
        self._aggregates = {
            name: (proj.alias,
                   expressions.aggregates[name].evaluate if name in expressions.aggregates
                   else None,
                   aggregator(proj.func, job.projection_type(name), proj.separator))
            for name, proj in output.columns.items() if isinstance(proj, Aggregate)}
        # The aggregates computed columns and `having` read (bound[AGGREGATED][key]).
        self._nested = {
            key: (agg.alias, expressions.aggregates[key].evaluate,
                  aggregator(agg.func, job.aggregate_result_type(key), agg.separator))
            for key, agg in expressions.nested.items()}
        self._having = None if expressions.having is None else expressions.having.evaluate
        # Per column: the fields of a collected list (packed as tuples), or None.
        self._collected: list[tuple[str, ...] | None] = [
            tuple(proj.fields) if isinstance(proj, Collect) else None
            for proj in [*output.key.values(), *output.columns.values()]]
        # What evaluate does for each fact, decided once (it runs for every changed fact):
        # per alias, the lookups below it (the lookup, the parent's columns it matches on,
        # whether it binds a list, whether it is inner) ...
        self._below: dict[str, tuple[tuple[Lookup, tuple[str, ...], bool, bool], ...]] = {
            alias: tuple((lk, tuple(lk.on.values()), lk.listed, lk.how == "inner")
                         for lk in job.children(alias))
            for alias in (job.fact_alias, *(lk.alias for lk in job.lookups))}
        # ... and per output column, in order, how its value is made (_COLLECT, _COMPUTED,
        # _AGGREGATE or _COLUMN, with a reference "alias.column" split once).
        self._plan: list[tuple[str, int, Any]] = []
        for name, proj in [*output.key.items(), *output.columns.items()]:
            if isinstance(proj, Collect):
                self._plan.append((name, _COLLECT, (proj.alias, [
                    (field, *_split(ref)) for field, ref in proj.fields.items()])))
            elif name in self._computed:
                self._plan.append((name, _COMPUTED, self._computed[name]))
            elif name in self._aggregates:
                self._plan.append((name, _AGGREGATE, self._aggregates[name]))
            else:
                assert isinstance(proj, str)
                self._plan.append((name, _COLUMN, _split(proj)))
        # Lookup side: rows of a lookup's table by its match columns (unless it is the PK).
        self.match_index: dict[str, ColumnIndex] = {}
        # Parent side: parent rows by the columns a lookup reads (for `current` fan-out).
        self.parent_index: dict[str, ColumnIndex] = {}
        self._indexes_by_table: dict[str, list[ColumnIndex]] = defaultdict(list)
        for lk in job.lookups:
            children = isinstance(lk, Children)
            if children or not self._on_primary_key(lk):
                ix = ColumnIndex(tuple(lk.on.keys()), array=False)
                self.match_index[lk.alias] = ix
                self._indexes_by_table[lk.table].append(ix)
            # A child row's change is its parent's under either semantics: its fact is found
            # through the parent index (under as_of_fact too).
            if job.semantics == "current" or children:
                px = ColumnIndex(tuple(lk.on.values()), array=lk.array)
                self.parent_index[lk.alias] = px
                self._indexes_by_table[job.alias_table(lk.parent).name].append(px)

    # Saved (join/state.py): the rows, the outputs and the indexes over them (one pickle
    # keeps an index shared between match_index or parent_index and _indexes_by_table).
    FIELDS = ("rows", "outputs", "match_index", "parent_index", "_indexes_by_table")

    def state(self) -> dict[str, Any]:
        return save_fields(self, self.FIELDS)

    def restore(self, state: Mapping[str, Any]) -> None:
        restore_fields(self, state, self.FIELDS)
        if any(isinstance(row, dict) for row in self.outputs.values()):
            # A state of version 2 (join/state.py): its outputs are rows.
            self.outputs = {key: self.pack(row) if isinstance(row, dict) else row
                            for key, row in self.outputs.items()}

    def pack(self, row: Row) -> Packed:
        """An output row as the tuple of its values, collected lists as tuples of tuples."""
        values = list(row.values())
        for i, fields in enumerate(self._collected):
            if fields is not None and values[i] is not None:
                values[i] = tuple(tuple(element.values()) for element in values[i])
        return tuple(values)

    def unpack(self, packed: Packed) -> Row:
        """The output row ``pack`` packed."""
        row: Row = {}
        for name, fields, value in zip(self._columns, self._collected, packed, strict=True):
            if fields is not None and value is not None:
                value = [dict(zip(fields, element, strict=True)) for element in value]
            row[name] = value
        return row

    def _on_primary_key(self, lk: Lookup) -> bool:
        return list(lk.on.keys()) == list(self.job.table(lk.table).key)

    # -- applying changes ---------------------------------------------------

    def changing(self, events: Iterable[ChangeEvent]) -> list[ChangeEvent]:
        """The rows among ``events`` (an incremental snapshot's, applied in this order) that
        change what the tables hold: each compared with the row the ones before it leave.
        A row this shard does not hold (metadata only) changes nothing here."""
        left: dict[tuple[str, Key], Row | None] = {}
        out = []
        for event in events:
            if event.after is None:
                continue
            table = self.job.table(event.table)
            where = f"{event.position}:"
            try:
                after = table.convert_row(event.after, where=where, complete=True)
            except JobError as exc:
                raise DecodeError(str(exc).removeprefix(where).strip(),
                                  topic=event.position.topic,
                                  partition=event.position.partition,
                                  offset=event.position.offset) from None
            key = (event.table, table.key_of(after))
            old = left[key] if key in left else self.rows[event.table].get(key[1])
            if old != after:
                out.append(event)
            left[key] = after
        return out

    def apply(self, tx: Transaction, forwarded: Iterable[tuple[str, Key, Row | None]] = (),
              keep: bool = True) -> list[OutputChange]:
        """Apply one complete transaction; return the output changes it causes.
        ``forwarded``: rows of split tables as they are after it (the staged engine's
        owners, ``join/owners.py``): (table, key, row or None when gone); ``keep``: they
        stay (else :meth:`forget` lets them go after it, and neither is journaled)."""
        facts, changed = self._apply_rows(tx)
        journal = self.journal
        if not keep:
            self.journal = None
        try:
            for table, pk, row in forwarded:
                held = self.rows[table].get(pk)
                if held is not None:
                    self._remove(table, pk, held)
                    changed[table].append(held)
                if row is not None:
                    self._put(table, pk, row)
                    changed[table].append(row)
        finally:
            self.journal = journal
        if self.job.semantics == "current":
            facts |= self._affected_facts(changed)
        else:
            facts |= self._parents_of_children(changed)
        out: list[OutputChange] = []
        for key in sorted(facts, key=repr):
            fact_row = self.rows[self.job.fact].get(key)
            new = self.evaluate(fact_row) if fact_row is not None else None
            packed = None if new is None else self.pack(new)
            old = self.outputs.get(key)
            if packed == old:
                continue
            if new is None:
                del self.outputs[key]
                out.append(OutputChange(key, "d", None, tx.commit_seq, tx.xid, tx.commit_ts_ms,
                                        tx.source))
            else:
                self.outputs[key] = packed  # type: ignore[assignment]
                out.append(OutputChange(key, "c" if old is None else "u", new, tx.commit_seq,
                                        tx.xid, tx.commit_ts_ms, tx.source))
        return out

    def forget(self, forwarded: Iterable[tuple[str, Key, Row | None]]) -> None:
        """Let go of rows applied with ``keep=False`` once their release is applied
        (``as_of_fact``: a fact reads a split table's rows only when it changes,
        ``join/placement.py``); the journal never saw them."""
        journal, self.journal = self.journal, None
        try:
            for table, pk, _row in forwarded:
                old = self.rows[table].get(pk)
                if old is not None:
                    self._remove(table, pk, old)
        finally:
            self.journal = journal

    def _apply_rows(self, tx: Transaction) -> tuple[set[Key], dict[str, list[Row]]]:
        """Apply the transaction's row changes: the keys of the fact rows touched, and of
        every other table the row versions touched (old and new)."""
        fact, fact_table = self.job.fact, self.job.table(self.job.fact)
        facts: set[Key] = set()
        changed: dict[str, list[Row]] = defaultdict(list)
        # A transaction is applied once: each event is let go as it is applied (a large
        # one's read back from disk a chunk at a time, sequence/spill.py), so it does not
        # sit in memory beside the rows it becomes; of a fact row only its key is kept.
        events, tx.events = tx.events, []
        for event in drain(events):
            if is_metadata_only(event):
                continue  # counted for completeness; the row lives in another shard
            for table, row in self._apply_event(event):
                if table == fact:
                    facts.add(fact_table.key_of(row))
                else:
                    changed[table].append(row)
        return facts, changed

    def _apply_event(self, event: ChangeEvent) -> Iterable[tuple[str, Row]]:
        """Apply one row change; yield (table, row version) for every version touched."""
        table = self.job.table(event.table)
        rows = self.rows[event.table]
        where = f"{event.position}:"
        if event.op == "t":
            for pk, gone in list(rows.items()):
                self._remove(event.table, pk, gone)
                yield event.table, gone
            return
        try:
            # Only the key of `before` matters: the previous version comes from our state.
            before_key = table.convert_key(event.before, where=where) if event.before else None
            after = (table.convert_row(event.after, where=where, complete=True)
                     if event.after else None)
        except JobError as exc:
            raise DecodeError(str(exc).removeprefix(where).strip(),
                              topic=event.position.topic, partition=event.position.partition,
                              offset=event.position.offset) from None
        if event.op == "d":
            deleted = rows.get(before_key) if before_key is not None else None
            if deleted is not None:
                self._remove(event.table, before_key, deleted)  # type: ignore[arg-type]
                yield event.table, deleted
            return  # deleting a row we never saw: nothing to do
        assert after is not None
        pk = table.key_of(after)
        if before_key is not None and before_key != pk and before_key in rows:
            # Primary-key change inside one event (pgoutput sends d + c, but be safe).
            prev = rows[before_key]
            self._remove(event.table, before_key, prev)
            yield event.table, prev
        if event.after_elsewhere:
            return  # a key change that moves the fact to another shard: that shard inserts it
        old = rows.get(pk)
        new = _merge_unavailable(after, old, event)
        if old is not None:
            self._remove(event.table, pk, old)
            yield event.table, old
        self._put(event.table, pk, new)
        yield event.table, new

    def _put(self, table: str, pk: Key, row: Row) -> None:
        self.rows[table][pk] = row
        for ix in self._indexes_by_table[table]:
            ix.add(pk, row)
        if self.journal is not None:
            self.journal.append((table, pk, row))

    def _remove(self, table: str, pk: Key, row: Row) -> None:
        del self.rows[table][pk]
        for ix in self._indexes_by_table[table]:
            ix.remove(pk, row)
        if self.journal is not None:
            self.journal.append((table, pk, None))

    def replay_journal(self, journal: Iterable[tuple[str, Key, Row | None]],
                       changes: Iterable[OutputChange]) -> None:
        """Re-apply row changes and output changes recorded by an earlier run (see ``journal``).

        Brings a cached or restored shard forward over micro-batches it has
        processed once, without evaluating the join again.
        """
        rows = self.rows
        for table, pk, row in journal:
            old = rows[table].get(pk)
            if old is not None:
                self._remove(table, pk, old)
            if row is not None:
                self._put(table, pk, row)
        for ch in changes:
            if ch.row is None:
                self.outputs.pop(ch.key, None)
            else:
                self.outputs[ch.key] = self.pack(ch.row)

    def _parents_of_children(self, changed: dict[str, list[Row]]) -> set[Key]:
        """Facts a changed child row (its old or new version) references (``as_of_fact``:
        a change to a child row is a change to its fact)."""
        facts: set[Key] = set()
        for lk in self.job.lookups:
            if isinstance(lk, Children):
                index = self.parent_index[lk.alias]
                for row in changed.get(lk.table, ()):
                    facts |= index.get(tuple(row.get(c) for c in lk.on))
        return facts

    def _affected_facts(self, changed: dict[str, list[Row]]) -> set[Key]:
        """Facts whose lookup tree reaches a changed row (``current`` semantics)."""
        facts: set[Key] = set()
        # frontier of (alias, row versions) to propagate towards the fact
        work: list[tuple[str, list[Row]]] = [
            (lk.alias, changed[lk.table]) for lk in self.job.lookups if changed.get(lk.table)]
        seen: set[tuple[str, Key]] = set()
        while work:
            alias, versions = work.pop()
            lk = self.job.lookup(alias)
            parent_table = self.job.alias_table(lk.parent)
            parents: list[Row] = []
            for row in versions:
                value = tuple(row.get(c) for c in lk.on)
                for pk in self.parent_index[alias].get(value):
                    if (lk.parent, pk) in seen:
                        continue
                    seen.add((lk.parent, pk))
                    if lk.parent == self.job.fact_alias:
                        facts.add(pk)
                    else:
                        parents.append(self.rows[parent_table.name][pk])
            if parents:
                work.append((lk.parent, parents))
        return facts

    # -- evaluation ------------------------------------------------------------

    def _match(self, lk: Lookup, values: Key) -> Row | None:
        if None in values:
            return None
        rows = self.rows[lk.table]
        ix = self.match_index.get(lk.alias)
        where = self._lookup_where.get(lk.alias)
        if ix is None:
            row = rows.get(values)
            if row is not None and where is not None and where({lk.alias: row}) is not True:
                return None
            return row
        candidates = [rows[pk] for pk in ix.get(values)]
        if where is not None:
            candidates = [r for r in candidates if where({lk.alias: r}) is True]
        if not candidates:
            return None
        assert lk.pick is not None
        return pick(candidates, lk.pick, self.job.table(lk.table).key)

    def _bind(self, alias: str, row: Row | None, bound: dict[str, Any]) -> bool:
        """Bind the non-array lookups below ``alias``; False if an inner one fails."""
        bound[alias] = row
        for lk, on, listed, inner in self._below[alias]:
            if listed:
                bound[lk.alias] = (self._child_rows(lk, row) if isinstance(lk, Children)
                                   else self._expand(lk, row))
                if inner and not bound[lk.alias]:
                    return False
                continue
            child = None if row is None else self._match(lk, tuple([row.get(c) for c in on]))
            if child is None and inner:
                return False
            if not self._bind(lk.alias, child, bound):
                return False
        return True

    def _expand(self, lk: Lookup, parent: Row | None) -> list[dict[str, Any]]:
        """One binding per array element, in array order (duplicates kept; a distinct
        lookup: each value once, at its first occurrence)."""
        array = None if parent is None else parent.get(next(iter(lk.on.values())))
        elements: list[dict[str, Any]] = []
        for value in lk.elements(array):
            match = self._match(lk, (value,))
            if match is None and lk.how == "inner":
                continue
            bound: dict[str, Any] = {}
            if self._bind(lk.alias, match, bound):
                elements.append(bound)
        return elements

    def _child_rows(self, lk: Children, parent: Row | None) -> list[dict[str, Any]]:
        """One binding per child row referencing ``parent``, in ``order_by`` then key order
        (ascending, NULLs last, as PostgreSQL's ORDER BY); a child whose inner lookup
        finds nothing is no element."""
        if parent is None:
            return []
        values = tuple(parent.get(c) for c in lk.on.values())
        if any(v is None for v in values):
            return []
        rows = self.rows[lk.table]
        children = [rows[pk] for pk in self.match_index[lk.alias].get(values)]
        where = self._lookup_where.get(lk.alias)
        if where is not None:
            children = [r for r in children if where({lk.alias: r}) is True]
        order = (*lk.order_by, *self.job.table(lk.table).key)
        children.sort(key=lambda r: tuple((r.get(c) is None, r.get(c)) for c in order))
        elements: list[dict[str, Any]] = []
        for child in children:
            bound: dict[str, Any] = {}
            if self._bind(lk.alias, child, bound):
                elements.append(bound)
        return elements

    def evaluate(self, fact_row: Row) -> Row | None:
        """The output row for one fact, or None when an inner lookup finds nothing."""
        bound: dict[str, Any] = {}
        if not self._bind(self.job.fact_alias, fact_row, bound):
            return None
        if self._where is not None and self._where(bound) is not True:
            return None  # filtered out: no output row (a delete if it had one)
        if self._nested:
            bound[AGGREGATED] = {key: agg([arg(element) for element in bound[listed]])
                                 for key, (listed, arg, agg) in self._nested.items()}
        if self._having is not None and self._having(bound) is not True:
            return None  # the fact's group fails `having`: no output row, as `where`
        out: Row = {}
        for name, kind, how in self._plan:
            if kind == _COLUMN:
                row = bound.get(how[0])
                out[name] = None if row is None else row.get(how[1])
            elif kind == _COLLECT:
                listed, fields = how
                out[name] = [{field: _value(element, alias, column)
                              for field, alias, column in fields}
                             for element in bound[listed]]
            elif kind == _COMPUTED:
                out[name] = how(bound)
            else:
                listed, arg, agg = how
                elements = bound[listed]
                out[name] = agg([True] * len(elements) if arg is None
                                else [arg(element) for element in elements])
        return out


def pick(candidates: Sequence[Row], rule: Pick, key: Sequence[str]) -> Row:
    """The one match of a many-valued lookup, by PostgreSQL's ``ORDER BY column DESC|ASC
    NULLS LAST, key DESC|ASC LIMIT 1``: the greatest (``max``) or least (``min``) non-NULL
    value, a NULL only when every match has one, ties to the greatest (least) key."""
    valued = [r for r in candidates if r.get(rule.column) is not None]
    if valued:
        def rank(r: Row) -> tuple[Any, ...]:
            return (r[rule.column], *(r.get(k) for k in key))
    else:
        valued = list(candidates)

        def rank(r: Row) -> tuple[Any, ...]:
            return tuple(r.get(k) for k in key)
    return max(valued, key=rank) if rule.order == "max" else min(valued, key=rank)


_COLUMN, _COLLECT, _COMPUTED, _AGGREGATE = range(4)
"""How an output column's value is made (``TemporalJoin._plan``)."""


def _split(ref: str) -> tuple[str, str]:
    """``"alias.column"`` as (alias, column)."""
    alias, column = ref.split(".", 1)
    return alias, column


def _value(bound: dict[str, Any], alias: str, column: str) -> Any:
    row = bound.get(alias)
    return None if row is None else row.get(column)
