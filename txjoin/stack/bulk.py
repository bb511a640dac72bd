"""``txjoin generate --bulk N``: the pizzeria workload as fast as PostgreSQL takes it, and
how fast the stack's Debezium gets it into Kafka.

The writer is one connection that sends many whole transactions per round trip (``BEGIN;
...; COMMIT; BEGIN; ...`` in one simple-query message), where
:func:`txjoin.stack.generate.generate` waits for an answer to every statement. Each
transaction stays a realistic handful of rows (a party seated with its
orders in one multi-row INSERT, a burst of changes to several orders in one UPDATE, a
user with their colours), now and then a loyalty import of a few hundred users by COPY.
Row ids are reserved from the tables' sequences in blocks beforehand, so a transaction
is plain SQL text that needs no answer from the server.

The bookkeeping is the normal generator's, so ``txjoin verify`` holds afterwards: every
transaction takes ``pg_advisory_xact_lock(ADVISORY_LOCK_KEY)`` first and, last, records
every order it changed with ``record_order_expected``. Updates and deletes touch only rows
this run created, so each statement's row count is known without asking; with another
writer on the same rows at once the counts may be off (the capture side does not rely
on them, see below).

The capture is timed by a consumer that tails every topic of the stack from its end
while the writer runs: it is complete when the END of the run's last transaction (its
xid is read before its commit) is on ``<prefix>.transaction`` and, for every END of the
run's xids, that many data events are on the table topics. Capture seconds run from the
first commit's acknowledgement to reading the event that completed it.
"""

from __future__ import annotations

import contextlib
import io
import random
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import psycopg2
import psycopg2.extensions

from txjoin.errors import ConfigError, ServiceError
from txjoin.sinks.postgres import mask_dsn
from txjoin.stack.generate import (
    COLOURS,
    NAMES,
    PIZZA_IDS,
    GenerateResult,
    connect_source,
    pizza_array,
)
from txjoin.stack.postgres import ADVISORY_LOCK_KEY
from txjoin.stack.stack import StackInfo

TRANSACTIONS_PER_ROUND_TRIP = 100
"""Transactions sent in one message; more buys little once the round trip is amortised."""
IDS_PER_RESERVATION = 2_000
STALL_SECONDS = 60.0
"""Give up waiting for the capture when no new event of the run arrived for this long."""

_LOCK = f"SELECT pg_advisory_xact_lock({ADVISORY_LOCK_KEY})".encode()
_XID = b"SELECT pg_current_xact_id()::text::bigint"


