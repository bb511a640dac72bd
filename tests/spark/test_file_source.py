"""The pipeline over archived Debezium files (``--source files:DIR``), Kafka Connect's layout.

The same synthesized pizzeria workload the Kafka test uses, written as
``DIR/<topic>/partition=<p>/<topic>+<p>+<start>.json`` files of a few records each
(table topics in 1 or 3 partitions), read in small micro-batches, must give the
oracle's output in both sinks; files
that appear while the query runs are read; gaps, overlaps and lines that are not
JSON stop the job with a message naming the file.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from deltalake import DeltaTable
from pyspark.sql import SparkSession

import txjoin
from txjoin.bench import spread
from txjoin.cli import main
from txjoin.errors import (
    ConfigError,
    DecodeError,
    ExpressionValueError,
    OrderingError,
    TxjoinError,
    from_worker,
)
from txjoin.export import write_records
from txjoin.job import Job, load_job
from txjoin.join.oracle import outputs_after_each
from txjoin.join.output import output_schema
from txjoin.pipeline.pipeline import Pipeline, RunConfig, check_layout
from txjoin.pipeline.run import source_frame
from txjoin.scenarios.checks import check_exactly_once, check_final
from txjoin.scenarios.synthesize import Produced, Synthesizer
from txjoin.scenarios.workload import pizzeria_workload
from txjoin.sinks import without_metadata
from txjoin.sinks.build import build_sinks
from txjoin.sinks.delta import DeltaSink
from txjoin.sinks.handoff import GroupCommit

pytestmark = pytest.mark.spark

ORDERS = Path(__file__).resolve().parents[2] / "jobs" / "orders.py"


def archive(out: Path, records: list[Produced], synth: Synthesizer, per_file: int) -> None:
    """Append ``records`` (offsets from the synthesizer) to the archive, per topic."""
    by_topic: dict[str, list[Produced]] = {}
    for r in records:
        by_topic.setdefault(r.topic, []).append(r)
    for topic, recs in by_topic.items():
        write_records(out, topic, 0, recs[0].offset, [r.value for r in recs], per_file)


def archive_rows(out: Path, rows: list[tuple[str, int, int, str | None, str | None]],
                 per_file: int) -> None:
    """Append (topic, partition, offset, key, value) rows to the archive, per partition."""
    by_part: dict[tuple[str, int], list[tuple]] = {}
    for row in rows:
        by_part.setdefault((row[0], row[1]), []).append(row)
    for (topic, part), recs in by_part.items():
        write_records(out, topic, part, recs[0][2], [r[4] for r in recs], per_file)


# One partition per topic runs end to end in tests/e2e/test_export_files.py (topics
# exported from a live stack); here the general case, with the upkeep between batches.
# Every 3 batches (every 2 until issue 34): an upkeep (OPTIMIZE and VACUUM of both tables)
# took 15-19 s here, and the 9 batches still get one in each of the two runs.
@pytest.mark.parametrize("partitions, maintain_every", [(3, 3)],
                         ids=["3-partitions-maintained"])
def test_pipeline_over_files_in_small_batches_resumes_and_matches_the_oracle(
        spark: SparkSession, pg_dsn: str, tmp_path: Path, partitions: int,
        maintain_every: int | None) -> None:
    """partitions: table topics spread over that many partition folders by key.
    maintain_every: the job compacts and VACUUMs (retention 0) its Delta tables every that
    many batches, and `txjoin maintain` runs once more at the end: nothing changes."""
    job = load_job(ORDERS)
    snapshot, txs = pizzeria_workload(60, seed=5)
    synth = Synthesizer(job, prefix="fshop")
    archive_dir = tmp_path / "archive"
    records = list(synth.snapshot(snapshot))
    first = len(txs) // 2
    for tx in txs[:first]:
        records.extend(synth.transaction(tx))
    more: list[Produced] = []
    for tx in txs[first:]:
        more.extend(synth.transaction(tx))
    spread_rows = spread(records + more, partitions, "fshop.transaction")
    archive_rows(archive_dir, spread_rows[:len(records)], per_file=7)

    config = RunConfig(topic_prefix="fshop", source=f"files:{archive_dir}",
                       max_events_per_trigger=60, checkpoint_dir=str(tmp_path / "ckpt"),
                       output_dir=str(tmp_path / "out"), postgres_dsn=pg_dsn,
                       maintain_every=maintain_every, delta_commit_interval_s=0,
                       vacuum_retention_hours=None if maintain_every is None else 0)

    def drain() -> list:
        sinks = build_sinks(job, config, spark, pg_table_suffix=f"files{partitions}")
        commits: list[GroupCommit] = []
        pipeline = Pipeline(spark, job, config, sinks, on_sink_commit=commits.append)
        query = pipeline.start(source_frame(spark, job, config, pipeline), available_now=True)
        query.awaitTermination()
        pipeline.close()
        assert len(pipeline.reports) > 3, "small batches expected"
        # The upkeep runs on the Delta committer, after the group commit that brings the
        # batches committed since the last upkeep to maintain_every.
        groups = [c for c in commits if c.sink == "delta"]
        maintained = [c.last_batch for c in groups if "maintain" in c.seconds]
        due, since = [], 0
        for c in groups:
            since += c.batches
            if maintain_every is not None and since >= maintain_every:
                due.append(c.last_batch)
                since = 0
        assert maintained == due
        assert bool(maintained) == (maintain_every is not None)
        print(f"upkeeps after batches {maintained} of {len(pipeline.reports)}")
        return sinks

    expected = outputs_after_each(job, snapshot, txs)
    sinks = drain()
    for sink in sinks:
        rows = [without_metadata(r) for r in sink.read_current()]
        result = check_final(rows, expected[first], ["order_id"])
        assert result.ok, f"{sink.name} after the first half: {result.message}"
        sink.close()

    archive_rows(archive_dir, spread_rows[len(records):], per_file=5)
    sinks = drain()
    for sink in sinks:
        current = sink.read_current()
        result = check_final([without_metadata(r) for r in current], expected[-1], ["order_id"])
        assert result.ok, f"{sink.name} at the end: {result.message}"
        once = check_exactly_once(sink.read_changelog(), ["order_id"], current, expected)
        assert once.ok, f"{sink.name}: {once.message}"
        sink.close()

    if maintain_every is not None:
        def delta_rows() -> tuple[list, list]:
            delta = DeltaSink(str(tmp_path / "out"), job.output.table, job.name,
                              list(job.output.key), output_schema(job))  # read-only
            return delta.read_current(), delta.read_changelog()

        before = delta_rows()
        done = CliRunner().invoke(main, ["maintain", str(ORDERS), "--output-dir",
                                         str(tmp_path / "out"), "--retention-hours", "0"])
        assert done.exit_code == 0, done.output
        assert done.output.count("live files") == 2, done.output  # changelog and current
        assert delta_rows() == before
        # The log keeps the window the data files keep, so it stays bounded too.
        for table in ("changelog", "current"):
            config = DeltaTable(str(tmp_path / "out" / job.output.table / table)).metadata()
            assert config.configuration["delta.logRetentionDuration"] == "interval 1 seconds"


def test_files_that_appear_while_the_job_runs_are_read(spark: SparkSession,
                                                       tmp_path: Path) -> None:
    """Through the Python API (``txjoin.start``) on the caller's session: the stream's
    progress follows the batches, and ``stop`` leaves Delta holding the last batch."""
    job = load_job(ORDERS)
    snapshot, txs = pizzeria_workload(30, seed=9)
    synth = Synthesizer(job, prefix="lshop")
    archive_dir = tmp_path / "archive"
    archive(archive_dir, list(synth.snapshot(snapshot)), synth, per_file=10)
    config = RunConfig(topic_prefix="lshop", source=f"files:{archive_dir}",
                       trigger_interval="200 milliseconds", delta_commit_interval_s=0.5,
                       checkpoint_dir=str(tmp_path / "ckpt"), output_dir=str(tmp_path / "out"))
    delta = DeltaSink(str(tmp_path / "out"), job.output.table, job.name,
                      list(job.output.key), output_schema(job))  # read-only
    expected = outputs_after_each(job, snapshot, txs)
    with txjoin.start(spark, job, config) as stream:
        assert stream.query is not None and stream.query.isActive
        for i in range(0, len(txs), 10):  # three waves of files, each after the job caught up
            wave: list[Produced] = []
            for tx in txs[i:i + 10]:
                wave.extend(synth.transaction(tx))
            archive(archive_dir, wave, synth, per_file=6)
            deadline = time.monotonic() + 120
            want = expected[min(i + 10, len(txs))]
            while True:
                rows = [without_metadata(r) for r in delta.read_current()]
                if check_final(rows, want, ["order_id"]).ok:
                    break
                assert stream.query.isActive, f"query stopped: {stream.query.exception()}"
                assert time.monotonic() < deadline, (
                    f"wave {i // 10}: {check_final(rows, want, ['order_id']).message}")
                time.sleep(0.3)
        progress = stream.progress()
        assert progress.active and progress.batches == len(stream.reports) > 0
        assert progress.frontier_commit_seq == stream.reports[-1].commit_seq
        assert progress.records == sum(r.records for r in stream.reports)
        fresh = progress.sinks["delta"]
        assert fresh.commits > 0 and fresh.committed_at is not None
        assert fresh.freshness_seconds is not None and fresh.freshness_seconds >= 0
    assert not stream.query.isActive and not stream.progress().active
    # stop() waited for Delta: it holds every batch the stream ran, nothing is pending
    assert stream.progress().sinks["delta"].pending_batches == 0
    assert stream.progress().sinks["delta"].last_batch == stream.reports[-1].batch_id
    assert delta.held() is not None
    assert delta.held().frontier_commit_seq == stream.reports[-1].commit_seq  # type: ignore[union-attr]
    delta.close()


def test_the_api_refuses_what_txjoin_run_refuses_before_any_query_starts(
        spark: SparkSession, tmp_path: Path) -> None:
    job = load_job(ORDERS)
    archive_dir, _ = _small_archive(tmp_path)
    config = RunConfig(topic_prefix="bshop", source=f"files:{archive_dir}", shards=2,
                       checkpoint_dir=str(tmp_path / "ckpt"), output_dir=str(tmp_path / "out"))
    check_layout(tmp_path / "ckpt" / job.name, 3)  # a checkpoint of 3 shards
    active = len(spark.streams.active)
    with pytest.raises(ConfigError, match=r"written with --shards 3, not 2: run with --shards 3"):
        txjoin.start(spark, job, config)
    with pytest.raises(ConfigError, match=r"^--output-dir s3a://b/out: .* s3a: is not "
                                          r"supported: mount the storage"):
        txjoin.start(spark, job, replace(config, output_dir="s3a://b/out"))
    with pytest.raises(ConfigError, match=r"txjoin run --rebuild"):
        txjoin.start(spark, job, replace(config, rebuild=True))
    assert len(spark.streams.active) == active


def _failing_run(spark: SparkSession, tmp_path: Path, archive_dir: Path,
                 job: Job | None = None) -> TxjoinError:
    job = job or load_job(ORDERS)
    config = RunConfig(topic_prefix="bshop", source=f"files:{archive_dir}",
                       checkpoint_dir=str(tmp_path / "ckpt"), output_dir=str(tmp_path / "out"))
    sinks = build_sinks(job, config, spark)
    pipeline = Pipeline(spark, job, config, sinks)
    with pytest.raises(Exception) as info:
        query = pipeline.start(source_frame(spark, job, config, pipeline), available_now=True)
        query.awaitTermination()
    err = info.value if isinstance(info.value, TxjoinError) else from_worker(info.value)
    assert err is not None, f"not a txjoin error: {info.value}"
    return err


def _small_archive(tmp_path: Path) -> tuple[Path, Synthesizer]:
    job = load_job(ORDERS)
    snapshot, txs = pizzeria_workload(5, seed=1)
    synth = Synthesizer(job, prefix="bshop")
    records = list(synth.snapshot(snapshot))
    for tx in txs:
        records.extend(synth.transaction(tx))
    archive_dir = tmp_path / "archive"
    archive(archive_dir, records, synth, per_file=4)
    return archive_dir, synth


def test_a_value_postgresql_would_refuse_stops_the_job_with_one_line(
        spark: SparkSession, tmp_path: Path) -> None:
    """A computed column that leaves its type on some row (PostgreSQL: integer out of range)
    fails the query with txjoin's one-line error from the Python worker, not the sink's."""
    archive_dir, _ = _small_archive(tmp_path)
    job = load_job(ORDERS)
    job = replace(job, output=replace(job.output, columns={
        **job.output.columns, "big": "o.id * 1000000000"}))
    err = _failing_run(spark, tmp_path, archive_dir, job)
    assert isinstance(err, ExpressionValueError), err
    assert str(err).startswith("output column 'big': integer out of range in "
                               "(o.id * 1000000000) with o.id "), err
    assert "\n" not in str(err) and "nothing of this batch was written" in str(err)


def test_a_missing_file_is_a_gap_named_by_file(spark: SparkSession, tmp_path: Path) -> None:
    archive_dir, _ = _small_archive(tmp_path)
    folder = archive_dir / "bshop.transaction" / "partition=0"
    (folder / "bshop.transaction+0+4.json").unlink()
    err = _failing_run(spark, tmp_path, archive_dir)
    assert isinstance(err, OrderingError)
    assert "bshop.transaction+0+8.json: starts at offset 8" in str(err)
    assert "offsets 4..7" in str(err) and "\n" not in str(err)


def test_overlapping_files_are_an_error_naming_both(spark: SparkSession, tmp_path: Path) -> None:
    archive_dir, _ = _small_archive(tmp_path)
    folder = archive_dir / "bshop.transaction" / "partition=0"
    lines = (folder / "bshop.transaction+0+4.json").read_text().splitlines()
    (folder / "bshop.transaction+0+6.json").write_text("\n".join(lines[2:]) + "\n")
    err = _failing_run(spark, tmp_path, archive_dir)
    assert isinstance(err, OrderingError)
    assert "bshop.transaction+0+6.json: starts at offset 6, inside" in str(err)
    assert "bshop.transaction+0+4.json (line 3" in str(err)


def test_a_line_that_is_not_json_names_file_and_line(spark: SparkSession,
                                                     tmp_path: Path) -> None:
    archive_dir, _ = _small_archive(tmp_path)
    path = archive_dir / "bshop.public.orders" / "partition=0" / "bshop.public.orders+0+0.json"
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:-5]  # a truncated record
    path.write_text("\n".join(lines) + "\n")
    err = _failing_run(spark, tmp_path, archive_dir)
    assert isinstance(err, DecodeError)
    assert f"{path}, line 3: not a JSON record" in str(err)
