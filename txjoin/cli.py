"""The ``txjoin`` command line.

Options come from flags; every flag of ``run`` also reads an environment
variable ``TXJOIN_<NAME>`` (shown in ``--help``), so a deployment can configure
the job without a wrapper script. Errors a user can cause end with one line and
an exit code (0 ok, 1 a check failed, 2 a usage, configuration or data error),
never a traceback, in every command: :class:`TxjoinCommands` reports them
(``txjoin.errors.report``). ``txjoin --verbose`` shows tracebacks and Spark's
own log on the terminal.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from txjoin.errors import (
    SPARK_LOG_ENV,
    VERBOSE_ENV,
    ConfigError,
    TxjoinError,
    cli_errors,
    report,
)
from txjoin.ingest.debezium import (
    BINARY_HANDLING_MODES,
    DECIMAL_HANDLING_MODES,
    DEFAULT_TOPIC_PREFIX,
    TIME_PRECISION_MODES,
)

DEFAULT_DIR = ".txjoin"


class TxjoinCommands(click.Group):
    """The command group: any subcommand's user error becomes one line and its exit code.

    Commands living next to what they drive (``bench``, ``verify``, ``demo``, the
    stack) get the same treatment as those that use ``cli_errors`` themselves.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as exc:
            code = report(exc)
            if code is None:
                raise
            sys.exit(code)


@click.group(cls=TxjoinCommands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="txjoin")
@click.option("-v", "--verbose", is_flag=True, envvar=VERBOSE_ENV, show_envvar=True,
              help="Show tracebacks of errors and Spark's own log on the terminal "
                   "(otherwise in a log file).")
def main(verbose: bool) -> None:
    """Transaction-consistent streaming joins over Debezium change data capture, on Spark."""
    if verbose:
        # An environment variable, so Spark's Python workers and child processes see it too.
        os.environ[VERBOSE_ENV] = "1"


def _env(name: str) -> str:
    return f"TXJOIN_{name}"


@main.command()
@click.argument("job_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--bootstrap-servers", envvar=_env("BOOTSTRAP_SERVERS"), show_envvar=True,
              help="Kafka bootstrap servers. Default: the local stack's broker if `txjoin up` "
                   "is running in --dir.")
@click.option("--topic-prefix", "topic_prefix", envvar=_env("TOPIC_PREFIX"), show_envvar=True,
              multiple=True, metavar="[NAME=]PREFIX",
              help="Debezium topic.prefix: topics <prefix>.<schema>.<table> and "
                   "<prefix>.transaction. Default: shop. A job over several source databases "
                   "takes each source's prefix from its Source(prefix=...); override one with "
                   "--topic-prefix NAME=PREFIX (repeatable).")
@click.option("--starting-offsets", envvar=_env("STARTING_OFFSETS"), show_envvar=True,
              type=click.Choice(["earliest", "latest"]), default="earliest", show_default=True,
              help="Where a new checkpoint starts reading (ignored when resuming).")
@click.option("--trigger-interval", envvar=_env("TRIGGER_INTERVAL"), show_envvar=True,
              default="200 milliseconds", show_default=True,
              help="Micro-batch trigger interval: how long a change can wait for a batch to "
                   "start when the job is idle (a busy job runs its batches back to back).")
@click.option("--max-events-per-trigger", envvar=_env("MAX_EVENTS_PER_TRIGGER"),
              show_envvar=True, type=int, default=None,
              help="Cap on records per micro-batch (default: everything available).")
@click.option("--checkpoint-dir", envvar=_env("CHECKPOINT_DIR"), show_envvar=True, default=None,
              help="Spark checkpoint root; the job's checkpoint is <dir>/<job name>. "
                   "Default: <--dir>/checkpoints.")
@click.option("--output-dir", envvar=_env("OUTPUT_DIR"), show_envvar=True, default=None,
              help="Delta tables root: <dir>/<output table>/{current,changelog}. "
                   "Default: <--dir>/output.")
@click.option("--master", envvar=_env("MASTER"), show_envvar=True, default="local[*]",
              show_default=True, help="Spark master URL.")
@click.option("--postgres-dsn", envvar=_env("POSTGRES_DSN"), show_envvar=True, default=None,
              help="PostgreSQL sink DSN (libpq). Default: the local stack's sink database if "
                   "it is up; none otherwise.")
@click.option("--no-postgres", is_flag=True, help="Do not write the PostgreSQL sink.")
@click.option("--postgres-retry-timeout", envvar=_env("POSTGRES_RETRY_TIMEOUT"),
              show_envvar=True, type=float, default=60.0, show_default=True,
              help="Seconds a lost PostgreSQL sink connection is retried (with backoff) "
                   "before the job stops with an error.")