@dataclass
class BulkResult:
    """What a bulk run wrote, and how long the stack took to capture it."""

    written: GenerateResult
    """Transactions and row changes committed (``written.seconds``: from the start of the
    writes to the last commit)."""
    events_captured: int = 0
    """Data events of the run's transactions read from the table topics (no tombstones)."""
    transactions_captured: int = 0
    """ENDs of the run's transactions read from the transaction topic."""
    capture_seconds: float = 0.0
    """From the first commit to the last of the run's events being read from Kafka."""
    after_last_commit_seconds: float = 0.0
    """How long after the last commit the last event was read."""

    @property
    def rows(self) -> int:
        return self.written.events

    @property
    def write_rows_per_s(self) -> float:
        return self.rows / max(self.written.seconds, 1e-9)

    @property
    def capture_events_per_s(self) -> float:
        return self.events_captured / max(self.capture_seconds, 1e-9)

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON object (``txjoin generate --bulk N --json``)."""
        return {
            "rows": self.rows, "transactions": self.written.transactions,
            "rows_by_table": dict(sorted(self.written.events_by_table.items())),
            "orders_recorded": self.written.orders_recorded,
            "write_seconds": round(self.written.seconds, 3),
            "write_rows_per_s": round(self.write_rows_per_s, 1),
            "events_captured": self.events_captured,
            "transactions_captured": self.transactions_captured,
            "capture_seconds": round(self.capture_seconds, 3),
            "capture_events_per_s": round(self.capture_events_per_s, 1),
            "after_last_commit_seconds": round(self.after_last_commit_seconds, 3),
        }

    def summary(self) -> str:
        """Two lines: what was written, and the capture rate."""
        w = self.written
        return (f"wrote {self.rows:,} row changes in {w.transactions:,} transactions in "
                f"{w.seconds:.1f}s ({self.write_rows_per_s:,.0f} rows/s), "
                f"{w.orders_recorded:,} orders_expected writes\n"
                f"captured {self.events_captured:,} events of {self.transactions_captured:,} "
                f"transactions in {self.capture_seconds:.1f}s from the first commit until the "
                f"last was in Kafka: {self.capture_events_per_s:,.0f} events/s (the last "
                f"{self.after_last_commit_seconds:.1f}s after the last commit)")


# -- the workload -------------------------------------------------------------------------


@dataclass
class _BulkTx:
    """One transaction as SQL text, with the row changes it makes per captured table."""

    kind: str
    statements: list[bytes] = field(default_factory=list)
    copy: tuple[str, str] | None = None  # (COPY ... FROM STDIN, its data), run after statements
    rows: Counter[str] = field(default_factory=Counter)
    orders: list[int] = field(default_factory=list)  # to record in orders_expected, last

    def change(self, table: str, rows: int, statement: bytes) -> None:
        self.statements.append(statement)
        self.rows[f"public.{table}"] += rows

    def opening(self) -> bytes:
        """BEGIN, the advisory lock (FIRST), and the changes up to the COPY, if any."""
        return b";".join([b"BEGIN", _LOCK, *self.statements]) + b";"

    def closing(self) -> bytes:
        """The orders_expected records (LAST, under the lock), without the COMMIT."""
        if not self.orders:
            return b""
        ids = ",".join(str(o) for o in self.orders)
        return (f"SELECT public.record_order_expected(o) FROM unnest(ARRAY[{ids}]) AS o;"
                .encode())


class _Ids:
    """Ids reserved from each table's serial sequence, handed out one by one."""

    def __init__(self, cur: psycopg2.extensions.cursor) -> None:
        self.cur = cur
        self.free: dict[str, deque[int]] = {}

    def take(self, table: str) -> int:
        free = self.free.setdefault(table, deque())
        if not free:
            # Sequences are not transactional: these ids are ours whatever else commits.
            self.cur.execute("SELECT nextval(pg_get_serial_sequence(%s, 'id')) "
                             "FROM generate_series(1, %s)", (f"public.{table}",
                                                             IDS_PER_RESERVATION))
            free.extend(int(r[0]) for r in self.cur.fetchall())
        return free.popleft()


def _pop(rng: random.Random, items: list[int]) -> int:
    """Remove and return a random element in O(1) (order is irrelevant)."""
    i = rng.randrange(len(items))
    items[i], items[-1] = items[-1], items[i]
    return items.pop()


