"""The Delta sink's data files written by the tasks: each task writes its part of a
micro-batch as staged files (``txjoin.sinks.delta_stage.DeltaStage.copy``, run here as a
Spark task runs it), the hand-off records what they wrote, and the group commit links the
changelog's files into the table and commits their add actions, the current table updated
from the parts' last changes (``DeltaSink.write_group``).

Against delta-spark on the session's Spark; the kill -9 of the pipeline at the new crash
points is in tests/spark/test_kill.py.
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from tests.spark.test_sinks import SCHEMA, batch, change, current_of
from txjoin import crashpoints
from txjoin.sinks import apply_changes, current_schema, last_change_per_key
from txjoin.sinks.delta import DeltaSink
from txjoin.sinks.delta_stage import CHANGELOG, CURRENT, STAGED_MAX_AGE_S, DeltaStage
from txjoin.sinks.handoff import Handoff, Parcel
from txjoin.sinks.lineage import Lineage

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
_tables = itertools.count()


def by_position(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["_commit_seq"], r["order_id"], r["_op"]))


def staged_files(sink: DeltaSink) -> list[str]:
    root = sink.root / "_staged"
    return sorted(f"{kind}/{f.name}" for kind in (CHANGELOG, CURRENT)
                  if (root / kind).is_dir() for f in (root / kind).iterdir())


def written_in_parts(sink: DeltaSink, batch_id: int, changes: pa.Table, parts: int,
                     rnd: random.Random, retried: set[int], checkpoint: str = "ckpt"
                     ) -> Parcel | None:
    """What foreachBatch does: the batch's stage, its parts written by "tasks" in a random
    order (some written twice: a retried task), the parcel the hand-off gets."""
    stage = sink.stage(batch_id, checkpoint)
    if stage is None:
        return None
    order = list(range(parts)) + [p for p in retried if p < parts]
    rnd.shuffle(order)
    part_of = [key % parts for key in changes.column("order_id").to_pylist()]
    staged = {}
    for part in order:
        mine = changes.filter(pa.array([p == part for p in part_of], pa.bool_()))
        staged[part] = stage.copy(part, mine)
    ts = [int(v.timestamp() * 1000) for v in changes.column("_commit_ts").to_pylist()]
    return Parcel(batch_id, pa.table({}), Lineage(checkpoint, batch_id), time.time(),
                  tuple(staged[p] for p in sorted(staged)), tuple(ts))


changes_strategy = st.lists(
    st.tuples(st.sampled_from("cud"), st.integers(1, 8), st.booleans()), min_size=0,
    max_size=20)


# 4 examples, not the ci profile's 200 (issue 68): each example creates two Delta tables and
# makes 2-8 commits on delta-spark; 10 examples measured 319 s on 2026-12-02 at load 5-10.
@settings(max_examples=4, deadline=None)
@given(batches=st.lists(changes_strategy, min_size=1, max_size=4),
       parts=st.integers(1, 3), rnd=st.randoms(use_true_random=False),
       retried=st.sets(st.integers(0, 2)), groups=st.lists(st.integers(1, 3), min_size=5,
                                                            max_size=5),
       rerun=st.sets(st.integers(0, 4)))
def test_batches_written_in_parts_in_any_order_retried_and_rerun_commit_as_the_whole_batches(
        spark: SparkSession, tmp_path_factory: pytest.TempPathFactory,
        batches: list[list[tuple[str, int, bool]]], parts: int, rnd: random.Random,
        retried: set[int], groups: list[int], rerun: set[int]) -> None:
    """However the tasks' parts come (any order, retried tasks), whichever batches are
    written again (a re-run after a kill before the hand-off) and however the batches are
    grouped into commits, the tables end holding what the whole batches applied in order
    give: every change once in the changelog, the last change per key in the current table,
    and no staged file left."""
    out = tmp_path_factory.mktemp("staged")
    sink = DeltaSink(str(out), f"orders_{next(_tables)}", "job", ["order_id"], SCHEMA,
                     spark=spark)
    seq = itertools.count(1)
    expected = current_schema(SCHEMA).empty_table()
    log: list[dict] = []
    pending: list[Parcel] = []
    sizes = iter(groups)
    for batch_id, ops in enumerate(batches):
        seqs: list[int] = []
        for i, (_, _, same) in enumerate(ops):
            seqs.append(seqs[-1] if same and i else next(seq))
        changes = batch(*(change(op, key, at) for (op, key, _), at in zip(ops, seqs, strict=True)))
        if batch_id in rerun:  # a killed run's tasks wrote it, the re-run writes it again
            written_in_parts(sink, batch_id, changes, parts, rnd, set())
        parcel = written_in_parts(sink, batch_id, changes, parts, rnd, retried)
        assert parcel is not None and parcel.rows == changes.num_rows
        pending.append(parcel)
        if len(pending) >= next(sizes) or batch_id == len(batches) - 1:
            sink.write_group(pending)
            pending = []
        expected = apply_changes(expected, last_change_per_key(changes, ["order_id"]),
                                 ["order_id"])
        log += changes.to_pylist()
    assert sink.read_current() == sorted(expected.to_pylist(), key=lambda r: r["order_id"])
    assert by_position(sink.read_changelog()) == by_position(log)
    assert sink.last_applied_batch() == len(batches) - 1
    assert staged_files(sink) == []
    # A plain Spark read sees the same changelog as delta-rs.
    assert spark.read.format("delta").load(sink.changelog_path).count() == len(log)


def test_a_held_batch_gets_no_stage_and_another_checkpoints_sink_is_refused(
        spark: SparkSession, tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    parcel = written_in_parts(sink, 0, batch(change("c", 1, 1)), 2, random.Random(1), set())
    assert parcel is not None
    sink.write_group([parcel])
    # a new run (a new sink object) re-runs batch 0 after its hand-off was committed
    again = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    assert again.stage(0, "ckpt") is None and again.stage(1, "ckpt") is not None
    other = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    with pytest.raises(Exception, match="not of this run's checkpoint"):
        other.stage(5, "another")
    assert staged_files(sink) == []


def test_a_hand_off_records_the_files_and_an_older_hand_off_of_rows_is_continued(
        spark: SparkSession, tmp_path: Path) -> None:
    """The hand-off holds what the tasks wrote, not the rows; a hand-off an older txjoin
    left (rows) is committed in the same group as a parcel of files."""
    sink = DeltaSink(str(tmp_path / "out"), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    handoff = Handoff(tmp_path / "ckpt")
    old = Parcel(0, batch(change("c", 1, 1), change("c", 2, 2)), Lineage("ckpt", 0), 1.0)
    new = written_in_parts(sink, 1, batch(change("u", 1, 3), change("d", 2, 4)), 2,
                           random.Random(2), {1})
    assert new is not None
    handoff.store(old)
    handoff.store(new)
    loaded = [handoff.load(i) for i in handoff.stored()]
    assert loaded[1].staged == new.staged and loaded[1].changes.num_rows == 0
    assert loaded[1].commit_times_ms() == list(new.commit_ts_ms) and loaded[1].rows == 2
    assert set(sink.write_group(loaded)) == {"changelog", "current"}
    assert [r["_commit_seq"] for r in sink.read_changelog()] == [1, 2, 3, 4]
    assert sink.read_current() == [current_of(change("u", 1, 3))]
    assert staged_files(sink) == []


def test_upkeep_deletes_and_counts_staged_files_no_commit_will_take(
        spark: SparkSession, tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    committed = written_in_parts(sink, 0, batch(change("c", 1, 1)), 1, random.Random(3), set())
    assert committed is not None
    sink.write_group([committed])

    def stage(checkpoint: str, batch_id: int) -> DeltaStage:
        return DeltaStage(str(sink.root / "_staged"), checkpoint, batch_id, "orders", SCHEMA,
                          sink.stored, ("order_id",))

    # a kill between a commit and its clean-up: files of a batch the tables hold
    stage("ckpt", 0).copy(0, batch(change("c", 1, 1)))
    # a wiped checkpoint's files, long ago
    stage("wiped", 7).copy(0, batch(change("c", 3, 3)))
    long_ago = time.time() - STAGED_MAX_AGE_S - 60
    for name in staged_files(sink):
        if name.split("/")[1].startswith("wiped"):
            os.utime(sink.root / "_staged" / name, (long_ago, long_ago))
    # a pending batch: a killed run's hand-off waits for its next run
    waiting = written_in_parts(sink, 1, batch(change("c", 2, 2)), 1, random.Random(4), set())
    assert waiting is not None and len(staged_files(sink)) == 6
    upkeep = sink.maintain()[-1]
    assert (upkeep.kind, upkeep.on_disk_before, upkeep.on_disk_after) == \
        ("staged data files", 4, 0)
    assert upkeep.line().startswith(f"{sink.root / '_staged'}: 4 -> 0 staged data files")
    assert [n.split("/")[1] for n in staged_files(sink)] == \
        ["ckpt-b000000000001-p00000.parquet"] * 2
    sink.write_group([waiting])  # the waiting batch's files were kept: it commits
    assert [r["order_id"] for r in sink.read_current()] == [1, 2]
    assert [u.kind for u in sink.maintain()] == ["files", "files"]  # no orphan: no line


KILLED = """
import sys, random, time
import pyarrow as pa
from tests.spark.test_sinks import SCHEMA, batch, change
from tests.spark.test_delta_staging import written_in_parts
from txjoin.pipeline.session import get_session
from txjoin.sinks.delta import DeltaSink
spark = get_session("local[1]", app_name="killed")
sink = DeltaSink(sys.argv[1], "orders", "job", ["order_id"], SCHEMA, spark=spark)
p0 = written_in_parts(sink, 0, batch(change("c", 1, 1)), 2, random.Random(0), set())
sink.write_group([p0])
p1 = written_in_parts(sink, 1, batch(change("u", 1, 2), change("c", 2, 3)), 2,
                      random.Random(0), set())
