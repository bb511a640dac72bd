"""Property tests of the staged engine (``txjoin/join/staged.py``): one sequencer over every
record's metadata, shards that hold only their rows and apply what the sequencer releases.

Invariants, with the workload, the shard count (1-8), the topics' partitions, the delivery,
and which shards and whether the sequencer go on from their saved state drawn at random:
after every batch every shard has applied the same releases, the union of the shards'
outputs is the oracle's output after that committed prefix, no (key, commit) is emitted
twice; batch for batch the change stream is the one today's sharded engine and the
unsharded core emit (incremental snapshots' corrections, two source databases, spilled
transactions and every scenario included); and a shard receives no marker and no other
shard's fact, and spends no pass on a transaction without rows in it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.delivery import insert, only, update, without
from tests.unit.strategies import deliveries, incremental_snapshots, produce, workloads
from tests.unit.test_incomplete import EVERY_STREAM, ORDERS, order, shop, short_of_a_client
from tests.unit.test_incremental_snapshots import PREFIX, run_and_check
from tests.unit.test_properties import JOB_VARIANTS
from tests.unit.test_sharding import SCENARIOS, assert_the_cores_changes, run_sharded
from tests.unit.test_spill import spilling_past
from tests.unit.test_two_sources import _check_run
from txjoin.errors import IncompleteTransactionError
from txjoin.ingest.debezium import ChangeEvent, TxMarker
from txjoin.join.engine import Engine
from txjoin.join.placement import splittable
from txjoin.join.routing import ForeignFacts, shard_of
from txjoin.join.sharded import ShardedEngine
from txjoin.join.staged import (
    SKIP,
    STAGED_LAYOUTS,
    TRANSACTION,
    ReleaseColumns,
    ShardApplier,
    StagedEngine,
)
from txjoin.join.state_log import SEGMENT, ShardLog
from txjoin.join.temporal import TemporalJoin
from txjoin.scenarios.core_runner import observe_core
from txjoin.scenarios.schedule import compile_schedule
from txjoin.scenarios.spec import load_scenario
from txjoin.sequence.assembly import IncompletePolicy


@pytest.mark.parametrize("variant", sorted(JOB_VARIANTS))
@given(data=st.data())
def test_union_of_staged_shard_outputs_is_always_a_committed_prefix(variant: str,
                                                                    data: Any) -> None:
    job, rows = JOB_VARIANTS[variant]
    workload = data.draw(workloads(rows), label="workload")
    n_shards = data.draw(st.integers(1, 8), label="shards")
    parts = data.draw(st.integers(1, 3), label="table topic partitions")
    run_sharded(job, workload, data, n_shards, parts, staged=True)


@given(data=st.data())
def test_spilled_transactions_through_the_staged_engine_keep_a_committed_prefix(
        data: Any) -> None:
    variant = data.draw(st.sampled_from(sorted(JOB_VARIANTS)), label="variant")
    job, rows = JOB_VARIANTS[variant]
    workload = data.draw(workloads(rows, large=True), label="workload")
    with spilling_past(data.draw(st.sampled_from([1, 2, 5]), label="spill past")):
        run_sharded(job, workload, data, data.draw(st.integers(1, 4), label="shards"),
                    data.draw(st.integers(1, 2), label="partitions"), staged=True)


def _stream(engine: Any, batches: list[Any], data: Any, prefix: str = "shop.") -> list[Any]:
    """The change stream batch by batch: (key, commit, row) sorted per batch."""
    out = []
    for n, batch in enumerate(batches):
        records = [(r.topic, 0, r.offset, r.value) for r in batch.records]
        caught = {t.removeprefix(prefix) for t in batch.caught_up}
        if isinstance(engine, Engine):
            changes = engine.process(records, caught_up=caught)
        else:
            drop = data.draw(st.sets(st.integers(0, engine.n_shards - 1)), label=f"drop {n}")
            extra = ({"drop_sequencer": data.draw(st.booleans(), label=f"drop sequencer {n}")}
                     if isinstance(engine, StagedEngine) else {})
            changes = engine.process(records, caught, drop_cache=drop, **extra)
            assert engine.commit_seq >= 0  # every shard applied the same releases
        out.append(sorted((repr(ch.key), ch.commit_seq, repr(ch.row), ch.xid, ch.commit_ts_ms)
                          for ch in changes))
    return out


@given(data=st.data())
def test_the_staged_change_stream_is_the_sharded_engines_and_the_cores(data: Any) -> None:
    """The same delivery through the core, today's sharded engine and the staged engine (any
    shard count, any restarts): the same changes, commits, xids and commit times, batch for
    batch."""
    variant = data.draw(st.sampled_from(sorted(JOB_VARIANTS)), label="variant")
    job, rows = JOB_VARIANTS[variant]
    workload = data.draw(workloads(rows), label="workload")
    batches = data.draw(deliveries(produce(job, workload)), label="delivery")
    n_shards = data.draw(st.integers(1, 8), label="shards")
    core = _stream(Engine(job), batches, data)
    assert _stream(StagedEngine(job, n_shards), batches, data) == core
    assert _stream(ShardedEngine(job, n_shards), batches, data) == core


@given(data=st.data())
def test_incremental_snapshot_corrections_are_the_cores_through_the_staged_engine(
        data: Any) -> None:
    """Corrections of looked-up and fact rows (equal rows dropped unnumbered, as the core
    does) are applied where the core applies them, at 1-6 shards with restarts."""
    variant = data.draw(st.sampled_from(sorted(JOB_VARIANTS)), label="variant")
    job, rows = JOB_VARIANTS[variant]
    workload = data.draw(workloads(rows), label="workload")
    workload = data.draw(incremental_snapshots(workload, rows), label="incremental")
    batches = run_and_check(job, workload, data)
    core = _stream(Engine(job), batches, data, PREFIX)
    staged = StagedEngine(job, data.draw(st.integers(1, 6), label="shards"),
                          split=data.draw(st.sets(st.sampled_from(splittable(job)))
                                          if splittable(job) else st.just(set()),
                                          label="split lookups"))
    assert _stream(staged, batches, data, PREFIX) == core


@given(data=st.data())
def test_two_sources_through_the_staged_engine_keep_one_prefix_per_source(data: Any) -> None:
    _check_run(data, data.draw(st.integers(1, 4), label="shards"), staged=True)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_scenario_gives_the_cores_changes_through_the_staged_engine(path: Path) -> None:
    """At 1-4 shards, a restart having the sequencer and every shard go on from their logs;
    again with every lookup the job can split split (``join/placement.py``)."""
    scenario = load_scenario(path)
    schedule = compile_schedule(scenario)
    core = observe_core(scenario, schedule)
    assert_the_cores_changes(scenario, schedule, core, staged=True)
    if splittable(scenario.job):
        assert_the_cores_changes(scenario, schedule, core, staged=True, split=True)


# -- what each part receives and does ------------------------------------------------------

def test_a_shard_receives_no_marker_and_no_other_shards_fact() -> None:
    pipe = shop()
    for n in range(12):
        pipe.commit(f"T{n}", insert("orders", **order(100 + n)),
                    insert("clients", id=10 + n, name=f"C{n}"))
    pipe.commit("key change", *[update("orders", id=100 + n, pizzas=[1, 1])
                                for n in range(12)])
    records = [(r.topic, 0, r.offset, r.value) for r in pipe.all_records()]
    n_shards = 4
    meta, per_shard, _ = StagedEngine(ORDERS, n_shards).route(records)
    # each record once: each table's streaming events as one batch of columns
    assert sum(len(m.item) if isinstance(m.item, ForeignFacts) else 1
               for m in meta) == sum(1 for r in records if r[3] is not None)
    assert sorted(m.item.table for m in meta if isinstance(m.item, ForeignFacts)) == \
        ["public.clients", ORDERS.fact]
    fact = ORDERS.table(ORDERS.fact)
    held = 0
    for shard, events in enumerate(per_shard):
        assert not any(isinstance(e, TxMarker) for e in events)
        for event in events:
            if event.table != ORDERS.fact:
                continue  # looked-up rows: every shard holds them (issue 65 splits them next)
            held += 1
            owners = {shard_of(fact.convert_key(row), n_shards)
                      for row in (event.before, event.after) if row is not None}
            assert shard in owners, f"shard {shard} got {event.position}, held by {owners}"
    assert held == sum(len(m.item) if isinstance(m.item, ForeignFacts) else 1 for m in meta
                       if isinstance(m.item, ForeignFacts | ChangeEvent)
                       and m.item.table == ORDERS.fact)


def test_a_shard_spends_no_pass_on_a_transaction_without_rows_in_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A transaction of only facts of other shards: the shards without its rows do not
    evaluate it (today's sharded engine has every shard pass over every transaction)."""
    applied: list[int] = []
    apply = TemporalJoin.apply

    def counting(self: TemporalJoin, tx: Any, *forwarded: Any) -> Any:
        applied.append(tx.xid)
        return apply(self, tx, *forwarded)

    monkeypatch.setattr(TemporalJoin, "apply", counting)
    pipe = shop()
    engine = StagedEngine(ORDERS, 4)
    engine.process([(r.topic, 0, r.offset, r.value) for r in pipe.all_records()],
                   caught_up=EVERY_STREAM)
    applied.clear()
    records = pipe.commit("T1", insert("orders", **order(101)))
    engine.process([(r.topic, 0, r.offset, r.value) for r in records], caught_up=EVERY_STREAM)
    assert applied == [pipe.xids["T1"]]  # one shard, once
    assert engine.commit_seq == 1 and list(engine.outputs()) == [(101,)]


