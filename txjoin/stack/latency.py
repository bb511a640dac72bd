"""Where a change's time goes, from its source commit to each sink (``txjoin demo``).

The demo times every change from its source commit to each sink's commit. This module
splits that time into its legs, for each change:

- ``debezium``: source commit -> Debezium processed the transaction (the envelope's
  ``ts_ms``: the WAL read, ``poll.interval.ms``);
- ``to_kafka``: -> the transaction's last record (a data event or its END marker) is in
  Kafka (the record's timestamp: Connect's producer batching and the broker's append);
- ``wait_for_batch``: -> the micro-batch that read it started (the trigger interval, and
  the batch before it still running);
- the batch, until its output reached the sinks, in three: ``batch_spark`` (Spark's part
  of computing it: planning, reading the topics, routing, the shuffle, the state store,
  handing rows to and from the shards' Python), ``batch_shards`` (the slowest shard's
  Python: decoding, sequencing, the join, its state) and ``batch_output`` (decoding the
  shards' output, the lineage);
- ``sink``: -> PostgreSQL committed it. For Delta: ``handed_off`` (-> PostgreSQL's commit
  of the batch, after which the batch hands its output off durably), ``wait_for_commit``
  (-> the group commit holding it started: the commit interval, or the commit before it)
  and ``commit`` (the group commit itself). Delta's legs are timed only beside a
  PostgreSQL sink (the demo's jobs have both).

The first two legs come from :class:`CaptureTimes`, a consumer reading the job's topics
beside the pipeline; the others from the pipeline's batch reports and sink commits. All
clocks are this machine's.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from txjoin.sinks.handoff import GroupCommit

UPSTREAM_LEGS = ("debezium", "to_kafka", "wait_for_batch", "batch_spark", "batch_shards",
                 "batch_output")
POSTGRES_LEGS = (*UPSTREAM_LEGS, "sink")
DELTA_LEGS = (*UPSTREAM_LEGS, "handed_off", "wait_for_commit", "commit")


@dataclass
class _Tx:
    commit_ms: int | None = None
    debezium_ms: int = 0
    kafka_ms: int = 0


class CaptureTimes(threading.Thread):
    """Reads ``topics`` (table topics and the transaction topic) from ``since_ms`` on and
    keeps, per source commit time (ms), when Debezium processed its transactions and when
    their last record reached Kafka (the latest over the transactions committed in that
    millisecond)."""

    def __init__(self, bootstrap_servers: str, table_topics: Sequence[str],
                 transaction_topic: str, since_ms: int) -> None:
        super().__init__(name="txjoin-capture-times", daemon=True)
        self.bootstrap_servers = bootstrap_servers
        self.table_topics = list(table_topics)
        self.transaction_topic = transaction_topic
        self.since_ms = since_ms
        self._txs: dict[str, _Tx] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.ready = threading.Event()  # assigned and positioned: safe to start writing
        self.error: Exception | None = None

    def run(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        try:
            consumer = Consumer({"bootstrap.servers": self.bootstrap_servers,
                                 "group.id": "txjoin-demo-capture-times",
                                 "enable.auto.commit": False})
        except Exception as exc:  # the figures are optional: the demo goes on without them
            self.error = exc
            self.ready.set()
            return
        try:
            topics = [*self.table_topics, self.transaction_topic]
            metadata = consumer.list_topics(timeout=10).topics
            wanted = [TopicPartition(t, p, self.since_ms) for t in topics if t in metadata
                      for p in metadata[t].partitions]
            positions = consumer.offsets_for_times(wanted, timeout=10)
            for tp in positions:  # nothing at or after since_ms yet: from the end, now
                if tp.offset < 0:
                    tp.offset = consumer.get_watermark_offsets(tp, timeout=10)[1]
            consumer.assign(positions)
            self.ready.set()
            while not self._stopping.is_set():
                for msg in consumer.consume(2000, 0.2):
                    value, topic = msg.value(), msg.topic()
                    if msg.error() is None and value is not None and topic is not None:
                        self._record(topic, json.loads(value), msg.timestamp()[1])
        except Exception as exc:
            self.error = exc
        finally:
            self.ready.set()
            consumer.close()

    def _record(self, topic: str, value: Any, kafka_ms: int) -> None:
        if not isinstance(value, dict):
            return
        if topic == self.transaction_topic:
            if value.get("status") != "END":
                return
            txid = str(value.get("id", "")).split(":", 1)[0]
            debezium_ms, commit_ms = 0, None
        else:
            source = value.get("source") or {}
            txid = str(source.get("txId"))
            debezium_ms, commit_ms = int(value.get("ts_ms") or 0), source.get("ts_ms")
        with self._lock:
            tx = self._txs.setdefault(txid, _Tx())
            tx.kafka_ms = max(tx.kafka_ms, kafka_ms)
            tx.debezium_ms = max(tx.debezium_ms, debezium_ms)
            if commit_ms is not None:
                tx.commit_ms = int(commit_ms)

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=10)

    def by_commit_ms(self) -> dict[int, tuple[int, int]]:
        """Source commit time (ms) -> (Debezium processed, last record in Kafka), ms."""
        out: dict[int, tuple[int, int]] = {}
        with self._lock:
            for tx in self._txs.values():
                if tx.commit_ms is None or not tx.debezium_ms:
                    continue
                seen = out.get(tx.commit_ms, (0, 0))
                out[tx.commit_ms] = (max(seen[0], tx.debezium_ms), max(seen[1], tx.kafka_ms))
        return out


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Legs:
    """Each change's legs (ms) for one sink, and its whole commit-to-sink time."""

    names: tuple[str, ...]
    totals: list[float] = field(default_factory=list)
    legs: list[tuple[float, ...]] = field(default_factory=list)

    def add(self, total: float, legs: Iterable[float]) -> None:
        self.totals.append(total)
        self.legs.append(tuple(legs))

    def summary(self) -> dict[str, Any]:
        """Per leg: p50, p99 and its mean over the slowest 1% of changes (what makes up the
        p99 of the whole); the whole's p50/p99 and the changes timed."""
        if not self.totals:
            return {"changes": 0}
        order = sorted(range(len(self.totals)), key=lambda i: self.totals[i])
        slowest = order[min(len(order) - 1, int(0.99 * len(order))):]

        out: dict[str, Any] = {"changes": len(self.totals),
                               "total": {"p50": percentile(self.totals, 50),
                                         "p99": percentile(self.totals, 99)}}
        for i, name in enumerate(self.names):
            values = [legs[i] for legs in self.legs]
            out[name] = {"p50": percentile(values, 50), "p99": percentile(values, 99),
                         "slowest_1pct_mean": sum(self.legs[j][i] for j in slowest)
                         / len(slowest)}
        return out


