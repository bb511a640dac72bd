"""``txjoin run`` refuses what needs no Spark before starting the Spark session (issue 34).

A sink written from another checkpoint, a checkpoint of another shard count or state
layout: one line, exit 2, and no JVM (tests/unit refuses to start a Spark session,
tests/unit/conftest.py); an unreachable broker: tests/spark/test_cli_process.py. Until
issue 34 each of these started Spark first (5-13 s, ~30 s on a loaded machine), and these
tests failed on that refusal.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from deltalake import CommitProperties, Transaction, write_deltalake

from txjoin.cli import main
from txjoin.errors import VERBOSE_ENV, ConfigError
from txjoin.job import load_job
from txjoin.join.output import output_schema
from txjoin.join.state_log import LAYOUT_VERSION
from txjoin.pipeline.pipeline import LAYOUT_FILE, check_layout
from txjoin.sinks.delta import DeltaSink, stored_schema

ROOT = Path(__file__).resolve().parents[2]
ORDERS = ROOT / "jobs" / "orders.py"


@pytest.fixture(autouse=True)
def _not_verbose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VERBOSE_ENV, raising=False)


def run(tmp_path: Path, *args: str) -> tuple[int, str, float]:
    """``txjoin run jobs/orders.py`` over an empty file archive, Delta sink only."""
    archive = tmp_path / "archive"
    archive.mkdir(exist_ok=True)
    started = time.monotonic()
    result = CliRunner().invoke(main, [
        "run", str(ORDERS), "--dir", str(tmp_path), "--source", f"files:{archive}",
        "--topic-prefix", "fshop", "--no-postgres", "--until-idle", *args])
    return result.exit_code, result.stderr, time.monotonic() - started


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


def test_a_sink_of_another_checkpoint_is_refused_before_spark(tmp_path: Path) -> None:
    job = load_job(ORDERS)
    sink = DeltaSink(str(tmp_path / "output"), job.output.table, job.name,
                     list(job.output.key), output_schema(job))
    # What a run from checkpoint "0123456789abcdef" left: its last batch 4 in the lineage.
    empty = pa.Table.from_pylist([], schema=stored_schema(output_schema(job)))
    write_deltalake(sink.current_path, empty, commit_properties=CommitProperties(
        app_transactions=[Transaction(sink.app_id("current", None), 4)],
        custom_metadata={"txjoin.job": job.name, "txjoin.batch_id": 4,
                         "txjoin.checkpoint": "0123456789abcdef",
                         "txjoin.frontier_commit_seq": 7}))
    (tmp_path / "checkpoints" / job.name / "commits").mkdir(parents=True)
    (tmp_path / "checkpoints" / job.name / "commits" / "0").write_text("v1\n{}\n")
    code, err, seconds = run(tmp_path)
    assert code == 2
    assert "holds batch 4, frontier commit_seq 7 of checkpoint 01234567" in one_line(err)
    assert "run with --rebuild" in err
    print(f"refused in {seconds:.2f} s")


@pytest.mark.parametrize("rebuild", [False, True])
def test_a_sink_table_another_job_wrote_is_refused_naming_that_job(
        tmp_path: Path, rebuild: bool) -> None:
    # Issue 73 item 1: a second job from the same view (trips_asof beside trips) wrote the
    # first one's table, and the refusal spoke of checkpoints and --rebuild only. Its own
    # checkpoint is new here; --rebuild would replace the other job's output: refused too.
    job = load_job(ORDERS)
    sink = DeltaSink(str(tmp_path / "output"), job.output.table, job.name,
                     list(job.output.key), output_schema(job))
    empty = pa.Table.from_pylist([], schema=stored_schema(output_schema(job)))
    write_deltalake(sink.current_path, empty, commit_properties=CommitProperties(
        custom_metadata={"txjoin.job": "orders_current", "txjoin.batch_id": 2,
                         "txjoin.checkpoint": "fedcba9876543210"}))
    code, err, _ = run(tmp_path, *(["--rebuild"] if rebuild else []))
    assert code == 2
    line = one_line(err)
    assert (f"delta sink {sink.root} is job 'orders_current''s output (its lineage names "
            f"that job), not job 'orders''s" in line), line
    assert f"Output(table=...) in {ORDERS}" in line and "--output-table" in line
    assert f"if job 'orders_current' is retired, remove {sink.root}" in line
    assert not (tmp_path / "checkpoints" / job.name / "commits").exists()


def test_a_sink_table_this_job_wrote_is_its_own(tmp_path: Path) -> None:
    job = load_job(ORDERS)
    sink = DeltaSink(str(tmp_path / "output"), job.output.table, job.name,
                     list(job.output.key), output_schema(job))
    assert sink.other_owner() is None  # nothing written yet
    empty = pa.Table.from_pylist([], schema=stored_schema(output_schema(job)))
    write_deltalake(sink.current_path, empty, commit_properties=CommitProperties(
        custom_metadata={"txjoin.job": job.name, "txjoin.batch_id": 0,
                         "txjoin.checkpoint": "fedcba9876543210"}))
    assert sink.other_owner() is None
    assert sink.held() is not None and sink.held().job == job.name  # type: ignore[union-attr]


def test_a_checkpoint_of_another_shard_count_is_refused_before_spark(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoints" / "orders"
    checkpoint.mkdir(parents=True)
    (checkpoint / LAYOUT_FILE).write_text(json.dumps(
        {"layout": LAYOUT_VERSION, "shards": 2, "partitions": 2}))
    code, err, _ = run(tmp_path, "--shards", "4")
    assert code == 2
    assert "was written with --shards 2, not 4: run with --shards 2" in one_line(err)


def test_a_checkpoint_of_an_older_layout_is_refused_before_spark(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "orders" / "offsets").mkdir(parents=True)
    code, err, _ = run(tmp_path)
    assert code == 2
    assert "was written by an older txjoin (state layout 1" in one_line(err)



def test_a_layout_6_checkpoint_is_continued_and_then_says_7(tmp_path: Path) -> None:
    """Layout 7 reads layout 6's log (tests/unit/test_sharding.py); the layout file says 7
    once a run records it, so a txjoin before layout 7 refuses the checkpoint from then on."""
    marker = tmp_path / LAYOUT_FILE
    marker.write_text(json.dumps({"layout": 6, "shards": 2, "partitions": 2}))
    assert check_layout(tmp_path, 2, record=False) == 2
    assert json.loads(marker.read_text())["layout"] == 6  # only checked
    assert check_layout(tmp_path, 2) == 2
    assert json.loads(marker.read_text()) == {"layout": LAYOUT_VERSION, "shards": 2,
                                              "partitions": 2}
    marker.write_text(json.dumps({"layout": 5, "shards": 2, "partitions": 2}))
    with pytest.raises(ConfigError, match=f"has state layout 5, this txjoin needs "
                                          f"{LAYOUT_VERSION}"):
        check_layout(tmp_path, 2)


def test_a_split_that_cannot_be_is_refused_before_spark(tmp_path: Path) -> None:
    code, err, _ = run(tmp_path, "--split", "ta")
    assert code == 2
    assert "--split needs --engine staged" in one_line(err)
    code, err, _ = run(tmp_path, "--engine", "staged", "--split", "p,nope")
    assert code == 2
    assert "no lookup named ['nope'] to split" in one_line(err)
    # c below ta: ta copied, so c is too (a shard needs every row below a copied row)
    code, err, _ = run(tmp_path, "--engine", "staged", "--split", "c")
    assert code == 2
    assert "job orders cannot split c (" in one_line(err) and "these can: ta,c,t,p" in err


def test_a_staged_checkpoint_is_continued_with_its_split_and_refused_with_another(
        tmp_path: Path) -> None:
    from txjoin.join import STAGED

    check_layout(tmp_path, 2, engine=STAGED, split=["ta", "c"])
    assert json.loads((tmp_path / LAYOUT_FILE).read_text())["split"] == ["ta", "c"]
    assert check_layout(tmp_path, 2, record=False, engine=STAGED, split=["c", "ta"]) == 2
    for other in ([], ["ta"]):
        with pytest.raises(ConfigError, match=r"was written with --split ta,c, not "
                                              f"{','.join(other) or 'none'}: run with "
                                              r"--split ta,c"):
            check_layout(tmp_path, 2, engine=STAGED, split=other)
    unsplit = tmp_path / "unsplit"
    check_layout(unsplit, 2, engine=STAGED)
    with pytest.raises(ConfigError, match="was written with --split none, not all"):
        check_layout(unsplit, 2, record=False, engine=STAGED, split=["all"])
