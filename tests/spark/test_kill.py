"""kill -9 of the Spark pipeline at each crash point and at a random moment, then a restart.

Both sinks (Delta via delta-spark, PostgreSQL) are compared with the oracle in the end;
the changelog must hold every version exactly once, and every version of both Delta
tables (read by time travel: what a reader could have read at any moment) is a state of
the oracle's. A file of its own (not
test_pipeline.py's): it is the suite's longest test, and scripts/test.sh's workers take
a file at a time, so it can start early on one worker while the other runs the scenarios.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from tests.fixtures.postgres import new_database
from tests.spark import kill_target
from txjoin.bench import spread
from txjoin.crashpoints import (
    CRASH_ENV,
    DELTA_BETWEEN_TABLES,
    DELTA_CURRENT_WRITTEN,
    DELTA_GROUP_COMMITTED,
    DELTA_PUBLISHED,
    DELTA_RECOVERED,
    DELTA_STAGED,
    FIRST_SINK,
    HANDOFF_STORE,
    OWNED,
    RECORD_ENV,
    SEQUENCED,
    SHARD_APPLY,
    SINKS_COMMITTED,
    fired,
)
from txjoin.delta_tables import read_table
from txjoin.errors import user_error
from txjoin.ingest.spark.replay import ReplaySource, write_schedule
from txjoin.job import load_job
from txjoin.join import STAGED
from txjoin.join.oracle import outputs_after_each
from txjoin.join.placement import SPLIT_ALL
from txjoin.pipeline.pipeline import BatchReport, RunConfig
from txjoin.scenarios.checks import check_exactly_once, check_final, check_prefix_consistent
from txjoin.scenarios.synthesize import Synthesizer
from txjoin.scenarios.workload import pizzeria_workload
from txjoin.sequence.spill import SPILL_ENV
from txjoin.sinks import without_metadata
from txjoin.sinks.build import build_sinks
from txjoin.sinks.delta import DeltaSink
from txjoin.sinks.handoff import Handoff
from txjoin.sinks.postgres import PostgresSink
from txjoin.verify.diff import diff_rows

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
ORDERS = ROOT / "jobs" / "orders.py"


WHOLE_TX_PER_BATCH = 2


def _kill_schedule(tmp_path: Path, n_tx: int, whole: int, partitions: int
                   ) -> tuple[Path, dict, list]:
    """Batch 0 the snapshot, then the first ``whole`` transactions two to a batch (each
    released in its batch: the crash points know what a batch does), then the rest with
    table topics over ``partitions`` partitions by key, topic-partitions interleaved at
    random, each in its order (read with any lag between partitions)."""
    job = load_job(ORDERS)
    snapshot, txs = pizzeria_workload(n_tx, seed=11)
    synth = Synthesizer(job)
    groups = [list(synth.snapshot(snapshot))]
    groups += [[r for tx in txs[i:i + WHOLE_TX_PER_BATCH] for r in synth.transaction(tx)]
               for i in range(0, whole, WHOLE_TX_PER_BATCH)]
    rest = [r for tx in txs[whole:] for r in synth.transaction(tx)]
    rows = spread([r for g in groups for r in g] + rest, partitions,
                  f"{synth.prefix}.transaction")
    chunks: list[list] = []
    for group in groups:
        chunks.append(rows[:len(group)])
        del rows[:len(group)]
    rnd = random.Random(5)
    queues: dict[tuple[str, int], list] = {}
    for row in rows:
        queues.setdefault((row[0], row[1]), []).append(row)
    while any(queues.values()):
        chunk = []
        for queue in queues.values():
            take = rnd.randint(0, 12)
            chunk += queue[:take]
            del queue[:take]
        chunks.append(chunk)
    # caught up: a topic read to its end as of the batch (in the first batches everything
    # produced so far; then the topics with no record later)
    last = {r[0]: i for i, chunk in enumerate(chunks) for r in chunk}
    batches = [(chunk, sorted(t for t, at in last.items() if at <= i or i < len(groups)))
               for i, chunk in enumerate(chunks)]
    path = tmp_path / "schedule.json"
    write_schedule(str(path), batches)
    return path, snapshot, txs


def _first_batch_with_changes(outputs: list[dict], after: int) -> int:
    """The first whole-transaction batch after ``after`` whose transactions change the output."""
    batch = after + 1
    while outputs[WHOLE_TX_PER_BATCH * batch] == outputs[WHOLE_TX_PER_BATCH * (batch - 1)]:
        batch += 1
    return batch


def _wait_for_line(proc: subprocess.Popen, log: Path, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in log.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"pipeline process exited with {proc.returncode}:\n"
                                 + log.read_text()[-3000:])
        time.sleep(0.05)
    raise AssertionError(f"no {needle!r} within {timeout}s")


def _record(log: Path) -> Path:
    """Where the crash-point hook of the run logging to ``log`` records where it fired."""
    return log.with_suffix(".fired")


def _start(cmd: list[str], log: Path, crash_at: str | None = None) -> subprocess.Popen:
    """A kill target in a process group of its own (what a crash point or the test kills),
    its output in ``log``, the crash points it reached in :func:`_record`. Its open
    transactions of more than three events spill (``SPILL_ENV``): the shards die and are
    restored with transactions on disk, one applied (``SHARD_APPLY``) among them."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", RECORD_ENV: str(_record(log)),
           SPILL_ENV: "3"}
    env.pop(CRASH_ENV, None)
    if crash_at:
        env[CRASH_ENV] = crash_at
    with log.open("w") as out:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True,
                                env=env, start_new_session=True)


