"""A new user's mistakes against the running local stack: found before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.e2e.conftest import E2EStack
from txjoin.cli import main

pytestmark = pytest.mark.e2e

ORDERS = Path(__file__).resolve().parents[2] / "jobs" / "orders.py"


def test_a_typo_in_a_declared_column_stops_the_run_before_spark_with_the_near_name(
        e2e_stack: E2EStack, tmp_path: Path) -> None:
    job = tmp_path / "orders_typo.py"
    job.write_text(ORDERS.read_text().replace('"order_time": "timestamp"',
                                              '"order_tme": "timestamp"'))
    result = CliRunner().invoke(main, ["run", str(job), "--dir", str(e2e_stack.directory),
                                       "--checkpoint-dir", str(tmp_path / "cp"),
                                       "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert (f"{job}: table public.orders has no column 'order_tme' in the source database"
            in result.output), result.output
    assert "(did you mean 'order_time'?)" in result.output, result.output
    assert not (tmp_path / "cp").exists() and not (tmp_path / "out").exists()