class _BulkWorkload:
    """The pizzeria's transactions, built as text. Only rows it created are changed."""

    def __init__(self, cur: psycopg2.extensions.cursor, rng: random.Random) -> None:
        self.cur, self.rng = cur, rng
        self.ids = _Ids(cur)
        cur.execute("SELECT id FROM public.clients ORDER BY id")
        self.clients = [int(r[0]) for r in cur.fetchall()]
        cur.execute("SELECT id FROM public.tables ORDER BY id")
        self.tables = [int(r[0]) for r in cur.fetchall()] or [1]
        self.open_assignments: list[int] = []
        self.orders: list[int] = []
        self.deleted_orders: list[int] = []
        self.users: list[int] = []
        self.colours: list[int] = []
        self.kinds: list[tuple[Callable[[_BulkTx], None], float]] = [
            (self.party, 30), (self.more_orders, 20), (self.order_changes, 20),
            (self.cancel, 6), (self.comeback, 3), (self.checkout, 8), (self.move_table, 3),
            (self.price_change, 3), (self.rename_client, 3), (self.loyalty, 10),
            (self.drop_colours, 3), (self.loyalty_import, 0.3),
        ]

    def next(self) -> _BulkTx:
        funcs, weights = zip(*self.kinds, strict=True)
        kind = self.rng.choices(funcs, weights)[0]
        tx = _BulkTx(kind.__name__)
        kind(tx)
        return tx

    def _sql(self, sql: str, args: tuple[object, ...] = ()) -> bytes:
        return bytes(self.cur.mogrify(sql, args))

    def _values(self, template: str, rows: Sequence[tuple[object, ...]]) -> bytes:
        return b",".join(self._sql(template, row) for row in rows)

    def _insert_orders(self, tx: _BulkTx, assignment: int, count: int,
                       ids: list[int] | None = None) -> None:
        ids = ids or [self.ids.take("orders") for _ in range(count)]
        values = self._values("(%s, %s, now(), %s::int[])",
                              [(i, assignment, pizza_array(self.rng)) for i in ids])
        tx.change("orders", len(ids), b"INSERT INTO public.orders "
                  b"(id, table_assignment_id, order_time, pizzas) VALUES " + values)
        self.orders += ids
        tx.orders += ids

    def _seat(self, tx: _BulkTx, client: int) -> int:
        # Table 4 rarely gets guests, as in the normal workload.
        table = self.rng.choices(self.tables, [1] * (len(self.tables) - 1) + [0.05])[0]
        assignment = self.ids.take("table_assignment")
        tx.change("table_assignment", 1, self._sql(
            "INSERT INTO public.table_assignment (id, client_id, table_id, time_in) "
            "VALUES (%s, %s, %s, now())", (assignment, client, table)))
        self.open_assignments.append(assignment)
        return assignment

    # -- transaction kinds --------------------------------------------------------------

    def party(self, tx: _BulkTx) -> None:
        """A new client sits down and the table orders one to four times at once."""
        client = self.ids.take("clients")
        name = f"{self.rng.choice(NAMES)} {self.rng.randint(1, 999)}"
        tx.change("clients", 1, self._sql("INSERT INTO public.clients (id, name) "
                                          "VALUES (%s, %s)", (client, name)))
        self.clients.append(client)
        self._insert_orders(tx, self._seat(tx, client), self.rng.randint(1, 4))

    def more_orders(self, tx: _BulkTx) -> None:
        if not self.open_assignments:
            return self.party(tx)
        self._insert_orders(tx, self.rng.choice(self.open_assignments), self.rng.randint(1, 3))
        return None

    def order_changes(self, tx: _BulkTx) -> None:
        """Several orders change in one statement (the burst pattern, batched)."""
        if len(self.orders) < 4:
            return self.party(tx)
        changed = self.rng.sample(self.orders, self.rng.randint(2, 4))
        values = self._values("(%s, %s::int[])", [(o, pizza_array(self.rng)) for o in changed])
        tx.change("orders", len(changed), b"UPDATE public.orders AS o SET pizzas = v.pizzas "
                  b"FROM (VALUES " + values + b") AS v(id, pizzas) WHERE o.id = v.id")
        tx.orders += changed
        return None

    def cancel(self, tx: _BulkTx) -> None:
        if len(self.orders) < 2:
            return self.party(tx)
        gone = [_pop(self.rng, self.orders) for _ in range(self.rng.randint(1, 2))]
        tx.change("orders", len(gone), self._sql("DELETE FROM public.orders WHERE id = ANY(%s)",
                                                 (gone,)))
        self.deleted_orders += gone
        tx.orders += gone
        return None

    def comeback(self, tx: _BulkTx) -> None:
        """A cancelled order comes back under the same id."""
        if not self.deleted_orders or not self.open_assignments:
            return self.cancel(tx)
        order = _pop(self.rng, self.deleted_orders)
        self._insert_orders(tx, self.rng.choice(self.open_assignments), 1, [order])
        return None

    def checkout(self, tx: _BulkTx) -> None:
        if not self.open_assignments:
            return self.party(tx)
        assignment = _pop(self.rng, self.open_assignments)
        tx.change("table_assignment", 1, self._sql(
            "UPDATE public.table_assignment SET time_out = now() WHERE id = %s", (assignment,)))
        return None

    def move_table(self, tx: _BulkTx) -> None:
        """A lookup change that must not rewrite the moved client's earlier orders."""
        if not self.open_assignments:
            return self.party(tx)
        tx.change("table_assignment", 1, self._sql(
            "UPDATE public.table_assignment SET table_id = %s WHERE id = %s",
            (self.rng.choice(self.tables[:-1] or self.tables),
             self.rng.choice(self.open_assignments))))
        return None

    def price_change(self, tx: _BulkTx) -> None:
        tx.change("pizzas", 1, self._sql("UPDATE public.pizzas SET price = %s WHERE id = %s", (
            round(self.rng.uniform(5, 15) * 4) / 4, self.rng.choice(PIZZA_IDS))))

    def rename_client(self, tx: _BulkTx) -> None:
        # No writer deletes clients, so any known one is still there.
        tx.change("clients", 1, self._sql("UPDATE public.clients SET name = name || '*' "
                                          "WHERE id = %s", (self.rng.choice(self.clients),)))

    def loyalty(self, tx: _BulkTx) -> None:
        """A new user with one to three favourite colours."""
        user = self.ids.take("users")
        tx.change("users", 1, self._sql("INSERT INTO public.users (id, full_name) "
                                        "VALUES (%s, %s)",
                                        (user, f"{self.rng.choice(NAMES).lower()} smith")))
        self.users.append(user)
        colours = [(self.ids.take("users_favorite_color"), user, c)
                   for c in self.rng.sample(COLOURS, self.rng.randint(1, 3))]
        tx.change("users_favorite_color", len(colours),
                  b"INSERT INTO public.users_favorite_color (id, user_id, favorite_color) "
                  b"VALUES " + self._values("(%s, %s, %s)", colours))
        self.colours += [c[0] for c in colours]

    def drop_colours(self, tx: _BulkTx) -> None:
        if len(self.colours) < 2:
            return self.loyalty(tx)
        gone = [_pop(self.rng, self.colours) for _ in range(self.rng.randint(1, 2))]
        tx.change("users_favorite_color", len(gone), self._sql(
            "DELETE FROM public.users_favorite_color WHERE id = ANY(%s)", (gone,)))
        return None

    def loyalty_import(self, tx: _BulkTx) -> None:
        """Now and then a few hundred users at once, by COPY: one large transaction."""
        users = [self.ids.take("users") for _ in range(self.rng.randint(100, 300))]
        data = "".join(f"{u}\t{self.rng.choice(NAMES).lower()} import\n" for u in users)
        tx.copy = ("COPY public.users (id, full_name) FROM STDIN", data)
        tx.rows["public.users"] += len(users)
        self.users += users