def _stop(proc: subprocess.Popen, timeout: float | None) -> None:
    """Wait ``timeout`` s for the process to die (None: kill it now), then kill its group."""
    try:
        if timeout is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and Python workers
        proc.wait()


def _batches_done(lines: list[str]) -> list[tuple[int, dict[str, bool]]]:
    """(batch id, what each sink wrote) from a kill target's ``batch N done {...}`` lines."""
    done = []
    for line in lines:
        if line.startswith("batch ") and " done " in line:
            head, _, written = line.partition(" done ")
            done.append((int(head.split()[1]), json.loads(written)))
    return done


def _logged(checkpoint: Path, log: str) -> int:
    """The last batch id in the checkpoint's ``offsets`` or ``commits`` log (-1: none)."""
    return max((int(p.name) for p in (checkpoint / log).glob("[0-9]*")), default=-1)


@dataclass
class Death:
    """Where a pipeline process died: Spark's logs and what each sink held."""

    offsets: int  # last batch in the offset log (planned)
    commits: int  # last batch in the commit log (finished)
    held: dict[str, int]  # sink -> last batch it holds (Delta: its current table)
    delta_changelog: int  # the last batch the Delta changelog holds
    handed_off: list[int]  # batches handed off to Delta and not committed there yet

    @property
    def delta(self) -> int:
        """The last batch Delta holds once the next run committed what was handed off."""
        last = self.held["delta"]
        for batch in self.handed_off:  # an unbroken run after its last batch
            if batch == last + 1:
                last = batch
        return last

    @property
    def pg(self) -> int:
        return self.held["postgres"]


def _death(job: Any, work: Path, pg_dsn: str) -> Death:
    config = RunConfig(checkpoint_dir=str(work / "ckpt"), output_dir=str(work / "out"),
                       postgres_dsn=pg_dsn)
    sinks = build_sinks(job, config)
    assert isinstance(sinks[0], DeltaSink) and isinstance(sinks[1], PostgresSink)
    checkpoint = work / "ckpt" / job.name
    changelog = sinks[0]._held(sinks[0].changelog_path, "changelog")
    death = Death(_logged(checkpoint, "offsets"), _logged(checkpoint, "commits"),
                  {s.name: -1 if s.last_applied_batch() is None else s.last_applied_batch()
                   for s in sinks},
                  -1 if changelog is None else changelog.last_batch_id,
                  Handoff(checkpoint).stored())
    for sink in sinks:
        sink.close()
    return death


def _after(death: Death) -> int:
    """The batch a run started after ``death`` can die in once it finished one: the one
    after the batch it re-runs, or, when the death came between two batches (Spark had
    committed all it planned: the Delta committer's death can), the second it runs."""
    return death.offsets + (2 if death.offsets == death.commits else 1)


def _check_replay(death: Death, lines: list[str]) -> None:
    """After a restart: Spark re-ran the batch that died, and each sink wrote it only if it
    did not hold it (``BatchReport.written``); a sink never holds a batch Spark did not plan."""
    done = _batches_done(lines)
    assert done, "the restarted pipeline finished no batch:\n" + "".join(lines[-30:])
    # nothing Spark recorded as done is missing from a sink (or Delta's hand-off)
    assert death.commits <= death.pg <= death.offsets, death
    assert death.commits <= death.delta <= death.offsets, death
    if death.offsets == death.commits:  # died between batches: nothing to replay
        assert done[0][0] == death.offsets + 1, (death, done[0])
        return
    batch, written = done[0]
    assert batch == death.offsets, f"the restart began at batch {batch}, not the one that died"
    # PostgreSQL wrote it only if it did not hold it; Delta gets every batch handed off
    # again and skips, in its group commit, what it holds (checked in the end: exactly once)
    assert written == {"postgres": death.pg < batch, "delta": True}, (death, written)


