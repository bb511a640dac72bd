"""Transactions a micro-batch holds whole (txjoin/sequence/whole.py): released without a
buffer, or opened as the rules open them, and deciding exactly what event by event decides.

The property tests of test_sharding.py (``_compare_counting``) and test_staged.py run the
same comparison over drawn workloads, deliveries and restarts; these pin down each case."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_properties import JOB_VARIANTS
from tests.unit.test_sharding import _decided, _foreign_facts, _marker
from txjoin.ingest.debezium import ChangeEvent, Position
from txjoin.join.routing import METADATA_SIZE, Routed, gather_foreign
from txjoin.join.shard import ShardEngine
from txjoin.sequence.assembly import Assembler

JOB, _ = JOB_VARIANTS["orders/as_of_fact"]


def _run(batches: list[list[Routed]], monkeypatch: pytest.MonkeyPatch
         ) -> tuple[ShardEngine, list[int]]:
    """Shard 0 of 2 fed the batches with the other shard's facts as columns, checked against
    a shard fed them event by event after every batch; the xids it opened a buffer for."""
    opened: list[int] = []
    open_ = Assembler._open

    def spy(self: Assembler, xid: int) -> Any:
        if xid not in self.pending:
            opened.append(xid)
        return open_(self, xid)

    monkeypatch.setattr(Assembler, "_open", spy)
    by_run, by_event = ShardEngine(JOB, 0, 2), ShardEngine(JOB, 0, 2)
    # the empty snapshot settles first: every topic read to its end, and a transaction
    settle = [_marker("BEGIN", 5, 0), _marker("END", 5, 1)]
    for n, batch in enumerate([settle, *batches]):
        caught = JOB.table_names if n == 0 else []
        by_run.process_routed(gather_foreign([JOB.fact], batch), caught)
        mark = len(opened)
        by_event.process_routed(batch, caught)
        del opened[0 if n == 0 else mark:]
        assert _decided(by_run) == _decided(by_event), f"batch {n}"
    return by_run, opened


def _released(engine: ShardEngine) -> list[int]:
    return list(engine.frontier._released_order)[1:]  # after the settling one


def test_a_transaction_the_batch_holds_whole_is_released_without_a_buffer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    batch = [_marker("BEGIN", 7, 10), *_foreign_facts(7, [(100, 1), (101, 2), (102, 3)], 0),
             _marker("END", 7, 11, 3)]
    engine, opened = _run([batch], monkeypatch)
    assert _released(engine) == [7] and engine.frontier.commit_seq == 2
    assert opened == []


def test_one_an_incomplete_transaction_holds_back_is_opened_as_the_rules_open_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Transaction 6 misses its second event; 7, whole, waits behind it and is buffered
    as event by event buffers it; the next batch completes 6, and both go in commit order."""
    first = [_marker("BEGIN", 6, 10), *_foreign_facts(6, [(90, 1)], 0), _marker("END", 6, 11, 2),
             _marker("BEGIN", 7, 12), *_foreign_facts(7, [(100, 1), (101, 2)], 1),
             _marker("END", 7, 13, 2)]
    second = _foreign_facts(6, [(91, 2)], 3)
    engine, opened = _run([first], monkeypatch)
    assert _released(engine) == [] and sorted(engine.assembler.pending) == [6, 7]
    assert opened == [6, 7]
    engine, opened = _run([first, second], monkeypatch)
    assert _released(engine) == [6, 7] and engine.frontier.commit_seq == 3


def _same_content_twice() -> list[Routed]:
    twice = ChangeEvent("public.orders", "c", None, None, 7, 100, 1000, "false", 2,
                        Position("shop.public.orders", 0, 1), bytes([100]))
    return [_marker("BEGIN", 7, 10), *_foreign_facts(7, [(100, 1)], 0),
            Routed(twice, METADATA_SIZE), _marker("END", 7, 11, 2)]


@pytest.mark.parametrize("case", ["a number missing", "numbered from 2", "a second BEGIN",
                                  "the same content twice", "a table END does not count"])
def test_what_is_not_whole_goes_by_the_rules(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each batch below holds all of xid 7 but one thing the rules decide on: it opens a
    buffer and decides as event by event."""
    begin, end = _marker("BEGIN", 7, 10), _marker("END", 7, 12, 2)
    batch = {
        "a number missing": [begin, *_foreign_facts(7, [(100, 1), (101, 3)], 0), end],
        "numbered from 2": [begin, *_foreign_facts(7, [(100, 2), (101, 3)], 0), end],
        "a second BEGIN": [begin, _marker("BEGIN", 7, 11),
                           *_foreign_facts(7, [(100, 1), (101, 2)], 0), end],
        "the same content twice": _same_content_twice(),
        "a table END does not count": [begin, *_foreign_facts(7, [(100, 1), (101, 2)], 0),
                                       _marker("END", 7, 12, 0)],
    }[case]
    _engine, opened = _run([batch], monkeypatch)
    assert opened == [7]
