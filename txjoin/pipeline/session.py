"""One place that builds the local Spark session with the settings txjoin relies on.

The settings come from measurements on our machines (docs/how-it-works.md): the
filesystem checkpoint manager cuts the per-batch overhead from ~200 ms to ~70 ms,
a UTC session and JVM time zone keeps commit timestamps unambiguous (and Delta's
commits light), Arrow is what makes
Python data sources and pandas UDFs fast, and a 16 MB thread stack stops
``stop()`` from dumping a StackOverflowError on deep plans.

Spark's own output (the JVM's start-up notices, log4j warnings, a failed task's
Java and Python stack traces, the Python workers' warnings) goes to a log file
unless ``txjoin --verbose`` is set or stderr already goes to a file: txjoin
reports what a user needs in one line (``txjoin.errors``). The JVM writes all
of it to the file descriptor 2 it inherits at launch, so that is what the
session points at the log file while it starts the JVM.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import SparkSession

from txjoin.errors import SPARK_LOG_ENV, verbose
from txjoin.jvm import (
    class_archive_options,
    local_fs_conf,
    spark_home,
    spark_jars,
    spark_java_home,
)

# PySpark 4.2's applyInPandasWithState serializer pads its output with all-NA rows
# and concatenates them (pyspark/sql/pandas/serializers.py), which pandas 2.x
# answers with a FutureWarning in every Python worker on every micro-batch. The
# code is PySpark's and the result is right: the workers ignore that warning.
_WORKER_WARNINGS = ("ignore:The behavior of DataFrame concatenation with empty or all-NA "
                    "entries is deprecated:FutureWarning")

CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing."
    "FileSystemBasedCheckpointFileManager"
)

# UTC in the JVM too: Delta 4.4 runs an all-files log reconstruction after every commit
# when the session, the JVM default or user.timezone zone is not UTC (DESIGN.md 2.2).
_JAVA_OPTIONS = "-Xss16m -Duser.timezone=UTC"
SPARK_WAREHOUSE = str(Path(tempfile.gettempdir()) / f"txjoin-spark-{os.getuid()}-warehouse")
"""Spark SQL's warehouse folder: txjoin's tables are paths and it keeps no catalog tables,
but Spark's default, ``./spark-warehouse``, was left in the user's working directory. One
a user, reused by every session, beside Spark's log (``txjoin-spark-<uid>.log``): a folder
another user made in a shared temporary directory is not writable."""


WORKER_DAEMON = "txjoin.pipeline.worker_daemon"
"""Spark's Python worker daemon in txjoin's sessions (its docstring says why)."""


RUNTIME_CONF = {
    "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER,
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}
"""The part of :func:`default_conf` a running session takes: ``txjoin.start`` sets it on a
session of the caller's (the rest applies only when a session is created)."""


def default_conf(shuffle_partitions: int = 2) -> dict[str, str]:
    """The Spark settings txjoin applies to every session, before ``extra_conf``."""
    return {
        **RUNTIME_CONF,
        "spark.driver.extraJavaOptions": f"{_JAVA_OPTIONS} {class_archive_options()}".strip(),
        "spark.executor.extraJavaOptions": _JAVA_OPTIONS,
        # Small local jobs: the default 200 shuffle partitions means 200 tiny
        # tasks (and 200 state store instances) per stateful micro-batch.
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        # The engine's state is one value rewritten every batch: keep fewer old versions
        # on disk than the default 100 (recovery needs only the last few).
        "spark.sql.streaming.minBatchesToRetain": "20",
        "spark.ui.enabled": "false",
        # The Delta group commit's jobs take turns with the stream's micro-batches for the
        # cores (txjoin.sinks.delta.COMMIT_POOL) instead of queuing them behind its tasks.
        "spark.scheduler.mode": "FAIR",
        "spark.sql.warehouse.dir": SPARK_WAREHOUSE,
        "spark.ui.showConsoleProgress": "false",
        # Python workers forked with pandas, pyarrow and txjoin's task modules imported
        # (each imported them after its fork: ~1.5 s of CPU a worker here)
        "spark.python.daemon.module": WORKER_DAEMON,
        # Spark's kafka source and delta-spark, fetched by scripts/jars.sh (txjoin.jvm);
        # pyspark's own jars come first on the classpath, so they win where trees clash.
        "spark.jars": spark_jars(),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    }


