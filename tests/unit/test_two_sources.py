"""Jobs over two source databases (issue 10): per-source transaction consistency.

Invariant, over random workloads (each transaction commits in one of the two
databases, whose xids collide) and random Kafka deliveries: after every batch
the output is the job on (users after its k-th transaction, colours after its
m-th), k and m never decreasing; at the end the job on both final states;
nothing applied twice. An idle source never holds the other back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.strategies import (
    USERS_ROWS,
    assert_restarts_change_nothing,
    deliveries,
    produce,
    workloads,
)
from txjoin.cli import parse_topic_prefixes
from txjoin.errors import ConfigError, JobError
from txjoin.job import Job, Source, Table, load_job
from txjoin.join.engine import Engine
from txjoin.join.oracle import RowChange, SourceTransaction, outputs_by_source_prefixes
from txjoin.join.output import changes_to_table, output_schema
from txjoin.join.placement import splittable
from txjoin.join.sharded import ShardedEngine
from txjoin.join.staged import StagedEngine
from txjoin.scenarios.core_runner import observe_core
from txjoin.scenarios.schedule import compile_schedule
from txjoin.scenarios.spec import load_scenario
from txjoin.scenarios.synthesize import SourcesSynthesizer

ROOT = Path(__file__).resolve().parents[2]
TWO_DBS = load_job(ROOT / "jobs" / "users_colors_two_dbs.py")
PREFIXES = TWO_DBS.source_prefixes("unused")


def _caught(job: Job, topics: set[str]) -> set[str]:
    streams = job.streams(PREFIXES)
    return {streams[t] for t in topics if t in streams}


def _per_source(engine: Any) -> tuple[int, ...]:
    return tuple(engine.frontiers[s].commit_seq for s in engine.job.source_names)


def _check_run(data: Any, n_shards: int | None, staged: bool = False) -> None:
    """``staged``: the staged engine's shards (``join/staged.py``), its sequencer restarted
    from its saved state at random."""
    job = TWO_DBS
    workload = data.draw(workloads(USERS_ROWS, job=job), label="workload")
    batches = data.draw(deliveries(produce(job, workload)), label="delivery")
    grid = outputs_by_source_prefixes(job, workload.snapshot, workload.transactions)
    # A database that is empty and never commits never shows its snapshot finished
    # (docs/writing-jobs.md, "Two source databases"): then nothing may be released at all.
    silent = any(not any(workload.snapshot.get(t) for t in job.tables_of(s))
                 and not any(tx.source == s for tx in workload.transactions)
                 for s in job.source_names)
    split = (data.draw(st.sets(st.sampled_from(splittable(job))), label="split lookups")
             if staged and splittable(job) else set())
    sharded = None if n_shards is None else (
        StagedEngine(job, n_shards, split=split) if staged else ShardedEngine(job, n_shards))
    engine = Engine(job) if sharded is None else None
    applied: dict[Any, Any] = {}
    seen: set[tuple[Any, int]] = set()
    last_seq, last = -1, (0, 0)
    for n, batch in enumerate(batches):
        records = [(r.topic, 0, r.offset, r.value) for r in batch.records]
        caught = _caught(job, batch.caught_up)
        if isinstance(sharded, StagedEngine):
            drop = data.draw(st.sets(st.integers(0, sharded.n_shards - 1)), label=f"drop {n}")
            changes = sharded.process(records, caught, drop_cache=drop, drop_sequencer=data.draw(
                st.booleans(), label=f"drop sequencer {n}"))
            assert sharded.commit_seq >= 0  # every shard applied the same releases
            current, outputs = sharded.sequencer, sharded.outputs()
        elif sharded is not None:
            drop = data.draw(st.sets(st.integers(0, sharded.n_shards - 1)), label=f"drop {n}")
            changes = sharded.process(records, caught, drop_cache=drop)
            engines = sharded.engines()
            assert len({_per_source(e) for e in engines}) == 1, "shards disagree"
            current, outputs = engines[0], sharded.outputs()
        else:
            assert engine is not None
            changes = engine.process(records, caught_up=caught)
            current, outputs = engine, engine.outputs()
        for ch in changes:
            assert (ch.key, ch.commit_seq) not in seen, f"{ch} applied twice"
            assert ch.commit_seq >= last_seq, f"{ch}: commit_seq went back"
            seen.add((ch.key, ch.commit_seq))
            if ch.row is None:
                applied.pop(ch.key, None)
            else:
                applied[ch.key] = ch.row
            last_seq = max(last_seq, ch.commit_seq)
        assert applied == outputs, "the change stream disagrees with the state"
        if not current.snapshot_done:
            assert applied == {}, f"batch {n}: output before every snapshot was complete"
            continue
        assert not silent, "released before a silent source showed its snapshot finished"
        ks = _per_source(current)
        assert all(k >= p for k, p in zip(ks, last, strict=True)), f"batch {n}: went back"
        last = ks
        assert applied == grid[ks], (f"batch {n}: not the job on (users after {ks[0]}, colours "
                                     f"after {ks[1]})\ngot      {applied}\nexpected {grid[ks]}")
    if silent:
        assert applied == {}
        return
    assert last == max(grid), "not every transaction of both sources was applied"
    assert applied == grid[max(grid)]


@given(data=st.data())
def test_output_is_always_one_committed_prefix_per_source_and_converges(data: Any) -> None:
    _check_run(data, None)


@given(data=st.data())
def test_union_of_shard_outputs_is_one_committed_prefix_per_source(data: Any) -> None:
    _check_run(data, data.draw(st.integers(1, 4), label="shards"))


AS_OF_FACT = Job(**{**{f: getattr(TWO_DBS, f) for f in (
    "name", "tables", "fact", "fact_alias", "lookups", "output", "sources")},
    "semantics": "as_of_fact"})


@pytest.mark.parametrize("n_shards", [None, 3])
@given(data=st.data())
def test_as_of_fact_across_sources_uses_the_other_source_as_of_the_applying_batch(
        n_shards: int | None, data: Any) -> None:
    """docs/writing-jobs.md: with as_of_fact a fact is enriched with the other source's
    state as of the batch in which the fact's transaction is applied. The oracle replays the same
    per-batch interleaving (first source's newly applied transactions, then the
    second's), taking the per-source counts the engine reports after each batch, which
    never go back and reach every source's last transaction at the end."""
    from txjoin.join.oracle import Oracle

    job = AS_OF_FACT
    workload = data.draw(workloads(USERS_ROWS, job=job), label="workload")
    batches = data.draw(deliveries(produce(job, workload)), label="delivery")
    per_source = {s: [tx for tx in workload.transactions if tx.source == s]
                  for s in job.source_names}
    oracle = Oracle(job)
    oracle.load_snapshot(workload.snapshot)
    sharded = ShardedEngine(job, n_shards) if n_shards else None
    engine = Engine(job)
    done = dict.fromkeys(job.source_names, 0)
    for batch in batches:
        records = [(r.topic, 0, r.offset, r.value) for r in batch.records]
        caught = _caught(job, batch.caught_up)
        if sharded is not None:
            sharded.process(records, caught)
            current, outputs = sharded.engines()[0], sharded.outputs()
        else:
            engine.process(records, caught_up=caught)
            current, outputs = engine, engine.outputs()
        if not current.snapshot_done:
            continue
        for source, k in zip(job.source_names, _per_source(current), strict=True):
            # a count that went back would apply nothing here and pass unnoticed
            assert k >= done[source], f"{source}: {done[source]} transactions applied, then {k}"
            for tx in per_source[source][done[source]:k]:
                oracle.apply(tx)
            done[source] = k
        assert outputs == oracle.output
    # the last delivery reads every topic to its end: every transaction is released, unless
    # a database is empty and silent (its snapshot never shows finished: see _check_run)
    silent = any(not any(workload.snapshot.get(t) for t in job.tables_of(s))
                 and not per_source[s] for s in job.source_names)
    assert done == {s: 0 if silent else len(txs) for s, txs in per_source.items()}, done


@given(data=st.data())
def test_two_source_engine_state_survives_serialisation_between_batches(data: Any) -> None:
    job = TWO_DBS
    workload = data.draw(workloads(USERS_ROWS, job=job), label="workload")
    batches = data.draw(deliveries(produce(job, workload)), label="delivery")
    assert_restarts_change_nothing(job, batches, lambda topics: _caught(job, topics))


# -- an idle source ----------------------------------------------------------------------


def _users_tx(n: int) -> SourceTransaction:
    return SourceTransaction(f"u{n}", [RowChange("insert", "public.users",
                                                 {"id": n, "full_name": f"user {n}"})], "users")


def test_an_idle_source_never_holds_the_other_back() -> None:
    """Colours commits nothing (its topics stay silent) while users commits ten times:
    each users transaction is applied in the batch that delivers it."""
    synth = SourcesSynthesizer(TWO_DBS, PREFIXES)
    snapshot = synth.snapshot({"public.users": [{"id": 100, "full_name": "ann"}],
                               "public.users_favorite_color": [
                                   {"id": 1, "user_id": 100, "favorite_color": "red"}]})
    engine = Engine(TWO_DBS)
    engine.process([(r.topic, 0, r.offset, r.value) for r in snapshot])
    assert engine.outputs()[(100,)]["favorite_color"] == "red"
    for n in range(1, 11):
        records = synth.transaction(_users_tx(n))
        changes = engine.process([(r.topic, 0, r.offset, r.value) for r in records],
                                 caught_up={"public.users", "transaction:users"})
        assert [(c.key, c.source, c.commit_seq) for c in changes] == [((n,), "users", n)]
    assert _per_source(engine) == (10, 0)


def test_an_open_transaction_of_one_source_does_not_hold_the_other_back() -> None:
    synth = SourcesSynthesizer(TWO_DBS, PREFIXES)
    snapshot = synth.snapshot({"public.users": [{"id": 100, "full_name": "ann"}],
                               "public.users_favorite_color": [
                                   {"id": 1, "user_id": 100, "favorite_color": "red"}]})
    colour = synth.transaction(SourceTransaction("c1", [RowChange(
        "update", "public.users_favorite_color",
        {"id": 1, "user_id": 100, "favorite_color": "blue"})], "colors"))
    users = synth.transaction(_users_tx(1))
    # xids collide across the two databases: both are the first after the snapshot
    assert {r.value and '"txId":1001' in r.value for r in colour + users if r.kind == "data"} \
        == {True}
    engine = Engine(TWO_DBS)
    first = snapshot + colour[:-1] + users  # the colour transaction's END is late
    engine.process([(r.topic, 0, r.offset, r.value) for r in first])
    assert _per_source(engine) == (1, 0)
    assert engine.outputs()[(100,)]["favorite_color"] == "red"
    engine.process([(r.topic, 0, r.offset, r.value) for r in colour[-1:]])
    assert _per_source(engine) == (1, 1)
    assert engine.outputs()[(100,)]["favorite_color"] == "blue"


def test_idle_source_scenario_releases_every_users_transaction_in_its_batch() -> None:
    scenario = load_scenario(ROOT / "scenarios" / "two_dbs_idle_source.yaml")
    seen = observe_core(scenario, compile_schedule(scenario))
    assert seen.released == [0, 1, 2, 2, 3, 4, 5]


def test_nothing_is_released_before_both_snapshots_are_complete() -> None:
    synth = SourcesSynthesizer(TWO_DBS, PREFIXES)
    snapshot = synth.snapshot({"public.users": [{"id": 1, "full_name": "ann"}],
                               "public.users_favorite_color": [
                                   {"id": 1, "user_id": 1, "favorite_color": "red"}]})
    users = [r for r in snapshot if r.table == "public.users"]
    colours = [r for r in snapshot if r.table != "public.users"]
    engine = Engine(TWO_DBS)
    engine.process([(r.topic, 0, r.offset, r.value) for r in users])
    assert engine.outputs() == {} and not engine.snapshot_done
    engine.process([(r.topic, 0, r.offset, r.value) for r in colours])
    assert engine.outputs()[(1,)]["favorite_color"] == "red"


# -- the job API and the output ------------------------------------------------------------


def _two(**changes: Any) -> Job:
    tables = changes.pop("tables", [
        Table("public.users", {"id": "int", "full_name": "text"}, source="users"),
        Table("public.users_favorite_color", {"id": "int", "user_id": "int",
                                              "favorite_color": "text"}, source="colors")])
    kwargs = {"name": "two", "tables": tables, "fact": TWO_DBS.fact,
              "fact_alias": TWO_DBS.fact_alias, "lookups": TWO_DBS.lookups,
              "output": TWO_DBS.output, "semantics": "current",
              "sources": [Source("users", prefix="a"), Source("colors", prefix="b")]}
    kwargs.update(changes)
    return Job(**kwargs)


def test_sources_give_topics_prefixes_and_streams() -> None:
    job = _two()
    prefixes = job.source_prefixes("shop", {"colors": "c2"})
    assert prefixes == {"users": "a", "colors": "c2"}
    assert job.all_topics(prefixes) == ["a.public.users", "c2.public.users_favorite_color",
                                        "a.transaction", "c2.transaction"]
    assert job.streams(prefixes)["c2.transaction"] == "transaction:colors"
    single = load_job(ROOT / "jobs" / "users_colors.py")
    assert single.source_prefixes("shop") == {"default": "shop"}
    assert single.all_topics("shop")[-1] == "shop.transaction"
    assert single.streams("shop")["shop.transaction"] == "transaction"


@pytest.mark.parametrize(("changes", "complaint"), [
    ({"sources": [Source("users", "a"), Source("users", "b")]}, "declared twice"),
    ({"sources": [Source("users", "a"), Source("colors", "a")]}, "share a topic prefix"),
    ({"sources": [Source("users", "a")]}, "names source 'colors'"),
    ({"sources": []}, "declares no sources"),
])
def test_bad_sources_are_one_line_job_errors(changes: dict[str, Any], complaint: str) -> None:
    with pytest.raises(JobError, match=complaint) as err:
        _two(**changes)
    assert "\n" not in str(err.value)


def test_a_table_without_source_in_a_job_with_sources_is_refused() -> None:
    tables = [Table("public.users", {"id": "int", "full_name": "text"}, source="users"),
              Table("public.users_favorite_color", {"id": "int", "user_id": "int",
                                                    "favorite_color": "text"})]
    with pytest.raises(JobError, match="names no source"):
        _two(tables=tables)


def test_a_source_without_prefix_needs_one_on_the_command_line() -> None:
    job = _two(sources=[Source("users", "a"), Source("colors")])
    with pytest.raises(JobError, match="--topic-prefix colors=PREFIX"):
        job.source_prefixes("shop")
    assert job.source_prefixes("shop", {"colors": "c"})["colors"] == "c"


def test_topic_prefix_options() -> None:
    names = ["users", "colors"]
    assert parse_topic_prefixes(["colors=c9"], names, True) == ("shop", {"colors": "c9"})
    assert parse_topic_prefixes(["x"], ["default"], False) == ("x", {})
    with pytest.raises(ConfigError, match="users, colors"):
        parse_topic_prefixes(["x"], names, True)
    with pytest.raises(ConfigError, match="no source 'nope'"):
        parse_topic_prefixes(["nope=x"], names, True)


def test_output_of_a_job_with_sources_has_a_source_column() -> None:
    assert "_source" in output_schema(TWO_DBS).names
    assert "_source" not in output_schema(load_job(ROOT / "jobs" / "users_colors.py")).names
    synth = SourcesSynthesizer(TWO_DBS, PREFIXES)
    records = synth.snapshot({"public.users": [{"id": 1, "full_name": "ann"}],
                              "public.users_favorite_color": [
                                  {"id": 1, "user_id": 1, "favorite_color": "red"}]})
    records += synth.transaction(SourceTransaction("c", [RowChange(
        "update", "public.users_favorite_color",
        {"id": 1, "user_id": 1, "favorite_color": "blue"})], "colors"))
    changes = Engine(TWO_DBS).process([(r.topic, 0, r.offset, r.value) for r in records])
    table = changes_to_table(TWO_DBS, changes)
    assert table.column("_source").to_pylist() == [None, "colors"]
    assert table.column("_commit_seq").to_pylist() == [0, 1]


# -- the scenario format's `sources:` extension ------------------------------------------------


def _scenario(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nabout: x\njob: {ROOT / 'jobs' / 'users_colors_two_dbs.py'}\n"
                    + body)
    return path


@pytest.mark.parametrize(("body", "complaint"), [
    ("transactions:\n  - name: t\n    ops: []\n", "missing required key 'source'"),
    ("transactions:\n  - name: t\n    source: nope\n    ops: []\n", "unknown source 'nope'"),
    ("transactions:\n  - name: t\n    source: colors\n    ops:\n"
     "      - insert: public.users\n        row: {id: 1, full_name: a}\n",
     "belongs to source 'users'"),
    ("topic_prefix: x\ntransactions:\n  - name: t\n    source: users\n    ops: []\n",
     "give their prefixes under `sources:`"),
    ("sources: {users: x, colors: x}\ntransactions:\n  - name: t\n    source: users\n"
     "    ops: []\n", "share a topic prefix"),
    ("transactions:\n  - name: t\n    source: users\n    ops: []\n"
     "expect:\n  frontier:\n    0: t\n", "expect.frontier"),
])
def test_bad_sources_in_a_scenario_name_the_line(tmp_path: Path, body: str,
                                                 complaint: str) -> None:
    from txjoin.errors import ScenarioError

    with pytest.raises(ScenarioError, match=complaint) as err:
        load_scenario(_scenario(tmp_path, body))
    assert str(err.value).startswith(f"{tmp_path / 's.yaml'}:")


def test_sources_in_a_scenario_of_a_single_source_job_is_refused(tmp_path: Path) -> None:
    from txjoin.errors import ScenarioError

    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nabout: x\njob: {ROOT / 'jobs' / 'users_colors.py'}\n"
                    "sources: {default: x}\ntransactions:\n  - name: t\n    ops: []\n")
    with pytest.raises(ScenarioError, match="declares no sources"):
        load_scenario(path)


