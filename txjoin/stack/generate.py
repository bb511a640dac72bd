"""The pizzeria workload, against the real source database, with the seeds' race patterns.

Every generated transaction starts with ``pg_advisory_xact_lock(ADVISORY_LOCK_KEY)``: the
lock is held until commit, so with several writers (threads here, or other processes that
use the same key) transactions run one after another and commit in the order they took
the lock. That is what makes ``public.orders_expected`` exact: every transaction that
changes an order calls ``record_order_expected(order_id)`` (schema.sql) as its LAST
statement, and under the lock the state it reads is precisely the state at this
transaction's commit, in commit order. ``commit_seq_hint`` (a sequence value taken under
the lock) therefore increases in commit order too.

Dimension changes (pizza prices, client names, table moves) never rewrite
``orders_expected`` of other orders: with ``as_of_fact`` semantics an order keeps what it
looked like when it last changed (an order keeps the price it was placed at).

Patterns, after seed 001 and seed 000:

- rapid successive updates of one order (several transactions in a row);
- seating a client (insert client + table_assignment) and ordering in one transaction;
- pizza price changes between orders;
- deletes of orders, and re-inserts of the same order id (later, or in the same transaction);
- orders whose pizza array has duplicates, unknown pizza ids (dropped by the inner join),
  or nothing that matches (no enriched row: ``present = false``);
- ``public.tables`` stays idle for long stretches (renamed very rarely);
- users: new users, several favourite colours added at once, colours deleted, renames.

With ``level`` set (``txjoin generate --level N``, the soak's default), live rows stay level
instead of growing with time: once more than ``level`` clients (or users) are live, the next
transaction forgets the oldest one, that is the client's orders, its table assignments and
the client (a user with its colours), in one transaction. A long run then has a bounded
join state, so what grows in it is a leak, not data.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg2
import psycopg2.extensions

from txjoin.errors import ConfigError, ServiceError
from txjoin.sinks.postgres import mask_dsn
from txjoin.stack.postgres import ADVISORY_LOCK_KEY

PIZZA_IDS = (1, 2, 3, 4)
UNKNOWN_PIZZA_ID = 99  # never on the menu: the inner join drops it
LEVEL_DELETED_ORDERS = 500  # level mode: deleted order ids kept for re-inserting
COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "teal", "black")
NAMES = ("Leo", "Mikey", "Donnie", "Raph", "Shredder", "Bebop", "Rocksteady", "Karai",
         "Krang", "Baxter", "Irma", "Vernon", "Hun", "Mondo", "Slash", "Leatherhead")


def pizza_array(rng: random.Random) -> list[int]:
    """An order's pizza array: usually known ids with duplicates, sometimes unmatched."""
    roll = rng.random()
    if roll < 0.02:
        return []  # nothing to join: present = false
    if roll < 0.04:
        return [UNKNOWN_PIZZA_ID]  # only unmatched elements: present = false
    pizzas = [rng.choice(PIZZA_IDS) for _ in range(rng.randint(1, 5))]
    if roll < 0.10:
        pizzas.insert(rng.randrange(len(pizzas) + 1), UNKNOWN_PIZZA_ID)
    return pizzas


@dataclass
class GenerateResult:
    """What ``generate`` committed."""

    transactions: int = 0  # that changed a captured row (pgoutput skips empty ones)
    events_by_table: Counter[str] = field(default_factory=Counter)
    transactions_by_kind: Counter[str] = field(default_factory=Counter)
    orders_recorded: int = 0
    seconds: float = 0.0

    @property
    def events(self) -> int:
        """Row changes in captured tables (= Debezium data events, tombstones excluded)."""
        return sum(self.events_by_table.values())

    def merge(self, other: GenerateResult) -> None:
        self.transactions += other.transactions
        self.events_by_table.update(other.events_by_table)
        self.transactions_by_kind.update(other.transactions_by_kind)
        self.orders_recorded += other.orders_recorded