@click.option("--until-idle", is_flag=True,
              help="Stop once the input available at start is drained and every complete "
                   "transaction is written.")
@click.option("--rebuild", is_flag=True,
              help="Start a new checkpoint and re-derive every sink from the source; readers "
                   "see the old contents until the rebuilt ones replace them atomically.")
@click.option("--on-incomplete", envvar=_env("ON_INCOMPLETE"), show_envvar=True,
              type=click.Choice(["fail", "skip", "wait"]), default="fail", show_default=True,
              help="Policy for a transaction that never completes.")
@click.option("--incomplete-timeout", envvar=_env("INCOMPLETE_TIMEOUT"), show_envvar=True,
              type=float, default=300.0, show_default=True,
              help="Seconds of later source commits after which an incomplete transaction "
                   "triggers the policy.")
@click.option("--decimal-handling-mode", envvar=_env("DECIMAL_HANDLING_MODE"), show_envvar=True,
              type=click.Choice(DECIMAL_HANDLING_MODES), default=None,
              help="The connector's decimal.handling.mode, for records without a schema. "
                   "Default: the job's decimal_handling_mode, else string (as shipped in "
                   "config/debezium-postgres.properties).")
@click.option("--time-precision-mode", envvar=_env("TIME_PRECISION_MODE"), show_envvar=True,
              type=click.Choice(TIME_PRECISION_MODES), default=None,
              help="The connector's time.precision.mode, for records without a schema "
                   "(with one, the schema says each value's unit). Default: the job's "
                   "time_precision_mode, else adaptive (Debezium's default).")
@click.option("--binary-handling-mode", envvar=_env("BINARY_HANDLING_MODE"), show_envvar=True,
              type=click.Choice(BINARY_HANDLING_MODES), default=None,
              help="The connector's binary.handling.mode (how bytea values are spelled). "
                   "Default: the job's binary_handling_mode, else bytes (Debezium's default: "
                   "base64 text through the JSON converter).")
@click.option("--spark-conf", "spark_conf", multiple=True, metavar="KEY=VALUE",
              help="Extra Spark setting (repeatable), e.g. spark.executor.memory=2g.")
@click.option("--max-transaction-bytes", envvar=_env("MAX_TRANSACTION_BYTES"), show_envvar=True,
              type=click.IntRange(min=1), default=512 << 20, show_default=True,
              help="A transaction is buffered whole in a shard's memory until it is "
                   "complete; one whose routed records exceed this stops the job with an "
                   "error naming its xid and size.")
@click.option("--shards", envvar=_env("SHARDS"), show_envvar=True, type=click.IntRange(min=1),
              default=None, help="Shards the join's state and work are split into (fixed for "
                                 "a checkpoint). Default: Spark's default parallelism.")
@click.option("--maintain-every", envvar=_env("MAINTAIN_EVERY"), show_envvar=True,
              type=click.IntRange(min=1), default=None,
              help="Compact the Delta tables' small files once N micro-batches were "
                   "committed to Delta since the last time (and VACUUM them with "
                   "--vacuum-retention-hours), from the Delta committer between two group "
                   "commits, so no writer runs beside it. Default: never (`txjoin maintain` "
                   "does it while the job is stopped).")
@click.option("--delta-commit-interval", envvar=_env("DELTA_COMMIT_INTERVAL"), show_envvar=True,
              type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Seconds between the starts of two Delta commits, at least: each commits "
                   "every micro-batch handed off since the last one (one commit per table, "
                   "ending at a batch boundary), while PostgreSQL commits every batch. 0: "
                   "the next commit starts as soon as the last one finished.")
@click.option("--delta-max-pending-batches", envvar=_env("DELTA_MAX_PENDING_BATCHES"),
              show_envvar=True, type=click.IntRange(min=1), default=1000, show_default=True,
              help="Micro-batches handed off and not yet in Delta, at most; beyond that the "
                   "stream waits for Delta (backpressure).")
@click.option("--delta-max-pending-mb", envvar=_env("DELTA_MAX_PENDING_MB"), show_envvar=True,
              type=click.IntRange(min=1), default=256, show_default=True,
              help="Megabytes of handed-off changes not yet in Delta, at most; beyond that "
                   "the stream waits for Delta (backpressure).")
