"""``txjoin_replay``: a streaming source that replays a scenario's schedule, one batch per trigger.

The schedule file (JSON, written by the harness) is a list of batches, each a
list of records ``[topic, partition, offset, key, value]`` and the topics the
batch reads to their end (``caught_up``). The offset in the checkpoint is
``{"batch": n}``: the number of schedule batches consumed. Each micro-batch
delivers exactly one schedule batch, so the harness can read the sinks after
every one of them; ``until`` stops an ``availableNow`` run at a restart point.
The rows have the same schema as ``txjoin_kafka`` (caught-up topics as marker
rows with offset -1), so everything after the source is the same code path.

Like ``txjoin_kafka``, the source checks the checkpoint's offset on start and on
every batch: the offset also records a digest of the schedule, and a checkpoint
of another schedule, or one beyond the schedule's end, stops the query with a
``CheckpointError``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

from txjoin.errors import CheckpointError
from txjoin.spark.sources.kafka import ARROW_SCHEMA, RECOVER, SCHEMA_DDL, caught_up_batch

SOURCE_NAME = "txjoin_replay"


def write_schedule(path: str, batches: Sequence[tuple[Sequence[Sequence[Any]], Sequence[str]]]
                   ) -> None:
    """Write ``[(records, caught_up_topics), ...]`` for the replay source."""
    doc = [{"records": [list(r) for r in records], "caught_up": sorted(caught)}
           for records, caught in batches]
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)


class ReplayPartition(InputPartition):
    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


class ReplayStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are batch numbers; one schedule batch per micro-batch."""

    def __init__(self, path: str, until: int | None) -> None:
        self.path = path
        with open(path, "rb") as fh:
            raw = fh.read()
        self.batches = json.loads(raw)
        self.digest = hashlib.blake2b(raw, digest_size=8).hexdigest()
        self.until = len(self.batches) if until is None else min(until, len(self.batches))

    def _offset(self, batch: int) -> dict[str, Any]:
        return {"batch": batch, "schedule": self.digest}

    def validate(self, offset: dict[str, Any]) -> None:
        """``CheckpointError`` unless ``offset`` belongs to this schedule and lies within it."""
        recorded = offset.get("schedule")
        if recorded is not None and recorded != self.digest:
            raise CheckpointError(
                f"{SOURCE_NAME}: the checkpoint was written for another schedule than "
                f"{self.path} (digest {recorded}, the file's is {self.digest}); {RECOVER}")
        if offset.get("batch", 0) > len(self.batches):
            raise CheckpointError(
                f"{SOURCE_NAME}: the checkpoint's offset {offset['batch']} for {self.path} is "
                f"beyond the schedule's end (batches 0..{len(self.batches)}); {RECOVER}")

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
        return [ReplayPartition(i) for i in range(start["batch"], end["batch"])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ReplayPartition)
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
        yield caught_up_batch(batch["caught_up"])

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release."""


class ReplaySource(DataSource):
    """Options: ``schedule`` (path of the JSON schedule), ``until`` (batch count, optional)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        until = self.options.get("until")
        return ReplayStreamReader(self.options["schedule"], int(until) if until else None)