class _World:
    """The generator's picture of the database, shared by the writers.

    Only read and changed while holding the advisory lock (so in commit order); a failed
    commit can leave it slightly wrong, which every operation tolerates (it checks row
    counts).
    """

    def __init__(self, cur: psycopg2.extensions.cursor) -> None:
        self.lock = threading.Lock()
        cur.execute("SELECT id FROM public.clients ORDER BY id")
        self.clients = [r[0] for r in cur.fetchall()]
        cur.execute("SELECT id FROM public.tables ORDER BY id")
        self.tables = [r[0] for r in cur.fetchall()] or [1]
        cur.execute("SELECT id FROM public.table_assignment WHERE time_out IS NULL ORDER BY id")
        self.open_assignments = [r[0] for r in cur.fetchall()]
        cur.execute("SELECT id FROM public.orders ORDER BY id")
        self.orders = [r[0] for r in cur.fetchall()]
        cur.execute("SELECT order_id FROM public.orders_expected WHERE NOT present "
                    "AND order_id NOT IN (SELECT id FROM public.orders)")
        self.deleted_orders = [r[0] for r in cur.fetchall()]
        cur.execute("SELECT id FROM public.users ORDER BY id")
        self.users = [r[0] for r in cur.fetchall()]
        cur.execute("SELECT id FROM public.users_favorite_color ORDER BY id")
        self.colours = [r[0] for r in cur.fetchall()]


class _Tx:
    """One generated transaction: counts row changes per table, records touched orders."""

    def __init__(self, cur: psycopg2.extensions.cursor, result: GenerateResult) -> None:
        self.cur, self.result = cur, result
        self.touched: list[int] = []
        self.changes = 0  # captured rows changed: 0 means Debezium never sees this transaction

    def _execute(self, table: str, sql: str, args: tuple[object, ...]) -> None:
        """Execute a change of ``public.<table>`` and count the rows it changed."""
        self.cur.execute(sql, args)
        self.result.events_by_table[f"public.{table}"] += self.cur.rowcount
        self.changes += self.cur.rowcount

    def run(self, table: str, sql: str, args: tuple[object, ...] = ()) -> int:
        """Execute a change of ``public.<table>``; return the new id if RETURNING, else rowcount."""
        self._execute(table, sql, args)
        if self.cur.description is not None:
            row = self.cur.fetchone()
            return int(row[0]) if row else 0
        return int(self.cur.rowcount)

    def run_returning(self, table: str, sql: str, args: tuple[object, ...] = ()) -> list[int]:
        """Execute a change of ``public.<table>`` that RETURNs ids; return all of them."""
        self._execute(table, sql, args)
        return [int(row[0]) for row in self.cur.fetchall()]

    def order_changed(self, order_id: int) -> None:
        if order_id not in self.touched:
            self.touched.append(order_id)

    def finish(self) -> None:
        # LAST statements: PostgreSQL's own enriched answer, as of this transaction.
        for order_id in self.touched:
            self.cur.execute("SELECT public.record_order_expected(%s)", (order_id,))
            self.result.orders_recorded += 1


def connect_source(dsn: str) -> psycopg2.extensions.connection:
    """A connection for a workload writer; an unreachable database is one ServiceError line."""
    try:
        return psycopg2.connect(dsn)
    except psycopg2.OperationalError as exc:
        raise ServiceError(f"cannot connect to the source database {mask_dsn(dsn)}: "
                           f"{str(exc).strip()}") from None


