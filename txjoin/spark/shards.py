"""The Spark side of the partitioned engine: decode on the executors, one stateful shard per key.

Two stages, both run where the data is:

1. :func:`make_decoder` (``mapInArrow``, before any shuffle, in parallel per
   source partition): Debezium JSON -> events and markers (orjson), routed to
   shards (``core/routing.py``) as small pickled records. Decode errors name
   topic/partition/offset.
2. :class:`ShardProcessor` (``groupBy(shard).transformWithStateInPandas``):
   one call per shard per micro-batch; the shard's engine is cached in the
   Python worker and kept in Spark's state store as a log of micro-batches
   (``core/state_log.py``): a batch writes what it brought, not the state.

Shard labels: Spark hash-partitions the grouping key into
``spark.sql.shuffle.partitions`` partitions; :func:`shard_labels` picks, for
each shard, an integer label that lands in a partition of its own, so ``n``
shards really run as ``n`` parallel tasks.
"""

from __future__ import annotations

import gc
import importlib
import json
import pickle
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark import Accumulator
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from txjoin.core.assembly import IncompletePolicy, TopicPartitions
from txjoin.core.join import OutputChange
from txjoin.core.output import changes_to_table
from txjoin.core.routing import Router
from txjoin.core.shard import ShardEngine
from txjoin.core.state_log import ShardLog
from txjoin.debezium import Position, decode
from txjoin.job import Job
from txjoin.spark.sources.kafka import KafkaFacts
from txjoin.spark.sources.markers import (
    CAUGHT_UP_OFFSET,
    PARTITION_CAUGHT_UP_OFFSET,
    PARTITIONS_OFFSET,
)

ROUTED_SCHEMA = "shard int, topic string, partition int, offset long, wire binary, counted boolean"
ROUTED_ARROW = pa.schema([("shard", pa.int32()), ("topic", pa.string()),
                          ("partition", pa.int32()), ("offset", pa.int64()),
                          ("wire", pa.binary()), ("counted", pa.bool_())])
OUTPUT_SCHEMA = "shard int, changes binary, info string"
"""Per shard and batch: its output changes as an Arrow IPC stream, and its progress (JSON)."""

# Engines cached in this Python worker: (query token, shard) -> engine. Only a cache
# (state_log.ShardLog validates it against the checkpoint's version and token).
_CACHE: OrderedDict[tuple[str, int], ShardEngine] = OrderedDict()
_CACHE_SIZE = 16


def shard_labels(spark: SparkSession, n_shards: int, partitions: int) -> list[int]:
    """An int label per shard such that the labels hash into distinct shuffle partitions."""
    from pyspark.sql import functions as F

    rows = (spark.range(0, 64 * max(n_shards, partitions))
            .select(F.col("id").cast("int").alias("label"),
                    F.expr(f"pmod(hash(cast(id as int)), {partitions})").alias("part"))
            .collect())
    labels: dict[int, int] = {}
    for row in rows:
        labels.setdefault(row["part"], row["label"])
        if len(labels) == min(n_shards, partitions):
            break
    ordered = [labels[p] for p in sorted(labels)]
    # More shards than partitions: the extra ones share partitions (still correct).
    extra = iter(r["label"] for r in rows if r["label"] not in ordered)
    while len(ordered) < n_shards:
        ordered.append(next(extra))
    return ordered


def make_decoder(job: Job, labels: Sequence[int], timer: Accumulator[float] | None = None
                 ) -> Any:
    """The ``mapInArrow`` function: source rows -> routed rows (``ROUTED_SCHEMA``).

    ``timer``: a Spark accumulator the decoding adds its seconds to (summed over tasks).
    """
    router = Router(job, len(labels))
    all_labels = list(labels)

    def decode_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            started = time.perf_counter()
            routed = _route(batch)
            if timer is not None:
                timer.add(time.perf_counter() - started)
            yield routed

    def _route(batch: pa.RecordBatch) -> pa.RecordBatch:
        out = _Routed()
        cols = batch.to_pydict()
        for topic, partition, offset, value in zip(cols["topic"], cols["partition"],
                                                   cols["offset"], cols["value"],
                                                   strict=True):
            if offset < 0:  # caught-up or partitions marker: every shard
                for label in all_labels:
                    out.emit(label, topic, partition, offset, None, False)
                continue
            item = decode(value, Position(topic, partition, offset))
            owners, wire, meta = (set(), b"", None) if item is None else router.route(item)
            if not owners:  # a tombstone, or a table the job does not read: every
                # shard sees it (so each counts the batch's records), one counts it
                for i, label in enumerate(all_labels):
                    out.emit(label, topic, partition, offset, None, i == 0)
                continue
            first = min(owners)
            for i, label in enumerate(all_labels):
                if i in owners:
                    out.emit(label, topic, partition, offset, wire, i == first)
                else:
                    out.emit(label, topic, partition, offset, meta, False)
        return out.batch()

    return decode_batches


