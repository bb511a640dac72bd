"""Property tests of the partitioned engine: shards, routing and the state log.

Invariants, with the shard count, the workload, the table topics' partition
count (each partition read in order, any lag between partitions), the delivery
and the shards that lose their worker-side cache drawn at random: after every batch every
shard has released the same transactions; the union of the shards' outputs is
the oracle's output after that committed prefix; the change stream applies to
exactly that output; no (key, commit) is emitted twice; and at the end the
output is the oracle's after the last transaction. A shard restored from its
log (the checkpoint) behaves exactly like one that never stopped.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.strategies import deliveries, produce, split_partitions, workloads
from tests.unit.test_properties import JOB_VARIANTS
from txjoin.errors import ConfigError, TxjoinError
from txjoin.ingest.debezium import ChangeEvent, Position, TxMarker, decode
from txjoin.join.oracle import outputs_after_each
from txjoin.join.placement import splittable
from txjoin.join.routing import (
    METADATA_SIZE,
    Routed,
    Router,
    gather_foreign,
    is_metadata_only,
    metadata_only,
    shard_of,
)
from txjoin.join.shard import ShardEngine
from txjoin.join.sharded import ShardedEngine
from txjoin.join.staged import StagedEngine
from txjoin.join.state import save_fields
from txjoin.join.state_log import LAYOUT_VERSION, MemoryStore, ShardLog
from txjoin.scenarios.checks import RunObservation, check_scenario
from txjoin.scenarios.core_runner import observe_batch, observe_core
from txjoin.scenarios.schedule import Restart, compile_schedule
from txjoin.scenarios.spec import load_scenario
from txjoin.sequence.assembly import Assembler, TopicPartitions


def run_sharded(job: Any, workload: Any, data: Any, n_shards: int, parts: int = 1,
                staged: bool = False) -> None:
    """``parts``: table topics spread over that many partitions by key, read with any lag
    between partitions; the source reports caught-up partitions, or (drawn) whole topics
    only. ``staged``: the staged engine (``join/staged.py``), its sequencer too restarted
    from its saved state at random, any of its splittable lookups split
    (``join/placement.py``)."""
    production, where = split_partitions(produce(job, workload), parts)
    batches = data.draw(deliveries(production), label="delivery")
    expected = outputs_after_each(job, workload.snapshot, workload.transactions)
    counts = dict.fromkeys(job.table_names, parts) if parts > 1 else {}
    engine: ShardedEngine | StagedEngine = (
        StagedEngine(job, n_shards, split=data.draw(
            st.sets(st.sampled_from(splittable(job))) if splittable(job) else st.just(set()),
            label="split lookups")) if staged else ShardedEngine(job, n_shards))
    applied: dict[Any, Any] = {}
    seen: set[tuple[Any, int]] = set()
    last_k = -1
    prefix = "shop."
    for n, batch in enumerate(batches):
        drop = data.draw(st.sets(st.integers(0, n_shards - 1)), label=f"drop cache {n}")
        records = [(*where[r.topic], r.offset, r.value) for r in batch.records]
        # a topic is read to its end when every one of its partitions is
        caught = {where[t][0].removeprefix(prefix) for t in batch.caught_up}
        caught -= {where[t][0].removeprefix(prefix) for t in where if t not in batch.caught_up}
        caught_parts: dict[str, set[int]] = {}
        for t in batch.caught_up:
            table = where[t][0].removeprefix(prefix)
            if table in counts:
                caught_parts.setdefault(table, set()).add(where[t][1])
        if counts and data.draw(st.booleans(), label=f"whole topics only {n}"):
            caught_parts = {}
        partitions = TopicPartitions(counts, {t: frozenset(p) for t, p in caught_parts.items()})
        if isinstance(engine, StagedEngine):
            changes = engine.process(records, caught, drop_cache=drop, partitions=partitions,
                                     drop_sequencer=data.draw(st.booleans(),
                                                              label=f"drop sequencer {n}"))
        else:
            changes = engine.process(records, caught, drop_cache=drop, partitions=partitions)
        for ch in changes:
            assert (ch.key, ch.commit_seq) not in seen, f"{ch} emitted twice"
            seen.add((ch.key, ch.commit_seq))
            if ch.row is None:
                applied.pop(ch.key, None)
            else:
                applied[ch.key] = ch.row
        assert applied == engine.outputs(), "the change stream disagrees with the shards' state"
        k = engine.commit_seq  # asserts every shard released the same prefix
        if not engine.snapshot_done:
            assert applied == {}
            continue
        assert k >= last_k
        last_k = k
        assert applied == expected[k], f"batch {n}: not the oracle's output after T{k}"
    assert engine.commit_seq == len(workload.transactions)
    assert applied == expected[-1]


@pytest.mark.parametrize("variant", sorted(JOB_VARIANTS))
@given(data=st.data())
def test_union_of_shard_outputs_is_always_a_committed_prefix(variant: str, data: Any) -> None:
    job, rows = JOB_VARIANTS[variant]
    workload = data.draw(workloads(rows), label="workload")
    n_shards = data.draw(st.integers(1, 4), label="shards")
    parts = data.draw(st.integers(1, 3), label="table topic partitions")
    run_sharded(job, workload, data, n_shards, parts)


@given(data=st.data())
def test_a_shard_restored_from_its_log_equals_one_that_never_stopped(data: Any) -> None:
    job, rows = JOB_VARIANTS["orders/current"]
    workload = data.draw(workloads(rows), label="workload")
    batches = data.draw(deliveries(produce(job, workload)), label="delivery")
    # 1-4 shards (2 until issue 34): the Spark run that restarts at every batch boundary
    # runs at the scenarios' shard count only (tests/spark/test_pipeline.py)
    shards = data.draw(st.integers(1, 4), label="shards")
    steady = ShardedEngine(job, shards)
    restored = ShardedEngine(job, shards)
    for batch in batches:
        records = [(r.topic, 0, r.offset, r.value) for r in batch.records]
        caught = {t.removeprefix("shop.") for t in batch.caught_up}
        a = steady.process(records, caught)
        b = restored.process(records, caught, drop_cache=range(shards))
        assert a == b
    assert steady.outputs() == restored.outputs()


def test_a_metadata_only_event_keeps_its_identity_without_rows() -> None:
    event = ChangeEvent("public.orders", "u", {"id": 1}, {"id": 1, "x": [1, 2]}, 7, 99, 1000,
                        "false", 3, Position("shop.public.orders", 0, 5), b"digest")
    meta = metadata_only(event)
    assert meta.before is None and meta.after is None and meta.identity == event.identity
    assert meta.xid == 7 and meta.lsn == 99 and meta.data_collection_order == 3


def _route(job: Any, router: Router, batch: Any) -> list[list[Routed]]:
    """A batch's records as each shard receives them, other shards' facts event by event."""
    per_shard: list[list[Routed]] = [[] for _ in range(router.n_shards)]
    for r in batch.records:
        item = decode(r.value, Position(r.topic, 0, r.offset))
        if item is not None:
            for shard, routed in enumerate(router.route(item, len(r.value or ""))):
                if routed is not None:
                    per_shard[shard].append(routed)
    return per_shard


def _decided(engine: ShardEngine) -> dict[Any, Any]:
    """All a shard's sequencing decides from: each open transaction's counting state and
    the events it holds rows of, each source's duplicates, snapshot and frontier, and the
    engine's clocks and counters."""
    seen: dict[Any, Any] = {"engine": save_fields(engine, ShardEngine.FIELDS)}
    for source, assembler in engine.assemblers.items():
        seen[source] = (assembler.duplicates, assembler.snapshot.state(),
                        engine.frontiers[source].state())
        for xid, tx in assembler.pending.items():
            seen[(source, xid)] = (
                tx.deliveries, tx.identities, tx.per_table, tx.last_number, tx.run, tx.end,
                tx.first_ts_ms, tx.begins, tx.restarted, tx.confirmed, tx.confirmed_parts,
                # (tables are independent within a transaction: applied table by table)
                sorted((e for e in tx.events if not is_metadata_only(e)), key=lambda e: e.table),
                tx.missing(assembler.tables))
    return seen


