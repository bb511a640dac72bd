"""The Spark side of the partitioned engine: one stateful shard per key, reading its records once.

The routed rows (``txjoin/join/spark/routing.py``: the JVM decides which shard gets
which record, before any Python) are grouped by shard label and handed to
:class:`ShardProcessor` (``groupBy(shard).transformWithStateInPandas``): one call
per shard per micro-batch. It decodes the records it holds rows for (orjson,
``txjoin/ingest/debezium.py``; errors name topic/partition/offset), builds the
metadata-only events of other shards' facts from their columns
(:func:`routed_items`), and runs its engine. The engine is cached in the shard's
host process (``host.py``; the Python worker itself where hosts are not available)
and kept in Spark's state store as a log of micro-batches (``join/state_log.py``):
a batch writes what it brought, not the state.

Shard labels: Spark hash-partitions the grouping key into
``spark.sql.shuffle.partitions`` partitions; :func:`shard_labels` picks, for
each shard, an integer label that lands in a partition of its own, so ``n``
shards really run as ``n`` parallel tasks.
"""

from __future__ import annotations

import importlib
import json
import pickle
import resource
import time
from collections import OrderedDict
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

from txjoin import crashpoints
from txjoin.errors import DecodeError
from txjoin.ingest.debezium import ChangeEvent, Position, decode
from txjoin.ingest.spark import worker
from txjoin.ingest.spark.kafka import KafkaFacts, task_offset_spans
from txjoin.ingest.spark.markers import is_marker, read_markers
from txjoin.job import Job
from txjoin.join.output import changes_to_table
from txjoin.join.routing import METADATA_SIZE, ForeignFacts, Routed, row_digest
from txjoin.join.shard import long_lived_state
from txjoin.join.spark import host, input_frames
from txjoin.join.state_log import BatchResult, ShardLog, engine_rows
from txjoin.join.temporal import OutputChange
from txjoin.sequence.assembly import IncompletePolicy, TopicPartitions
from txjoin.sinks import tasks

if TYPE_CHECKING:
    # pandas where the shards run, not where the processor is unpickled only: Spark's
    # driver starts a Python process at each query's start to call init() (the state
    # variables' schemas), and pandas was half its imports (issue 34).
    import pandas as pd

# The state variables' schemas, as Spark parses "blob binary" and "kind int, version long,
# chunk int" (what checkpoints hold). Given as types, not DDL text: PySpark sends DDL text
# to the JVM's state server to parse, one round trip per schema in every task.
META_SCHEMA = StructType([StructField("blob", BinaryType())])
LOG_KEY_SCHEMA = StructType([StructField("kind", IntegerType()),
                             StructField("version", LongType()),
                             StructField("chunk", IntegerType())])
LOG_VALUE_SCHEMA = META_SCHEMA

OUTPUT_SCHEMA = "shard int, changes binary, info string"
"""Per shard and batch: its output changes as Arrow IPC streams (``OUTPUT_CHUNK_ROWS`` each at
most), and its progress (JSON) on the first row."""

# A Python worker imports this module to unpickle the processor, before it reads the
# task's rows: from then on they come in frames cut from each Arrow batch, not rebuilt
# row by row (input_frames).
input_frames.install()

# Engines cached in this process (a shard's host, or a Python worker):
# (query token, shard) -> engine. Only a cache
# (state_log.ShardLog validates it against the checkpoint's version and token).
_CACHE: OrderedDict[tuple[str, int], Any] = OrderedDict()
_CACHE_SIZE = 16
# When each was last used: one unused for host.IDLE_S is dropped (its query has ended,
# or moved its shard elsewhere; it would be restored from the log if it came back).
_CACHE_USED: dict[tuple[str, int], float] = {}


def shard_labels(n_shards: int, partitions: int, taken: Collection[int] = ()) -> list[int]:
    """An int label per shard such that the labels hash into distinct shuffle partitions
    (none of ``taken``: another stage's, whose groups pass through this one's).

    Spark's shuffle sends a row to partition ``pmod(hash(key), partitions)``; the hash is
    computed here as Spark computes it (:func:`spark_hash_int`) rather than by a Spark job
    at every query start (0.1-0.2 s warm, more in a new session)."""
    used = set(taken)
    candidates = [label for label in range(0, 64 * max(n_shards, partitions) + len(used))
                  if label not in used]
    labels: dict[int, int] = {}
    for label in candidates:
        labels.setdefault(spark_hash_int(label) % partitions, label)
        if len(labels) == min(n_shards, partitions):
            break
    ordered = [labels[p] for p in sorted(labels)]
    # More shards than partitions: the extra ones share partitions (still correct).
    extra = iter(label for label in candidates if label not in ordered)
    while len(ordered) < n_shards:
        ordered.append(next(extra))
    return ordered


