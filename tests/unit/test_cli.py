"""The command line: one line per user error, the same exit codes everywhere, --verbose.

Exit codes: 0 ok, 1 a check failed, 2 a usage, configuration or data error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from txjoin.cli import main
from txjoin.errors import VERBOSE_ENV, ConfigError, DecodeError, ServiceError, user_error

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "lookup_race.yaml"


@pytest.fixture(autouse=True)
def _not_verbose(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    yield


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


INVALID_SCENARIOS = {
    "not YAML": ("name: x\n  about: [\n", "not valid YAML, column 8"),
    "not UTF-8": (b"\xff\xfe name", "cannot read the scenario file"),
    "a list": ("- 1\n- 2\n", "expected a mapping, got a list"),
    "empty": ("", "the file is empty"),
    "a missing job": (SCENARIO.read_text().replace("../jobs/orders.py", "nothere.py"),
                      "nothere.py does not exist"),
}


@pytest.mark.parametrize("case", sorted(INVALID_SCENARIOS))
def test_an_invalid_scenario_is_one_line_and_exit_2_under_core_only(
        case: str, tmp_path: Path) -> None:
    text, what = INVALID_SCENARIOS[case]
    path = tmp_path / "broken.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    code, out, err = invoke("replay", "--core-only", str(path))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"error: {path}") and what in err, err


def test_a_passing_scenario_under_core_only_exits_0_and_a_failing_one_1(tmp_path: Path) -> None:
    code, out, _ = invoke("replay", "--core-only", str(SCENARIO))
    assert code == 0 and out.startswith("lookup_race  PASS")
    wrong = tmp_path / "wrong.yaml"
    text = SCENARIO.read_text().replace("../jobs/orders.py", str(ROOT / "jobs" / "orders.py"))
    wrong.write_text(text.replace("client_name: Leo, ", "client_name: Leonardo, "))
    code, out, _ = invoke("replay", "--core-only", str(wrong))
    assert code == 1 and "FAIL" in out


def test_a_bad_job_file_for_run_is_one_line_and_exit_2(tmp_path: Path) -> None:
    job = tmp_path / "typo.py"
    job.write_text("from txjoin.job import Jobb\n")
    code, _, err = invoke("run", str(job), "--bootstrap-servers", "127.0.0.1:1", "--no-postgres")
    assert code == 2
    assert err == f"error: {job}: failed to import: ImportError: cannot import name 'Jobb' " \
                  f"from 'txjoin.job' ({ROOT / 'txjoin' / 'job.py'})\n"


def test_a_usage_error_exits_2() -> None:
    code, _, err = invoke("run", str(ROOT / "jobs" / "orders.py"), "--decimal-handling-mode",
                          "exact")
    assert code == 2 and "'exact' is not one of" in err


def test_verbose_adds_the_traceback_to_the_one_line(tmp_path: Path) -> None:
    job = tmp_path / "typo.py"
    job.write_text("from txjoin.job import Jobb\n")
    args = ["run", str(job), "--bootstrap-servers", "127.0.0.1:1", "--no-postgres"]
    quiet = CliRunner().invoke(main, args)
    loud = CliRunner().invoke(main, ["--verbose", *args])
    assert "Traceback" not in quiet.stderr
    assert loud.exit_code == quiet.exit_code == 2
    assert "Traceback (most recent call last)" in loud.stderr
    assert loud.stderr.endswith(quiet.stderr)


def test_errors_of_every_command_are_reported_by_the_group() -> None:
    # A command that does not use cli_errors itself (as bench, verify or demo).
    @main.command("fails-for-test")
    def fails() -> None:
        raise ServiceError("the broker at 127.0.0.1:1 is unreachable; start it")

    try:
        code, _, err = invoke("fails-for-test")
    finally:
        main.commands.pop("fails-for-test")
    assert (code, err) == (2, "error: the broker at 127.0.0.1:1 is unreachable; start it\n")


def test_user_errors_are_recognised_bugs_are_not() -> None:
    assert isinstance(user_error(FileNotFoundError(2, "No such file", "x.py")), ConfigError)
    assert isinstance(user_error(ConnectionRefusedError(111, "Connection refused")), ConfigError)
    drift = DecodeError("public.users.full_name: the job declares column 'full_name' ...",
                        topic="shop.public.users", partition=0, offset=7)
    assert user_error(drift) is drift and drift.exit_code == 2
    wrapped = Exception(f"[STREAM_FAILED] Query terminated with exception: Traceback ...\n"
                        f"txjoin.errors.DecodeError: {drift}\n\tat org.apache.spark.X")
    recovered = user_error(wrapped)
    assert isinstance(recovered, DecodeError) and str(recovered) == str(drift)
    assert user_error(KeyError("a bug")) is None
    assert user_error(click.UsageError("no")) is None


def test_the_real_process_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("- 1\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "txjoin", "replay", "--core-only", str(broken)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert done.stderr == f"error: {broken}:1: : expected a mapping, got a list\n"


TWO_DBS_JOB = Path(__file__).resolve().parents[2] / "jobs" / "users_colors_two_dbs.py"


@pytest.mark.parametrize(("prefixes", "what"), [
    (["shop"], "reads several source databases (users, colors)"),
    (["nope=x"], "the job has no source 'nope'"),
    (["users=same", "colors=same"], "two sources share a topic prefix"),
])
def test_a_wrong_topic_prefix_for_a_two_database_job_is_one_line_and_exit_2(
        prefixes: list[str], what: str, tmp_path: Path) -> None:
    args = ["run", str(TWO_DBS_JOB), "--bootstrap-servers", "127.0.0.1:1", "--no-postgres",
            "--dir", str(tmp_path)]
    for prefix in prefixes:
        args += ["--topic-prefix", prefix]
    code, _out, err = invoke(*args)
    assert code == 2
    assert err.count("\n") == 1 and what in err, err


def test_bench_refuses_an_also_job_over_other_tables_before_starting_anything() -> None:
    jobs = Path(__file__).resolve().parents[2] / "jobs"
    code, _, err = invoke("bench", "--also-job", str(jobs / "order_lines.py"))
    assert code == 2
    assert err.startswith(f"error: --also-job {jobs / 'order_lines.py'}: reads ")
    assert "public.order_lines" in err and "the benchmark's workload is the pizzeria's" in err
    code, _, err = invoke("bench", "--also-job", str(jobs / "orders_totals.py"), "--peer",
                          "flink")
    assert code == 2 and "--also-job runs with the kafka and replay sources" in err


def test_bench_refuses_api_vs_run_without_the_broker_before_starting_anything() -> None:
    code, _, err = invoke("bench", "--api-vs-run", "--source", "replay")
    assert code == 2 and err.count("\n") == 1, err
    assert "--api-vs-run reads through the broker" in err and "--source kafka" in err


def test_a_run_prints_each_batchs_seconds_last_on_its_line() -> None:
    """bench --api-vs-run reads a batch's seconds from the end of run's batch line."""
    from click.testing import CliRunner

    from txjoin.pipeline.pipeline import BatchReport
    from txjoin.pipeline.run import print_report

    report = BatchReport(batch_id=3, records=10, changes=2, commit_seq=4, snapshot_done=True,
                         snapshot_released=True, waiting=1, transactions_released=2,
                         written={"delta": True, "postgres": False}, seconds=1.234)
    runner = CliRunner()
    with runner.isolation() as (out, _, _):
        print_report(report)
        line = out.getvalue().decode().strip()
    assert line.startswith("batch 3: 10 records, 2 transactions released") and \
        line.endswith("1 waiting; 1.23 s"), line


def test_a_failed_jvm_call_is_told_by_what_the_jvm_said() -> None:
    """py4j's first line names only the call (a Delta write failing in the committer: the
    real one in tests/spark/test_kill.py); the line is the Java exception's message."""
    from txjoin.errors import _java_cause

    text = ("An error occurred while calling o213.save.\n: org.apache.spark.sql.delta.schema."
            "DeltaInvariantViolationException: [DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK "
            "constraint stop (_commit_seq <= 40) violated by row with values:\n - _commit_seq "
            ": 41\n\tat org.apache.spark.sql.delta.X(X.scala:1)")
    assert _java_cause(text) == ("[DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK constraint stop "
                                 "(_commit_seq <= 40) violated by row with values:")
    assert _java_cause("[TABLE_OR_VIEW_NOT_FOUND] x\nmore") == "[TABLE_OR_VIEW_NOT_FOUND] x"
    assert _java_cause("An error occurred while calling o1.x.\n: java.io.IOException") == \
        "java.io.IOException"


@pytest.mark.parametrize(("given", "limit"), [((), 100_000), (("--max-events-per-trigger",
                                                               "0"), None),
                                               (("--max-events-per-trigger", "5000"), 5000)])
def test_run_reads_at_most_100k_records_a_batch_unless_told(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, given: tuple[str, ...],
        limit: int | None) -> None:
    """A backlog read whole is every shard's memory at once (a large snapshot, a
    transaction of millions of changes): the run's read limit is 100,000 records a batch by
    default, and 0 lifts it."""
    import txjoin.pipeline.run

    configs = []
    monkeypatch.setattr(txjoin.pipeline.run, "run_job",
                        lambda job, config, **kwargs: configs.append(config) or [])
    code, out, err = invoke("run", str(ROOT / "jobs" / "orders.py"), "--bootstrap-servers",
                            "localhost:1", "--no-postgres", "--dir", str(tmp_path), *given)
    assert code == 0, out + err
    assert [c.max_events_per_trigger for c in configs] == [limit]
    assert "default: 100000" in " ".join(invoke("run", "--help")[1].split())