class _Routed:
    """Columns of routed rows being built."""

    def __init__(self) -> None:
        self.shards: list[int] = []
        self.topics: list[str] = []
        self.parts: list[int] = []
        self.offsets: list[int] = []
        self.wires: list[bytes | None] = []
        self.counted: list[bool] = []

    def emit(self, shard: int, topic: str, partition: int, offset: int, wire: bytes | None,
             counted: bool) -> None:
        self.shards.append(shard)
        self.topics.append(topic)
        self.parts.append(partition)
        self.offsets.append(offset)
        self.wires.append(wire)
        self.counted.append(counted)

    def batch(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [pa.array(self.shards, pa.int32()), pa.array(self.topics, pa.string()),
             pa.array(self.parts, pa.int32()), pa.array(self.offsets, pa.int64()),
             pa.array(self.wires, pa.binary()), pa.array(self.counted, pa.bool_())],
            schema=ROUTED_ARROW)


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

    def remove(self, kind: int, version: int, chunk: int) -> None:
        self.log.removeKey((kind, version, chunk))


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
        meta = handle.getValueState("meta", "blob binary")
        log = handle.getMapState("log", "kind int, version long, chunk int", "blob binary")
        self.store = _SparkBlobStore(meta, log)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: Any) -> Iterator[pd.DataFrame]:
        started = time.perf_counter()
        # The shard's state is millions of long-lived objects: keep the cyclic collector
        # from walking it during the batch, collect only what this batch allocated, then
        # move the survivors out of the collector's generations (gc.freeze).
        gc.disable()
        try:
            yield from self._handle(key, rows, started)
        finally:
            gc.collect(1)
            gc.freeze()
            gc.enable()

    def _handle(self, key: Any, rows: Iterator[pd.DataFrame], started: float
                ) -> Iterator[pd.DataFrame]:
        shard = self.labels.index(int(key[0]))
        frames = [f for f in rows if len(f)]
        if not frames:
            return
        frame = pd.concat(frames, ignore_index=True)
        markers = frame["offset"] < 0
        if self.kafka_facts is None:
            caught, partitions = self._markers(frame.loc[markers])
        else:
            caught, partitions = self._kafka_facts(self.kafka_facts, int((~markers).sum()))
        wires = [w for w in frame.loc[~markers, "wire"] if w is not None]
        cache: OrderedDict[tuple[str, int], ShardEngine] = importlib.import_module(
            __name__)._CACHE
        cache_key = (self.query_token, shard)
        cached = cache.pop(cache_key, None)
        self.store.written = 0
        log = ShardLog(self.store, self.job, shard, len(self.labels), self.policy,
                       where=f"shard {shard} of {len(self.labels)}",
                       max_transaction_bytes=self.max_transaction_bytes)
        result = log.process(cached, wires, caught, partitions)
        engine = result.engine
        cache[cache_key] = engine
        while len(cache) > _CACHE_SIZE:
            cache.popitem(last=False)
        info = {"shard": shard, "records": int(frame.loc[~markers, "counted"].sum()),
                "commit_seq": engine.commit_seq, "snapshot_done": engine.snapshot_done,
                "snapshot_released": engine.snapshot_released, "waiting": engine.waiting,
                "released": result.released, "duplicates": engine.duplicates,
                "skipped": engine.skipped, "state": result.restored,
                "state_bytes_written": self.store.written,
                "snapshot_rows": engine.batch_snapshot_rows,
                "seconds": {**result.seconds, "total": time.perf_counter() - started}}
        yield changes_frame(self.job, shard, result.changes, info)

    def _markers(self, markers: pd.DataFrame) -> tuple[set[str], TopicPartitions | None]:
        """What the source's marker rows say: the streams read to their end, and the
        topics with several partitions (counts, partitions read to their end)."""
        caught: set[str] = set()
        counts: dict[str, int] = {}
        parts: dict[str, set[int]] = {}
        for topic, partition, offset in zip(markers["topic"], markers["partition"],
                                            markers["offset"], strict=True):
            stream = self.streams.get(topic)
            if stream is None:
                continue
            if offset == CAUGHT_UP_OFFSET:
                caught.add(stream)
            elif offset == PARTITIONS_OFFSET:
                counts[stream] = int(partition)
            elif offset == PARTITION_CAUGHT_UP_OFFSET:
                parts.setdefault(stream, set()).add(int(partition))
        if not counts:
            return caught, None
        return caught, TopicPartitions(counts, {t: frozenset(p) for t, p in parts.items()})

    def _kafka_facts(self, facts: KafkaFacts, records: int
                     ) -> tuple[set[str], TopicPartitions | None]:
        """The same, for Spark's kafka source: every shard sees every record of the batch
        once, so ``records`` is the batch's size, which tells whether the read limit cut
        it short (``KafkaFacts.caught_up``)."""
        caught_up = facts.caught_up(records)
        caught = {s for t, s in self.streams.items() if t in facts.partitions} \
            if caught_up else set()
        several = {self.streams[t]: n for t, n in facts.several().items() if t in self.streams}
        if not several:
            return caught, None
        parts = {s: frozenset(range(n)) for s, n in several.items()} if caught_up else {}
        return caught, TopicPartitions(several, parts)

    def close(self) -> None:
        pass


def changes_frame(job: Job, shard: int, changes: list[OutputChange],
                  info: dict[str, Any]) -> pd.DataFrame:
    """The shard's output row: its changes as an Arrow table (typed here, on the executor)."""
    blob = None
    if changes:
        table = changes_to_table(job, changes)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        blob = sink.getvalue().to_pybytes()
    return pd.DataFrame({"shard": [shard], "changes": [blob], "info": [json.dumps(info)]})
