"""The shard state layout: an append-only log of micro-batches, compacted now and then.

Per shard, Spark's state store holds (see ``txjoin/join/spark/shards.py`` for the
Spark side; this module only needs the small :class:`BlobStore` interface):

- ``meta``: layout version, shard count, the current ``version`` (micro-batches
  applied) with a ``token`` naming that exact state (chained from the previous
  one, deterministic: see :func:`chain_token`), and where the last snapshot is;
- ``segment v``: what micro-batch ``v`` did (``shard.Effects``: the small
  assembly/frontier state, the snapshot rows and released xids it added, the
  rows it put or removed) and the output changes the shard emitted, plus the
  token of the state it was applied to (``parent``) and of the state it produced.
  It is proportional to the batch, and it is the only thing an
  ordinary micro-batch writes (with the small meta);
- ``snapshot``: the whole pickled shard engine at some version, written only
  when the rows in the segments since the last snapshot outnumber the rows it
  holds (or the segments grow too many), so its cost is amortised over at
  least as many rows of changes; older segments
  and snapshots are then deleted, and the batch that writes it writes no segment.

Values are compressed (lz4) and split into chunks of at most 8 MiB (the JVM's
array limit and the state API's per-message cost both favour small values).

The working engine is cached in the shard's host process (``spark/host.py``)
between micro-batches, but
only as a cache: it is used when its (version, token) equals the meta's; when
it is older, the segments it missed are re-applied (recorded effects: no
decoding, no join evaluation) after checking that each segment's parent token continues the
cache's chain; otherwise (another worker, a restart, a re-run of a batch after a
failure, a newer cached state than the checkpoint's) the shard is restored
exactly from the snapshot and the segments after it. A checkpoint written by
another layout, or with another shard count, is refused with a clear error.
"""

from __future__ import annotations

import gc
import hashlib
import pickle
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from txjoin.errors import RECOVER, ConfigError
from txjoin.job import Job
from txjoin.join.routing import Routed
from txjoin.join.shard import Effects, ShardEngine
from txjoin.join.state import CODEC, SIZE, unpack
from txjoin.join.temporal import OutputChange
from txjoin.sequence.assembly import IncompletePolicy, TopicPartitions

LAYOUT_VERSION = 11
"""1: the whole engine as one pickled value (txjoin 0.1); 2: per-shard log + snapshots;
3: the same, with the engine's state in named fields (``join/state.py``); 4: a segment
carries only the open transactions its batch changed; 5: routed in the JVM (a fact event's
digest and owner come from its JSON text; events say ``after_elsewhere``); 6: the stage
packages (class paths in the saved state moved); 7: of a transaction open before its batch,
a segment carries only the events the batch added (``Assembler.state``), not all of them;
8: other shards' facts are counted per transaction (``assembly.FactRun`` among the events a
segment adds), and an open transaction keeps only the events whose rows its shard holds;
9: the assembly state carries an incremental snapshot's rows not yet released
(``sequence/incremental.py``); 10: an open transaction of more than ``SPILL_EVENTS``
events keeps them in an ``EventLog`` (``sequence/spill.py``), which a snapshot of the
engine carries as its compressed chunks; 11: a snapshot holds the engine's state as a
value pickled into the store as it goes (``state_value``), not as bytes pickled first."""

CONTINUED_LAYOUTS = (6, 7, 8, 9, 10, LAYOUT_VERSION)
"""Layouts this txjoin continues: a layout-6 to -10 log reads as it is (a layout-6
segment carries whole transactions, a layout-7 one every foreign fact as an event; none
before 9 holds incremental snapshot rows, which txjoin before 9 refused; none before 10 an
``EventLog``: its transactions' events are lists, which spill once they grow; a snapshot
before 11 holds the state as bytes) and is layout 11 from its next segment on (a txjoin
before 11 then refuses it in one line)."""

CHUNK_BYTES = 8 << 20
SNAPSHOT_MIN_ROWS = 200_000  # below this, segments are cheap to re-apply: no compaction
MAX_SEGMENTS = 256
SEGMENT, SNAPSHOT = 0, 1  # kinds of log entries
# an entry is ``state.pack``'s form, or its size header says _STREAMED: an LZ4 frame
# written as the value was pickled (size unknown)
_STREAMED = (1 << 64) - 1
_COUNT = struct.Struct("<I")  # chunks of an entry, at the start of its chunk 0