def _assert_the_oracles_end_exactly_once(sink: Any, outputs: list[dict]) -> None:
    """``sink`` holds the oracle's output after the last transaction, and its changelog
    every change exactly once."""
    current = [without_metadata(r) for r in sink.read_current()]
    result = check_final(current, outputs[-1], ["order_id"])
    assert result.ok, f"{sink.name}: {result.message}"
    once = check_exactly_once(sink.read_changelog(), ["order_id"], sink.read_current(),
                              outputs)
    assert once.ok, f"{sink.name}: {once.message}"


def _versions(path: str) -> list[tuple[int, list[dict], dict[str, Any]]]:
    """Every version of the Delta table at ``path`` as a reader reading it by time travel
    gets it: (version, its rows without txjoin's columns, its commit's txjoin lineage)."""
    lineage = {c["version"]: json.loads(c["userMetadata"])
               for c in DeltaTable(path).history() if c.get("userMetadata")}
    return [(v, read_table(DeltaTable(path, version=v)).to_pylist(), lineage.get(v, {}))
            for v in range(DeltaTable(path).version() + 1)]


def _check_every_version(sink: DeltaSink, outputs: list[dict]) -> int:
    """Every version of both Delta tables is what a reader may see (DESIGN.md 1): the
    current table's equals the oracle's output after some T_k, k never decreasing, and
    after T_F where its commit says its frontier is F; the changelog's rows up to each
    version replay to the oracle's changes up to its frontier, and it only grows. The
    number of group commits of more than one batch among the current table's versions."""
    key = ["order_id"]
    current = _versions(sink.current_path)
    observed = [[without_metadata(r) for r in rows] for _, rows, _ in current]
    labels = [f"current v{v} (batches {info.get('txjoin.first_batch_id')}-"
              f"{info.get('txjoin.batch_id')})" for v, _, info in current]
    prefix = check_prefix_consistent(observed, outputs, key, labels)
    assert prefix.ok, prefix.message
    for (version, _, info), rows in zip(current, observed, strict=True):
        frontier = info.get("txjoin.frontier_commit_seq")
        if frontier is not None:
            diff = diff_rows(list(outputs[frontier].values()), rows, key)
            assert diff.ok, f"current v{version} is not T{frontier}, its frontier:\n" + \
                diff.format()
    held, frontiers = 0, list[int]()
    for version, rows, info in _versions(sink.changelog_path):
        if not info:  # the table's creation: no rows, nothing released
            assert rows == [], f"changelog v{version}, not txjoin's commit, holds rows"
            continue
        assert len(rows) >= held, f"changelog v{version} lost rows ({held} -> {len(rows)})"
        held = len(rows)
        upto = info.get("txjoin.frontier_commit_seq",
                        max((r["_commit_seq"] for r in rows), default=0))
        assert not frontiers or upto >= frontiers[-1], (version, frontiers[-1], upto)
        frontiers.append(upto)
        once = check_exactly_once(rows, key, list(outputs[upto].values()), outputs, upto=upto)
        assert once.ok, f"changelog v{version}: {once.message}"
    return sum(1 for _, _, info in current
               if info.get("txjoin.first_batch_id", info.get("txjoin.batch_id"))
               != info.get("txjoin.batch_id"))


# Where each run dies: (crash point, the micro-batch it is armed at; AFTER: the batch a run
# started after the last death dies in once it finished one; CHANGES: the first such batch
# that changes the output (a Delta group commit writes files of it); ANY: the first time it
# is reached).
AFTER, ANY, CHANGES = -1, -2, -3
STOP = "kill_test_stop"
"""The CHECK constraint that makes a Delta write fail in a live query."""


