"""``txjoin_kafka``: a PySpark 4.2 Python streaming data source over confluent-kafka.

Spark's native ``kafka`` format needs the spark-sql-kafka jars, which are not
reachable here, so this source reads Kafka (or tansu) with confluent-kafka and
hands Spark Arrow record batches (~5x faster than tuples, DESIGN.md section 4).

Offsets in the checkpoint are ``{topic: {"<partition>": next_offset}}``; the
partition keys are strings because the offsets travel as JSON. A micro-batch has
one input partition per topic-partition with records in ``[start, end)``.

"Caught up": the end offsets also record, under the reserved key
``__caught_up__`` as ``{topic: 0|1}``, which topics this batch reads to the end
of what the broker had when the batch was planned (not cut short by
``maxEventsPerTrigger``). Being part of the checkpointed offsets, a re-run of the
batch after a crash reports the same. One extra input partition turns it into
marker rows (``offset = -1``, ``value`` null, ``key`` = ``__caught_up__``) that
the transactional core uses to settle the snapshot of empty tables and to
confirm restarted transactions (see ``txjoin.core.assembly``). The same input
partition declares, in every batch, the table topics with several partitions
(``offset = -2``, ``partition`` = the count, ``key`` = ``__partitions__``), read
from the batch's end offsets, and which of their partitions the batch reads to
the end (``offset = -3``, recorded under ``__caught_up_partitions__``): the core
applies those rules per partition for them.

Topic identity: the offsets also record, under ``__topic_ids__``, each topic's
Kafka topic id where the broker reports one. On every planned batch (and on the
first batch after a restart) the checkpoint's offsets are checked against the
topics: an offset beyond a partition's end or below its earliest retained
offset, or a topic whose id changed (recreated), stops the query with a
``CheckpointError`` naming topic, partition, offset and the current range.
Otherwise a checkpoint ahead of recreated topics would wait, silently, for
offsets that will only hold unrelated records.

Ordering facts this source guarantees and txjoin relies on: within a
topic-partition records arrive in offset order, each exactly once across
micro-batches and restarts (the end offset of a batch is the start of the next),
and a micro-batch never reads past the end offset it planned.

tansu defect: its high watermark is the base offset of the last record *batch*
+ 1, so records in the tail of a multi-record batch stay invisible until a later
batch lands. Our producers write one-record batches. With other producers such
records are delayed, never lost or duplicated: offsets only come from the
watermark, and ``read`` stops at the planned end instead of waiting for more.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# Used through the module object: the classes report the unimportable module
# "cimpl", so cloudpickle (this module is pickled by value for the workers) would
# try to copy them by value and fail; a module is always pickled by reference.
import confluent_kafka
import confluent_kafka.admin
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from txjoin.debezium import UNDECLARED_PARTITIONS
from txjoin.errors import CheckpointError, ConfigError, DecodeError, ServiceError

if TYPE_CHECKING:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient

SOURCE_NAME = "txjoin_kafka"
SCHEMA_DDL = (
    "topic string, partition int, offset long, key string, value string, timestamp timestamp"
)
# Must equal what Spark derives from SCHEMA_DDL (it compares schemas exactly).
ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("key", pa.string()),
    ("value", pa.string()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
])

Offsets = dict[str, dict[str, Any]]
"""``{topic: {"<partition>": next offset to read}}``, JSON-able for the checkpoint, plus
the reserved entries ``__caught_up__`` (``{topic: 0|1}``) and ``__topic_ids__``
(``{topic: id}``)."""

METADATA_TIMEOUT_S = 15.0
# How long a read task waits without receiving anything before it gives up on a
# range the broker said exists.
READ_STALL_TIMEOUT_S = 60.0
_CONSUME_CHUNK = 10_000
CAUGHT_UP = "__caught_up__"
CAUGHT_UP_PARTS = "__caught_up_partitions__"  # {topic: [partition, ...]}, topics with several
PARTITIONS = "__partitions__"
CAUGHT_UP_OFFSET = -1  # marker row: the topic was read to its end in this batch
PARTITIONS_OFFSET = -2  # marker row: the topic has `partition` partitions
PARTITION_CAUGHT_UP_OFFSET = -3  # marker row: partition `partition` was read to its end
TOPIC_IDS = "__topic_ids__"
RESERVED = (CAUGHT_UP, CAUGHT_UP_PARTS, TOPIC_IDS)
_NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # Kafka's zero UUID: the broker has no id
RECOVER = ("start a new checkpoint and re-derive the sinks from the topics with "
           "`txjoin run --rebuild`")


def topic_tuple(topics: str | Sequence[str] | None) -> tuple[str, ...]:
    """One topic, several, or none, as a tuple (the sources' ``transaction_topic`` option)."""
    if topics is None:
        return ()
    if isinstance(topics, str):
        return (topics,)
    return tuple(topics)


@dataclass(frozen=True)
class KafkaSourceConfig:
    """The source's options, validated once."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    starting_offsets: str = "earliest"
    max_events_per_trigger: int | None = None
    transaction_topic: str | tuple[str, ...] | None = None
    """The transaction topic, or several (a job over several source databases)."""
    one_partition_tables: bool = False
    """Refuse table topics with several partitions (for a reader that cannot declare them)."""

    @property
    def transaction_topics(self) -> tuple[str, ...]:
        """Every transaction topic (each must have exactly one partition)."""
        return topic_tuple(self.transaction_topic)

    @classmethod
    def from_options(cls, options: Any) -> KafkaSourceConfig:
        """Parse Spark's case-insensitive options object (read keys from it, never dict() it)."""
        bootstrap = options.get("bootstrap.servers")
        if not bootstrap:
            raise ConfigError(f"{SOURCE_NAME}: option 'bootstrap.servers' is required, "
                              "e.g. .option('bootstrap.servers', 'localhost:9092')")
        tx_topics = tuple(t.strip() for t in (options.get("transactionTopic") or "").split(",")
                          if t.strip())
        transaction_topic = (None if not tx_topics else tx_topics[0] if len(tx_topics) == 1
                             else tx_topics)
        topics = [t.strip() for t in (options.get("topics") or "").split(",") if t.strip()]
        # The transaction topic is read like any other topic; naming it only in
        # transactionTopic is enough.
        topics.extend(t for t in tx_topics if t not in topics)
        if not topics:
            raise ConfigError(f"{SOURCE_NAME}: option 'topics' is required "
                              "(comma-separated topic names)")
        starting = (options.get("startingOffsets") or "earliest").strip().lower()
        if starting not in ("earliest", "latest"):
            raise ConfigError(f"{SOURCE_NAME}: option 'startingOffsets' must be 'earliest' or "
                              f"'latest', got {starting!r}")
        raw_max = options.get("maxEventsPerTrigger")
        max_events: int | None = None
        if raw_max not in (None, ""):
            try:
                max_events = int(raw_max)
            except ValueError:
                max_events = 0
            if max_events <= 0:
                raise ConfigError(f"{SOURCE_NAME}: option 'maxEventsPerTrigger' must be a "
                                  f"positive integer, got {raw_max!r}")
        return cls(bootstrap, tuple(dict.fromkeys(topics)), starting, max_events,
                   transaction_topic)


def split_budget(available: dict[tuple[str, int], int], budget: int) -> dict[tuple[str, int], int]:
    """Share ``budget`` records fairly among topic-partitions with ``available`` records.

    Water-filling: every partition with data gets an equal share, capped by what it
    has, and the leftover of small partitions goes to the others. Each share is at
    least 1 while budget remains, so no partition with data gets 0 as long as the
    budget covers one record per partition; when it does not, the partitions with
    the largest backlog go first, so a partition cannot be starved forever.
    """
    grants = {tp: 0 for tp in available}
    # Largest backlog first, ties by name for a deterministic plan.
    active = sorted((tp for tp, n in available.items() if n > 0),
                    key=lambda tp: (-available[tp], tp))
    remaining = budget
    while remaining > 0 and active:
        share = max(1, remaining // len(active))
        still_active = []
        for tp in active:
            if remaining == 0:
                break
            grant = min(share, available[tp] - grants[tp], remaining)
            grants[tp] += grant
            remaining -= grant
            if grants[tp] < available[tp]:
                still_active.append(tp)
        active = still_active
    return grants


class KafkaInputPartition(InputPartition):
    """Records ``[start, end)`` of one topic-partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches from the brokers' watermarks and reads them on the workers.

    The reader lives in Spark's driver-side Python runner for the whole query; a
    pickled copy (without the Kafka clients) runs ``read`` in the tasks.
    """

    def __init__(self, config: KafkaSourceConfig) -> None:
        self.config = config
        self._admin: AdminClient | None = None
        self._consumer: Consumer | None = None
        self._target: Offsets | None = None  # end of an availableNow run
        self._latest: Offsets | None = None
        self._validated = False  # the checkpoint's offsets were checked since the start

    def __getstate__(self) -> dict[str, Any]:
        # Kafka clients are per process; tasks open their own consumer in read().
        state = self.__dict__.copy()
        state["_admin"] = state["_consumer"] = None
        return state

    # -- driver side ---------------------------------------------------------

    def _client_conf(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.config.bootstrap_servers,
                "socket.connection.setup.timeout.ms": 10_000}

    def _driver_consumer(self) -> Consumer:
        if self._consumer is None:
            # A group id is mandatory for the client, but we never join a group
            # or commit: Spark's checkpoint owns the offsets.
            self._consumer = confluent_kafka.Consumer({**self._client_conf(),
                                       "group.id": f"txjoin-planner-{uuid.uuid4()}",
                                       "enable.auto.commit": False})
        return self._consumer

    def _topic_partitions(self) -> list[tuple[str, int]]:
        """Check the topics once and return their partitions; raises clear errors."""
        if self._admin is None:
            self._admin = confluent_kafka.admin.AdminClient(self._client_conf())
        servers = self.config.bootstrap_servers
        try:
            metadata = self._admin.list_topics(timeout=METADATA_TIMEOUT_S)
        except confluent_kafka.KafkaException as exc:
            raise ServiceError(
                f"{SOURCE_NAME}: cannot reach the Kafka brokers at {servers!r} within "
                f"{METADATA_TIMEOUT_S:.0f}s ({exc.args[0] if exc.args else exc}); check that "
                "the broker runs and 'bootstrap.servers' is right") from exc
        result: list[tuple[str, int]] = []
        for topic in self.config.topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise ConfigError(
                    f"{SOURCE_NAME}: topic {topic!r} does not exist on {servers!r}; create it "
                    "(the Debezium connector creates its topics on first use) or fix the "
                    "'topics' option")
            count = len(meta.partitions)
            if topic in self.config.transaction_topics and count != 1:
                raise ConfigError(
                    f"{SOURCE_NAME}: transaction topic {topic!r} on {servers!r} has {count} "
                    "partitions but must have exactly 1, because transaction order is only "
                    "kept within a partition; recreate it with 1 partition (e.g. "
                    f"kafka-topics --create --topic {topic} --partitions 1) before Debezium "
                    "writes to it")
            if count != 1 and self.config.one_partition_tables:
                raise ConfigError(
                    f"table topic {topic!r} on {servers!r} has {count} partitions; "
                    f"{UNDECLARED_PARTITIONS}")
            result.extend((topic, p) for p in sorted(meta.partitions))
        return result

    def _ranges(self) -> dict[tuple[str, int], tuple[int, int]]:
        """``(low, high)`` watermarks of every subscribed topic-partition."""
        consumer = self._driver_consumer()
        ranges = {}
        for topic, partition in self._topic_partitions():
            try:
                ranges[(topic, partition)] = consumer.get_watermark_offsets(
                    confluent_kafka.TopicPartition(topic, partition),
                    timeout=METADATA_TIMEOUT_S, cached=False)
            except confluent_kafka.KafkaException as exc:
                raise ServiceError(
                    f"{SOURCE_NAME}: cannot read the offsets of {topic}[{partition}] from "
                    f"{self.config.bootstrap_servers!r}: {exc}") from exc
        return ranges

    def _watermarks(self, low: bool) -> Offsets:
        offsets: Offsets = {}
        for (topic, partition), (lo, hi) in self._ranges().items():
            offsets.setdefault(topic, {})[str(partition)] = lo if low else hi
        return offsets

    def _topic_ids(self) -> dict[str, str]:
        """Kafka topic ids of the subscribed topics; empty where the broker has none."""
        if self._admin is None:
            self._admin = confluent_kafka.admin.AdminClient(self._client_conf())
        try:
            futures = self._admin.describe_topics(
                confluent_kafka.TopicCollection(list(self.config.topics)),
                request_timeout=METADATA_TIMEOUT_S)
            ids = {topic: str(f.result(METADATA_TIMEOUT_S).topic_id)
                   for topic, f in futures.items()}
        except (confluent_kafka.KafkaException, AttributeError, TypeError, ValueError):
            return {}  # an older broker: offsets are still checked against the ranges
        return {t: i for t, i in ids.items() if i and i not in ("None", _NO_TOPIC_ID)}

    def validate(self, offsets: Offsets, what: str = "the checkpoint's offset") -> None:
        """Raise ``CheckpointError`` unless every offset lies within its topic's current range
        and every recorded topic id is the topic's current one."""
        ids = self._topic_ids()
        for topic, recorded in (offsets.get(TOPIC_IDS) or {}).items():
            if topic in ids and ids[topic] != recorded:
                raise CheckpointError(
                    f"{SOURCE_NAME}: topic {topic!r} on {self.config.bootstrap_servers!r} was "
                    f"recreated since the checkpoint was written (topic id {recorded} is now "
                    f"{ids[topic]}); {RECOVER}")
        ranges = self._ranges()
        for topic, parts in offsets.items():
            if topic in RESERVED or topic not in self.config.topics:
                continue
            for part, offset in parts.items():
                current = ranges.get((topic, int(part)))
                if current is None:
                    raise CheckpointError(
                        f"{SOURCE_NAME}: {what} {offset} for {topic}[{part}] names a partition "
                        f"the topic no longer has on {self.config.bootstrap_servers!r}; "
                        f"{RECOVER}")
                lo, hi = current
                if offset > hi:
                    problem = "is beyond the partition's end (the topic was recreated or " \
                              "another cluster is configured)"
                elif offset < lo:
                    problem = "is below its earliest retained offset (records were deleted " \
                              "before the job read them)"
                else:
                    continue
                raise CheckpointError(
                    f"{SOURCE_NAME}: {what} {offset} for {topic}[{part}] {problem}: the "
                    f"topic now holds offsets {lo}..{hi} (end {hi}); {RECOVER}")
        self._validated = True

    def initialOffset(self) -> Offsets:
        """Low (``earliest``) or high (``latest``) watermark of every partition."""
        offsets = self._watermarks(low=self.config.starting_offsets == "earliest")
        ids = self._topic_ids()
        if ids:
            offsets[TOPIC_IDS] = ids
        self._validated = True
        return offsets

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxEventsPerTrigger`` as a ReadMaxRows limit, else everything available."""
        if self.config.max_events_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.config.max_events_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        """Freeze the end of an ``availableNow`` run at today's high watermarks."""
        self._target = self._watermarks(low=False)

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        """End offsets of the next micro-batch: the high watermarks, capped by ``limit``.

        ``start`` (the checkpoint's offsets) is checked against the topics first.
        """
        self.validate(start)
        high = self._target if self._target is not None else self._watermarks(low=False)
        self._latest = high
        begin: dict[tuple[str, int], int] = {}
        available: dict[tuple[str, int], int] = {}
        for topic, parts in high.items():
            if topic in RESERVED:
                continue
            for part, hi in parts.items():
                # A partition added since the last batch starts at 0 (earliest
                # retained offset is found by the consumer at read time).
                lo = start.get(topic, {}).get(part, 0)
                begin[(topic, int(part))] = lo
                available[(topic, int(part))] = max(0, hi - lo)
        if isinstance(limit, ReadMaxRows):
            grants = split_budget(available, limit.max_rows)
        else:
            grants = available
        end: Offsets = {}
        for (topic, number), lo in begin.items():
            end.setdefault(topic, {})[str(number)] = lo + grants[(topic, number)]
        # Keep partitions that only the checkpoint knows (e.g. a topic removed
        # from the options) so the offset never moves backwards.
        for topic, parts in start.items():
            if topic in RESERVED:
                continue
            for part, offset in parts.items():
                end.setdefault(topic, {}).setdefault(part, offset)
        mark_caught_up(end, {k: grants[k] == available[k] for k in begin})
        ids = start.get(TOPIC_IDS) or self._topic_ids()
        if ids:
            end[TOPIC_IDS] = dict(sorted(ids.items()))
        return end

    def reportLatestOffset(self) -> Offsets | None:
        """The high watermarks seen by the last ``latestOffset`` call (for query progress)."""
        return self._latest

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        """One input partition per topic-partition that has records in ``[start, end)``.

        A batch re-run after a restart is planned without ``latestOffset``: its
        offsets are checked here.
        """
        if not self._validated:
            self.validate(start)
            self.validate(end, "the checkpoint's planned end offset")
        result: list[InputPartition] = []
        markers = CaughtUpPartition.of(end)
        if markers is not None:
            result.append(markers)
        for topic, parts in sorted(end.items()):
            if topic in RESERVED:
                continue
            for part, hi in sorted(parts.items(), key=lambda kv: int(kv[0])):
                lo = start.get(topic, {}).get(part, 0)
                if hi > lo:
                    result.append(KafkaInputPartition(topic, int(part), lo, hi))
        return result

    def commit(self, end: Offsets) -> None:
        """Nothing to do: the checkpoint owns the offsets and we keep no buffers."""

    def stop(self) -> None:
        """Close the planner's Kafka clients."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._admin = None

    # -- task side -----------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Yield the records ``[start, end)`` of one topic-partition as Arrow batches."""
        if isinstance(partition, CaughtUpPartition):
            return iter([caught_up_batch(partition.topics, partition.partitioned,
                                         partition.parts)])
        assert isinstance(partition, KafkaInputPartition)
        return _read_range(self.config.bootstrap_servers, partition)


def mark_caught_up(end: Offsets, full: Mapping[tuple[str, int], bool],
                   topics: Sequence[str] = ()) -> None:
    """Record in a batch's end offsets which topics it reads to their end (every
    partition ``full``; ``topics`` without partitions count as read) and, for topics
    with several partitions, which of their partitions it reads to their end."""
    caught: dict[str, int] = dict.fromkeys(topics, 1)
    parts: dict[str, list[int]] = {}
    for (topic, number), done in sorted(full.items()):
        caught[topic] = int(caught.get(topic, 1) and done)
        if done:
            parts.setdefault(topic, []).append(number)
    end[CAUGHT_UP] = dict(sorted(caught.items()))
    several = {t for t, p in end.items() if t not in RESERVED and len(p) > 1}
    end[CAUGHT_UP_PARTS] = {t: p for t, p in sorted(parts.items()) if t in several}


class CaughtUpPartition(InputPartition):
    """A batch's marker rows: the topics it reads to their end, the topics with several
    partitions (topic -> partition count) and which of their partitions it reads to
    their end (topic -> partitions)."""

    def __init__(self, topics: list[str], partitioned: dict[str, int] | None = None,
                 parts: dict[str, list[int]] | None = None) -> None:
        super().__init__((tuple(topics), tuple(sorted((partitioned or {}).items())),
                          tuple((t, tuple(p)) for t, p in sorted((parts or {}).items()))))
        self.topics = topics
        self.partitioned = dict(partitioned or {})
        self.parts = dict(parts or {})

    @classmethod
    def of(cls, end: Offsets) -> CaughtUpPartition | None:
        """The markers of the batch ending at ``end`` (None: nothing to say)."""
        caught = sorted(t for t, flag in end.get(CAUGHT_UP, {}).items() if flag)
        counts = {t: len(p) for t, p in end.items() if t not in RESERVED and len(p) > 1}
        parts = {t: list(p) for t, p in end.get(CAUGHT_UP_PARTS, {}).items() if t in counts}
        return cls(caught, counts, parts) if caught or counts else None


def caught_up_batch(topics: Sequence[str], partitioned: Mapping[str, int] | None = None,
                    parts: Mapping[str, Sequence[int]] | None = None) -> pa.RecordBatch:
    """Marker rows: caught-up topics (offset -1, key ``__caught_up__``); the topics with
    several partitions (offset -2, key ``__partitions__``, ``partition`` = the count); and
    their partitions read to the end (offset -3, key ``__caught_up__``, ``partition``).

    Every batch declares its partitioned topics, so a stateful stage knows them before
    it reads any of their records (see ``Engine.process``).
    """
    rows = [(t, 0, CAUGHT_UP_OFFSET, CAUGHT_UP) for t in topics]
    rows += [(t, c, PARTITIONS_OFFSET, PARTITIONS) for t, c in sorted((partitioned or {}).items())]
    rows += [(t, p, PARTITION_CAUGHT_UP_OFFSET, CAUGHT_UP)
             for t, ps in sorted((parts or {}).items()) for p in ps]
    n = len(rows)
    return pa.RecordBatch.from_arrays([
        pa.array([r[0] for r in rows], pa.string()), pa.array([r[1] for r in rows], pa.int32()),
        pa.array([r[2] for r in rows], pa.int64()), pa.array([r[3] for r in rows], pa.string()),
        pa.array([None] * n, pa.string()), pa.array([None] * n, pa.timestamp("us", tz="UTC")),
    ], schema=ARROW_SCHEMA)


def _read_range(bootstrap: str, part: KafkaInputPartition) -> Iterator[pa.RecordBatch]:
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"txjoin-reader-{uuid.uuid4()}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
    })
    where = f"{part.topic}[{part.partition}]"
    try:
        consumer.assign([confluent_kafka.TopicPartition(part.topic, part.partition, part.start)])
        next_offset = part.start
        last_progress = time.monotonic()
        while next_offset < part.end:
            # consume(n) waits until it has all n messages: ask only for what remains.
            wanted = min(_CONSUME_CHUNK, part.end - next_offset)
            messages = consumer.consume(wanted, timeout=1.0)
            rows = []
            for msg in messages:
                err = msg.error()
                if err is not None:
                    if err.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        continue
                    raise ServiceError(f"{SOURCE_NAME}: error reading {where} from "
                                       f"{bootstrap!r} at offset {next_offset}: {err}")
                offset = msg.offset()
                if offset is None or offset >= part.end:
                    continue  # fetched beyond the plan; the next batch reads it
                rows.append(msg)
                next_offset = offset + 1
            if rows:
                last_progress = time.monotonic()
                yield _to_batch(part, rows)
                continue
            # Offsets can be gaps (transaction markers, compaction): the consumer's
            # position moves past them although no message is delivered.
            (position,) = consumer.position(
                [confluent_kafka.TopicPartition(part.topic, part.partition)])
            if position.offset >= part.end:
                break
            if time.monotonic() - last_progress > READ_STALL_TIMEOUT_S:
                raise ServiceError(
                    f"{SOURCE_NAME}: no records from {where} on {bootstrap!r} for "
                    f"{READ_STALL_TIMEOUT_S:.0f}s although offsets {next_offset}..{part.end - 1} "
                    "were announced; is the broker up and were the records deleted?")
    finally:
        consumer.close()


