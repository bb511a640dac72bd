"""``txjoin export``: a broker's topics as files, in Kafka Connect's S3/file sink layout.

``OUT/<topic>/partition=<p>/<topic>+<p>+<start offset>.json``, one record value
per line (``null`` for a tombstone), at most ``--records-per-file`` records per
file: what ``txjoin run --source files:OUT`` reads (``txjoin.ingest.spark.files``).
Running it again appends only the records written since (new files continue each
partition at the end of its last file), so a job reading OUT sees them arrive.
Each file is written under a temporary name and renamed, so a reader never sees
half a file.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

from txjoin.errors import ConfigError, ServiceError

DEFAULT_RECORDS_PER_FILE = 10_000


def file_name(topic: str, partition: int, start: int) -> str:
    """``<topic>+<partition>+<start offset>.json``, as Kafka Connect's sinks name files."""
    return f"{topic}+{partition}+{start}.json"


def partition_dir(out: Path, topic: str, partition: int) -> Path:
    """``OUT/<topic>/partition=<p>``."""
    return out / topic / f"partition={partition}"


def archived_end(out: Path, topic: str, partition: int) -> int | None:
    """The offset after the last archived record of a partition (None: nothing archived)."""
    folder = partition_dir(out, topic, partition)
    if not folder.is_dir():
        return None
    pattern = re.compile(rf"^{re.escape(topic)}\+{partition}\+(\d+)\.json$")
    last: tuple[int, Path] | None = None
    for entry in folder.iterdir():
        match = pattern.match(entry.name)
        if match and (last is None or int(match.group(1)) > last[0]):
            last = (int(match.group(1)), entry)
    if last is None:
        return None
    with last[1].open(encoding="utf-8") as fh:
        return last[0] + sum(1 for _ in fh)


def write_segment(out: Path, topic: str, partition: int, start: int,
                  values: Sequence[str | None]) -> Path:
    """One file holding ``values`` at offsets ``start...``; written whole, then renamed."""
    folder = partition_dir(out, topic, partition)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / file_name(topic, partition, start)
    temp = folder / f".{final.name}.{uuid.uuid4().hex}.tmp"
    with temp.open("w", encoding="utf-8") as fh:
        for value in values:
            if value is not None and "\n" in value:
                raise ConfigError(f"{topic}[{partition}]: a record value contains a newline; "
                                  "the line-per-record layout needs compact JSON")
            fh.write("null\n" if value is None else value + "\n")
    os.replace(temp, final)
    return final


def write_records(out: Path, topic: str, partition: int, start: int,
                  values: Iterable[str | None],
                  records_per_file: int = DEFAULT_RECORDS_PER_FILE) -> list[Path]:
    """Archive a partition's records from offset ``start``, ``records_per_file`` per file."""
    written: list[Path] = []
    chunk: list[str | None] = []
    offset = start
    for value in values:
        chunk.append(value)
        if len(chunk) == records_per_file:
            written.append(write_segment(out, topic, partition, offset, chunk))
            offset += len(chunk)
            chunk = []
    if chunk:
        written.append(write_segment(out, topic, partition, offset, chunk))
    return written


def export_topics(bootstrap: str, topics: Sequence[str], out: Path,
                  records_per_file: int = DEFAULT_RECORDS_PER_FILE,
                  timeout: float = 15.0) -> dict[str, int]:
    """Copy ``topics`` from the broker to ``out``; returns records written per topic.

    Each partition continues at the end of what ``out`` already holds, up to the
    high watermark read at the start.
    """
    import confluent_kafka
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        metadata = admin.list_topics(timeout=timeout)
    except confluent_kafka.KafkaException as exc:
        raise ServiceError(f"cannot reach the broker at {bootstrap!r}: {exc}") from exc
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"txjoin-export-{uuid.uuid4()}",
        "enable.auto.commit": False, "enable.partition.eof": False})
    counts: dict[str, int] = {}
    try:
        for topic in topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None:
                continue  # not created yet: nothing to export
            counts[topic] = 0
            for partition in sorted(meta.partitions):
                tp = confluent_kafka.TopicPartition(topic, partition)
                low, high = consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)
                start = archived_end(out, topic, partition)
                start = low if start is None else start
                if start < low:
                    raise ServiceError(
                        f"{topic}[{partition}]: {out} ends at offset {start} but the broker "
                        f"keeps offsets from {low}; export to an empty directory")
                if start >= high:
                    continue
                values = _consume(consumer, topic, partition, start, high)
                write_records(out, topic, partition, start, values, records_per_file)
                counts[topic] += high - start
    finally:
        consumer.close()
    return counts


def _consume(consumer: object, topic: str, partition: int, start: int, end: int
             ) -> list[str | None]:
    import confluent_kafka

    assert isinstance(consumer, confluent_kafka.Consumer)
    consumer.assign([confluent_kafka.TopicPartition(topic, partition, start)])
    values: list[str | None] = []
    expected = start
    while expected < end:
        messages = consumer.consume(min(10_000, end - expected), timeout=5.0)
        if not messages:
            raise ServiceError(f"{topic}[{partition}]: no records after offset {expected} "
                               f"although the broker announced up to {end - 1}")
        for msg in messages:
            if msg.error() is not None:
                raise ServiceError(f"{topic}[{partition}]: {msg.error()}")
            offset = msg.offset()
            if offset is None or offset >= end:
                continue
            if offset != expected:
                raise ServiceError(f"{topic}[{partition}]: expected offset {expected}, got "
                                   f"{offset} (compacted topics cannot be archived densely)")
            raw = msg.value()
            values.append(None if raw is None else raw.decode("utf-8"))
            expected += 1
    return values
