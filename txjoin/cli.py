"""The ``txjoin`` command line.

Options come from flags; every flag of ``run`` also reads an environment
variable ``TXJOIN_<NAME>`` (shown in ``--help``), so a deployment can configure
the job without a wrapper script. Errors a user can cause end with one line and
an exit code (0 ok, 1 a check failed, 2 a usage, configuration or data error),
never a traceback, in every command: :class:`TxjoinCommands` reports them
(``txjoin.errors.report``). ``txjoin --verbose`` shows tracebacks and Spark's
own log on the terminal.

The one module that bridges the job's code and the tooling (tests/unit/test_layout.py):
it registers the tools' commands (the local stack, bench, demo, soak) beside the job's,
and the job's commands default to a running local stack's broker and databases.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from txjoin.errors import (
    SPARK_LOG_ENV,
    VERBOSE_ENV,
    ConfigError,
    TxjoinError,
    cli_errors,
    report,
)
from txjoin.export import DEFAULT_RECORDS_PER_FILE
from txjoin.ingest.debezium import (
    BINARY_HANDLING_MODES,
    DECIMAL_HANDLING_MODES,
    DEFAULT_TOPIC_PREFIX,
    TIME_PRECISION_MODES,
)
from txjoin.ingest.spark import DEFAULT_MAX_EVENTS_PER_TRIGGER
from txjoin.join import ENGINES, SHARDED
from txjoin.join.placement import parse_split
from txjoin.package import COMPRESS_LEVEL, DEFAULT_ARCHIVE

if TYPE_CHECKING:
    from txjoin.job import Job, Table
    from txjoin.stack.stack import StackInfo

DEFAULT_DIR = ".txjoin"


class TxjoinCommands(click.Group):
    """The command group: any subcommand's user error becomes one line and its exit code.

    Commands living next to what they drive (``bench``, ``demo``, ``soak``, the
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

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """``txjoin --help`` lists the commands in sections: the job, the local stack, the
        tools (a command in none of them is listed under "Other commands")."""
        # As click's own listing: the help cut to the width left beside the longest name.
        width = formatter.width - 6 - max(len(name) for name in self.commands)
        listed: set[str] = set()
        for title, names in (*COMMAND_SECTIONS, ("Other commands", tuple(self.commands))):
            rows = []
            for name in names:
                cmd = self.get_command(ctx, name)
                if cmd is None or cmd.hidden or name in listed:
                    continue
                listed.add(name)
                rows.append((name, cmd.get_short_help_str(limit=width)))
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


COMMAND_SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("The job", ("job", "run", "submit-line", "package", "verify", "maintain", "export")),
    ("The local stack", ("up", "status", "generate", "demo", "down")),
    ("Tools", ("replay", "bench", "soak")),
)
"""How ``txjoin --help`` groups the commands (docs/reference/cli.md lists them all)."""


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
                   "<prefix>.transaction. Default: the local stack's prefix when the run "
                   "uses it (a `txjoin up --job` stack's is named after the job), else shop. "
                   "A job over several source databases "
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
              show_envvar=True, type=click.IntRange(min=0),
              default=DEFAULT_MAX_EVENTS_PER_TRIGGER, show_default=True,
              help="Cap on records per micro-batch (0: everything available in each batch). "
                   "Spark shares it among partitions by backlog; a new checkpoint reads the "
                   "topics with at most this many records, beside larger ones, through a "
                   "second source with the same cap, so a small table's snapshot is not read "
                   "a record a batch (docs/production.md).")
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
              type=click.IntRange(min=1), default=None,
              help="Stop the job, naming the xid and its size, when a transaction's routed "
                   "records buffered in one shard exceed this many bytes. Default: no "
                   "limit (an open transaction's events past 4,096 wait on the worker's "
                   "local disk, not in its memory).")
@click.option("--shards", envvar=_env("SHARDS"), show_envvar=True, type=click.IntRange(min=1),
              default=None, help="Shards the join's state and work are split into (fixed for "
                                 "a checkpoint). Default: Spark's default parallelism.")