class _Writer:
    """One connection generating transactions at its share of the rate."""

    def __init__(self, dsn: str, world: _World, rng: random.Random,
                 level: int | None = None) -> None:
        self.conn = connect_source(dsn)
        self.world, self.rng, self.level = world, rng, level
        self.result = GenerateResult()
        self.kinds: list[tuple[Callable[[_Tx], None], float]] = [
            (self.seat_and_order, 14), (self.seat, 4), (self.order, 18), (self.price_change, 8),
            (self.delete_order, 6), (self.reinsert_order, 4), (self.delete_and_reinsert, 2),
            (self.checkout, 4), (self.move_table, 3), (self.rename_client, 3),
            (self.new_user, 5), (self.add_colours, 6), (self.delete_colours, 3),
            (self.rename_user, 2), (self.rename_table, 0.2),
        ]
        self.burst: tuple[int, int] | None = None  # (order id, transactions left)

    def close(self) -> None:
        self.conn.close()

    def step(self) -> None:
        """Run one transaction: the next of a burst, or a fresh random kind."""
        try:
            kind_name, changes = self._transaction()
        except BaseException:
            self.conn.rollback()
            raise
        # A transaction that changed no captured row (a burst update of an order a racing
        # writer deleted) is never published: pgoutput skips empty transactions.
        if changes:
            self.result.transactions += 1
            self.result.transactions_by_kind[kind_name] += 1

    def _transaction(self) -> tuple[str, int]:
        with self.conn.cursor() as cur:
            # FIRST statement: serialise with every other writer until our commit.
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
            with self.world.lock:
                tx = _Tx(cur, self.result)
                if self.burst is None and self.world.orders and self.rng.random() < 0.12:
                    self.burst = (self.rng.choice(self.world.orders), self.rng.randint(2, 5))
                if self.burst is not None:
                    kind_name = "order_burst_update"
                    self.update_order(tx, self.burst[0])
                    left = self.burst[1] - 1
                    self.burst = (self.burst[0], left) if left > 0 else None
                elif self.level is not None and len(self.world.clients) > self.level:
                    kind_name = "forget_visit"
                    self.forget_visit(tx)
                elif self.level is not None and len(self.world.users) > self.level:
                    kind_name = "forget_user"
                    self.forget_user(tx)
                else:
                    funcs, weights = zip(*self.kinds, strict=True)
                    kind = self.rng.choices(funcs, weights)[0]
                    kind_name = kind.__name__
                    kind(tx)
                tx.finish()
                # Commit while still holding the world lock, so no writer sees our
                # in-memory changes before they are committed.
                self.conn.commit()
        return kind_name, tx.changes

    # -- helpers -------------------------------------------------------------------------

    def _pizzas(self) -> list[int]:
        return pizza_array(self.rng)

    def _new_client(self, tx: _Tx) -> int:
        name = f"{self.rng.choice(NAMES)} {self.rng.randint(1, 999)}"
        client = tx.run("clients", "INSERT INTO public.clients (name) VALUES (%s) RETURNING id",
                        (name,))
        self.world.clients.append(client)
        return client

    def _seat(self, tx: _Tx, client: int) -> int:
        # Table 4 rarely gets guests: its rows stay idle for long stretches.
        table = self.rng.choices(self.world.tables, [1] * (len(self.world.tables) - 1) + [0.05])[0]
        assignment = tx.run(
            "table_assignment",
            "INSERT INTO public.table_assignment (client_id, table_id, time_in) "
            "VALUES (%s, %s, now()) RETURNING id", (client, table))
        self.world.open_assignments.append(assignment)
        return assignment

    def _insert_order(self, tx: _Tx, assignment: int, order_id: int | None = None) -> int:
        if order_id is None:
            order_id = tx.run(
                "orders", "INSERT INTO public.orders (table_assignment_id, order_time, pizzas) "
                "VALUES (%s, now(), %s::int[]) RETURNING id", (assignment, self._pizzas()))
        elif not tx.run(
                "orders", "INSERT INTO public.orders (id, table_assignment_id, order_time, pizzas) "
                "VALUES (%s, %s, now(), %s::int[]) ON CONFLICT (id) DO NOTHING",
                (order_id, assignment, self._pizzas())):
            return order_id  # someone else re-inserted it meanwhile
        self.world.orders.append(order_id)
        tx.order_changed(order_id)
        return order_id

    def _open_assignment(self, tx: _Tx) -> int:
        if self.world.open_assignments:
            return self.rng.choice(self.world.open_assignments)
        return self._seat(tx, self.rng.choice(self.world.clients) if self.world.clients
                          else self._new_client(tx))

    # -- transaction kinds --------------------------------------------------------------

    def seat_and_order(self, tx: _Tx) -> None:
        """A new client sits down and orders at once: client, assignment, order in one tx."""
        self._insert_order(tx, self._seat(tx, self._new_client(tx)))

    def seat(self, tx: _Tx) -> None:
        if not self.world.clients:
            self._new_client(tx)
        self._seat(tx, self.rng.choice(self.world.clients))

    def order(self, tx: _Tx) -> None:
        self._insert_order(tx, self._open_assignment(tx))

    def update_order(self, tx: _Tx, order_id: int) -> None:
        """One of a burst of rapid updates to the same order."""
        roll = self.rng.random()
        if roll < 0.5:
            changed = tx.run("orders", "UPDATE public.orders SET pizzas = array_append(pizzas, %s) "
                             "WHERE id = %s", (self.rng.choice(PIZZA_IDS), order_id))
        elif roll < 0.85 or not self.world.open_assignments:
            changed = tx.run("orders", "UPDATE public.orders SET pizzas = %s::int[] WHERE id = %s",
                             (self._pizzas(), order_id))
        else:
            changed = tx.run("orders", "UPDATE public.orders SET table_assignment_id = %s "
                             "WHERE id = %s", (self.rng.choice(self.world.open_assignments),
                                               order_id))
        if changed:
            tx.order_changed(order_id)

    def price_change(self, tx: _Tx) -> None:
        """The menu changes between orders; existing orders keep their price (as-of)."""
        tx.run("pizzas", "UPDATE public.pizzas SET price = %s WHERE id = %s",
               (round(self.rng.uniform(5, 15) * 4) / 4, self.rng.choice(PIZZA_IDS)))

    def delete_order(self, tx: _Tx) -> None:
        if not self.world.orders:
            return self.order(tx)
        order_id = self.world.orders.pop(self.rng.randrange(len(self.world.orders)))
        tx.run("orders", "DELETE FROM public.orders WHERE id = %s", (order_id,))
        self.world.deleted_orders.append(order_id)
        tx.order_changed(order_id)
        return None

    def reinsert_order(self, tx: _Tx) -> None:
        """A deleted order comes back under the same id."""
        if not self.world.deleted_orders:
            return self.delete_order(tx)
        order_id = self.world.deleted_orders.pop(self.rng.randrange(len(self.world.deleted_orders)))
        self._insert_order(tx, self._open_assignment(tx), order_id)
        return None

    def delete_and_reinsert(self, tx: _Tx) -> None:
        """Delete an order and insert it again, changed, in the same transaction."""
        if not self.world.orders:
            return self.order(tx)
        order_id = self.world.orders.pop(self.rng.randrange(len(self.world.orders)))
        tx.run("orders", "DELETE FROM public.orders WHERE id = %s", (order_id,))
        tx.order_changed(order_id)
        self._insert_order(tx, self._open_assignment(tx), order_id)
        return None

    def checkout(self, tx: _Tx) -> None:
        if not self.world.open_assignments:
            return self.seat(tx)
        assignment = self.world.open_assignments.pop(
            self.rng.randrange(len(self.world.open_assignments)))
        tx.run("table_assignment", "UPDATE public.table_assignment SET time_out = now() "
               "WHERE id = %s", (assignment,))
        return None

    def move_table(self, tx: _Tx) -> None:
        """A seated client changes table: a lookup change that must not rewrite old orders."""
        if not self.world.open_assignments:
            return self.seat(tx)
        tx.run("table_assignment", "UPDATE public.table_assignment SET table_id = %s "
               "WHERE id = %s", (self.rng.choice(self.world.tables[:-1] or self.world.tables),
                                 self.rng.choice(self.world.open_assignments)))
        return None

    def rename_client(self, tx: _Tx) -> None:
        if not self.world.clients:
            return self.seat_and_order(tx)
        tx.run("clients", "UPDATE public.clients SET name = name || '*' WHERE id = %s",
               (self.rng.choice(self.world.clients),))
        return None

    def rename_table(self, tx: _Tx) -> None:
        """Very rare: public.tables otherwise stays idle for the whole run."""
        tx.run("tables", "UPDATE public.tables SET name = name || '+' WHERE id = %s",
               (self.rng.choice(self.world.tables),))

    def forget_visit(self, tx: _Tx) -> None:
        """Level mode: the oldest client's orders, table assignments and the client go."""
        client = self.world.clients.pop(0)
        for order_id in tx.run_returning(
                "orders", "DELETE FROM public.orders WHERE table_assignment_id IN (SELECT id "
                "FROM public.table_assignment WHERE client_id = %s) RETURNING id", (client,)):
            _forget(self.world.orders, order_id)
            tx.order_changed(order_id)
        for assignment in tx.run_returning(
                "table_assignment", "DELETE FROM public.table_assignment WHERE client_id = %s "
                "RETURNING id", (client,)):
            _forget(self.world.open_assignments, assignment)
        tx.run("clients", "DELETE FROM public.clients WHERE id = %s", (client,))
        # Deleted orders wait to be re-inserted; in level mode only the newest few hundred.
        del self.world.deleted_orders[:-LEVEL_DELETED_ORDERS]

    def forget_user(self, tx: _Tx) -> None:
        """Level mode: the oldest user and their favourite colours go."""
        user = self.world.users.pop(0)
        for colour in tx.run_returning(
                "users_favorite_color", "DELETE FROM public.users_favorite_color "
                "WHERE user_id = %s RETURNING id", (user,)):
            _forget(self.world.colours, colour)
        tx.run("users", "DELETE FROM public.users WHERE id = %s", (user,))

    def new_user(self, tx: _Tx) -> None:
        name = f"{self.rng.choice(NAMES).lower()} smith"
        user = tx.run("users", "INSERT INTO public.users (full_name) VALUES (%s) RETURNING id",
                      (name,))
        self.world.users.append(user)

    def add_colours(self, tx: _Tx) -> None:
        """Several favourite colours for one user in one transaction."""
        if not self.world.users:
            self.new_user(tx)
        user = self.rng.choice(self.world.users)
        for colour in self.rng.sample(COLOURS, self.rng.randint(1, 3)):
            self.world.colours.append(tx.run(
                "users_favorite_color", "INSERT INTO public.users_favorite_color "
                "(user_id, favorite_color) VALUES (%s, %s) RETURNING id", (user, colour)))

    def delete_colours(self, tx: _Tx) -> None:
        if not self.world.colours:
            return self.add_colours(tx)
        for _ in range(min(len(self.world.colours), self.rng.randint(1, 2))):
            colour = self.world.colours.pop(self.rng.randrange(len(self.world.colours)))
            tx.run("users_favorite_color", "DELETE FROM public.users_favorite_color WHERE id = %s",
                   (colour,))
        return None

    def rename_user(self, tx: _Tx) -> None:
        if not self.world.users:
            return self.new_user(tx)
        tx.run("users", "UPDATE public.users SET full_name = upper(full_name) WHERE id = %s",
               (self.rng.choice(self.world.users),))
        return None