class BlobStore(Protocol):
    """What the log needs from a state store: one meta value and binary entries by key."""

    def get_meta(self) -> dict[str, Any] | None: ...
    def put_meta(self, meta: dict[str, Any]) -> None: ...
    def get(self, kind: int, version: int, chunk: int) -> bytes | None: ...
    def put(self, kind: int, version: int, chunk: int, blob: bytes) -> None: ...
    def clear(self) -> None:
        """Remove every entry (not the meta)."""


class MemoryStore:
    """A :class:`BlobStore` in a dict (tests, and the core replay runner)."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] | None = None
        self.blobs: dict[tuple[int, int, int], bytes] = {}
        self.written = 0

    def get_meta(self) -> dict[str, Any] | None:
        return None if self.meta is None else dict(self.meta)

    def put_meta(self, meta: dict[str, Any]) -> None:
        self.meta = dict(meta)

    def get(self, kind: int, version: int, chunk: int) -> bytes | None:
        return self.blobs.get((kind, version, chunk))

    def put(self, kind: int, version: int, chunk: int, blob: bytes) -> None:
        self.written += len(blob)
        self.blobs[(kind, version, chunk)] = blob

    def clear(self) -> None:
        self.blobs.clear()

    def copy(self) -> MemoryStore:
        """A snapshot of the store (what a checkpoint holds at this point)."""
        other = MemoryStore()
        other.meta = None if self.meta is None else dict(self.meta)
        other.blobs = dict(self.blobs)
        return other


@dataclass
class Segment:
    parent: str
    token: str
    version: int
    effects: Effects
    changes: list[OutputChange]


@dataclass
class BatchResult:
    """What one micro-batch did in one shard."""

    changes: list[OutputChange]
    engine: ShardEngine
    bytes_written: int = 0
    restored: str = "cached"  # cached | caught-up | restored | new
    released: int = 0  # transactions released by this batch
    seconds: dict[str, float] = field(default_factory=dict)


def chain_token(parent: str, version: int) -> str:
    """The token of the state at ``version`` reached from the state named ``parent``.

    Deterministic on purpose: Spark may re-execute a micro-batch after a failure and,
    with RocksDB's changelog checkpointing, combine a snapshot of one attempt with
    changelogs of another. The engine is deterministic (same input, same state), and
    everything this log stores (tokens, compaction decisions) must be too.
    """
    return hashlib.blake2b(f"{parent}|{version}".encode(), digest_size=16).hexdigest()


def engine_rows(engine: ShardEngine) -> int:
    """The shard's size in rows (current rows, outputs, and the snapshot rows and events
    it buffers): a deterministic measure of what a snapshot of it writes."""
    return (sum(len(rows) for rows in engine.join.rows.values()) + len(engine.join.outputs)
            + engine.buffered_rows())


class _Chunks:
    """A file to write a log entry through: its bytes go to the store in chunks of
    ``CHUNK_BYTES`` as they come (chunk 0, which starts with the count, last), so writing
    a large entry holds a chunk of it, not the whole, beside the objects it pickles."""

    closed = False

    def __init__(self, store: BlobStore, kind: int, version: int) -> None:
        self.store, self.kind, self.version = store, kind, version
        self.pending = bytearray()
        self.first: bytes | None = None
        self.count = self.size = 0

    def write(self, data: Any) -> int:
        self.pending += data
        self.size += len(data)
        while len(self.pending) >= CHUNK_BYTES:
            self._emit(bytes(self.pending[:CHUNK_BYTES]))
            del self.pending[:CHUNK_BYTES]
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def _emit(self, part: bytes) -> None:
        if self.count == 0:
            self.first = part
        else:
            self.store.put(self.kind, self.version, self.count, part)
        self.count += 1

    def finish(self) -> int:
        """Put the last chunk, then chunk 0 with the count; the entry's size in bytes."""
        if self.pending or self.count == 0:
            self._emit(bytes(self.pending))
            self.pending = bytearray()
        assert self.first is not None
        self.store.put(self.kind, self.version, 0, _COUNT.pack(self.count) + self.first)
        return self.size


def _unpack(blob: bytes) -> Any:
    """A log entry's value: streamed by :meth:`ShardLog._write`, or (written before
    layout 10) packed whole by ``state.pack``."""
    (size,) = SIZE.unpack_from(blob)
    if size != _STREAMED:
        return unpack(blob)
    body = memoryview(blob)[SIZE.size:]
    # unpickled as it is decompressed: never the whole uncompressed entry in memory
    return pickle.load(pa.CompressedInputStream(pa.BufferReader(body), CODEC))


