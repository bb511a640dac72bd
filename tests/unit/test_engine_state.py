"""The engine's saved state: named fields under one version, refused with what to do otherwise."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from tests.unit.delivery import pizzeria_rows
from tests.unit.test_properties import JOB_VARIANTS
from txjoin.errors import ConfigError
from txjoin.ingest.debezium import ChangeEvent, Position, decode
from txjoin.join.engine import Engine
from txjoin.join.routing import Router
from txjoin.join.shard import ShardEngine
from txjoin.join.sharded import ShardedEngine
from txjoin.join.state import ENGINE_STATE_VERSION
from txjoin.join.state_log import SEGMENT, ShardLog, _unpack
from txjoin.join.temporal import TemporalJoin
from txjoin.sequence.assembly import Assembler, SnapshotBuffer, identity_digest
from txjoin.sequence.frontier import Frontier
from txjoin.sequence.incremental import IncrementalRows

# What each object holds besides the fields it saves, and why it need not be saved.
NOT_SAVED = {
    Engine: {"job", "policy", "assemblers", "frontiers", "join",  # from the constructor;
             # the three saved on their own
             "_marker_sources", "_table_sources", "batch_join_s",  # derived; last batch
             "_whole"},  # within a batch only (empty between batches: sequence/whole.py)
    ShardEngine: {"shard", "n_shards", "max_transaction_bytes",  # constructor, run config
                  "last_effects", "batch_snapshot_rows", "batch_wire_s",  # the last batch
                  "log_version", "log_token"},  # set by the state log
    Assembler: {"tables", "snapshot", "incremental",  # the two saved on their own
                # the last batch's changes to the open transactions
                "touched", "gone", "born", "added"},
    SnapshotBuffer: {"tables"},
    IncrementalRows: set(),
    Frontier: set(),
    # _where, _lookup_where, _computed: the job's expressions, compiled (txjoin/expr.py)
    # _aggregates: the job's Aggregate columns, compiled; _nested, _having: the aggregates
    # its expressions read and its HAVING, compiled; _columns, _collected: the job's;
    # _below, _plan: the job's lookup tree and output columns as evaluate walks them
    TemporalJoin: {"job", "journal", "_columns", "_collected", "_where", "_lookup_where",
                   "_computed", "_aggregates", "_nested", "_having", "_below", "_plan"},
}


def engine_after_a_workload(n_shards: int = 1) -> tuple[ShardedEngine, list]:
    job, _rows = JOB_VARIANTS["orders/as_of_fact"]
    rows = pizzeria_rows(job, 120, seed=2)
    engine = ShardedEngine(job, n_shards)
    engine.process(rows[: len(rows) // 2], [*job.table_names, "transaction"])
    return engine, rows[len(rows) // 2:]


def saved_fields(obj: object) -> set[str]:
    fields = set(type(obj).FIELDS)  # type: ignore[attr-defined]
    for extra in ("ROW_FIELDS", "RELEASED_FIELDS"):
        fields |= set(getattr(type(obj), extra, ()))
    return fields


def test_every_attribute_is_saved_or_declared_not_to_be() -> None:
    """An attribute added later must be put in FIELDS or in NOT_SAVED above, on purpose."""
    engine, _ = engine_after_a_workload()
    shard = engine.engines()[0]
    assembler = shard.assembler
    objects = [(shard, NOT_SAVED[Engine] | NOT_SAVED[ShardEngine]), (assembler,
               NOT_SAVED[Assembler]), (assembler.snapshot, NOT_SAVED[SnapshotBuffer]),
               (shard.frontier, NOT_SAVED[Frontier]), (shard.join, NOT_SAVED[TemporalJoin]),
               (assembler.incremental, NOT_SAVED[IncrementalRows])]
    for obj, not_saved in objects:
        assert set(vars(obj)) == saved_fields(obj) | not_saved, type(obj).__name__


def test_a_restored_engine_continues_like_the_original() -> None:
    engine, rest = engine_after_a_workload()
    original = engine.engines()[0]
    job = original.job
    restored = Engine.from_state(job, original.state_bytes())
    plain = Engine.from_state(job, original.state_bytes())
    assert restored.outputs() == original.outputs()
    caught = [*job.table_names, "transaction"]
    assert restored.process(rest, caught) == plain.process(rest, caught)
    assert restored.commit_seq == plain.commit_seq > original.commit_seq


def test_a_version_2_state_with_output_rows_is_packed_as_it_is_read() -> None:
    """Version 2 saved the last outputs as rows and the snapshot's identities whole;
    version 3 packs them."""
    engine, rest = engine_after_a_workload()
    original = engine.engines()[0]
    job = original.job
    version, state = pickle.loads(original.state_bytes())
    assert version == ENGINE_STATE_VERSION and original.join.outputs
    assert all(isinstance(v, tuple) for v in state["join"]["outputs"].values())
    unpack = original.join.unpack
    state["join"]["outputs"] = {k: unpack(v) for k, v in state["join"]["outputs"].items()}
    snapshot = state["sources"]["default"]["assembler"]["snapshot"]
    digests = snapshot["identities"]
    assert digests and all(isinstance(i, bytes) for i in digests)
    decoded = [decode(v, Position(t, p, o)) for t, p, o, v in pizzeria_rows(job, 120, seed=2)]
    routed = [Router(job, 1).route(ev, 0)[0] for ev in decoded if ev is not None]
    whole = {r.item.identity for r in routed
             if r is not None and isinstance(r.item, ChangeEvent) and r.item.op == "r"}
    assert {identity_digest(i) for i in whole} >= digests
    snapshot["identities"] = {i for i in whole if identity_digest(i) in digests}
    old = Engine.from_state(job, pickle.dumps((2, state)))
    current = Engine.from_state(job, original.state_bytes())
    assert old.join.outputs == original.join.outputs
    assert old.assembler.snapshot.identities == digests
    assert old.outputs() == original.outputs()
    caught = [*job.table_names, "transaction"]
    assert old.process(rest, caught) == current.process(rest, caught)


def test_a_state_of_another_version_or_lacking_a_field_is_refused_with_what_to_do() -> None:
    engine, _ = engine_after_a_workload()
    original = engine.engines()[0]
    job = original.job
    version, state = pickle.loads(original.state_bytes())
    assert version == ENGINE_STATE_VERSION
    with pytest.raises(ConfigError, match=r"engine state has version 1, this txjoin reads "
                                          r"versions 2, 3 and 4; .*txjoin run --rebuild"):
        Engine.from_state(job, pickle.dumps((1, state)))
    del state["sources"]["default"]["frontier"]["commit_seq"]
    with pytest.raises(ConfigError, match=r"saved Frontier state lacks commit_seq: .*--rebuild"):
        Engine.from_state(job, pickle.dumps((version, state)))


def test_a_restored_shard_keeps_counting_an_open_transaction_against_its_budget() -> None:
    job, _rows = JOB_VARIANTS["orders/as_of_fact"]
    rows = pizzeria_rows(job, 40, seed=4)
    ends = [i for i, r in enumerate(rows) if r[0].endswith(".transaction")]
    cut = ends[-2] - 1  # before the last transactions' END: their events stay open
    engine = ShardedEngine(job, 1, max_transaction_bytes=10**9)
    engine.process(rows[:cut], [])
    shard = engine.engines()[0]
    assert shard.open_bytes, "nothing open to count"
    restored = ShardEngine.from_state(job, shard.state_bytes(), shard=0, n_shards=1)
    assert restored.open_bytes == shard.open_bytes


def test_a_shard_log_segment_lacking_a_field_is_refused() -> None:
    engine, _ = engine_after_a_workload()
    store = engine.stores[0]
    key, blob = next((k, v) for k, v in store.blobs.items() if k[0] == SEGMENT)
    segment = _unpack(blob[4:])
    del segment.effects.sequencer["engine"]["applied_seq"]
    log = ShardLog(store, engine.job, 0, 1)
    log._write(SEGMENT, key[1], segment)
    with pytest.raises(ConfigError, match="saved ShardEngine state lacks applied_seq"):
        log.load(None)


def test_the_core_has_no_dict_copies_left() -> None:
    core = Path(__file__).resolve().parents[2] / "txjoin" / "core"
    for module in core.glob("*.py"):
        assert "__dict__" not in module.read_text(), module.name


def test_a_batch_logs_the_open_transactions_it_changed_not_the_backlog() -> None:
    """With nothing released (no END read yet) the open transactions pile up; each
    batch's segment still carries only what that batch added."""
    job, _rows = JOB_VARIANTS["orders/as_of_fact"]
    rows = pizzeria_rows(job, 400, seed=6)
    data = [r for r in rows if not r[0].endswith(".transaction")]
    engine = ShardedEngine(job, 1)
    written = []
    for start in range(0, 1000, 100):
        before = engine.stores[0].written
        engine.process(data[start:start + 100], [])
        written.append(engine.stores[0].written - before)
    assert engine.engines()[0].waiting > 150  # a backlog of open transactions
    assert max(written[5:]) < 2 * min(written[1:5]), written