def _forget(live: list[int], row_id: int) -> None:
    """Drop a deleted row's id from the generator's picture (if it is there: a closed
    assignment, say, is not)."""
    with contextlib.suppress(ValueError):
        live.remove(row_id)


def paced(step: Callable[[], None], deadline: float, interval: float,
          stop: threading.Event | None = None) -> None:
    """Call ``step`` every ``interval`` seconds until ``deadline`` (monotonic) or until
    ``stop`` is set, flat out when a step takes longer than the interval."""
    stop = stop or threading.Event()
    next_at = time.monotonic()
    while time.monotonic() < deadline and not stop.is_set():
        step()
        next_at += interval
        pause = next_at - time.monotonic()
        if pause > 0:
            stop.wait(pause)


def generate(dsn: str, rate_tx_per_s: float, duration_s: float, seed: int = 0,
             writers: int = 1, stop: threading.Event | None = None,
             level: int | None = None) -> GenerateResult:
    """Drive the pizzeria workload against ``dsn`` for ``duration_s`` seconds.

    ``rate_tx_per_s`` is the target over all ``writers`` (each its own connection and
    thread); when the database cannot keep up the writers simply run flat out. Returns
    the committed transactions and the row changes per captured table (= the data events
    Debezium should emit), and how many orders_expected rows were written. Setting
    ``stop`` ends it early, after each writer's transaction in flight. ``level`` keeps
    at most that many clients (and users) live (module docstring); None lets them grow.
    """
    if rate_tx_per_s <= 0 or duration_s < 0 or writers < 1:
        raise ConfigError("generate needs rate > 0, duration >= 0 and writers >= 1")
    if level is not None and level < 1:
        raise ConfigError(f"--level must be at least 1 (live clients), got {level}")
    try:
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            world = _World(cur)
        conn.close()
    except psycopg2.Error as exc:
        raise ServiceError(f"cannot read the pizzeria tables at {mask_dsn(dsn)}: {exc}") from None

    interval = writers / rate_tx_per_s
    started = time.monotonic()
    deadline = started + duration_s
    results: list[GenerateResult] = []
    errors: list[BaseException] = []

    def work(index: int) -> None:
        writer: _Writer | None = None
        try:
            writer = _Writer(dsn, world, random.Random(seed * 1_000 + index), level)
            paced(writer.step, deadline, interval, stop)
        except BaseException as exc:
            errors.append(exc)
        finally:
            if writer is not None:
                results.append(writer.result)
                writer.close()

    threads = [threading.Thread(target=work, args=(i,), name=f"txjoin-writer-{i}")
               for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = GenerateResult()
    for result in results:
        total.merge(result)
    total.seconds = time.monotonic() - started
    if errors:
        raise ServiceError(f"a workload writer failed after {total.transactions} transactions: "
                           f"{errors[0]}") from errors[0]
    return total