def _compare_counting(job: Any, batches: list[Any], n_shards: int) -> None:
    """Every shard fed other shards' facts as columns (counted per transaction) and one fed
    them event by event emit the same changes and decide from the same state, batch by batch;
    so do the shards restored from the first ones' logs."""
    router = Router(job, n_shards)
    by_run = ShardedEngine(job, n_shards)
    by_event = [ShardEngine(job, s, n_shards) for s in range(n_shards)]
    for n, batch in enumerate(batches):
        caught = {t.removeprefix("shop.") for t in batch.caught_up}
        records = [(r.topic, 0, r.offset, r.value) for r in batch.records]
        by_run.process(records, caught, drop_cache=[n % n_shards])  # one restored each batch
        for shard, routed in enumerate(_route(job, router, batch)):
            changes = by_event[shard].process_routed(routed, caught)
            assert by_run.last[shard].changes == changes, f"batch {n}, shard {shard}"
            mine, theirs = _decided(by_run.cache[shard]), _decided(by_event[shard])
            differ = sorted(str(k) for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))
            assert not differ, f"batch {n}, shard {shard}: not event by event's state: {differ}"


@given(data=st.data())
def test_foreign_facts_counted_per_transaction_decide_as_event_by_event(data: Any) -> None:
    """Redeliveries, consumer rewinds and pre-3.7 restarts inside transactions drawn: the
    runs that do not fit go event by event, and the decisions never differ."""
    job, rows = JOB_VARIANTS[data.draw(st.sampled_from(["orders/as_of_fact", "orders/current"]),
                                       label="job")]
    workload = data.draw(workloads(rows), label="workload")
    batches = data.draw(deliveries(produce(job, workload)), label="delivery")
    _compare_counting(job, batches, data.draw(st.integers(2, 8), label="shards"))


