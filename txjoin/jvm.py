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
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

from txjoin.errors import ConfigError
from txjoin.procfs import cpu_seconds, stat_fields

JARS_ENV = "TXJOIN_JARS"
SPARK_JAVA_HOME_ENV = "TXJOIN_SPARK_JAVA_HOME"
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


def stage_probe_jar() -> Path | None:
    """The jar of issue 65's probe of a stateful stage in the JVM (jvm/stageprobe:
    ``txjoin.staged.GroupCount``), compiled by scripts/jars.sh into ``.jars/stageprobe``, for
    scripts/staged_stage_cost.py; None without it."""
    return next(iter(sorted((jars_root() / "stageprobe").glob("txjoin-stageprobe-*.jar"))), None)


def submit_jar() -> Path:
    """The jar of txjoin's launcher for a standalone master's cluster mode (jvm/submit:
    ``txjoin.submit.PythonDriver``), compiled by scripts/jars.sh into ``.jars/submit``;
    ConfigError saying what to run when it is missing (it needs a JDK's ``javac``)."""
    jar = next(iter(sorted((jars_root() / "submit").glob("txjoin-submit-*.jar"))), None)
    if jar is None:
        raise ConfigError(f"txjoin's launcher jar for spark-submit on a standalone master is "
                          f"missing in {jars_root() / 'submit'}: {SETUP_HINT} (with a JDK's "
                          f"javac on PATH)")
    return jar


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


# -- the Spark driver's JDK ----------------------------------------------------------------

JDK_ROOTS = (Path("/usr/lib/jvm"),)
"""Where Debian's and Ubuntu's JDK packages (OpenJDK's, Temurin's) install: looked in for a
newer JDK than the ``java`` on PATH."""


def java_version(home: Path) -> tuple[int, ...] | None:
    """A JDK's version from its ``release`` file (``JAVA_VERSION="25.0.3"``); None without one."""
    try:
        text = (home / "release").read_text()
    except OSError:
        return None
    found = re.search(r'^JAVA_VERSION="([0-9]+(?:\.[0-9]+)*)', text, re.MULTILINE)
    return tuple(int(part) for part in found.group(1).split(".")) if found else None


SPARK_JAVA = {17: (17,), 21: (21,), 25: (25, 0, 3)}
"""The Java releases Spark 4.2 runs on, each from its least version: 25 from 25.0.3 (Spark
deprecates earlier 25s for a G1 data corruption, SPARK-55852)."""


def spark_supports(version: tuple[int, ...]) -> bool:
    """Whether Spark 4.2 runs on this Java (``SPARK_JAVA``)."""
    least = SPARK_JAVA.get(version[0])
    return least is not None and version >= least


def _releases() -> str:
    """``SPARK_JAVA``'s releases in words: "17, 21 or 25"."""
    *first, last = map(str, SPARK_JAVA)
    return f"{', '.join(first)} or {last}" if first else last


def spark_java_home() -> Path | None:
    """The JDK a Spark driver txjoin starts runs on (its ``JAVA_HOME`` as it starts; the local
    stack's broker and Kafka Connect keep the ``java`` on PATH).

    ``$TXJOIN_SPARK_JAVA_HOME`` if set (ConfigError if it holds no ``bin/java``); else none
    where ``$JAVA_HOME`` is set (Spark takes that, as always); else the newest JDK under
    ``JDK_ROOTS`` that Spark supports, if it is newer than the ``java`` on PATH (none when
    that one's version cannot be read: it stays, as Spark would take it). On these
    machines that is Temurin 25 beside OpenJDK 17: a driver on 25 spent a quarter less CPU
    in its JIT compiler in ``txjoin demo``'s timed window (docs/benchmarks.md, "The Spark
    driver on Java 25"). None: the ``java`` on PATH."""
    chosen = os.environ.get(SPARK_JAVA_HOME_ENV)
    if chosen:
        if not (Path(chosen) / "bin" / "java").is_file():
            raise ConfigError(f"${SPARK_JAVA_HOME_ENV} is {chosen!r}, which has no bin/java: "
                              f"set it to a JDK's folder (Java {_releases()}) or unset it")
        return Path(chosen)
    if os.environ.get("JAVA_HOME"):
        return None
    on_path = shutil.which("java")
    current = java_version(Path(on_path).resolve().parents[1]) if on_path else None
    if on_path is not None and current is None:
        return None
    best: tuple[tuple[int, ...], Path] | None = None
    for root in JDK_ROOTS:
        try:
            homes = sorted(root.iterdir())
        except OSError:
            continue
        for home in homes:
            version = java_version(home)
            if (version is not None and spark_supports(version)
                    and (home / "bin" / "java").is_file()
                    and (best is None or version > best[0])):
                best = (version, home)
    if best is None or (current is not None and best[0] <= current):
        return None
    return best[1]


def spark_java() -> Path:
    """The ``java`` binary a Spark driver runs (see :func:`spark_java_home`), resolved."""
    home = spark_java_home() or (Path(os.environ["JAVA_HOME"]) if os.environ.get("JAVA_HOME")
                                 else None)
    java = home / "bin" / "java" if home is not None else Path(shutil.which("java") or "java")
    return java.resolve()


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
    was made from (the driver's ``java``, :func:`spark_java`; pyspark's and txjoin's
    jars), so a changed one is a missing archive, not a stale one."""
    import hashlib

    import pyspark

    java = spark_java()
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
    seconds = 0.0
    for thread in threads:
        try:
            if COMPILER_THREAD not in (thread / "comm").read_text():
                continue
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat_fields(thread / "stat")
        if fields is not None:
            seconds += cpu_seconds(fields)
    return seconds