# -- the capture ----------------------------------------------------------------------------


class _CaptureWatch:
    """Tails the stack's topics from their current ends, counting per xid (>= ``xid_floor``)
    the data events and each END's ``event_count``, until :meth:`expect`'s xid is complete."""

    def __init__(self, info: StackInfo, xid_floor: int) -> None:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        self.transaction_topic = info.transaction_topic
        self.xid_floor = xid_floor
        self.consumer = Consumer({
            "bootstrap.servers": info.bootstrap_servers,
            "group.id": f"txjoin-bulk-{uuid.uuid4()}", "enable.auto.commit": False,
            "enable.partition.eof": False,
            # The last fetch's wait is added to the capture time: keep it short.
            "fetch.wait.max.ms": 20})
        try:
            metadata = self.consumer.list_topics(timeout=15)
            assignment = []
            for topic in info.topics:
                meta = metadata.topics.get(topic)
                if meta is None or meta.error is not None or not meta.partitions:
                    raise ServiceError(f"topic {topic} is not on the broker at "
                                       f"{info.bootstrap_servers}: is the stack healthy "
                                       f"(`txjoin status`)?")
                for partition in sorted(meta.partitions):
                    tp = TopicPartition(topic, partition)
                    _, high = self.consumer.get_watermark_offsets(tp, timeout=15, cached=False)
                    assignment.append(TopicPartition(topic, partition, high))
        except KafkaException as exc:
            self.consumer.close()
            raise ServiceError(f"cannot read the broker at {info.bootstrap_servers}: "
                               f"{exc}") from None
        except BaseException:
            self.consumer.close()
            raise
        self.consumer.assign(assignment)
        self.end_counts: dict[int, int] = {}
        self.data_counts: Counter[int] = Counter()
        self.target: int | None = None
        # Totals over the xids up to ``limit`` (all of the run's until the target is known).
        self.limit: int | None = None
        self.events = self.announced = 0
        self.done_at: float | None = None
        self.progress_at = time.monotonic()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="txjoin-bulk-capture",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def expect(self, last_xid: int) -> None:
        """The run's last transaction: complete once it and every earlier one are in."""
        self.progress_at = max(self.progress_at, time.monotonic())
        self.target = last_xid

    def wait(self, stall_seconds: float = STALL_SECONDS) -> float:
        """Block until complete; the monotonic time the last needed event was read."""
        while self._thread.is_alive() and self.done_at is None:
            if time.monotonic() - self.progress_at > stall_seconds:
                self.close()
                raise ServiceError(
                    f"the capture stalled: no event of the bulk run arrived for "
                    f"{stall_seconds:.0f}s; read {self.ends} ENDs announcing {self.announced} "
                    f"events and {self.events} data events; the END of the last transaction "
                    f"(xid {self.target}) is {'' if self.target in self.end_counts else 'not '}"
                    f"in; is Debezium streaming (`txjoin status`, its log in <dir>/logs)?")
            time.sleep(0.05)
        self.close()
        if self.error is not None:
            raise ServiceError(f"reading the captured events failed: {self.error}") from None
        assert self.done_at is not None
        return self.done_at

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(10)

    @property
    def ends(self) -> int:
        """ENDs read of the run's transactions (up to the expected one, once known)."""
        return sum(1 for x in self.end_counts if self.limit is None or x <= self.limit)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                messages = self.consumer.consume(2_000, 0.1)
                now = time.monotonic()
                if self._count(messages):
                    self.progress_at = now
                target = self.target
                if target is not None and self.limit is None:
                    # Once: forget what later transactions (another writer's) added.
                    self.limit = target
                    self.events = sum(n for x, n in self.data_counts.items() if x <= target)
                    self.announced = sum(n for x, n in self.end_counts.items() if x <= target)
                if target in self.end_counts and self.events >= self.announced:
                    self.done_at = now
                    return
        except BaseException as exc:
            self.error = exc
        finally:
            self.consumer.close()

    def _count(self, messages: list[Any]) -> int:
        """Count the run's events among ``messages``; return how many there were."""
        seen = 0
        for msg in messages:
            if msg.error() is not None:
                raise ServiceError(f"{msg.topic()}[{msg.partition()}]: {msg.error()}")
            value = msg.value()
            if value is None:
                continue  # a delete's tombstone: not a data event
            event = orjson.loads(value)
            if msg.topic() == self.transaction_topic:
                if event.get("status") != "END":
                    continue
                xid = int(str(event["id"]).split(":")[0])
                if xid >= self.xid_floor:
                    self.end_counts[xid] = int(event["event_count"])
                    if self.limit is None or xid <= self.limit:
                        self.announced += self.end_counts[xid]
                    seen += 1
            elif event.get("op") != "r":
                xid = int(event["source"]["txId"])
                if xid >= self.xid_floor:
                    self.data_counts[xid] += 1
                    if self.limit is None or xid <= self.limit:
                        self.events += 1
                    seen += 1
        return seen


