"""Spark's own ``kafka`` source as txjoin's ingest path, and what txjoin checks around it.

The records come from ``spark.readStream.format("kafka")`` (spark-sql-kafka, on the
session's ``spark.jars``: ``txjoin.jvm``): one Spark task per topic-partition and
micro-batch, reading its offset range in order (``minPartitions`` is never set: it
would split a partition across tasks). Each record is read once per micro-batch, a
batch's end offsets are the next one's start, and a batch re-run after a crash reads
the same offsets again (Spark's offset log): the ordering facts the core relies on.

What the core learned from txjoin's former Python source, re-derived here:

- **Read to the end ("caught up").** Without a read limit, Spark plans every batch up
  to the latest offsets of every partition, so every batch reads every topic to its
  end as of planning (an ``availableNow`` run: as of its start, which is sound too).
  With ``--max-events-per-trigger N`` (``maxOffsetsPerTrigger``; by default N is
  ``DEFAULT_MAX_EVENTS_PER_TRIGGER``, 0 lifts the limit) Spark shares N among
  the partitions' offsets in proportion to their backlog, rounding each share down (up
  below 1); if the limit binds, the batch spans at least ``N - P`` offsets, P being the
  number of partitions (each share loses less than one offset to rounding). So a batch
  planned over fewer than ``N - P`` offsets read every partition to its end
  (:meth:`KafkaFacts.caught_up`; ``tests/unit/test_kafka_facts.py`` checks the rule
  against Spark's own rate limit). The driver reads the batch's planned offsets from
  Spark's offset log before the batch's job (:func:`batch_offset_spans`, the same when
  the batch is re-run) and hands them to the shards' tasks as a local property
  (:data:`OFFSET_SPANS_PROPERTY`). Offsets, not records: an exactly-once source
  connector's transaction markers and compaction leave gaps in the offsets, and a
  batch the limit cut short that skipped gaps holds fewer than ``N - P`` records
  (counting records, as txjoin did before 2026-12-07, called it caught up).
- **Small topics read by a source of their own.** Spark's share of the limit goes by
  backlog, so on a long backlog a topic of a few records (a lookup table's snapshot) is
  read a record or so per batch, and nothing is released until its last snapshot row
  arrives. So when a new checkpoint starts with a read limit N, the topics whose backlog
  is at most N while some other topic's is larger are read by a second kafka source
  with a limit N of its own (:func:`split_topics`): they arrive whole in the first
  batches. Spark matches sources by their place in the query, so a restart takes the
  split from the checkpoint's offset log (a line per source: :func:`checkpoint_sources`),
  whatever the backlogs are then; a checkpoint started with one source keeps one. The
  caught-up rule holds per source (:meth:`KafkaFacts.caught_up`).
- **Partition counts.** Read from the brokers when the query starts (and recorded in
  the checkpoint, see below). Table topics with several partitions are declared to the
  shards from these counts; a record from a partition beyond them (a topic that gained
  partitions while the job ran) stops the job with what to do (restart it).
- **A topic recreated, an offset out of range.** At start, the checkpoint's last
  offsets are checked against each partition's retained range, and the topics' Kafka
  ids against the ids recorded in the checkpoint (``txjoin-topics.json``): either
  mismatch is a ``CheckpointError`` naming topic, partition, offset and the way out.
  While running, ``failOnDataLoss`` makes Spark stop on offsets that vanished.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession

from txjoin.errors import RECOVER, CheckpointError, ConfigError, ServiceError

if TYPE_CHECKING:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient

SOURCE_NAME = "kafka"
METADATA_TIMEOUT_S = 15.0
NEWEST_RECORDS = 5
"""Records read from the end of each partition for the column check at start (the very
newest is often a tombstone: Debezium writes one after each delete by default)."""
NEWEST_RECORDS_TIMEOUT_S = 3.0
TOPICS_FILE = "txjoin-topics.json"
"""In the checkpoint: each topic's Kafka id and partition count when the query last started."""
_NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # Kafka's zero UUID: the broker has no id


Sources = tuple[tuple[str, ...], ...]
"""The topics each kafka source of the query reads, in the query's order (one source: one
group of every topic)."""


