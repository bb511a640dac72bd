"""``txjoin up | down | status | generate``: the local stack from the command line.

Plain ``click.command`` objects; the main CLI registers them (``cli.add_command(up)``).
Errors are ``TxjoinError``s, which the main CLI turns into a message and an exit code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from txjoin.errors import ConfigError, ServiceError, cli_errors
from txjoin.sinks.postgres import mask_dsn, read_progress
from txjoin.stack import debezium as debezium_mod
from txjoin.stack import stack as stack_mod
from txjoin.stack.generate import generate as generate_workload

_console = Console()


_dir_option = click.option(
    "--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
    default=stack_mod.DEFAULT_DIR, show_default=True, help="Stack directory (state, logs, data).")


@click.command()
@_dir_option
@click.option("--pg-port", type=int, default=None, help="PostgreSQL port (default: a free one).")
@click.option("--broker-port", type=int, default=None, help="Broker port (default: a free one).")
@click.option("--timeout", type=float, default=180.0, show_default=True,
              help="Seconds each component may take to become healthy.")
@click.option("--job", "job_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Capture this job's tables instead of the pizzeria's: one database built "
                   "from its Table declarations, with one Debezium connector, per source (a job "
                   "without `sources` gets one, named after the job; both name the topic "
                   "prefix). Write to it with your own SQL or application.")
@click.option("--source-dsn", default=None, metavar="DSN",
              help="With --job: capture the job's tables from this PostgreSQL, which you run "
                   "(checked first: wal_level=logical, a REPLICATION role, the tables, columns "
                   "and replica identity); the stack's own PostgreSQL then holds only the sink.")
@click.option("--schema", "schema_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, metavar="FILE",
              help="With --job: build the job's database from your own DDL (CREATE TABLE "
                   "... with its constraints, indexes, other tables) instead of txjoin's "
                   "from the job's Table declarations; checked against the job first (every "
                   "table and column it declares, with a type it reads: one line per "
                   "problem, and nothing is kept). A job of one database.")
@click.option("--partitions", type=click.IntRange(min=1), default=None,
              help="Partitions of each table topic (Debezium spreads records by row key; "
                   "transaction topics always have one). Default: 1, or what the stack in "
                   "--dir was started with.")
@cli_errors
def up(directory: Path, pg_port: int | None, broker_port: int | None, timeout: float,
       job_file: Path | None, source_dsn: str | None, schema_file: Path | None,
       partitions: int | None) -> None:
    """Start PostgreSQL, Apache Kafka and Debezium (Kafka Connect) in the background.

    A stack stopped by `down` (without --wipe), or whose processes died, starts again on
    its ports and data: `txjoin up --dir DIR` starts it as it was started (a `--job` stack
    with its job's source databases)."""
    sources: list[stack_mod.SourceSpec] = []
    if source_dsn is not None and job_file is None:
        raise ConfigError("--source-dsn captures a job's tables: add --job FILE (write one "
                          "from your catalog with `txjoin job init --dsn DSN --tables ...`)")
    if schema_file is not None and job_file is None:
        raise ConfigError("--schema builds a job's database: add --job FILE (the job whose "
                          "tables the DDL holds)")
    recorded = stack_mod.recorded_start(directory)
    if job_file is not None:
        from txjoin.job import load_job

        sources = stack_mod.job_sources(load_job(job_file), source_dsn, schema_file)
    elif recorded is not None:
        sources = recorded[0]  # no --job: the stack as it was started
    if partitions is None:
        partitions = recorded[1] if recorded is not None else 1
    result = stack_mod.up(directory, pg_port=pg_port, broker_port=broker_port, timeout=timeout,
                          progress=lambda line: _console.print(f"[dim]{line}[/dim]"),
                          sources=sources, partitions=partitions, job_file=job_file)
    info = result.info
    if result.already_running:  # (a start's own line came through progress: once)
        _console.print(f"stack in {directory} is already running")
    _console.print(f"  source    {mask_dsn(info.pg_dsn_source)}\n"
                   f"  sink      {mask_dsn(info.pg_dsn_sink)}\n"
                   f"  bootstrap {info.bootstrap_servers}\n  topics    {', '.join(info.topics)}",
                   highlight=False)
    for source in info.sources:
        _console.print(f"  source {source.name!r}: {mask_dsn(source.dsn)} "
                       f"(prefix {source.prefix})", highlight=False)
    example = (info.tables or [t for s in info.sources for t in s.tables])[:1]
    if example and not any(s.external_dsn for s in sources):  # (no signal table there)
        # (docs/production.md, "Incremental snapshots": what it changes in the output)
        _console.print(f"  re-read a table (Debezium's incremental snapshot), in its source "
                       f"database:\n    {debezium_mod.execute_snapshot_sql(list(example))}",
                       highlight=False, soft_wrap=True)
    fresh = not (result.already_running or result.resumed)
    stale = stack_mod.stale_checkpoints(directory) if fresh else []
    if stale:
        _console.print(
            f"[yellow]warning: {directory}/checkpoints holds checkpoints of an earlier stack "
            f"({', '.join(stale)}) that do not match the new topics; run those jobs with "
            f"--rebuild, or `txjoin down --wipe` to remove them[/yellow]", highlight=False,
            soft_wrap=True)


@click.command()
@_dir_option
@click.option("--wipe", is_flag=True,
              help="Also remove the databases, Kafka's topics, logs, the state file, and the "
                   "checkpoints and Delta outputs in <dir>/checkpoints and <dir>/output.")
@cli_errors
def down(directory: Path, wipe: bool) -> None:
    """Stop the processes `up` started (only those); their data stays unless --wipe."""
    stopped = stack_mod.down(
        directory, wipe=wipe,
        warn=lambda line: _console.print(f"[yellow]warning: {line}[/yellow]", highlight=False,
                                         soft_wrap=True))
    _console.print(f"stopped {', '.join(stopped)}" if stopped else "nothing was running")
    if wipe:
        _console.print(
            f"removed from {directory}: PostgreSQL's data (source and sink databases), "
            f"Kafka's topics, Debezium's offsets, logs, the state file, checkpoints/ and "
            f"output/ (and Debezium's slot and publication from a --source-dsn database, "
            f"whose data stays); checkpoints or outputs kept elsewhere (--checkpoint-dir, "
            f"--output-dir) are not touched",
            highlight=False, soft_wrap=True)


@click.command()
@_dir_option
@click.option("--show-dsn", is_flag=True,
              help="Print the databases' connection strings with their password (the local "
                   "stack's own, for psql or your application), not masked.")
@cli_errors
def status(directory: Path, show_dsn: bool) -> None:
    """Show each component's pid, port (Debezium: its Connect REST port) and health."""
    components = stack_mod.status(directory)
    if not components:
        _console.print(f"no stack in {directory} ({stack_mod.start_hint(directory)})")
        return
    shown: Callable[[str], str] = (lambda dsn: dsn) if show_dsn else mask_dsn

    table = Table("component", "pid", "port", "running", "health")
    for c in components:
        table.add_row(c.name, str(c.pid), "" if c.port is None else str(c.port),
                      "yes" if c.running else "no", c.health)
    console = Console(width=min(_console.width, 80))
    console.print(table)
    info = stack_mod.load_stack(directory)
    if info is not None:
        console.print(f"source    {shown(info.pg_dsn_source)}\n"
                      f"sink      {shown(info.pg_dsn_sink)}\n"
                      f"bootstrap {info.bootstrap_servers}", highlight=False)
        for source in info.sources:
            console.print(f"source {source.name!r}: {shown(source.dsn)}, topics "
                          f"{', '.join(source.topics)}", highlight=False)
        postgres = next((c for c in components if c.name == "postgres"), None)
        if postgres is not None and postgres.running:
            _print_jobs(console, read_progress(info.pg_dsn_sink))


def _print_jobs(console: Console, rows: list[dict[str, Any]]) -> None:
    """The jobs writing the stack's sink database, from their progress rows."""
    if not rows:
        console.print("jobs      none has written the sink database yet", highlight=False)
        return
    table = Table("job", "last batch", "frontier commit_seq", "last change xid", "updated")
    for row in rows:
        age = row["age"].total_seconds()
        table.add_row(row["job"], str(row["last_batch_id"]),
                      "" if row["frontier_commit_seq"] is None else str(row["frontier_commit_seq"]),
                      "" if row["last_change_xid"] is None else str(row["last_change_xid"]),
                      f"{age:,.0f} s ago")
    console.print(table)


@click.command()
@_dir_option
@click.option("--dsn", default=None, help="Source database (default: the local stack's).")
@click.option("--rate", type=float, default=50.0, show_default=True,
              help="Target transactions per second, over all writers.")
@click.option("--duration", type=float, default=10.0, show_default=True, help="Seconds to run.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--writers", type=int, default=1, show_default=True,
              help="Concurrent connections (serialised per transaction by an advisory lock); "
                   "with --job: per source database.")
@click.option("--job", "job_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Drive the source databases of this multi-source job instead (the stack of "
                   "`txjoin up --job`): jobs/users_colors_two_dbs.py gets users inserted and "
                   "renamed in one database, colours added, changed and deleted in the other; "
                   "--rate is then per database.")
@click.option("--level", type=click.IntRange(min=1), default=None, metavar="N",
              help="Keep live rows level: once more than N clients (or users) are live, "
                   "the next transaction deletes the oldest one with its orders and table "
                   "assignments (its colours). Default: rows grow with time.")
@click.option("--only", type=click.Choice(["users", "colors"]), default=None,
              help="With --job: write this database only; the other source stays idle.")
@click.option("--bulk", "bulk_rows", type=click.IntRange(min=1), default=None, metavar="N",
              help="Instead of --rate/--duration/--writers: write at least N row changes into "
                   "the stack's pizzeria as fast as PostgreSQL takes them (many small "
                   "transactions per round trip), wait until Debezium has put every event "
                   "of them into Kafka, and report the capture rate.")
@click.option("--json", "as_json", is_flag=True,
              help="With --bulk: print the report as one JSON object.")
@cli_errors
def generate(directory: Path, dsn: str | None, rate: float, duration: float, seed: int,
             writers: int, job_file: Path | None, level: int | None, only: str | None,
             bulk_rows: int | None, as_json: bool) -> None:
    """Drive the pizzeria workload (and users/colours) against the source database.

    With --bulk N: write N row changes flat out, then report how fast the stack captured
    them (events from the first commit until the last one is in Kafka).
    """
    if level is not None and (bulk_rows is not None or job_file is not None):
        raise ConfigError("--level applies to the racing pizzeria workload, not to --bulk "
                          "or --job")
    if bulk_rows is not None or as_json:
        _generate_bulk(directory, dsn, job_file, bulk_rows, seed, as_json)
        return
    if job_file is not None:
        _generate_sources(directory, job_file, rate, duration, seed, writers, only)
        return
    if only is not None:
        raise ConfigError("--only needs --job (a job with several sources)")
    if dsn is None:
        info = stack_mod.load_stack(directory)
        if info is None:
            raise ServiceError(f"no running stack in {directory}: `txjoin up` or pass --dsn")
        if info.sources:
            raise ConfigError(f"the stack in {directory} captures a job's own tables (`up "
                              f"--job`), not the pizzeria's: write to "
                              f"{mask_dsn(info.pg_dsn_source)} with your own SQL or "
                              f"application")
        dsn = info.pg_dsn_source
    result = generate_workload(dsn, rate, duration, seed=seed, writers=writers, level=level)
    _console.print(f"{result.transactions} transactions in {result.seconds:.1f}s "
                   f"({result.transactions / max(result.seconds, 1e-9):.0f} tx/s), "
                   f"{result.events} row changes, {result.orders_recorded} orders_expected writes")
    table = Table("table", "events")
    for name, count in sorted(result.events_by_table.items()):
        table.add_row(name, str(count))
    _console.print(table)


def _generate_bulk(directory: Path, dsn: str | None, job_file: Path | None,
                   bulk_rows: int | None, seed: int, as_json: bool) -> None:
    from txjoin.stack.bulk import generate_bulk

    if bulk_rows is None:
        raise ConfigError("--json needs --bulk N")
    if dsn is not None or job_file is not None:
        raise ConfigError("--bulk times the local stack's own capture: drop --dsn and --job")
    info = stack_mod.load_stack(directory)
    if info is None:
        raise ServiceError(f"no running stack in {directory}: `txjoin up --dir {directory}` "
                           f"first")
    result = generate_bulk(info, bulk_rows, seed=seed)
    click.echo(json.dumps(result.to_json()) if as_json else result.summary())


def _generate_sources(directory: Path, job_file: Path, rate: float, duration: float, seed: int,
                      writers: int, only: str | None) -> None:
    from txjoin.job import load_job
    from txjoin.stack.generate_sources import (
        COLOURS_TABLE,
        USERS_TABLE,
        generate_two_sources,
    )

    job = load_job(job_file)
    by_table = {t.name: t.source for t in job.tables}
    users_source, colours_source = by_table.get(USERS_TABLE), by_table.get(COLOURS_TABLE)
    if (users_source is None or colours_source is None or users_source == colours_source):
        raise ConfigError(f"{job_file}: the two-source workload needs {USERS_TABLE} and "
                          f"{COLOURS_TABLE} in two different sources (as in "
                          f"jobs/users_colors_two_dbs.py)")
    info = stack_mod.load_stack(directory)
    if info is None:
        raise ServiceError(f"no running stack in {directory}: `txjoin up --dir {directory} "
                           f"--job {job_file}` first")
    users, colours = info.source(users_source), info.source(colours_source)
    result = generate_two_sources(users.dsn, colours.dsn, rate, duration, seed=seed,
                                  writers=writers, only=only)
    table = Table("source", "database", "transactions", "row changes")
    for name, source, part in ((users_source, users, result.users),
                               (colours_source, colours, result.colors)):
        table.add_row(name, source.database, str(part.transactions), str(part.events))
    _console.print(f"{result.transactions} transactions in {result.seconds:.1f}s")
    _console.print(table)
