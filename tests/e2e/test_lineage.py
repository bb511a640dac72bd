"""A sink never silently out of step with its checkpoint, nor a checkpoint with its topics.

Issue 8 item 1 as a user met it: a wiped checkpoint restarted at batch 0 and both
sinks skipped its batches as replays. Issue 11 item 1: a checkpoint of an earlier
stack followed new topics and ended quietly with nothing done. Both now stop with
one line (exit 2) naming what is wrong and the way out, and ``--rebuild``
re-derives the sinks from the source, after which they match PostgreSQL's answer.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import psycopg2
import pytest
from click.testing import CliRunner

from tests.e2e.conftest import E2EStack
from tests.e2e.test_end_to_end import (
    ORDERS,
    assert_orders_changelogs,
    assert_verified,
    fresh_sink_database,
    run_args,
    txjoin_in_process,
)
from txjoin.job import load_job
from txjoin.sinks.postgres import mask_dsn
from txjoin.stack import postgres as postgres_mod
from txjoin.stack import stack as stack_mod
from txjoin.stack.commands import down, status, up
from txjoin.stack.demo import wait_until_captured
from txjoin.stack.generate import generate
from txjoin.verify.verify import verify_job

pytestmark = pytest.mark.e2e

SECRET = f":{postgres_mod.DB_PASSWORD}@"  # the password as it would sit in a DSN


def txjoin_run(log: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``txjoin run ARGS`` in this process, its output appended to ``log`` too."""
    started = time.monotonic()
    done = txjoin_in_process("run", *args)  # the worker's warm Spark session (run_until_idle)
    print(f"[e2e] txjoin run {' '.join(a for a in args if a.startswith('--'))}: exit "
          f"{done.returncode} in {time.monotonic() - started:.1f}s")
    with open(log, "a") as fh:
        # The command line is ours (with the DSN we passed); only its output is checked.
        fh.write(f"$ txjoin run {mask_dsn(' '.join(args))}\n{done.stdout}{done.stderr}"
                 f"exit {done.returncode}\n")
    return done


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def test_a_wiped_checkpoint_is_refused_then_rebuilt_and_matches_postgresql(
        e2e_stack: E2EStack, tmp_path: Path) -> None:
    sink_dsn = fresh_sink_database(e2e_stack, "sink_lineage")
    source = e2e_stack.info.pg_dsn_source
    args = run_args(e2e_stack, ORDERS, tmp_path, sink_dsn)
    log = tmp_path / "run.log"
    # 3 s of writes each time (8 s until issue 34): the refusal needs a sink holding batches
    # and new changes to read, not many of them; the rebuild reads the topics' whole history
    # (every earlier test's on the shared stack) anyway.
    generate(source, rate_tx_per_s=20, duration_s=3, seed=81)
    wait_until_captured(e2e_stack.info)

    first = txjoin_run(log, "--until-idle", *args)
    assert first.returncode == 0, log.read_text()
    assert last_line(first.stdout).startswith("done: ")

    shutil.rmtree(tmp_path / "checkpoints" / "orders")
    generate(source, rate_tx_per_s=20, duration_s=3, seed=82)
    wait_until_captured(e2e_stack.info)
    with psycopg2.connect(sink_dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM orders_enriched_changelog")
        before = cur.fetchone()

    refused = txjoin_run(log, "--until-idle", *args)

    assert refused.returncode == 2, log.read_text()
    # (Spark's own start-up lines may precede it on stderr.)
    error = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and last_line(refused.stderr) == error[0], refused.stderr
    assert "sink" in error[0] and "holds batch" in error[0] and "--rebuild" in error[0]
    assert "restore the checkpoint" in error[0]
    assert "batch 0" not in refused.stdout  # nothing was processed, nothing skipped
    with psycopg2.connect(sink_dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM orders_enriched_changelog")
        assert cur.fetchone() == before

    started = time.monotonic()
    rebuilt = txjoin_run(log, "--until-idle", "--rebuild", *args)
    print(f"\n[e2e] --rebuild --until-idle: {time.monotonic() - started:.1f}s")

    assert rebuilt.returncode == 0, log.read_text()
    assert "rebuilt:" in rebuilt.stdout
    assert_verified(verify_job(load_job(ORDERS), (source, sink_dsn), tmp_path / "output"))
    assert_orders_changelogs(e2e_stack, tmp_path, sink_dsn)

    # Nothing new: still one summary line, and the progress row names the frontier.
    idle = txjoin_run(log, "--until-idle", *args)
    assert idle.returncode == 0, log.read_text()
    summary = last_line(idle.stdout)
    assert summary.startswith("done: 0 batches, 0 records, 0 transactions released; "
                              "rows written: delta 0, postgres 0; frontier commit_seq "), summary
    with psycopg2.connect(sink_dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT last_batch_id, frontier_commit_seq, checkpoint_id "
                    "FROM txjoin_progress WHERE job = 'orders'")
        last_batch, frontier, checkpoint = cur.fetchone()
    assert summary.endswith(f"frontier commit_seq {frontier}")
    assert last_batch >= 0 and checkpoint
    assert SECRET not in log.read_text()


def test_an_earlier_stacks_checkpoint_is_refused_and_down_wipe_removes_it(
        tmp_path: Path) -> None:
    directory = tmp_path / "stack"
    log = tmp_path / "run.log"
    cli = CliRunner()
    started = cli.invoke(up, ["--dir", str(directory)])
    try:
        assert started.exit_code == 0, started.output
        assert SECRET not in started.output
        shown = cli.invoke(status, ["--dir", str(directory)])
        assert SECRET not in shown.output
        assert max(len(line) for line in shown.output.splitlines()) <= 80, shown.output
        info = stack_mod.load_stack(directory)
        assert info is not None
        generate(info.pg_dsn_source, rate_tx_per_s=20, duration_s=5, seed=91)
        wait_until_captured(info)
        args = [str(ORDERS), "--dir", str(directory), "--master", "local[2]", "--no-postgres"]
        assert txjoin_run(log, "--until-idle", *args).returncode == 0, log.read_text()

        # A new stack in the same directory with the old checkpoint and output left behind
        # (`down` keeps the topics, so wipe the stack and put them back): new topics.
        kept = tmp_path / "kept"
        for derived in ("checkpoints", "output"):
            shutil.copytree(directory / derived, kept / derived)
        assert cli.invoke(down, ["--dir", str(directory), "--wipe"]).exit_code == 0
        shutil.copytree(kept, directory, dirs_exist_ok=True)
        again = cli.invoke(up, ["--dir", str(directory)])
        assert again.exit_code == 0, again.output
        warning = [line for line in again.output.splitlines() if "earlier stack" in line]
        assert len(warning) == 1 and "orders" in warning[0] and "--rebuild" in warning[0]
        info = stack_mod.load_stack(directory)
        assert info is not None
        generate(info.pg_dsn_source, rate_tx_per_s=20, duration_s=3, seed=92)
        wait_until_captured(info)

        refused = txjoin_run(log, "--until-idle", *args)
        assert refused.returncode == 2, log.read_text()
        error = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
        assert len(error) == 1 and last_line(refused.stderr) == error[0], refused.stderr
        assert error[0].startswith("error: kafka: ") and "--rebuild" in error[0]

        rebuilt = txjoin_run(log, "--until-idle", "--rebuild", *args)
        assert rebuilt.returncode == 0, log.read_text()
        result = verify_job(load_job(ORDERS), (info.pg_dsn_source, None), directory / "output")
        assert result.ok, result.format(10)
        assert SECRET not in log.read_text()
    finally:
        if (directory / "logs").is_dir():  # a failure names them, and the wipe removes them
            shutil.copytree(directory / "logs", tmp_path / "logs", dirs_exist_ok=True)
        wiped = cli.invoke(down, ["--dir", str(directory), "--wipe"])
    assert "checkpoints/ and output/" in wiped.output
    assert not (directory / "checkpoints").exists() and not (directory / "output").exists()


def test_a_sink_table_altered_underneath_stops_the_job_until_repaired_or_rebuilt(
        e2e_stack: E2EStack, tmp_path: Path) -> None:
    sink_dsn = fresh_sink_database(e2e_stack, "sink_altered")
    source = e2e_stack.info.pg_dsn_source
    args = run_args(e2e_stack, ORDERS, tmp_path, sink_dsn)
    log = tmp_path / "run.log"
    generate(source, rate_tx_per_s=20, duration_s=4, seed=71)
    wait_until_captured(e2e_stack.info)
    assert txjoin_run(log, "--until-idle", *args).returncode == 0, log.read_text()

    def progress() -> tuple[int, int]:
        with psycopg2.connect(sink_dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT last_batch_id, frontier_commit_seq FROM txjoin_progress")
            return cur.fetchone()

    for alteration, column, repair in (
            ("ALTER COLUMN table_name TYPE varchar(3) USING left(table_name, 3)",
             "table_name", None),
            ("ALTER COLUMN client_name TYPE bytea USING convert_to(client_name, 'UTF8')",
             "client_name", "ALTER COLUMN client_name TYPE text USING "
                            "convert_from(client_name, 'UTF8')")):
        with psycopg2.connect(sink_dsn) as conn, conn.cursor() as cur:
            cur.execute(f"ALTER TABLE orders_enriched {alteration}")
        generate(source, rate_tx_per_s=20, duration_s=3, seed=72)
        wait_until_captured(e2e_stack.info)
        before = progress()

        refused = txjoin_run(log, "--until-idle", *args)

        assert refused.returncode == 2, log.read_text()
        error = last_line(refused.stderr)
        assert error.startswith("error: postgres sink table public.orders_enriched: column "
                                f"{column!r} has type "), refused.stderr
        assert "--rebuild" in error
        assert progress() == before  # nothing of the batch committed

        if repair is None:
            fixed = txjoin_run(log, "--until-idle", "--rebuild", *args)
        else:
            with psycopg2.connect(sink_dsn) as conn, conn.cursor() as cur:
                cur.execute(f"ALTER TABLE orders_enriched {repair}")
            fixed = txjoin_run(log, "--until-idle", *args)
        assert fixed.returncode == 0, log.read_text()
        assert_verified(verify_job(load_job(ORDERS), (source, sink_dsn), tmp_path / "output"))
