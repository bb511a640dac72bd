"""Where txjoin's JVM jars are: one folder per classpath, filled by ``scripts/jars.sh``.

The versions are pinned in ``jvm/<name>/pom.xml`` and fetched with ``mvn`` into the
git-ignored ``.jars/`` of the checkout (or ``$TXJOIN_JARS``):

- ``spark``: added to pyspark's own jars through ``spark.jars`` (Spark's ``kafka`` source
  and delta-spark, without their transitive trees, so pyspark's jackson/parquet/hadoop win);
- ``kafka``: the Apache Kafka broker of the local stack;
- ``connect``: Kafka Connect's worker; ``connect-plugins``: the Debezium connector plugin.

Also what a running driver JVM's JIT compiler has used (:func:`compiler_cpu_seconds`),
which ``txjoin demo`` reports for its timed window.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from txjoin.errors import ConfigError

JARS_ENV = "TXJOIN_JARS"
STACK_JAVA_OPTIONS_ENV = "TXJOIN_STACK_JAVA_OPTIONS"
REPO_ROOT = Path(__file__).resolve().parents[1]
SETUP_HINT = "run `bash scripts/setup.sh` (it fetches them with mvn) or set $TXJOIN_JARS"


def jars_root() -> Path:
    """Where the jars' folders are (and what setup makes beside them): ``$TXJOIN_JARS``, else
    the checkout's ``.jars``."""
    return Path(os.environ.get(JARS_ENV) or REPO_ROOT / ".jars")


def jars_dir(name: str) -> Path:
    """The folder of one classpath (ConfigError naming what to run if it is missing)."""
    folder = jars_root() / name
    if not folder.is_dir() or not any(folder.iterdir()):
        raise ConfigError(f"txjoin's {name} jars are missing in {folder}: {SETUP_HINT}")
    return folder


def stack_java_options() -> list[str]:
    """Extra options for the local stack's broker and Kafka Connect JVMs, from
    ``$TXJOIN_STACK_JAVA_OPTIONS`` (shell words, after txjoin's own heap and collector
    options, so they win where both set one; not a second collector). The test suite compiles
    them with C1 only: its stacks live minutes on little data."""
    return shlex.split(os.environ.get(STACK_JAVA_OPTIONS_ENV, ""))


def classpath(name: str) -> str:
    """A Java ``-cp`` value holding every jar of ``name``."""
    return f"{jars_dir(name)}/*"


def spark_jars() -> str:
    """The ``spark.jars`` value: every jar of the ``spark`` folder, comma-separated."""
    return ",".join(str(jar) for jar in sorted(jars_dir("spark").glob("*.jar")))


def local_fs_jar() -> Path | None:
    """The jar of txjoin's Hadoop local file system (jvm/localfs), which scripts/jars.sh
    compiles into ``.jars/localfs`` when a JDK's ``javac`` is at hand; None without it."""
    return next(iter(sorted((jars_root() / "localfs").glob("txjoin-localfs-*.jar"))), None)


def local_fs_conf(master: str) -> dict[str, str]:
    """Spark settings for txjoin's Hadoop local file system (jvm/localfs), when built.

    Without Hadoop's native library (pip's pyspark has none), Hadoop starts a ``chmod``
    process for every file and directory it creates on a ``file:`` path and a ``readlink``
    process to tell a link: ~50 processes from the driver per micro-batch (checkpoint, state
    store, Delta's log). txjoin's file system does both in Java, with the same outcome. The
    jar is on every driver's class path (one class archive fits them all); ``file:`` paths
    use it only with a ``local`` master, whose tasks run in the driver: a cluster's
    executors have no such jar."""
    jar = local_fs_jar()
    if jar is None:
        return {}
    conf = {"spark.driver.extraClassPath": str(jar)}
    if master == "local" or master.startswith("local["):  # not local-cluster[...]
        conf["spark.hadoop.fs.file.impl"] = "txjoin.hadoop.NioLocalFileSystem"
        conf["spark.hadoop.fs.AbstractFileSystem.file.impl"] = "txjoin.hadoop.NioLocalFs"
    return conf


# -- the SPARK_HOME txjoin's sessions start from -----------------------------------------------

SPARK_HOME_PARTS = ("bin", "jars", "sbin")
"""What of pip's pyspark a ``SPARK_HOME`` needs to start Spark here (local sessions and a
standalone cluster): the launch scripts and the jars."""


