"""``txjoin bench``'s memory figures: which process counts as what."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Run in a process of its own: the sampler counts every child of its process, and a pytest
# worker may have its own Spark driver JVM running beside this test.
SAMPLE = """
import json, subprocess, sys, time
from txjoin.bench import EXECUTOR, SPARK_SUBMIT, RssSampler
java, = sys.argv[1:]
hold = "import sys, time; x = bytearray(int(sys.argv[1]) * 2**20); time.sleep(30)"
driver = subprocess.Popen([java, "-c", hold, "40", SPARK_SUBMIT])
executor = subprocess.Popen([java, "-c", hold, "160", EXECUTOR])
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
print(json.dumps({"driver_jvm": rss.driver_jvm, "executors": rss.executors}))
"""


def test_the_driver_jvm_and_executor_jvms_are_told_apart_by_their_main_class(
        tmp_path: Path) -> None:
    # Two children named `java` (an interpreter under that name, as `ps` shows a JVM), one
    # with the driver's main class in its command line and one with an executor's, holding
    # different amounts of memory: each counts where its class says, the executor's never in
    # the driver's figure.
    java = tmp_path / "java"
    java.symlink_to(sys.executable)
    done = subprocess.run([sys.executable, "-c", SAMPLE, str(java)], capture_output=True,
                          text=True, timeout=60, check=True)
    rss = json.loads(done.stdout.splitlines()[-1])
    assert 30 * 2**20 < rss["driver_jvm"] < 150 * 2**20, rss
    assert rss["executors"] > 150 * 2**20, rss