def _foreign_facts(xid: int, events: list[tuple[int, int]], start: int) -> list[Routed]:
    """Facts of another shard in transaction ``xid`` ((LSN, number) each) from offset
    ``start`` of the orders topic, event by event."""
    return [Routed(ChangeEvent("public.orders", "c", None, None, xid, lsn, 1000, "false",
                               number, Position("shop.public.orders", 0, start + i),
                               bytes([lsn % 256])), METADATA_SIZE)
            for i, (lsn, number) in enumerate(events)]


def _marker(status: str, xid: int, offset: int, count: int = 0) -> Routed:
    counts = {"public.orders": count} if status == "END" else None
    return Routed(TxMarker(status, xid, f"{xid}:1", None, count if counts else None, counts,
                           1000, Position("shop.transaction", 0, offset)), 10)


@pytest.mark.parametrize("resent", ["redelivered as numbered", "renumbered from 1 (pre-3.7)"])
def test_a_redelivered_or_renumbered_run_goes_event_by_event(
        resent: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another shard's facts that a later batch brings again, with their numbers (a consumer
    rewind) or numbered again from 1 after a connector restart inside the transaction, do
    not fit it as a run: counted event by event, each is recognised as a repeat (counted
    once) and the transaction is released as a shard fed every event one by one releases it."""
    job, _ = JOB_VARIANTS["orders/as_of_fact"]
    fits: list[bool] = []
    add_run = Assembler.add_run

    def spy(self: Assembler, *args: Any) -> bool:
        fits.append(add_run(self, *args))
        return fits[-1]

    monkeypatch.setattr(Assembler, "add_run", spy)
    first = [_marker("BEGIN", 7, 0), *_foreign_facts(7, [(100, 1), (101, 2), (102, 3)], 0)]
    if resent == "redelivered as numbered":
        second = [*_foreign_facts(7, [(100, 1), (101, 2), (102, 3)], 0), _marker("END", 7, 1, 3)]
    else:  # the connector resends the last two, numbered 1 and 2, and counts only those
        second = [_marker("BEGIN", 7, 1), *_foreign_facts(7, [(101, 1), (102, 2)], 3),
                  _marker("END", 7, 2, 2)]
    by_run, by_event = ShardEngine(job, 0, 2), ShardEngine(job, 0, 2)
    for n, batch in enumerate([first, second]):
        caught = job.table_names if n == 0 else []  # the empty snapshot settles
        by_run.process_routed(gather_foreign([job.fact], batch), caught)
        by_event.process_routed(batch, caught)
        assert _decided(by_run) == _decided(by_event)
    assert fits == [True, False]
    assert by_run.frontier.commit_seq == 1
    assert by_run.duplicates == (3 if resent == "redelivered as numbered" else 2)


def test_fact_rows_go_to_one_shard_and_lookups_to_all() -> None:
    job, _ = JOB_VARIANTS["orders/as_of_fact"]
    router = Router(job, 3)
    pos = Position("shop.public.orders", 0, 1)
    order = ChangeEvent("public.orders", "c", None, {"id": 42, "table_assignment_id": 1,
                                                      "order_time": 0, "pizzas": [1]},
                        5, 10, 0, "false", 1, pos)
    routed = router.route(order, 100)
    owner = shard_of((42,), 3)
    assert [r is not None and r.item.after is not None for r in routed] == \
        [s == owner for s in range(3)]
    assert {r.item.identity for r in routed if r is not None} == {routed[owner].item.identity}
    assert [r.size for r in routed if r is not None] == \
        [100 if s == owner else METADATA_SIZE for s in range(3)]
    client = ChangeEvent("public.clients", "c", None, {"id": 1, "name": "a"}, 5, 10, 0,
                         "false", 1, Position("shop.public.clients", 0, 1))
    assert all(r is not None and r.item.after is not None for r in router.route(client, 10))


def test_a_key_change_goes_to_both_shards_and_only_the_new_owner_inserts() -> None:
    job, _ = JOB_VARIANTS["orders/as_of_fact"]
    router = Router(job, 4)
    keys = {shard_of((k,), 4): k for k in range(50)}
    old, new = keys[0], keys[1]
    row = {"table_assignment_id": 1, "order_time": 0, "pizzas": [1]}
    moved = ChangeEvent("public.orders", "u", {"id": old, **row}, {"id": new, **row}, 5, 10, 0,
                        "false", 1, Position("shop.public.orders", 0, 1))
    routed = router.route(moved, 100)
    assert routed[0] is not None and routed[0].item.after_elsewhere
    assert routed[1] is not None and not routed[1].item.after_elsewhere
    assert routed[1].item.after is not None
    assert all(r is not None and r.item.after is None for r in routed[2:])


def test_shard_of_is_stable_across_processes() -> None:
    # crc32 of the key's repr: the same in every process (Python's str hash is salted)
    assert shard_of((42,), 4) == zlib.crc32(b"(42,)") % 4
    assert [shard_of((i,), 4) for i in range(8)] == [shard_of((i,), 4) for i in range(8)]
    assert len({shard_of((i,), 4) for i in range(100)}) == 4


def test_a_checkpoint_of_another_layout_or_shard_count_is_refused() -> None:
    job, _ = JOB_VARIANTS["orders/as_of_fact"]
    store = MemoryStore()
    store.put_meta({"layout": 1})
    with pytest.raises(ConfigError, match=f"needs layout {LAYOUT_VERSION}"):
        ShardLog(store, job, 0, 2).process(None, [], [])
    store.put_meta({"layout": LAYOUT_VERSION, "shards": 4})
    with pytest.raises(ConfigError, match="--shards 4"):
        ShardLog(store, job, 0, 2).process(None, [], [])


def test_per_batch_writes_follow_the_batch_not_the_state() -> None:
    """A batch writes its segment and the meta, not the state (until a compaction)."""
    job, _rows = JOB_VARIANTS["orders/as_of_fact"]
    from txjoin.scenarios.synthesize import Synthesizer
    from txjoin.scenarios.workload import pizzeria_workload

    snapshot, txs = pizzeria_workload(400, seed=3)
    synth = Synthesizer(job)
    head = list(synth.snapshot(snapshot))
    for tx in txs[:300]:
        head.extend(synth.transaction(tx))
    tail = []
    for tx in txs[300:]:
        tail.extend(synth.transaction(tx))
    engine = ShardedEngine(job, 2)
    every = [*job.table_names, "transaction"]
    engine.process([(r.topic, 0, r.offset, r.value) for r in head], every)
    big = sum(s.written for s in engine.stores)
    before = [s.written for s in engine.stores]
    engine.process([(r.topic, 0, r.offset, r.value) for r in tail[:50]], every)
    small = sum(s.written - b for s, b in zip(engine.stores, before, strict=True))
    assert small < big / 5, (small, big)


@given(data=st.data())
def test_state_of_one_attempt_continues_with_another_attempts_log(data: Any) -> None:
    """Spark may re-execute a batch and, with RocksDB changelog checkpointing, combine
    the snapshot of one attempt with the changelogs of another: everything the log
    stores must be deterministic so that such a combination restores exactly."""
    job, rows = JOB_VARIANTS["orders/as_of_fact"]
    workload = data.draw(workloads(rows), label="workload")
    batches = data.draw(deliveries(produce(job, workload)), label="delivery")
    first, second = ShardedEngine(job, 2), ShardedEngine(job, 2)
    cut = data.draw(st.integers(0, len(batches)), label="attempt boundary")
    for n, batch in enumerate(batches):
        records = [(r.topic, 0, r.offset, r.value) for r in batch.records]
        caught = {t.removeprefix("shop.") for t in batch.caught_up}
        first.process(records, caught)
        second.process(records, caught)
        assert [s.meta for s in first.stores] == [s.meta for s in second.stores]
        if n + 1 == cut:  # from here on, the second attempt's log on the first's state
            mixed = [s.copy() for s in first.stores]
    if cut == 0:
        return
    for shard, store in enumerate(mixed):
        later = {k: v for k, v in second.stores[shard].blobs.items() if k[1] > cut}
        store.blobs.update(later)
        store.meta = second.stores[shard].meta
        engine, how = ShardLog(store, job, shard, 2).load(None)
        assert how == "restored"
        assert engine.outputs() == second.engines()[shard].outputs()


def _snapshot_records(orders: int) -> tuple[Any, Any, Any, list[tuple[str, int, int, Any]]]:
    """A snapshot of ``orders`` orders then 30 transactions, as (topic, 0, offset, value)."""
    from txjoin.scenarios.synthesize import Synthesizer
    from txjoin.scenarios.workload import pizzeria_workload

    job, _ = JOB_VARIANTS["orders/as_of_fact"]
    snapshot, txs = pizzeria_workload(30, seed=4, snapshot_orders=orders)
    synth = Synthesizer(job)
    produced = list(synth.snapshot(snapshot))
    for tx in txs:
        produced.extend(synth.transaction(tx))
    return job, snapshot, txs, [(r.topic, 0, r.offset, r.value) for r in produced]


def test_a_shard_buffers_only_the_snapshot_rows_it_holds() -> None:
    """While the snapshot loads, a shard buffers its own orders and every looked-up row,
    not the other shards' orders (it counts them: every shard reports the batch's rows)."""
    from txjoin.pipeline.pipeline import merge_infos

    job, snapshot, txs, records = _snapshot_records(300)
    engine = ShardedEngine(job, 3)
    snap = [r for r in records if '"op":"r"' in (r[3] or "")]
    orders = [r for r in snap if r[0].endswith(".orders")]
    first = [r for r in snap if not r[0].endswith(".orders")] + orders[:200]
    engine.process(first, [])
    shards = engine.engines()
    assert all(not e.snapshot_done for e in shards)
    buffered = [[ev for a in e.assemblers.values() for ev in a.snapshot.rows] for e in shards]
    for shard, rows in enumerate(buffered):
        own = [ev for ev in rows if ev.table == "public.orders"]
        assert own and all(shard_of((ev.after["id"],), 3) == shard for ev in own)
        assert {ev.table for ev in rows} == {t for t, r in snapshot.items() if r}
    assert sum(len([ev for ev in rows if ev.table == "public.orders"])
               for rows in buffered) == 200
    counted = [e.batch_snapshot_rows for e in shards]
    assert counted == [len(first)] * 3
    infos = [{"commit_seq": 0, "records": 1, "snapshot_rows": n} for n in counted]
    assert merge_infos(infos)["snapshot_rows"] == len(first)
    engine.process([r for r in records if r not in first], [*job.table_names, "transaction"])
    assert engine.outputs() == outputs_after_each(job, snapshot, txs)[-1]


def test_a_snapshot_loaded_over_many_batches_is_compacted_a_few_times(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction writes the whole shard, the buffered snapshot included: it must count
    that snapshot as the shard's size, or a snapshot loading over many batches is written
    whole again every SNAPSHOT_MIN_ROWS rows (quadratic; measured at 1M orders: a
    compaction every ~40 batches, each longer, up to 17 s)."""
    import txjoin.join.state_log as state_log

    monkeypatch.setattr(state_log, "SNAPSHOT_MIN_ROWS", 50)
    job, snapshot, txs, records = _snapshot_records(1500)
    engine = ShardedEngine(job, 2)
    snapshots: list[int] = []
    for store in engine.stores:
        put = store.put

        def counting(kind: int, version: int, chunk: int, blob: bytes, put: Any = put) -> None:
            if kind == state_log.SNAPSHOT and chunk == 0:
                snapshots.append(version)
            put(kind, version, chunk, blob)

        store.put = counting  # type: ignore[method-assign]
    every = [*job.table_names, "transaction"]
    for start in range(0, len(records), 40):
        engine.process(records[start:start + 40], every if start + 40 >= len(records) else [])
    # per shard about log2(rows / 50) compactions; counting only the join's rows: ~25
    assert 0 < len(snapshots) <= 14, snapshots
    assert engine.outputs() == outputs_after_each(job, snapshot, txs)[-1]


