"""Shard routing: which shards see which decoded record, and in what form.

The join's state and work are split into ``n`` shards by the fact table's key:

- a **fact row** (an order) lives in exactly one shard, ``shard_of(key, n)``; a
  primary-key change inside one event goes to the shards of both keys (each
  keeps only the side it owns);
- rows of **looked-up tables** (clients, pizzas, ...) go to every shard: each
  shard keeps a full copy, so every lookup is local. The cost is memory and
  apply work for those tables times ``n``; fact tables are usually the big ones;
- **transaction markers** (BEGIN/END), **caught-up markers** and truncates go to
  every shard;
- every shard also receives the **metadata** of each fact event it does not own
  (table, op, xid, LSN, numbering, a digest of the row image, position): the
  events without their rows. So every shard assembles every transaction and
  computes the same frontier, deterministically, from the same input: all shards
  release exactly the same transactions in the same micro-batch, and commit
  order stays global without a separate sequencing stage.

Records travel between the decode stage and the shards as small pickled tuples
(:func:`to_wire` / :func:`from_wire`), produced once per record on the executors.
"""

from __future__ import annotations

import hashlib
import pickle
import zlib
from typing import Any

from txjoin.debezium import ChangeEvent, Position, TxMarker
from txjoin.errors import DecodeError, JobError
from txjoin.job import Job

Key = tuple[Any, ...]
_PICKLE = pickle.HIGHEST_PROTOCOL


def shard_of(key: Key, n_shards: int) -> int:
    """The shard that owns fact key ``key`` (stable across processes and runs).

    Python's ``hash`` is salted per process for strings, so a CRC of the key's
    ``repr`` is used: the typed key (ints, strings, Decimals, datetimes) has a
    deterministic ``repr``.
    """
    if n_shards == 1:
        return 0
    return zlib.crc32(repr(key).encode()) % n_shards


class ShardOwnership:
    """``owns(key)``: whether a fact key belongs to this shard (picklable, unlike a lambda)."""

    def __init__(self, shard: int, n_shards: int) -> None:
        self.shard = shard
        self.n_shards = n_shards

    def __call__(self, key: Key) -> bool:
        return shard_of(key, self.n_shards) == self.shard


def row_digest(event: ChangeEvent) -> bytes:
    """Digest of the row image that identifies an event (see ``ChangeEvent.identity``)."""
    image = event.after if event.after is not None else event.before
    return hashlib.blake2b(repr(image).encode(), digest_size=12).digest()


def to_wire(item: ChangeEvent | TxMarker, *, with_rows: bool = True) -> bytes:
    """A decoded record as bytes for the shuffle (``with_rows=False``: metadata only)."""
    pos = item.position
    if isinstance(item, TxMarker):
        return pickle.dumps(("m", item.status, item.xid, item.id, item.commit_lsn,
                             item.event_count, item.counts, item.ts_ms, pos.topic,
                             pos.partition, pos.offset), _PICKLE)
    return pickle.dumps(("e", item.table, item.op,
                         item.before if with_rows else None, item.after if with_rows else None,
                         item.xid, item.lsn, item.commit_ts_ms, item.snapshot,
                         item.data_collection_order, pos.topic, pos.partition, pos.offset,
                         item.digest), _PICKLE)


def from_wire(blob: bytes) -> ChangeEvent | TxMarker:
    t = pickle.loads(blob)
    if t[0] == "m":
        return TxMarker(t[1], t[2], t[3], t[4], t[5], t[6], t[7], Position(t[8], t[9], t[10]))
    return ChangeEvent(t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9],
                       Position(t[10], t[11], t[12]), t[13])


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
        self.everyone = list(range(n_shards))

    def owners(self, event: ChangeEvent) -> set[int]:
        """Shards that hold this event's rows."""
        if self.n_shards == 1 or event.table != self.fact.name or event.op == "t":
            return set(self.everyone)
        owners = set()
        where = f"{event.position}:"
        try:
            for row in (event.before, event.after):
                if row is not None:
                    owners.add(shard_of(self.fact.convert_key(row, where=where), self.n_shards))
        except JobError as exc:
            raise DecodeError(str(exc).removeprefix(where).strip(),
                              topic=event.position.topic, partition=event.position.partition,
                              offset=event.position.offset) from None
        return owners

    def route(self, item: ChangeEvent | TxMarker) -> tuple[set[int], bytes, bytes | None]:
        """(owner shards, record with rows, metadata-only record for the other shards or None).

        The counted shard (lowest owner) is the one that counts the record in
        the statistics, so that a record replicated to several shards is counted once.
        """
        if isinstance(item, TxMarker):
            return set(self.everyone), to_wire(item), None
        if item.table not in self.job.table_names:
            return set(), b"", None
        if self.n_shards > 1 or item.digest is None:
            item = _with_digest(item)
        owners = self.owners(item)
        meta = None if len(owners) == self.n_shards else to_wire(item, with_rows=False)
        return owners, to_wire(item), meta


def _with_digest(event: ChangeEvent) -> ChangeEvent:
    return ChangeEvent(event.table, event.op, event.before, event.after, event.xid, event.lsn,
                       event.commit_ts_ms, event.snapshot, event.data_collection_order,
                       event.position, row_digest(event))
