"""Where each looked-up table's rows live in the staged engine: copied or split (issue 65).

A **copied** table is what the staged engine has always done: every shard receives every
row of it and holds a full copy. A **split** table's rows are held once, by the *owner*
of their key (``owner_of``: a CRC32 of the key's text), in an owner stage before the shards
(``join/owners.py``), which sends a shard the rows its facts read:

- ``as_of_fact``: a fact reads them only when it changes, so an owner sends the rows a
  release's changed facts read, for that release alone; the shard lets them go after it
  and holds nothing of a split table;
- ``current``: a shard keeps the rows its facts read, its *replica*: an owner sends a shard
  a row when one of the shard's facts first references it (a *subscription*) and every
  later change of it. Subscriptions are never withdrawn (Debezium's update events carry
  no ``before`` image without REPLICA IDENTITY FULL, so a fact's old reference is not
  known where the owner is): a replica holds every row any of its facts ever referenced.

What can be split, today: a lookup on its table's whole primary key (``on`` names the key
columns, in order; ``=``/``= ANY`` lookups of the key) of integer, text or uuid columns
(:data:`KEY_KINDS`), of a table no other alias reads, whose parent is the fact or another
split alias, in a job whose fact key is of those kinds too. With a split, a fact's shard is
:func:`owner_of` its key as well (``fact_shard``): an owner tells which shard reads a row
from the fact row alone, and the JVM places a fact by the same hash of its JSON text. A
split table's rows are then found by key: the owner of a row is the owner of the value a
parent reads. A lookup on other columns (``Pick``),
``Children``, and everything below a copied alias stay copied (a shard needs every row
below a copied row it holds). Each split alias has a *depth*: 1 below the fact, one more
per split parent; an owner stage serves the aliases of one depth, and a depth's
subscriptions come from the one above (the fact's events for depth 1).
"""

from __future__ import annotations

import dataclasses
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from txjoin.errors import JobError
from txjoin.ingest.types import UNAVAILABLE, column_kind
from txjoin.job import Children, Job, Lookup

Key = tuple[Any, ...]

KEY_KINDS = frozenset({"smallint", "int", "bigint", "text", "uuid"})
"""The column kinds a split table's key may have (``ingest.types.column_kind``): those whose
typed value's text is the text of its JSON value, so the JVM can place a record by the same
hash as :func:`owner_of` without typing it."""


SPLIT_ALL = "all"
"""``--split all``: every lookup :func:`splittable` names."""


def parse_split(text: str) -> tuple[str, ...]:
    """``--split``'s value: lookup aliases, comma-separated (or :data:`SPLIT_ALL`)."""
    return tuple(a.strip() for a in text.split(",") if a.strip())


def owner_of(key: Key, n: int) -> int:
    """The owner of a split table's row with key ``key`` among ``n`` owners: a CRC32 of the
    values' text (joined by U+001F), which Spark computes alike from the JSON text
    (``pmod(crc32(CAST(concat_ws(...) AS BINARY)), n)``)."""
    if n == 1:
        return 0
    return zlib.crc32("\x1f".join(map(str, key)).encode()) % n


def fact_shard(key: Key, n: int) -> int:
    """A fact key's shard when the job has split tables (the staged engine's router and
    the owners'; Spark's routing computes the same from the JSON text)."""
    return owner_of(key, n)


def _typer(column_type: str) -> Callable[[str], Any]:
    """A :data:`KEY_KINDS` value from its JSON text, as the column's reader types it."""
    kind = column_kind(column_type)[0]
    if kind in ("smallint", "int", "bigint"):
        return int
    if kind == "uuid":
        return lambda text: str(uuid.UUID(text))
    return str


def _kinds_fit(types: Iterable[str]) -> bool:
    try:
        return all(column_kind(t)[0] in KEY_KINDS for t in types)
    except ValueError:
        return False


def _key_kinds_fit(job: Job, lk: Lookup) -> bool:
    """Whether the lookup's key columns, and the parent columns that read them, are of
    :data:`KEY_KINDS` (an array's elements: of its element type)."""
    parent = job.alias_table(lk.parent)
    types = [job.table(lk.table).columns[c] for c in lk.on]
    types += [parent.columns[c].removesuffix("[]") for c in lk.on.values()]
    return _kinds_fit(types)


class Forward(NamedTuple):
    """A split table's row for shard ``shard``'s replica, as it is after the batch's release
    number ``release`` (None: the row is gone)."""

    shard: int
    release: int
    table: str
    key: Key
    row: dict[str, Any] | None


class FactReads(NamedTuple):
    """A streaming fact event as what the depth-1 owners need of it: its transaction, its
    shard and the keys its row reads, (alias, key), of the split tables below the fact
    (Spark's routing extracts them from the JSON text: a depth-1 owner never decodes a
    streaming fact record)."""

    table: str
    xid: int
    shard: int
    reads: tuple[tuple[str, Key], ...]


class Subscribe(NamedTuple):
    """Shards ``shards`` read alias ``alias``'s row ``key`` from the batch's release number
    ``release`` on: to the owner of ``key`` in the stage of ``alias``'s depth."""

    release: int
    alias: str
    key: Key
    shards: tuple[int, ...]


class CorrectionChanged(NamedTuple):
    """The batch's release number ``release`` (a correction) changed a split table's row."""

    release: int


