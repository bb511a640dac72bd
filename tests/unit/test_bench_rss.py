"""``txjoin bench``'s memory figures: which process counts as what."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from txjoin.bench import EXECUTOR, SPARK_SUBMIT, RssSampler


def test_the_driver_jvm_and_executor_jvms_are_told_apart_by_their_main_class(
        tmp_path: Path) -> None:
    # Two children named `java` (an interpreter under that name, as `ps` shows a JVM), one
    # with the driver's main class in its command line and one with an executor's, holding
    # different amounts of memory: each counts where its class says, the executor's never in
    # the driver's figure.
    java = tmp_path / "java"
    java.symlink_to(sys.executable)
    hold = "import sys, time; x = bytearray(int(sys.argv[1]) * 2**20); time.sleep(30)"
    driver = subprocess.Popen([str(java), "-c", hold, "40", SPARK_SUBMIT])
    executor = subprocess.Popen([str(java), "-c", hold, "160", EXECUTOR])
    try:
        with RssSampler() as rss:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and (rss.executors < 150 * 2**20
                                                   or rss.driver_jvm < 30 * 2**20):
                time.sleep(0.2)
    finally:
        for proc in (driver, executor):
            proc.kill()
            proc.wait()
    assert 30 * 2**20 < rss.driver_jvm < 150 * 2**20, rss.driver_jvm
    assert rss.executors > 150 * 2**20, rss.executors