def spark_home() -> Path:
    """``SPARK_HOME`` for txjoin's Spark processes: pip's pyspark without ``python/lib``.

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on the path of
    every Python process it starts (workers, data source planners, a query's pre-init
    process), so they import PySpark from the zip: pip ships it as sources only (compiled
    again in each process), and each new worker's first task re-reads the zip's directory
    once per package imported from it (``importlib.invalidate_caches`` in PySpark's
    ``setup_spark_files``: 14 readers of a 1,200-module zip, ~0.27 s of CPU). This home
    is links to pyspark's ``bin``, ``jars`` and ``sbin`` in a folder beside the jars
    (made once, named after the pyspark it points at), without those zips, so the
    processes import the same PySpark from the venv, compiled by pip. Pyspark's own
    folder when no such folder can be made there."""
    import hashlib
    import shutil
    import tempfile

    import pyspark

    real = Path(pyspark.__file__).resolve().parent
    root = jars_root()
    digest = hashlib.sha256(f"{real}\n{pyspark.__version__}".encode()).hexdigest()[:12]
    home = root / f"spark-home-{digest}"
    if home.is_dir():
        return home
    try:
        root.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f"{home.name}.", dir=root))
        partial.chmod(0o755)
        for part in SPARK_HOME_PARTS:
            (partial / part).symlink_to(real / part, target_is_directory=True)
    except OSError:
        return real
    try:
        partial.rename(home)
    except OSError:  # made meanwhile by another process
        shutil.rmtree(partial, ignore_errors=True)
    return home if home.is_dir() else real


# -- the Spark driver's class-data-sharing archive ---------------------------------------------

CLASS_ARCHIVE_OPTIONS = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"
"""With an archive: use it when it matches this JVM and classpath, else start as without it,
silently (the JVM checks; a stale or damaged archive is ignored, never an error)."""


def class_archive() -> Path:
    """Where the class-data-sharing archive of Spark's driver JVM is (``scripts/setup.sh``
    writes it with ``scripts/class_archive.py``): the classes a driver loads to start
    Spark, plan and run a micro-batch and commit to Delta, stored parsed and verified so
    the next JVM maps them instead of loading them from the jars (a driver started ~3 s
    sooner here, a first job 1.5 s sooner: docs/benchmarks.md). Its name holds what it
    was made from (the ``java`` binary, pyspark's and txjoin's jars), so a changed one
    is a missing archive, not a stale one."""
    import hashlib
    import shutil

    import pyspark

    java = Path(shutil.which("java") or "java").resolve()
    home = Path(os.environ.get("SPARK_HOME") or spark_home())
    try:
        jars = spark_jars()
    except ConfigError:
        jars = ""
    made_of = [str(java), str(java.stat().st_mtime_ns) if java.exists() else "",
               pyspark.__version__, str(home), jars, str(local_fs_jar() or "")]
    digest = hashlib.sha256("\n".join(made_of).encode()).hexdigest()[:16]
    return jars_root() / f"spark-driver-{digest}.jsa"


def class_archive_options() -> str:
    """Java options of a Spark driver: the class archive's when it exists, else none."""
    archive = class_archive()
    return f"-XX:SharedArchiveFile={archive} {CLASS_ARCHIVE_OPTIONS}" if archive.is_file() else ""


COMPILER_THREAD = "CompilerThre"
"""How HotSpot's JIT compiler threads name themselves in Linux (``C1 CompilerThre``,
``C2 CompilerThre``: the 15-character ``comm`` of "C2 CompilerThread0")."""


def jvm_pid(spark: Any) -> int | None:
    """The process id of a local session's JVM (the driver), if it says."""
    try:
        return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    except Exception:  # not a classic local session, or its gateway is gone
        return None


def compiler_cpu_seconds(pid: int, proc: Path = Path("/proc")) -> float | None:
    """CPU seconds (user + system) the JIT compiler threads of JVM ``pid`` have used so far,
    read from Linux's ``/proc``; None where there is no such process or no ``/proc``.

    A new Spark driver compiles its per-batch code for minutes: on 2 cores, 90 s into
    ``txjoin demo`` its compiler threads used ~47% of a core, ~16% after 4 min
    (docs/benchmarks.md, "The driver's JIT in the timed window")."""
    tasks = proc / str(pid) / "task"
    try:
        threads = list(tasks.iterdir())
    except OSError:
        return None
    ticks = 0
    for thread in threads:
        try:
            if COMPILER_THREAD not in (thread / "comm").read_text():
                continue
            # after the command name in parentheses: state, then 10 fields, utime, stime
            fields = (thread / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")
