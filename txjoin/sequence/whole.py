"""Transactions a micro-batch holds whole: released without an open buffer.

A streaming transaction is usually read in one micro-batch: its BEGIN, every event of
it and its END. When all of that is in the batch, its events are counted per transaction
(``join/routing.ForeignFacts``: the events of a table whose rows the engine does not
hold, the staged engine's sequencer's every table and a shard's other shards' facts), and
nothing of it was buffered before, the rules of ``assembly.py`` can only find it complete:
opening a :class:`~txjoin.sequence.assembly.PendingTransaction`, adding the markers and a
``FactRun`` per table and asking whether END's counts are met would decide what the
checks below decide, at several times their cost (the sequencer is one task per batch,
so its cost per transaction is every shard count's).

Such a transaction goes to the frontier's queue at its END, as any, and is released from
there in commit order without a buffer (``Frontier.release_streaming``). One that the
batch cannot release (an earlier transaction is still incomplete) is opened after the
batch's first release pass exactly as the rules would have opened it (:meth:`Whole.open`),
so the state that the batch leaves, and its record in a shard's log, is the same.

What the checks ask, per transaction (anything else goes the usual way):

- one BEGIN and one END of it in the batch, and neither open nor released before (a
  redelivery, a connector restart: the rules' business);
- no event of it but counted ones (an event whose rows the engine holds, a partitioned
  topic's, one routing could not read, a snapshot row);
- per job table of its source, END's count met by a run whose numbers are exactly
  ``1..n`` in topic order, and no run of a table END does not count;
- no two events of it with the same content identity (``ChangeEvent.identity``).

A batch with an incremental snapshot row is left to the rules whole (a row's place
depends on which transactions are open: ``incremental.py``), as is every batch before
the snapshot is done.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from txjoin.ingest.debezium import INCREMENTAL, ChangeEvent, TxMarker
from txjoin.sequence.assembly import Assembler, FactRun

if TYPE_CHECKING:
    from txjoin.join.routing import ForeignFacts
    from txjoin.sequence.frontier import Frontier


class Whole:
    """A transaction the batch holds whole: its markers and its runs (a table's counted
    events, row numbers of the table's :class:`ForeignFacts` in topic order)."""

    __slots__ = ("begin", "end", "runs")

    def __init__(self, begin: TxMarker, end: TxMarker,
                 runs: list[tuple[ForeignFacts, list[int]]]) -> None:
        self.begin, self.end, self.runs = begin, end, runs

    def commit_ts_ms(self) -> int | None:
        """What ``Assembler.take`` gives it: END's time, else the earliest time of it."""
        if self.end.ts_ms:
            return self.end.ts_ms
        times = [t for t in (self.begin.ts_ms, self.end.ts_ms) if t is not None]
        for facts, rows in self.runs:
            times.extend(t for t in (facts.ts_ms[r] for r in rows) if t is not None)
        return min(times) if times else None

    def open(self, assembler: Assembler, released: set[int]) -> None:
        """Buffer it as the rules would have (its markers in topic order, then its runs in
        table order, as ``Engine.process_decoded`` adds them); its END is queued already."""
        first, second = sorted((self.begin, self.end), key=lambda m: m.position.offset)
        assembler.add_marker(first, released)
        assembler.add_marker(second, released)
        for facts, rows in sorted(self.runs, key=lambda run: run[0].table):
            stamps = [t for t in (facts.ts_ms[r] for r in rows) if t is not None]
            run = FactRun(facts.table, [facts.numbers[r] for r in rows],  # type: ignore[misc]
                          [facts.identity(r) for r in rows], [],
                          min(stamps) if stamps else None)
            added = assembler.add_run(self.end.xid, run, released)
            assert added, f"xid {self.end.xid}: a whole transaction's run did not fit"


def whole_in_batch(items: Sequence[ChangeEvent | TxMarker], foreign: Iterable[ForeignFacts],
                   runs: Mapping[str, Mapping[int, list[int]]],
                   assemblers: Mapping[str, Assembler], frontiers: Mapping[str, Frontier],
                   source_of_marker: Callable[[TxMarker], str],
                   source_of_table: Callable[[str], str]) -> dict[str, dict[int, Whole]]:
    """The batch's whole transactions, per source and xid (the module docstring says which).

    ``items``: the batch's markers and events other than ``foreign`` (the counted events,
    one :class:`ForeignFacts` a table); ``runs``: per table of ``foreign``, its row numbers
    per xid in topic order (``ForeignFacts.by_xid``)."""
    if not runs:
        return {}
    markers: dict[tuple[str, int], list[TxMarker]] = {}
    eventful: set[int] = set()  # xids with an event that is not counted
    for item in items:
        if isinstance(item, TxMarker):
            markers.setdefault((source_of_marker(item), item.xid), []).append(item)
        elif item.snapshot == INCREMENTAL:
            return {}
        elif item.xid is not None:
            eventful.add(item.xid)
    by_source: dict[str, list[ForeignFacts]] = {}
    for facts in foreign:
        by_source.setdefault(source_of_table(facts.table), []).append(facts)
        # two events alike (ChangeEvent.identity): never with distinct LSNs, the usual
        if len(set(facts.lsns)) != len(facts.lsns):
            identities = list(zip(facts.xids, facts.ops, facts.lsns, facts.digests, strict=True))
            eventful.update(xid for (xid, *_), n in Counter(identities).items() if n > 1)
        if None in facts.numbers:
            eventful.update(x for x, n in zip(facts.xids, facts.numbers, strict=True) if n is None)
    out: dict[str, dict[int, Whole]] = {}
    for (source, xid), pair in markers.items():
        if len(pair) != 2 or xid in eventful:
            continue
        begin, end = pair if pair[0].status == "BEGIN" else (pair[1], pair[0])
        if begin.status != "BEGIN" or end.status != "END" or end.counts is None:
            continue
        assembler = assemblers[source]
        if xid in assembler.pending or xid in frontiers[source].released:
            continue
        need = {t: n for t, n in end.counts.items() if n and t in assembler.tables}
        found: list[tuple[ForeignFacts, list[int]]] = []
        for facts in by_source.get(source, ()):
            rows = runs[facts.table].get(xid)
            if rows is None:
                continue
            n = need.get(facts.table)
            if n is None or len(rows) != n or list(map(facts.numbers.__getitem__, rows)) != \
                    list(range(1, n + 1)):
                break
            found.append((facts, rows))
        else:
            if len(found) == len(need):
                out.setdefault(source, {})[xid] = Whole(begin, end, found)
    return out
