"""An open transaction's events on disk (``txjoin/sequence/spill.py``).

The log itself against a list (hypothesis), and the partitioned engine against the oracle
with a spill threshold so small that every transaction of more than a few events spills:
any shard count, partitioned topics, redeliveries and renumbering (their identities then
compared as digests), shards restored from their logs between batches.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.strategies import workloads
from tests.unit.test_properties import JOB_VARIANTS
from tests.unit.test_sharding import run_sharded
from tests.unit.test_two_sources import _check_run
from txjoin.ingest.debezium import ChangeEvent, Position
from txjoin.sequence import spill
from txjoin.sequence.spill import EventLog, drain, in_table_order, latest_commit_ts

TABLES = ("public.b", "public.a", "public.c")


@contextlib.contextmanager
def spilling_past(events: int) -> Iterator[None]:
    """Open transactions spill past ``events`` events (``spill.SPILL_EVENTS``) inside."""
    saved = spill.SPILL_EVENTS
    spill.SPILL_EVENTS = events
    try:
        yield
    finally:
        spill.SPILL_EVENTS = saved


def _event(n: int, table: str) -> ChangeEvent:
    return ChangeEvent(table, "u", None, {"id": n % 7, "v": "x" * (n % 50)}, 42, 1000 + n,
                       None if n % 5 == 0 else 5 + n % 11, "false", n + 1,
                       Position(f"shop.{table}", 0, n))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@given(tables=st.lists(st.sampled_from(TABLES), max_size=60),
       threshold=st.integers(1, 6), pickled_at=st.integers(0, 60))
def test_a_log_hands_back_each_tables_events_in_the_order_they_came(
        tables: list[str], threshold: int, pickled_at: int) -> None:
    events = [_event(n, t) for n, t in enumerate(tables)]
    with spilling_past(threshold):
        log = EventLog()
        for n, event in enumerate(events):
            if n == pickled_at:  # a snapshot of the engine taken while it is open
                log = pickle.loads(pickle.dumps(log))
            log.append(event)
        expected = sorted(events, key=lambda e: e.table)
        assert len(log) == len(events)
        assert list(log) == expected == in_table_order(list(events))
        assert list(pickle.loads(pickle.dumps(log))) == expected
        # the latest commit time, kept as the log grows (a snapshot's is its transaction's)
        assert latest_commit_ts(log) == latest_commit_ts(events)
        assert latest_commit_ts(pickle.loads(pickle.dumps(log))) == latest_commit_ts(events)
        assert list(drain(log)) == expected
        assert len(log) == 0 and list(log) == []


def test_a_drained_or_dropped_log_lets_its_file_go() -> None:
    with spilling_past(4):
        before = _open_fds()
        log = EventLog(_event(n, TABLES[n % 3]) for n in range(40))
        assert _open_fds() == before + 1  # one file, unlinked: nothing to clean up by name
        assert len(list(drain(log))) == 40
        assert _open_fds() == before
        dropped = EventLog(_event(n, "public.a") for n in range(40))
        assert _open_fds() == before + 1
        del dropped
        assert _open_fds() == before


def test_a_large_open_transaction_keeps_at_most_a_chunk_of_events_in_memory() -> None:
    """What the worker holds of a 20,000-event transaction before its END: the events
    are in the log's file but for its last chunk, its identities are digests."""
    from tests.unit.test_large_transactions import _big_transaction
    from txjoin.join.sharded import ShardedEngine

    job, records, xid = _big_transaction(20_000)
    every = [*job.table_names, "transaction"]
    engine = ShardedEngine(job, 2)
    engine.process(records[:-1], every)  # all but the END
    held = 0
    for shard in engine.engines():
        tx = shard.assembler.pending[xid]
        assert isinstance(tx.events, EventLog) and tx.compact
        assert sum(tx.per_table.values()) == 20_000  # every event counted in every shard
        held += len(tx.events)  # the rows of its own facts only
        assert sum(map(len, tx.events._tails.values())) <= spill.SPILL_EVENTS
        assert all(isinstance(i, bytes) and len(i) == 16 for i in tx.identities)
    assert held == 20_000
    engine.process(records[-1:], every)
    assert engine.commit_seq == 1 and not engine.engines()[0].assembler.pending


@pytest.mark.parametrize("variant", sorted(JOB_VARIANTS))
@given(data=st.data())
def test_spilled_transactions_keep_the_union_of_shard_outputs_a_committed_prefix(
        variant: str, data: Any) -> None:
    job, rows = JOB_VARIANTS[variant]
    workload = data.draw(workloads(rows, large=True), label="workload")
    n_shards = data.draw(st.integers(1, 4), label="shards")
    parts = data.draw(st.integers(1, 3), label="table topic partitions")
    threshold = data.draw(st.sampled_from([1, 2, 5, 40]), label="spill past")
    with spilling_past(threshold):
        run_sharded(job, workload, data, n_shards, parts)


@given(data=st.data())
def test_spilled_snapshots_and_transactions_of_two_sources_keep_a_prefix_per_source(
        data: Any) -> None:
    """Two source databases, each snapshot spilled apart and applied as one transaction 0."""
    with spilling_past(data.draw(st.sampled_from([1, 3]), label="spill past")):
        _check_run(data, data.draw(st.sampled_from([None, 1, 3]), label="shards"))