# -- shard-count invariance: every scenario at 1, 2, 3 and 4 shards, without Spark ---------------
# tests/spark/test_pipeline.py runs every scenario through Spark at one shard count (and a few
# at the others): what the shard count could change is checked here, on the same schedules.

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "scenarios").glob("*.yaml"))


def observe_sharded(scenario: Any, schedule: Any, n_shards: int,
                    staged: bool = False, split: bool = False) -> RunObservation:
    """:func:`observe_core` with the job split over ``n_shards`` shard logs; a ``restart``
    drops every shard's cached engine, so each goes on from its log (the checkpoint).
    ``staged``: the staged engine (``join/staged.py``), whose sequencer a restart drops too;
    ``split``: with every lookup it can split split (``join/placement.py``)."""
    job = scenario.job
    engine: ShardedEngine | StagedEngine = (
        StagedEngine(job, n_shards, split=splittable(job) if split else ())
        if staged else ShardedEngine(job, n_shards))
    current: dict[Any, Any] = {}
    seen = RunObservation(outputs=[], changelog=[], released=[])
    assert seen.released is not None
    drop: list[int] = []
    for step in schedule.steps:
        if isinstance(step, Restart):
            drop = list(range(n_shards))
            continue
        records = [(r.topic, 0, r.offset, r.value) for r in step.records]
        try:
            if isinstance(engine, StagedEngine):
                changes = engine.process(records, schedule.caught_up_tables(step),
                                         drop_cache=drop, drop_sequencer=bool(drop))
            else:
                changes = engine.process(records, schedule.caught_up_tables(step),
                                         drop_cache=drop)
        except TxjoinError as exc:
            seen.error = f"{type(exc).__name__}: {exc}"
            break
        drop = []
        observe_batch(seen, job, current, changes)
        seq = engine.commit_seq  # asserts every shard released the same prefix
        seen.released.append(seq if seq > 0 else (0 if engine.snapshot_released else None))
    return seen


