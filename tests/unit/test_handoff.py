"""The Delta hand-off and its group committer, without Spark (txjoin/sinks/handoff.py).

A model of the two Delta tables (changelog, current) that commits group ranges the way
``DeltaSink.write_group`` does (each table skips what its last commit's lineage covers),
driven by a model of Spark's micro-batch loop, with kills at every point of the protocol.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from txjoin import crashpoints
from txjoin.sinks.handoff import GroupCommitter, Handoff, Parcel, still_needed
from txjoin.sinks.lineage import Lineage

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.unit

CHECKPOINT = "c0ffee"
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("_op", pa.string()),
                    ("_commit_seq", pa.int64()), ("_xid", pa.int64()),
                    ("_commit_ts", pa.timestamp("us", tz="UTC"))])


class Killed(BaseException):
    """The process dies here (kill -9): nothing after it runs, memory is lost."""


def batch_table(rows: list[tuple[int, int, int]]) -> pa.Table:
    """(key, value, commit_seq) rows; value < 0 is a delete."""
    ts = datetime(2026, 1, 1, tzinfo=UTC)
    return pa.Table.from_pylist(
        [{"k": k, "v": v, "_op": "d" if v < 0 else "u", "_commit_seq": seq, "_xid": seq,
          "_commit_ts": ts} for k, v, seq in rows], schema=SCHEMA)


class ModelDelta:
    """Two tables on 'disk' (they outlive a kill), committed as DeltaSink commits them."""

    name = "delta"

    def __init__(self) -> None:
        self.changelog: list[tuple[int, int, int]] = []
        self.current: dict[int, int] = {}
        self.held = {"changelog": (None, None), "current": (None, None)}
        # Every state a reader could see, per table: after each commit.
        self.seen: dict[str, list[object]] = {"changelog": [[]], "current": [{}]}
        self.kill_between = False  # die after the changelog's commit, before the current's
        self.fail: BaseException | None = None
        self.gate: threading.Event | None = None  # a commit waits for it (a slow Delta)
        self.groups: list[list[int]] = []
        self.maintained: list[int] = []

    def thread_cpu(self) -> float:
        return time.thread_time()

    def write_group(self, parcels: Sequence[Parcel]) -> dict[str, float]:
        if self.gate is not None:
            self.gate.wait()
        if self.fail is not None:
            raise self.fail
        self.groups.append([p.batch_id for p in parcels])
        last = parcels[-1]
        seconds = {}
        todo = still_needed(parcels, *self.held["changelog"])
        rows = [r for p in todo for r in rows_of(p.changes)]
        if rows:
            self.changelog = [*self.changelog, *rows]
            self.held["changelog"] = (last.lineage.checkpoint_id, last.batch_id)
            self.seen["changelog"].append(list(self.changelog))
            seconds["changelog"] = 0.0
        if self.kill_between:
            self.kill_between = False
            raise Killed("between the changelog's commit and the current table's")
        todo = still_needed(parcels, *self.held["current"])
        if todo:
            current = dict(self.current)
            for k, v, _ in (r for p in todo for r in rows_of(p.changes)):
                if v < 0:
                    current.pop(k, None)
                else:
                    current[k] = v
            self.current = current
            self.held["current"] = (last.lineage.checkpoint_id, last.batch_id)
            self.seen["current"].append(dict(current))
            seconds["current"] = 0.0
        return seconds

    def maintain(self, retention_hours: float | None = None) -> list[object]:
        self.maintained.append(len(self.groups))
        return []


def rows_of(table: pa.Table) -> list[tuple[int, int, int]]:
    return list(zip(table.column("k").to_pylist(), table.column("v").to_pylist(),
                    table.column("_commit_seq").to_pylist(), strict=True))


def expected_after(batches: list[list[tuple[int, int, int]]], n: int
                   ) -> tuple[list[tuple[int, int, int]], dict[int, int]]:
    """The changelog and current table after the first ``n`` batches."""
    changelog = [r for b in batches[:n] for r in b]
    current: dict[int, int] = {}
    for k, v, _ in changelog:
        if v < 0:
            current.pop(k, None)
        else:
            current[k] = v
    return changelog, current


def parcel(batch_id: int, rows: list[tuple[int, int, int]]) -> Parcel:
    return Parcel(batch_id, batch_table(rows), Lineage(CHECKPOINT, batch_id), time.time())


class DyingHandoff(Handoff):
    """Dies once after a group commit, before its files are removed."""

    kill_on_remove = False

    def remove(self, batch_ids: Sequence[int]) -> None:
        if self.kill_on_remove:
            type(self).kill_on_remove = False
            raise Killed("after the Delta commit, before the hand-off files went")
        super().remove(batch_ids)


KILL_POINTS = ("before_handoff", "after_handoff", "after_spark_commit", "between_tables",
               "after_commit")

batches_strategy = st.lists(
    st.lists(st.tuples(st.integers(0, 5), st.integers(-1, 9)), max_size=4),
    min_size=1, max_size=8)


@given(batches=batches_strategy,
       flushes=st.lists(st.booleans(), min_size=8, max_size=8),
       kills=st.lists(st.tuples(st.integers(0, 7), st.sampled_from(KILL_POINTS)),
                      max_size=3))
def test_delta_holds_every_batch_once_and_readers_see_only_batch_boundaries(
        tmp_path_factory: pytest.TempPathFactory, batches: list[list[tuple[int, int]]],
        flushes: list[bool], kills: list[tuple[int, str]]) -> None:
    """Kill the driver anywhere (before/after the hand-off, after Spark's commit, between the
    two tables' commits, after a group commit): once restarted and caught up, the changelog
    holds every change exactly once in commit order, the current table the last change per
    key, and every state either table ever showed was the output after some batch, in order."""
    directory = tmp_path_factory.mktemp("checkpoint")
    seq = iter(range(1, 1000))
    numbered = [[(k, v, next(seq)) for k, v in b] for b in batches]
    delta = ModelDelta()
    spark_committed = -1  # Spark's commit log: the last batch it recorded as done
    pending_kills = list(kills)
    DyingHandoff.kill_on_remove = False

    def kill_now(batch: int, point: str) -> bool:
        if (batch, point) in pending_kills:
            pending_kills.remove((batch, point))
            return True
        return False

    for _ in range(len(kills) + 1):  # one run per kill, then one that finishes
        committer = GroupCommitter(delta, DyingHandoff(directory), interval_s=3600)
        try:
            committer.recover()  # what a killed run left, before the query starts
            for b in range(spark_committed + 1, len(numbered)):
                if kill_now(b, "before_handoff"):
                    raise Killed
                committer.put(parcel(b, numbered[b]))
                if kill_now(b, "after_handoff"):
                    raise Killed
                spark_committed = b  # foreachBatch returned: Spark records the batch
                if kill_now(b, "after_spark_commit"):
                    raise Killed
                if flushes[b] or b == len(numbered) - 1:  # the interval came (or the end)
                    delta.kill_between = kill_now(b, "between_tables")
                    DyingHandoff.kill_on_remove = kill_now(b, "after_commit")
                    committer.flush()
            break
        except Killed:
            delta.kill_between = False
            DyingHandoff.kill_on_remove = False
            continue
    else:
        committer = GroupCommitter(delta, Handoff(directory), interval_s=3600)
        committer.recover()

    changelog, current = expected_after(numbered, len(numbered))
    assert delta.changelog == changelog
    assert delta.current == current
    assert Handoff(directory).stored() == []
    boundaries = [expected_after(numbered, n) for n in range(len(numbered) + 1)]
    for table, position in (("changelog", 0), ("current", 1)):
        k = 0  # the batch boundary the last state seen was, never going back (a state can
        for state in delta.seen[table]:  # recur: a key set back to an earlier value)
            later = [n for n in range(k, len(boundaries)) if boundaries[n][position] == state]
            assert later, f"{table} showed {state}, no batch boundary at or after {k}"
            k = later[0]


def test_a_replayed_batch_is_rewritten_whole_and_committed_once(tmp_path) -> None:
    delta = ModelDelta()
    handoff = Handoff(tmp_path)
    committer = GroupCommitter(delta, handoff, interval_s=3600)
    rows = [(1, 5, 1), (2, 6, 2)]
    committer.put(parcel(0, rows))
    committer.put(parcel(0, rows))  # Spark re-ran batch 0 after a crash
    assert handoff.stored() == [0]
    assert rows_of(handoff.load(0).changes) == rows
    assert handoff.load(0).lineage == Lineage(CHECKPOINT, 0)
    committer.flush()
    committer.put(parcel(0, rows))  # and once more after Delta committed it
    committer.flush()
    assert delta.changelog == rows
    assert handoff.stored() == []
    assert not list(tmp_path.rglob("*.partial"))


def test_the_committer_groups_batches_and_waits_the_interval(tmp_path) -> None:
    delta = ModelDelta()
    commits = []
    committer = GroupCommitter(delta, Handoff(tmp_path), interval_s=0.6,
                               on_commit=commits.append)
    committer.start()
    try:
        for b in range(12):
            committer.put(parcel(b, [(b, b, b + 1)]))
            time.sleep(0.1)
        committer.flush()
    finally:
        committer.close()
    # 1.2 s of batches at one commit per 0.6 s: a few groups, not one commit per batch.
    assert 2 <= len(delta.groups) <= 4, delta.groups
    assert [b for g in delta.groups for b in g] == list(range(12))
    starts = [c.started_at for c in commits][:-1]  # the last: flush commits at once
    assert all(b - a >= 0.6 - 0.01 for a, b in itertools.pairwise(starts))
    assert sum(c.changes for c in commits) == 12
    assert all(len(c.commit_ts_ms) == c.changes for c in commits)


def test_a_full_handoff_makes_the_stream_wait_for_delta(tmp_path) -> None:
    delta = ModelDelta()
    delta.gate = threading.Event()  # Delta is slow: its first commit hangs until the gate
    committer = GroupCommitter(delta, Handoff(tmp_path), interval_s=0, max_batches=2)
    committer.start()
    try:
        committer.put(parcel(0, [(1, 1, 1)]))  # the committer takes it and hangs
        time.sleep(0.2)
        committer.put(parcel(1, [(2, 2, 2)]))  # 2 pending: 0 (in the hung commit) and 1
        third = threading.Thread(target=committer.put, args=(parcel(2, [(3, 3, 3)]),))
        third.start()
        time.sleep(0.5)
        assert third.is_alive(), "the hand-off took a batch beyond its bound"
        assert Handoff(tmp_path).stored() == [0, 1]
        delta.gate.set()
        third.join(5)
        assert not third.is_alive()
        committer.flush()
    finally:
        committer.close()
    assert delta.changelog == [(1, 1, 1), (2, 2, 2), (3, 3, 3)]


def test_a_failing_delta_commit_stops_the_stream_and_keeps_the_batches(tmp_path) -> None:
    delta = ModelDelta()
    delta.fail = RuntimeError("delta sink: disk full")
    handoff = Handoff(tmp_path)
    committer = GroupCommitter(delta, handoff, interval_s=0)
    committer.start()
    committer.put(parcel(0, [(1, 1, 1)]))
    with pytest.raises(RuntimeError, match="disk full"):
        committer.flush()
    with pytest.raises(RuntimeError, match="disk full"):
        committer.put(parcel(1, [(2, 2, 2)]))
    committer.close(flush=False)
    assert handoff.stored() == [0]  # left for the next run
    delta.fail = None
    GroupCommitter(delta, handoff).recover()
    assert delta.changelog == [(1, 1, 1)]


def test_upkeep_runs_between_group_commits(tmp_path) -> None:
    delta = ModelDelta()
    committer = GroupCommitter(delta, Handoff(tmp_path), interval_s=3600, maintain_every=3)
    for b in range(7):
        committer.put(parcel(b, [(b, b, b + 1)]))
        committer.flush()
    # After the 3rd and 6th batch's commits; never inside one.
    assert delta.maintained == [3, 6]


def test_lag_counts_batches_not_yet_in_delta(tmp_path) -> None:
    committer = GroupCommitter(ModelDelta(), Handoff(tmp_path), interval_s=3600)
    assert committer.lag() == (0, 0.0)
    committer.put(parcel(0, []))
    committer.put(parcel(1, [(1, 1, 1)]))
    batches, seconds = committer.lag()
    assert batches == 2 and seconds >= 0
    committer.flush()
    assert committer.lag() == (0, 0.0)


def test_metrics_show_each_sinks_commit_to_sink_latency_and_deltas_lag() -> None:
    from txjoin.pipeline.metrics import Metrics
    from txjoin.sinks.handoff import GroupCommit

    metrics = Metrics("orders")
    now = 1_800_000_000.0
    metrics.observe_sink(GroupCommit(0, 0, 1, 2, [int((now - 0.5) * 1000)] * 2, now - 0.1, now,
                                     sink="postgres"))
    metrics.observe_sink(GroupCommit(0, 9, 10, 3, [int((now - 12) * 1000)] * 3, now - 2, now,
                                     sink="delta"))
    metrics.delta_lag = lambda: (4, 3.5)
    lines = dict(line.rsplit(" ", 1) for line in metrics.render().splitlines()
                 if not line.startswith("#"))
    job = 'job="orders"'
    assert float(lines[f'txjoin_sink_commit_to_sink_seconds{{{job},sink="postgres",'
                       'quantile="0.99"}']) == pytest.approx(0.5, abs=0.01)
    assert float(lines[f'txjoin_sink_commit_to_sink_seconds{{{job},sink="delta",'
                       'quantile="1"}']) == pytest.approx(12, abs=0.01)
    assert lines[f"txjoin_delta_lag_batches{{{job}}}"] == "4"
    assert lines[f"txjoin_delta_lag_seconds{{{job}}}"] == "3.5"


def test_an_empty_batch_comes_back_with_a_chunk_spark_accepts(tmp_path) -> None:
    handoff = Handoff(tmp_path)
    handoff.store(parcel(0, []))
    loaded = handoff.load(0).changes
    assert loaded.num_rows == 0 and loaded.schema.remove_metadata() == SCHEMA
    # An IPC file of no rows reads back with no chunk; Spark's createDataFrame refuses that.
    assert all(column.num_chunks == 1 for column in loaded.columns)


def test_a_kill_in_the_middle_of_a_store_leaves_only_a_temporary_file(tmp_path) -> None:
    """The ``handoff_store`` crash point on the real hand-off (kill -9 by the hook, in a
    process of its own): the parcel was written and fsynced under its temporary name, not
    renamed, so it is not pending; the batch's next store replaces it."""
    code = ("import sys; from tests.unit.test_handoff import parcel; "
            "from txjoin.sinks.handoff import Handoff\n"
            "handoff = Handoff(sys.argv[1])\n"
            "handoff.store(parcel(0, [(1, 1, 1)])); handoff.store(parcel(1, [(2, 2, 2)]))\n"
            "print('survived', flush=True)\n")
    record = tmp_path / "fired"
    env = {**os.environ, crashpoints.CRASH_ENV: f"{crashpoints.HANDOFF_STORE}:1",
           crashpoints.RECORD_ENV: str(record)}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, start_new_session=True, timeout=60,
                          check=False)
    assert done.returncode == -9 and done.stdout == "", (done.returncode, done.stderr)
    assert crashpoints.fired(record) == [(crashpoints.HANDOFF_STORE, 1)]
    handoff = Handoff(tmp_path)
    assert handoff.stored() == [0] and handoff.partial_path(1).exists()
    handoff.store(parcel(1, [(2, 2, 2)]))
    assert handoff.stored() == [0, 1] and not handoff.partial_path(1).exists()
    assert handoff.load(1).changes == parcel(1, [(2, 2, 2)]).changes
