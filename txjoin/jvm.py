"""Where txjoin's JVM jars are: one folder per classpath, filled by ``scripts/jars.sh``.

The versions are pinned in ``jvm/<name>/pom.xml`` and fetched with ``mvn`` into the
git-ignored ``.jars/`` of the checkout (or ``$TXJOIN_JARS``):

- ``spark``: added to pyspark's own jars through ``spark.jars`` (Spark's ``kafka`` source
  and delta-spark, without their transitive trees, so pyspark's jackson/parquet/hadoop win);
- ``kafka``: the Apache Kafka broker of the local stack;
- ``connect``: Kafka Connect's worker; ``connect-plugins``: the Debezium connector plugin.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from txjoin.errors import ConfigError

JARS_ENV = "TXJOIN_JARS"
STACK_JAVA_OPTIONS_ENV = "TXJOIN_STACK_JAVA_OPTIONS"
REPO_ROOT = Path(__file__).resolve().parents[1]
SETUP_HINT = "run `bash scripts/setup.sh` (it fetches them with mvn) or set $TXJOIN_JARS"


def jars_dir(name: str) -> Path:
    """The folder of one classpath (ConfigError naming what to run if it is missing)."""
    root = Path(os.environ.get(JARS_ENV) or REPO_ROOT / ".jars")
    folder = root / name
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
    spark_home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    try:
        jars = spark_jars()
    except ConfigError:
        jars = ""
    made_of = [str(java), str(java.stat().st_mtime_ns) if java.exists() else "",
               pyspark.__version__, str(spark_home), jars]
    digest = hashlib.sha256("\n".join(made_of).encode()).hexdigest()[:16]
    root = Path(os.environ.get(JARS_ENV) or REPO_ROOT / ".jars")
    return root / f"spark-driver-{digest}.jsa"


def class_archive_options() -> str:
    """Java options of a Spark driver: the class archive's when it exists, else none."""
    archive = class_archive()
    return f"-XX:SharedArchiveFile={archive} {CLASS_ARCHIVE_OPTIONS}" if archive.is_file() else ""