@click.option("--engine", envvar=_env("ENGINE"), show_envvar=True,
              type=click.Choice(ENGINES), default=SHARDED, show_default=True,
              help="sharded: every shard assembles and orders every transaction; staged: "
                   "one sequencer stage orders them from every record's metadata, then each "
                   "shard applies only the rows it holds (fixed for a checkpoint).")
@click.option("--split", envvar=_env("SPLIT"), show_envvar=True, default="",
              metavar="LOOKUPS",
              help="With --engine staged: the looked-up tables split by key, as lookup "
                   "aliases (comma-separated) or 'all' of those that can be; a split table's "
                   "rows are held once, by an owner stage, and a shard gets the rows its "
                   "facts read, instead of a copy of the table (fixed for a checkpoint). "
                   "Default: none (each looked-up table copied to every shard).")
@click.option("--maintain-every", envvar=_env("MAINTAIN_EVERY"), show_envvar=True,
              type=click.IntRange(min=1), default=None,
              help="Compact the Delta changelog's small files once N micro-batches were "
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
        engine: str, split: str,
        maintain_every: int | None, delta_commit_interval: float,
        delta_max_pending_batches: int, delta_max_pending_mb: int,
        vacuum_retention_hours: float | None,
        metrics_port: int | None, directory: Path, source: str) -> None:
    """Run JOB_FILE as a streaming query: Kafka -> transactions -> join -> Delta + PostgreSQL.

    It runs until stopped: Ctrl-C ends it after the batch in progress commits (exit 0; a
    second Ctrl-C stops at once, and the next run replays that batch). With --until-idle it
    ends by itself once the input available at start is written."""
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
        from txjoin.stack.stack import load_stack, start_hint

        stack = load_stack(directory)
        if not bootstrap_servers and not from_files:
            if stack is None:
                raise ConfigError(
                    f"no --bootstrap-servers given and no local stack is running in "
                    f"{directory}/; {start_hint(directory)}, or pass "
                    f"--bootstrap-servers HOST:PORT")
            bootstrap_servers = stack.bootstrap_servers
            if not job.sources and not topic_prefix:  # declared sources name their own
                plain_prefix = stack.topic_prefix
            click.echo(f"using the local stack in {directory}/: broker {bootstrap_servers}")
            check_stack_columns(stack, job)
        if postgres_dsn is None and not no_postgres and stack is not None:
            postgres_dsn = stack.pg_dsn_sink
            click.echo("using the local stack's PostgreSQL sink database")
    config = RunConfig(
        topic_prefix=plain_prefix, topic_prefixes=prefixes, bootstrap_servers=bootstrap_servers,
        starting_offsets=starting_offsets, trigger_interval=trigger_interval,
        max_events_per_trigger=max_events_per_trigger or None,
        checkpoint_dir=checkpoint_dir or str(directory / "checkpoints"),
        output_dir=output_dir or str(directory / "output"), master=master,
        postgres_dsn=None if no_postgres else postgres_dsn, until_idle=until_idle,
        on_incomplete=on_incomplete, incomplete_timeout_s=incomplete_timeout,
        spark_conf=_parse_conf(spark_conf), shards=shards, engine=engine,
        split=parse_split(split), source=source,
        rebuild=rebuild,
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
    submitted = click.get_current_context().find_root().obj  # txjoin.submit's, or None
    if submitted is not None:  # under spark-submit: its master, deploy mode and session
        if spark_conf:
            raise ConfigError("--spark-conf: under spark-submit the session is spark-submit's; "
                              "give Spark settings to spark-submit (--conf KEY=VALUE)")
        config.master = submitted.master
        run_job(job, config, deploy_mode=submitted.deploy_mode, session=submitted.session)
        return
    run_job(job, config)


_MASTER_HELP = ("The cluster's master: a standalone master's URL (spark://HOST:PORT), yarn, "
                "or k8s://HOST:PORT (these two with --archive).")
_PYTHON_HELP = ("The driver's interpreter on a standalone master, of an environment with "
                "txjoin at the same path on every worker (and the executors' too without "
                "--archive).")


def _submit_words(master: str, python: str, spark_submit: str, job_file: Path,
                  run_args: tuple[str, ...], archive: str | None, command: str) -> list[str]:
    """``txjoin run``'s options checked as the submitted run would, then the line."""
    from txjoin.api import resolve_paths
    from txjoin.pipeline.pipeline import RunConfig
    from txjoin.submit import submit_line as line

    with run.make_context("txjoin run", [str(job_file), *run_args]) as ctx:
        params = ctx.params
    if ctx.get_parameter_source("master") is not click.core.ParameterSource.DEFAULT:
        raise ConfigError(f"{command}: --master is spark-submit's (give it before JOB_FILE), "
                          f"not one of the run's options")
    for name in ("checkpoint_dir", "output_dir"):
        if params[name] is None:
            raise ConfigError(f"{command}: give --{name.replace('_', '-')} (an absolute "
                              f"path every node reaches): the default is under --dir, "
                              f"relative to the driver's working directory")
    resolve_paths(RunConfig(checkpoint_dir=params["checkpoint_dir"],
                            output_dir=params["output_dir"]), "cluster")
    return line(master, str(job_file), list(run_args), python, spark_submit, archive)


@main.command("submit-line", context_settings={"ignore_unknown_options": True,
                                               "allow_interspersed_args": False})
@click.option("--master", required=True, help=_MASTER_HELP)
@click.option("--python", "python", default=sys.executable, show_default="this txjoin's",
              help=_PYTHON_HELP)
@click.option("--archive", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The environment archive `txjoin package` built: the executors (and on "
                   "YARN or Kubernetes the driver) run its interpreter.")
@click.option("--spark-submit", "spark_submit", default="spark-submit", show_default=True,
              help="The spark-submit to name (e.g. $SPARK_HOME/bin/spark-submit).")
@click.argument("job_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("run_args", nargs=-1, type=click.UNPROCESSED)
@cli_errors
def submit_line(master: str, python: str, archive: str | None, spark_submit: str,
                job_file: Path, run_args: tuple[str, ...]) -> None:
    """Print the spark-submit command that runs JOB_FILE in cluster mode: on a standalone
    master its driver restarted by the master if it dies (--supervise).

    RUN_ARGS are `txjoin run`'s options (checked here), without --master; --checkpoint-dir
    and --output-dir are required, as absolute paths every node reaches (a restarted
    driver resumes from them). spark-submit refuses a Python application in cluster mode
    on a standalone master, so the line submits txjoin's JVM launcher (jvm/submit), which
    starts txjoin/submit.py through Spark's PythonRunner. On YARN or Kubernetes the line
    submits txjoin/submit.py itself, with the job file (--files) and --archive."""
    import shlex

    click.echo(shlex.join(_submit_words(master, python, spark_submit, job_file, run_args,
                                        archive, "submit-line")))


@main.command("package", context_settings={"ignore_unknown_options": True,
                                           "allow_interspersed_args": False})
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              default=str(DEFAULT_ARCHIVE), show_default=True,
              help="Where to write the environment archive.")
@click.option("--python-prefix", default=None,
              help="Where the Python the archive's bin/python links to is on the cluster's "
                   "nodes (default: where it is here; a CPython of this minor version).")
@click.option("--compress-level", type=click.IntRange(0, 9), default=COMPRESS_LEVEL,
              show_default=True,
              help="gzip level of the archive: 0 stores it uncompressed (~480 MiB against "
                   "~172, each executor's unpack without inflating it), for a fast "
                   "network.")
@click.option("--master", default=None,
              help=_MASTER_HELP + " With JOB_FILE: print the spark-submit line.")
@click.option("--python", "python", default=sys.executable, show_default="this txjoin's",
              help=_PYTHON_HELP)
@click.option("--spark-submit", "spark_submit", default="spark-submit", show_default=True,
              help="The spark-submit to name (e.g. $SPARK_HOME/bin/spark-submit).")
@click.argument("job_file", required=False,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("run_args", nargs=-1, type=click.UNPROCESSED)
@cli_errors
def package(out: Path, python_prefix: str | None, compress_level: int, master: str | None,
            python: str, spark_submit: str, job_file: Path | None,
            run_args: tuple[str, ...]) -> None:
    """Build txjoin's environment archive for a cluster (--out), and with --master and
    JOB_FILE print the spark-submit line that ships it (as `txjoin submit-line --archive`).

    The archive holds txjoin's wheel, built from this checkout, and its dependencies at the
    versions installed here (pyspark's Python modules without its jars, the JVM being the
    cluster's); venv-pack2 packs it. spark-submit unpacks it as ./env in each executor's working
    directory (--archives ARCHIVE#env, spark.pyspark.python=./env/bin/python).
    Progress goes to stderr, the line alone to stdout."""
    import shlex

    from txjoin.package import build_archive

    if (master is None) != (job_file is None):
        raise ConfigError("package: give both --master and JOB_FILE to print the "
                          "spark-submit line, or neither to build the archive only")
    # The line is made (and the run's options checked) before minutes of building; its
    # archive path is the one build_archive resolves and writes.
    words = None
    if job_file is not None and master is not None:
        words = _submit_words(master, python, spark_submit, job_file, run_args,
                              str(out.resolve()), "package")
    build_archive(out, python_prefix, compress_level=compress_level)
    if words is not None:
        click.echo(shlex.join(words))


def check_stack_columns(stack: StackInfo, job: Job) -> None:
    """The job's tables and columns against the local stack's source database(s), before
    anything starts (``catalog.check_declared_columns``)."""
    from txjoin.catalog import check_declared_columns

    by_dsn: dict[str, list[Table]] = {}
    for table in job.tables:
        if stack.sources:
            names = [s.name for s in stack.sources]
            name = table.source if table.source is not None else (
                names[0] if len(names) == 1 else None)
            source = next((s for s in stack.sources if s.name == name), None)
            if source is None or table.name not in source.tables:
                continue
            dsn = source.dsn
        elif table.name in stack.tables:
            dsn = stack.pg_dsn_source
        else:
            continue
        by_dsn.setdefault(dsn, []).append(table)
    for dsn, tables in by_dsn.items():
        check_declared_columns(dsn, tables, job.source_file)


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
@click.option("--engine", type=click.Choice(ENGINES), default=SHARDED, show_default=True,
              help="The partitioned engine (txjoin run --engine).")
@click.option("--split", default="", metavar="LOOKUPS",
              help="With --engine staged: the looked-up tables split by key (txjoin run "
                   "--split; 'all': each scenario's lookups that can be).")
def replay(files: tuple[Path, ...], as_json: bool, postgres_dsn: str | None,
           workdir: Path | None, keep: bool, core_only: bool, master: str,
           shards: int | None, engine: str, split: str) -> None:
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
                                            postgres_dsn=postgres_dsn, shards=shards,
                                            engine=engine, split=parse_split(split))
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
@click.option("--postgres-dsn", envvar=_env("POSTGRES_DSN"), show_envvar=True, default=None,
              help="PostgreSQL sink DSN (libpq): also drop the staging tables killed runs left "
                   "there. Default: the local stack's sink database if it is up; none "
                   "otherwise.")
@cli_errors
def maintain(job_file: Path, output_dir: str | None, retention_hours: float | None,
             master: str, directory: Path, postgres_dsn: str | None) -> None:
    """Compact JOB_FILE's Delta changelogs (and VACUUM both tables with --retention-hours);
    the current tables' commits keep them in clustered files of their own. Drop the
    PostgreSQL sink's staging tables that killed runs left.

    Compaction commits no row change: readers see the same state, earlier versions stay
    readable. Run it while the job is stopped (a running job compacts itself with
    `txjoin run --maintain-every N`): Delta would let one of two concurrent writers fail,
    and a running job's batch being staged would lose its staging table (the job stops
    and its next run re-runs the batch).
    """
    from txjoin.job import load_job
    from txjoin.pipeline.pipeline import RunConfig
    from txjoin.pipeline.session import get_session
    from txjoin.sinks.build import build_sinks

    os.environ.setdefault(SPARK_LOG_ENV, str(directory / "logs" / "spark.log"))
    job = load_job(job_file)
    root = Path(output_dir or directory / "output")
    if not (root / job.output.table / "current" / "_delta_log").is_dir():
        raise ConfigError(f"no Delta table of job {job.name!r} at {root / job.output.table}: "
                          f"has it run with --output-dir {root}?")
    if postgres_dsn is None:
        from txjoin.stack.stack import load_stack

        stack = load_stack(directory)
        if stack is not None:
            postgres_dsn = stack.pg_dsn_sink
            click.echo("using the local stack's PostgreSQL sink database")
    spark = get_session(master, app_name="txjoin-maintain")
    sinks = build_sinks(job, RunConfig(output_dir=str(root), master=master,
                                       postgres_dsn=postgres_dsn), spark)
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
@click.option("--lookup", "lookups", multiple=True, metavar="TABLE.COL=TABLE.COL",
              help="A join the catalog has no foreign key for: the referencing table's "
                   "column(s), then the looked-up table's primary key, e.g. "
                   "loans.member_id=members.id (repeatable; a+b=p+q for several columns).")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the job file here (refuses to overwrite); default: print it.")
def job_init(dsn: str, tables: str, fact: str | None, lookups: tuple[str, ...],
             out: Path | None) -> None:
    """Write a job file from the catalog: tables, keys, lookups from foreign keys (and
    --lookup), an output."""
    from txjoin.catalog import init_job

    if out is not None and out.exists():
        raise ConfigError(f"{out} exists; choose another --out or remove it")
    names = [t.strip() for t in tables.split(",") if t.strip()]
    text = init_job(dsn, names, fact, lookups)
    if len(names) > 1 and "No foreign key joins these tables" in text:
        click.echo("note: no foreign keys join these tables, so the job has no lookups; name "
                   "them with --lookup TABLE.COL=TABLE.COL", err=True)
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text)
        click.echo(f"wrote {out}: edit its Output as you need, then txjoin run {out}",
                   err=True)


@job_group.command("from-sql")
@click.argument("query_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--name", required=True,
              help="The job's name (and its output table's, unless --output-table or the "
                   "query's INSERT INTO t names one; a CREATE VIEW t AS does not).")
@click.option("--output-table", default=None, metavar="TABLE",
              help="The table the job writes (Delta <output-dir>/TABLE, PostgreSQL TABLE and "
                   "TABLE_changelog). Default: the query's INSERT INTO t, else --name. Two "
                   "jobs cannot write one table: `txjoin run` refuses the second.")
@click.option("--dsn", default=None, envvar=_env("SOURCE_DSN"), show_envvar=True,
              help="The source database (libpq DSN) whose catalog gives the tables' columns, "
                   "types and primary keys, as `txjoin job init` reads them.")
@click.option("--job", "job_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None,
              help="Take the tables' declarations from this job file instead of a catalog.")
@click.option("--semantics", type=click.Choice(["as_of_fact", "current"]), default=None,
              help="The job's semantics. Default: as_of_fact when every join is FOR "
                   "SYSTEM_TIME AS OF the fact's column (Flink SQL's temporal join), else "
                   "current.")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the job file here (refuses to overwrite); default: print it.")
def job_from_sql(query_file: Path, name: str, output_table: str | None, dsn: str | None,
                 job_file: Path | None, semantics: str | None, out: Path | None) -> None:
    """Compile a SELECT (PostgreSQL or Flink SQL) into a job file: FROM the fact, JOINs
    lookups, WHERE a filter, expressions computed columns."""
    from txjoin.sql_job import from_sql

    if out is not None and out.exists():
        raise ConfigError(f"{out} exists; choose another --out or remove it")
    if job_file is not None:
        dsn = None  # --job wins over a TXJOIN_SOURCE_DSN in the environment
    if dsn is None and job_file is None:
        raise ConfigError("job from-sql needs the tables' declarations: --dsn DSN (the "
                          "source catalog) or --job FILE (an existing job's tables)")
    compiled = from_sql(query_file, name, dsn=dsn, job_file=job_file, semantics=semantics,
                        output_table=output_table)
    for note in compiled.notes:
        click.echo(f"note: {note}", err=True)
    if compiled.notes:
        click.echo(f"once the job has run, `txjoin verify JOB --against-sql {query_file}` "
                   f"names each row these rules decide", err=True)
    if out is None:
        click.echo(compiled.source, nl=False)
    else:
        out.write_text(compiled.source)
        click.echo(f"wrote {out}: txjoin run {out}", err=True)


# -- the job's commands that read its sinks or its topics (txjoin.verify, txjoin.export);
# a running local stack's databases and broker are their defaults


@main.command()
@click.argument("job_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=DEFAULT_DIR, show_default=True,
              help="Local stack directory: its source and sink databases, and the default "
                   "--output-dir <dir>/output.")
@click.option("--postgres-dsn", envvar="TXJOIN_POSTGRES_DSN", show_envvar=True, default=None,
              help="PostgreSQL sink DSN (default: the local stack's sink database).")
@click.option("--source-dsn", "source_dsn_items", multiple=True, metavar="[NAME=]DSN",
              help="Source database DSN (default: the local stack's source database); for a "
                   "job with several sources, NAME=DSN once per source (default: the "
                   "databases of `txjoin up --job`).")
@click.option("--no-postgres", is_flag=True, help="Check the Delta tables only.")
@click.option("--output-dir", envvar="TXJOIN_OUTPUT_DIR", show_envvar=True, default=None,
              help="Delta tables root (default: <--dir>/output).")
@click.option("--show", "show_rows", type=int, default=5, show_default=True,
              help="Mismatched rows to print per kind and sink.")
@click.option("--record", "start", is_flag=True,
              help="Start verify's record of the source database's history (a logical "
                   "replication slot, txjoin_verify, and a copy of the job's tables at its "
                   "snapshot; kept in <--dir>/verify/): run it before the workload, so an "
                   "as_of_fact job can be verified on writes txjoin did not make (`txjoin up "
                   "--job` starts one on the database it builds). The slot keeps the "
                   "server's WAL until verify reads it: --drop-record when done (`txjoin down "
                   "--wipe` drops it too).")
@click.option("--drop-record", is_flag=True,
              help="Drop verify's slot on the source database and its record, then exit.")
@click.option("--no-state-check", is_flag=True,
              help="Job with sources: skip replaying every state the changelog "
                   "passes through (the job is evaluated once per _commit_seq; slow for "
                   "long workloads). The order and grouping checks still run.")
@click.option("--against-sql", "against_sql", metavar="FILE", default=None,
              type=click.Path(exists=True, dir_okay=False),
              help="Also compare each sink with your own query (the SQL the job was "
                   "compiled from, PostgreSQL dialect) run on the source: each difference "
                   "that a documented rule of the job explains (a Pick among several "
                   "matches, the order of tied child rows) is one line, counted; any other "
                   "is a mismatch. current jobs.")
def verify(job_file: Path, directory: Path, postgres_dsn: str | None,
           source_dsn_items: tuple[str, ...], no_postgres: bool, output_dir: str | None,
           show_rows: int, start: bool, drop_record: bool, no_state_check: bool,
           against_sql: str | None) -> None:
    """Compare JOB_FILE's sinks with PostgreSQL's own answer.

    as_of_fact jobs are checked against <fact>_expected (written by `txjoin generate`)
    or, on a workload of your own, against verify's record of the source's history
    (`--record` before the workload, or the one `txjoin up --job` starts: each fact's
    row is the job as of the commit that last changed it; facts last changed before the
    record began are named in a note, not checked), current jobs against the job's query
    on the source database: run this after `txjoin run --until-idle` once the writers
    stopped. A job with several sources is
    the job's query on a copy of each source's tables (one snapshot per database); each
    sink's changelog must keep every source's commit order with no transaction split, and
    txjoin's own oracle checks every state it passes through (the "checked by:" line says
    who answered what). --against-sql FILE compares each sink with your own query too,
    explaining the differences the job's documented rules cause (docs/verify.md).
    Exit code 0: every sink matches; 1: a mismatch; 2: wrong options, or a database or
    oracle table that is not there.
    """
    from txjoin.job import load_job
    from txjoin.stack.stack import load_stack
    from txjoin.verify.history import SLOT, start_record
    from txjoin.verify.history import drop_record as drop_record_of
    from txjoin.verify.own_query import read_own_query
    from txjoin.verify.verify import verify_job

    try:
        job = load_job(job_file)
        # NAME=DSN only names one of the job's sources (a libpq "host=... dbname=..." has
        # '=' too).
        names = {s.name for s in job.sources}
        named = dict(item.split("=", 1) for item in source_dsn_items
                     if item.split("=", 1)[0] in names)
        plain = [item for item in source_dsn_items if item.split("=", 1)[0] not in names]
        source_dsn = plain[-1] if plain else None
        source_dsns: dict[str, str] | None = None
        if job.sources:
            if plain:
                raise ConfigError(f"--source-dsn {plain[0]!r}: job {job.name!r} has sources "
                                  f"{sorted(names)}; give NAME=DSN for each")
            stack = None
            if len(named) < len(job.sources) or (postgres_dsn is None and not no_postgres):
                stack = load_stack(directory)
                if stack is None:
                    raise ConfigError(
                        f"no local stack is running in {directory}/: start it with `txjoin up "
                        f"--dir {directory} --job {job_file}`, or pass --source-dsn NAME=DSN "
                        f"for each source and --postgres-dsn (or --no-postgres)")
                postgres_dsn = postgres_dsn or stack.pg_dsn_sink
            source_dsns = {s.name: named.get(s.name) or (stack.source(s.name).dsn if stack
                                                         else "")
                           for s in job.sources}
            source_dsn = source_dsn or (stack.pg_dsn_source if stack else "")
        if source_dsn is None or (postgres_dsn is None and not no_postgres):
            stack = load_stack(directory)
            if stack is None:
                raise ConfigError(f"no local stack is running in {directory}/: start it with "
                                  f"`txjoin up --dir {directory}`, or pass --source-dsn and "
                                  f"--postgres-dsn (or --no-postgres)")
            source_dsn = source_dsn or stack.pg_dsn_source
            postgres_dsn = postgres_dsn or stack.pg_dsn_sink
        assert source_dsn is not None
        if start or drop_record:
            if job.sources and len(job.sources) > 1:
                raise ConfigError(f"--record: job {job.name!r} reads several databases; "
                                  f"verify records a single source's history")
            dsn = next(iter(source_dsns.values())) if source_dsns else source_dsn
            if drop_record:
                dropped, path = drop_record_of(dsn, directory)
                click.echo(f"verify: slot {SLOT} " + ("dropped" if dropped else "not found")
                           + (f"; record {path} removed" if path else ""))
            else:
                path = start_record(dsn, directory, job.table_names)
                click.echo(f"verify: recording the source's history (slot {SLOT}) into "
                           f"{path}; run the workload, then `txjoin verify {job_file}`; "
                           f"`--drop-record` when done (the slot keeps WAL until read)")
            sys.exit(0)
        # A line every few seconds on a terminal; none in a log or a pipe.
        progress = ((lambda line: click.echo(line, err=True)) if sys.stderr.isatty()
                    else None)
        own_query = None if against_sql is None else read_own_query(against_sql)
        result = verify_job(job, (source_dsn, None if no_postgres else postgres_dsn),
                            output_dir or directory / "output", source_dsns,
                            check_states=not no_state_check, record_dir=directory,
                            progress=progress, own_query=own_query)
    except TxjoinError as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(2)
    click.echo(result.format(show_rows))
    if not result.ok and job.semantics == "current":
        click.echo("  (a current job is compared with the source's state now: run "
                   "`txjoin run --until-idle` after the writers stop, then verify again)")
    click.secho("verify: OK" if result.ok else f"verify: {result.mismatches} mismatches",
                fg="green" if result.ok else "red")
    sys.exit(0 if result.ok else 1)


@main.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=DEFAULT_DIR, show_default=True, help="Local stack directory.")
@click.option("--job", "job_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None,
              help="Export the topics this job reads (needed with --bootstrap-servers; "
                   "default: every topic of the local stack).")
