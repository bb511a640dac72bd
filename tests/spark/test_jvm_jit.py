"""The driver's JIT compiler threads, read from /proc (txjoin.jvm): a running session's JVM
has compiled something, and the reading only grows."""

from __future__ import annotations

import sys

import pytest
from pyspark.sql import SparkSession

from txjoin.jvm import compiler_cpu_seconds, jvm_pid


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_a_session_jvm_has_compiled(spark: SparkSession) -> None:
    pid = jvm_pid(spark)
    assert pid is not None and pid > 0
    first = compiler_cpu_seconds(pid)
    assert first is not None and first > 0
    spark.range(100_000).selectExpr("sum(id * 3)").collect()
    later = compiler_cpu_seconds(pid)
    assert later is not None and later >= first
