"""The PostgreSQL sink written from the tasks: each task COPYs its part of a micro-batch into
the batch's UNLOGGED staging table, the driver applies it with the progress in one
transaction (txjoin.sinks.postgres.Stage, PostgresSink.stage/apply).

Against the session's real PostgreSQL server; no Spark (the tasks' side is ``Stage.copy``,
which a Spark task runs as it is run here).
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
from pathlib import Path

import psycopg2
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.postgres import new_database
from tests.spark.test_sinks import SCHEMA, batch, change, current_of
from txjoin import crashpoints
from txjoin.errors import ServiceError
from txjoin.sinks import apply_changes, current_schema, last_change_per_key, without_metadata
from txjoin.sinks.lineage import Lineage
from txjoin.sinks.postgres import STAGE_PREFIX, PostgresSink

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
_tables = itertools.count()


@pytest.fixture(scope="module")
def dsn(pg_server: str) -> str:
    return new_database(pg_server, "staging")


def new_sink(dsn: str) -> PostgresSink:
    table = f"staged_{next(_tables)}"
    return PostgresSink(dsn, table, f"job.{table}", ["order_id"], SCHEMA)


def stages_left(dsn: str) -> list[str]:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE starts_with(tablename, %s)",
                    (STAGE_PREFIX,))
        return sorted(r[0] for r in cur.fetchall())


def rows_of(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: r["order_id"])


# One batch: changes over a few keys in commit order; its parts split it by key (as shards
# do), each part in commit order.
# (op, key, whether the change is in the previous change's transaction: a transaction may
# change one key more than once, so its commit sequence alone does not order them)
changes_strategy = st.lists(
    st.tuples(st.sampled_from("cud"), st.integers(1, 8), st.booleans()), min_size=0,
    max_size=25)


def by_position(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["_commit_seq"], r["order_id"], r["_op"]))


# 15 examples, not the ci profile's 200 (issue 68): 1.44 s for 15, measured
# on 2026-12-02, near idle (x1.5-2 in the suite); 200 would add ~18 s to a suite over its budget.
@settings(max_examples=15, deadline=None)
@given(batches=st.lists(changes_strategy, min_size=1, max_size=3),
       parts=st.integers(1, 4), rnd=st.randoms(use_true_random=False),
       retried=st.sets(st.integers(0, 3)))
def test_a_batch_staged_in_parts_in_any_order_and_retried_applies_as_the_whole_batch(
        dsn: str, batches: list[list[tuple[str, int, bool]]], parts: int,
        rnd: random.Random, retried: set[int]) -> None:
    """Whatever the tasks' order, however often a task's part is written again (a retried
    task), the sink ends holding what the batch's changes give applied in commit order:
    the last change per key in the current table, every change once in the changelog, and
    no stage left."""
    sink = new_sink(dsn)
    try:
        seq = itertools.count(1)
        expected = current_schema(SCHEMA).empty_table()
        log: list[dict] = []
        names = []
        for batch_id, ops in enumerate(batches):
            seqs: list[int] = []
            for i, (_, _, same) in enumerate(ops):
                seqs.append(seqs[-1] if same and i else next(seq))
            changes = batch(*(change(op, key, at)
                              for (op, key, _), at in zip(ops, seqs, strict=True)))
            stage = sink.stage(batch_id, "ckpt")
            assert stage is not None
            names.append(stage.name)
            order = list(range(parts)) + [p for p in retried if p < parts]
            rnd.shuffle(order)
            staged = {}
            part_of = [key % parts for key in changes.column("order_id").to_pylist()]
            for part in order:
                mine = changes.filter(pa.array([p == part for p in part_of], pa.bool_()))
                staged[part] = stage.copy(part, mine)
            assert sink.apply(stage, list(staged.values()), Lineage("ckpt", batch_id)) is True
            expected = apply_changes(expected, last_change_per_key(changes, ["order_id"]),
                                     ["order_id"])
            log += changes.to_pylist()
        assert sink.read_current() == rows_of(expected)
        assert by_position(sink.read_changelog()) == by_position(log)
        assert not set(names) & set(stages_left(dsn))
    finally:
        sink.close()


def test_a_held_batch_gets_no_stage_and_a_killed_runs_stage_is_replaced_by_the_rerun(
        dsn: str) -> None:
    sink = new_sink(dsn)
    assert sink.write(0, batch(change("c", 1, 1)), Lineage("ckpt", 1)) is True
    assert sink.stage(0, "ckpt") is None  # Spark re-ran batch 0: nothing to write
    # a run killed after its tasks staged batch 1, before the driver applied it
    killed = sink.stage(1, "ckpt")
    assert killed is not None
    killed.copy(0, batch(change("u", 1, 2), change("c", 2, 3)))
    rerun = sink.stage(1, "ckpt")
    assert rerun is not None and rerun.name == killed.name
    part = rerun.copy(0, batch(change("u", 1, 2), change("c", 2, 3)))
    assert sink.apply(rerun, [part], Lineage("ckpt", 3)) is True
    assert [r["_commit_seq"] for r in sink.read_changelog()] == [1, 2, 3]
    assert sink.held() is not None and sink.held().last_change_xid == 1003  # type: ignore
    sink.close()


def test_upkeep_drops_and_counts_the_stages_killed_runs_left(dsn: str) -> None:
    sink = new_sink(dsn)
    left = []
    for checkpoint, batch_id in (("old", 7), ("ckpt", 1)):  # a wiped checkpoint's, and one
        stage = sink.stage(batch_id, checkpoint)
        assert stage is not None
        stage.copy(0, batch(change("c", 1, 1)))
        left.append(stage.name)
    other = new_sink(dsn)
    others = other.stage(0, "ckpt")  # another job's: not this sink's to drop
    assert others is not None and set(left) <= set(stages_left(dsn))
    upkeep = sink.maintain()
    assert [(u.on_disk_before, u.on_disk_after) for u in upkeep] == [(2, 0)]
    assert upkeep[0].line().startswith(f"postgres public.{sink.table}: 2 -> 0 staging tables")
    assert not set(left) & set(stages_left(dsn)) and others.name in stages_left(dsn)
    assert sink.maintain()[0].on_disk_before == 0
    assert sink.write(0, batch(change("c", 5, 1)), Lineage("ckpt", 1)) is True
    assert other.maintain()[0].on_disk_before == 1
    sink.close()
    other.close()


def test_a_stage_postgresql_emptied_is_refused_in_one_line_and_nothing_applied(
        dsn: str) -> None:
    sink = new_sink(dsn)
    stage = sink.stage(0, "ckpt")
    assert stage is not None
    part = stage.copy(0, batch(change("c", 1, 1), change("c", 2, 2)))
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:  # crash recovery's truncation
        cur.execute(f'TRUNCATE "{stage.name}"')
    with pytest.raises(ServiceError) as caught:
        sink.apply(stage, [part], Lineage("ckpt", 2))
    message = str(caught.value)
    assert "\n" not in message and "holds 0 rows, the tasks staged 2" in message
    assert "nothing of batch 0 was applied; run again" in message
    assert sink.held() is None and sink.read_changelog() == []
    sink.close()


KILLED = """
import sys
from tests.spark.test_sinks import SCHEMA, batch, change
from txjoin.sinks.lineage import Lineage
from txjoin.sinks.postgres import PostgresSink
sink = PostgresSink(sys.argv[1], sys.argv[2], "job." + sys.argv[2], ["order_id"], SCHEMA)
sink.write(0, batch(change("c", 1, 1)), Lineage("ckpt", 1))
sink.write(1, batch(change("u", 1, 2), change("c", 2, 3)), Lineage("ckpt", 3))
print("survived", flush=True)
"""


@pytest.mark.parametrize("point", [crashpoints.POSTGRES_STAGED, crashpoints.POSTGRES_APPLIED])
def test_a_kill_after_staging_or_inside_the_apply_leaves_the_batch_out_and_its_rerun_lands_once(
        dsn: str, tmp_path: Path, point: str) -> None:
    """kill -9 at batch 1's crash point (after the tasks staged it; inside the transaction
    that applies it, before the progress): readers see batch 0 only, and the batch's re-run
    (what Spark does after the crash) applies it once."""
    table = f"killed_{next(_tables)}"
    record = tmp_path / "fired"
    env = {**os.environ, crashpoints.CRASH_ENV: f"{point}:1",
           crashpoints.RECORD_ENV: str(record), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", KILLED, dsn, table], env=env, cwd=ROOT,
                          capture_output=True, text=True, start_new_session=True, timeout=120,
                          check=False)
    assert done.returncode == -9 and "survived" not in done.stdout, done.stderr
    assert crashpoints.fired(record) == [(point, 1)]
    sink = PostgresSink(dsn, table, f"job.{table}", ["order_id"], SCHEMA)
    assert sink.last_applied_batch() == 0
    assert [without_metadata(r) for r in sink.read_current()] == [
        without_metadata(current_of(change("c", 1, 1)))]
    assert sink.write(1, batch(change("u", 1, 2), change("c", 2, 3)), Lineage("ckpt", 3))
    assert [r["_commit_seq"] for r in sink.read_changelog()] == [1, 2, 3]
    assert sink.write(1, batch(change("u", 1, 2), change("c", 2, 3)),
                      Lineage("ckpt", 3)) is False
    assert sink.maintain()[0].on_disk_before == 0  # the re-run replaced the killed stage
    sink.close()