@click.option("--vacuum-retention-hours", envvar=_env("VACUUM_RETENTION_HOURS"),
              show_envvar=True, type=click.FloatRange(min=0), default=None,
              help="With --maintain-every: delete data files no Delta version of the last H "
                   "hours needs (time travel keeps working inside H). Default: no VACUUM.")
@click.option("--metrics-port", envvar=_env("METRICS_PORT"), show_envvar=True,
              type=click.IntRange(min=0, max=65535), default=None,
              help="Serve the job's progress at http://HOST:PORT/metrics in the Prometheus "
                   "text format (batches, records, transactions released and waiting, "
                   "frontier lag, per-stage and sink commit times). Default: off.")
@click.option("--dir", "directory", envvar=_env("DIR"), show_envvar=True, default=DEFAULT_DIR,
              show_default=True, type=click.Path(file_okay=False, path_type=Path),
              help="Local stack directory (state, logs, default checkpoints and output).")
@click.option("--source", envvar=_env("SOURCE"), show_envvar=True, default="kafka",
              show_default=True,
              help="'kafka', or 'files:DIR' for Debezium records archived in Kafka Connect's "
                   "S3/file sink layout DIR/<topic>/partition=<p>/<topic>+<p>+<offset>.json.")
@cli_errors
def run(job_file: Path, bootstrap_servers: str | None, topic_prefix: tuple[str, ...],
        starting_offsets: str, trigger_interval: str, max_events_per_trigger: int | None,
        checkpoint_dir: str | None, output_dir: str | None, master: str,
        postgres_dsn: str | None, no_postgres: bool, postgres_retry_timeout: float,
        until_idle: bool, rebuild: bool, on_incomplete: str,
        incomplete_timeout: float, decimal_handling_mode: str | None,
        time_precision_mode: str | None, binary_handling_mode: str | None,
        spark_conf: tuple[str, ...], max_transaction_bytes: int, shards: int | None,
        maintain_every: int | None, delta_commit_interval: float,
        delta_max_pending_batches: int, delta_max_pending_mb: int,
        vacuum_retention_hours: float | None,
        metrics_port: int | None, directory: Path, source: str) -> None:
    """Run JOB_FILE as a streaming query: Kafka -> transactions -> join -> Delta + PostgreSQL."""
    from txjoin.ingest.spark.files import parse_source
    from txjoin.job import load_job
    from txjoin.pipeline.pipeline import RunConfig
    from txjoin.pipeline.run import run_job

    # Spark's own output (shown with --verbose) next to the stack's logs.
    os.environ.setdefault(SPARK_LOG_ENV, str(directory / "logs" / "spark.log"))
    job = load_job(job_file)
    job = job.with_modes(decimal=decimal_handling_mode, time_precision=time_precision_mode,
                         binary=binary_handling_mode)
    plain_prefix, prefixes = parse_topic_prefixes(topic_prefix, job.source_names,
                                                  bool(job.sources))
    archive = parse_source(source)
    from_files = archive is not None
    if archive is not None and not Path(archive).is_dir():
        raise ConfigError(f"--source {source}: {archive} is not a directory; expected "
                          "<dir>/<topic>/partition=<p>/<topic>+<p>+<start offset>.json "
                          "(e.g. written by `txjoin export`)")
    if (not bootstrap_servers and not from_files) or (postgres_dsn is None and not no_postgres):
        from txjoin.stack.stack import load_stack

        stack = load_stack(directory)
        if not bootstrap_servers and not from_files:
            if stack is None:
                raise ConfigError(
                    f"no --bootstrap-servers given and no local stack is running in "
                    f"{directory}/; start one with `txjoin up --dir {directory}` or pass "
                    f"--bootstrap-servers HOST:PORT")
            bootstrap_servers = stack.bootstrap_servers
            if not job.sources:  # declared sources name their own prefixes
                plain_prefix = stack.topic_prefix
            click.echo(f"using the local stack in {directory}/: broker {bootstrap_servers}")
        if postgres_dsn is None and not no_postgres and stack is not None:
            postgres_dsn = stack.pg_dsn_sink
            click.echo("using the local stack's PostgreSQL sink database")
    config = RunConfig(
        topic_prefix=plain_prefix, topic_prefixes=prefixes, bootstrap_servers=bootstrap_servers,
        starting_offsets=starting_offsets, trigger_interval=trigger_interval,
        max_events_per_trigger=max_events_per_trigger,
        checkpoint_dir=checkpoint_dir or str(directory / "checkpoints"),
        output_dir=output_dir or str(directory / "output"), master=master,
        postgres_dsn=None if no_postgres else postgres_dsn, until_idle=until_idle,
        on_incomplete=on_incomplete, incomplete_timeout_s=incomplete_timeout,
        spark_conf=_parse_conf(spark_conf), shards=shards, source=source, rebuild=rebuild,
        max_transaction_bytes=max_transaction_bytes,
        postgres_retry_timeout_s=postgres_retry_timeout, maintain_every=maintain_every,
        vacuum_retention_hours=vacuum_retention_hours, metrics_port=metrics_port,
        delta_commit_interval_s=delta_commit_interval,
        delta_handoff_max_batches=delta_max_pending_batches,
        delta_handoff_max_bytes=delta_max_pending_mb << 20)
    if vacuum_retention_hours is not None and maintain_every is None:
        raise ConfigError("--vacuum-retention-hours runs with the job's maintenance: add "
                          "--maintain-every N (or run `txjoin maintain` while it is stopped)")
    config.prefixes(job)  # every source has a prefix, no two share one: fail before Spark
    run_job(job, config)


