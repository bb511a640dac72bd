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
from pathlib import Path

from txjoin.errors import ConfigError

JARS_ENV = "TXJOIN_JARS"
REPO_ROOT = Path(__file__).resolve().parents[1]
SETUP_HINT = "run `bash scripts/setup.sh` (it fetches them with mvn) or set $TXJOIN_JARS"


def jars_dir(name: str) -> Path:
    """The folder of one classpath (ConfigError naming what to run if it is missing)."""
    root = Path(os.environ.get(JARS_ENV) or REPO_ROOT / ".jars")
    folder = root / name
    if not folder.is_dir() or not any(folder.iterdir()):
        raise ConfigError(f"txjoin's {name} jars are missing in {folder}: {SETUP_HINT}")
    return folder


def classpath(name: str) -> str:
    """A Java ``-cp`` value holding every jar of ``name``."""
    return f"{jars_dir(name)}/*"


def spark_jars() -> str:
    """The ``spark.jars`` value: every jar of the ``spark`` folder, comma-separated."""
    return ",".join(str(jar) for jar in sorted(jars_dir("spark").glob("*.jar")))