def test_skip_drops_the_transaction_in_every_shard_and_a_rewind_leaves_nothing_waiting(
        ) -> None:
    """``--on-incomplete skip``: the sequencer's skip entry has each shard drop what it
    held of the transaction and remember it, so a rewind that reads it again leaves nothing
    buffered; later transactions flow with the core's commit numbers."""
    policy = IncompletePolicy("skip", timeout_s=300)
    pipe = shop(policy)
    staged = StagedEngine(ORDERS, 3, policy)
    staged.process([(r.topic, 0, r.offset, r.value) for r in pipe.all_records()],
                   caught_up=EVERY_STREAM)
    before = set(pipe.delivered)
    lost = short_of_a_client(pipe, later_after_ms=10 * 60_000)
    batch = [r for r in pipe.all_records() if (r.topic, r.offset) not in before
             and r not in lost]
    changes = staged.process([(r.topic, 0, r.offset, r.value) for r in batch],
                             caught_up=EVERY_STREAM)
    assert [(c.key, c.commit_seq) for c in changes] == [((102,), 1)]
    assert [r.kind for r in staged.last_releases][:1] == [SKIP]
    t1 = pipe.produced["T1"]
    assert staged.process([(r.topic, 0, r.offset, r.value) for r in t1],
                          drop_cache=[0, 2], drop_sequencer=True) == []
    assert all(not a.pending for a in staged.appliers)
    t3 = pipe.commit("T3", insert("orders", **order(103)))
    staged.process([(r.topic, 0, r.offset, r.value) for r in t3], caught_up=EVERY_STREAM)
    assert staged.commit_seq == 2 and set(staged.outputs()) == {(102,), (103,)}