def assert_the_cores_changes(scenario: Any, schedule: Any, core: RunObservation,
                             staged: bool = False, split: bool = False) -> None:
    """The scenario's own checks hold at 1-4 shards, and every shard count produces the
    unsharded core's (``core``) change stream: the same rows, the same (key, commit)
    versions, batch for batch."""
    for n_shards in (1, 2, 3, 4):
        seen = observe_sharded(scenario, schedule, n_shards, staged, split)
        failures = check_scenario(scenario, schedule, seen)
        assert not failures, f"shards {n_shards}:\n" + "\n".join(failures)
        assert seen.error == core.error, f"shards {n_shards}"
        assert seen.released == core.released, f"shards {n_shards}"
        assert sorted(seen.changelog, key=_changelog_key) == sorted(
            core.changelog, key=_changelog_key), f"shards {n_shards}"
        for n, (a, b) in enumerate(zip(seen.outputs, core.outputs, strict=True)):
            assert sorted(map(repr, a)) == sorted(map(repr, b)), f"shards {n_shards}, batch {n}"


def _changelog_key(row: dict[str, Any]) -> tuple[int, str]:
    return row["_commit_seq"], repr(sorted(row.items()))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_scenario_gives_the_same_changes_at_every_shard_count(path: Path) -> None:
    """The scenario's own checks hold at 1-4 shards, and every shard count produces the
    unsharded core's change stream: the same rows, the same (key, commit) versions, batch
    for batch."""
    scenario = load_scenario(path)
    schedule = compile_schedule(scenario)
    unsharded = observe_core(scenario, schedule)
    assert not check_scenario(scenario, schedule, unsharded)
    assert_the_cores_changes(scenario, schedule, unsharded)


@given(data=st.data())
def test_the_change_stream_does_not_depend_on_the_shard_count(data: Any) -> None:
    """One workload and delivery through 1 to 4 shards (any cache losses): batch for batch,
    the same changes (key, commit, row) come out."""
    job, rows = JOB_VARIANTS["orders/current"]
    workload = data.draw(workloads(rows), label="workload")
    batches = data.draw(deliveries(produce(job, workload)), label="delivery")
    streams = []
    for n_shards in (1, 2, 3, 4):
        engine = ShardedEngine(job, n_shards)
        stream = []
        for n, batch in enumerate(batches):
            drop = data.draw(st.sets(st.integers(0, n_shards - 1)),
                             label=f"drop cache {n_shards}/{n}")
            records = [(r.topic, 0, r.offset, r.value) for r in batch.records]
            caught = {t.removeprefix("shop.") for t in batch.caught_up}
            changes = engine.process(records, caught, drop_cache=drop)
            stream.append(sorted((repr(ch.key), ch.commit_seq, repr(ch.row)) for ch in changes))
        streams.append(stream)
    assert all(stream == streams[0] for stream in streams[1:])
