"""The staged engine (``txjoin run --engine staged``: a sequencer stage, then shards that hold
only their rows) through Spark: scenarios in both sinks, with every looked-up table copied
or split by key (``--split all``: owner stages between the two), a restart at every batch
boundary, and a checkpoint of one engine refused by the other.

What the staged engine decides is checked against the oracle and the sharded engine without
Spark for every scenario at 1-4 shards with random placements (tests/unit/test_staged.py);
Spark adds the chained stateful stages, their logs in the state store, the release,
forward and subscribe rows between them and the hosts, which these exercise.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.spark.test_pipeline import ROOT, restart_every_batch
from txjoin.errors import ConfigError
from txjoin.join import SHARDED, STAGED
from txjoin.join.placement import SPLIT_ALL, parse_split
from txjoin.pipeline.pipeline import check_layout
from txjoin.scenarios.spark_runner import run_scenario_spark
from txjoin.scenarios.spec import load_scenario

pytestmark = pytest.mark.spark

CASES = [
    # (scenario, shards, split): "all" holds every looked-up table in owner stages split by
    # key (orders: ta, then c and t below it, p through the array: two owner stages), no
    # lookup copied to the shards; the scenarios of the other jobs have none to split
    # re-read and duplicated events, a restart inside a transaction (Debezium < 3.7)
    ("duplicates_restart_mid_transaction", 2, SPLIT_ALL),
    # a transaction spread over eight batches; more shards (and owners) than cores
    ("large_transaction_split", 4, SPLIT_ALL),
    # two source databases, their markers interleaved, a restart
    ("two_dbs_interleaved_delivery", 2, ""),
    # rows deleted and re-inserted under their key; an order's lines (Children)
    ("delete_and_reinsert", 2, SPLIT_ALL),
    ("child_rows", 3, ""),
    # a torn transaction and a lookup race: the releases wait for what is missing
    ("torn_transaction", 2, ""),
    ("seed_3_lookup_race", 1, ""),
    # current semantics split: a shard keeps the rows its facts read and gets their changes
    ("filters_and_computed_columns", 2, SPLIT_ALL),
]


@pytest.mark.parametrize("name, shards, split", CASES,
                         ids=[f"{n}-shards{s}{'-split' if p else ''}" for n, s, p in CASES])
def test_scenarios_hold_in_both_sinks_through_the_staged_engine(
        spark: SparkSession, pg_dsn: str, name: str, shards: int, split: str,
        tmp_path: Path) -> None:
    report = run_scenario_spark(spark, load_scenario(ROOT / "scenarios" / f"{name}.yaml"),
                                str(tmp_path), postgres_dsn=pg_dsn, shards=shards, delta=True,
                                engine=STAGED, split=parse_split(split))
    assert report.passed, "\n".join(report.failures)
    assert report.batches > 0


def test_a_restart_at_every_batch_boundary_changes_nothing_in_the_staged_engine(
        spark: SparkSession, pg_dsn: str, tmp_path: Path) -> None:
    path, batches = restart_every_batch(tmp_path, 10, seed=11, delivery_seed=5,
                                        name="restart_every_batch_staged")
    report = run_scenario_spark(spark, load_scenario(path), str(tmp_path / "run"),
                                postgres_dsn=pg_dsn, shards=2, delta=True, engine=STAGED)
    assert report.passed, "\n".join(report.failures)
    assert report.batches == batches


def test_a_checkpoint_of_one_engine_is_refused_by_the_other(tmp_path: Path) -> None:
    check_layout(tmp_path / "a", 2, engine=STAGED)
    with pytest.raises(ConfigError, match="--engine staged"):
        check_layout(tmp_path / "a", 2, engine=SHARDED)
    check_layout(tmp_path / "b", 2, engine=SHARDED)
    with pytest.raises(ConfigError, match="--engine sharded"):
        check_layout(tmp_path / "b", 2, engine=STAGED)
    assert check_layout(tmp_path / "a", 2, engine=STAGED) == 2  # continued
