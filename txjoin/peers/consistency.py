"""Inconsistent observable states: an output changelog replayed against the committed prefixes.

Number the source transactions T1..Tn in commit order. A state a reader can
observe in a system's output is *consistent* when it equals the oracle's output
after some committed prefix T1..Tk (k = 0: the snapshot; the empty output before
anything was read counts too). Replaying the system's changelog in emission
order and checking the materialized result after each observation point counts
the points where it equals no prefix: torn transactions, lookup races,
retraction gaps.

Comparing whole tables at every point would be quadratic, so every state is
reduced to a multiset hash (the sum of 128-bit row hashes modulo 2**128),
maintained incrementally: a change adds or subtracts one row hash. The oracle's
side (``PrefixStates``) is the serial oracle of ``txjoin.join.oracle`` with
indexed lookups and incremental re-evaluation, so thousands of transactions
take seconds: in ``as_of_fact`` only the facts a transaction touched are
re-evaluated (what the oracle does), in ``current`` also every fact whose
evaluation looked up a row the transaction changed (tracked per looked-up key).

``current`` has a quadratic fan-out: a pizza's price change rewrites every order
that contains it (Flink emits a retraction and an insertion for each). Comparing
with such a system uses ``GroupedPrefixStates`` and ``grouped_row_hash``: a row
hashes to ``g(row without its collected list) * (C + sum of e(element))`` modulo
a prime, so a changed element moves the state hash by
``(e(new) - e(old)) * G[element key]`` with ``G`` maintained per looked-up key,
without visiting the orders. (With at most one row per output key, as both
oracle and a materialized changelog have, distinct states collide with
probability ~2/P.) Element order is not part of this hash.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from txjoin.errors import ConfigError
from txjoin.job import Collect, Job, Lookup
from txjoin.join.oracle import Oracle, Row, SourceTransaction

MOD = 1 << 128
PRIME = (1 << 127) - 1  # modulus of the grouped hash (a Mersenne prime)


def canonical(value: Any, ordered: bool = True) -> Any:
    """A JSON-able canonical form: numbers as normalized decimal strings (8, 8.0 and
    Decimal("8.00") are one value: systems print decimals differently);
    lists of rows sorted when ``ordered`` is False (for systems whose array
    aggregation has no defined order)."""
    if isinstance(value, Mapping):
        return {str(k): canonical(v, ordered) for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [canonical(v, ordered) for v in value]
        if not ordered:
            items.sort(key=lambda v: json.dumps(v, sort_keys=True))
        return items
    if isinstance(value, Decimal | float | int) and not isinstance(value, bool):
        return str(Decimal(str(value)).normalize())
    return value


def row_hash(row: Mapping[str, Any], ordered: bool = True) -> int:
    """128-bit hash of a canonical output row (key and value columns, no metadata)."""
    text = json.dumps(canonical(row, ordered), sort_keys=True, default=str)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=16).digest(), "big")


def value_hash(value: Any) -> int:
    """A value's hash modulo ``PRIME`` (canonical form, lists as multisets)."""
    text = json.dumps(canonical(value, ordered=False), sort_keys=True, default=str)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=16).digest(),
                          "big") % PRIME


ROW_CONSTANT = value_hash("txjoin.grouped_row")


def grouped_row_hash(row: Mapping[str, Any], collected: str) -> int:
    """``g(row minus the list column) * (C + sum of e(element))`` modulo ``PRIME``."""
    base = {k: v for k, v in row.items() if k != collected}
    elements = sum(value_hash(e) for e in row[collected] or ())
    return value_hash(base) * (ROW_CONSTANT + elements) % PRIME


