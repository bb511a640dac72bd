"""The real stack's topics archived with ``txjoin export`` and read back with ``--source files``.

PostgreSQL -> Debezium -> broker -> ``txjoin export`` (Kafka Connect's sink layout,
small files) -> ``txjoin run --source files:DIR --until-idle`` -> both sinks, verified
against PostgreSQL's own answer; a second export after more writes appends files that a
second run picks up from its checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.e2e.conftest import E2EStack
from tests.e2e.test_end_to_end import (
    ORDERS,
    assert_verified,
    fresh_sink_database,
    run_args,
    run_until_idle,
)
from txjoin.cli import export
from txjoin.job import load_job
from txjoin.stack.demo import wait_until_captured
from txjoin.stack.generate import generate
from txjoin.verify.verify import verify_job

pytestmark = pytest.mark.e2e


def test_exported_topics_run_from_files_and_match_postgresql(e2e_stack: E2EStack,
                                                             tmp_path: Path) -> None:
    sink_dsn = fresh_sink_database(e2e_stack, "sink_files")
    archive = tmp_path / "archive"
    args = [*run_args(e2e_stack, ORDERS, tmp_path, sink_dsn), "--source", f"files:{archive}"]
    # 3 s of writes per round (8 s until issue 34): a round needs new records to export into
    # more files and a run to pick them up from its checkpoint, not many of them (the files
    # hold the shared stack's whole history anyway), and its writer only waits.
    for seed in (21, 22):
        generate(e2e_stack.info.pg_dsn_source, rate_tx_per_s=30, duration_s=3, seed=seed,
                 writers=2)
        wait_until_captured(e2e_stack.info)
        cli = CliRunner().invoke(export, [str(archive), "--dir", str(e2e_stack.directory),
                                          "--records-per-file", "50"])
        assert cli.exit_code == 0, cli.output
        assert "exported to" in cli.output
        run_until_idle(tmp_path / "run.log", *args)
        assert_verified(verify_job(load_job(ORDERS), (e2e_stack.info.pg_dsn_source, sink_dsn),
                                   tmp_path / "output"))
    files = list((archive / f"{e2e_stack.info.topic_prefix}.public.orders").rglob("*.json"))
    assert len(files) > 2, "several files per partition expected"
