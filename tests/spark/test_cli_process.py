"""``txjoin`` as a user runs it, in a process of its own: output, exit codes, schema drift.

Seed 000's experiment over Kafka: a column added at the source is ignored (and
logged once); a column the job uses is dropped and a row arrives: the job stops
with one line naming the table, column and record, nothing of that batch is
written; once the job file gives the column a default, a restart on the same
checkpoint continues and loses nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.broker import create_topics
from txjoin.bench import produce
from txjoin.delta_tables import read_table
from txjoin.job import load_job
from txjoin.join.oracle import RowChange, SourceTransaction
from txjoin.scenarios.synthesize import Produced, Synthesizer

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
USERS_COLORS = ROOT / "jobs" / "users_colors.py"


def txjoin(*args: str, env: dict[str, str] | None = None,
           timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # A Spark session made in this process (another test's) exports its log file in
    # TXJOIN_SPARK_LOG for its children: a user's shell has none.
    inherited = {k: v for k, v in os.environ.items() if k != "TXJOIN_SPARK_LOG"}
    return subprocess.run([sys.executable, "-m", "txjoin", *args], capture_output=True,
                          text=True, timeout=timeout,
                          env={**inherited, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.fixture(scope="module")
def bootstrap(kafka_broker: str) -> str:
    """The session's broker (tests/conftest.py); this module's topics have their own names."""
    return kafka_broker


def _edit(record: Produced, change: Any) -> Produced:
    assert record.value is not None
    doc = json.loads(record.value)
    change(doc["after"])
    return Produced(record.topic, record.key, json.dumps(doc), record.tx, record.kind,
                    record.table, record.index, record.offset)


def test_schema_drift_on_the_source_is_seed_000s_story_with_a_way_out(
        bootstrap: str, tmp_path: Path) -> None:
    job = load_job(USERS_COLORS)
    synth = Synthesizer(job, prefix="drift")
    records = list(synth.snapshot({"public.users": [{"id": 1, "full_name": "susanna smith"}],
                                   "public.users_favorite_color": []}))
    # ALTER TABLE users ADD new_column VARCHAR; two inserts that fill it.
    for user_id, name in ((2, "fred smith"), (3, "sally")):
        tx = synth.transaction(SourceTransaction(f"add{user_id}", [
            RowChange("insert", "public.users", {"id": user_id, "full_name": name})]))
        records += [_edit(r, lambda row: row.update(new_column="value for new column"))
                    if r.kind == "data" else r for r in tx]
    # ALTER TABLE users DROP COLUMN full_name; then an insert.
    tx = synth.transaction(SourceTransaction("drop", [
        RowChange("insert", "public.users", {"id": 4, "full_name": "-"})]))
    dropped = next(r for r in tx if r.kind == "data")
    records += [_edit(r, lambda row: row.pop("full_name")) if r is dropped else r for r in tx]
    create_topics(bootstrap, list(synth.topics))
    produce(bootstrap, [(r.topic, r.key, r.value) for r in records])

    spark_log = tmp_path / "spark.log"
    args = ["--bootstrap-servers", bootstrap, "--topic-prefix", "drift", "--until-idle",
            "--no-postgres", "--checkpoint-dir", str(tmp_path / "checkpoints"),
            "--output-dir", str(tmp_path / "output"), "--master", "local[1]"]
    env = {"TXJOIN_SPARK_LOG": str(spark_log)}
    failed = txjoin("run", str(USERS_COLORS), *args, env=env)
    assert failed.returncode == 2, failed.stderr[-2000:]
    assert failed.stderr.count("\n") == 1, failed.stderr[-2000:]
    line = failed.stderr
    assert line.startswith("error: ") and "Traceback" not in line and "\tat " not in line
    assert f"drift.public.users[0]@{dropped.offset}" in line
    assert "public.users.full_name" in line and "dropped or renamed" in line
    assert "defaults={'full_name': None}" in line and "same checkpoint" in line
    current = tmp_path / "output" / "users_full_name_and_favorite_color" / "current"
    written = read_table(current).to_pylist() if current.exists() else []
    assert {r["id"] for r in written} <= {1}, "nothing of the failed batch is written"
    log = spark_log.read_text()
    assert log.count("has column 'new_column' that the job does not declare: ignored") == 1

    # The documented way out: the job gives the dropped column a default; same checkpoint.
    fixed = tmp_path / "users_colors.py"
    fixed.write_text(USERS_COLORS.read_text().replace(
        'Table("public.users", {"id": "int", "full_name": "text"})',
        'Table("public.users", {"id": "int", "full_name": "text"}, defaults={"full_name": None})'))
    resumed = txjoin("run", str(fixed), *args, env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert resumed.stderr == ""
    rows = sorted(read_table(current).to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["full_name"]) for r in rows] == [
        (1, "susanna smith"), (2, "fred smith"), (3, "sally"), (4, None)]


def test_an_unreachable_broker_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = txjoin("run", str(USERS_COLORS), "--bootstrap-servers", "127.0.0.1:1", "--until-idle",
                  "--no-postgres", "--checkpoint-dir", str(tmp_path / "checkpoints"),
                  "--output-dir", str(tmp_path / "output"), "--master", "local[1]",
                  env={"TXJOIN_SPARK_LOG": str(tmp_path / "spark.log")})
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert done.stderr.startswith("error: kafka: cannot reach the Kafka brokers at "
                                  "'127.0.0.1:1'")
    assert "check that the broker runs" in done.stderr
    assert not (tmp_path / "spark.log").exists(), "refused before the Spark session starts"


# -- txjoin replay as a process -------------------------------------------------------------

SCENARIO = ROOT / "scenarios" / "torn_transaction.yaml"
ABORT = "terminate called without an active exception\n"


def test_consecutive_replays_exit_0_print_only_their_result_and_leave_no_temporary_directory(
        tmp_path: Path) -> None:
    # 20 in a row would take ~10 min here; tests/unit/test_exit.py runs the reading part
    # of the race behind an abort at exit (the cause) 20 times in seconds.
    for _ in range(2):
        done = txjoin("replay", str(SCENARIO), env={"TMPDIR": str(tmp_path)})
        assert ABORT not in done.stderr
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.startswith("torn_transaction  PASS") and done.stdout.count("\n") == 1
        # No Spark or library noise.
        assert done.stderr == "", done.stderr[-2000:]
    # what every run reuses (one a user), nothing of this run's own
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"txjoin-spark-{os.getuid()}-warehouse", f"txjoin-spark-{os.getuid()}.log"]
    assert "WARN" in (tmp_path / f"txjoin-spark-{os.getuid()}.log").read_text()


def test_txjoin_run_reads_two_source_databases_with_a_prefix_override(
        bootstrap: str, tmp_path: Path) -> None:
    """`txjoin run` of seed 000 over two databases: the users prefix from the job's
    Source, the colours one from `--topic-prefix colors=...`; both transaction topics."""
    from txjoin.scenarios.synthesize import SourcesSynthesizer

    job = load_job(ROOT / "jobs" / "users_colors_two_dbs.py")
    prefixes = {"users": "users_db", "colors": "cli_colors"}
    synth = SourcesSynthesizer(job, prefixes)
    records = list(synth.snapshot({
        "public.users": [{"id": 1, "full_name": "susanna smith"}],
        "public.users_favorite_color": [{"id": 1, "user_id": 1, "favorite_color": "red"}]}))
    records += synth.transaction(SourceTransaction("rename", [RowChange(
        "update", "public.users", {"id": 1, "full_name": "sue smith"})], "users"))
    records += synth.transaction(SourceTransaction("green", [RowChange(
        "update", "public.users_favorite_color",
        {"id": 1, "user_id": 1, "favorite_color": "green"})], "colors"))
    create_topics(bootstrap, list(synth.topics))
    produce(bootstrap, [(r.topic, r.key, r.value) for r in records])

    done = txjoin("run", str(ROOT / "jobs" / "users_colors_two_dbs.py"),
                  "--bootstrap-servers", bootstrap, "--topic-prefix", "colors=cli_colors",
                  "--until-idle", "--no-postgres", "--checkpoint-dir",
                  str(tmp_path / "checkpoints"), "--output-dir", str(tmp_path / "output"),
                  "--master", "local[1]")
    assert done.returncode == 0, done.stderr[-2000:]
    table = tmp_path / "output" / "users_full_name_and_favorite_color_two_dbs"
    rows = read_table(table / "current").to_pylist()
    assert [(r["id"], r["full_name"], r["favorite_color"]) for r in rows] == [
        (1, "sue smith", "green")]
    changelog = read_table(table / "changelog").to_pylist()
    # one batch: users' transaction, then colours' (declared order); commit_seq across both
    assert sorted(r["_commit_seq"] for r in changelog) == [0, 1, 2]
    assert sorted(str(r["_source"]) for r in changelog) == ["None", "colors", "users"]
