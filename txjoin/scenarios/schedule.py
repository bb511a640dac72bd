"""Compile a scenario's delivery into the micro-batches a replay feeds the pipeline.

Records are synthesized with :class:`~txjoin.scenarios.synthesize.Synthesizer`
exactly as Debezium writes them: the snapshot first, then the transactions in
file (commit) order. The *production order* of these records is the order in
which the connector wrote them.

**Batches.** Each listed batch is the union of its selectors' events (a set).
Within a batch the events of one topic are delivered in that topic's order;
across topics the records keep the order in which the selectors first mention
them. A ``restart`` becomes a :class:`Restart` step. Without ``delivery.batches``
the schedule is one batch of every event (minus withheld ones) in commit order.

**Kafka's promise**, checked here (exit 2 naming the two events otherwise): a
topic is read in order, so an event may be delivered for the first time only if
every earlier event of its topic was delivered before or is in the same batch.
Hence the events delivered so far are always a prefix of each topic. Delivering
an event again is allowed only

- through ``delivery.duplicate``: each listed event is delivered a second time,
  in a batch of its own (:attr:`ReplayBatch.duplicate`), right after the batch
  that first delivered it;
- in the first batch after a ``restart`` (a consumer rewinding to its committed
  offset): the events it reads of one topic must then be one contiguous run of
  that topic.

A tombstone is selected with its delete event. Every event must be delivered at
least once unless ``delivery.withhold`` lists it; a withheld event is never
delivered, so no later event of its topic can be either.

**Caught up** (``ReplayBatch.caught_up``, topic names). A real source plans a
batch at some moment and reports the topics it read to the end offset they had
then. Here the *planning point* of a batch is the production index of the
latest-produced record delivered in this batch or any earlier one: every record
produced up to it exists when the batch is planned. A topic is caught up in a
batch when, after the batch, every record of that topic produced up to the
planning point has been delivered. A topic with a withheld event is never caught
up (its end is never reached). A duplicate batch reports what its batch reported.
The engine uses this to settle tables without snapshot rows and to confirm a
transaction renumbered by a connector restart (see :mod:`txjoin.sequence.assembly`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from txjoin.errors import ScenarioError
from txjoin.scenarios.spec import BatchSpec, RestartSpec, Scenario, Selector
from txjoin.scenarios.synthesize import Produced, SourcesSynthesizer, Synthesizer

RecordId = tuple[str, int]  # (topic, offset)


@dataclass(frozen=True)
class ReplayBatch:
    """One micro-batch: records to deliver (each topic in its order) and caught-up topics."""

    records: list[Produced]
    caught_up: set[str]  # topics read to their end as of the batch's planning point
    number: int = 0  # the listed batch it belongs to (the key of `expect.frontier`)
    duplicate: bool = False  # the second delivery of `delivery.duplicate` events
    line: int = 0  # line of the batch in the scenario file (0: default delivery)

    @property
    def label(self) -> str:
        """How reports name this batch: ``batch 2`` or ``batch 2 (duplicates)``."""
        return f"batch {self.number}" + (" (duplicates)" if self.duplicate else "")

    def source_rows(self) -> list[tuple[str, int, int, str | None, str | None]]:
        """The records as a source yields them: ``(topic, partition, offset, key, value)``."""
        return [(r.topic, 0, r.offset, r.key, r.value) for r in self.records]


@dataclass(frozen=True)
class Restart:
    """The processor stops here; the next batch runs in a fresh process from the checkpoint."""

    line: int = 0


Step = ReplayBatch | Restart


@dataclass
class Schedule:
    """Every synthesized record, and the steps that deliver them."""

    steps: list[Step]
    produced: list[Produced]  # in production order
    topics: list[str]
    topic_prefix: str
    tables: list[str] = field(default_factory=list)
    streams: dict[str, str] = field(default_factory=dict)  # topic -> stream (Job.streams)

    @property
    def batches(self) -> list[ReplayBatch]:
        """The micro-batches, without the restarts."""
        return [s for s in self.steps if isinstance(s, ReplayBatch)]

    def table_of(self, topic: str) -> str | None:
        """The job table a topic carries (None for the transaction topic)."""
        if self.streams:
            table = self.streams.get(topic)
        else:
            table = topic.removeprefix(f"{self.topic_prefix}.")
        return table if table in self.tables else None

    def caught_up_tables(self, batch: ReplayBatch) -> set[str]:
        """``batch.caught_up`` as table names, as :meth:`Engine.process` takes them."""
        return {t for t in (self.table_of(topic) for topic in batch.caught_up) if t is not None}


def describe(rec: Produced) -> str:
    """An event named like the selector that picks it: ``t1:public.orders#0``, ``t2:end``."""
    if rec.kind in ("begin", "end"):
        return f"{rec.tx}:{rec.kind}"
    text = f"{rec.tx}:{rec.table}#{rec.index}"
    return text + " (tombstone)" if rec.kind == "tombstone" else text