def legs_per_sink(captured: dict[int, tuple[int, int]],
                  batches: dict[int, tuple[float, float, float]],
                  commits: Sequence[GroupCommit]) -> dict[str, Legs]:
    """Each timed change's legs per sink, from the capture times (``CaptureTimes``), each
    micro-batch's times by batch id (when it started, unix s; the seconds of computing it
    and of its slowest shard: the report's ``compute`` and ``shard_total``) and the sinks'
    commits (``postgres`` per batch, ``delta`` per group: see the module docstring). A
    change whose capture or batch is unknown is left out."""
    out = {"postgres": Legs(POSTGRES_LEGS), "delta": Legs(DELTA_LEGS)}
    # The legs of a change up to its batch's output reaching the sinks, from the batch that
    # committed it to PostgreSQL, and when that commit started and finished (unix ms): the
    # batch hands its output to Delta right after it, in the same foreachBatch call.
    upstream: dict[int, tuple[tuple[float, ...], float, float]] = {}
    for commit in commits:
        if commit.sink != "postgres" or not commit.wrote:
            continue
        if commit.first_batch not in batches:
            continue
        started, compute_s, shards_s = batches[commit.first_batch]
        began, done = commit.started_at * 1000, commit.finished_at * 1000
        for ts in commit.commit_ts_ms:
            if ts not in captured or ts in upstream:
                continue
            debezium, kafka = captured[ts]
            batch, compute, shards = began - started * 1000, compute_s * 1000, shards_s * 1000
            first: tuple[float, ...] = (debezium - ts, kafka - debezium,
                                        started * 1000 - kafka, compute - shards, shards,
                                        batch - compute)
            upstream[ts] = (first, began, done)
            out["postgres"].add(done - ts, (*first, done - began))
    for commit in commits:
        if commit.sink != "delta":
            continue
        for ts in commit.commit_ts_ms:
            if ts not in upstream:
                continue
            first, began, done = upstream[ts]
            out["delta"].add(commit.finished_at * 1000 - ts,
                             (*first, done - began, commit.started_at * 1000 - done,
                              (commit.finished_at - commit.started_at) * 1000))
    return out
