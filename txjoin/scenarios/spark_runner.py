"""Run a scenario through the real Spark pipeline (``txjoin replay``) and check the sinks.

The schedule's batches are written for the ``txjoin_replay`` source, which
delivers exactly one of them per micro-batch, into the same pipeline
``txjoin run`` uses (stateful core, Delta sink, and the PostgreSQL sink when a
DSN is given). After every micro-batch the harness has the Delta committer
commit what was handed off (so each Delta commit is checked as a reader would
see it), then reads back what each sink holds. A ``restart`` stops the query
and starts a new one on the same checkpoint, with new sink objects (sink
contents kept), as a new process would. Every sink's observations are checked
separately against the scenario.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
import weakref
from pathlib import Path

from pyspark.sql import SparkSession

from txjoin.errors import TxjoinError, from_worker
from txjoin.ingest.spark.replay import SOURCE_NAME, ReplaySource, write_schedule
from txjoin.join import SHARDED
from txjoin.pipeline.pipeline import BatchReport, Pipeline, RunConfig
from txjoin.scenarios.checks import RunObservation, ScenarioReport, check_scenario
from txjoin.scenarios.schedule import ReplayBatch, Restart, compile_schedule
from txjoin.scenarios.spec import Scenario
from txjoin.sinks import Sink, without_metadata
from txjoin.sinks.build import build_sinks


def run_scenario_spark(spark: SparkSession, scenario: Scenario, workdir: str | None = None,
                       postgres_dsn: str | None = None, shards: int | None = None,
                       delta: bool = True, engine: str = SHARDED,
                       split: tuple[str, ...] = ()) -> ScenarioReport:
    """Replay one scenario through Spark; check every sink after every batch.

    Checkpoints and Delta output go to ``workdir``, or to a temporary directory
    removed at the end. ``shards``: how many shards the join runs in (default:
    Spark's default parallelism). ``delta=False`` leaves the Delta sink out (it needs
    ``postgres_dsn`` then): for checking the shards with the quicker sink only.
    ``engine``: ``txjoin run --engine``; ``split``: its ``--split``.
    """
    if not delta and not postgres_dsn:
        raise ValueError("without the Delta sink a scenario needs the PostgreSQL sink")
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix=f"txjoin-replay-{scenario.name}-",
                                         ignore_cleanup_errors=True) as temporary:
            return run_scenario_spark(spark, scenario, temporary, postgres_dsn, shards, delta,
                                      engine, split)
    started = time.perf_counter()
    schedule = compile_schedule(scenario)
    job = scenario.job
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    batches = [s for s in schedule.steps if isinstance(s, ReplayBatch)]
    write_schedule(str(work / "schedule.json"),
                   [(b.source_rows(), sorted(b.caught_up)) for b in batches])
    ends: list[int] = []  # cumulative batch count at each restart and at the end
    count = 0
    for step in schedule.steps:
        if isinstance(step, Restart):
            ends.append(count)
        else:
            count += 1
    ends.append(count)

    # Scenarios share one sink database: a short, stable suffix per scenario.
    pg_schema = "s" + hashlib.sha1(scenario.name.encode()).hexdigest()[:8]
    config = RunConfig(topic_prefix=scenario.topic_prefix,
                       topic_prefixes=dict(scenario.prefixes) if scenario.multi_source else {},
                       checkpoint_dir=str(work / "checkpoints"), output_dir=str(work / "output"),
                       postgres_dsn=postgres_dsn, shards=shards, engine=engine, split=split)
    _register_once(spark)
    seen: dict[str, RunObservation] = {}
    error: str | None = None
    sinks: list[Sink] = []
    for until in ends:
        sinks = [s for s in build_sinks(job, config, spark, pg_table_suffix=pg_schema)
                 if delta or s.name != "delta"]
        for sink in sinks:
            seen.setdefault(sink.name, RunObservation(outputs=[], changelog=[], released=[]))

        pipelines: list[Pipeline] = []

        def observe(report: BatchReport, sinks: list[Sink] = sinks,
                    pipelines: list[Pipeline] = pipelines) -> None:
            pipelines[0].flush()  # the Delta committer catches up: a check point
            released = report.commit_seq if report.commit_seq > 0 else (
                0 if report.snapshot_released else None)
            for sink in sinks:
                obs = seen[sink.name]
                obs.outputs.append([without_metadata(r) for r in sink.read_current()])
                assert obs.released is not None
                obs.released.append(released)

        pipeline = Pipeline(spark, job, config, sinks, on_batch=observe)
        pipelines.append(pipeline)
        source = (spark.readStream.format(SOURCE_NAME)
                  .option("schedule", str(work / "schedule.json"))
                  .option("until", str(until)).load())
        query = pipeline.start(source, available_now=True)
        try:
            query.awaitTermination()
        except Exception as exc:  # the query failed: report it as the scenario's failure
            error = _message(exc)
        finally:
            pipeline.close()
        if error is not None:
            break
        if until < ends[-1]:
            for sink in sinks:
                sink.close()
    failures: list[str] = []
    for name, obs in seen.items():
        owner = next((s for s in sinks if s.name == name), None)
        obs.changelog = owner.read_changelog() if owner is not None else []
        obs.error = error
        failures.extend(f"[{name} sink] {f}" for f in check_scenario(scenario, schedule, obs))
    for sink in sinks:
        sink.close()
    outputs = next(iter(seen.values())).outputs if seen else []
    return ScenarioReport(name=scenario.name, passed=not failures, batches=len(outputs),
                          seconds=time.perf_counter() - started, failures=failures,
                          path=str(scenario.path), runner="spark")


_REGISTERED: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def _register_once(spark: SparkSession) -> None:
    """Register the replay source once per session (again, Spark warns that it replaced it)."""
    if spark not in _REGISTERED:
        spark.dataSource.register(ReplaySource)
        _REGISTERED.add(spark)


def _message(exc: BaseException) -> str:
    recovered = exc if isinstance(exc, TxjoinError) else from_worker(exc)
    if recovered is not None:
        return f"{type(recovered).__name__}: {recovered}"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