def get_session(
    master: str = "local[*]",
    app_name: str = "txjoin",
    extra_conf: dict[str, str] | None = None,
    log_file: str | os.PathLike[str] | None = None,
) -> SparkSession:
    """Return the process-wide Spark session, creating it with txjoin's settings.

    ``extra_conf`` overrides the defaults (e.g. ``spark.sql.shuffle.partitions``).
    Settings are only applied when the session is created: a JVM that is already
    running keeps its static configuration (Java options, UI, where its output
    goes), as in any Spark app. ``log_file``: see :func:`spark_log_file`.
    """
    if master.startswith("local"):
        # A local session needs no external interface; binding to loopback also
        # silences the "hostname resolves to a loopback address" warning.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers otherwise run the first `python3` on PATH, which is not our
    # venv (no confluent-kafka, deltalake...). PySpark 4.2 takes the workers'
    # interpreter from this variable, not from spark.pyspark.python.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Its Python processes import PySpark from the venv, not from pyspark.zip (spark_home);
    # a SPARK_HOME of the user's is theirs (class_archive reads the same).
    if not os.environ.get("SPARK_HOME"):
        os.environ["SPARK_HOME"] = str(spark_home())
    inherited = os.environ.get("PYTHONWARNINGS", "")
    if _WORKER_WARNINGS not in inherited:
        os.environ["PYTHONWARNINGS"] = ",".join(w for w in (inherited, _WORKER_WARNINGS) if w)
    conf = default_conf()
    conf.update(local_fs_conf(master))
    for key, value in (extra_conf or {}).items():
        if key == "spark.driver.extraClassPath" and key in conf:
            value = f"{value}{os.pathsep}{conf[key]}"  # theirs first, txjoin's jar kept
        conf[key] = value
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    if not verbose():
        # When a micro-batch fails inside toPandas (an error in a Python worker, or the
        # query stopped meanwhile), PySpark warns with the whole error, JVM stack trace
        # included, then raises it: the error is reported once, by txjoin, in one line.
        warnings.filterwarnings("ignore", message="toPandas attempted Arrow optimization",
                                category=UserWarning)
    with _jvm_output(log_file), _spark_java_home():
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def spark_log_file(log_file: str | os.PathLike[str] | None = None) -> Path:
    """The file Spark's output goes to: ``log_file``, ``$TXJOIN_SPARK_LOG``, or a temporary one."""
    chosen = log_file or os.environ.get(SPARK_LOG_ENV)
    if chosen:
        return Path(chosen)
    return Path(tempfile.gettempdir()) / f"txjoin-spark-{os.getuid()}.log"


@contextlib.contextmanager
def _jvm_output(log_file: str | os.PathLike[str] | None) -> Iterator[None]:
    """Launch the JVM (if this call does) with its stderr on the log file, unless verbose.

    Nothing changes when stderr already is a file: the caller chose where it goes
    (``2>run.log``, the demo's own log, pytest's capture).
    """
    if (verbose() or SparkContext._gateway is not None  # the JVM's stderr is already chosen
            or stat.S_ISREG(os.fstat(2).st_mode)):
        yield
        return
    path = spark_log_file(log_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.environ[SPARK_LOG_ENV] = str(path)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def _spark_java_home() -> Iterator[None]:
    """``JAVA_HOME`` set to :func:`txjoin.jvm.spark_java_home` while this call launches the
    driver's JVM, and only then: a JVM the process starts later (a Flink peer) keeps its own."""
    home = spark_java_home() if SparkContext._gateway is None else None
    if home is None:
        yield
        return
    saved = os.environ.get("JAVA_HOME")
    os.environ["JAVA_HOME"] = str(home)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("JAVA_HOME", None)
        else:
            os.environ["JAVA_HOME"] = saved


def stop_session() -> None:
    """Stop the process's Spark session, if any, so the next ``get_session`` starts afresh."""
    # getActiveSession is per thread; the instantiated default session is the
    # process-wide one, so a teardown on another thread still finds it.
    spark = SparkSession.getActiveSession() or SparkSession._instantiatedSession
    if spark is not None:
        spark.stop()
