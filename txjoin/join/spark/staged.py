"""The Spark side of the staged engine (``join/staged.py``): a sequencer stage, then the shards.

Shape (``txjoin run --engine staged``)::

    source -> envelopes (the JVM: what routing reads of every job table's records,
              the fact key's shard: join/spark/routing.py)
      -> copies (route_staged): one per record for the sequencer (its metadata as
         columns; a marker, or a record routing could not read, whole), one per shard
         that holds its rows (a fact to the owner(s) of its key, every other table's
         rows to every shard; no marker, no other shard's fact)
      -> groupBy(shard).transformWithStateInPandas(SequencerProcessor): the
         sequencer's group (SEQUENCER_LABEL, one task): the core's assembly and commit
         order (its log in the state store), and the batch's releases, one row per shard
         (RELEASES_OFFSET); each shard's group passes its copies through unchanged
      -> with split tables (``--split``), one owner stage per depth
         (``join/spark/owners.py``): the rows the shards' facts read, forwarded
      -> groupBy(shard).transformWithStateInPandas(ApplierProcessor): each shard's
         rows kept per open transaction and applied as released (its log, its output)

Spark runs the second stateful operator on the first one's output in the same
micro-batch, so a transaction released by the sequencer is applied by the shards in the
batch that completes it, as in the sharded engine. Both stages keep their state in
Spark's state store (RocksDB) as ``state_log.ShardLog`` logs (layout
``STAGED_LAYOUT``), and each runs in its host process (``host.py``) like a shard: after a
crash Spark re-runs the batch from the previous state, and both being deterministic,
the same releases and changes come out.

Why the shards' copies pass through the first stage: Spark plans one source for branches
of a query that read the same stream, but runs each branch's scan on its own (the records
read and parsed in the JVM once per branch: no exchange is shared between the branches of
a streaming plan, a ``repartition`` before them included), and a stateful stage's output
cannot feed two branches (each would run the stage); through one stage the source is read
once. What it costs: each shard's copies cross into Python and back once more (its own
group: in parallel, as the shards), and the sequencer is one task.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from txjoin import crashpoints
from txjoin.ingest.debezium import ChangeEvent, transaction_topic
from txjoin.ingest.spark.kafka import KafkaFacts
from txjoin.job import Job
from txjoin.join.placement import Placement
from txjoin.join.routing import METADATA_SIZE, Routed, is_metadata_only, metadata_only
from txjoin.join.spark.routing import _METADATA, _READ, envelopes
from txjoin.join.spark.shards import ShardProcessor, routed_items
from txjoin.join.staged import (
    SEQUENCER,
    STAGED_LAYOUTS,
    ReleaseColumns,
    Sequencer,
    ShardApplier,
)
from txjoin.join.state_log import ShardLog
from txjoin.sequence.assembly import IncompletePolicy

if TYPE_CHECKING:

    from txjoin.join.spark.owners import OwnerProcessor

SEQUENCER_LABEL = -1
"""The sequencer's grouping label (the shards' are ``shards.shard_labels``, never
negative)."""

RELEASES_OFFSET = -100
"""The offset of a release row: the sequencer's output to one shard (negative, as a marker
row's, but none of the sources' marker codes: ``ingest/spark/markers.py``)."""

FORWARD_OFFSET = -101
"""The offset of an owner's row to a shard (its ``partition``: the owner's number)."""

SUBSCRIBE_OFFSET = -102
"""The offset of an owner's row to an owner of the next depth."""

ROUTED_SCHEMA = ("shard int, topic string, partition int, offset long, value binary, "
                 "counted boolean, routed boolean, op string, tbl string, xid string, "
                 "lsn string, ts_ms string, snapshot string, dco string, digest binary, "
                 "after_elsewhere boolean, refs string")
"""The rows every stage reads (``routing.ROUTED_COLUMNS``, the value as bytes, and a
depth-1 owner's copy of a streaming fact record as its reads, ``refs``, without the
record): each stage's output has it too, so they unite."""


def special_rows(frame: pa.Table, offset: int) -> tuple[list[Any], pa.Table]:
    """The unpickled payloads of ``frame``'s rows at ``offset``, by their ``partition``
    (the sender's number: the same order whatever the order the rows came in), and the
    frame without them."""
    at = pc.equal(frame["offset"], offset)
    if not pc.any(at).as_py():
        return [], frame
    rows = frame.filter(at)
    pairs = sorted(zip(rows["partition"].to_pylist(), rows["value"].to_pylist(), strict=True))
    return [pickle.loads(value) for _sender, value in pairs], frame.filter(pc.invert(at))


