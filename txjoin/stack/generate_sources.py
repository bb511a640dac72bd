"""Racing writers on two source databases: seed 000's users in one, colours in the other.

For ``jobs/users_colors_two_dbs.py`` on a stack started with ``txjoin up --job``. Each
database gets its own writers (threads, one connection each) racing for that database's
advisory lock: as in :mod:`txjoin.stack.generate`, the lock is taken by the FIRST
statement and held until commit, so one database's transactions commit one after another.
The database's commit-order trigger (:mod:`txjoin.stack.postgres`) records each one's xid
and count of captured row changes in the uncaptured commit log
(:data:`txjoin.verify.source_tables.COMMIT_LOG`) at commit, as for any other writer. Its ``seq``
is that source's commit order: what ``txjoin verify`` checks the sink changelog's
per-source order against.

The two databases are not coordinated at all: there is no order between them, which is
the point (the guarantee is per source: docs/writing-jobs.md, "Two source databases").
Colour writers pick user ids up to a little past the largest user they have seen, so
colours of users that do not exist yet (in the other database) happen, and users get
several colours in one transaction (the greatest id wins).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg2
import psycopg2.extensions

from txjoin.errors import ConfigError, ServiceError
from txjoin.sinks.postgres import mask_dsn
from txjoin.stack.generate import (
    COLOURS,
    NAMES,
    GenerateResult,
    connect_source,
    paced,
)
from txjoin.stack.postgres import ADVISORY_LOCK_KEY

USERS_TABLE = "public.users"
COLOURS_TABLE = "public.users_favorite_color"


@dataclass
class TwoSourceResult:
    """What each database's writers committed."""

    users: GenerateResult = field(default_factory=GenerateResult)
    colors: GenerateResult = field(default_factory=GenerateResult)
    seconds: float = 0.0

    @property
    def transactions(self) -> int:
        return self.users.transactions + self.colors.transactions


class _SourceWriter:
    """One connection to one source database, one transaction per ``step``."""

    def __init__(self, dsn: str, rng: random.Random, shared: _Shared) -> None:
        self.conn = connect_source(dsn)
        self.rng, self.shared = rng, shared
        self.result = GenerateResult()
        self.kinds: list[tuple[Callable[[psycopg2.extensions.cursor], None], float]] = []
        self.tx_events = 0

    def close(self) -> None:
        self.conn.close()

    def run(self, cur: psycopg2.extensions.cursor, table: str, sql: str,
            args: tuple[object, ...] = ()) -> list[int]:
        cur.execute(sql, args)
        self.result.events_by_table[table] += cur.rowcount
        self.tx_events += cur.rowcount
        return [int(r[0]) for r in cur.fetchall()] if cur.description is not None else []

    def step(self) -> None:
        self.tx_events = 0
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
                funcs, weights = zip(*self.kinds, strict=True)
                kind = self.rng.choices(funcs, weights)[0]
                kind(cur)
                # Its place in commit order is recorded at commit by the database's trigger.
                # A transaction that changed no captured row (a delete of rows a racing
                # writer removed) gets none: pgoutput never publishes it either.
            self.conn.commit()
        except BaseException:
            self.conn.rollback()
            raise
        if self.tx_events:  # an empty transaction is never published (see above)
            self.result.transactions += 1
            self.result.transactions_by_kind[kind.__name__] += 1


