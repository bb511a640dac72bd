"""Shard routing: which shards see which decoded record, and in what form.

The join's state and work are split into ``n`` shards by the fact table's key:

- a **fact row** (an order) lives in exactly one shard; a primary-key change
  inside one event goes to the shards of both keys: the one that owns ``before``
  removes it, the one that owns ``after`` inserts it (the first one's copy says
  ``after_elsewhere``);
- rows of **looked-up tables** (clients, pizzas, ...) go to every shard: each
  shard keeps a full copy, so every lookup is local. The cost is memory and
  apply work for those tables times ``n``; fact tables are usually the big ones.
  **Child rows** (``Children``: an order's lines) are broadcast the same way, and each
  shard re-evaluates the parents it owns. Routing a child by its parent's key would need,
  for a line moved to another order, the old order in the line's ``before`` image, which
  an update carries only under REPLICA IDENTITY FULL (and the JVM router would have to
  learn every child table's parent columns);
- **transaction markers** (BEGIN/END), **caught-up markers** and truncates go to
  every shard;
- every shard also receives the **metadata** of each fact event it does not own
  (table, op, xid, LSN, numbering, a digest of the row image, position): the
  event without its rows. So every shard assembles every transaction and
  computes the same frontier, deterministically, from the same input: all shards
  release exactly the same transactions in the same micro-batch, and commit
  order stays global without a separate sequencing stage. A shard takes the
  streaming ones of a batch as columns (:class:`ForeignFacts`), and counts them
  per transaction (``sequence.assembly.FactRun``), not as one event each, unless
  the per-event rules could decide otherwise (a redelivery, a restart).

A shard receives each record as a :class:`Routed` item. Two routers honour this
contract: :class:`Router` here (pure Python, what ``join/sharded.py`` and the
property tests run; a fact key's shard is :func:`shard_of`), and the Spark
pipeline's, which decides the same in the JVM from the raw JSON before any record
reaches Python (``txjoin/join/spark/routing.py``; its own hash of the key's JSON text).
Each is consistent with itself, which is all a run needs: a checkpoint is only
ever continued by the same router.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from txjoin.errors import DecodeError, JobError
from txjoin.ingest.debezium import ChangeEvent, Position, TxMarker
from txjoin.job import Job

Key = tuple[Any, ...]


def shard_of(key: Key, n_shards: int) -> int:
    """The shard that owns fact key ``key`` (stable across processes and runs).

    Python's ``hash`` is salted per process for strings, so a CRC of the key's
    ``repr`` is used: the typed key (ints, strings, Decimals, datetimes) has a
    deterministic ``repr``.
    """
    if n_shards == 1:
        return 0
    return zlib.crc32(repr(key).encode()) % n_shards


def row_digest(event: ChangeEvent) -> bytes:
    """Digest of the row image that identifies an event (see ``ChangeEvent.identity``)."""
    image = event.after if event.after is not None else event.before
    return hashlib.blake2b(repr(image).encode(), digest_size=12).digest()


class ForeignFacts:
    """The streaming events of one table in one micro-batch whose rows are held elsewhere,
    as columns: what an engine counts of them for completeness (a :func:`metadata_only`
    event each, without building one). A shard's are the fact events other shards hold; the
    staged engine's sequencer (``join/staged.py``) gets every table's this way. Rows in any
    order; :meth:`by_xid` puts them in topic order."""

    __slots__ = ("digests", "lsns", "numbers", "offsets", "ops", "partitions", "snapshots",
                 "table", "topics", "ts_ms", "xids")

    def __init__(self, table: str, topics: list[str], partitions: list[int], offsets: list[int],
                 ops: list[str], xids: list[int], lsns: list[int | None],
                 ts_ms: list[int | None], snapshots: list[str | None],
                 numbers: list[int | None], digests: list[bytes]) -> None:
        self.table = table
        self.topics, self.partitions, self.offsets = topics, partitions, offsets
        self.ops, self.xids, self.lsns, self.ts_ms = ops, xids, lsns, ts_ms
        self.snapshots, self.numbers, self.digests = snapshots, numbers, digests

    def __len__(self) -> int:
        return len(self.xids)

    @classmethod
    def of(cls, table: str, events: list[ChangeEvent]) -> ForeignFacts:
        """The columns of :func:`metadata_only` events (the Python router's)."""
        pos = [e.position for e in events]
        return cls(table, [p.topic for p in pos], [p.partition for p in pos],
                   [p.offset for p in pos], [e.op for e in events],
                   [e.xid for e in events],  # type: ignore[misc]
                   [e.lsn for e in events], [e.commit_ts_ms for e in events],
                   [e.snapshot for e in events], [e.data_collection_order for e in events],
                   [e.digest or b"" for e in events])

    def event(self, i: int) -> ChangeEvent:
        """Row ``i`` as the :func:`metadata_only` event it stands for."""
        return ChangeEvent(self.table, self.ops[i], None, None, self.xids[i], self.lsns[i],
                           self.ts_ms[i], self.snapshots[i], self.numbers[i],
                           Position(self.topics[i], self.partitions[i], self.offsets[i]),
                           self.digests[i])

    def identity(self, i: int) -> tuple[Any, ...]:
        """Row ``i``'s ``ChangeEvent.identity``."""
        return (self.table, self.ops[i], self.lsns[i], self.digests[i])

    def by_xid(self) -> dict[int, list[int]]:
        """Row numbers per transaction, each in topic order (by partition and offset)."""
        order = sorted(range(len(self.xids)),
                       key=lambda i: (self.partitions[i], self.offsets[i]))
        groups: dict[int, list[int]] = {}
        xids = self.xids
        for i in order:
            groups.setdefault(xids[i], []).append(i)
        return groups


class Routed(NamedTuple):
    """A record as one shard receives it: the decoded item (a fact event of another shard
    without its rows; or a batch's worth of them as :class:`ForeignFacts`), and the bytes it
    counts against ``--max-transaction-bytes`` (:data:`METADATA_SIZE` per foreign fact)."""

    item: ChangeEvent | TxMarker | ForeignFacts
    size: int


METADATA_SIZE = 64
"""What a metadata-only event counts against ``--max-transaction-bytes`` (about its size
in memory, without rows)."""


def metadata_only(event: ChangeEvent) -> ChangeEvent:
    """``event`` without its rows, for the shards that count it but do not hold it."""
    return event.routed(event.digest, False, rows=False)


def gather_foreign(tables: Iterable[str], routed: list[Routed]) -> list[Routed]:
    """``routed`` with its streaming metadata-only events of each of ``tables`` as one
    :class:`ForeignFacts` a table (in ``tables``' order), as Spark's stages read them
    (``spark/shards.py``): a shard's other shards' facts (``tables``: the fact table), the
    staged engine's sequencer every table's."""
    foreign: dict[str, list[ChangeEvent]] = {table: [] for table in tables}
    rest = []
    for r in routed:
        item = r.item
        if (isinstance(item, ChangeEvent) and item.table in foreign
                and is_metadata_only(item) and not item.is_snapshot and item.xid is not None):
            foreign[item.table].append(item)
        else:
            rest.append(r)
    if len(rest) == len(routed):
        return routed
    return [*rest, *(Routed(ForeignFacts.of(table, events), METADATA_SIZE * len(events))
                     for table, events in foreign.items() if events)]


def is_metadata_only(event: ChangeEvent) -> bool:
    """An event this shard counts for completeness but whose rows it does not hold."""
    return event.before is None and event.after is None and event.op != "t"


class Router:
    """Decides, per decoded record, which shards get it with rows and which without."""

    def __init__(self, job: Job, n_shards: int,
                 place: Callable[[Key, int], int] = shard_of) -> None:
        """``place``: a fact key's shard of ``n_shards`` (:func:`shard_of`; with split tables
        the staged engine's ``placement.fact_shard``)."""
        if n_shards < 1:
            raise ValueError(f"n_shards must be >= 1, got {n_shards}")
        self.job = job
        self.n_shards = n_shards
        self.fact = job.table(job.fact)
        self.place = place

    def route(self, item: ChangeEvent | TxMarker, size: int) -> list[Routed | None]:
        """What each shard receives of a decoded record (``size``: its bytes), by shard;
        ``None``: nothing (a table the job does not read)."""
        if isinstance(item, TxMarker):
            return [Routed(item, size)] * self.n_shards
        if item.table not in self.job.table_names:
            return [None] * self.n_shards
        item = _with_digest(item)
        if self.n_shards == 1 or item.table != self.fact.name or item.op == "t":
            return [Routed(item, size)] * self.n_shards
        before = None if item.before is None else self._shard(item, item.before)
        after = None if item.after is None else self._shard(item, item.after)
        meta = Routed(metadata_only(item), METADATA_SIZE)
        whole = Routed(item, size)
        moved = whole if after is None else Routed(item.routed(item.digest, True), size)
        return [whole if shard == after else moved if shard == before else meta
                for shard in range(self.n_shards)]

    def _shard(self, event: ChangeEvent, row: dict[str, Any]) -> int:
        try:
            key = self.fact.convert_key(row)  # the position goes in DecodeError's own fields
        except JobError as exc:
            raise DecodeError(str(exc).strip(),
                              topic=event.position.topic, partition=event.position.partition,
                              offset=event.position.offset) from None
        return self.place(key, self.n_shards)


def _with_digest(event: ChangeEvent) -> ChangeEvent:
    return event.routed(row_digest(event), event.after_elsewhere)
