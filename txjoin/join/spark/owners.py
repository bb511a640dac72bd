"""The Spark side of the owner stages (``join/owners.py``): split looked-up tables, each row
held once, between the sequencer and the shards.

Shape, with split tables (``txjoin run --engine staged --split ...``)::

    ... -> sequencer stage (release rows to every shard and every owner)
      -> groupBy(shard).transformWithStateInPandas(OwnerProcessor), one per depth: an
         owner's group (its label: ``owner_labels``) runs its ``LookupOwner`` on its rows
         (its split rows' records; at depth 1 the fact records that reference its keys),
         the release row and the ``Subscribe`` rows of the stage above; out, per shard one
         ``FORWARD_OFFSET`` row (the rows its facts read as of each release, the
         correction flags, and to the shard of the owner's own number its figures) and per
         owner of the next depth one ``SUBSCRIBE_OFFSET`` row; every other group passes
         its rows through unchanged
      -> the shards (``ApplierProcessor``), which apply the forwarded rows with their own

Each owner's log is in Spark's state store like a shard's; its engine (number
``OWNER_HOSTS * depth + owner``) is cached in the host process of the shard of its number,
which its batches use between the shard's (a batch's stages run one after the other).
Why the shards' rows pass through each stage: the sequencer stage's docstring
(``staged.py``).
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from txjoin import crashpoints
from txjoin.errors import DecodeError, JobError
from txjoin.job import Job
from txjoin.join.owners import LookupOwner, owner_class
from txjoin.join.placement import CorrectionChanged, FactReads, Subscribe
from txjoin.join.routing import Routed
from txjoin.join.spark.shards import ShardProcessor, routed_items
from txjoin.join.spark.staged import (
    FORWARD_OFFSET,
    RELEASES_OFFSET,
    SUBSCRIBE_OFFSET,
    payload_columns,
    special_rows,
)
from txjoin.join.staged import STAGED_LAYOUTS, ReleaseColumns
from txjoin.join.state_log import ShardLog
from txjoin.sequence.assembly import IncompletePolicy

if TYPE_CHECKING:
    from txjoin.join.placement import Placement

OWNER_HOSTS = 1_000_000
"""An owner's engine number is ``OWNER_HOSTS * depth + owner`` (a shard's is its number)."""


class OwnerProcessor(ShardProcessor):
    """The owner stage of depth ``depth``: its owners' groups run, every other passes."""

    def __init__(self, job: Job, labels: Sequence[int], policy: IncompletePolicy,
                 prefix: str | Mapping[str, str], query_token: str, placement: Placement,
                 depth: int, owner_labels: Sequence[Sequence[int]]) -> None:
        super().__init__(job, labels, policy, prefix, query_token)
        self.depth = depth
        self.owner_labels = [list(d) for d in owner_labels]
        self.mine = self.owner_labels[depth - 1]
        # made once here: the hosts unpickle it with the processor (the log's isinstance
        # check holds across batches in a host)
        self.owner_cls = owner_class(placement, depth)
        self.placement = placement

    def host(self, key: Any) -> int:
        return OWNER_HOSTS * self.depth + self.mine.index(int(key[0]))

    def host_process(self, number: int) -> int:
        # the host of the shard of the owner's number: the stages of a batch run one after
        # the other, so it is idle then, and a run starts no process per owner (each
        # imports pyarrow and txjoin: the kill test's cold first batch took 30 s with them)
        return number % OWNER_HOSTS

    def runs(self, label: int) -> bool:
        return label in self.mine

    def fact_reads(self, frame: pa.Table) -> tuple[list[Routed], pa.Table]:
        """The batch's streaming fact records routing sent as their reads (``refs``), as
        :class:`FactReads`, and the frame without them; a :class:`DecodeError` names one
        whose key text is not a value of its column."""
        compact = pc.is_valid(frame["refs"])
        if not pc.any(compact).as_py():
            return [], frame
        rows = frame.filter(compact)
        out = []
        for topic, partition, offset, tbl, xid, refs in zip(*(rows[c].to_pylist() for c in (
                "topic", "partition", "offset", "tbl", "xid", "refs")), strict=True):
            doc = orjson.loads(refs)
            try:
                reads = self.placement.typed_reads((r["a"], r["k"]) for r in doc["r"])
            except JobError as exc:
                raise DecodeError(str(exc), topic=topic, partition=int(partition),
                                  offset=int(offset)) from None
            out.append(Routed(FactReads(tbl, int(xid), int(doc["s"]), tuple(reads)),  # type: ignore[arg-type]
                              0))
        return out, frame.filter(pc.invert(compact))

    def handle(self, shard: int, frame: pa.Table, started: float) -> dict[str, list[Any]]:
        cpu_started = time.process_time()
        number = shard - OWNER_HOSTS * self.depth
        n = len(self.labels)
        released, frame = special_rows(frame, RELEASES_OFFSET)
        assert len(released) <= 1, f"owner {number}: {len(released)} release rows in a batch"
        releases: ReleaseColumns = released[0][0] if released else ReleaseColumns()
        subscribed, frame = special_rows(frame, SUBSCRIBE_OFFSET)
        messages: list[Subscribe] = [m for batch in subscribed for m in batch]
        read_started = time.perf_counter()
        reads, frame = self.fact_reads(frame)
        items = [*routed_items(self.job, n, frame), *reads]
        read_s = time.perf_counter() - read_started
        self.store.written = 0
        log = ShardLog(self.store, self.job, number, n, self.policy,
                       where=f"owner {number} of depth {self.depth}",
                       engine_class=self.owner_cls,  # type: ignore[arg-type]
                       layouts=STAGED_LAYOUTS)
        result = log.process(self.cached(shard), [*items, Routed(releases, 0),  # type: ignore[arg-type]
                                                  *(Routed(m, 0) for m in messages)], ())  # type: ignore[arg-type]
        owner = result.engine
        assert isinstance(owner, LookupOwner)
        self.keep(shard, owner)
        crashpoints.in_shard(crashpoints.OWNED)  # tests only: logged, not applied
        result.seconds["read_records"] += read_s
        to_shards: list[list[Any]] = [[] for _ in range(n)]
        flags: set[CorrectionChanged] = set()
        below: dict[int, list[Subscribe]] = {}
        owner.hand_on(to_shards, flags, below)
        info = {"owner": number, "depth": self.depth,
                **self.task_figures(result, started, cpu_started)}
        out = [(self.labels[s], number, FORWARD_OFFSET,
                (forwards, sorted(flags), info if s == number else None))
               for s, forwards in enumerate(to_shards) if forwards or flags or s == number]
        out += [(self.owner_labels[self.depth][o], number, SUBSCRIBE_OFFSET, messages)
                for o, messages in sorted(below.items())]
        return payload_columns([(label, sender, kind, pickle.dumps(
            payload, pickle.HIGHEST_PROTOCOL)) for label, sender, kind, payload in out])
