"""``txjoin_replay``: a streaming source that replays a scenario's schedule, one batch per trigger.

The schedule file (JSON, written by the harness) is a list of batches, each a
list of records ``[topic, partition, offset, key, value]`` and the topics the
batch reads to their end (``caught_up``). The offset in the checkpoint is
``{"batch": n}``: the number of schedule batches consumed. Each micro-batch
delivers exactly one schedule batch, so the harness can read the sinks after
every one of them; ``until`` stops an ``availableNow`` run at a restart point.
The rows have the schema of ``markers.SCHEMA_DDL`` (caught-up topics as marker
rows with offset -1; in every batch the topics with records in a partition > 0,
with their partition count, as marker rows with offset -2; and the schedule's
``caught_up_partitions`` of those topics as rows with offset -3), so everything
after the source is the same code path as for Spark's kafka source (whose facts come
from ``kafka.KafkaFacts`` instead of marker rows).

Like the kafka path, the source checks the checkpoint's offset on start and on
every batch: the offset also records a digest of the schedule, and a checkpoint
of another schedule, or one beyond the schedule's end, stops the query with a
``CheckpointError``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

from txjoin.errors import RECOVER, CheckpointError
from txjoin.ingest.spark import worker
from txjoin.ingest.spark.markers import ARROW_SCHEMA, SCHEMA_DDL, caught_up_batch

SOURCE_NAME = "txjoin_replay"


Batch = tuple[Sequence[Sequence[Any]], Sequence[str]] | tuple[
    Sequence[Sequence[Any]], Sequence[str], Mapping[str, Sequence[int]]]
"""(records, caught-up topics[, topic -> partitions read to their end, for topics with
several partitions])."""


def write_schedule(path: str, batches: Sequence[Batch]) -> None:
    """Write ``[(records, caught_up_topics[, caught_up_partitions]), ...]`` for the replay
    source."""
    doc = [{"records": [list(r) for r in batch[0]], "caught_up": sorted(batch[1]),
            "caught_up_partitions": _parts(batch)} for batch in batches]
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)


def add_partition_counts(counts: dict[str, int], records: Iterable[Sequence[Any]]) -> None:
    """Grow ``counts`` (topic -> partitions, for topics with a record in a partition > 0)
    to cover the partitions of ``records`` (``[topic, partition, ...]``)."""
    for r in records:
        if r[1] > 0:
            counts[r[0]] = max(counts.get(r[0], 1), int(r[1]) + 1)


def _parts(batch: Batch) -> dict[str, list[int]]:
    return {t: sorted(p) for t, p in sorted(batch[2].items())} if len(batch) > 2 else {}


def write_schedule_dir(path: str, batches: Iterable[Batch]) -> int:
    """Like :func:`write_schedule`, one file per batch in directory ``path`` (large replays:
    each read task loads only its batch). Returns the number of batches."""
    os.makedirs(path, exist_ok=True)
    topics: list[list[str]] = []
    counts: dict[str, int] = {}
    for batch in batches:
        records, caught = batch[0], batch[1]
        index = len(topics)
        per_topic: dict[str, list[list[Any]]] = {}
        for r in records:
            per_topic.setdefault(r[0], []).append(list(r))
        add_partition_counts(counts, records)
        for n, topic in enumerate(sorted(per_topic)):
            with open(os.path.join(path, f"batch-{index:06d}-{n}.json"), "w",
                      encoding="utf-8") as fh:
                json.dump({"records": per_topic[topic], "caught_up": []}, fh)
        with open(os.path.join(path, f"batch-{index:06d}.json"), "w", encoding="utf-8") as fh:
            json.dump({"records": [], "caught_up": sorted(caught),
                       "caught_up_partitions": _parts(batch)}, fh)
        topics.append(sorted(per_topic))
    with open(os.path.join(path, "index.json"), "w", encoding="utf-8") as fh:
        json.dump({"batches": len(topics), "topics": topics,
                   "partitions": dict(sorted(counts.items()))}, fh)
    return len(topics)


def _load_batch(path: str, index: int, part: int | None = None) -> dict[str, Any]:
    name = f"batch-{index:06d}.json" if part is None else f"batch-{index:06d}-{part}.json"
    with open(os.path.join(path, name), encoding="utf-8") as fh:
        batch: dict[str, Any] = json.load(fh)
    return batch


class ReplayPartition(InputPartition):
    """Schedule batch ``index``; ``topic``: only that topic's records ("" = the caught-up
    markers) when the schedule is a directory, read one partition per topic."""

    def __init__(self, index: int, topic: str | None = None) -> None:
        super().__init__(index)
        self.index = index
        self.topic = topic


class ReplayStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are batch numbers; one schedule batch per micro-batch."""

    def __init__(self, path: str, until: int | None) -> None:
        self.path = path
        self.is_dir = os.path.isdir(path)
        index_path = os.path.join(path, "index.json") if self.is_dir else path
        with open(index_path, "rb") as fh:
            raw = fh.read()
        self.digest = hashlib.blake2b(raw, digest_size=8).hexdigest()
        if self.is_dir:
            index = json.loads(raw)
            self.count = int(index["batches"])
            self.batches: list[Any] = []
            self.topics: list[list[str]] = index["topics"]
            self.partitioned: dict[str, int] = index.get("partitions", {})
        else:
            self.batches = json.loads(raw)
            self.count = len(self.batches)
            self.partitioned = {}
            for batch in self.batches:
                add_partition_counts(self.partitioned, batch["records"])
        self.until = self.count if until is None else min(until, self.count)

    def _offset(self, batch: int) -> dict[str, Any]:
        return {"batch": batch, "schedule": self.digest}

    def validate(self, offset: dict[str, Any]) -> None:
        """``CheckpointError`` unless ``offset`` belongs to this schedule and lies within it."""
        recorded = offset.get("schedule")
        if recorded is not None and recorded != self.digest:
            raise CheckpointError(
                f"{SOURCE_NAME}: the checkpoint was written for another schedule than "
                f"{self.path} (digest {recorded}, the file's is {self.digest}); {RECOVER}")
        if offset.get("batch", 0) > self.count:
            raise CheckpointError(
                f"{SOURCE_NAME}: the checkpoint's offset {offset['batch']} for {self.path} is "
                f"beyond the schedule's end (batches 0..{self.count}); {RECOVER}")

    def initialOffset(self) -> dict[str, Any]:
        return self._offset(0)

    def prepareForTriggerAvailableNow(self) -> None:
        """Nothing to freeze: the schedule is fixed; ``until`` bounds the run."""

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if not start:
            return self._offset(0)
        self.validate(start)
        return self._offset(max(start["batch"], min(start["batch"] + 1, self.until)))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self.validate(start)
        self.validate(end)
        if not self.is_dir:
            return [ReplayPartition(i) for i in range(start["batch"], end["batch"])]
        # One input partition per topic, read (and decoded) in parallel, as Kafka's are.
        parts: list[InputPartition] = []
        for i in range(start["batch"], end["batch"]):
            parts += [ReplayPartition(i, t) for t in [*self.topics[i], ""]]
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        worker.settle()
        assert isinstance(partition, ReplayPartition)
        if partition.topic is not None:
            if partition.topic == "":
                markers = _load_batch(self.path, partition.index)
                yield caught_up_batch(markers["caught_up"], self.partitioned,
                                      markers.get("caught_up_partitions"))
                return
            part = self.topics[partition.index].index(partition.topic)
            batch = _load_batch(self.path, partition.index, part)
        else:
            batch = self.batches[partition.index]
        records = batch["records"]
        yield pa.RecordBatch.from_arrays([
            pa.array([r[0] for r in records], pa.string()),
            pa.array([r[1] for r in records], pa.int32()),
            pa.array([r[2] for r in records], pa.int64()),
            pa.array([r[3] for r in records], pa.string()),
            pa.array([r[4] for r in records], pa.string()),
            pa.array([None] * len(records), pa.timestamp("us", tz="UTC")),
        ], schema=ARROW_SCHEMA)
        if partition.topic is None:
            yield caught_up_batch(batch["caught_up"], self.partitioned,
                                  batch.get("caught_up_partitions"))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release."""


class ReplaySource(DataSource):
    """Options: ``schedule`` (a JSON schedule file, or a directory written by
    :func:`write_schedule_dir`), ``until`` (batch count, optional)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        until = self.options.get("until")
        return ReplayStreamReader(self.options["schedule"], int(until) if until else None)
