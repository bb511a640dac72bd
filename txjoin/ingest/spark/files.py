"""``txjoin_files``: Debezium records archived by a Kafka Connect S3/file sink, as a stream.

Layout (what Kafka Connect's S3 sink writes with ``JsonFormat`` and the default
partitioner, and what ``txjoin export`` writes)::

    DIR/<topic>/partition=<p>/<topic>+<p>+<start offset>.json

one record value per line, ``null`` for a tombstone; the i-th line (from 0) of a
file is the record at offset ``start + i``. The rows have exactly the schema of
``markers.SCHEMA_DDL`` (``key`` and ``timestamp`` are null: the sink does not store
them) with caught-up marker rows, so everything after the source is the Kafka code
path.

Offsets are Kafka's: ``{topic: {"<partition>": next offset}}`` plus
``__caught_up__``, checkpointed by Spark. Each ``latestOffset`` lists the
directory again, so files that appear while the job runs are read by the next
micro-batch; a partition whose last file has been read counts as read to its end
(the caught-up rule: "no newer file" plays the broker's high watermark). A table
topic with several ``partition=<p>`` folders is declared partitioned in every
batch; its folders must all exist from the start
(the snapshot's end is read from every partition that the batch knows).

Files must appear complete (S3 objects do; on a local disk write them under
another name and rename, as ``txjoin export`` does): a file is read and checked
once, when first seen, and its record count is cached. Files of one partition
must tile its offsets: a gap (a missing file, records lost) or an overlap is an
error naming the file, as is a line that is not JSON (naming file and line).
Other names in the folders (temporary files, ``.tmp``) are ignored.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from txjoin.errors import ConfigError, DecodeError, OrderingError
from txjoin.ingest.spark import worker
from txjoin.ingest.spark.markers import (
    ARROW_SCHEMA,
    RESERVED,
    SCHEMA_DDL,
    CaughtUpPartition,
    Offsets,
    caught_up_batch,
    mark_caught_up,
    split_budget,
    topic_tuple,
)

SOURCE_NAME = "txjoin_files"
_PARTITION_DIR = re.compile(r"^partition=(\d+)$")
_BATCH = 10_000


@dataclass(frozen=True)
class SegmentFile:
    """One file of a topic-partition: records ``[start, start + count)``."""

    path: str
    start: int
    count: int

    @property
    def end(self) -> int:
        return self.start + self.count


def _file_pattern(topic: str, partition: int) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(topic)}\+{partition}\+(\d+)\.json$")


def read_lines(path: str) -> list[str]:
    """The record lines of a file (a final newline does not make an extra record)."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def check_lines(path: str, lines: list[str], topic: str, partition: int, start: int) -> None:
    """Every line must be a JSON document (``null`` for a tombstone); else a one-line error."""
    for number, line in enumerate(lines, start=1):
        try:
            json.loads(line)
        except ValueError as exc:
            raise DecodeError(
                f"{path}, line {number}: not a JSON record ({exc}); each line must hold "
                "one record value (null for a tombstone), as Kafka Connect's JsonFormat "
                "writes it", topic=topic, partition=partition, offset=start + number - 1
            ) from None


