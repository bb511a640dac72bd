"""Incremental snapshots (Debezium's ``execute-snapshot``), against the oracle.

See ``txjoin/sequence/incremental.py``: a row of table T is applied after the transaction
of the last streamed event of T before it in T's topic (its anchor A) and before the next
transaction that touches T (B). Invariants, over random workloads, chunks of looked-up and
fact tables (rows equal to the source's and corrections) and random deliveries: after every
batch the output is the oracle's after the releases so far, the corrections placed where
the engine placed them; every correction row is placed between its A and B; a row equal
to the state is never applied; the change stream is the same at 1-4 shards with any cache
losses (restored from the shard log) and after a restart from the state at every batch.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest
from hypothesis import Phase, event, find, given, settings
from hypothesis import strategies as st

from tests.unit.delivery import Pipeline
from tests.unit.strategies import (
    PIZZERIA_ROWS,
    Workload,
    assert_restarts_change_nothing,
    deliveries,
    incremental_snapshots,
    produce,
    touches,
    workloads,
)
from tests.unit.test_properties import JOB_VARIANTS, ORDERS
from tests.unit.test_snapshot import PIZZERIA
from txjoin.errors import OrderingError
from txjoin.ingest.debezium import ChangeEvent, Position, decode
from txjoin.join.engine import Engine
from txjoin.join.oracle import RowChange, SourceTransaction, outputs_after_each
from txjoin.join.sharded import ShardedEngine
from txjoin.join.state import ENGINE_STATE_VERSION
from txjoin.sequence.assembly import SNAPSHOT_XID, Transaction
from txjoin.sequence.incremental import IncrementalRows

PREFIX = "shop."


@dataclasses.dataclass
class Release:
    """What the engine applied, in order: a source transaction, or a correction's rows."""

    correction: bool
    rows: list[tuple[str, int]]  # a correction's rows: (topic, offset)
    commit_seq: int


def recording(engine: Engine) -> list[Release]:
    """The releases ``engine`` applies from now on (its ``_apply``, wrapped)."""
    log: list[Release] = []
    apply = engine._apply

    def recorded(tx: Transaction) -> Any:
        if tx.commit_seq > 0 or tx.correction:
            log.append(Release(tx.correction, [(e.position.topic, e.position.offset)
                                               for e in tx.events], tx.commit_seq))
        return apply(tx)

    engine._apply = recorded  # type: ignore[method-assign]
    return log


def chunk_rows(workload: Workload, records: list[Any]) -> dict[tuple[str, int], Any]:
    """(topic, offset) of each incremental row -> (tx index it follows, chunk, row index)."""
    placed = [(n, chunk, i) for n in sorted(workload.incremental)
              for chunk in workload.incremental[n] for i in range(len(chunk.rows))]
    written = [(r.topic, r.offset) for r in records if r.tx == "incremental"]
    assert len(placed) == len(written)
    return dict(zip(written, placed, strict=True))


def run_and_check(job: Any, workload: Workload, data: Any) -> list[Any]:
    """Run one engine over a random delivery and check it against the oracle; the batches."""
    production = produce(job, workload)
    batches = data.draw(deliveries(production), label="delivery")
    where = chunk_rows(workload, production.records)
    corrections = sum(sum(c.differs) for cs in workload.incremental.values() for c in cs)
    event("corrections" if corrections else "incremental rows all equal"
          if where else "no incremental rows")
    engine = Engine(job)
    log = recording(engine)
    applied: dict[Any, Any] = {}
    seen: set[tuple[Any, int]] = set()
    states: list[tuple[int, dict[Any, Any]]] = []
    for batch in batches:
        records = [(r.topic, 0, r.offset, r.value) for r in batch.records]
        caught = {t.removeprefix(PREFIX) for t in batch.caught_up}
        for ch in engine.process(records, caught_up=caught):
            assert (ch.key, ch.commit_seq) not in seen, f"{ch} applied twice"
            seen.add((ch.key, ch.commit_seq))
            if ch.row is None:
                applied.pop(ch.key, None)
            else:
                applied[ch.key] = ch.row
        assert applied == engine.outputs()
        if engine.assembler.snapshot.done:
            states.append((engine.commit_seq, dict(applied)))
    txs = workload.transactions
    assert [r.commit_seq for r in log] == list(range(1, len(log) + 1))
    assert sum(not r.correction for r in log) == len(txs), "not every transaction released"
    # The history the engine's releases make: the source's transactions in commit order,
    # each correction where it was applied; each correction row between its A and B.
    history: list[SourceTransaction] = []
    released = 0
    applied_rows: set[tuple[str, int]] = set()
    for release in log:
        if not release.correction:
            history.append(txs[released])
            released += 1
            continue
        changes = []
        for position in release.rows:
            n, chunk, i = where[position]
            before = [k for k in range(n + 1) if touches(txs[k], chunk.table)]
            after = [k for k in range(n + 1, len(txs)) if touches(txs[k], chunk.table)]
            anchor, following = (before[-1] if before else -1), (after[0] if after else len(txs))
            assert anchor < released <= following, (
                f"a row of {chunk.table} written after T{n + 1} applied after T{released}, "
                f"not between T{anchor + 1} and T{following + 1}")
            assert chunk.differs[i], f"a row of {chunk.table} equal to the state was applied"
            applied_rows.add(position)
            changes.append(RowChange("update", chunk.table, chunk.rows[i]))
        history.append(SourceTransaction(f"c{release.commit_seq}", changes))
    missed = [where[p][1].table for p, (_, c, i) in where.items()
              if c.differs[i] and p not in applied_rows]
    assert not missed, f"corrections of {missed} never applied"
    expected = outputs_after_each(job, workload.snapshot, history)
    last_k = -1
    for k, state in states:
        assert k >= last_k
        last_k = k
        assert state == expected[k], f"not the oracle's output after release {k}"
    assert applied == expected[-1]
    return batches


