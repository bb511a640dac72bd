"""The partitioned engine in one process: route a batch to ``n`` shards, run each through its log.

This is what the Spark pipeline does across tasks (``txjoin/join/spark/shards.py``),
without Spark: the same routing, the same shard engines, the same state log in
memory. Property tests use it to check that the union of the shards' outputs
is always the oracle's output after a committed prefix, whatever the shard
count, the delivery, and which shards lose their cached engine between batches.
"""

from __future__ import annotations

from collections.abc import Iterable

from txjoin.ingest.debezium import Position, decode
from txjoin.job import Job
from txjoin.join.routing import Routed, Router, gather_foreign
from txjoin.join.shard import ShardEngine, long_lived_state
from txjoin.join.state_log import BatchResult, MemoryStore, ShardLog
from txjoin.join.temporal import OutputChange
from txjoin.sequence.assembly import IncompletePolicy, TopicPartitions


class ShardedEngine:
    """``n`` shard engines, each persisted in its own :class:`MemoryStore`."""

    def __init__(self, job: Job, n_shards: int, policy: IncompletePolicy | None = None,
                 max_transaction_bytes: int | None = None) -> None:
        self.max_transaction_bytes = max_transaction_bytes
        self.job = job
        self.router = Router(job, n_shards)
        self.stores = [MemoryStore() for _ in range(n_shards)]
        self.policy = policy or IncompletePolicy()
        self.cache: dict[int, ShardEngine] = {}
        self.last: list[BatchResult] = []

    @property
    def n_shards(self) -> int:
        return len(self.stores)

    def route(self, records: Iterable[tuple[str, int, int, str | None]]) -> list[list[Routed]]:
        per_shard: list[list[Routed]] = [[] for _ in self.stores]
        for topic, partition, offset, value in records:
            item = decode(value, Position(topic, partition, offset))
            if item is None:
                continue
            size = len(value.encode() if isinstance(value, str) else value or b"")
            for shard, routed in enumerate(self.router.route(item, size)):
                if routed is not None:
                    per_shard[shard].append(routed)
        # other shards' streaming facts as the Spark shards take them: as columns
        return [gather_foreign([self.job.fact], routed) for routed in per_shard]

    def process(self, records: Iterable[tuple[str, int, int, str | None]],
                caught_up: Iterable[str] = (), drop_cache: Iterable[int] = (),
                partitions: TopicPartitions | None = None) -> list[OutputChange]:
        """One micro-batch; ``drop_cache``: shards that lose their cached engine first;
        ``partitions``: what the source says about partitioned topics (``Engine.process``)."""
        for shard in drop_cache:
            self.cache.pop(shard, None)
        caught = list(caught_up)
        changes: list[OutputChange] = []
        self.last = []
        with long_lived_state():  # as each shard's batch runs in Spark
            routed_by_shard = self.route(records)
        for shard, routed in enumerate(routed_by_shard):
            log = ShardLog(self.stores[shard], self.job, shard, self.n_shards, self.policy,
                           max_transaction_bytes=self.max_transaction_bytes)
            with long_lived_state():
                result = log.process(self.cache.get(shard), routed, caught, partitions)
            self.cache[shard] = result.engine
            self.last.append(result)
            changes.extend(result.changes)
        changes.sort(key=lambda ch: ch.commit_seq)
        return changes

    def engines(self) -> list[ShardEngine]:
        return [self.cache[s] for s in range(self.n_shards)]

    @property
    def commit_seq(self) -> int:
        seqs = {e.commit_seq for e in self.engines()}
        assert len(seqs) == 1, f"shards disagree on the frontier: {seqs}"
        return seqs.pop()

    @property
    def snapshot_done(self) -> bool:
        return self.engines()[0].snapshot_done

    @property
    def snapshot_released(self) -> bool:
        return self.engines()[0].snapshot_released

    def outputs(self) -> dict:
        merged: dict = {}
        for engine in self.engines():
            merged.update(engine.outputs())
        return merged