class Catalog:
    """The files of each topic-partition, listed from the directory and checked.

    Counts are cached by path (files are immutable once they appear), so a new
    listing reads only new files.
    """

    def __init__(self, directory: str, topics: Sequence[str]) -> None:
        self.directory = directory
        self.topics = tuple(topics)
        self._counts: dict[str, int] = {}

    def _count(self, path: str, topic: str, partition: int, start: int) -> int:
        count = self._counts.get(path)
        if count is None:
            lines = read_lines(path)
            check_lines(path, lines, topic, partition, start)
            count = self._counts[path] = len(lines)
        return count

    def partitions(self, topic: str) -> list[int]:
        folder = os.path.join(self.directory, topic)
        if not os.path.isdir(folder):
            return []
        numbers = []
        for name in os.listdir(folder):
            match = _PARTITION_DIR.match(name)
            if match and os.path.isdir(os.path.join(folder, name)):
                numbers.append(int(match.group(1)))
        return sorted(numbers)

    def segments(self, topic: str, partition: int) -> list[SegmentFile]:
        """The partition's files in offset order; raises on a gap or an overlap."""
        folder = os.path.join(self.directory, topic, f"partition={partition}")
        pattern = _file_pattern(topic, partition)
        starts = []
        for name in os.listdir(folder):
            match = pattern.match(name)
            if match:
                starts.append((int(match.group(1)), os.path.join(folder, name)))
        starts.sort()
        result: list[SegmentFile] = []
        for start, path in starts:
            segment = SegmentFile(path, start, self._count(path, topic, partition, start))
            if result:
                prev = result[-1]
                if segment.start > prev.end:
                    raise OrderingError(
                        f"{path}: starts at offset {segment.start} but {prev.path} ends at "
                        f"offset {prev.end - 1}, so offsets {prev.end}..{segment.start - 1} of "
                        f"{topic}[{partition}] are missing; restore the missing file")
                if segment.start < prev.end:
                    raise OrderingError(
                        f"{path}: starts at offset {segment.start}, inside {prev.path} "
                        f"(line {segment.start - prev.start + 1} has offset {segment.start}); "
                        f"files of {topic}[{partition}] overlap; remove the duplicate file")
            result.append(segment)
        return result

    def listing(self) -> dict[tuple[str, int], list[SegmentFile]]:
        """Every configured topic's partitions and files."""
        found: dict[tuple[str, int], list[SegmentFile]] = {}
        for topic in self.topics:
            for partition in self.partitions(topic):
                found[(topic, partition)] = self.segments(topic, partition)
        return found


@dataclass(frozen=True)
class FileSourceConfig:
    """The source's options, validated once."""

    directory: str
    topics: tuple[str, ...]
    max_events_per_trigger: int | None = None
    transaction_topic: str | tuple[str, ...] | None = None
    """The transaction topic, or several (a job over several source databases)."""

    @property
    def transaction_topics(self) -> tuple[str, ...]:
        """Every transaction topic (each must have exactly one partition)."""
        return topic_tuple(self.transaction_topic)

    @classmethod
    def from_options(cls, options: Any) -> FileSourceConfig:
        """Parse Spark's case-insensitive options object (read keys from it, never dict() it)."""
        directory = options.get("path") or ""
        if not directory:
            raise ConfigError(f"{SOURCE_NAME}: option 'path' (the archive directory) is required")
        if not os.path.isdir(directory):
            raise ConfigError(f"{SOURCE_NAME}: {directory!r} is not a directory; expected "
                              "<dir>/<topic>/partition=<p>/<topic>+<p>+<start offset>.json")
        tx_topics = tuple(t.strip() for t in (options.get("transactionTopic") or "").split(",")
                          if t.strip())
        transaction_topic = (None if not tx_topics else tx_topics[0] if len(tx_topics) == 1
                             else tx_topics)
        topics = [t.strip() for t in (options.get("topics") or "").split(",") if t.strip()]
        topics.extend(t for t in tx_topics if t not in topics)
        if not topics:
            raise ConfigError(f"{SOURCE_NAME}: option 'topics' is required "
                              "(comma-separated topic names)")
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
        return cls(os.path.abspath(directory), tuple(dict.fromkeys(topics)), max_events,
                   transaction_topic)


class FileRangePartition(InputPartition):
    """Records ``[start, end)`` of one topic-partition, with the files that hold them."""

    def __init__(self, topic: str, partition: int, start: int, end: int,
                 files: list[SegmentFile]) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.files = files


class FileStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches from directory listings; tasks read the planned line ranges."""

    def __init__(self, config: FileSourceConfig) -> None:
        self.config = config
        self.catalog = Catalog(config.directory, config.topics)
        self._target: Offsets | None = None
        self._latest: Offsets | None = None
        self._listing: dict[tuple[str, int], list[SegmentFile]] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Tasks need only the config and their partition's files.
        state = self.__dict__.copy()
        state["catalog"] = Catalog(self.config.directory, self.config.topics)
        state["_listing"] = {}
        return state

    def _check_transaction_topic(self, listing: dict[tuple[str, int], list[SegmentFile]]
                                 ) -> None:
        for topic in self.config.transaction_topics:
            parts = [p for (t, p) in listing if t == topic]
            if len(parts) > 1:
                raise ConfigError(
                    f"{SOURCE_NAME}: transaction topic {topic!r} has {len(parts)} partitions in "
                    f"{self.config.directory} but must have exactly 1 (transaction order is only "
                    "kept within a partition)")

    def _ends(self, low: bool) -> Offsets:
        self._listing = self.catalog.listing()
        self._check_transaction_topic(self._listing)
        offsets: Offsets = {}
        for (topic, partition), files in self._listing.items():
            value = (files[0].start if low else files[-1].end) if files else 0
            offsets.setdefault(topic, {})[str(partition)] = value
        return offsets

    def initialOffset(self) -> Offsets:
        """The first offset of each partition's earliest file (Kafka's ``earliest``)."""
        return self._ends(low=True)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxEventsPerTrigger`` as a ReadMaxRows limit, else everything available."""
        if self.config.max_events_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.config.max_events_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        """Freeze the end of an ``availableNow`` run at the files present now."""
        self._target = self._ends(low=False)

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        """End offsets of the next micro-batch: the end of the last file, capped by ``limit``."""
        listed = self._ends(low=False)
        high = self._target if self._target is not None else listed
        self._latest = high
        begin: dict[tuple[str, int], int] = {}
        available: dict[tuple[str, int], int] = {}
        for topic, parts in high.items():
            for part, hi in parts.items():
                lo = start.get(topic, {}).get(part, 0)
                files = self._listing.get((topic, int(part)), [])
                if files and lo < files[0].start:
                    raise OrderingError(
                        f"{SOURCE_NAME}: the checkpoint continues {topic}[{part}] at offset "
                        f"{lo} but its earliest file {files[0].path} starts at offset "
                        f"{files[0].start}; offsets {lo}..{files[0].start - 1} are missing")
                begin[(topic, int(part))] = lo
                available[(topic, int(part))] = max(0, hi - lo)
        grants = (split_budget(available, limit.max_rows) if isinstance(limit, ReadMaxRows)
                  else available)
        end: Offsets = {}
        for (topic, number), lo in begin.items():
            end.setdefault(topic, {})[str(number)] = lo + grants[(topic, number)]
        for topic, parts in start.items():
            if topic in RESERVED:
                continue
            for part, offset in parts.items():
                end.setdefault(topic, {}).setdefault(part, offset)
        mark_caught_up(end, {k: grants[k] == available[k] for k in begin}, self.config.topics)
        return end

    def reportLatestOffset(self) -> Offsets | None:
        """The file ends seen by the last ``latestOffset`` call (for query progress)."""
        return self._latest

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        """One input partition per topic-partition with records in ``[start, end)``."""
        result: list[InputPartition] = []
        markers = CaughtUpPartition.of(end)
        if markers is not None:
            result.append(markers)
        listing = self._listing
        for topic, parts in sorted(end.items()):
            if topic in RESERVED:
                continue
            for part, hi in sorted(parts.items(), key=lambda kv: int(kv[0])):
                lo = start.get(topic, {}).get(part, 0)
                if hi <= lo:
                    continue
                files = listing.get((topic, int(part)))
                if files is None or not files or files[-1].end < hi:
                    # A re-planned batch after a restart: list again.
                    listing = self._listing = self.catalog.listing()
                    files = listing.get((topic, int(part)), [])
                needed = [f for f in files if f.end > lo and f.start < hi]
                result.append(FileRangePartition(topic, int(part), lo, hi, needed))
        return result

    def commit(self, end: Offsets) -> None:
        """Nothing to do: the checkpoint owns the offsets."""

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Yield the records of the planned range as Arrow batches."""
        worker.settle()
        if isinstance(partition, CaughtUpPartition):
            return iter([caught_up_batch(partition.topics, partition.partitioned, partition.parts)])
        assert isinstance(partition, FileRangePartition)
        return _read_range(partition)


def _read_range(part: FileRangePartition) -> Iterator[pa.RecordBatch]:
    offset = part.start
    for segment in part.files:
        if offset >= part.end:
            break
        if segment.start > offset:
            raise OrderingError(f"{segment.path}: expected a file holding offset {offset} of "
                                f"{part.topic}[{part.partition}]")
        lines = read_lines(segment.path)
        if len(lines) != segment.count:
            raise OrderingError(f"{segment.path}: had {segment.count} records when listed, "
                                f"now {len(lines)}; archived files must not change")
        first = offset - segment.start
        last = min(segment.count, part.end - segment.start)
        for chunk in range(first, last, _BATCH):
            values = lines[chunk:min(last, chunk + _BATCH)]
            yield _to_batch(part, segment.start + chunk, values)
        offset = segment.start + last
    if offset < part.end:
        raise OrderingError(f"{SOURCE_NAME}: offsets {offset}..{part.end - 1} of "
                            f"{part.topic}[{part.partition}] were planned but no file holds "
                            "them (was a file removed?)")


def _to_batch(part: FileRangePartition, first: int, lines: list[str]) -> pa.RecordBatch:
    n = len(lines)
    values = [None if line.strip() == "null" else line for line in lines]
    return pa.RecordBatch.from_arrays([
        pa.array([part.topic] * n, pa.string()),
        pa.array([part.partition] * n, pa.int32()),
        pa.array(range(first, first + n), pa.int64()),
        pa.array([None] * n, pa.string()),
        pa.array(values, pa.string()),
        pa.array([None] * n, pa.timestamp("us", tz="UTC")),
    ], schema=ARROW_SCHEMA)


class FileSource(DataSource):
    """Spark data source ``txjoin_files``: archived Debezium records as ``SCHEMA_DDL`` rows.

    Options: ``path`` (the archive directory), ``topics`` (comma-separated),
    ``transactionTopic`` (comma-separated, one per source; read too; at most one partition) and
    ``maxEventsPerTrigger``. A new checkpoint starts at each partition's earliest
    file.
    """

    @classmethod
    def name(cls) -> str:
        """The format name for ``spark.readStream.format``."""
        return SOURCE_NAME

    def schema(self) -> str:
        """``markers.SCHEMA_DDL`` rows; ``key`` and ``timestamp`` are always null."""
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        """The micro-batch reader for this source's options."""
        return FileStreamReader(FileSourceConfig.from_options(self.options))