class PrefixStates(Oracle):
    """The oracle with primary-key lookups from dicts; hashes the output after each prefix."""

    def __init__(self, job: Job, ordered: bool = True) -> None:
        super().__init__(job)
        for lk in job.lookups:
            if lk.pick is not None or set(lk.on) != set(job.table(lk.table).key):
                raise ConfigError(f"peer comparison: lookup {lk.alias!r} is not by the primary "
                                  f"key of {lk.table}; only key lookups are indexed")
        self.ordered = ordered
        self.rows: dict[str, dict[tuple[Any, ...], Row]] = {t: {} for t in job.table_names}
        self.hash = 0
        self._row_hashes: dict[tuple[Any, ...], int] = {}
        self._evaluating: tuple[Any, ...] | None = None
        self._deps: dict[tuple[str, tuple[Any, ...]], set[tuple[Any, ...]]] = {}
        self._uses: dict[tuple[Any, ...], set[tuple[str, tuple[Any, ...]]]] = {}

    def _pk(self, table: str, row: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(row.get(k) for k in self.job.table(table).key)

    def _find(self, lk: Lookup, parent: Row | None, value: Any = None) -> Row | None:
        if parent is None:
            return None
        wanted = {mine: (value if lk.array else parent.get(theirs))
                  for mine, theirs in lk.on.items()}
        if any(v is None for v in wanted.values()):
            return None
        key = self._pk(lk.table, wanted)
        if self._evaluating is not None:
            self._deps.setdefault((lk.table, key), set()).add(self._evaluating)
            self._uses.setdefault(self._evaluating, set()).add((lk.table, key))
        return self.rows[lk.table].get(key)

    def _set_output(self, out_key: tuple[Any, ...], row: Row | None) -> None:
        old = self._row_hashes.pop(out_key, None)
        if old is not None:
            self.hash = (self.hash - old) % MOD
            self.output.pop(out_key, None)
        if row is not None:
            h = row_hash(row, self.ordered)
            self._row_hashes[out_key] = h
            self.hash = (self.hash + h) % MOD
            self.output[out_key] = row

    def _reevaluate(self, fact_key: tuple[Any, ...]) -> None:
        """Evaluate the fact with primary key ``fact_key`` again (gone: its output goes)."""
        for dep in self._uses.pop(fact_key, set()):
            users = self._deps.get(dep)
            if users is not None:
                users.discard(fact_key)
        fact = self.rows[self.job.fact].get(fact_key)
        if fact is None:
            self._set_output(self._out_key(self._fact_stub(fact_key)), None)
            return
        self._evaluating = fact_key
        try:
            self._set_output(self._out_key(fact), self.evaluate(fact))
        finally:
            self._evaluating = None

    def _fact_stub(self, fact_key: tuple[Any, ...]) -> Row:
        return dict(zip(self.job.table(self.job.fact).key, fact_key, strict=True))

    def load_snapshot(self, rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        """S_0: the snapshot's rows, every fact evaluated."""
        for table, table_rows in rows.items():
            for r in table_rows:
                typed = self._typed(table, r)
                self.rows[table][self._pk(table, typed)] = typed
        for key in list(self.rows[self.job.fact]):
            self._reevaluate(key)

    def apply(self, tx: SourceTransaction) -> None:
        """Apply one transaction; re-evaluate the facts whose output it can change."""
        affected: set[tuple[Any, ...]] = set()
        fact = self.job.fact
        for change in tx.changes:
            if change.table not in self.rows:
                continue
            typed = self._typed(change.table, change.row)
            key = self._pk(change.table, typed)
            self.rows[change.table].pop(key, None)
            if change.op != "delete":
                self.rows[change.table][key] = typed
            if change.table == fact:
                affected.add(key)
            elif self.job.semantics == "current":
                affected.update(self._deps.get((change.table, key), ()))
        for key in sorted(affected, key=repr):
            self._reevaluate(key)


class GroupedPrefixStates(PrefixStates):
    """``current`` semantics hashed with ``grouped_row_hash``: element changes cost O(1).

    Needs one ``Collect`` column over an array lookup from the fact table into a
    table looked up by key with nothing below it (the pizzas of ``jobs/orders.py``).
    """

    def __init__(self, job: Job) -> None:
        super().__init__(replace(job, semantics="current"), ordered=False)
        collects = [(name, p) for name, p in job.output.columns.items()
                    if isinstance(p, Collect)]
        if len(collects) != 1:
            raise ConfigError("grouped prefix states need exactly one Collect column")
        self.collected, collect = collects[0]
        (lookup,) = [lk for lk in job.lookups if lk.alias == collect.alias]
        if not lookup.array or lookup.distinct or lookup.parent != job.fact_alias or any(
                lk.parent == lookup.alias for lk in job.lookups):
            raise ConfigError(f"grouped prefix states: {lookup.alias!r} must be an array lookup "
                              "(not distinct) from the fact table with no lookups below it")
        self.element_table = lookup.table
        self.array_column = next(iter(lookup.on.values()))
        self.element_fields = {f: ref.split(".", 1)[1] for f, ref in collect.fields.items()}
        self.element_hash: dict[tuple[Any, ...], int] = {}
        self.weight: dict[tuple[Any, ...], int] = {}  # G: sum of g(fact) * count in it
        self.parts: dict[tuple[Any, ...], tuple[int, Counter[tuple[Any, ...]]]] = {}

    def _element(self, key: tuple[Any, ...]) -> int | None:
        row = self.rows[self.element_table].get(key)
        if row is None:
            return None
        h = self.element_hash.get(key)
        if h is None:
            h = self.element_hash[key] = value_hash({f: row.get(c)
                                             for f, c in self.element_fields.items()})
        return h

    def _remove(self, fact_key: tuple[Any, ...]) -> None:
        for dep in self._uses.pop(fact_key, set()):
            users = self._deps.get(dep)
            if users is not None:
                users.discard(fact_key)
        part = self.parts.pop(fact_key, None)
        if part is None:
            return
        g, counts = part
        total = ROW_CONSTANT
        for key, n in counts.items():
            total += n * (self._element(key) or 0)
            self.weight[key] = (self.weight[key] - g * n) % PRIME
        self.hash = (self.hash - g * total) % PRIME

    def _add(self, fact_key: tuple[Any, ...]) -> None:
        fact = self.rows[self.job.fact].get(fact_key)
        if fact is None:
            return
        self._evaluating = fact_key
        try:
            row = self.evaluate(fact)
        finally:
            self._evaluating = None
        if row is None:
            return
        g = value_hash({k: v for k, v in row.items() if k != self.collected})
        table = self.rows[self.element_table]
        counts = Counter(k for k in ((v,) for v in fact.get(self.array_column) or ())
                         if k in table)
        total = ROW_CONSTANT
        for key, n in counts.items():
            total += n * (self._element(key) or 0)
            self.weight[key] = (self.weight.get(key, 0) + g * n) % PRIME
        self.hash = (self.hash + g * total) % PRIME
        self.parts[fact_key] = (g, counts)

    def _reevaluate(self, fact_key: tuple[Any, ...]) -> None:
        self._remove(fact_key)
        self._add(fact_key)

    def apply(self, tx: SourceTransaction) -> None:
        """Facts touched, or looking up a changed row, leave before the change and come
        back after the transaction; an updated element moves the hash in one step."""
        pending: set[tuple[Any, ...]] = set()
        for change in tx.changes:
            if change.table not in self.rows:
                continue
            typed = self._typed(change.table, change.row)
            key = self._pk(change.table, typed)
            rows = self.rows[change.table]
            if (change.table == self.element_table and change.op != "delete"
                    and key in rows):
                old = self._element(key)
                rows[key] = typed
                self.element_hash.pop(key, None)
                new = self._element(key)
                assert old is not None and new is not None
                self.hash = (self.hash + self.weight.get(key, 0) * (new - old)) % PRIME
                continue
            if change.table == self.job.fact:
                leaving = {key}
            else:
                leaving = set(self._deps.get((change.table, key), ()))
            for fact_key in leaving - pending:
                self._remove(fact_key)
            pending |= leaving
            rows.pop(key, None)
            self.element_hash.pop(key, None)
            if change.op != "delete":
                rows[key] = typed
        for fact_key in sorted(pending, key=repr):
            self._add(fact_key)


def grouped_prefix_hashes(job: Job, snapshot: Mapping[str, Sequence[Mapping[str, Any]]],
                          transactions: Iterable[SourceTransaction]) -> list[int]:
    """``grouped_row_hash`` state of the ``current`` output after the snapshot and each tx."""
    states = GroupedPrefixStates(job)
    states.load_snapshot(snapshot)
    hashes = [states.hash]
    for tx in transactions:
        states.apply(tx)
        hashes.append(states.hash)
    return hashes


def prefix_hashes(job: Job, snapshot: Mapping[str, Sequence[Mapping[str, Any]]],
                  transactions: Iterable[SourceTransaction], ordered: bool = True,
                  semantics: str | None = None) -> list[int]:
    """Hash of the oracle's output after the snapshot and after each transaction."""
    if semantics is not None and semantics != job.semantics:
        job = replace(job, semantics=semantics)  # type: ignore[arg-type]
    states = PrefixStates(job, ordered)
    states.load_snapshot(snapshot)
    hashes = [states.hash]
    for tx in transactions:
        states.apply(tx)
        hashes.append(states.hash)
    return hashes


@dataclass
class Observation:
    """A changelog replayed against the prefixes."""

    observed_states: int = 0
    inconsistent_states: int = 0
    final_hash: int = 0
    furthest_prefix: int = -1  # the highest k whose state was observed

    def final_equals(self, hashes: Sequence[int]) -> bool:
        """Whether the last observed state is the output after the last transaction."""
        return self.final_hash == hashes[-1]


class ChangelogReplay:
    """Materializes a changelog (as a multiset of rows) and checks each observed state."""

    def __init__(self, hashes: Sequence[int], ordered: bool = True,
                 hasher: Callable[[Mapping[str, Any]], int] | None = None,
                 modulus: int = MOD) -> None:
        self.allowed: dict[int, int] = {0: -1}  # the empty output before anything was read
        for k, h in enumerate(hashes):
            self.allowed[h] = k
        self.hasher = hasher or (lambda row: row_hash(row, ordered))
        self.modulus = modulus
        self.hash = 0
        self.result = Observation()

    def add(self, row: Mapping[str, Any]) -> None:
        """An insert (+I/+U) of ``row`` into the materialized result."""
        self.hash = (self.hash + self.hasher(row)) % self.modulus

    def retract(self, row: Mapping[str, Any]) -> None:
        """A retraction (-U/-D) of ``row``."""
        self.hash = (self.hash - self.hasher(row)) % self.modulus

    def observe(self) -> None:
        """A point where a reader can see the materialized result."""
        self.result.observed_states += 1
        k = self.allowed.get(self.hash)
        if k is None:
            self.result.inconsistent_states += 1
        else:
            self.result.furthest_prefix = max(self.result.furthest_prefix, k)
        self.result.final_hash = self.hash