def _to_batch(part: KafkaInputPartition, messages: list[Any]) -> pa.RecordBatch:
    """Arrow batch of ``messages``; keys and values are validated as UTF-8 by Arrow."""
    n = len(messages)
    timestamps = []
    for msg in messages:
        kind, millis = msg.timestamp()
        timestamps.append(millis * 1000 if kind != 0 else None)  # 0 = not available
    columns = [
        pa.array([part.topic] * n, pa.string()),
        pa.array([part.partition] * n, pa.int32()),
        pa.array([m.offset() for m in messages], pa.int64()),
        _utf8(part, messages, [m.key() for m in messages], "key"),
        _utf8(part, messages, [m.value() for m in messages], "value"),
        pa.array(timestamps, pa.timestamp("us", tz="UTC")),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _utf8(part: KafkaInputPartition, messages: list[Any], raw: list[bytes | None],
          field: str) -> pa.Array:
    try:
        return pa.array(raw, pa.binary()).cast(pa.string())
    except pa.ArrowInvalid:
        for msg, data in zip(messages, raw, strict=True):
            try:
                if data is not None:
                    data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DecodeError(f"the record {field} is not UTF-8 ({exc})", topic=part.topic,
                                  partition=part.partition, offset=msg.offset()) from exc
        raise


class KafkaSource(DataSource):
    """Spark data source ``txjoin_kafka``: Kafka records as ``SCHEMA_DDL`` rows.

    Options: ``bootstrap.servers``, ``topics`` (comma-separated),
    ``startingOffsets`` (``earliest`` | ``latest``, for a new checkpoint only),
    ``maxEventsPerTrigger`` (records per micro-batch, shared fairly among
    partitions) and ``transactionTopic`` (comma-separated: one per source database; read too,
    and each must have one partition).
    """

    @classmethod
    def name(cls) -> str:
        """The format name for ``spark.readStream.format``."""
        return SOURCE_NAME

    def schema(self) -> str:
        """Fixed row schema; ``value`` is the record's JSON text, null for a tombstone."""
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        """The micro-batch reader for this source's options."""
        return KafkaStreamReader(KafkaSourceConfig.from_options(self.options))


def register_kafka_source(spark: SparkSession) -> None:
    """Register ``txjoin_kafka`` with ``spark`` and ship this module to Python workers by value.

    The workers import nothing from txjoin: the module is pickled with the
    reader, so the package need not be installed where tasks run.
    """
    import sys

    from pyspark import cloudpickle

    from txjoin import errors

    cloudpickle.register_pickle_by_value(errors)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(KafkaSource)


def read_stream(
    spark: SparkSession,
    bootstrap: str,
    topics: Sequence[str],
    transaction_topic: str | Sequence[str] | None = None,
    starting_offsets: str = "earliest",
    max_events: int | None = None,
) -> DataFrame:
    """Streaming DataFrame of ``topics`` (plus ``transaction_topic``) via ``txjoin_kafka``."""
    register_kafka_source(spark)
    reader = (spark.readStream.format(SOURCE_NAME)
              .option("bootstrap.servers", bootstrap)
              .option("topics", ",".join(topics))
              .option("startingOffsets", starting_offsets))
    if transaction_topic:
        names = [transaction_topic] if isinstance(transaction_topic, str) else transaction_topic
        reader = reader.option("transactionTopic", ",".join(names))
    if max_events is not None:
        reader = reader.option("maxEventsPerTrigger", str(max_events))
    return reader.load()