def register_file_source(spark: SparkSession) -> None:
    """Register ``txjoin_files`` and ship its modules to Python workers by value."""
    import sys

    from pyspark import cloudpickle

    from txjoin import errors
    from txjoin.ingest.spark import kafka

    for module in (errors, kafka, sys.modules[__name__]):
        cloudpickle.register_pickle_by_value(module)
    spark.dataSource.register(FileSource)


def read_stream(spark: SparkSession, directory: str, topics: Sequence[str],
                transaction_topic: str | Sequence[str] | None = None,
                max_events: int | None = None) -> DataFrame:
    """Streaming DataFrame of ``topics`` (plus ``transaction_topic``) archived in ``directory``."""
    register_file_source(spark)
    reader = (spark.readStream.format(SOURCE_NAME)
              .option("path", directory)
              .option("topics", ",".join(topics)))
    if transaction_topic:
        names = [transaction_topic] if isinstance(transaction_topic, str) else transaction_topic
        reader = reader.option("transactionTopic", ",".join(names))
    if max_events is not None:
        reader = reader.option("maxEventsPerTrigger", str(max_events))
    return reader.load()


def parse_source(source: str) -> str | None:
    """The directory of a ``files:DIR`` source option; None for ``kafka`` (the default)."""
    if source in ("", "kafka"):
        return None
    if source.startswith("files:") and len(source) > len("files:"):
        return source[len("files:"):]
    raise ConfigError(f"--source {source!r}: expected 'kafka' or 'files:DIR'")