@dataclass(frozen=True)
class KafkaFacts:
    """What the shards need to know about the topics and Spark's kafka source does not say."""

    partitions: dict[str, int]
    """Topic -> partition count, for every subscribed topic."""
    max_events: int | None = None
    """``maxOffsetsPerTrigger`` of each source: None reads everything available in every
    batch."""
    sources: Sources = ()
    """The topics of each kafka source (:func:`split_topics`); empty: one source."""

    def groups(self) -> Sources:
        return self.sources or (tuple(self.partitions),)

    def caught_up(self, spans: Mapping[str, int]) -> set[str]:
        """The topics a batch read to their planned end, from ``spans`` (topic -> the
        offsets the batch was planned to read from it, :func:`batch_offset_spans`): every
        topic of a source planned fewer than ``N - P`` offsets (N its limit, P its
        partitions; each source is limited on its own)."""
        if self.max_events is None:
            return set(self.partitions)
        out: set[str] = set()
        for group in self.groups():
            read = sum(spans.get(t, 0) for t in group)
            if read < self.max_events - sum(self.partitions.get(t, 0) for t in group):
                out.update(group)
        return out

    def several(self) -> dict[str, int]:
        """The topics with several partitions and their counts."""
        return {t: n for t, n in self.partitions.items() if n > 1}


