"""Where a job's files may live (``txjoin.api.resolve_paths``) and the spark-submit line that
runs it (``txjoin submit-line``, ``txjoin package``); the line itself, with the archive, runs in
tests/e2e/test_cluster.py, whose driver the master restarts."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from txjoin.api import resolve_paths
from txjoin.cli import main
from txjoin.errors import ConfigError
from txjoin.pipeline.pipeline import RunConfig
from txjoin.procfs import STAT_STATE, stat_fields
from txjoin.submit import LAUNCHER_CLASS

ORDERS = Path(__file__).resolve().parents[2] / "jobs" / "orders.py"
SUBMIT_PY = Path(__file__).resolve().parents[2] / "txjoin" / "submit.py"


def test_a_file_uri_is_its_path_and_a_plain_path_is_kept() -> None:
    config = resolve_paths(RunConfig(checkpoint_dir="file:///mnt/shared/my%20ckpt",
                                     output_dir="/mnt/shared/out"), "cluster")
    assert (config.checkpoint_dir, config.output_dir) == ("/mnt/shared/my ckpt",
                                                          "/mnt/shared/out")
    relative = RunConfig(checkpoint_dir=".txjoin/checkpoints", output_dir="out")
    assert resolve_paths(relative) is relative  # client mode: the driver's directory stays


@pytest.mark.parametrize("path", ["hdfs://nn:8020/txjoin", "s3a://bucket/txjoin",
                                  "abfss://c@account.dfs.core.windows.net/txjoin"])
def test_a_scheme_other_than_file_is_refused_in_one_line_not_mangled(path: str) -> None:
    scheme = path.split(":", 1)[0]
    with pytest.raises(ConfigError) as info:
        resolve_paths(RunConfig(checkpoint_dir=path))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"--checkpoint-dir {path}: txjoin keeps its checkpoint")
    assert f"{scheme}: is not supported: mount the storage and pass the mount's path" in message


def test_a_relative_path_is_refused_in_cluster_mode_saying_why() -> None:
    with pytest.raises(ConfigError, match=r"^--output-dir out is relative: in cluster deploy "
                                          r"mode the driver runs in a new working directory "
                                          r"on each start"):
        resolve_paths(RunConfig(checkpoint_dir="/mnt/c", output_dir="out"), "cluster")


def test_submit_line_is_a_supervised_cluster_submission_of_the_launcher(tmp_path: Path) -> None:
    done = CliRunner().invoke(main, [
        "submit-line", "--master", "spark://10.0.0.5:7077", str(ORDERS),
        "--checkpoint-dir", "/mnt/shared/ckpt", "--output-dir", "file:///mnt/shared/out",
        "--bootstrap-servers", "broker:9092", "--shards", "4"])
    assert done.exit_code == 0, done.output
    words = shlex.split(done.output)
    assert words[:8] == ["spark-submit", "--master", "spark://10.0.0.5:7077",
                         "--deploy-mode", "cluster", "--supervise", "--name", "txjoin-orders"]
    conf = dict(words[i + 1].split("=", 1) for i, w in enumerate(words) if w == "--conf")
    assert conf["spark.pyspark.python"] == sys.executable
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert "SharedArchiveFile" not in conf["spark.driver.extraJavaOptions"]  # this machine's
    jars = words[words.index("--jars") + 1].split(",")
    assert any("delta-spark" in jar for jar in jars), jars
    launcher = words.index("--class")
    assert words[launcher + 1] == LAUNCHER_CLASS
    assert Path(words[launcher + 2]).name.startswith("txjoin-submit-")
    assert words[launcher + 3:] == [str(SUBMIT_PY), str(ORDERS), "--checkpoint-dir",
                                    "/mnt/shared/ckpt", "--output-dir",
                                    "file:///mnt/shared/out", "--bootstrap-servers",
                                    "broker:9092", "--shards", "4"]


@pytest.mark.parametrize("args, error", [
    (["--checkpoint-dir", "ckpt", "--output-dir", "/o"], "--checkpoint-dir ckpt is relative"),
    (["--output-dir", "/o"], "submit-line: give --checkpoint-dir (an absolute path"),
    (["--checkpoint-dir", "/c", "--output-dir", "/o", "--master", "local[2]"],
     "submit-line: --master is spark-submit's"),
    (["--checkpoint-dir", "/c", "--output-dir", "/o", "--shard", "2"],
     "Error: No such option '--shard'. Did you mean '--shards'?"),
])
def test_submit_line_refuses_what_the_submitted_run_would(args: list[str], error: str) -> None:
    done = CliRunner().invoke(main, ["submit-line", "--master", "spark://h:7077", str(ORDERS),
                                     *args])
    assert done.exit_code == 2, done.output
    assert error in done.output


def test_submit_line_on_yarn_needs_the_environment_archive() -> None:
    done = CliRunner().invoke(main, ["submit-line", "--master", "yarn", str(ORDERS),
                                     "--checkpoint-dir", "/c", "--output-dir", "/o"])
    assert done.exit_code == 2
    assert "on YARN or Kubernetes spark-submit runs txjoin/submit.py itself" in done.output
    assert "`txjoin package` and pass --archive" in done.output


def _conf(words: list[str]) -> dict[str, str]:
    return dict(words[i + 1].split("=", 1) for i, w in enumerate(words) if w == "--conf")


def test_with_an_archive_the_standalone_executors_run_its_interpreter(tmp_path: Path) -> None:
    archive = tmp_path / "txjoin-env.tar.gz"
    archive.write_bytes(b"")
    done = CliRunner().invoke(main, [
        "submit-line", "--master", "spark://h:7077", "--archive", str(archive),
        "--python", "/opt/txjoin/bin/python", str(ORDERS),
        "--checkpoint-dir", "/mnt/c", "--output-dir", "/mnt/o"])
    assert done.exit_code == 0, done.output
    words = shlex.split(done.output)
    assert words[words.index("--archives") + 1] == f"{archive}#env"
    conf = _conf(words)
    assert conf["spark.pyspark.python"] == "./env/bin/python"  # unpacked in an executor's cwd
    assert conf["spark.pyspark.driver.python"] == "/opt/txjoin/bin/python"
    assert "--supervise" in words
    assert words[words.index("--class") + 1] == LAUNCHER_CLASS


def test_on_yarn_the_application_is_the_launcher_file_and_the_job_goes_with_files(
        tmp_path: Path) -> None:
    archive = tmp_path / "env.tgz"
    archive.write_bytes(b"")
    done = CliRunner().invoke(main, [
        "submit-line", "--master", "yarn", "--archive", str(archive), str(ORDERS),
        "--checkpoint-dir", "/mnt/c", "--output-dir", "/mnt/o", "--shards", "4"])
    assert done.exit_code == 0, done.output
    words = shlex.split(done.output)
    assert words[:6] == ["spark-submit", "--master", "yarn", "--deploy-mode", "cluster",
                         "--name"]
    assert "--supervise" not in words and "--class" not in words  # standalone's only
    assert words[words.index("--files") + 1] == str(ORDERS)
    conf = _conf(words)
    assert conf["spark.pyspark.python"] == "./env/bin/python"  # the driver's too
    assert "spark.pyspark.driver.python" not in conf
    assert words[-8:] == [str(SUBMIT_PY), "orders.py", "--checkpoint-dir", "/mnt/c",
                          "--output-dir", "/mnt/o", "--shards", "4"]


@pytest.mark.parametrize("args, error", [
    (["--master", "yarn"], "package: give both --master and JOB_FILE"),
    ([str(ORDERS), "--checkpoint-dir", "/c", "--output-dir", "/o"],
     "package: give both --master and JOB_FILE"),
    (["--master", "yarn", str(ORDERS), "--output-dir", "/o"],
     "package: give --checkpoint-dir (an absolute path"),
    (["--out", "env.rar"], "--out env.rar: an archive's name ends with one of .tar.gz, .tgz"),
])
def test_package_refuses_before_building(args: list[str], error: str) -> None:
    done = CliRunner().invoke(main, ["package", *args])
    assert done.exit_code == 2, done.output
    assert error in done.output
    assert "\n" not in done.output.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_python_driver_dies_with_the_process_that_started_it() -> None:
    """A driver JVM killed with kill -9 takes its Python driver along (txjoin.submit), so no
    Delta committer of the dead driver writes beside the restarted one."""
    import os
    import signal
    import subprocess
    import time

    # the parent stands in for the driver JVM: it starts the "Python driver" and waits
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'from txjoin.submit import "
        "_die_with_parent; _die_with_parent(); print(1, flush=True); import time; "
        "time.sleep(120)'], stdout=subprocess.PIPE)\n"
        "child.stdout.readline()\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(10)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and "Z" not in _state(child):
        assert time.monotonic() < deadline, "the child outlived its parent"
        time.sleep(0.05)


def _state(pid: int) -> str:
    fields = stat_fields(pid)
    return "gone" if fields is None else fields[STAT_STATE]


def test_the_driver_of_a_standalone_cluster_finds_env_as_its_own_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark starts Python processes beside the driver too (a query's pre-init runner) with
    the executors' ``./env/bin/python``; a standalone worker unpacks no archive there."""
    from txjoin.submit import _env_beside_the_driver

    monkeypatch.chdir(tmp_path)
    _env_beside_the_driver(sys.executable)  # no archive: nothing made
    assert not (tmp_path / "env").exists()
    _env_beside_the_driver("./env/bin/python")
    assert (tmp_path / "env").resolve() == Path(sys.prefix).resolve()
    assert (tmp_path / "env" / "bin" / "python").exists()
    _env_beside_the_driver("./env/bin/python")  # there already (YARN unpacked it): kept
