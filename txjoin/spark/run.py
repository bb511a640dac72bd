"""``txjoin run``: start the Spark session, wire the Kafka source, sinks and pipeline, wait."""

from __future__ import annotations

import threading
from collections.abc import Callable

import click
from pyspark.sql import DataFrame, SparkSession

from txjoin.job import Job
from txjoin.spark.pipeline import BatchReport, Pipeline, RunConfig, build_sinks
from txjoin.spark.session import get_session
from txjoin.spark.sources.kafka import register_kafka_source


def print_report(report: BatchReport) -> None:
    sinks = "+".join(f"{name}{'' if applied else '(replayed, skipped)'}"
                     for name, applied in report.written.items())
    click.echo(f"batch {report.batch_id}: {report.records} records, "
               f"{report.transactions_released} transactions released, {report.changes} "
               f"changes -> {sinks}; frontier commit_seq {report.commit_seq}, "
               f"{report.waiting} waiting")


def source_frame(spark: SparkSession, job: Job, config: RunConfig, pipeline: Pipeline
                 ) -> DataFrame:
    """The streaming input: ``config.source`` is ``kafka`` or ``files:DIR``."""
    from txjoin.spark.sources import files

    directory = files.parse_source(config.source)
    if directory is None:
        return pipeline.kafka_source()
    prefix = config.topic_prefix
    return files.read_stream(spark, directory, list(job.topics(prefix)),
                             transaction_topic=f"{prefix}.transaction",
                             max_events=config.max_events_per_trigger)


def run_job(job: Job, config: RunConfig, on_batch: Callable[[BatchReport], None] | None = None,
            stop: threading.Event | None = None, quiet: bool = False) -> list[BatchReport]:
    """Run the job until stopped (Ctrl-C or ``stop``), or until idle with ``until_idle``."""
    spark = get_session(config.master, app_name=f"txjoin-{job.name}",
                        extra_conf=config.spark_conf)
    register_kafka_source(spark)
    sinks = build_sinks(job, config, spark)

    def report(r: BatchReport) -> None:
        if not quiet:
            print_report(r)
        if on_batch is not None:
            on_batch(r)

    pipeline = Pipeline(spark, job, config, sinks, on_batch=report)
    query = pipeline.start(source_frame(spark, job, config, pipeline),
                           available_now=config.until_idle,
                           query_name=f"txjoin_{job.name}")
    try:
        if config.until_idle:
            query.awaitTermination()
        else:
            while query.isActive and not (stop is not None and stop.is_set()):
                query.awaitTermination(1)
    except KeyboardInterrupt:
        click.echo("stopping (the checkpoint keeps the progress; run again to resume)")
    finally:
        if query.isActive:
            query.stop()
        exc = query.exception()
        for sink in sinks:
            sink.close()
    if exc is not None:
        raise exc
    return pipeline.reports
