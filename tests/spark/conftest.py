"""Shared fixtures for tests that need Spark: one local session for the whole run.

A session takes 5-13 s to start here, so every test in tests/spark shares it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from txjoin.pipeline.session import get_session, stop_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One shared ``local[2]`` Spark session with txjoin's settings, stopped at the end."""
    session = get_session("local[2]", app_name="txjoin-tests")
    yield session
    stop_session()


@pytest.fixture(scope="session")
def pg_dsn(pg_server: str) -> str:
    """The session's shared PostgreSQL server (tests/conftest.py), for the sinks: runs keep
    apart by table names (scenarios: a suffix per scenario; sink tests: their own tables)."""
    return pg_server
