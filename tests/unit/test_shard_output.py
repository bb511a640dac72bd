"""A shard's output travels to the driver in rows of bounded size, and arrives whole and in
commit order (``shards.changes_columns`` -> ``pipeline.decode_batch``)."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from tests.unit.delivery import pizzeria_rows
from tests.unit.test_properties import JOB_VARIANTS
from txjoin.join.output import changes_to_table, output_schema
from txjoin.join.sharded import ShardedEngine
from txjoin.join.spark import shards
from txjoin.pipeline.pipeline import decode_batch, merge_infos
from txjoin.pipeline.sink_tasks import PartWriter, summarise


def _frame(job: Any, shard: int, changes: list[Any], info: dict[str, Any]) -> pd.DataFrame:
    """A shard's output rows as its task returns them (``ShardProcessor.handleInputRows``)."""
    return pd.DataFrame(shards.changes_columns(job, shard, changes, info))


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


def test_the_tasks_summaries_give_the_driver_the_batch_in_commit_order_or_only_its_figures(
        ) -> None:
    """What the pipeline's tasks return of a batch (``sink_tasks.PartWriter``, one call per
    task, here one per shard) read back on the driver (``summarise``): with the rows kept,
    the table ``decode_batch`` makes of the same output; without, only its progress, size
    and commit times."""
    job, _ = JOB_VARIANTS["orders/as_of_fact"]
    engine = ShardedEngine(job, 2)
    engine.process(pizzeria_rows(job, 80, seed=5))
    frames = [_frame(job, i, r.changes, {"commit_seq": 4, "records": 5 + i})
              for i, r in enumerate(engine.last)]
    expected, info = decode_batch(job, pd.concat(frames))
    schema = output_schema(job)
    for keep_rows in (True, False):
        writer = PartWriter(schema, {}, keep_rows)
        summaries = pa.concat_tables(
            pa.Table.from_batches(list(writer(iter(
                pa.Table.from_pandas(f, preserve_index=False).to_batches()))))
            for f in frames)
        summary = summarise(summaries, schema, keep_rows)
        assert merge_infos(summary.infos)["records"] == info["records"] == 11
        assert summary.rows == expected.num_rows > 14
        assert sorted(summary.commit_ts_ms) == sorted(
            int(v.timestamp() * 1000) for v in expected.column("_commit_ts").to_pylist())
        assert summary.staged == {}
        if keep_rows:
            assert summary.changes is not None and summary.changes.equals(expected)
        else:
            assert summary.changes is None