# The crash points (txjoin.crashpoints) in one checkpoint, one process each (JVM start and
# the first batch are 10-20 s of each): each run dies at its point (the hook's record says
# it fired there, not the test's kill after 300 s), the next one replays that batch first,
# each sink writing it only if it did not hold it; then a kill at a random moment (the seed
# printed), then a run to the end (in the test's own Spark session), checked against the
# source, and every version of both Delta tables a reader could have read. More shards
# than cores, the last transactions over partitioned topics read with any lag between them.
def test_kill_9_at_each_crash_point_and_restart_loses_nothing_and_applies_nothing_twice(
        spark: SparkSession, pg_dsn: str, tmp_path: Path) -> None:
    shards, partitions, n_tx, whole = 4, 3, 60, 40
    schedule, snapshot, txs = _kill_schedule(tmp_path, n_tx, whole, partitions)
    job = load_job(ORDERS)
    outputs = outputs_after_each(job, snapshot, txs)
    work = tmp_path / "work"
    handoff = Handoff(work / "ckpt" / job.name)
    cmd = [sys.executable, "-m", "tests.spark.kill_target", str(schedule), str(work), pg_dsn,
           str(ORDERS), f"--shards={shards}"]
    # The Delta committer's points come after a batch or more: it dies inside a group
    # commit while the stream is up to --delta-max-pending-batches batches further on.
    points: list[tuple[str, int]] = [
        (SINKS_COMMITTED, 2), (FIRST_SINK, 4), (HANDOFF_STORE, AFTER),
        # the tasks wrote the batch's Delta files, the driver neither committed nor
        # handed them off
        (DELTA_STAGED, AFTER),
        (DELTA_BETWEEN_TABLES, CHANGES),
        # the current table's new files written in its folder, not committed
        (DELTA_CURRENT_WRITTEN, CHANGES),
        # the next run's start commits what the committer's death left, and dies there
        (DELTA_RECOVERED, ANY),
        (DELTA_GROUP_COMMITTED, AFTER),
        # a group's changelog files linked into the table, not committed
        (DELTA_PUBLISHED, CHANGES), (SHARD_APPLY, AFTER)]
    deaths: list[Death] = []
    for run, (point, planned) in enumerate(points):
        batch = (None if planned == ANY else _after(deaths[-1]) if planned == AFTER
                 else _first_batch_with_changes(outputs, _after(deaths[-1]) - 1)
                 if planned == CHANGES else planned)
        assert batch is None or WHOLE_TX_PER_BATCH * (batch + 2) <= whole, \
            "the points need whole batches"
        log = tmp_path / f"run{run}.log"
        proc = _start(cmd, log, point if batch is None else f"{point}:{batch}")
        _stop(proc, 300)
        out = log.read_text()
        lines = out.splitlines(keepends=True)
        assert proc.returncode == -signal.SIGKILL, f"{point}: exit {proc.returncode}\n{out[-3000:]}"
        # the hook fired there (one process, or a few shards in the same batch), so the
        # kill was the crash point's, not the test's after 300 s
        where = fired(_record(log))
        assert where and {p for p, _ in where} == {point}, (point, batch, where, out[-3000:])
        if batch is not None:
            assert {b for _, b in where} == {batch}, (point, batch, where)
        death = _death(job, work, pg_dsn)
        if point == DELTA_RECOVERED:
            # died before its query started: no batch, Spark's logs as they were; the
            # recovered group committed what the hand-off held, which is still there
            before = deaths[-1]
            assert before.handed_off and where[0][1] in before.handed_off, (before, where)
            assert not _batches_done(lines), lines[-30:]
            assert (death.offsets, death.commits) == (before.offsets, before.commits), death
            assert death.handed_off == before.handed_off, (before, death)
            assert death.held["delta"] == before.handed_off[-1], (before, death)
            assert death.delta_changelog >= before.delta_changelog, (before, death)
            deaths.append(death)
            continue
        assert batch is not None
        if deaths:
            _check_replay(deaths[-1], lines)
        if point in (DELTA_BETWEEN_TABLES, DELTA_CURRENT_WRITTEN):
            # the Delta committer died inside a group commit holding the batch: its
            # changelog committed, its current table not; the stream anywhere after it
            assert death.delta_changelog >= batch > death.held["delta"], death
            assert batch in death.handed_off and death.commits >= batch - 1, (point, death)
            if point == DELTA_CURRENT_WRITTEN:
                # files in the current table's folder that no version references
                current = next((work / "out").glob("*/current"))
                live = {Path(u.removeprefix("file://")).name
                        for u in DeltaTable(str(current)).file_uris()}
                assert {f.name for f in current.glob("part-*.parquet")} - live, death
        elif point == DELTA_PUBLISHED:
            # the group's changelog files are in the table's folder, no version has them
            assert death.delta_changelog < batch and death.held["delta"] < batch, death
            assert batch in death.handed_off and death.commits >= batch - 1, (point, death)
            linked = list((work / "out").glob(f"*/changelog/part-*-b{batch:012d}-p*.parquet"))
            assert linked, list((work / "out").rglob("*.parquet"))
        elif point == DELTA_GROUP_COMMITTED:
            # both tables hold the group, whose hand-off files were not removed
            assert death.held["delta"] >= batch, death
            assert batch in death.handed_off and death.commits >= batch - 1, (point, death)
        else:
            # where it died: Spark planned the batch and did not commit it; the sinks
            assert (death.offsets, death.commits) == (batch, batch - 1), (point, death)
            if point == SINKS_COMMITTED:  # PostgreSQL committed it, Delta has it handed off
                assert (death.delta, death.pg) == (batch, batch), death
            elif point == FIRST_SINK:  # PostgreSQL committed it, not handed off yet
                assert (death.delta, death.pg) == (batch - 1, batch), death
            elif point == HANDOFF_STORE:
                # PostgreSQL committed it; its parcel written under the temporary name only
                assert (death.delta, death.pg) == (batch - 1, batch), death
                assert batch not in death.handed_off, death
                assert handoff.partial_path(batch).exists(), list(handoff.directory.iterdir())
            else:
                assert (death.delta, death.pg) == (batch - 1, batch - 1), death
            if point == DELTA_STAGED:  # the tasks' files of the batch, nothing else of it
                staged = list((work / "out").glob(f"*/_staged/*/*-b{batch:012d}-p*.parquet"))
                assert staged and batch not in death.handed_off, (death, staged)
        deaths.append(death)
    assert batch is not None

    seed = time.time_ns()
    print(f"random kill seed {seed}")
    log = tmp_path / "random.log"
    proc = _start(cmd, log)
    try:
        _wait_for_line(proc, log, f"batch {batch + 1} done", 300)
        time.sleep(random.Random(seed).uniform(0.0, 3.0))
    finally:
        _stop(proc, None)
    assert fired(_record(log)) == []  # the test's kill, no crash point's
    lines = log.read_text().splitlines(keepends=True)
    _check_replay(deaths[-1], lines)
    deaths.append(_death(job, work, pg_dsn))
    print(f"random kill landed at {deaths[-1]}")

    # The runs to the end in the test session's Spark (the same Pipeline, config and lines
    # as the kill target's; until issue 34 a seventh process): nothing kills them, so they
    # need no process of their own, and they save a JVM start and a cold first batch.
    assert os.environ.get(CRASH_ENV) is None
    spark.dataSource.register(ReplaySource)
    config = RunConfig(checkpoint_dir=str(work / "ckpt"), output_dir=str(work / "out"),
                       postgres_dsn=pg_dsn)
    delta, postgres = build_sinks(job, config)
    held = postgres.held()
    delta.close()
    postgres.close()
    assert isinstance(delta, DeltaSink) and held is not None
    # A Delta write that fails in a live query: a CHECK constraint on the current table
    # that every change PostgreSQL holds meets (so what the kill left commits at the start)
    # and the next ones break.
    spark.sql(f"ALTER TABLE delta.`{delta.current_path}` ADD CONSTRAINT {STOP} "
              f"CHECK (_commit_seq <= {held.frontier_commit_seq})")
    failing = io.StringIO()
    with contextlib.redirect_stdout(failing), pytest.raises(Exception) as failed:
        kill_target.run(spark, str(schedule), str(work), pg_dsn, str(ORDERS), shards, True,
                        kill_target.report)
    # The query stopped with Delta's error, one line as the CLI prints it (txjoin.errors);
    # PostgreSQL went on alone, and what was handed off stays for the next run.
    error = user_error(failed.value)
    assert error is not None and STOP in str(error).lower() and "\n" not in str(error), \
        repr(failed.value)[:2000]
    _check_replay(deaths[-1], failing.getvalue().splitlines(keepends=True))
    stopped = _death(job, work, pg_dsn)
    assert stopped.handed_off and stopped.held["delta"] < stopped.handed_off[0], stopped
    assert stopped.held["delta"] < stopped.pg, stopped
    deaths.append(stopped)
    spark.sql(f"ALTER TABLE delta.`{delta.current_path}` DROP CONSTRAINT {STOP}")

    # The next run commits them first, then runs to the end with its committer slowed down
    # (a group commit at most every 1.5 s, 1 batch pending at most: the third batch of a
    # run finds the hand-off full whatever the pace of its batches): the stream waits for
    # room in the hand-off and says so in its batches' reports (delta_backpressure, the
    # txjoin_stage_seconds metric).
    reports: list[BatchReport] = []

    def on_batch(report: BatchReport) -> None:
        reports.append(report)
        kill_target.report(report)

    finish = io.StringIO()
    with contextlib.redirect_stdout(finish):
        kill_target.run(spark, str(schedule), str(work), pg_dsn, str(ORDERS), shards, True,
                        on_batch, delta_commit_interval_s=1.5, delta_handoff_max_batches=1)
    _check_replay(deaths[-1], finish.getvalue().splitlines(keepends=True))
    waited = [r.breakdown.get("delta_backpressure", 0.0) for r in reports]
    assert len(reports) >= 3 and max(waited) > 0.1, waited

    sinks = build_sinks(job, config)
    for sink in sinks:
        _assert_the_oracles_end_exactly_once(sink, outputs)
        if isinstance(sink, DeltaSink):
            # the kill target's committer commits back to back, at most 2 batches pending:
            # groups of several batches, through every kill above
            assert _check_every_version(sink, outputs) > 0, "no group of several batches"
        sink.close()
    assert len(outputs[-1]) > 10


