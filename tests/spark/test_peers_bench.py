"""``txjoin bench --peer flink`` on a small workload: both systems, both counted the same way.

txjoin, read from the archived files in micro-batches that split transactions,
must show no inconsistent state at any batch commit and end at the oracle's
output in both sinks. Flink SQL runs for real when PyFlink is available (else
the peer reports why it was skipped); its changelog must end at the oracle's
``current`` output, which checks the parsing and hashing of its rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from txjoin.job import load_job
from txjoin.peers.bench import JOB, PATHWAY_COMMITS_MS, run_pathway_peer, run_peer_bench
from txjoin.peers.consistency import grouped_prefix_hashes
from txjoin.peers.workload import archive_workload

pytestmark = pytest.mark.spark


def test_peer_bench_counts_no_inconsistent_state_for_txjoin_and_replays_flink(
        spark: object, tmp_path: Path) -> None:
    out, chart = tmp_path / "peers.json", tmp_path / "peers.png"
    result = run_peer_bench(60, seed=3, out=out, chart=chart, peers=("flink",),
                            source_dir=tmp_path / "archive", master="local[2]", max_events=50)
    assert json.loads(out.read_text()) == result
    assert chart.stat().st_size > 1000
    assert (tmp_path / "archive" / "shop.transaction" / "partition=0").is_dir()

    txjoin = result["peers"]["txjoin"]
    assert txjoin["observed_states"] >= 5, "several batch commits expected"
    assert txjoin["inconsistent_states"] == 0
    assert txjoin["final_equals_oracle"] is True
    assert txjoin["sinks_equal_oracle"] == {"delta": True, "postgres": True}

    flink = result["peers"]["flink"]
    if "skipped" in flink:
        pytest.skip(f"Flink peer unavailable: {flink['skipped']}")
    assert flink["final_equals_oracle"] is True
    assert flink["observed_states"] == flink["changelog_rows"] > 0
    assert 0 <= flink["inconsistent_states"] <= flink["observed_states"]
    assert flink["events_per_s"] > 0


def test_pathway_peer_ends_at_the_current_oracle_at_both_commit_cadences(
        tmp_path: Path) -> None:
    job = load_job(JOB)
    workload = archive_workload(job, tmp_path / "archive", 60, seed=3)
    current = grouped_prefix_hashes(job, workload.snapshot, workload.transactions)
    for label, ms in PATHWAY_COMMITS_MS.items():
        pathway = run_pathway_peer(workload, current, tmp_path, ms)
        if "skipped" in pathway:
            pytest.skip(f"Pathway peer unavailable: {pathway['skipped']}")
        assert pathway["autocommit_ms"] == ms, label
        assert pathway["final_equals_oracle"] is True, label
        assert 0 < pathway["observed_states"] <= pathway["every_row"]["observed_states"]
        assert pathway["every_row"]["observed_states"] == pathway["changelog_rows"]
        assert 0 <= pathway["inconsistent_states"] <= pathway["observed_states"]
        assert pathway["commit_to_output_ms"]["times"] >= 1
        assert 0 <= pathway["read_seconds"] <= pathway["wall_seconds"]
        assert pathway["events_per_s"] > 0
