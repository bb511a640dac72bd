"""A shard's output travels to the driver in rows of bounded size, and arrives whole and in
commit order (``shards.changes_columns`` -> ``pipeline.decode_batch``); in a pipeline's
batch the shards write it into the sinks' stages and send the driver what they wrote
(``ShardProcessor.output`` -> ``sinks.tasks.summarise``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.unit.delivery import pizzeria_rows
from tests.unit.test_properties import JOB_VARIANTS
from txjoin.join.output import changes_to_table, output_schema
from txjoin.join.sharded import ShardedEngine
from txjoin.join.spark import shards
from txjoin.pipeline.pipeline import decode_batch, merge_infos
from txjoin.sequence.assembly import IncompletePolicy
from txjoin.sinks import COMMIT_SEQ
from txjoin.sinks.delta import stored_schema
from txjoin.sinks.delta_stage import CHANGELOG, DeltaStage
from txjoin.sinks.tasks import PART_KEY, TaskSinks, encode, summarise


def _frame(job: Any, shard: int, changes: list[Any], info: dict[str, Any]) -> pd.DataFrame:
    """A shard's output rows as its task returns them (``ShardProcessor.handleInputRows``)."""
    return pd.DataFrame(shards.changes_columns(shard, changes_to_table(job, changes), info))


def test_a_shards_output_split_into_bounded_rows_arrives_whole_in_commit_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    job, _ = JOB_VARIANTS["orders/as_of_fact"]
    engine = ShardedEngine(job, 2)
    engine.process(pizzeria_rows(job, 80, seed=5))
    per_shard = [result.changes for result in engine.last]
    assert all(len(c) > 7 for c in per_shard), "the workload must give each shard changes"
    expected = decode_batch(job, pd.concat(
        [_frame(job, i, c, {"commit_seq": 1, "records": 5})
         for i, c in enumerate(per_shard)]))

    monkeypatch.setattr(shards, "OUTPUT_CHUNK_ROWS", 7)
    frames = [_frame(job, i, c, {"commit_seq": 1, "records": 5})
              for i, c in enumerate(per_shard)]
    for frame, c in zip(frames, per_shard, strict=True):
        assert len(frame) == -(-len(c) // 7)  # rows of at most 7 changes
        assert [json.loads(v)["records"] if isinstance(v, str) else None
                for v in frame["info"]] == [5] + [None] * (len(frame) - 1)
    table, info = decode_batch(job, pd.concat(frames))
    assert table.equals(expected[0]) and info["records"] == 10 == expected[1]["records"]
    assert table.num_rows == sum(len(c) for c in per_shard)
    seqs = table.column("_commit_seq").to_pylist()
    assert seqs == sorted(seqs)
    whole = pa.concat_tables(changes_to_table(job, c) for c in per_shard)
    assert sorted(whole.column("_commit_seq").to_pylist()) == seqs


def test_a_shard_without_changes_sends_one_row_with_its_progress() -> None:
    job, _ = JOB_VARIANTS["orders/as_of_fact"]
    frame = _frame(job, 3, [], {"commit_seq": 0, "records": 2})
    assert len(frame) == 1 and frame["changes"][0] is None
    table, info = decode_batch(job, frame)
    assert table.num_rows == 0 and info["records"] == 2


def test_shards_write_their_parts_and_the_driver_gets_the_batch_or_only_its_figures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a pipeline's shards return of a batch whose sinks they write
    (``ShardProcessor.output`` with the batch's ``TaskSinks``, as the driver's local property
    carries them) read back on the driver (``summarise``): each shard's changes staged as its
    part (here Delta's staged files, read back), and with the rows kept, the table
    ``decode_batch`` makes of the same output; without, only its progress, size, parts and
    commit times."""
    job, _ = JOB_VARIANTS["orders/as_of_fact"]
    engine = ShardedEngine(job, 2)
    engine.process(pizzeria_rows(job, 80, seed=5))
    frames = [_frame(job, i, r.changes, {"commit_seq": 4, "records": 5 + i})
              for i, r in enumerate(engine.last)]
    expected, info = decode_batch(job, pd.concat(frames))
    schema = output_schema(job)
    monkeypatch.setattr(shards, "OUTPUT_CHUNK_ROWS", 7)  # typed and sent in pieces
    processor = shards.ShardProcessor(job, [0, 1], IncompletePolicy(), "pizzeria",
                                      "token")
    for keep_rows in (True, False):
        stage = DeltaStage(str(tmp_path / f"keep-{keep_rows}"), "ckpt", 3, "orders", schema,
                           stored_schema(schema), tuple(job.output.key))
        processor.task_sinks = encode(TaskSinks({"delta": stage}, keep_rows))
        output = pa.concat_tables(
            pa.Table.from_pandas(pd.DataFrame(processor.output(
                i, r.changes, {"shard": i, "commit_seq": 4, "records": 5 + i})),
                preserve_index=False)
            for i, r in enumerate(engine.last))
        summary = summarise(output, schema, keep_rows)
        assert all(PART_KEY not in i for i in summary.infos)
        assert merge_infos(summary.infos)["records"] == info["records"] == 11
        assert summary.rows == expected.num_rows > 14
        assert sorted(summary.commit_ts_ms) == sorted(
            int(v.timestamp() * 1000) for v in expected.column("_commit_ts").to_pylist())
        parts = summary.staged["delta"]
        assert [(p.part, p.rows) for p in parts] == [
            (i, len(r.changes)) for i, r in enumerate(engine.last)]
        staged = pa.concat_tables(pq.read_table(stage.path(CHANGELOG, p.part)) for p in parts)
        seqs = sorted(staged.column(COMMIT_SEQ).to_pylist())
        assert seqs == expected.column(COMMIT_SEQ).to_pylist()
        if keep_rows:
            assert summary.changes is not None and summary.changes.equals(expected)
            assert len(output) > 2  # in rows of at most 7 changes
        else:
            assert summary.changes is None and len(output) == 2  # one row a shard


def test_a_shard_that_wrote_no_part_is_refused_not_taken_for_an_empty_one() -> None:
    job, _ = JOB_VARIANTS["orders/as_of_fact"]
    frame = _frame(job, 1, [], {"shard": 1, "commit_seq": 0, "records": 2})
    with pytest.raises(RuntimeError, match="shard 1 wrote no part"):
        summarise(pa.Table.from_pandas(frame, preserve_index=False), output_schema(job), False)