def test_fail_stops_the_staged_engine_with_the_cores_line() -> None:
    pipe = shop()
    first = [(r.topic, 0, r.offset, r.value) for r in pipe.all_records()]
    t1 = pipe.commit("T1", insert("orders", **order(101)))
    pipe.synth.now_ms += 10 * 60_000
    t2 = pipe.commit("T2", insert("orders", **order(102)))
    second = [(r.topic, 0, r.offset, r.value) for r in [*without(t1, only(t1, kind="end")), *t2]]
    errors = []
    for engine in (Engine(ORDERS), StagedEngine(ORDERS, 2)):
        engine.process(first, caught_up=EVERY_STREAM)
        with pytest.raises(IncompleteTransactionError) as error:
            engine.process(second, caught_up=set(ORDERS.table_names))
        errors.append(str(error.value))
    assert errors[0] == errors[1] and f"xid {pipe.xids['T1']}" in errors[0]


# -- looked-up tables split by key (join/owners.py) ----------------------------------------

SPLITTABLE = sorted(v for v, (job, _) in JOB_VARIANTS.items() if splittable(job))

@given(data=st.data())
def test_split_lookups_give_the_cores_change_stream(data: Any) -> None:
    """Any splittable lookups split (their rows held once, by their key's owner, and
    forwarded to the shards whose facts read them), any shard count, any restarts: batch for
    batch the core's changes, commits, xids and commit times."""
    variant = data.draw(st.sampled_from(SPLITTABLE), label="variant")
    job, rows = JOB_VARIANTS[variant]
    workload = data.draw(workloads(rows), label="workload")
    batches = data.draw(deliveries(produce(job, workload)), label="delivery")
    n_shards = data.draw(st.integers(1, 8), label="shards")
    split = data.draw(st.sets(st.sampled_from(splittable(job))), label="split")
    core = _stream(Engine(job), batches, data)
    staged = StagedEngine(job, n_shards, split=split)
    assert _stream(staged, batches, data) == core
    if staged.commit_seq == len(workload.transactions):  # all released: nothing waits
        assert all(not o.pending and not o.reads  # type: ignore[attr-defined]
                   for o in staged.owner_cache.values())


def test_a_segment_keeps_the_releases_by_column_and_one_of_layout_12_still_reads() -> None:
    """Layout 13: a shard's segment holds the batch's releases as ``ReleaseColumns`` (how
    the sequencer sends them); a segment written before, with a ``Release`` each, brings a
    copy one batch behind forward to the same state."""
    pipe = shop()
    engine = StagedEngine(ORDERS, 2)
    engine.process([(r.topic, 0, r.offset, r.value) for r in pipe.all_records()],
                   caught_up=EVERY_STREAM)
    before = [store.copy() for store in engine.stores]
    records = [*pipe.commit("T1", insert("orders", **order(101))),
               *pipe.commit("T2", insert("orders", **order(102)))]
    engine.process([(r.topic, 0, r.offset, r.value) for r in records], caught_up=EVERY_STREAM)
    for shard, store in enumerate(before):
        version = engine.stores[shard].get_meta()["version"]  # type: ignore[index]
        segment = engine.shard_log(shard)._read(SEGMENT, version)
        columns = segment.effects.releases
        assert isinstance(columns, ReleaseColumns)
        assert [(r.kind, r.xid) for r in columns] == [
            (TRANSACTION, pipe.xids["T1"]), (TRANSACTION, pipe.xids["T2"])]
        one_by_one = dataclasses.replace(segment.effects, releases=list(columns))
        for effects in (segment.effects, one_by_one):
            behind, _ = ShardLog(store.copy(), ORDERS, shard, 2, engine_class=ShardApplier,  # type: ignore[arg-type]
                                 layouts=STAGED_LAYOUTS).load(None)
            assert isinstance(behind, ShardApplier)
            behind.apply_effects(effects, segment.changes)
            now = engine.cache[shard]
            assert (behind.applied_seq, behind.released, behind.outputs()) == (
                now.applied_seq, now.released, now.outputs())