@pytest.mark.parametrize("variant", sorted(JOB_VARIANTS))
@given(data=st.data())
def test_incremental_rows_are_applied_between_the_transactions_around_them(
        variant: str, data: Any) -> None:
    job, rows = JOB_VARIANTS[variant]
    workload = data.draw(workloads(rows), label="workload")
    workload = data.draw(incremental_snapshots(workload, rows), label="incremental")
    run_and_check(job, workload, data)


@given(data=st.data())
def test_incremental_rows_give_the_same_stream_at_every_shard_count_and_after_restarts(
        data: Any) -> None:
    """1-4 shards, each losing its cached engine at random (restored from its log), and
    an engine restored from its serialised state before every batch: the single engine's
    change stream, batch for batch."""
    variant = data.draw(st.sampled_from(sorted(JOB_VARIANTS)), label="variant")
    job, rows = JOB_VARIANTS[variant]
    workload = data.draw(workloads(rows), label="workload")
    workload = data.draw(incremental_snapshots(workload, rows), label="incremental")
    batches = run_and_check(job, workload, data)
    assert_restarts_change_nothing(job, batches)

    def stream(engine: Any, n_shards: int | None) -> list[Any]:
        out = []
        for n, batch in enumerate(batches):
            records = [(r.topic, 0, r.offset, r.value) for r in batch.records]
            caught = {t.removeprefix(PREFIX) for t in batch.caught_up}
            if n_shards is None:
                changes = engine.process(records, caught_up=caught)
            else:
                drop = data.draw(st.sets(st.integers(0, n_shards - 1)),
                                 label=f"drop cache {n_shards}/{n}")
                changes = engine.process(records, caught, drop_cache=drop)
                assert engine.commit_seq >= 0  # every shard released the same
            out.append(sorted((repr(ch.key), ch.commit_seq, repr(ch.row)) for ch in changes))
        return out

    single = stream(Engine(job), None)
    n_shards = data.draw(st.integers(1, 4), label="shards")
    assert stream(ShardedEngine(job, n_shards), n_shards) == single


# -- the cases one by one --------------------------------------------------------------

def incremental(pipe: Pipeline, table: str, rows: list[dict[str, Any]]) -> list[Any]:
    return pipe.synth.incremental(f"public.{table}", rows)


def test_a_row_equal_to_the_state_changes_nothing() -> None:
    pipe = Pipeline(ORDERS)
    pipe.snapshot(PIZZERIA)
    pipe.deliver_rest()
    before, seq = dict(pipe.output), pipe.engine.commit_seq
    assert pipe.deliver(incremental(pipe, "pizzas", PIZZERIA["pizzas"])) == []
    assert pipe.output == before and pipe.engine.commit_seq == seq


def test_a_correction_is_one_release_of_its_own_with_the_snapshots_xid() -> None:
    job = JOB_VARIANTS["orders/current"][0]
    pipe = Pipeline(job)
    pipe.snapshot(PIZZERIA)
    pipe.deliver_rest()
    changes = pipe.deliver(incremental(pipe, "pizzas", [
        {"id": 1, "name": "Margherita", "price": "7.00"},
        {"id": 2, "name": "Diavola", "price": "9.00"}]))
    assert [(ch.key, ch.commit_seq, ch.xid, ch.source) for ch in changes] == [
        ((10,), 1, SNAPSHOT_XID, None)]
    assert [p["price"] for p in changes[0].row["pizzas"]] == [7, 9]  # type: ignore[index]


def test_a_redelivered_row_is_not_applied_again_after_a_later_change() -> None:
    pipe = Pipeline(ORDERS)
    pipe.snapshot(PIZZERIA)
    pipe.deliver_rest()
    row = incremental(pipe, "clients", [{"id": 2, "name": "Bea"}])
    pipe.deliver(row)
    # as_of_fact: the order keeps the client it was placed with; the client is corrected
    assert pipe.output[(10,)]["client_name"] == "Bob" and pipe.engine.commit_seq == 1
    pipe.deliver(pipe.commit("t", RowChange("update", "public.clients", {"id": 2, "name": "Cy"})))
    seq = pipe.engine.commit_seq
    assert pipe.deliver(row) == [] and pipe.engine.commit_seq == seq  # rewound: offset seen
    assert pipe.engine.join.rows["public.clients"][(2,)]["name"] == "Cy"