class KafkaTopics:
    """The brokers' view of the subscribed topics, checked with clear one-line errors."""

    def __init__(self, bootstrap_servers: str, topics: Sequence[str],
                 transaction_topics: Sequence[str] = ()) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.transaction_topics = tuple(transaction_topics)
        self.topics = tuple(dict.fromkeys([*topics, *transaction_topics]))
        self._admin: AdminClient | None = None

    def _client_conf(self) -> dict[str, Any]:
        # log_level 0: librdkafka would print a line per failed connection attempt to
        # stderr; an unreachable broker is reported once, as txjoin's own one-line error.
        return {"bootstrap.servers": self.bootstrap_servers,
                "socket.connection.setup.timeout.ms": 10_000, "log_level": 0}

    def admin(self) -> AdminClient:
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient(self._client_conf())
        return self._admin

    def partitions(self) -> dict[str, int]:
        """Topic -> partition count; raises if a topic is missing or a transaction topic
        has several partitions, or the brokers do not answer."""
        from confluent_kafka import KafkaException

        servers = self.bootstrap_servers
        try:
            metadata = self.admin().list_topics(timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:
            raise ServiceError(
                f"{SOURCE_NAME}: cannot reach the Kafka brokers at {servers!r} within "
                f"{METADATA_TIMEOUT_S:.0f}s ({exc.args[0] if exc.args else exc}); check that "
                "the broker runs and --bootstrap-servers is right") from exc
        counts: dict[str, int] = {}
        for topic in self.topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise ConfigError(
                    f"{SOURCE_NAME}: topic {topic!r} does not exist on {servers!r}; create it "
                    "(the Debezium connector creates its topics on first use) or check the "
                    "job's topic prefix")
            count = len(meta.partitions)
            if topic in self.transaction_topics and count != 1:
                raise ConfigError(
                    f"{SOURCE_NAME}: transaction topic {topic!r} on {servers!r} has {count} "
                    "partitions but must have exactly 1, because transaction order is only "
                    "kept within a partition; recreate it with 1 partition (e.g. "
                    f"kafka-topics.sh --create --topic {topic} --partitions 1) before Debezium "
                    "writes to it")
            counts[topic] = count
        return counts

    @contextlib.contextmanager
    def _consumer(self) -> Iterator[Consumer]:
        """A consumer for the checks: it never joins a group or commits (a group id is
        mandatory for the client all the same)."""
        from confluent_kafka import Consumer

        consumer = Consumer({**self._client_conf(), "group.id": f"txjoin-check-{uuid.uuid4()}",
                             "enable.auto.commit": False})
        try:
            yield consumer
        finally:
            consumer.close()

    def _watermarks(self, consumer: Consumer, counts: dict[str, int]
                    ) -> dict[tuple[str, int], tuple[int, int]]:
        from confluent_kafka import KafkaException, TopicPartition

        ranges = {}
        for topic, count in counts.items():
            for partition in range(count):
                try:
                    ranges[(topic, partition)] = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=METADATA_TIMEOUT_S,
                        cached=False)
                except KafkaException as exc:
                    raise ServiceError(
                        f"{SOURCE_NAME}: cannot read the offsets of {topic}[{partition}] "
                        f"from {self.bootstrap_servers!r}: {exc}") from exc
        return ranges

    def ranges(self, counts: dict[str, int]) -> dict[tuple[str, int], tuple[int, int]]:
        """``(low, high)`` watermarks of every partition of ``counts``."""
        with self._consumer() as consumer:
            return self._watermarks(consumer, counts)

    def newest_values(self, topics: Sequence[str], counts: dict[str, int],
                      timeout_s: float = NEWEST_RECORDS_TIMEOUT_S
                      ) -> dict[str, list[tuple[int, int, bytes | None]]]:
        """Topic -> (partition, offset, value) of the last :data:`NEWEST_RECORDS` records of
        each of its partitions, for the topics that hold any; whatever has not arrived
        within ``timeout_s`` is left out (what it serves is a check at start, not the run)."""
        from confluent_kafka import TopicPartition

        out: dict[str, list[tuple[int, int, bytes | None]]] = {}
        with self._consumer() as consumer:
            ranges = self._watermarks(consumer, {t: counts[t] for t in topics})
            last = {key: high - 1 for key, (low, high) in ranges.items() if high > low}
            if not last:
                return out
            consumer.assign([TopicPartition(t, p, max(ranges[(t, p)][0], end + 1 - NEWEST_RECORDS))
                             for (t, p), end in last.items()])
            deadline = time.monotonic() + timeout_s
            quiet = 0  # polls in a row with nothing: the rest is not coming (e.g. a partition
            # whose last offset is a transaction marker, never delivered)
            while last and time.monotonic() < deadline and quiet < 3:
                msg = consumer.poll(0.2)
                if msg is None:
                    quiet += 1 if out else 0
                    continue
                quiet = 0
                topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                if msg.error() is not None or topic is None or partition is None \
                        or offset is None:
                    continue
                out.setdefault(topic, []).append((partition, offset, msg.value()))
                if offset >= last.get((topic, partition), offset + 1):
                    del last[(topic, partition)]
        return out

    def sources(self, checkpoint: Path | None, counts: dict[str, int], max_events: int | None,
                starting_offsets: str = "earliest") -> Sources:
        """The kafka sources of the query: as the checkpoint's offset log has them once it
        planned a batch, else :func:`split_topics` of the backlogs now."""
        if checkpoint is not None:
            recorded = checkpoint_sources(checkpoint, self.topics)
            if recorded is not None:
                return recorded
        if max_events is None or starting_offsets != "earliest":
            return ()
        backlogs = dict.fromkeys(self.topics, 0)
        for (topic, _), (low, high) in self.ranges(counts).items():
            backlogs[topic] += high - low
        return split_topics(backlogs, max_events)

    def topic_ids(self) -> dict[str, str]:
        """Kafka topic ids of the subscribed topics; empty where the broker has none."""
        from confluent_kafka import KafkaException, TopicCollection

        try:
            futures = self.admin().describe_topics(TopicCollection(list(self.topics)),
                                                   request_timeout=METADATA_TIMEOUT_S)
            ids = {topic: str(f.result(METADATA_TIMEOUT_S).topic_id)
                   for topic, f in futures.items()}
        except (KafkaException, AttributeError, TypeError, ValueError):
            return {}  # an older broker: offsets are still checked against the ranges
        return {t: i for t, i in ids.items() if i and i not in ("None", _NO_TOPIC_ID)}

    def check_checkpoint(self, checkpoint: Path, counts: dict[str, int]) -> None:
        """Refuse a checkpoint whose topics were recreated or whose offsets left the
        topics' retained ranges; then record the topics' ids and counts in it."""
        ids = self.topic_ids()
        record = checkpoint / TOPICS_FILE
        if record.exists():
            recorded = json.loads(record.read_text())
            for topic, seen in recorded.items():
                now = ids.get(topic)
                if now and seen.get("id") and now != seen["id"]:
                    raise CheckpointError(
                        f"{SOURCE_NAME}: topic {topic!r} on {self.bootstrap_servers!r} was "
                        f"recreated since the checkpoint was written (topic id {seen['id']} "
                        f"is now {now}); {RECOVER}")
        offsets = last_offsets(checkpoint)
        if offsets:
            ranges = self.ranges(counts)
            for topic, parts in offsets.items():
                if topic not in counts:
                    continue
                for part, offset in parts.items():
                    current = ranges.get((topic, int(part)))
                    if current is None:
                        raise CheckpointError(
                            f"{SOURCE_NAME}: the checkpoint's offset {offset} for "
                            f"{topic}[{part}] names a partition the topic no longer has on "
                            f"{self.bootstrap_servers!r}; {RECOVER}")
                    lo, hi = current
                    if offset > hi:
                        problem = ("is beyond the partition's end (the topic was recreated or "
                                   "another cluster is configured)")
                    elif offset < lo:
                        problem = ("is below its earliest retained offset (records were "
                                   "deleted before the job read them)")
                    else:
                        continue
                    raise CheckpointError(
                        f"{SOURCE_NAME}: the checkpoint's offset {offset} for {topic}[{part}] "
                        f"{problem}: the topic now holds offsets {lo}..{hi} (end {hi}); "
                        f"{RECOVER}")
        checkpoint.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({t: {"id": ids.get(t), "partitions": n}
                                      for t, n in sorted(counts.items())}, indent=1) + "\n")


