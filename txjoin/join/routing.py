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
  order stays global without a separate sequencing stage.

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
from typing import Any, NamedTuple

from txjoin.errors import DecodeError, JobError
from txjoin.ingest.debezium import ChangeEvent, TxMarker
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


class Routed(NamedTuple):
    """A record as one shard receives it: the decoded item (a fact event of another shard
    without its rows), and the bytes it counts against ``--max-transaction-bytes``."""

    item: ChangeEvent | TxMarker
    size: int


METADATA_SIZE = 64
"""What a metadata-only event counts against ``--max-transaction-bytes`` (about its size
in memory, without rows)."""


def metadata_only(event: ChangeEvent) -> ChangeEvent:
    """``event`` without its rows, for the shards that count it but do not hold it."""
    return event.routed(event.digest, False, rows=False)


def is_metadata_only(event: ChangeEvent) -> bool:
    """An event this shard counts for completeness but whose rows it does not hold."""
    return event.before is None and event.after is None and event.op != "t"


class Router:
    """Decides, per decoded record, which shards get it with rows and which without."""

    def __init__(self, job: Job, n_shards: int) -> None:
        if n_shards < 1:
            raise ValueError(f"n_shards must be >= 1, got {n_shards}")
        self.job = job
        self.n_shards = n_shards
        self.fact = job.table(job.fact)

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
        return shard_of(key, self.n_shards)


def _with_digest(event: ChangeEvent) -> ChangeEvent:
    return event.routed(row_digest(event), event.after_elsewhere)
