"""Hypothesis strategies: random source workloads and random Kafka deliveries of them."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import strategies as st

from txjoin.bench import key_partition
from txjoin.job import Job
from txjoin.join.oracle import RowChange, SourceTransaction
from txjoin.scenarios.synthesize import Produced, SourcesSynthesizer, Synthesizer

TIMES = ["2023-09-23T22:00:00", "2023-09-23T23:00:00", "2023-09-24T00:30:00"]

# Strategies built once: one built inside a draw is a new object each time, and Hypothesis
# checks every new one (emptiness, recursion) before drawing from it.
_NAMES = st.sampled_from(["Ann", "Bob", "Cid"])
_PIZZA_NAMES = st.sampled_from(["Margherita", "Diavola", "Napoli"])
_PRICES = st.sampled_from(["8.50", "9.00", "12.25", "9.5"])
_TABLE_NAMES = st.sampled_from(["T1", "T2", "Patio"])
_IDS = st.integers(1, 4)
_TIMES = st.sampled_from(TIMES)
_TIMES_OUT = st.sampled_from([None, *TIMES])
_MAYBE_ID = st.one_of(st.none(), _IDS)
_PIZZA_LISTS = st.one_of(st.none(), st.lists(st.integers(1, 5), max_size=4))
_FULL_NAMES = st.sampled_from(["Ann Lee", "Bo Wu"])
_COLORS = st.sampled_from(["red", "blue", "green"])

PIZZERIA_ROWS: dict[str, Any] = {
    "public.clients": lambda d, i: {"id": i, "name": d(_NAMES)},
    "public.pizzas": lambda d, i: {"id": i, "name": d(_PIZZA_NAMES), "price": d(_PRICES)},
    "public.tables": lambda d, i: {"id": i, "name": d(_TABLE_NAMES)},
    "public.table_assignment": lambda d, i: {
        "id": i, "client_id": d(_IDS), "table_id": d(_IDS),
        "time_in": d(_TIMES), "time_out": d(_TIMES_OUT)},
    "public.orders": lambda d, i: {
        "id": i, "table_assignment_id": d(_MAYBE_ID), "order_time": d(_TIMES),
        "pizzas": d(_PIZZA_LISTS)},
}

USERS_ROWS: dict[str, Any] = {
    "public.users": lambda d, i: {"id": i, "full_name": d(_FULL_NAMES)},
    "public.users_favorite_color": lambda d, i: {
        "id": i, "user_id": d(_MAYBE_ID), "favorite_color": d(_COLORS)},
}

KEY_SPACE = 5
LARGE_TX = (100, 300)
"""Changes in a large transaction (:func:`workloads` with ``large=True``): hundreds, against
the small ones' 0-4, so its records span many micro-batches between the small ones'."""


@dataclass
class Workload:
    snapshot: dict[str, list[dict[str, Any]]]
    transactions: list[SourceTransaction]
    restarts: dict[int, tuple[int, int]] = field(default_factory=dict)  # tx index -> (i, j)
    resends: dict[int, int] = field(default_factory=dict)  # tx index -> resend last n records
    key_changes: list[tuple[int, str, int, int]] = field(default_factory=list)
    """(tx index, table, old id, new id): primary-key updates (:func:`key_change`)."""
    incremental: dict[int, list[Chunk]] = field(default_factory=dict)
    """tx index -> incremental snapshot chunks written right after it (-1: right after the
    initial snapshot), in that order (:func:`incremental_snapshots`)."""


@dataclass
class Chunk:
    """Rows of one incremental snapshot chunk of ``table`` (Debezium's ``execute-snapshot``),
    each with whether it differs from the source's row as the captured events left it (a
    correction: a change the capture missed)."""

    table: str
    rows: list[dict[str, Any]]
    differs: list[bool]


def key_change(table: str, row: dict[str, Any], new_id: int) -> list[RowChange]:
    """A primary-key update of ``row`` to ``new_id`` as PostgreSQL's Debezium connector
    sends it: a delete of the old key, then a create of the new one, in one transaction."""
    return [RowChange("delete", table, {"id": row["id"]}),
            RowChange("insert", table, {**row, "id": new_id})]


def _large_transaction(draw: Any, rows: dict[str, Any], tables: list[str],
                       db: dict[str, dict[int, dict[str, Any]]]) -> list[RowChange]:
    """Hundreds of inserts, updates and deletes over the key space (``db`` kept as they
    leave it): rows from a small pool drawn once, chosen by a seeded generator, so a large
    transaction costs Hypothesis a few dozen draws rather than thousands."""
    pool = {t: [rows[t](draw, 0) for _ in range(4)] for t in tables}
    rnd = random.Random(draw(st.integers(0, 2**32 - 1), label="large seed"))
    changes: list[RowChange] = []
    for _ in range(draw(st.integers(*LARGE_TX), label="large size")):
        t = rnd.choice(tables)
        i = rnd.randint(1, KEY_SPACE)
        if i in db[t] and rnd.random() < 0.3:
            changes.append(RowChange("delete", t, {"id": i}))
            del db[t][i]
        else:
            row = {**rnd.choice(pool[t]), "id": i}
            changes.append(RowChange("update" if i in db[t] else "insert", t, row))
            db[t][i] = row
    return changes


@st.composite
def workloads(draw: Any, rows: dict[str, Any], max_tx: int = 12,
              job: Job | None = None, large: bool = False) -> Workload:
    """Random transactions; with a ``job`` that declares sources, each transaction commits
    in a random source and touches only that source's tables. ``large``: in one workload
    of three, one transaction (anywhere among the small ones) has hundreds of changes
    (``LARGE_TX``)."""
    tables = list(rows)
    multi = job is not None and bool(job.sources)
    db: dict[str, dict[int, dict[str, Any]]] = {t: {} for t in tables}
    snapshot: dict[str, list[dict[str, Any]]] = {}
    for t in draw(st.permutations(tables)):
        ids = draw(st.sets(st.integers(1, KEY_SPACE), max_size=3))
        snapshot[t] = [rows[t](draw, i) for i in sorted(ids)]
        db[t] = {r["id"]: r for r in snapshot[t]}
    txs: list[SourceTransaction] = []
    restarts: dict[int, tuple[int, int]] = {}
    resends: dict[int, int] = {}
    key_changes: list[tuple[int, str, int, int]] = []
    n_tx = draw(st.integers(1, max_tx))
    at_large = draw(st.integers(-2 * n_tx, n_tx - 1)) if large else -1  # < 0: none
    for n in range(n_tx):
        changes: list[RowChange] = []
        source = None
        choices = tables
        if multi:
            assert job is not None
            source = draw(st.sampled_from(job.source_names))
            choices = job.tables_of(source)
        if n == at_large:
            changes = _large_transaction(draw, rows, choices, db)
        for _ in range(0 if n == at_large else draw(st.integers(0, 4))):
            t = draw(st.sampled_from(choices))
            i = draw(st.integers(1, KEY_SPACE))
            free = [j for j in range(1, KEY_SPACE + 1) if j not in db[t]]
            if i in db[t] and free and draw(st.integers(0, 3)) == 0:
                # UPDATE ... SET id = j: Debezium sends the old key's delete, then the new
                # key's create with the row's other columns as they were
                j = draw(st.sampled_from(free))
                changes.extend(key_change(t, db[t][i], j))
                key_changes.append((n, t, i, j))
                db[t][j] = {**db[t].pop(i), "id": j}
            elif i in db[t] and draw(st.booleans()):
                changes.append(RowChange("delete", t, {"id": i}))
                del db[t][i]
            else:
                row = rows[t](draw, i)
                changes.append(RowChange("update" if i in db[t] else "insert", t, row))
                db[t][i] = row
        txs.append(SourceTransaction(f"t{n + 1}", changes, source))
        if len(changes) >= 2 and draw(st.integers(0, 5)) == 0:
            i = draw(st.integers(1, len(changes)))
            restarts[n] = (i, draw(st.integers(0, i)))
        elif draw(st.integers(0, 6)) == 0:
            resends[n] = draw(st.integers(1, 4))
    return Workload(snapshot, txs, restarts, resends, key_changes)


def touches(tx: SourceTransaction, table: str) -> bool:
    return any(c.table == table for c in tx.changes)


@st.composite
def incremental_snapshots(draw: Any, workload: Workload, rows: dict[str, Any]) -> Workload:
    """``workload`` with incremental snapshot chunks of random tables after random
    transactions: the rows the source holds there (equal to what the events say), some of
    them changed (corrections, standing for changes the capture missed; the source's rows
    from then on). Only rows the source holds are snapshotted (Debezium reads the table)."""
    db: dict[str, dict[Any, dict[str, Any]]] = {
        t: {r["id"]: dict(r) for r in workload.snapshot.get(t, [])} for t in rows}
    chunks: dict[int, list[Chunk]] = {}
    for n in range(-1, len(workload.transactions)):
        if n >= 0:
            for change in workload.transactions[n].changes:
                if change.op == "delete":
                    db[change.table].pop(change.row["id"], None)
                else:
                    db[change.table][change.row["id"]] = dict(change.row)
        for _ in range(draw(st.integers(0, 2), label=f"chunks after {n}")):
            table = draw(st.sampled_from(sorted(rows)), label="chunk table")
            ids = sorted(db[table])
            if not ids:
                continue
            picked = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=3, unique=True))
            chunk = Chunk(table, [], [])
            for i in sorted(picked):
                row = dict(db[table][i])
                if draw(st.integers(0, 2), label="correction") == 0:
                    row = rows[table](draw, i)
                chunk.rows.append(row)
                chunk.differs.append(row != db[table][i])
                db[table][i] = row
            chunks.setdefault(n, []).append(chunk)
    return replace(workload, incremental=chunks)


@dataclass
class Production:
    records: list[Produced]  # in production order
    must_precede_end: list[tuple[Produced, Produced]]  # (record, END) pairs (restart pattern)
    topics: list[str]


def produce(job: Job, workload: Workload) -> Production:
    synth: Synthesizer | SourcesSynthesizer = (
        SourcesSynthesizer(job, job.source_prefixes("shop")) if job.sources else Synthesizer(job))
    records = list(synth.snapshot(workload.snapshot))
    constraints: list[tuple[Produced, Produced]] = []
    for chunk in workload.incremental.get(-1, []):
        records.extend(synth.incremental(chunk.table, chunk.rows))
    for n, tx in enumerate(workload.transactions):
        out = synth.transaction(tx, restart=workload.restarts.get(n))
        records.extend(out)
        if n in workload.restarts:
            second_begin = [k for k, r in enumerate(out) if r.kind == "begin"][1]
            constraints.extend((r, out[-1]) for r in out[:second_begin])
        if n in workload.resends:
            records.extend(synth.resend(out[-workload.resends[n]:]))
        for chunk in workload.incremental.get(n, []):
            records.extend(synth.incremental(chunk.table, chunk.rows))
    return Production(records, constraints, list(synth.topics))


@dataclass
class Batch:
    records: list[Produced]
    caught_up: set[str]  # topics read to their end offset as of the batch's planning


@st.composite
def deliveries(draw: Any, produced: Production) -> list[Batch]:
    """Kafka-like delivery: each topic read in order, any lag between topics, rewinds."""
    by_topic: dict[str, list[Produced]] = {t: [] for t in produced.topics}
    rank: dict[tuple[str, int], int] = {}
    for k, r in enumerate(produced.records):
        by_topic.setdefault(r.topic, []).append(r)
        rank[(r.topic, r.offset)] = k
    pos = dict.fromkeys(by_topic, 0)
    visible = 0
    total = len(produced.records)
    batches: list[Batch] = []
    # a production as large as a large transaction's over up to 30 batches, so that
    # transaction's records spread over many of them between the small ones'
    steps = draw(st.integers(1, 8 if total < LARGE_TX[0] else 30))
    for step in range(steps + 1):
        final = step == steps or all(pos[t] == len(v) for t, v in by_topic.items())
        visible = total if final else draw(st.integers(visible, total))
        starts: dict[str, int] = {}
        ends: dict[str, int] = {}
        caught: set[str] = set()
        for topic, recs in by_topic.items():
            vis_end = sum(1 for r in recs if rank[(topic, r.offset)] < visible)
            end = vis_end if final or draw(st.booleans()) else draw(
                st.integers(pos[topic], max(pos[topic], vis_end)))
            end = max(end, pos[topic])
            start = pos[topic]
            if not final and draw(st.integers(0, 9)) == 0:  # consumer rewind: redelivery
                start = max(0, start - draw(st.integers(1, 3)))
            starts[topic], ends[topic] = start, end
        for rec, end_marker in produced.must_precede_end:
            if ends[end_marker.topic] > end_marker.offset:
                ends[rec.topic] = max(ends[rec.topic], rec.offset + 1)
        for topic, recs in by_topic.items():
            vis_end = sum(1 for r in recs if rank[(topic, r.offset)] < visible)
            if ends[topic] >= vis_end:
                caught.add(topic)
        records = [r for topic, recs in by_topic.items() for r in recs[starts[topic]:ends[topic]]]
        pos = ends
        batches.append(Batch(records, caught))
        if final:
            break
    assert all(pos[t] == len(v) for t, v in by_topic.items())
    return batches


def assert_restarts_change_nothing(job: Job, batches: list[Batch],
                                   caught_of: Callable[[set[str]], set[str]] | None = None
                                   ) -> None:
    """Restart an engine from its serialised state before every batch: it emits what an
    engine that never stopped emits, batch by batch, and ends with the same outputs.
    ``caught_of``: a batch's caught-up topics -> the streams ``process`` takes (default:
    the ``shop.`` prefix dropped)."""
    from txjoin.join.engine import Engine

    caught_of = caught_of or (lambda topics: {t.removeprefix("shop.") for t in topics})
    steady, restarted = Engine(job), Engine(job)
    for batch in batches:
        records = [(r.topic, 0, r.offset, r.value) for r in batch.records]
        caught = caught_of(batch.caught_up)
        emitted = steady.process(records, caught_up=caught)
        restarted = Engine.from_state(job, restarted.state_bytes())
        assert restarted.process(records, caught_up=caught) == emitted
    assert steady.outputs() == restarted.outputs()


def partition_of(record: Produced, parts: int) -> int:
    """A record's partition follows its key (the bench's partitioner); the transaction
    topic has one partition."""
    if record.table is None or parts == 1:
        return 0
    return key_partition(record.key, parts)


def split_partitions(production: Production, parts: int
                     ) -> tuple[Production, dict[str, tuple[str, int]]]:
    """The production with each table topic's partitions as topics of their own
    (``<topic>#<p>``, offsets from 0), so :func:`deliveries` reads each partition in order
    with any lag between them; and pseudo-topic -> (topic, partition)."""
    where: dict[str, tuple[str, int]] = {}
    topics: list[str] = []
    for topic in production.topics:
        table_topic = any(r.topic == topic and r.table is not None for r in production.records)
        for p in range(parts if table_topic else 1):
            name = f"{topic}#{p}"
            where[name] = (topic, p)
            topics.append(name)
    offsets: dict[str, int] = {}
    moved: dict[int, Produced] = {}
    records = []
    for r in production.records:
        name = f"{r.topic}#{partition_of(r, parts)}"
        offset = offsets.get(name, 0)
        offsets[name] = offset + 1
        moved[id(r)] = replace(r, topic=name, offset=offset)
        records.append(moved[id(r)])
    pairs = [(moved[id(a)], moved[id(b)]) for a, b in production.must_precede_end]
    return Production(records, pairs, topics), where


# -- SQL expressions (txjoin/expr.py): random filters and computed columns ------------------

EXPR_COLUMNS: dict[str, dict[str, list[str]]] = {
    # kind -> the orders job's columns of that kind, by the aliases an output may read
    "orders": {
        "int": ["o.id", "o.table_assignment_id", "ta.client_id", "ta.table_id", "c.id"],
        "text": ["c.name", "t.name"],
        "ts": ["o.order_time", "ta.time_in", "ta.time_out"],
    },
}


EXTRACT_FIELDS = ["hour", "day", "dow", "epoch", "second"]
COMPARISONS = ["=", "<>", "<", "<=", ">", ">="]


@st.composite
def sql_expressions(draw: Any, kind: str, columns: dict[str, list[str]], depth: int = 3) -> str:
    """A random PostgreSQL expression of ``kind`` (int, num, text, ts, interval, bool) over
    ``columns`` (kind -> column references), as txjoin/expr.py supports them."""
    def sub(k: str) -> str:
        return draw(sql_expressions(k, columns, depth - 1))

    leaves: dict[str, Any] = {
        "int": st.one_of(st.sampled_from(columns.get("int", ["1"])),
                         st.integers(-3, 12).map(lambda i: f"({i})" if i < 0 else str(i))),
        "num": st.sampled_from(["1.25", "0.5", "2.000", "(-3.75)", *columns.get("num", [])]),
        "text": st.one_of(st.sampled_from(columns.get("text", ["'x'"])),
                          st.sampled_from(["'Ann'", "' Bo '", "''", "'T1'"])),
        "ts": st.sampled_from(columns.get("ts", ["timestamp '2023-09-24 00:30:00'"])),
        "interval": st.sampled_from(["interval '1 hour'", "interval '90 minutes'",
                                     "interval '2 days 3 hours'"]),
        "bool": st.sampled_from(["true", "false", "NULL::boolean"]),
    }
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        return draw(leaves[kind])
    forms: dict[str, list[Any]] = {
        "int": [lambda: f"({sub('int')} {draw(st.sampled_from('+-*/%'))} {sub('int')})",
                lambda: f"length({sub('text')})", lambda: f"abs({sub('int')})",
                lambda: f"coalesce({sub('int')}, {sub('int')})",
                lambda: f"nullif({sub('int')}, {sub('int')})",
                lambda: f"CASE WHEN {sub('bool')} THEN {sub('int')} ELSE {sub('int')} END",
                lambda: f"CAST({sub('num')} AS int)", lambda: f"(-{sub('int')})"],
        "num": [lambda: f"({sub('num')} {draw(st.sampled_from('+-*'))} {sub('int')})",
                lambda: f"({sub('num')} / {sub('int')})",
                lambda: f"({sub('int')} * {sub('num')})",
                lambda: f"round({sub('num')}, {draw(st.integers(-1, 3))})",
                lambda: f"round({sub('num')})", lambda: f"abs({sub('num')})",
                lambda: f"CAST({sub('int')} AS numeric(8,2))",
                lambda: f"extract({draw(st.sampled_from(EXTRACT_FIELDS))} FROM {sub('ts')})",
                lambda: f"coalesce({sub('num')}, {sub('int')})"],
        "text": [lambda: f"({sub('text')} || {sub('text')})",
                 lambda: f"({sub('text')} || {sub('int')})",
                 lambda: f"upper({sub('text')})", lambda: f"lower({sub('text')})",
                 lambda: f"trim({sub('text')})",
                 lambda: f"substring({sub('text')}, {draw(st.integers(-1, 4))}, "
                         f"{draw(st.integers(0, 4))})",
                 lambda: f"substring({sub('text')} FROM {draw(st.integers(1, 3))})",
                 lambda: f"CAST({sub('int')} AS text)",
                 lambda: f"CASE WHEN {sub('bool')} THEN {sub('text')} END",
                 lambda: f"coalesce({sub('text')}, {sub('text')})"],
        "ts": [lambda: f"date_trunc('{draw(st.sampled_from(['hour', 'day', 'month']))}', "
                       f"{sub('ts')})",
               lambda: f"({sub('ts')} {draw(st.sampled_from('+-'))} {sub('interval')})",
               lambda: f"coalesce({sub('ts')}, {sub('ts')})"],
        "interval": [lambda: f"({sub('ts')} - {sub('ts')})",
                     lambda: f"({sub('interval')} + {sub('interval')})"],
        "bool": [lambda k=k: f"({sub(k)} {draw(st.sampled_from(COMPARISONS))} {sub(k)})"
                 for k in ("int", "num", "text", "ts")] + [
                 lambda: f"({sub('bool')} AND {sub('bool')})",
                 lambda: f"({sub('bool')} OR {sub('bool')})", lambda: f"(NOT {sub('bool')})",
                 lambda: f"({sub('int')} IS NULL)", lambda: f"({sub('text')} IS NOT NULL)",
                 lambda: f"({sub('int')} IN ({sub('int')}, {sub('int')}))",
                 lambda: f"({sub('int')} BETWEEN {sub('int')} AND {sub('int')})"],
    }
    return str(draw(st.sampled_from(forms[kind]))())
