"""Where a batch's time goes: the shards' stages, the pipeline's names, the bench's merge."""

from __future__ import annotations

from types import SimpleNamespace

import click
import pytest

from tests.unit.delivery import pizzeria_rows
from tests.unit.test_properties import JOB_VARIANTS
from txjoin.bench import batch_stages, parse_counts, shard_figures, stage_names, sweep_figures
from txjoin.join.sharded import ShardedEngine
from txjoin.pipeline.pipeline import merge_infos, stage_seconds

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


def _shard(n: int, total: float, cpu: float, rows: int, rss: int) -> dict[str, object]:
    return {"shard": n, "seconds": {"join": total / 2, "total": total}, "cpu_seconds": cpu,
            "state_rows": rows, "peak_rss_mb": rss}


def test_merged_progress_keeps_each_shards_own_figures_in_shard_order() -> None:
    infos = [{"shard": 1, "commit_seq": 3, "records": 5, "seconds": {"total": 0.2},
              "cpu_seconds": 0.1, "state_rows": 7, "peak_rss_mb": 90, "waiting": 0},
             {"shard": 0, "commit_seq": 3, "records": 4, "seconds": {"total": 0.5},
              "cpu_seconds": 0.4, "state_rows": 9, "peak_rss_mb": 80}]
    merged = merge_infos(infos)
    assert merged["seconds"] == {"total": 0.5}  # the slowest sets the pace
    assert [s["shard"] for s in merged["per_shard"]] == [0, 1]
    assert merged["per_shard"][1] == {"shard": 1, "seconds": {"total": 0.2},
                                      "cpu_seconds": 0.1, "state_rows": 7,
                                      "peak_rss_mb": 90, "records": 5}


def test_the_sweep_takes_the_slowest_shard_and_the_sum_per_batch_then_the_median() -> None:
    batches = [[_shard(0, 1.0, 0.9, 10, 100), _shard(1, 3.0, 2.0, 12, 130)],
               [_shard(0, 2.0, 1.0, 11, 110), _shard(1, 2.0, 1.5, 13, 120)],
               [_shard(0, 5.0, 4.0, 14, 105), _shard(1, 1.0, 0.5, 15, 125)]]
    steady = [SimpleNamespace(per_shard=b) for b in batches]
    figures = shard_figures(steady)
    # per batch: slowest 3, 2, 5 -> median 3; sums 4, 4, 6 -> median 4
    assert figures["slowest"]["total"] == 3.0 and figures["sum"]["total"] == 4.0
    assert figures["slowest"]["cpu"] == 2.0 and figures["sum"]["cpu"] == 2.9
    assert figures["slowest"]["join"] == 1.5
    assert figures["state_rows"] == [14, 15]  # after the last batch
    assert figures["peak_rss_mb"] == [110, 130]  # the peak over batches
    assert shard_figures([SimpleNamespace(per_shard=[])]) == {}


def test_the_staged_sequencer_is_a_stage_before_the_shards_so_its_task_adds_to_the_slowest(
) -> None:
    # shard -1 is the staged engine's sequencer: a batch waits for it, then for its
    # slowest shard, so the slowest figure is their sum, and the sum counts it once
    batches = [[_shard(-1, 0.4, 0.3, 0, 50), _shard(0, 1.0, 0.9, 10, 100),
                _shard(1, 3.0, 2.0, 12, 130)]]
    figures = shard_figures([SimpleNamespace(per_shard=b) for b in batches])
    assert figures["slowest"]["total"] == 3.4 and figures["sum"]["total"] == 4.4
    assert figures["slowest"]["cpu"] == 2.3 and figures["sum"]["cpu"] == 3.2
    assert figures["state_rows"] == [0, 10, 12]