def test_events_and_markers_pickle_as_their_fields_and_default_pickles_still_load() -> None:
    """Shards pickle their state, open transactions' events with it, every batch: events
    and markers pickle as constructor and field values (txjoin.ingest.debezium), and a
    state pickled the dataclass way (by an earlier txjoin) still loads."""
    import copyreg
    import io
    from typing import Any

    from txjoin.ingest.debezium import TxMarker

    job, _rows = JOB_VARIANTS["orders/as_of_fact"]
    decoded = [decode(v, Position(t, p, o)) for t, p, o, v in pizzeria_rows(job, 40, seed=3)]
    items = [d for d in decoded if d is not None]
    assert {type(d).__name__ for d in items} == {"ChangeEvent", "TxMarker"}
    routed = [r.item for ev in items if isinstance(ev, ChangeEvent)
              for r in Router(job, 2).route(ev, 0) if r is not None]
    stripped = [r for r in routed if isinstance(r, ChangeEvent) and r.digest is not None]
    assert stripped  # events a shard keeps without their rows
    items += stripped
    for proto in range(2, pickle.HIGHEST_PROTOCOL + 1):
        again = pickle.loads(pickle.dumps(items, protocol=proto))
        assert again == items and [type(i) for i in again] == [type(i) for i in items]
    assert items[0].__reduce__()[0] is type(items[0])

    class DefaultWay(pickle.Pickler):  # pickles them as the dataclass did before
        def reducer_override(self, obj: object) -> Any:
            if isinstance(obj, (ChangeEvent, TxMarker, Position)):
                return copyreg.__newobj__, (type(obj),), obj.__getstate__()  # type: ignore
            return NotImplemented

    earlier = io.BytesIO()
    DefaultWay(earlier, protocol=5).dump(items)
    assert earlier.getvalue() != pickle.dumps(items, protocol=5)
    assert pickle.loads(earlier.getvalue()) == items