def test_scenario_prefixes_override_the_jobs() -> None:
    scenario = load_scenario(ROOT / "scenarios" / "seed_000_two_databases.yaml")
    assert scenario.prefixes == {"users": "users_db", "colors": "colors_db"}
    schedule = compile_schedule(scenario)
    assert "colors_db.transaction" in schedule.topics
    assert "users_db.transaction" in schedule.topics


def test_the_pair_check_catches_a_source_going_back_and_a_state_of_no_pair() -> None:
    from txjoin.scenarios.checks import check_source_prefixes_consistent

    grid = {(0, 0): {1: {"id": 1, "c": None}}, (1, 0): {1: {"id": 1, "c": "a"}},
            (0, 1): {1: {"id": 1, "c": "b"}}, (1, 1): {1: {"id": 1, "c": "ab"}}}
    sources = ["s1", "s2"]
    rows = {k: list(v.values()) for k, v in grid.items()}
    ok = check_source_prefixes_consistent([rows[(0, 0)], rows[(0, 1)], rows[(1, 1)]], grid,
                                          sources, ["id"])
    assert ok.ok
    back = check_source_prefixes_consistent([rows[(1, 0)], rows[(0, 1)]], grid, sources, ["id"])
    assert not back.ok and "after batch 1" in back.message
    torn = check_source_prefixes_consistent([[{"id": 1, "c": "torn"}]], grid, sources, ["id"])
    assert not torn.ok and "closest" in torn.message