def payload_columns(rows: Sequence[tuple[int, int, int, bytes]]) -> dict[str, list[Any]]:
    """Rows (``ROUTED_SCHEMA``, by column) that carry a stage's output to a later stage's
    groups: per row the group's label, the sender's number (``partition``), the kind of
    payload (its ``offset``) and the payload, pickled."""
    n = len(rows)
    none: list[Any] = [None] * n
    labels, senders, offsets, payloads = (list(c) for c in zip(*rows, strict=True)) if rows \
        else ([], [], [], [])
    return {"shard": labels, "topic": [""] * n, "partition": senders, "offset": offsets,
            "value": payloads, "counted": [False] * n, "routed": [False] * n, "op": none,
            "tbl": none, "xid": none, "lsn": none, "ts_ms": none, "snapshot": none,
            "dco": none, "digest": none, "after_elsewhere": [False] * n, "refs": none}


def route_staged(source: DataFrame, job: Job, prefixes: str | Mapping[str, str],
                 labels: Sequence[int], placement: Placement | None = None,
                 owner_labels: Sequence[Sequence[int]] = ()) -> DataFrame:
    """``source`` rows -> the rows of every stage (``ROUTED_SCHEMA``): the sequencer's copy
    of every record (``SEQUENCER_LABEL``), each shard's copies, and with ``placement``'s
    split tables each owner's (``owner_labels``: per depth, an owner's label by number):
    the records of its rows and, at depth 1, the fact records that reference them."""
    n = len(labels)
    split = placement is not None and bool(placement)
    rows = envelopes(source, job, prefixes, n, every_table=True, placement=placement)
    markers = sorted({transaction_topic(p) for p in (
        [prefixes] if isinstance(prefixes, str) else prefixes.values())})
    is_marker_topic = f"`topic` IN ({', '.join(repr(t) for t in markers)})"
    owners = [label for depth in owner_labels for label in depth] if split else []
    everyone = ", ".join(str(int(label)) for label in [SEQUENCER_LABEL, *labels, *owners])
    exploded = rows.selectExpr("*", f"posexplode(array({everyone})) AS (j, shard)")
    i = "(j - 1)"  # the shard's number
    owner = f"({i} = before_shard OR {i} = after_shard)"
    # the sequencer gets every row, tombstones too: under a read limit it tells a topic
    # read to its end by the records the batch read of it (ingest/spark/kafka.py)
    sequencer = "true"
    shard = (f"`offset` >= 0 AND `value` IS NOT NULL AND NOT {is_marker_topic} "
             f"AND (NOT (routed AND fact_topic) OR {owner})")
    if split:
        o = f"(j - {n + 1})"  # over the owners of every depth
        shard += " AND NOT split_topic"
        to_owner = (f"`offset` >= 0 AND `value` IS NOT NULL AND owner_depth = {o} DIV {n} + 1 "
                    f"AND array_contains(owners, {o} % {n})")
        where = (f"CASE WHEN j = 0 THEN {sequencer} WHEN j <= {n} THEN {shard} "
                 f"ELSE coalesce({to_owner}, false) END")
    else:
        where = f"CASE WHEN j = 0 THEN {sequencer} ELSE {shard} END"
    kept = exploded.where(where)
    # a depth-1 owner's copy of a streaming fact record: its reads, not the record
    compact = f"j > {n} AND refs IS NOT NULL" if split else "false"
    return kept.selectExpr(
        "CAST(shard AS INT) AS shard", *_READ[:3],
        f"CASE WHEN (j = 0 AND routed) OR {compact} THEN NULL "
        f"ELSE CAST(`value` AS BINARY) END AS `value`",
        "j = 0 AND `offset` >= 0 AS counted", *_METADATA,
        f"coalesce(j > 0 AND j <= {n} AND routed AND {i} = before_shard "
        f"AND after_shard != before_shard, false) AS after_elsewhere",
        f"CASE WHEN {compact} THEN refs END AS refs" if split
        else "CAST(NULL AS STRING) AS refs")


def sequencer_items(job: Job, n_shards: int, records: pa.Table) -> list[Routed]:
    """The sequencer's routed rows (no marker rows) -> its items: every record's metadata
    (a record it got whole is decoded, then kept without its rows)."""
    return [Routed(metadata_only(r.item), METADATA_SIZE)
            if isinstance(r.item, ChangeEvent) and not is_metadata_only(r.item) else r
            for r in routed_items(job, n_shards, records)]


