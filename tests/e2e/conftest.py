"""The real local stack for the end-to-end tests, shared by the files that ask for it.

``e2e_stack`` starts it in a temporary directory (``txjoin up``) and wipes it (``txjoin down
--wipe``) after the last test of the files that use it (scripts/test.sh runs those files one
after the other on one worker). test_stack.py keeps its own module-scoped ``stack``
fixture: it stops its stack in a test, so it cannot share this one.

Before any workload runs, a trigger copies every row written to
``public.orders_expected`` (PostgreSQL's as-of answer, one row per order, overwritten)
into ``public.orders_expected_history``, so a test can compare the whole sequence of an
order's versions with the sinks' changelog. Neither table is captured by Debezium.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest

from tests.conftest import uses_shared_stack
from txjoin.stack import down, load_stack, up
from txjoin.stack import stack as stack_mod
from txjoin.stack.stack import StackInfo

HISTORY_SQL = """
CREATE TABLE IF NOT EXISTS public.orders_expected_history AS
    SELECT * FROM public.orders_expected WITH NO DATA;
CREATE OR REPLACE FUNCTION public.keep_orders_expected_history() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.orders_expected_history SELECT NEW.*;
    RETURN NEW;
END
$$;
DROP TRIGGER IF EXISTS keep_history ON public.orders_expected;
CREATE TRIGGER keep_history AFTER INSERT OR UPDATE ON public.orders_expected
    FOR EACH ROW EXECUTE FUNCTION public.keep_orders_expected_history();
"""


@dataclass(frozen=True)
class E2EStack:
    """A running stack: its directory and what ``load_stack`` says about it."""

    directory: Path
    info: StackInfo


@contextlib.contextmanager
def running_stack(directory: Path, partitions: int = 1) -> Iterator[E2EStack]:
    """``txjoin up`` in ``directory`` with the history trigger installed; wiped on the way out."""
    started = time.monotonic()
    result = up(directory, partitions=partitions)
    print(f"\n[e2e] stack up in {time.monotonic() - started:.1f}s")
    try:
        with psycopg2.connect(result.info.pg_dsn_source) as conn, conn.cursor() as cur:
            cur.execute(HISTORY_SQL)
        conn.close()
        yield E2EStack(directory, result.info)
    finally:
        down(directory, wipe=True)


class _SharedStack:
    """The shared stack of this test process: started by the first test that asks for it,
    wiped right after the last test of the files that use it (not at the end of the session:
    idle, a stack still costs ~6 s of CPU a minute, and scripts/test.sh's worker goes on to
    other files for a quarter of an hour; issue 34). A later test that asks again gets a
    new one."""

    def __init__(self) -> None:
        self.exits = contextlib.ExitStack()
        self.stack: E2EStack | None = None

    def get(self, tmp_path_factory: pytest.TempPathFactory) -> E2EStack:
        if self.stack is None:
            self.stack = self.exits.enter_context(
                running_stack(tmp_path_factory.mktemp("e2e-stack")))
        return self.stack

    def close(self) -> None:
        self.stack = None
        self.exits.close()


_SHARED = _SharedStack()


@pytest.fixture
def e2e_stack(tmp_path_factory: pytest.TempPathFactory) -> E2EStack:
    return _SHARED.get(tmp_path_factory)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Wipe the shared stack once the next test is in none of the files that use it
    (xdist's worker knows its next test; scripts/test.sh sends all those files as one unit).
    Not as soon as the next test does not ask for it: a test of those files may need what
    earlier ones wrote to the stack (test_end_to_end.py's verify tests read the workload's
    orders), and a test without it can come between."""
    try:
        return (yield)
    finally:
        if _SHARED.stack is not None and (
                nextitem is None or not uses_shared_stack(Path(nextitem.path))):
            _SHARED.close()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _SHARED.close()  # a run stopped early


def restart_debezium(directory: Path, *, timeout: float = 120.0) -> float:
    """Stop the stack's Kafka Connect worker (SIGTERM: it flushes its offsets) and start it
    again on the same offsets (in its Kafka topic) and replication slot; wait until it
    streams again. Returns the seconds it took."""
    seconds = stack_mod.restart(directory, "debezium", timeout=timeout)
    assert load_stack(directory) is not None
    return seconds


def committed_after(dsn: str, transactions: int, timeout: float = 120.0) -> None:
    """Wait until the source has given out ``transactions`` more transaction ids than now (a
    workload is writing): a condition instead of a sleep."""
    def xmax() -> int:
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
            value = int(cur.fetchone()[0])
        conn.close()
        return value

    target = xmax() + transactions
    deadline = time.monotonic() + timeout
    while xmax() < target:
        assert time.monotonic() < deadline, f"fewer than {transactions} transactions in {timeout}s"
        time.sleep(0.2)
