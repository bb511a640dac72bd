"""Property tests: the engine against the oracle, over random workloads and deliveries.

Invariants, for both semantics: after every batch the output equals the oracle's
output after some committed prefix T1..Tk, with k never decreasing (so never a
part of a transaction, never a newer lookup state); at the end it equals the
oracle after the last transaction; no transaction's effect is applied twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, event, find, given, settings
from hypothesis import strategies as st

from tests.unit.strategies import (
    LARGE_TX,
    PIZZERIA_ROWS,
    USERS_ROWS,
    Workload,
    assert_restarts_change_nothing,
    deliveries,
    produce,
    workloads,
)
from txjoin.job import Job, load_job
from txjoin.join.engine import Engine
from txjoin.join.oracle import outputs_after_each

JOBS = Path(__file__).resolve().parents[2] / "jobs"
ORDERS = load_job(JOBS / "orders.py")
USERS = load_job(JOBS / "users_colors.py")


def _with_semantics(job: Job, semantics: str) -> Job:
    return Job(name=job.name, tables=job.tables, fact=job.fact, fact_alias=job.fact_alias,
               lookups=job.lookups, output=job.output, semantics=semantics,  # type: ignore[arg-type]
               source_file=job.source_file)


JOB_VARIANTS = {
    "orders/as_of_fact": (ORDERS, PIZZERIA_ROWS),
    "orders/current": (_with_semantics(ORDERS, "current"), PIZZERIA_ROWS),
    "users_colors/current": (USERS, USERS_ROWS),
    "users_colors/as_of_fact": (_with_semantics(USERS, "as_of_fact"), USERS_ROWS),
}


def run_and_check(job: Job, workload: Workload, data: Any) -> None:
    production = produce(job, workload)
    batches = data.draw(deliveries(production), label="delivery")
    # The run's statistics (pytest --hypothesis-show-statistics) show the hard cases came.
    large = [tx.name for tx in workload.transactions if len(tx.changes) >= LARGE_TX[0]]
    if large:
        spans = sum(1 for b in batches if any(r.tx == large[0] for r in b.records))
        event(f"a transaction of >= {LARGE_TX[0]} changes, its records in "
              f"{'1 batch' if spans == 1 else '2-4 batches' if spans < 5 else '5+ batches'}")
    else:
        event("small transactions only")
    expected = outputs_after_each(job, workload.snapshot, workload.transactions)
    engine = Engine(job)
    applied: dict[Any, Any] = {}
    seen_versions: set[tuple[Any, int]] = set()
    last_k = -1
    prefix = job.topics("shop")[0].rsplit(".", 2)[0] + "."
    for n, batch in enumerate(batches):
        records = [(r.topic, 0, r.offset, r.value) for r in batch.records]
        caught = {t.removeprefix(prefix) for t in batch.caught_up}
        changes = engine.process(records, caught_up=caught)
        for ch in changes:
            assert (ch.key, ch.commit_seq) not in seen_versions, f"{ch} applied twice"
            seen_versions.add((ch.key, ch.commit_seq))
            if ch.row is None:
                applied.pop(ch.key, None)
            else:
                applied[ch.key] = ch.row
        assert applied == engine.outputs(), "the change stream disagrees with the state"
        if not engine.assembler.snapshot.done:
            assert applied == {}, f"batch {n}: output before the snapshot was complete"
            continue
        k = engine.commit_seq
        assert k >= last_k, f"batch {n}: frontier went back from {last_k} to {k}"
        last_k = k
        assert applied == expected[k], (
            f"batch {n}: output is not the oracle's after T{k}\n"
            f"got      {applied}\nexpected {expected[k]}")
    assert engine.commit_seq == len(workload.transactions), "not every transaction released"
    assert applied == expected[-1]


@pytest.mark.parametrize("variant", sorted(JOB_VARIANTS))
@given(data=st.data())
def test_output_is_always_a_committed_prefix_and_converges(variant: str, data: Any) -> None:
    job, rows = JOB_VARIANTS[variant]
    workload = data.draw(workloads(rows, large=True), label="workload")
    run_and_check(job, workload, data)


@pytest.mark.parametrize("table", ["public.orders", "public.pizzas"])
def test_the_workloads_change_primary_keys_of_facts_and_looked_up_rows(table: str) -> None:
    """The property tests above reach key changes: a fact moving to another key (and so,
    with shards, to another shard) and a looked-up row moving away from the facts that
    reference it, the other columns kept (what Debezium sends for ``UPDATE ... SET id``)."""
    workload = find(workloads(PIZZERIA_ROWS),
                    lambda w: any(t == table for _, t, _, _ in w.key_changes),
                    settings=settings(max_examples=2000, database=None, phases=[Phase.generate]))
    n, _, old, new = next(c for c in workload.key_changes if c[1] == table)
    changes = workload.transactions[n].changes
    at = next(i for i, c in enumerate(changes)
              if c.op == "delete" and c.table == table and c.row["id"] == old)
    moved = changes[at + 1]
    assert (moved.op, moved.table, moved.row["id"]) == ("insert", table, new)


@given(data=st.data())
def test_engine_state_survives_serialisation_between_batches(data: Any) -> None:
    """Restart the engine from its serialised state after every batch: same outputs."""
    job = ORDERS
    workload = data.draw(workloads(PIZZERIA_ROWS), label="workload")
    batches = data.draw(deliveries(produce(job, workload)), label="delivery")
    assert_restarts_change_nothing(job, batches)