@click.option("--bootstrap-servers", envvar=_env("BOOTSTRAP_SERVERS"), show_envvar=True,
              help="Your own Kafka's bootstrap servers (with --job). Default: the local "
                   "stack's broker.")
@click.option("--topic-prefix", "topic_prefix", envvar=_env("TOPIC_PREFIX"), show_envvar=True,
              multiple=True, metavar="[NAME=]PREFIX",
              help="Debezium topic.prefix of the --job's topics, as `txjoin run` takes it.")
@click.option("--records-per-file", type=int, default=DEFAULT_RECORDS_PER_FILE,
              show_default=True, help="Records per file (Kafka Connect's flush.size).")
@cli_errors
def export(out: Path, directory: Path, job_file: Path | None, bootstrap_servers: str | None,
           topic_prefix: tuple[str, ...], records_per_file: int) -> None:
    """Write Debezium topics to OUT in Kafka Connect's S3/file sink layout.

    By default the local stack's topics; with --bootstrap-servers and --job, the
    topics that job reads on your own Kafka. Read them back with
    `txjoin run JOB.py --source files:OUT`. Running export again appends what was
    captured since.
    """
    from txjoin.export import export_topics
    from txjoin.job import load_job
    from txjoin.stack.stack import load_stack

    if records_per_file <= 0:
        raise ConfigError("--records-per-file must be positive")
    if bootstrap_servers and job_file is None:
        raise ConfigError("--bootstrap-servers needs --job JOB.py: export reads the topics "
                          "that job reads (its tables and transaction topics)")
    if topic_prefix and job_file is None:
        raise ConfigError("--topic-prefix needs --job JOB.py: the prefix names that job's "
                          "topics")
    job = load_job(job_file) if job_file is not None else None
    stack = None if bootstrap_servers else load_stack(directory)
    if not bootstrap_servers:
        if stack is None:
            raise ConfigError(f"no local stack is running in {directory}/; start one with "
                              f"`txjoin up --dir {directory}`, or pass --bootstrap-servers "
                              f"HOST:PORT --job JOB.py")
        bootstrap_servers = stack.bootstrap_servers
    if job is None:
        assert stack is not None
        topics = list(stack.topics)
    else:
        plain, named = parse_topic_prefixes(topic_prefix, job.source_names, bool(job.sources))
        if stack is not None and not topic_prefix and not job.sources:
            plain = stack.topic_prefix
        topics = job.all_topics(job.source_prefixes(plain, named))
    counts = export_topics(bootstrap_servers, topics, out, records_per_file)
    if not counts:
        raise ConfigError(f"none of the topics to export is on the broker at "
                          f"{bootstrap_servers} ({', '.join(topics)}); check --topic-prefix "
                          f"(Debezium's topic.prefix) and that the connector has run")
    for topic in topics:
        click.echo(f"{topic}: {counts[topic]} records" if topic in counts
                   else f"{topic}: not on the broker yet (nothing exported)")
    click.echo(f"exported to {out}/ (read with --source files:{out})")


def _register_commands() -> None:
    """The tooling's commands, which live next to what they drive: bench, the local stack,
    demo, soak (the job's code never imports them: tests/unit/test_layout.py)."""
    from txjoin.bench import bench
    from txjoin.stack.commands import down, generate, status, up
    from txjoin.stack.demo import demo
    from txjoin.stack.soak import soak

    for cmd in (bench, up, down, status, generate, demo, soak):
        main.add_command(cmd)


_register_commands()

if __name__ == "__main__":
    main()
