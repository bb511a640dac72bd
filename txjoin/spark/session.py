"""One place that builds the local Spark session with the settings txjoin relies on.

The settings come from measurements on our machines (DESIGN.md section 4): the
filesystem checkpoint manager cuts the per-batch overhead from ~200 ms to ~70 ms,
a UTC session time zone keeps commit timestamps unambiguous, Arrow is what makes
Python data sources and pandas UDFs fast, and a 16 MB thread stack stops
``stop()`` from dumping a StackOverflowError on deep plans.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing."
    "FileSystemBasedCheckpointFileManager"
)

_JAVA_OPTIONS = "-Xss16m"


def default_conf(shuffle_partitions: int = 2) -> dict[str, str]:
    """The Spark settings txjoin applies to every session, before ``extra_conf``."""
    return {
        "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.extraJavaOptions": _JAVA_OPTIONS,
        "spark.executor.extraJavaOptions": _JAVA_OPTIONS,
        # Small local jobs: the default 200 shuffle partitions means 200 tiny
        # tasks (and 200 state store instances) per stateful micro-batch.
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        # The engine's state is one value rewritten every batch: keep fewer old versions
        # on disk than the default 100 (recovery needs only the last few).
        "spark.sql.streaming.minBatchesToRetain": "20",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }


def get_session(
    master: str = "local[*]",
    app_name: str = "txjoin",
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """Return the process-wide Spark session, creating it with txjoin's settings.

    ``extra_conf`` overrides the defaults (e.g. ``spark.sql.shuffle.partitions``).
    Settings are only applied when the session is created: a JVM that is already
    running keeps its static configuration (Java options, UI), as in any Spark app.
    """
    if master.startswith("local"):
        # A local session needs no external interface; binding to loopback also
        # silences the "hostname resolves to a loopback address" warning.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers otherwise run the first `python3` on PATH, which is not our
    # venv (no confluent-kafka, deltalake...). PySpark 4.2 takes the workers'
    # interpreter from this variable, not from spark.pyspark.python.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = default_conf()
    conf.update(extra_conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def stop_session() -> None:
    """Stop the process's Spark session, if any, so the next ``get_session`` starts afresh."""
    # getActiveSession is per thread; the instantiated default session is the
    # process-wide one, so a teardown on another thread still finds it.
    spark = SparkSession.getActiveSession() or SparkSession._instantiatedSession
    if spark is not None:
        spark.stop()