def test_owner_stages_are_stages_of_their_own_between_the_sequencer_and_the_shards() -> None:
    """With split tables (``--split``) each owner reports through the shard of its number;
    each owner stage is a stage of the batch's critical path, its slowest owner's."""
    def owner(depth: int, number: int, total: float) -> dict[str, object]:
        return {"owner": number, "depth": depth, "seconds": {"total": total},
                "cpu_seconds": total, "state_rows": 100 + number, "peak_rss_mb": 60}

    sequencer = {"shard": -1, "seconds": {"total": 0.3}, "cpu_seconds": 0.3, "state_rows": 0,
                 "peak_rss_mb": 50}
    infos = [{"shard": 0, "commit_seq": 2, "records": 9, "seconds": {"total": 1.0},
              "cpu_seconds": 1.0, "state_rows": 10, "peak_rss_mb": 80, "sequencer": sequencer,
              "owners": [owner(1, 0, 0.2), owner(2, 0, 0.1)]},
             {"shard": 1, "commit_seq": 2, "records": 0, "seconds": {"total": 2.0},
              "cpu_seconds": 2.0, "state_rows": 12, "peak_rss_mb": 90,
              "owners": [owner(1, 1, 0.5), owner(2, 1, 0.05)]}]
    merged = merge_infos(infos)
    assert "owners" not in merged and "sequencer" not in merged
    # the slowest of each stage, summed: 0.3 + 0.5 + 0.1 + 2.0
    assert merged["seconds"] == {"total": pytest.approx(2.9)}
    assert [(t.get("stage"), t["shard"]) for t in merged["per_shard"]] == [
        ("sequencer", -1), ("owners1", 0), ("owners1", 1), ("owners2", 0), ("owners2", 1),
        (None, 0), (None, 1)]
    figures = shard_figures([SimpleNamespace(per_shard=merged["per_shard"])])
    assert figures["slowest"]["cpu"] == pytest.approx(2.9)
    assert figures["sum"]["cpu"] == pytest.approx(0.3 + 0.2 + 0.5 + 0.1 + 0.05 + 1.0 + 2.0)
    assert figures["tasks"] == ["owners1 0", "owners1 1", "owners2 0", "owners2 1",
                                "sequencer -1", "shards 0", "shards 1"]
    assert figures["state_rows"] == [100, 101, 100, 101, 0, 10, 12]
    # the critical path's parts: each part's slowest task and its tasks' sum
    assert figures["by_part"] == {
        "sequencer": {"slowest_cpu": 0.3, "sum_cpu": 0.3},
        "owners1": {"slowest_cpu": 0.5, "sum_cpu": pytest.approx(0.7)},
        "owners2": {"slowest_cpu": 0.1, "sum_cpu": pytest.approx(0.15)},
        "shards": {"slowest_cpu": 2.0, "sum_cpu": 3.0}}


def test_sweep_ratios_are_to_the_fewest_shards_run() -> None:
    def run(slowest: float, total: float, rows: list[int], rate: int) -> dict[str, object]:
        return {"events_per_s": rate, "per_shard": {
            "slowest": {"total": slowest, "cpu": slowest}, "sum": {"total": total, "cpu": total},
            "state_rows": rows}}

    ratios = sweep_figures({1: run(2.0, 2.0, [100], 10), 4: run(0.5, 2.4, [30, 20, 25, 25], 30)})
    assert ratios["base_shards"] == 1
    assert ratios["ratios_to_base"]["4"] == {
        "slowest_total": 0.25, "slowest_cpu": 0.25, "sum_total": 1.2, "sum_cpu": 1.2,
        "largest_state_rows": 0.3, "events_per_s": 30}


@pytest.mark.parametrize("text", ["", "0,2", "a,b", "1,-2"])
def test_shard_sweep_counts_are_checked(text: str) -> None:
    with pytest.raises(click.BadParameter, match="shard counts"):
        parse_counts(text)


def test_shard_sweep_counts_are_sorted_and_distinct() -> None:
    assert parse_counts("8,1,2,2,4") == [1, 2, 4, 8]