class SequencerProcessor(ShardProcessor):
    """The first stage: the sequencer's group (``SEQUENCER_LABEL``: the whole batch's
    metadata; out, a release row per shard and per owner of ``owner_labels``), and every
    other group passed through as it came (the source appears once in the query: see the
    module docstring)."""

    def __init__(self, job: Job, labels: Sequence[int], policy: IncompletePolicy,
                 prefix: str | Mapping[str, str], query_token: str,
                 kafka_facts: KafkaFacts | None = None,
                 owner_labels: Sequence[Sequence[int]] = ()) -> None:
        super().__init__(job, labels, policy, prefix, query_token, kafka_facts=kafka_facts)
        self.receivers = [*labels, *(label for depth in owner_labels for label in depth)]

    def host(self, key: Any) -> int:
        return SEQUENCER

    def runs(self, label: int) -> bool:
        return label == SEQUENCER_LABEL

    def handle(self, shard: int, frame: pa.Table, started: float) -> dict[str, list[Any]]:
        cpu_started = time.process_time()
        caught, partitions, records = self.batch_facts(frame)
        read_started = time.perf_counter()
        items = sequencer_items(self.job, len(self.labels), records)
        read_s = time.perf_counter() - read_started
        self.store.written = 0
        log = ShardLog(self.store, self.job, SEQUENCER, len(self.labels), self.policy,
                       where="the sequencer", engine_class=Sequencer, layouts=STAGED_LAYOUTS)
        result = log.process(self.cached(SEQUENCER), items, caught, partitions)
        engine = result.engine
        assert isinstance(engine, Sequencer)
        self.keep(SEQUENCER, engine)
        crashpoints.in_shard(crashpoints.SEQUENCED)  # tests only: logged, not applied
        result.seconds["read_records"] += read_s
        info = {"shard": SEQUENCER,
                "records": int(pc.sum(records["counted"].cast(pa.int64())).as_py() or 0),
                "snapshot_done": engine.snapshot_done, "waiting": engine.waiting,
                "released": result.released, "duplicates": engine.duplicates,
                "skipped": engine.skipped, "snapshot_rows": engine.batch_snapshot_rows,
                **self.task_figures(result, started, cpu_started)}
        payload = pickle.dumps((ReleaseColumns(engine.releases), info),
                               pickle.HIGHEST_PROTOCOL)
        return payload_columns([(label, 0, RELEASES_OFFSET, payload)
                                for label in self.receivers])


class ApplierProcessor(ShardProcessor):
    """A shard of the staged engine: its rows and the sequencer's release row of the batch."""

    def handle(self, shard: int, frame: pa.Table, started: float) -> dict[str, list[Any]]:
        cpu_started = time.process_time()
        payloads, frame = special_rows(frame, RELEASES_OFFSET)
        assert len(payloads) <= 1, f"shard {shard}: {len(payloads)} release rows in a batch"
        releases: ReleaseColumns
        releases, sequencer = payloads[0] if payloads else (ReleaseColumns(), {})
        # the owners' rows (join/spark/owners.py): the split tables' rows the shard's facts
        # read, the corrections they changed, and the figures of the owners of its number
        forwarded, frame = special_rows(frame, FORWARD_OFFSET)
        forwards = [f for rows, _flags, _info in forwarded for f in rows]
        flags = sorted({flag for _rows, fl, _info in forwarded for flag in fl})
        owners = [info for _rows, _flags, info in forwarded if info is not None]
        read_started = time.perf_counter()
        items = routed_items(self.job, len(self.labels), frame)
        read_s = time.perf_counter() - read_started
        self.store.written = 0
        log = ShardLog(self.store, self.job, shard, len(self.labels), self.policy,
                       where=f"shard {shard} of {len(self.labels)}",
                       engine_class=ShardApplier,  # type: ignore[arg-type]
                       layouts=STAGED_LAYOUTS)
        releasing = [Routed(r, 0) for r in [releases, *forwards, *flags]]
        result = log.process(self.cached(shard), [*items, *releasing], ())
        applier = result.engine
        assert isinstance(applier, ShardApplier)
        self.keep(shard, applier)
        result.seconds["read_records"] += read_s
        first = shard == 0  # reports what the sequencer did once
        info = {"shard": shard,
                "records": sequencer.get("records", 0) if first else 0,
                "commit_seq": applier.commit_seq,
                "snapshot_done": sequencer.get("snapshot_done", False),
                "snapshot_released": applier.snapshot_released,
                "waiting": sequencer.get("waiting", 0),
                "released": sequencer.get("released", 0),
                "duplicates": sequencer.get("duplicates", 0),
                "skipped": sequencer.get("skipped", []),
                "snapshot_rows": sequencer.get("snapshot_rows", 0),
                **self.task_figures(result, started, cpu_started)}
        if first and sequencer:
            info["state_bytes_written"] += sequencer.get("state_bytes_written", 0)
            info["sequencer"] = sequencer
        if owners:
            info["state_bytes_written"] += sum(o.get("state_bytes_written", 0) for o in owners)
            info["owners"] = owners
        return self.output(shard, result.changes, info)


def staged_stages(routed: DataFrame, sequencer: SequencerProcessor,
                  appliers: ApplierProcessor, output_schema: str,
                  owners: Sequence[OwnerProcessor] = ()) -> DataFrame:
    """The stateful stages over :func:`route_staged`'s rows (the sequencer, the owner stages
    by depth, the shards): the shards' output."""
    rows = routed.groupBy("shard").transformWithStateInPandas(
        sequencer, ROUTED_SCHEMA, "Append", "None")
    for stage in owners:
        rows = rows.groupBy("shard").transformWithStateInPandas(
            stage, ROUTED_SCHEMA, "Append", "None")
    return rows.groupBy("shard").transformWithStateInPandas(
        appliers, output_schema, "Append", "None")
