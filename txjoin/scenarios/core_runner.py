"""Run a scenario through the transactional core directly (no Spark), then check it.

The same schedule the Spark harness replays is fed to
:class:`~txjoin.join.engine.Engine` batch by batch. The "sink" is a dict of
current rows plus a changelog, both built only from the emitted
:class:`~txjoin.join.temporal.OutputChange` s, the way a sink would build them. A
``restart`` serialises the engine (:meth:`Engine.state_bytes`) and continues
with a fresh one restored from those bytes, as a new process would from its
checkpoint; the sink contents are kept. Milliseconds per scenario, so every
scenario file also runs as a unit test.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

from txjoin.errors import TxjoinError
from txjoin.job import Job
from txjoin.join.engine import Engine
from txjoin.join.output import key_row
from txjoin.join.temporal import OutputChange
from txjoin.scenarios.checks import RunObservation, ScenarioReport, check_scenario
from txjoin.scenarios.schedule import ReplayBatch, Restart, Schedule, compile_schedule
from txjoin.scenarios.spec import Scenario, load_scenario

__all__ = ["ScenarioReport", "observe_core", "run_scenario_core", "run_scenario_file_core"]

Row = dict[str, Any]


def changelog_row(job: Job, change: OutputChange) -> Row:
    """An output change as a changelog row: output columns plus ``_op``, ``_commit_seq``,
    ``_xid``, ``_commit_ts``. A delete carries the key columns only."""
    if change.row is not None:
        row: Row = dict(change.row)
    else:
        row = key_row(job, change.key)
        row.update(dict.fromkeys(job.output.columns))
    ts = None if change.commit_ts_ms is None else (
        dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=change.commit_ts_ms))
    row.update({"_op": change.op, "_commit_seq": change.commit_seq, "_xid": change.xid,
                "_commit_ts": ts})
    if job.sources:
        row["_source"] = change.source
    return row


def observe_batch(seen: RunObservation, job: Job, current: dict[Any, Row],
                  changes: list[OutputChange]) -> None:
    """Record one batch's ``changes``: its changelog rows, and the output after it
    (``current``, the output by key, is updated in place)."""
    for change in changes:
        seen.changelog.append(changelog_row(job, change))
        if change.row is None:
            current.pop(change.key, None)
        else:
            current[change.key] = dict(change.row)
    seen.outputs.append([dict(r) for r in current.values()])


def observe_core(scenario: Scenario, schedule: Schedule) -> RunObservation:
    """Replay ``schedule`` through the engine; the output after every batch and the changelog."""
    job = scenario.job
    engine = Engine(job)
    current: dict[Any, Row] = {}
    seen = RunObservation(outputs=[], changelog=[], released=[])
    assert seen.released is not None
    for step in schedule.steps:
        if isinstance(step, Restart):
            engine = Engine.from_state(job, engine.state_bytes(), engine.policy)
            continue
        assert isinstance(step, ReplayBatch)
        records = [(r.topic, 0, r.offset, r.value) for r in step.records]
        try:
            changes = engine.process(records, caught_up=schedule.caught_up_tables(step))
        except TxjoinError as exc:
            seen.error = f"{type(exc).__name__}: {exc}"
            break
        observe_batch(seen, job, current, changes)
        seq = engine.commit_seq
        seen.released.append(seq if seq > 0 else (0 if engine.snapshot_released else None))
    return seen


def run_scenario_core(scenario: Scenario) -> ScenarioReport:
    """Compile, run through the core and check one scenario."""
    start = time.perf_counter()
    schedule = compile_schedule(scenario)
    seen = observe_core(scenario, schedule)
    failures = check_scenario(scenario, schedule, seen)
    return ScenarioReport(name=scenario.name, passed=not failures,
                          batches=len(seen.outputs), seconds=time.perf_counter() - start,
                          failures=failures, path=str(scenario.path), runner="core")


def run_scenario_file_core(path: str | Path) -> ScenarioReport:
    """:func:`load_scenario` then :func:`run_scenario_core`."""
    return run_scenario_core(load_scenario(path))