def parse_topic_prefixes(items: Sequence[str], sources: Sequence[str], declared: bool
                         ) -> tuple[str, dict[str, str]]:
    """``--topic-prefix`` values -> (the single source's prefix, source name -> prefix).

    A plain ``PREFIX`` is the prefix of a job without declared sources (at most
    one); ``NAME=PREFIX`` sets source NAME's (a job without declared sources has
    one source, ``default``).
    """
    plain: list[str] = []
    named: dict[str, str] = {}
    for item in items:
        name, sep, prefix = item.partition("=")
        if not sep:
            plain.append(item)
            continue
        if not name or not prefix:
            raise ConfigError(f"--topic-prefix {item!r}: expected PREFIX or NAME=PREFIX")
        if name not in sources:
            raise ConfigError(f"--topic-prefix {item!r}: the job has no source {name!r}; its "
                              f"sources: {', '.join(sources)}")
        if name in named:
            raise ConfigError(f"--topic-prefix: source {name!r} is given two prefixes "
                              f"({named[name]!r} and {prefix!r}); give one")
        named[name] = prefix
    if plain and declared:
        raise ConfigError(f"--topic-prefix {plain[0]!r}: this job reads several source "
                          f"databases ({', '.join(sources)}); give each prefix as "
                          f"--topic-prefix NAME=PREFIX, or rely on the job's Source(prefix=...)")
    if len(plain) > 1:
        raise ConfigError(f"--topic-prefix is given {len(plain)} times ({', '.join(plain)}); "
                          f"a job without declared sources reads one prefix")
    return (plain[0] if plain else DEFAULT_TOPIC_PREFIX), named


def _parse_conf(items: tuple[str, ...]) -> dict[str, str]:
    conf = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--spark-conf {item!r}: expected KEY=VALUE")
        conf[key.strip()] = value.strip()
    return conf


