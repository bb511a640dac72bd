"""A pipeline process for the kill tests: replays a schedule into both sinks.

Usage: python -m tests.spark.kill_target SCHEDULE WORKDIR PG_DSN JOB [--shards=N] [--until-idle]
    [--engine=sharded|staged] [--split=LOOKUPS]
Without --until-idle it keeps triggering (one schedule batch per micro-batch)
until it is killed: by the test, or by a crash point (``TXJOIN_CRASH_AT``,
``txjoin.crashpoints``). After each micro-batch it prints
``batch <id> done <what each sink wrote, as JSON>`` (``BatchReport.written``).
"""

import json
import sys
from collections.abc import Callable

from pyspark.sql import SparkSession

from txjoin.ingest.spark.replay import SOURCE_NAME, ReplaySource
from txjoin.job import load_job
from txjoin.join import SHARDED
from txjoin.pipeline.pipeline import BatchReport, Pipeline, RunConfig
from txjoin.pipeline.session import get_session
from txjoin.sinks.build import build_sinks


def report(r: BatchReport) -> None:
    print(f"batch {r.batch_id}: {r.records} records, {r.changes} changes, commit_seq "
          f"{r.commit_seq}", flush=True)
    print(f"batch {r.batch_id} done {json.dumps(r.written, sort_keys=True)}", flush=True)


def run(spark: SparkSession, schedule: str, workdir: str, dsn: str, job_path: str,
        shards: int | None, until_idle: bool, on_batch: Callable[[BatchReport], None],
        delta_commit_interval_s: float = 0, engine: str = SHARDED,
        split: tuple[str, ...] = (), delta_handoff_max_batches: int = 2) -> None:
    """Replay ``schedule`` into both sinks in ``spark`` (the kill test's last runs to the
    end use the test session's own Spark: a run to the end needs no process of its own);
    ``delta_commit_interval_s`` > 0 slows the Delta committer down (a group commit at most
    that often), ``delta_handoff_max_batches`` is how far the stream runs ahead of it."""
    job = load_job(job_path)
    config = RunConfig(checkpoint_dir=f"{workdir}/ckpt", output_dir=f"{workdir}/out",
                       postgres_dsn=dsn, trigger_interval="100 milliseconds", shards=shards,
                       delta_commit_interval_s=delta_commit_interval_s, engine=engine,
                       split=split, delta_handoff_max_batches=delta_handoff_max_batches)
    # By default Delta commits back to back and the stream runs at most 2 batches ahead of
    # it (the hand-off's backpressure): a kill lands inside a group commit as often as
    # between two
    sinks = build_sinks(job, config, spark)
    pipeline = Pipeline(spark, job, config, sinks, on_batch=on_batch)
    try:
        source = spark.readStream.format(SOURCE_NAME).option("schedule", schedule).load()
        query = pipeline.start(source, available_now=until_idle)
        query.awaitTermination()  # until the schedule is read (--until-idle), or killed
    finally:
        pipeline.close()
        for sink in sinks:
            sink.close()


def main() -> None:
    schedule, workdir, dsn, job_path = sys.argv[1:5]
    until_idle = "--until-idle" in sys.argv
    shards = next((int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--shards=")), None)
    engine = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--engine=")), SHARDED)
    split = next((tuple(a.split("=", 1)[1].split(",")) for a in sys.argv
                  if a.startswith("--split=")), ())
    spark = get_session("local[2]", app_name="txjoin-kill-target")
    spark.dataSource.register(ReplaySource)
    run(spark, schedule, workdir, dsn, job_path, shards, until_idle, report, engine=engine,
        split=split)


if __name__ == "__main__":
    main()
