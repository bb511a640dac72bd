"""Spark's Python workers fork from txjoin's daemon, with its task modules already imported
(``txjoin/pipeline/worker_daemon.py``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from txjoin.pipeline.worker_daemon import PRELOAD

pytestmark = pytest.mark.spark


def _worker_facts(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        parent = f.read().replace(b"\0", b" ").decode()
    missing = [m for m in PRELOAD if m not in sys.modules]
    for _ in frames:
        yield pd.DataFrame({"parent": [parent], "missing": [",".join(missing)],
                            "blas": [os.environ.get("OPENBLAS_NUM_THREADS", "")]})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_python_workers_fork_from_the_daemon_with_the_task_modules_imported(
        spark: SparkSession) -> None:
    rows = spark.range(2).repartition(2).mapInPandas(
        _worker_facts, "parent string, missing string, blas string").collect()
    assert rows
    for row in rows:
        assert "txjoin.pipeline.worker_daemon" in row.parent, row
        assert row.missing == "", f"not imported before the fork: {row.missing}"
        assert row.blas == "1", row