def _rid(rec: Produced) -> RecordId:
    return (rec.topic, rec.offset)


def _matches(sel: Selector, rec: Produced) -> bool:
    if rec.tx != sel.tx:
        return False
    if sel.part == "*":
        return True
    if sel.part in ("begin", "end"):
        return rec.kind == sel.part
    return rec.table == sel.part and (sel.index is None or rec.index == sel.index)


def _resolve(selectors: Iterable[Selector], produced: Sequence[Produced]) -> list[Produced]:
    """The union of the selectors' events, in order of first mention (topic order per selector)."""
    out: list[Produced] = []
    seen: set[RecordId] = set()
    for sel in selectors:
        for rec in produced:
            if _matches(sel, rec) and _rid(rec) not in seen:
                seen.add(_rid(rec))
                out.append(rec)
    return out


def _in_topic_order(records: list[Produced]) -> list[Produced]:
    """Keep the cross-topic interleaving, put each topic's records in offset order."""
    by_topic: dict[str, list[Produced]] = {}
    for rec in records:
        by_topic.setdefault(rec.topic, []).append(rec)
    queues = {t: iter(sorted(recs, key=lambda r: r.offset)) for t, recs in by_topic.items()}
    return [next(queues[rec.topic]) for rec in records]


def synthesize(scenario: Scenario) -> tuple[list[Produced], list[str]]:
    """All records of the scenario in production order, and the topics (transaction topic first)."""
    synth: Synthesizer | SourcesSynthesizer
    if scenario.multi_source:
        synth = SourcesSynthesizer(scenario.job, scenario.prefixes)
    else:
        synth = Synthesizer(scenario.job, prefix=scenario.topic_prefix)
    produced = list(synth.snapshot(scenario.snapshot))
    for tx in scenario.transactions:
        produced.extend(synth.transaction(tx))
    return produced, list(synth.topics)


