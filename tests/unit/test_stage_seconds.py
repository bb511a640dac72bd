"""Where a batch's time goes: the shards' stages, the pipeline's names, the bench's merge."""

from __future__ import annotations

import pytest

from tests.unit.delivery import pizzeria_rows
from tests.unit.test_properties import JOB_VARIANTS
from txjoin.bench import batch_stages, stage_names
from txjoin.join.sharded import ShardedEngine
from txjoin.pipeline.pipeline import stage_seconds

SHARD_STAGES = {"state_load", "read_records", "sequence", "join", "state_save"}


def test_a_shard_reports_each_of_its_stages() -> None:
    job, _rows = JOB_VARIANTS["orders/as_of_fact"]
    engine = ShardedEngine(job, 2)
    changes = engine.process(pizzeria_rows(job, 300, seed=5), [*job.table_names, "transaction"])
    assert changes
    for result in engine.last:
        assert set(result.seconds) == SHARD_STAGES
        assert all(v >= 0 for v in result.seconds.values())
        assert result.seconds["join"] > 0 and result.seconds["sequence"] > 0
        assert result.seconds["read_records"] > 0
    # a batch with nothing released spends nothing in the join
    engine.process([], [])
    assert all(r.seconds["join"] == 0 for r in engine.last)


def test_the_pipeline_names_the_stages_it_measured() -> None:
    info = {"seconds": {"state_load": 0.1, "sequence": 0.2, "join": 0.3, "total": 0.7}}
    assert stage_seconds(2.0, info) == {
        "compute": 2.0, "shard_state_load": 0.1, "shard_sequence": 0.2,
        "shard_join": 0.3, "shard_total": 0.7}


def test_the_bench_adds_sparks_planning_logs_and_state_commit() -> None:
    progress = {"durationMs": {"latestOffset": 20, "getBatch": 5, "queryPlanning": 75,
                               "walCommit": 30, "commitOffsets": 10, "addBatch": 2000,
                               "triggerExecution": 2150},
                "stateOperators": [{"commitTimeMs": 40}, {"commitTimeMs": 2}]}
    stages = batch_stages({"compute": 1.5, "sink_delta": 0.4}, progress)
    assert stages == pytest.approx({"compute": 1.5, "sink_delta": 0.4, "planning": 0.1,
                                    "offset_log": 0.04, "state_commit": 0.042,
                                    "trigger": 2.15})
    # a batch without progress (e.g. the last of availableNow) keeps its own stages
    assert batch_stages({"compute": 1.0}, None) == {"compute": 1.0}


def test_stage_names_fill_what_a_batch_did_not_have() -> None:
    stages = [{"compute": 1.0}, {"compute": 2.0, "delta_maintain": 3.0}]
    assert stage_names(stages) == ["compute", "delta_maintain"]
    assert stages[0] == {"compute": 1.0, "delta_maintain": 0.0}
