"""The rows txjoin's Python streaming sources (replay, files) hand the pipeline, and their markers.

Rows are ``SCHEMA_DDL``: ``topic, partition, offset, key, value, timestamp``, the
columns Spark's own ``kafka`` source gives once ``key``/``value`` are cast to strings.
Offsets in these sources' checkpoints are Kafka's ``{topic: {"<partition>": next
offset}}``, plus reserved entries that record, per batch, which topics (and, for topics
with several partitions, which partitions) it reads to the end of what was there when it
was planned. Being part of the checkpointed offsets, a re-run of a batch reports the
same. One extra input partition turns them into marker rows (negative offsets,
:func:`caught_up_batch`), which the shards read back with :func:`read_markers`; no other
module knows the offsets' codes. Caught-up topics settle the snapshot of empty
tables and confirm restarted transactions (``txjoin.sequence.assembly``).

Spark's ``kafka`` format has no such markers: ``txjoin.ingest.spark.kafka`` derives the
same facts from its read limit and the topics' partition counts instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from txjoin.sequence.assembly import TopicPartitions

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

CAUGHT_UP = "__caught_up__"
CAUGHT_UP_PARTS = "__caught_up_partitions__"  # {topic: [partition, ...]}, topics with several
PARTITIONS = "__partitions__"
CAUGHT_UP_OFFSET = -1  # marker row: the topic was read to its end in this batch
PARTITIONS_OFFSET = -2  # marker row: the topic has `partition` partitions
PARTITION_CAUGHT_UP_OFFSET = -3  # marker row: partition `partition` was read to its end
TOPIC_IDS = "__topic_ids__"
RESERVED = (CAUGHT_UP, CAUGHT_UP_PARTS, TOPIC_IDS)

def is_marker(offset: Any) -> Any:
    """Whether a row is a marker row, for an offset, a pandas, Arrow or Spark column
    (marker rows are exactly the rows with a negative offset)."""
    if isinstance(offset, pa.Array | pa.ChunkedArray):
        return pc.less(offset, 0)
    return offset < 0


def read_markers(rows: Iterable[tuple[str, int, int]], streams: Mapping[str, str]
                 ) -> tuple[set[str], TopicPartitions | None]:
    """What a batch's marker rows (topic, partition, offset) say, by stream name
    (``streams``: topic -> stream, see ``Job.streams``): the streams read to their end,
    and for topics with several partitions their counts and the partitions read to
    their end (``None``: no such topic). The inverse of :func:`caught_up_batch`."""
    caught: set[str] = set()
    counts: dict[str, int] = {}
    parts: dict[str, set[int]] = {}
    for topic, partition, offset in rows:
        stream = streams.get(topic)
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


def topic_tuple(topics: str | Sequence[str] | None) -> tuple[str, ...]:
    """One topic, several, or none, as a tuple (the sources' ``transaction_topic`` option)."""
    if topics is None:
        return ()
    if isinstance(topics, str):
        return (topics,)
    return tuple(topics)



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