def _offset_lines(checkpoint: Path) -> list[dict[str, dict[str, int]]]:
    """Each kafka source's end offsets in the checkpoint's last planned batch, in the
    query's source order (empty: no batch planned).

    Spark's offset log: ``<checkpoint>/offsets/<batch id>``, a version line, a metadata
    line, then one line per source (``{topic: {partition: offset}}`` for a kafka source).
    """
    folder = checkpoint / "offsets"
    batches = sorted((int(p.name) for p in folder.glob("[0-9]*")), reverse=True) \
        if folder.is_dir() else []
    for batch in batches:
        lines = _log_entry(folder / str(batch))
        if lines:
            return lines
    return []


def _log_entry(path: Path) -> list[dict[str, dict[str, int]]] | None:
    """The kafka source lines of one entry of Spark's offset log (None: no such entry, or
    not a kafka source's)."""
    if not path.is_file():
        return None
    lines = [line.strip() for line in path.read_text().splitlines()[2:]]
    if not lines or not all(line.startswith("{") for line in lines):
        return None
    return [_source_offsets(line) for line in lines]


def _source_offsets(text: str) -> dict[str, dict[str, int]]:
    """A kafka source's offsets as Spark writes them: ``{topic: {partition: offset}}``."""
    return {t: {p: int(o) for p, o in parts.items()} for t, parts in json.loads(text).items()}


def _initial_offsets(checkpoint: Path, source: int) -> dict[str, dict[str, int]]:
    """Where kafka source number ``source`` of the checkpoint's query started (its
    ``startingOffsets`` as resolved on the first batch): Spark's kafka source keeps them in
    ``<checkpoint>/sources/<source>/0``, a zero byte, a version line, then the offsets."""
    path = checkpoint / "sources" / str(source) / "0"
    if not path.is_file():
        return {}
    text = path.read_bytes().lstrip(b"\0").decode()
    return _source_offsets(text.partition("\n")[2])


def batch_offset_spans(checkpoint: Path, batch_id: int) -> dict[str, int]:
    """Topic -> the offsets micro-batch ``batch_id`` was planned to read from it, summed
    over its partitions: the batch's end offsets in Spark's offset log less the previous
    batch's (the source's starting offsets for a partition it had not read). These are
    what Spark's read limit shares out (offsets, not records), so
    :meth:`KafkaFacts.caught_up` on them holds with gaps in the offsets too (transaction
    markers of an exactly-once source connector, compaction), where a count of the
    records the batch read would not. Raises ``CheckpointError`` if the batch is not in
    the offset log."""
    folder = checkpoint / "offsets"
    ends = _log_entry(folder / str(batch_id))
    if ends is None:
        raise CheckpointError(
            f"{SOURCE_NAME}: micro-batch {batch_id} is not in the offset log of the checkpoint "
            f"{checkpoint}; {RECOVER}")
    before = _log_entry(folder / str(batch_id - 1)) or []
    spans: dict[str, int] = {}
    for number, line in enumerate(ends):
        starts = before[number] if number < len(before) else {}
        initial: dict[str, dict[str, int]] | None = None
        for topic, parts in line.items():
            span = 0
            for partition, end in parts.items():
                start = starts.get(topic, {}).get(partition)
                if start is None:
                    if initial is None:
                        initial = _initial_offsets(checkpoint, number)
                    start = initial.get(topic, {}).get(partition, 0)
                span += max(end - start, 0)
            spans[topic] = span
    return spans


OFFSET_SPANS_PROPERTY = "txjoin.kafka.offsetSpans"
"""The Spark local property the driver sets, before a micro-batch's job, to the batch's
:func:`batch_offset_spans` as JSON, for the shards' tasks (``TaskContext``)."""