def compile_schedule(scenario: Scenario) -> Schedule:
    """Turn the scenario's delivery into replay steps; :class:`ScenarioError` if it is invalid."""
    produced, topics = synthesize(scenario)
    rank = {_rid(r): k for k, r in enumerate(produced)}
    by_topic: dict[str, list[Produced]] = {t: [] for t in topics}
    for rec in produced:
        by_topic.setdefault(rec.topic, []).append(rec)

    def fail(line: int, where: str, message: str) -> ScenarioError:
        return ScenarioError(f"{scenario.path}:{line}: {where}: {message}")

    withheld: dict[RecordId, Selector] = {}
    for sel in scenario.withhold:
        for rec in _resolve([sel], produced):
            withheld[_rid(rec)] = sel
    withheld_topics = {topic for topic, _ in withheld}
    duplicated: dict[RecordId, Selector] = {}
    for sel in scenario.duplicate:
        for rec in _resolve([sel], produced):
            if _rid(rec) in withheld:
                raise fail(sel.line, sel.where,
                           f"{describe(rec)} is duplicated but also withheld "
                           f"({withheld[_rid(rec)].where}); it is never delivered")
            duplicated[_rid(rec)] = sel

    plan: list[BatchSpec | RestartSpec]
    if scenario.delivery is None:
        everything = [r for r in produced if _rid(r) not in withheld]
        plan = [BatchSpec(0, (), "delivery", scenario.delivery_line)]
        default_records: list[Produced] | None = everything
    else:
        plan = scenario.delivery
        default_records = None

    delivered = dict.fromkeys(topics, 0)  # per topic: length of the delivered prefix
    first_batch: dict[RecordId, int] = {}
    planning = -1
    rewind = False
    steps: list[Step] = []
    for spec in plan:
        if isinstance(spec, RestartSpec):
            steps.append(Restart(spec.line))
            rewind = True
            continue
        if default_records is not None:
            records = default_records
            origin: dict[RecordId, Selector | None] = {_rid(r): None for r in records}
        else:
            records, origin = [], {}
            for sel in spec.selectors:
                picked = _resolve([sel], produced)
                if not rewind:
                    # "the rest of": outside a rewind a selector delivers what is still due
                    fresh = [r for r in picked if _rid(r) not in first_batch]
                    if not fresh:
                        before = sorted({first_batch[_rid(r)] for r in picked})
                        raise fail(sel.line, sel.where,
                                   f"{sel.text!r} selects only events already delivered (in "
                                   f"batch {', '.join(map(str, before))}); only the first "
                                   f"batch after a `restart` re-delivers events (a rewind), or "
                                   f"list them in delivery.duplicate")
                    picked = fresh
                for rec in picked:
                    if _rid(rec) not in origin:
                        origin[_rid(rec)] = sel
                        records.append(rec)

        def where_of(rec: Produced, spec: BatchSpec = spec,
                     origin: dict[RecordId, Selector | None] = origin) -> tuple[int, str]:
            sel = origin.get(_rid(rec))
            return (sel.line, sel.where) if sel is not None else (spec.line, spec.where)

        for rec in records:
            if _rid(rec) in withheld:
                line, where = where_of(rec)
                raise fail(line, where, f"{describe(rec)} is delivered in batch {spec.number} "
                                        f"but listed in delivery.withhold "
                                        f"({withheld[_rid(rec)].where}, line "
                                        f"{withheld[_rid(rec)].line})")
        per_topic: dict[str, list[Produced]] = {}
        for rec in records:
            per_topic.setdefault(rec.topic, []).append(rec)
        for topic, recs in per_topic.items():
            recs.sort(key=lambda r: r.offset)
            done = delivered[topic]
            old = [r for r in recs if r.offset < done]
            new = [r for r in recs if r.offset >= done]
            if old and not rewind:
                rec = old[0]
                line, where = where_of(rec)
                raise fail(line, where,
                           f"{describe(rec)} is delivered again in batch {spec.number}, after "
                           f"its delivery in batch {first_batch[_rid(rec)]}; only the first "
                           f"batch after a `restart` may re-deliver events (a rewind), or list "
                           f"them in delivery.duplicate")
            if old:
                offsets = [r.offset for r in recs]
                gap = next((o for o, p in zip(offsets[1:], offsets, strict=False) if o != p + 1),
                           None)
                if gap is not None:
                    missing = by_topic[topic][offsets[offsets.index(gap) - 1] + 1]
                    rec = next(r for r in recs if r.offset == gap)
                    line, where = where_of(rec)
                    raise fail(line, where,
                               f"after the restart, batch {spec.number} re-reads {topic} "
                               f"including {describe(rec)} but skips {describe(missing)} "
                               f"before it; a rewound consumer reads its topic in order from "
                               f"the committed offset: add {describe(missing)} to the batch")
            expected = done
            for rec in new:
                if rec.offset != expected:
                    missing = by_topic[topic][expected]
                    line, where = where_of(rec)
                    why = (f"which is withheld, so nothing after it in {topic} can be "
                           f"delivered" if _rid(missing) in withheld else
                           "which has not been delivered yet")
                    raise fail(line, where,
                               f"{describe(rec)} is delivered in batch {spec.number} before "
                               f"{describe(missing)}, an earlier event of the same topic "
                               f"{topic} {why}. Kafka delivers a topic in order: deliver "
                               f"{describe(missing)} in this batch or an earlier one")
                expected += 1
            delivered[topic] = expected
        for rec in records:
            first_batch.setdefault(_rid(rec), spec.number)
            planning = max(planning, rank[_rid(rec)])
        caught = set()
        for topic, recs in by_topic.items():
            if topic in withheld_topics:
                continue
            produced_so_far = sum(1 for r in recs if rank[_rid(r)] <= planning)
            if delivered[topic] >= produced_so_far:
                caught.add(topic)
        steps.append(ReplayBatch(_in_topic_order(records), caught, spec.number, False, spec.line))
        dups = [r for r in records
                if _rid(r) in duplicated and first_batch[_rid(r)] == spec.number]
        if dups:
            steps.append(ReplayBatch(_in_topic_order(dups), set(caught), spec.number, True,
                                     spec.line))
        rewind = False

    undelivered = [r for r in produced if _rid(r) not in first_batch and _rid(r) not in withheld]
    if undelivered:
        names = ", ".join(describe(r) for r in undelivered[:6]) + (
            f" and {len(undelivered) - 6} more" if len(undelivered) > 6 else "")
        raise fail(scenario.delivery_line, "delivery.batches",
                   f"these events are never delivered: {names}. Add them to a batch, or list "
                   f"them in delivery.withhold if the output should be checked without them")
    return Schedule(steps, produced, topics, scenario.topic_prefix,
                    list(scenario.job.table_names),
                    scenario.job.streams(scenario.prefixes) if scenario.multi_source else {})
