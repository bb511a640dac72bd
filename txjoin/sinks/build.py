"""A job's sinks: Delta always, PostgreSQL when a DSN is given.

``txjoin run`` writes them (Delta through Spark), ``txjoin verify`` and ``txjoin maintain``
read them (Delta with delta-rs, no Spark): this module imports no pyspark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from txjoin.job import Job
from txjoin.join.output import output_schema
from txjoin.sinks import DEFAULT_RETRY_TIMEOUT_S, Sink
from txjoin.sinks.delta import DeltaSink

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

class SinkConfig(Protocol):
    """Where a job's sinks are: what :func:`build_sinks` needs of a run's configuration
    (``pipeline.RunConfig`` has it; :class:`SinkPlaces` is just this)."""

    @property
    def output_dir(self) -> str: ...
    @property
    def postgres_dsn(self) -> str | None: ...
    @property
    def postgres_retry_timeout_s(self) -> float: ...


@dataclass(frozen=True)
class SinkPlaces:
    """The Delta tables' root and the PostgreSQL sink's DSN (None: no PostgreSQL sink)."""

    output_dir: str
    postgres_dsn: str | None = None
    postgres_retry_timeout_s: float = DEFAULT_RETRY_TIMEOUT_S


def build_sinks(job: Job, config: SinkConfig, spark: SparkSession | None = None,
                pg_table_suffix: str | None = None) -> list[Sink]:
    """Delta always (written by delta-spark through ``spark``; without it, for reading only);
    PostgreSQL when a DSN is configured (``pg_table_suffix`` keeps several runs, e.g.
    scenarios, apart in one database)."""
    schema = output_schema(job)
    keys = list(job.output.key)
    sinks: list[Sink] = [DeltaSink(config.output_dir, job.output.table, job.name, keys, schema,
                                   spark=spark)]
    if config.postgres_dsn:
        from txjoin.sinks.postgres import PostgresSink

        table, name = job.output.table, job.name
        if pg_table_suffix:
            table = f"{table[:63 - len('_changelog') - len(pg_table_suffix) - 1]}_{pg_table_suffix}"
            name = f"{name}:{pg_table_suffix}"
        sinks.append(PostgresSink(config.postgres_dsn, table, name, keys, schema,
                                  retry_timeout_s=config.postgres_retry_timeout_s))
    return sinks