@dataclass
class _Shared:
    """What the writers know: user ids seen (a hint for colour writers), colour row ids."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    max_user: int = 0
    users: list[int] = field(default_factory=list)
    colours: list[int] = field(default_factory=list)


class _UsersWriter(_SourceWriter):
    def __init__(self, dsn: str, rng: random.Random, shared: _Shared) -> None:
        super().__init__(dsn, rng, shared)
        self.kinds = [(self.new_users, 5), (self.rename_user, 4), (self.new_and_rename, 2)]

    def new_users(self, cur: psycopg2.extensions.cursor) -> None:
        """One to three users in one transaction."""
        for _ in range(self.rng.randint(1, 3)):
            name = f"{self.rng.choice(NAMES).lower()} {self.rng.randint(1, 999)}"
            (user,) = self.run(cur, USERS_TABLE, f"INSERT INTO {USERS_TABLE} (full_name) "
                               "VALUES (%s) RETURNING id", (name,))
            with self.shared.lock:
                self.shared.users.append(user)
                self.shared.max_user = max(self.shared.max_user, user)

    def rename_user(self, cur: psycopg2.extensions.cursor) -> None:
        with self.shared.lock:
            users = list(self.shared.users)
        if not users:
            return self.new_users(cur)
        for user in self.rng.sample(users, min(len(users), self.rng.randint(1, 2))):
            self.run(cur, USERS_TABLE, f"UPDATE {USERS_TABLE} SET full_name = %s WHERE id = %s",
                     (f"{self.rng.choice(NAMES)} {self.rng.randint(1, 999)}", user))
        return None

    def new_and_rename(self, cur: psycopg2.extensions.cursor) -> None:
        """A multi-statement transaction: rename someone, add someone."""
        self.rename_user(cur)
        self.new_users(cur)


class _ColoursWriter(_SourceWriter):
    def __init__(self, dsn: str, rng: random.Random, shared: _Shared) -> None:
        super().__init__(dsn, rng, shared)
        self.kinds = [(self.add_colours, 6), (self.change_colour, 4),
                      (self.delete_colours, 2), (self.replace_colours, 2)]

    def _user(self) -> int:
        # Up to a little past the newest user seen: sometimes a user the other database
        # has not committed yet (the LEFT JOIN shows the colour once the user arrives).
        with self.shared.lock:
            top = self.shared.max_user
        return self.rng.randint(1, top + 3)

    def add_colours(self, cur: psycopg2.extensions.cursor) -> None:
        """Several colours for one user at once: the greatest id wins."""
        user = self._user()
        for colour in self.rng.sample(COLOURS, self.rng.randint(1, 3)):
            ids = self.run(cur, COLOURS_TABLE, f"INSERT INTO {COLOURS_TABLE} "
                           "(user_id, favorite_color) VALUES (%s, %s) RETURNING id",
                           (user, colour))
            with self.shared.lock:
                self.shared.colours += ids

    def change_colour(self, cur: psycopg2.extensions.cursor) -> None:
        with self.shared.lock:
            colours = list(self.shared.colours)
        if not colours:
            return self.add_colours(cur)
        self.run(cur, COLOURS_TABLE, f"UPDATE {COLOURS_TABLE} SET favorite_color = %s "
                 "WHERE id = %s", (self.rng.choice(COLOURS), self.rng.choice(colours)))
        return None

    def delete_colours(self, cur: psycopg2.extensions.cursor) -> None:
        with self.shared.lock:
            if not self.shared.colours:
                gone: list[int] = []
            else:
                gone = [self.shared.colours.pop(self.rng.randrange(len(self.shared.colours)))
                        for _ in range(min(len(self.shared.colours), self.rng.randint(1, 2)))]
        if not gone:
            return self.add_colours(cur)
        self.run(cur, COLOURS_TABLE, f"DELETE FROM {COLOURS_TABLE} WHERE id = ANY(%s)", (gone,))
        return None

    def replace_colours(self, cur: psycopg2.extensions.cursor) -> None:
        """Delete a user's colours and add new ones in one transaction."""
        user = self._user()
        self.run(cur, COLOURS_TABLE, f"DELETE FROM {COLOURS_TABLE} WHERE user_id = %s", (user,))
        self.add_colours(cur)


def _known_ids(dsn: str, table: str) -> list[int]:
    try:
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT id FROM {table} ORDER BY id")
            ids = [int(r[0]) for r in cur.fetchall()]
        conn.close()
    except psycopg2.Error as exc:
        raise ServiceError(f"cannot read {table} at {mask_dsn(dsn)}: {str(exc).strip()}; is "
                           f"this a stack started with `txjoin up --job "
                           f"jobs/users_colors_two_dbs.py`?") from None
    return ids


def generate_two_sources(users_dsn: str, colors_dsn: str, rate_tx_per_s: float,
                         duration_s: float, seed: int = 0, writers: int = 2,
                         only: str | None = None) -> TwoSourceResult:
    """Drive both databases for ``duration_s`` seconds, ``writers`` racing threads on each.

    ``rate_tx_per_s`` is the target per database; ``only`` (``"users"`` or ``"colors"``)
    writes that database alone, the other one stays idle. Returns each database's committed
    transactions and row changes per table (= the data events its connector should emit).
    """
    if rate_tx_per_s <= 0 or duration_s < 0 or writers < 1:
        raise ConfigError("generate needs rate > 0, duration >= 0 and writers >= 1")
    if only not in (None, "users", "colors"):
        raise ConfigError(f"only={only!r}: expected 'users', 'colors' or None (both)")
    shared = _Shared(users=_known_ids(users_dsn, USERS_TABLE),
                     colours=_known_ids(colors_dsn, COLOURS_TABLE))
    shared.max_user = max(shared.users, default=0)
    interval = writers / rate_tx_per_s
    started = time.monotonic()
    deadline = started + duration_s
    done: list[tuple[str, GenerateResult]] = []
    errors: list[BaseException] = []

    def work(kind: str, index: int) -> None:
        writer: _SourceWriter | None = None
        try:
            rng = random.Random(seed * 1_000 + index * 2 + (kind == "colors"))
            writer = (_UsersWriter(users_dsn, rng, shared) if kind == "users"
                      else _ColoursWriter(colors_dsn, rng, shared))
            paced(writer.step, deadline, interval)
        except BaseException as exc:
            errors.append(exc)
        finally:
            if writer is not None:
                done.append((kind, writer.result))
                writer.close()

    threads = [threading.Thread(target=work, args=(kind, i), name=f"txjoin-{kind}-{i}")
               for i in range(writers) for kind in ("users", "colors") if only in (None, kind)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result = TwoSourceResult()
    for kind, partial in done:
        (result.users if kind == "users" else result.colors).merge(partial)
    result.seconds = time.monotonic() - started
    if errors:
        raise ServiceError(f"a workload writer failed after {result.transactions} "
                           f"transactions: {errors[0]}") from errors[0]
    return result
