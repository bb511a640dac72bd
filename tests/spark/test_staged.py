"""The staged engine (``txjoin run --engine staged``: a sequencer stage, then shards that hold
only their rows) through Spark: scenarios in both sinks, a restart at every batch boundary,
and a checkpoint of one engine refused by the other.

What the staged engine decides is checked against the oracle and the sharded engine without
Spark for every scenario at 1-4 shards (tests/unit/test_staged.py); Spark adds the two
chained stateful stages, their logs in the state store, the release rows between them and
the shards' hosts, which these exercise.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.spark.test_pipeline import ROOT, _scenario_yaml
from txjoin.errors import ConfigError
from txjoin.join import SHARDED, STAGED
from txjoin.pipeline.pipeline import check_layout
from txjoin.scenarios.spark_runner import run_scenario_spark
from txjoin.scenarios.spec import load_scenario

pytestmark = pytest.mark.spark

CASES = [
    # re-read and duplicated events, a restart inside a transaction (Debezium < 3.7)
    ("duplicates_restart_mid_transaction", 2),
    # a transaction spread over eight batches; more shards than cores
    ("large_transaction_split", 4),
    # two source databases, their markers interleaved, a restart
    ("two_dbs_interleaved_delivery", 2),
    # rows deleted and re-inserted under their key; an order's lines (Children)
    ("delete_and_reinsert", 2),
    ("child_rows", 3),
    # a torn transaction and a lookup race: the releases wait for what is missing
    ("torn_transaction", 2),
    ("seed_3_lookup_race", 1),
]


@pytest.mark.parametrize("name, shards", CASES, ids=[f"{n}-shards{s}" for n, s in CASES])
def test_scenarios_hold_in_both_sinks_through_the_staged_engine(
        spark: SparkSession, pg_dsn: str, name: str, shards: int, tmp_path: Path) -> None:
    report = run_scenario_spark(spark, load_scenario(ROOT / "scenarios" / f"{name}.yaml"),
                                str(tmp_path), postgres_dsn=pg_dsn, shards=shards, delta=True,
                                engine=STAGED)
    assert report.passed, "\n".join(report.failures)
    assert report.batches > 0


def test_a_restart_at_every_batch_boundary_changes_nothing_in_the_staged_engine(
        spark: SparkSession, pg_dsn: str, tmp_path: Path) -> None:
    import random

    import yaml

    from txjoin.scenarios.workload import pizzeria_workload

    snapshot, txs = pizzeria_workload(10, seed=11)
    delivery: list[object] = [["snapshot:*"], "restart"]
    rnd = random.Random(5)
    for tx in txs:
        tables = sorted({c.table for c in tx.changes})
        if tables and rnd.random() < 0.5:
            delivery += [[f"{tx.name}:{t}" for t in tables], "restart",
                         [f"{tx.name}:begin", f"{tx.name}:end"], "restart"]
        else:
            delivery += [[f"{tx.name}:*"], "restart"]
    path = tmp_path / "restart_every_batch.yaml"
    path.write_text(yaml.safe_dump(_scenario_yaml(snapshot, txs, delivery[:-1]),
                                   sort_keys=False))
    report = run_scenario_spark(spark, load_scenario(path), str(tmp_path / "run"),
                                postgres_dsn=pg_dsn, shards=2, delta=True, engine=STAGED)
    assert report.passed, "\n".join(report.failures)
    assert report.batches == sum(1 for d in delivery if d != "restart")


def test_a_checkpoint_of_one_engine_is_refused_by_the_other(tmp_path: Path) -> None:
    check_layout(tmp_path / "a", 2, engine=STAGED)
    with pytest.raises(ConfigError, match="--engine staged"):
        check_layout(tmp_path / "a", 2, engine=SHARDED)
    check_layout(tmp_path / "b", 2, engine=SHARDED)
    with pytest.raises(ConfigError, match="--engine sharded"):
        check_layout(tmp_path / "b", 2, engine=STAGED)
    assert check_layout(tmp_path / "a", 2, engine=STAGED) == 2  # continued
