"""Write the Spark driver's class-data-sharing archive (``txjoin.jvm.class_archive``).

    .venv/bin/python scripts/class_archive.py     # run by scripts/setup.sh

Starts a Spark driver with ``-XX:ArchiveClassesAtExit``, replays one scenario through the
pipeline (a micro-batch with the join's state and a Delta commit), stops the JVM and keeps
the archive it wrote as it exited. Nothing to do when the archive for this ``java`` and
these jars exists. Later drivers (``txjoin run``, ``replay``, the tests' sessions) map the
archived classes instead of loading them: measured here, a driver's session ~3 s sooner.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    from txjoin.jvm import CLASS_ARCHIVE_OPTIONS, class_archive, spark_java

    target = class_archive()
    if target.is_file():
        return 0
    for stale in target.parent.glob("spark-driver-*.jsa*"):
        stale.unlink()
    partial = target.with_name(target.name + ".partial")
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(filter(None, (
        os.environ.get("SPARK_SUBMIT_OPTS"), f"-XX:ArchiveClassesAtExit={partial}",
        CLASS_ARCHIVE_OPTIONS)))
    started = time.monotonic()
    from pyspark import SparkContext

    from txjoin.pipeline.session import get_session
    from txjoin.scenarios.spark_runner import run_scenario_spark
    from txjoin.scenarios.spec import load_scenarios

    spark = get_session("local[2]", app_name="txjoin-class-archive")
    with tempfile.TemporaryDirectory(prefix="txjoin-class-archive-") as work:
        for scenario in load_scenarios([REPO / "scenarios" / "lookup_race.yaml"]):
            run_scenario_spark(spark, scenario, str(Path(work) / scenario.name))
    spark.stop()
    gateway = SparkContext._gateway
    assert gateway is not None
    process = gateway.proc  # type: ignore[attr-defined]
    gateway.shutdown()
    process.stdin.close()  # the JVM exits when its stdin closes, writing the archive
    process.wait(timeout=300)
    if not partial.is_file():
        print(f"no class archive written (java exit {process.returncode})", file=sys.stderr)
        return 1
    partial.rename(target)
    print(f"class archive for Spark drivers (java: {spark_java()}): {target} "
          f"({target.stat().st_size // 2**20} MB, {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