# -- the run --------------------------------------------------------------------------------


def _commit(cur: psycopg2.extensions.cursor, txs: list[_BulkTx]) -> int:
    """Commit ``txs`` in order in as few round trips as the last one's COPY allows; return
    the last one's xid (read before its commit, so nothing of it is in Kafka yet)."""
    *head, last = txs
    script = b"".join(tx.opening() + tx.closing() + b"COMMIT;" for tx in head)
    if last.copy is not None:
        cur.execute(script + last.opening())
        cur.copy_expert(last.copy[0], io.StringIO(last.copy[1]))
        cur.execute(last.closing() + _XID)
    else:
        cur.execute(script + last.opening() + last.closing() + _XID)
    row = cur.fetchone()
    cur.execute(b"COMMIT")
    assert row is not None
    return int(row[0])


def _count(result: GenerateResult, txs: list[_BulkTx]) -> None:
    for tx in txs:
        result.transactions += 1
        result.transactions_by_kind[tx.kind] += 1
        result.events_by_table.update(tx.rows)
        result.orders_recorded += len(tx.orders)


def generate_bulk(info: StackInfo, rows: int, seed: int = 0,
                  per_round_trip: int = TRANSACTIONS_PER_ROUND_TRIP,
                  stall_seconds: float = STALL_SECONDS) -> BulkResult:
    """Write at least ``rows`` row changes into the stack's pizzeria as fast as PostgreSQL
    takes them, wait until Debezium has put every one of them into Kafka, and time both."""
    if rows < 1 or per_round_trip < 1:
        raise ConfigError("a bulk run needs rows >= 1 and per_round_trip >= 1")
    if info.sources:
        raise ConfigError("the bulk workload writes the pizzeria's `shop` database, which this "
                          "stack (`txjoin up --job`) does not capture; start it with plain "
                          "`txjoin up`")
    # 1. One connection in autocommit: the scripts carry their own BEGIN/COMMIT.
    conn = connect_source(info.pg_dsn_source)
    conn.autocommit = True
    watch: _CaptureWatch | None = None
    written = GenerateResult()
    try:
        with conn.cursor() as cur:
            try:
                # A commit returns without waiting for its WAL write: measured 10-20% more
                # transactions/s here. The WAL writer flushes within wal_writer_delay and
                # Debezium reads only flushed WAL, so that delay counts in the capture time.
                cur.execute("SET synchronous_commit = off")
                workload = _BulkWorkload(cur, random.Random(seed))
                # Every xid assigned from now on is at least this one.
                cur.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
                row = cur.fetchone()
                assert row is not None
                floor = int(row[0])
            except psycopg2.Error as exc:
                raise ServiceError(f"cannot read the pizzeria tables at "
                                   f"{mask_dsn(info.pg_dsn_source)}: {exc}") from None
            # 2. Tail every topic from its end before the first commit.
            watch = _CaptureWatch(info, floor)
            watch.start()
            # 3. Write: the first transaction alone (the capture clock starts at its
            # commit), then round trips of many; a COPY ends its round trip.
            started = time.monotonic()
            first_commit_at, last_xid = 0.0, 0
            batch: list[_BulkTx] = []
            planned = 0
            try:
                while planned < rows or batch:
                    if planned < rows:
                        tx = workload.next()
                        batch.append(tx)
                        planned += sum(tx.rows.values())
                    full = (len(batch) >= (per_round_trip if first_commit_at else 1)
                            or batch[-1].copy is not None or planned >= rows)
                    if full:
                        last_xid = _commit(cur, batch)
                        _count(written, batch)
                        batch = []
                        first_commit_at = first_commit_at or time.monotonic()
            except psycopg2.Error as exc:
                with contextlib.suppress(psycopg2.Error):
                    cur.execute("ROLLBACK")  # a script stops at its failing transaction
                raise ServiceError(f"the bulk writer failed after about {written.transactions} "
                                   f"transactions: {str(exc).strip()}") from None
            last_commit_at = time.monotonic()
            written.seconds = last_commit_at - started
        # 4. Wait until the last transaction's END and every data event it announces are in.
        watch.expect(last_xid)
        done_at = watch.wait(stall_seconds)
        events, ends = watch.events, watch.ends
    finally:
        if watch is not None:
            watch.close()
        conn.close()
    return BulkResult(written, events, ends, done_at - first_commit_at,
                      done_at - last_commit_at)