@main.command()
@click.argument("files", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per scenario.")
@click.option("--postgres-dsn", envvar=_env("POSTGRES_DSN"), show_envvar=True, default=None,
              help="Also write and check the PostgreSQL sink (one table per scenario).")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep checkpoints and Delta output here (default: a temporary directory, "
                   "removed at the end).")
@click.option("--keep", is_flag=True,
              help="Keep the temporary directory (its path is printed).")
@click.option("--core-only", is_flag=True,
              help="Run the transactional core without Spark (milliseconds; no sinks).")
@click.option("--master", envvar=_env("MASTER"), show_envvar=True, default="local[2]",
              show_default=True, help="Spark master URL.")
@click.option("--shards", type=click.IntRange(min=1), default=None,
              help="Shards of the join (default: Spark's default parallelism).")
def replay(files: tuple[Path, ...], as_json: bool, postgres_dsn: str | None,
           workdir: Path | None, keep: bool, core_only: bool, master: str,
           shards: int | None) -> None:
    """Replay scenario FILES through the real pipeline and check the sinks after every batch.

    Exit code 0: every check held; 1: a check failed; 2: a file is invalid.
    """
    import json as jsonlib

    from txjoin.scenarios.spec import load_scenarios

    try:
        scenarios = load_scenarios(files)
    except TxjoinError as exc:
        if as_json:
            click.echo(jsonlib.dumps({"error": str(exc), "exit_code": exc.exit_code}))
        else:
            click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(exc.exit_code)
    spark = None
    if not core_only:
        from txjoin.pipeline.session import get_session

        spark = get_session(master, app_name="txjoin-replay")
    root = workdir
    if root is None and not core_only:
        root = Path(tempfile.mkdtemp(prefix="txjoin-replay-"))
    failed = False
    try:
        for scenario in scenarios:
            if spark is None:
                from txjoin.scenarios.core_runner import run_scenario_core

                result = run_scenario_core(scenario)
            else:
                from txjoin.scenarios.spark_runner import run_scenario_spark

                assert root is not None
                result = run_scenario_spark(spark, scenario, str(root / scenario.name),
                                            postgres_dsn=postgres_dsn, shards=shards)
            failed = failed or not result.passed
            if as_json:
                click.echo(jsonlib.dumps(result.to_json()))
            else:
                click.secho(result.line(), fg="green" if result.passed else "red")
                if result.failures:
                    click.echo("  " + result.failures[0].replace("\n", "\n  "))
    finally:
        if root is not None and workdir is None:
            if keep:
                click.echo(f"kept checkpoints and output in {root}", err=as_json)
            else:
                shutil.rmtree(root, ignore_errors=True)
    sys.exit(1 if failed else 0)


@main.command()
@click.argument("job_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--output-dir", envvar=_env("OUTPUT_DIR"), show_envvar=True, default=None,
              help="Delta tables root, as given to `txjoin run`. Default: <--dir>/output.")
@click.option("--retention-hours", type=click.FloatRange(min=0), default=None,
              help="Also VACUUM: delete data files no version of the last H hours needs "
                   "(time travel keeps working inside H). Default: compact only.")
@click.option("--master", envvar=_env("MASTER"), show_envvar=True, default="local[*]",
              show_default=True, help="Spark master URL.")
@click.option("--dir", "directory", envvar=_env("DIR"), show_envvar=True, default=DEFAULT_DIR,
              show_default=True, type=click.Path(file_okay=False, path_type=Path),
              help="Local stack directory (its default output).")
@cli_errors
def maintain(job_file: Path, output_dir: str | None, retention_hours: float | None,
             master: str, directory: Path) -> None:
    """Compact JOB_FILE's Delta tables (and VACUUM with --retention-hours).

    Compaction commits no row change: readers see the same state, earlier versions stay
    readable. Run it while the job is stopped (a running job compacts itself with
    `txjoin run --maintain-every N`): Delta would let one of two concurrent writers fail.
    """
    from txjoin.job import load_job
    from txjoin.pipeline.pipeline import RunConfig, build_sinks
    from txjoin.pipeline.session import get_session

    os.environ.setdefault(SPARK_LOG_ENV, str(directory / "logs" / "spark.log"))
    job = load_job(job_file)
    root = Path(output_dir or directory / "output")
    if not (root / job.output.table / "current" / "_delta_log").is_dir():
        raise ConfigError(f"no Delta table of job {job.name!r} at {root / job.output.table}: "
                          f"has it run with --output-dir {root}?")
    spark = get_session(master, app_name="txjoin-maintain")
    sinks = build_sinks(job, RunConfig(output_dir=str(root), master=master), spark)
    for sink in sinks:
        for upkeep in sink.maintain(retention_hours):
            click.echo(upkeep.line())


@main.group("job")
def job_group() -> None:
    """Write job files."""


@job_group.command("init")
@click.option("--dsn", required=True, envvar=_env("SOURCE_DSN"), show_envvar=True,
              help="The source database (libpq DSN) whose catalog describes the tables.")
@click.option("--tables", required=True, metavar="A,B,C",
              help="Comma-separated tables to capture (schema.table; bare names use the "
                   "search_path).")
@click.option("--fact", default=None,
              help="The driving table (default: the one whose foreign keys reach most others).")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the job file here (refuses to overwrite); default: print it.")
def job_init(dsn: str, tables: str, fact: str | None, out: Path | None) -> None:
    """Write a job file from the catalog: tables, keys, lookups from foreign keys, an output."""
    from txjoin.catalog import init_job

    if out is not None and out.exists():
        raise ConfigError(f"{out} exists; choose another --out or remove it")
    text = init_job(dsn, [t.strip() for t in tables.split(",") if t.strip()], fact)
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text)
        click.echo(f"wrote {out}: edit its Output as you need, then txjoin run {out}",
                   err=True)


def _register_commands() -> None:
    """Commands that live next to what they drive: bench, the local stack, verify, demo, soak."""
    from txjoin.bench import bench
    from txjoin.stack.commands import down, generate, status, up
    from txjoin.stack.demo import demo
    from txjoin.stack.export import export
    from txjoin.stack.soak import soak
    from txjoin.stack.verify import verify

    for cmd in (bench, up, down, status, generate, verify, demo, export, soak):
        main.add_command(cmd)


_register_commands()

if __name__ == "__main__":
    main()