def task_offset_spans() -> dict[str, int]:
    """In a task of a micro-batch's job: the batch's :func:`batch_offset_spans`, as the
    driver set them (:data:`OFFSET_SPANS_PROPERTY`)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    value = None if context is None else context.getLocalProperty(OFFSET_SPANS_PROPERTY)
    if value is None:
        raise RuntimeError(f"{OFFSET_SPANS_PROPERTY} is not set in this task: the read "
                           "limit's caught-up rule needs the batch's planned offsets")
    spans: dict[str, int] = json.loads(value)
    return spans


def last_offsets(checkpoint: Path) -> dict[str, dict[str, int]]:
    """The kafka sources' end offsets of the checkpoint's last planned batch (empty if none)."""
    return {t: parts for line in _offset_lines(checkpoint) for t, parts in line.items()}


def split_topics(backlogs: Mapping[str, int], max_events: int | None) -> Sources:
    """The kafka sources a new checkpoint's query reads, from each topic's ``backlogs``
    (records to read): with a read limit N, the topics of at most N records while another
    has more get a source of their own (a share by backlog would read them a record or so
    a batch); otherwise one source."""
    if max_events is None:
        return ()
    small = tuple(t for t, n in backlogs.items() if n <= max_events)
    large = tuple(t for t in backlogs if t not in small)
    return (large, small) if small and large else ()


def checkpoint_sources(checkpoint: Path, topics: Sequence[str]) -> Sources | None:
    """The kafka sources the checkpoint's query was started with, as its offset log records
    them (``topics`` no source read yet go to the first); None if it planned no batch."""
    lines = _offset_lines(checkpoint)
    if not lines:
        return None
    if len(lines) == 1:
        return ()
    groups = [[t for t in line if t in topics] for line in lines]
    for line, group in zip(lines, groups, strict=True):
        if not group:  # Spark would refuse the query: its sources no longer match the log
            raise CheckpointError(
                f"{SOURCE_NAME}: the checkpoint {checkpoint} reads {', '.join(sorted(line))} "
                f"through a kafka source of their own, and the job subscribes none of them now; "
                f"{RECOVER}")
    seen = {t for group in groups for t in group}
    groups[0].extend(t for t in topics if t not in seen)
    return tuple(tuple(group) for group in groups)


# The consumer's fetch.max.wait.ms: how long the broker holds a fetch that finds fewer
# bytes than it wants. A micro-batch reads each partition up to an offset already
# written, yet with Kafka's default (500 ms) every partition's read ended in one such
# wait: counting 15k records of the stack's 8 topics took 2.6 s, 0.4 s with 10 ms
# (2 cores).
FETCH_MAX_WAIT_MS = 10
# Bytes one fetch returns per partition (Kafka's default: 1 MiB, a thousand Debezium
# records): a task reads its range in fewer round trips. bench -n 40000: source alone
# 78-79k -> 82-88k records/s. A fetch stays bounded by fetch.max.bytes (50 MiB).
MAX_PARTITION_FETCH_BYTES = 16 * 1024 * 1024
# Records one poll hands over (Kafka's default: 500). Spark's source looks up the
# partition's earliest and latest offsets (two requests to the broker) after every poll,
# so with 500 a task paid those round trips every 500 records: the orders partition's
# 7.4k records of a 25k-record batch took 15 polls and 59 ms, 1 poll and 23 ms with this;
# the first source-only pass after a warm-up (bench -n 40000's workload, 3 runs each, 2
# cores) read 78-96k records/s with 500, 84-109k with this. A poll's records stay bounded
# by the fetch it drains (above).
MAX_POLL_RECORDS = 20_000


def read_stream(spark: SparkSession, bootstrap: str, topics: Sequence[str],
                starting_offsets: str = "earliest", max_events: int | None = None,
                sources: Sources = ()) -> DataFrame:
    """Spark's kafka source over ``topics`` as ``markers.SCHEMA_DDL`` rows (key and value
    as strings: Debezium's JSON; a tombstone's value is null); with ``sources``, one kafka
    source per group of topics, each with the read limit, in one stream (a union)."""
    if starting_offsets not in ("earliest", "latest"):
        raise ConfigError(f"--starting-offsets must be 'earliest' or 'latest', got "
                          f"{starting_offsets!r}")
    if max_events is not None and max_events <= 0:
        raise ConfigError(f"--max-events-per-trigger must be positive, got {max_events}")
    frames = [_read_one(spark, bootstrap, group, starting_offsets, max_events)
              for group in (sources or (tuple(topics),))]
    return functools.reduce(DataFrame.union, frames)


def _read_one(spark: SparkSession, bootstrap: str, topics: Sequence[str],
              starting_offsets: str, max_events: int | None) -> DataFrame:
    reader = (spark.readStream.format(SOURCE_NAME)
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", ",".join(dict.fromkeys(topics)))
              .option("startingOffsets", starting_offsets)
              # Offsets that vanished (retention, a deleted topic) stop the query.
              .option("failOnDataLoss", "true")
              .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
              .option("kafka.max.partition.fetch.bytes", str(MAX_PARTITION_FETCH_BYTES))
              .option("kafka.max.poll.records", str(MAX_POLL_RECORDS)))
    if max_events is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_events))
    return reader.load().selectExpr(
        "topic", "partition", "offset", "CAST(key AS STRING) AS key",
        "CAST(value AS STRING) AS value", "timestamp")