_MASK = 0xFFFFFFFF


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of an int column (Murmur3 x86 32-bit, seed 42: Spark's
    ``Murmur3_x86_32.hashInt``), as a signed 32-bit int."""
    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = _rotl(k1, 15) * 0x1B873593 & _MASK
    h1 = _rotl(seed ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _MASK
    h1 ^= 4  # the input's length in bytes
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def routed_items(job: Job, n_shards: int, frame: pa.Table | pd.DataFrame) -> list[Routed]:
    """A shard's routed rows (``routing.ROUTED_COLUMNS``, without marker rows) -> the
    items its engine takes, each with the bytes it counts.

    A row with bytes is decoded here; a row routing read and left without bytes is an
    event whose rows are held elsewhere (a fact event of another shard; in the staged
    engine's sequencer, every table's): the streaming ones are taken as columns, one
    :class:`~txjoin.join.routing.ForeignFacts` per table (no object per event), a
    snapshot row is built from its columns. A fact event routing could not read but which
    decodes after all is refused: every shard got it whole, and applying it in each would
    apply it ``n`` times.
    """
    fact = job.fact
    out: list[Routed] = []
    table = frame if isinstance(frame, pa.Table) else pa.Table.from_pandas(
        frame, preserve_index=False)
    # routed, no bytes, and not a snapshot row (a row without an op is not one)
    tables = table["tbl"].cast(pa.string())
    foreign = pc.and_(pc.and_(pc.fill_null(table["routed"].cast(pa.bool_()), False),
                              pc.is_null(table["value"])),
                      pc.and_(pc.fill_null(pc.not_equal(table["op"].cast(pa.string()), "r"), True),
                              pc.fill_null(pc.is_in(tables, pa.array(sorted(job.table_names))),
                                           False)))
    if pc.any(foreign).as_py():
        all_theirs = table.filter(foreign)
        table = table.filter(pc.invert(foreign))
        names = tables.filter(foreign)
        for name in sorted(set(names.to_pylist())):  # one ForeignFacts a table, in name order
            theirs = all_theirs.filter(pc.equal(names, name))
            ints = {c: _ints(theirs[c]) for c in ("xid", "lsn", "ts_ms", "dco")}
            facts = ForeignFacts(
                name, theirs["topic"].to_pylist(), theirs["partition"].to_pylist(),
                theirs["offset"].to_pylist(), theirs["op"].to_pylist(),
                ints["xid"], ints["lsn"], ints["ts_ms"],  # type: ignore[arg-type]  # (routed)
                theirs["snapshot"].to_pylist(), ints["dco"], theirs["digest"].to_pylist())
            out.append(Routed(facts, METADATA_SIZE * len(facts)))
    cols = [table[c].to_pylist() for c in ("topic", "partition", "offset", "value", "routed",
                                           "op", "tbl", "xid", "lsn", "ts_ms", "snapshot",
                                           "dco", "digest", "after_elsewhere")]
    for (topic, partition, offset, value, routed, op, tbl, xid, lsn, ts_ms, snapshot, dco,
         digest, elsewhere) in zip(*cols, strict=True):
        pos = Position(topic, int(partition), int(offset))
        if routed and value is None:
            out.append(Routed(ChangeEvent(tbl, op, None, None, _int(xid), _int(lsn),
                                          _int(ts_ms), snapshot, _int(dco), pos, digest),
                              METADATA_SIZE))
            continue
        if value is None:
            continue  # a tombstone
        item = decode(value, pos)
        if item is None:
            continue
        if isinstance(item, ChangeEvent):
            if item.table not in job.table_names:
                continue
            if routed:
                item = item.routed(digest, bool(elsewhere))
            else:
                if n_shards > 1 and item.table == fact and item.op != "t":
                    raise DecodeError(
                        "txjoin's routing could not read this fact event's op, source, "
                        "transaction or key columns, yet it decodes: it would be applied by "
                        "every shard. Run with --shards 1 and report it",
                        topic=topic, partition=int(partition), offset=int(offset))
                item = item.routed(row_digest(item), item.after_elsewhere)
        out.append(Routed(item, len(value)))
    return out


def _ints(column: pa.ChunkedArray | pa.Array) -> list[int | None]:
    """A column of decimal text (routing's integers, :func:`_int`) as Python integers, cast
    by Arrow (a Python ``int`` per value was a fifth of the staged sequencer's decoding)."""
    try:
        return column.cast(pa.int64()).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # beyond 64 bits: Python's ints
        return list(map(_int, column.to_pylist()))


def _int(value: str | None) -> int | None:
    """An integer routing sent as decimal text (pandas would make nullable integers floats)."""
    return None if value is None else int(value)


class _SparkBlobStore:
    """``state_log.BlobStore`` over a ValueState (meta) and a MapState (log entries)."""

    def __init__(self, meta: Any, log: Any) -> None:
        self.meta_state = meta
        self.log = log
        self.written = 0

    def get_meta(self) -> dict[str, Any] | None:
        if not self.meta_state.exists():  # (a get would log a warning on a new shard)
            return None
        value = self.meta_state.get()
        return None if value is None else pickle.loads(value[0])

    def put_meta(self, meta: dict[str, Any]) -> None:
        blob = pickle.dumps(meta)
        self.written += len(blob)
        self.meta_state.update((blob,))

    def get(self, kind: int, version: int, chunk: int) -> bytes | None:
        value = self.log.getValue((kind, version, chunk))
        return None if value is None else bytes(value[0])

    def put(self, kind: int, version: int, chunk: int, blob: bytes) -> None:
        self.written += len(blob)
        self.log.updateValue((kind, version, chunk), (blob,))

    def clear(self) -> None:
        self.log.clear()


class ShardProcessor(StatefulProcessor):
    """One shard: restore or reuse its engine, process the batch, log it, emit changes."""

    def __init__(self, job: Job, labels: Sequence[int], policy: IncompletePolicy,
                 prefix: str | Mapping[str, str], query_token: str,
                 kafka_facts: KafkaFacts | None = None,
                 max_transaction_bytes: int | None = None) -> None:
        self.job = job
        self.labels = list(labels)
        self.policy = policy
        # topic -> stream name (a table, or a source's transaction stream) for caught-up markers
        self.streams = job.streams(prefix if isinstance(prefix, str) else dict(prefix))
        self.query_token = query_token
        # Spark's kafka source sends no marker rows: what they would say comes from here.
        self.kafka_facts = kafka_facts
        self.max_transaction_bytes = max_transaction_bytes

    def init(self, handle: StatefulProcessorHandle) -> None:
        worker.settle()
        meta = handle.getValueState("meta", META_SCHEMA)
        log = handle.getMapState("log", LOG_KEY_SCHEMA, LOG_VALUE_SCHEMA)
        self.store = _SparkBlobStore(meta, log)
        self._spec: bytes | None = None
        self.offset_spans: dict[str, int] | None = None  # this batch's (run_batch)
        # this batch's TASK_SINKS_PROPERTY (run_batch), decoded where the output is written
        self.task_sinks: str | None = None

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: Any) -> Iterator[pd.DataFrame]:
        started = time.perf_counter()
        frames = [f for f in rows if len(f)]
        if not self.runs(int(key[0])):
            yield from frames  # another stage's group (join/spark/staged.py)
            return
        if not frames:
            return
        import pandas as pd

        frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        shard = self.host(key)
        # tests only (txjoin.crashpoints): the host has no task context to tell the batch
        batch = crashpoints.task_batch_id() if crashpoints.armed(*crashpoints.EXECUTOR_POINTS) \
            else None
        # the offsets the batch was planned over, under a read limit (the host has no task
        # context either)
        spans = task_offset_spans() if self.kafka_facts is not None and \
            self.kafka_facts.max_events is not None else None
        # Arrow, not pandas, to the engine: a shard's host then never imports pandas
        # (1.4 s of CPU at each host's start here), and the rows travel as buffers; and
        # the sinks' stages of the batch, which the shard writes its output into
        request = (self.spec(), shard, pa.Table.from_pandas(frame, preserve_index=False),
                   started, batch, spans, tasks.task_value())
        if not host.available():
            for columns in run_batch(request, self.store):
                yield pd.DataFrame(columns)
            return
        with host.connect(self.host_process(shard)) as conn:
            # each output row on to Spark as the host sends it (host._serve)
            for columns in host.serve_batch(conn, request, self.store):
                yield pd.DataFrame(columns)

    def spec(self) -> bytes:
        """The processor's fields, pickled once: what a request carries, and what
        :func:`run_batch` rebuilds the processor from in a shard's host."""
        spec: bytes | None = getattr(self, "_spec", None)
        if spec is None:
            spec = self._spec = cloudpickle.dumps(
                (type(self), {k: v for k, v in vars(self).items()
                              if k not in ("store", "_spec", "offset_spans",
                                           "task_sinks")}))
        return spec

    def host(self, key: Any) -> int:
        """The number of this group's engine (the shard's): its cache key, and its batches'."""
        return self.labels.index(int(key[0]))

    def runs(self, label: int) -> bool:
        """Whether this stage runs the group ``label``'s batches (else it passes its rows
        through as they came: a later stage's)."""
        return True

    def host_process(self, number: int) -> int:
        """The host process that runs engine ``number``'s batches (``host.connect``)."""
        return number

    def handle(self, shard: int, frame: pa.Table, started: float) -> dict[str, list[Any]]:
        """Run one batch of the shard on its engine (cached in this process): the output
        frame's columns (:func:`changes_columns`)."""
        # This process's CPU over the batch: in a shard's host, the shard's own (the host
        # serves one shard); the shard sweep of `txjoin bench` compares it across shards.
        cpu_started = time.process_time()
        caught, partitions, records = self.batch_facts(frame)
        read_started = time.perf_counter()
        items = routed_items(self.job, len(self.labels), records)
        read_s = time.perf_counter() - read_started
        cached = self.cached(shard)
        self.store.written = 0
        log = ShardLog(self.store, self.job, shard, len(self.labels), self.policy,
                       where=f"shard {shard} of {len(self.labels)}",
                       max_transaction_bytes=self.max_transaction_bytes)
        result = log.process(cached, items, caught, partitions)
        engine = result.engine
        self.keep(shard, engine)
        result.seconds["read_records"] += read_s
        info = {"shard": shard,
                "records": int(pc.sum(records["counted"].cast(pa.int64())).as_py() or 0),
                "commit_seq": engine.commit_seq, "snapshot_done": engine.snapshot_done,
                "snapshot_released": engine.snapshot_released, "waiting": engine.waiting,
                "released": result.released, "duplicates": engine.duplicates,
                "skipped": engine.skipped, "snapshot_rows": engine.batch_snapshot_rows,
                **self.task_figures(result, started, cpu_started)}
        return self.output(shard, result.changes, info)

    def output(self, shard: int, changes: list[OutputChange], info: dict[str, Any]
               ) -> dict[str, list[Any]]:
        """The shard's output rows of the batch (:func:`changes_columns`). In a batch whose
        sinks are written from the tasks (``txjoin.sinks.tasks``), its changes are written
        into their stages here, as part ``shard``, and only what it wrote goes on to the
        driver in its progress (the changes too if a sink needs them there)."""
        sinks = None if self.task_sinks is None else tasks.decode(self.task_sinks)
        # typed a chunk at a time: a release's ~1M changes are never all dicts at once
        table = pa.concat_tables(
            [changes_to_table(self.job, changes[start:start + OUTPUT_CHUNK_ROWS])
             for start in range(0, max(len(changes), 1), OUTPUT_CHUNK_ROWS)])
        if sinks is None:
            return changes_columns(shard, table, info)
        info[tasks.PART_KEY] = tasks.write_part(sinks, shard, table)
        return changes_columns(shard, table if sinks.keep_rows else None, info)

    def task_figures(self, result: BatchResult, started: float, cpu_started: float
                     ) -> dict[str, Any]:
        """What a task reports of its batch whatever its stage: how its state was loaded,
        the bytes it wrote, the rows its state holds, its process's peak RSS, its stages'
        seconds and its CPU seconds (``merge_infos``: ``per_shard``)."""
        return {"state": result.restored, "state_bytes_written": self.store.written,
                "state_rows": engine_rows(result.engine),
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                "seconds": {**result.seconds, "total": time.perf_counter() - started},
                "cpu_seconds": time.process_time() - cpu_started}

    def cached(self, number: int) -> Any:
        """This query's engine of shard ``number`` cached in this process (None: none),
        taken out of the cache."""
        cache: OrderedDict[tuple[str, int], Any] = importlib.import_module(__name__)._CACHE
        return cache.pop((self.query_token, number), None)

    def keep(self, number: int, engine: Any) -> None:
        """Cache ``engine`` as this query's shard ``number``; drop engines unused for
        ``host.IDLE_S`` or past ``_CACHE_SIZE``."""
        cache: OrderedDict[tuple[str, int], Any] = importlib.import_module(__name__)._CACHE
        cache_key = (self.query_token, number)
        cache[cache_key] = engine
        now = time.monotonic()
        _CACHE_USED[cache_key] = now
        for key in list(cache):
            if len(cache) > _CACHE_SIZE or now - _CACHE_USED.get(key, now) > host.IDLE_S:
                del cache[key]
                _CACHE_USED.pop(key, None)

    def batch_facts(self, frame: pa.Table) -> tuple[set[str], TopicPartitions | None, pa.Table]:
        """What the batch says of its topics (the streams read to their end, partitioned
        topics: ``Engine.process``) and its records (without marker rows)."""
        markers = is_marker(frame["offset"])
        if self.kafka_facts is None:
            marker_rows = frame.filter(markers)
            caught, partitions = read_markers(
                zip(marker_rows["topic"].to_pylist(), marker_rows["partition"].to_pylist(),
                    marker_rows["offset"].to_pylist(), strict=True), self.streams)
        else:
            spans = self.offset_spans
            if self.kafka_facts.max_events is not None and spans is None:
                raise RuntimeError("the micro-batch's planned offsets did not reach the shard")
            caught, partitions = self._kafka_facts(self.kafka_facts, spans or {})
        return caught, partitions, frame.filter(pc.invert(markers))

    def _kafka_facts(self, facts: KafkaFacts, spans: Mapping[str, int]
                     ) -> tuple[set[str], TopicPartitions | None]:
        """The same, for Spark's kafka source: ``spans`` (topic -> offsets the batch was
        planned over, from the driver: ``kafka.batch_offset_spans``) tells which sources
        the read limit cut short (``KafkaFacts.caught_up``)."""
        topics = facts.caught_up(spans)
        caught = {s for t, s in self.streams.items() if t in topics}
        several = {t: n for t, n in facts.several().items() if t in self.streams}
        if not several:
            return caught, None
        parts = {self.streams[t]: frozenset(range(n)) for t, n in several.items() if t in topics}
        return caught, TopicPartitions({self.streams[t]: n for t, n in several.items()}, parts)

    def close(self) -> None:
        pass


def run_batch(request: tuple[bytes, int, pa.Table, float, int | None,
                             dict[str, int] | None, str | None],
              store: Any, settle: bool = True) -> list[dict[str, list[Any]]]:
    """Run a shard's batch in this process (a Python worker, or the shard's host):
    ``request`` is what :meth:`ShardProcessor.handleInputRows` sends (then the
    micro-batch, known only when a crash point needs it, the offsets it was planned
    over, under a read limit, and the sinks' stages it writes its output into:
    ``txjoin.sinks.tasks``), ``store`` the shard's state store (Spark's, or the task's
    over the host's connection). ``settle=False``: the caller calls
    ``shard.settle_state()`` once it has sent the output (a host)."""
    spec, shard, frame, started, batch, spans, sinks = request
    crashpoints.shard_batch(batch)
    processor = _PROCESSORS.get(spec)
    if processor is None:
        cls, fields = pickle.loads(spec)
        processor = cls.__new__(cls)
        vars(processor).update(fields)
        _PROCESSORS.clear()
        _PROCESSORS[spec] = processor
    processor.store = store
    processor.offset_spans = spans
    processor.task_sinks = sinks
    with long_lived_state(settle):
        return [processor.handle(shard, frame, started)]


# The processor of the last request run in this process, by its pickled fields.
_PROCESSORS: dict[bytes, ShardProcessor] = {}


OUTPUT_CHUNK_ROWS = 50_000
"""Output changes per output row at most. One row of a shard's whole output grew past
the driver's default 1 GB heap when a batch released a 1M-order snapshot (Spark grows
a row's buffer by doubling, then copies it into Arrow): Java heap space in
``collectAsArrowToPython``, and a row cannot pass 2 GB at all. 50k changes are a few MB."""


def changes_columns(shard: int, table: pa.Table | None, info: dict[str, Any]
                    ) -> dict[str, list[Any]]:
    """The shard's output rows, by column (``OUTPUT_SCHEMA``; no pandas: a shard's host
    builds them): its changes (``join.output.changes_to_table``, typed on the executor; None:
    they stay here) as Arrow IPC streams of at most ``OUTPUT_CHUNK_ROWS`` each, in order;
    the first row carries its progress."""
    blobs: list[bytes | None] = []
    rows = 0 if table is None else table.num_rows
    for start in range(0, rows, OUTPUT_CHUNK_ROWS):
        assert table is not None
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(start, OUTPUT_CHUNK_ROWS))
        blobs.append(sink.getvalue().to_pybytes())
    blobs = blobs or [None]
    infos = [json.dumps(info)] + [None] * (len(blobs) - 1)
    return {"shard": [shard] * len(blobs), "changes": blobs, "info": infos}
