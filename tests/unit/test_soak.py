"""``txjoin soak``'s arithmetic: the seeded fault plan, the trend fits, the Delta file counts."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from txjoin.stack.soak import (
    FAULT_KINDS,
    METRICS,
    RESTART_WARMUP_S,
    Sample,
    delta_file_counts,
    fault_schedule,
    slope_per_minute,
    trends,
)


def test_slope_of_a_straight_line_is_its_rise_per_minute() -> None:
    points = [(t, 5 + 0.5 * t) for t in range(0, 300, 10)]
    assert slope_per_minute(points) == pytest.approx(30.0)


def test_slope_of_a_flat_series_with_noise_around_it_is_near_zero() -> None:
    points = [(t, 100 + (3 if i % 2 else -3)) for i, t in enumerate(range(0, 600, 10))]
    assert abs(slope_per_minute(points) or 0) < 0.2


def test_slope_needs_two_instants() -> None:
    assert slope_per_minute([]) is None
    assert slope_per_minute([(10.0, 1.0)]) is None
    assert slope_per_minute([(10.0, 1.0), (10.0, 2.0)]) is None
    assert slope_per_minute([(10.0, 1.0)], [(20.0, 2.0)]) is None


def test_segments_share_one_slope_and_a_reset_between_them_is_no_decline() -> None:
    before = [(t, 1000 + t) for t in range(0, 100, 10)]
    after = [(t, 200 + t) for t in range(100, 200, 10)]  # restarted: lower, same growth
    assert slope_per_minute(before, after) == pytest.approx(60.0)
    assert (slope_per_minute(before + after) or 0) < 0


def sample(t: int, pid: int | None, rss: float | None) -> Sample:
    return Sample(float(t), pid, rss, None if rss is None else 50.0, 1.0, 0.5, t, t)


def test_trends_ignore_the_warm_up_third_and_samples_without_a_driver() -> None:
    # Memory climbs during the first 100 s, then stays flat; the driver is down at 200 s.
    samples = [sample(t, 1, None if t == 200 else min(t, 100) * 10.0) for t in range(0, 301, 10)]
    result = trends(samples, duration_s=300)
    assert set(result) == set(METRICS)
    rss = result["driver_rss_mb"]
    assert rss["window_from_s"] == 100 and rss["window_samples"] == 20
    assert rss["slope_per_min"] == 0 and rss["first"] == 0 and rss["last"] == 1000
    assert result["delta_log_files"]["slope_per_min"] == pytest.approx(60.0)


def test_a_restarted_driver_counts_only_after_its_warm_up() -> None:
    # Flat at 1000 MB; killed at 1/2 of the run; the new driver (pid 2) warms up to
    # 1000 MB again within RESTART_WARMUP_S, then stays there for 100 s.
    kill = int(3 * RESTART_WARMUP_S)
    end = kill + int(RESTART_WARMUP_S) + 100
    warm_rate = 600 / RESTART_WARMUP_S
    samples = [sample(t, 1, 1000.0) for t in range(0, kill, 10)]
    samples += [sample(t, 2, min(400 + warm_rate * (t - kill), 1000))
                for t in range(kill, end + 1, 10)]
    rss = trends(samples, duration_s=end)["driver_rss_mb"]
    window_from = end / 3
    before_kill = len(range(int(-(-window_from // 10)) * 10, kill, 10))
    assert rss["slope_per_min"] == 0 and rss["window_samples"] == before_kill + 11
    assert rss["lifetime_peaks"] == [1000.0, 1000.0]


def test_the_same_seed_plans_the_same_faults_and_another_seed_other_ones() -> None:
    assert fault_schedule(1800, 120, seed=7) == fault_schedule(1800, 120, seed=7)
    assert fault_schedule(1800, 120, seed=7) != fault_schedule(1800, 120, seed=8)


def test_faults_skip_the_warm_up_slot_stay_apart_and_take_turns() -> None:
    faults = fault_schedule(240, 48, seed=3)
    assert len(faults) == 4 and {f.kind for f in faults} == set(FAULT_KINDS)
    for slot, fault in enumerate(faults, start=1):
        assert slot * 48 <= fault.at_s <= slot * 48 + 24
    many = fault_schedule(3600, 60, seed=3)
    assert all(b.at_s - a.at_s >= 30 for a, b in itertools.pairwise(many))
    counts = [sum(f.kind == kind for f in many) for kind in FAULT_KINDS]
    assert max(counts) - min(counts) <= 1


def test_no_faults_when_every_is_zero_or_longer_than_the_run() -> None:
    assert fault_schedule(240, 0, seed=0) == []
    assert fault_schedule(240, 300, seed=0) == []


def test_delta_files_count_data_files_apart_from_the_log(tmp_path: Path) -> None:
    for table in ("current", "changelog"):
        log = tmp_path / "orders_enriched" / table / "_delta_log"
        log.mkdir(parents=True)
        for version in range(3):
            (log / f"{version:020}.json").write_text("{}")
        (log / "00000000000000000002.checkpoint.parquet").write_bytes(b"")
        for part in range(2):
            (log.parent / f"part-{part}.snappy.parquet").write_bytes(b"")
            (log.parent / f".part-{part}.snappy.parquet.crc").write_bytes(b"")
    assert delta_file_counts(tmp_path) == (4, 8)
    assert delta_file_counts(tmp_path / "missing") == (0, 0)