class ShardLog:
    """Restores, advances and persists one shard's engine in a :class:`BlobStore`."""

    def __init__(self, store: BlobStore, job: Job, shard: int, n_shards: int,
                 policy: IncompletePolicy | None = None, where: str = "",
                 max_transaction_bytes: int | None = None,
                 engine_class: type[ShardEngine] = ShardEngine,
                 layouts: tuple[int, tuple[int, ...]] = (LAYOUT_VERSION, CONTINUED_LAYOUTS)
                 ) -> None:
        """``engine_class``: what the log holds (a :class:`ShardEngine`, or a part of the
        staged engine, ``join/staged.py``, with the same interface); ``layouts``: the layout
        it writes and those it continues."""
        self.engine_class = engine_class
        self.layout, self.continued = layouts
        self.store = store
        self.max_transaction_bytes = max_transaction_bytes
        self.job = job
        self.shard = shard
        self.n_shards = n_shards
        self.policy = policy or IncompletePolicy()
        self.where = where or f"shard {shard}"

    # -- reading -------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        meta = self.store.get_meta()
        if meta is None:
            return {"layout": self.layout, "shards": self.n_shards, "version": 0,
                    "token": "", "snapshot": None, "snapshot_rows": 0, "since_snapshot": 0,
                    "segments": 0}
        if meta.get("layout") not in self.continued:
            raise ConfigError(
                f"{self.where}: the checkpoint's state has layout {meta.get('layout')}, this "
                f"txjoin needs layout {self.layout}; {RECOVER}")
        if meta.get("shards") != self.n_shards:
            raise ConfigError(
                f"{self.where}: the checkpoint was written with --shards {meta.get('shards')}, "
                f"not {self.n_shards}; run with --shards {meta.get('shards')} or start from a "
                f"new checkpoint")
        return meta

    def _read(self, kind: int, version: int) -> Any:
        first = self.store.get(kind, version, 0)
        if first is not None:
            (count,) = _COUNT.unpack_from(first)
            parts = [first[_COUNT.size:]]
            for chunk in range(1, count):
                part = self.store.get(kind, version, chunk)
                if part is None:
                    break
                parts.append(part)
            if len(parts) == count:
                return _unpack(b"".join(parts))
        raise ConfigError(f"{self.where}: the checkpoint's state lacks "
                              f"{'segment' if kind == SEGMENT else 'snapshot'} {version}; it "
                              f"is damaged: start from a new checkpoint and rebuild the sinks")

    def _write(self, kind: int, version: int, obj: Any) -> int:
        """Pickle ``obj`` into the store as entry (kind, version), streamed: LZ4-compressed
        as it is pickled and put in chunks as they fill (:class:`_Chunks`)."""
        chunks = _Chunks(self.store, kind, version)
        chunks.write(SIZE.pack(_STREAMED))
        stream = pa.CompressedOutputStream(pa.PythonFile(chunks, mode="w"), CODEC)
        pickle.Pickler(stream, pickle.HIGHEST_PROTOCOL).dump(obj)
        stream.close()
        return chunks.finish()

    def load(self, cached: ShardEngine | None, meta: dict[str, Any] | None = None
             ) -> tuple[ShardEngine, str]:
        """The engine at the checkpoint's version: the cache if valid, else restored."""
        meta = meta or self._meta()
        version, token = meta["version"], meta["token"]
        cache_version = getattr(cached, "log_version", None)
        if cached is not None and cache_version == version and cached.log_token == token:
            return cached, "cached"
        snap = meta["snapshot"]
        if (cached is not None and cache_version is not None and cache_version < version
                and (snap is None or cache_version >= snap)):
            engine = cached
            if self._advance(engine, cache_version + 1, version, engine.log_token):
                return engine, "caught-up"
        if version == 0:
            return self._new(), "new"
        engine = self._new() if snap is None else self._restore_snapshot(snap)
        start = 1 if snap is None else snap + 1
        if not self._advance(engine, start, version, engine.log_token):
            raise ConfigError(f"{self.where}: the checkpoint's state log is not one chain "
                              f"(segment parents do not match); start from a new checkpoint "
                              f"and rebuild the sinks")
        gc.freeze()  # the restored state lives long: keep the collector off it
        return engine, "restored"

    def _new(self) -> ShardEngine:
        return self.engine_class(self.job, self.shard, self.n_shards, self.policy)

    def _restore_snapshot(self, version: int) -> ShardEngine:
        state = self._read(SNAPSHOT, version)
        if "value" in state:  # layout 11 (the staged engine's 12)
            engine = self.engine_class.from_state_value(
                self.job, state["value"], self.policy, shard=self.shard,
                n_shards=self.n_shards)
        else:  # the engine's state pickled into bytes first
            engine = self.engine_class.from_state(self.job, state["engine"], self.policy,
                                                  shard=self.shard, n_shards=self.n_shards)
        assert isinstance(engine, self.engine_class)
        engine.log_version = version
        engine.log_token = state["token"]
        return engine

    def _advance(self, engine: ShardEngine, first: int, last: int, token: str) -> bool:
        """Re-apply segments ``first..last`` (recorded outputs); False if the chain breaks."""
        for v in range(first, last + 1):
            seg: Segment = self._read(SEGMENT, v)
            if seg.parent != token:
                return False
            engine.apply_effects(seg.effects, seg.changes)
            token = seg.token
            engine.log_version, engine.log_token = v, token
        return True

    # -- one micro-batch -------------------------------------------------------------

    def process(self, cached: ShardEngine | None, records: Sequence[Routed],
                caught_up: Iterable[str], partitions: TopicPartitions | None = None
                ) -> BatchResult:
        """Load (or reuse) the engine, process the batch, persist what it changed."""
        started = time.perf_counter()
        meta = self._meta()
        engine, how = self.load(cached, meta)
        engine.max_transaction_bytes = self.max_transaction_bytes
        loaded = time.perf_counter()
        caught = sorted(caught_up)
        parent = engine.log_token
        # A worker-side cache must not be left half-advanced if processing fails.
        engine.log_version, engine.log_token = -1, "broken"
        released_before = engine.stats.transactions_released
        changes = engine.process_routed(records, caught, partitions)
        released = engine.stats.transactions_released - released_before
        processed = time.perf_counter()
        version = meta["version"] + 1
        token = chain_token(parent, version)
        effects = engine.last_effects
        assert effects is not None
        engine.last_effects = None
        size = len(effects.journal) + len(effects.snapshot_events) + len(changes)
        meta = dict(meta, layout=self.layout, version=version, token=token,
                    segments=meta["segments"] + 1,
                    since_snapshot=meta["since_snapshot"] + size)
        if (meta["since_snapshot"] > max(meta["snapshot_rows"], SNAPSHOT_MIN_ROWS)
                or meta["segments"] > MAX_SEGMENTS):
            # The snapshot at this version replaces every segment up to it, this batch's
            # included: that segment is not written (the batch that releases a large
            # initial snapshot would otherwise pickle its million rows twice).
            del effects
            written = self._compact(engine, meta, version, token)
        else:
            written = self._write(SEGMENT, version, Segment(parent, token, version, effects,
                                                            changes))
        self.store.put_meta(meta)
        engine.log_version, engine.log_token = version, token
        # The engine's time: reading the routed records, sequencing (assembly, commit
        # order, frontier), the join; the first two are what every shard repeats.
        wire, join = engine.batch_wire_s, engine.batch_join_s
        return BatchResult(changes, engine, written, how, released,
                           {"state_load": loaded - started, "read_records": wire,
                            "sequence": max(0.0, processed - loaded - wire - join),
                            "join": join, "state_save": time.perf_counter() - processed})

    def _compact(self, engine: ShardEngine, meta: dict[str, Any], version: int,
                 token: str) -> int:
        """Snapshot at ``version``, replacing the segments and the snapshot it supersedes
        (every entry: the log holds nothing newer). One call clears them: entry by entry
        was a read and a removal per segment, each a round trip to Spark's state store
        (0.3-0.5 s every ``MAX_SEGMENTS`` batches, the slowest batch of a demo). The
        batch's state changes commit together or not at all, so the log is never seen
        cleared without its snapshot."""
        self.store.clear()
        # the engine's state pickled straight into the store, not into bytes first (which
        # held a second, uncompressed copy of the shard beside it: at a large release)
        written = self._write(SNAPSHOT, version, {"value": engine.state_value(),
                                                  "token": token})
        meta.update(snapshot=version, snapshot_rows=engine_rows(engine), since_snapshot=0,
                    segments=0)
        return written
