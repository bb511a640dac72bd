"""tests/unit starts no server: PostgreSQL, a broker or a Spark session started by a test here
(its fixtures included) fails it, naming the lane where such a test belongs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def _refuse(what: str) -> Any:
    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError(f"tests/unit starts no server, but this test starts {what}: move "
                             "it to tests/e2e (real services) or tests/spark (a Spark session)")
    return refuse


def _no_servers() -> pytest.MonkeyPatch:
    from pyspark.sql import SparkSession

    import tests.fixtures.postgres as test_postgres
    from txjoin.stack import broker, postgres

    patch = pytest.MonkeyPatch()
    patch.setattr(test_postgres, "running_postgres", _refuse("PostgreSQL"))
    patch.setattr(postgres, "start_postgres", _refuse("PostgreSQL"))
    patch.setattr(broker, "start_broker", _refuse("a Kafka broker"))
    patch.setattr(SparkSession.Builder, "getOrCreate", _refuse("a Spark session"))
    return patch


# Around each phase, so module- and session-scoped fixtures are covered too (these hooks run
# for tests under tests/unit only).
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    patch = _no_servers()
    yield
    patch.undo()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    patch = _no_servers()
    yield
    patch.undo()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    patch = _no_servers()
    yield
    patch.undo()