def splittable(job: Job) -> list[str]:
    """The aliases that may be split, parents before children (module docstring)."""
    fact = job.table(job.fact)
    if not _kinds_fit(fact.columns[c] for c in fact.key):
        return []
    readers: dict[str, int] = {}
    for lk in job.lookups:
        readers[lk.table] = readers.get(lk.table, 0) + 1
    out: list[str] = []
    for lk in job.lookups:  # a parent is declared before its lookups (Job validates it)
        if (isinstance(lk, Children) or lk.pick is not None or lk.table == job.fact
                or readers[lk.table] > 1
                or list(lk.on) != list(job.table(lk.table).key)
                or not _key_kinds_fit(job, lk)
                or (lk.parent != job.fact_alias and lk.parent not in out)):
            continue
        out.append(lk.alias)
    return out


class Placement:
    """Which aliases of ``job`` are split, and what the owners need to know of them."""

    def __init__(self, job: Job, split: Iterable[str] = ()) -> None:
        self.job = job
        wanted = set(split)
        possible = splittable(job)
        unknown = wanted - {lk.alias for lk in job.lookups}
        if unknown:
            raise JobError(f"job {job.name}: no lookup named {sorted(unknown)} to split")
        # an alias below a copied one stays copied: keep only those whose parents are split
        self.split: list[str] = []
        for alias in possible:
            lk = job.lookup(alias)
            if alias in wanted and (lk.parent == job.fact_alias or lk.parent in self.split):
                self.split.append(alias)
        self.depth: dict[str, int] = {}
        for alias in self.split:
            parent = job.lookup(alias).parent
            self.depth[alias] = 1 if parent == job.fact_alias else self.depth[parent] + 1
        self.depths = max(self.depth.values(), default=0)
        # ``current``: a shard keeps the rows its facts read (a change of one re-evaluates
        # them); ``as_of_fact``: a fact reads them only when it changes, so an owner sends
        # them for that release alone and the shard lets them go after it
        self.persistent = job.semantics == "current"
        self.table_alias: dict[str, str] = {job.lookup(a).table: a for a in self.split}
        # split aliases by depth, and the split lookups below each (split) alias
        self.at_depth: dict[int, list[str]] = {d: [a for a in self.split
                                                   if self.depth[a] == d]
                                               for d in range(1, self.depths + 1)}
        self.below: dict[str, list[Lookup]] = {
            parent: [lk for lk in job.lookups if lk.alias in self.depth
                     and lk.parent == parent] for parent in [job.fact_alias, *self.split]}

        # what an owner reads of a fact row: its key and the columns split lookups read
        fact = job.table(job.fact)
        read = {*fact.key, *(c for lk in self.below[job.fact_alias] for c in lk.on.values())}
        self._fact_read = dataclasses.replace(
            fact, columns={c: t for c, t in fact.columns.items() if c in read},
            defaults={c: v for c, v in fact.defaults.items() if c in read})
        # a read column's value (an array's element) from its JSON text, as it is typed
        self._typers = {c: _typer(fact.columns[c].removesuffix("[]")) for c in read
                        if self.split}

    def fact_reads(self, raw: dict[str, Any], where: str = ""
                   ) -> tuple[Key, list[tuple[str, Key]]]:
        """A fact row's (Debezium's JSON row) key and what it reads of the depth-1 split
        tables, (alias, key), from only the columns that say so, typed (the rest is the
        shard's to read); a :class:`JobError` if they cannot be read."""
        read = self._fact_read
        row = read.convert_row({c: raw[c] for c in read.columns if c in raw}, where=where)
        return read.key_of(row), [(lk.alias, key) for lk in self.below[self.job.fact_alias]
                                  for key in self.references(lk, row)]

    def compact(self, event: Any, n: int) -> FactReads | None:
        """A streaming fact event (a ``ChangeEvent`` with an ``after`` row and an xid) as
        :class:`FactReads` for ``n`` shards; None if its row cannot be read (its shard
        stops the job on it)."""
        try:
            key, reads = self.fact_reads(event.after)
        except JobError:
            return None
        return FactReads(event.table, event.xid, fact_shard(key, n), tuple(reads))

    def typed_reads(self, texts: Iterable[tuple[str, list[str]]]) -> list[tuple[str, Key]]:
        """What Spark's routing extracted of a fact row (per depth-1 alias, the text of each
        key it reads) typed as :meth:`fact_reads` types them; a :class:`JobError` if a text
        is not a value of its column."""
        out = []
        for alias, values in texts:
            lk = self.job.lookup(alias)
            columns = list(lk.on.values())
            if any(v == UNAVAILABLE for v in values):
                continue
            try:
                out.append((alias, tuple(self._typers[c](v) for c, v in zip(
                    columns[:1] * len(values) if lk.array else columns, values, strict=True))))
            except ValueError as exc:
                raise JobError(f"job {self.job.name}: {alias}'s key {values!r}: {exc}") from None
        return out

    def __bool__(self) -> bool:
        return bool(self.split)

    def is_split(self, table: str) -> bool:
        return table in self.table_alias

    def references(self, lk: Lookup, row: dict[str, Any] | None) -> Iterator[Key]:
        """The keys of ``lk``'s table a parent row (converted) reads: one, or an array's
        elements; none for a NULL (nothing matches it)."""
        if row is None:
            return
        if lk.array:
            column = next(iter(lk.on.values()))
            for value in lk.elements(row.get(column)):
                if value is not None and value != UNAVAILABLE:
                    yield (value,)
            return
        values = tuple(row.get(c) for c in lk.on.values())
        if not any(v is None or v == UNAVAILABLE for v in values):
            yield values