def test_a_row_waits_for_the_open_transaction_before_it() -> None:
    pipe = Pipeline(JOB_VARIANTS["orders/current"][0])
    pipe.snapshot(PIZZERIA)
    pipe.deliver_rest()
    tx = pipe.commit("t", RowChange("update", "public.pizzas", {
        "id": 1, "name": "Margherita", "price": "8.00"}))
    row = incremental(pipe, "pizzas", [{"id": 1, "name": "Margherita", "price": "7.50"}])
    data = [r for r in tx if r.kind == "data"]
    assert pipe.deliver([*data, *row]) == []  # the transaction's END not read: both wait
    changes = pipe.deliver([r for r in tx if r.kind != "data"])
    assert [(ch.commit_seq, [p["price"] for p in ch.row["pizzas"]]) for ch in changes] == [
        (1, [8, 9]), (2, [7.5, 9])]


def test_a_row_on_a_partitioned_topic_stops_the_job_in_one_line() -> None:
    pipe = Pipeline(ORDERS)
    pipe.snapshot(PIZZERIA)
    row = incremental(pipe, "pizzas", PIZZERIA["pizzas"][:1])[0]
    decoded = decode(row.value, Position(row.topic, 0, row.offset))
    assert isinstance(decoded, ChangeEvent)
    with pytest.raises(OrderingError) as exc:
        IncrementalRows().add(decoded, {}, 3, None)
    assert "\n" not in str(exc.value) and "with 3 partitions" in str(exc.value)


def test_a_row_of_a_table_without_its_initial_snapshot_stops_the_job_in_one_line() -> None:
    pipe = Pipeline(ORDERS)
    pipe.snapshot({k: v for k, v in PIZZERIA.items() if k != "pizzas"})
    pipe.deliver(pipe.undelivered(), caught_up=())
    row = incremental(pipe, "pizzas", PIZZERIA["pizzas"][:1])
    before = dict(pipe.output)
    with pytest.raises(OrderingError) as exc:
        pipe.deliver(row, caught_up=())
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith(f"incremental snapshot row of public.pizzas at "
                              f"shop.public.pizzas[0]@{row[0].offset} (Debezium's "
                              f"execute-snapshot signal) before txjoin has the table's "
                              f"initial snapshot")
    assert pipe.output == before


def test_a_state_from_before_incremental_snapshots_restores_with_none_read() -> None:
    engine = Engine(ORDERS)
    version, state = pickle.loads(engine.state_bytes())
    assert version == ENGINE_STATE_VERSION
    for parts in state["sources"].values():
        del parts["assembler"]["incremental"]
    restored = Engine.from_state(ORDERS, pickle.dumps((3, state)))
    assert restored.assembler.incremental.state() == engine.assembler.incremental.state()


@pytest.mark.parametrize("table", ["public.orders", "public.pizzas"])
@pytest.mark.parametrize("differs", [True, False])
def test_the_workloads_hold_equal_rows_and_corrections_of_facts_and_looked_up_rows(
        table: str, differs: bool) -> None:
    """The property tests above reach both kinds of rows in both kinds of tables, behind
    transactions that touch the table (``find`` fails when no example does)."""
    found = find(workloads(PIZZERIA_ROWS).flatmap(
                     lambda w: incremental_snapshots(w, PIZZERIA_ROWS)),
                 lambda w: any(c.table == table and differs in c.differs and n >= 0
                               and touches(w.transactions[n], table)
                               for n, cs in w.incremental.items() for c in cs),
                 settings=settings(max_examples=3000, database=None, phases=[Phase.generate]))
    assert found.incremental


def test_a_layout_8_log_continues_under_todays_layout(monkeypatch: pytest.MonkeyPatch
                                                     ) -> None:
    """A shard log written before incremental snapshots were applied (no ``incremental`` in
    its states) is read as it is and continued; from its next segment on it says today's
    layout."""
    from tests.unit.delivery import continue_older_layout, pizzeria_rows
    from txjoin.join.state_log import LAYOUT_VERSION
    from txjoin.sequence.assembly import Assembler

    saved = Assembler.state

    def layout_8_state(self: Assembler, rows: bool = True) -> dict[str, Any]:
        return {k: v for k, v in saved(self, rows).items() if k != "incremental"}

    assert LAYOUT_VERSION >= 9
    continued = continue_older_layout(
        ORDERS, pizzeria_rows(ORDERS, 60, seed=3), 20, 8, layout_8_state, monkeypatch)
    assert continued.commit_seq > 0