def test_kill_9_inside_the_staged_engine_loses_nothing_and_applies_nothing_twice(
        spark: SparkSession, pg_dsn: str, tmp_path: Path) -> None:
    """``--engine staged --split all`` (every looked-up table held by owner stages of two
    depths): killed after its sequencer logged a batch's releases and before any owner or
    shard applied them (``sequenced``), after an owner logged a batch and sent the shards
    their rows (``owned``), and inside a shard after it applied a released transaction
    (``shard_apply``); each restart re-runs the batch from every stage's log, and the sinks
    end with the oracle's output, every change exactly once. The sink-side points the
    engine does not change are the test above's."""
    # 2 shards: each run to its death starts a host per shard and per owner (the sequencer,
    # 2 shards, 2 owners of each of the 2 depths); and a batch is four stateful stages, so
    # the run to the end gets ten transactions after the whole ones (with 3 shards and 40
    # transactions the test took 240 s alone, 95 s before the owners)
    shards, partitions, n_tx, whole = 2, 3, 20, 10
    pg_dsn = new_database(pg_dsn, "kill_staged")  # the sinks of this test's own
    schedule, snapshot, txs = _kill_schedule(tmp_path, n_tx, whole, partitions)
    job = load_job(ORDERS)
    outputs = outputs_after_each(job, snapshot, txs)
    work = tmp_path / "work"
    cmd = [sys.executable, "-m", "tests.spark.kill_target", str(schedule), str(work), pg_dsn,
           str(ORDERS), f"--shards={shards}", f"--engine={STAGED}", f"--split={SPLIT_ALL}"]
    deaths: list[Death] = []
    for run, (point, planned) in enumerate([(SEQUENCED, 2), (OWNED, AFTER),
                                            (SHARD_APPLY, AFTER)]):
        batch = _after(deaths[-1]) if planned == AFTER else planned
        log = tmp_path / f"run{run}.log"
        proc = _start(cmd, log, f"{point}:{batch}")
        _stop(proc, 300)
        out = log.read_text()
        assert proc.returncode == -signal.SIGKILL, f"{point}: exit {proc.returncode}\n{out[-3000:]}"
        where = fired(_record(log))
        assert where and {(p, b) for p, b in where} == {(point, batch)}, (point, batch, where,
                                                                         out[-3000:])
        death = _death(job, work, pg_dsn)
        if deaths:
            _check_replay(deaths[-1], out.splitlines(keepends=True))
        # Spark planned the batch and did not commit it
        assert (death.offsets, death.commits) == (batch, batch - 1), (point, death)
        assert (death.delta, death.pg) == (batch - 1, batch - 1), death
        deaths.append(death)

    assert os.environ.get(CRASH_ENV) is None
    spark.dataSource.register(ReplaySource)
    finish = io.StringIO()
    with contextlib.redirect_stdout(finish):
        kill_target.run(spark, str(schedule), str(work), pg_dsn, str(ORDERS), shards, True,
                        kill_target.report, engine=STAGED, split=(SPLIT_ALL,))
    _check_replay(deaths[-1], finish.getvalue().splitlines(keepends=True))
    config = RunConfig(checkpoint_dir=str(work / "ckpt"), output_dir=str(work / "out"),
                       postgres_dsn=pg_dsn)
    for sink in build_sinks(job, config):
        _assert_the_oracles_end_exactly_once(sink, outputs)
        sink.close()
    assert len(outputs[-1]) > 10