import pickle
open(sys.argv[2], "wb").write(pickle.dumps(p1))
sink.write_group([p1])
print("survived", flush=True)
"""


def test_a_kill_with_the_files_linked_and_not_committed_commits_them_once_on_the_retry(
        spark: SparkSession, tmp_path: Path) -> None:
    """kill -9 at ``delta_published`` (batch 1's changelog files linked into the table's
    folder, not committed): readers see batch 0 only, and the group's retry (what the next
    run's recovery does with the hand-off) commits batch 1 once."""
    record = tmp_path / "fired"
    env = {**os.environ, crashpoints.CRASH_ENV: f"{crashpoints.DELTA_PUBLISHED}:1",
           crashpoints.RECORD_ENV: str(record), "PYTHONPATH": str(ROOT)}
    out, saved = tmp_path / "out", tmp_path / "parcel"
    done = subprocess.run([sys.executable, "-c", KILLED, str(out), str(saved)], env=env,
                          cwd=ROOT, capture_output=True, text=True, start_new_session=True,
                          timeout=300, check=False)
    assert done.returncode == -9 and "survived" not in done.stdout, done.stderr[-3000:]
    assert crashpoints.fired(record) == [(crashpoints.DELTA_PUBLISHED, 1)]
    sink = DeltaSink(str(out), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    assert sink.last_applied_batch() == 0
    assert [r["_commit_seq"] for r in sink.read_changelog()] == [1]
    linked = [f for f in Path(sink.changelog_path).glob("part-ckpt-b000000000001-*")]
    assert linked and len(DeltaTable(sink.changelog_path).file_uris()) == 1
    import pickle

    parcel = pickle.loads(saved.read_bytes())
    assert set(sink.write_group([parcel])) == {"changelog", "current"}
    assert [r["_commit_seq"] for r in sink.read_changelog()] == [1, 2, 3]
    assert [r["order_id"] for r in sink.read_current()] == [1, 2]
    assert sink.write_group([parcel]) == {}
    assert staged_files(sink) == []
