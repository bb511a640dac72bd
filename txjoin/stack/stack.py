"""Lifecycle of the local stack: PostgreSQL -> Debezium (Kafka Connect) -> Apache Kafka.

Everything lives in one stack directory (default ``.txjoin``)::

    stack.json      pids (with start times), ports, DSNs, bootstrap servers, topics
    logs/*.log      postgres.log, broker.log, debezium.log
    postgres/       the data directory (elsewhere if the server's user cannot reach it)
    kafka-data/     the broker's server.properties, cluster id and topic data (log.dirs)
    connect/        the Connect worker's properties and the connector's settings (its
                    config, offsets and status live in Kafka topics ``txjoin-connect.*``)

With ``up(sources=...)`` (``txjoin up --job FILE`` for a job with several sources) the
cluster also gets one logical database per source (named after its topic prefix) holding
that source's tables, and one Connect worker per source (``debezium:<prefix>``, work
directory ``connect-<prefix>/``, its own REST port and Connect cluster
``txjoin-connect-<prefix>``) with its own slot, publication, topic prefix and
one-partition ``<prefix>.transaction`` topic; the single ``shop`` connector is not
started then. stack.json records them under ``sources``.

Every port, directory and the Connect REST ports are recorded (stack.json version 3), so
a stack can be started again on the same data: ``up`` after ``down`` (without
``--wipe``), or after a process died (``kill -9``), starts what is not running on the
same ports and resumes from Kafka's topics (Connect's offsets among them) and the
replication slot. ``down --wipe`` removes the data. A stack recorded by an older txjoin
(tansu kept topics in memory) cannot resume: ``up`` starts a stopped one over and asks
for ``down --wipe`` if its processes died.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg2

from txjoin import jvm
from txjoin.errors import ConfigError, ServiceError, TxjoinError
from txjoin.ingest.debezium import DEFAULT_TOPIC_PREFIX, table_topic, transaction_topic
from txjoin.job import DEFAULT_SOURCE, Job, Table
from txjoin.sinks.postgres import mask_dsn
from txjoin.stack import broker as broker_mod
from txjoin.stack import debezium as debezium_mod
from txjoin.stack import external as external_mod
from txjoin.stack import postgres as postgres_mod
from txjoin.stack.processes import (
    PortReservations,
    ProcessId,
    ensure_port_free,
    listening,
    wait_until,
)

DEFAULT_DIR = Path(".txjoin")
STATE_FILE = "stack.json"
STATE_VERSION = 3
KAFKA_DATA = "kafka-data"
RECORDED_PORT_WAIT_S = 15.0
"""How long a component started again waits for its recorded port to be released."""

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SourceSpec:
    """A source database to capture: the job's source name, topic prefix, and its tables;
    ``external_dsn``: a database the user runs (``up --source-dsn``), else one the stack
    creates in its own PostgreSQL."""

    name: str
    prefix: str
    tables: tuple[Table, ...]
    external_dsn: str | None = None
    schema: postgres_mod.SchemaFile | None = None
    """The user's DDL for the database the stack creates (``up --job --schema``)."""

    @property
    def database(self) -> str:
        """Its logical database: the user's, or named after the prefix (unique per stack)."""
        if self.external_dsn is not None:
            return external_mod.connection_settings(self.external_dsn)["database.dbname"]
        return self.prefix


    @property
    def component(self) -> str:
        """Its Debezium worker's name in stack.json and ``txjoin status``."""
        return f"debezium:{self.prefix}"


def job_sources(job: Job, source_dsn: str | None = None,
                schema: str | os.PathLike[str] | None = None) -> list[SourceSpec]:
    """The source databases of ``job``'s stack (``txjoin up --job``): one per declared
    source; a job without declared sources gets one, named after the job (its database and
    topic prefix). ``source_dsn``: capture the user's database there instead of creating
    one (a job with one source only). ``schema``: the user's DDL file, which builds the one
    database the stack creates instead of txjoin's DDL from the job's tables."""
    if schema is not None:
        if source_dsn is not None:
            raise ConfigError("--schema builds the database the stack creates; with "
                              "--source-dsn your database already has its tables: drop one")
        if len(job.sources) > 1:
            raise ConfigError(f"--schema builds one database, and job {job.name!r} reads "
                              f"{len(job.sources)} ({', '.join(s.name for s in job.sources)}); "
                              f"leave --schema out (txjoin's DDL builds each)")
        if not Path(schema).is_file():
            raise ConfigError(f"--schema {schema}: no such file")
        specs = job_sources(job)
        own = postgres_mod.SchemaFile(str(schema), job.source_file)
        return [replace(spec, schema=own) for spec in specs]
    if not job.sources:
        prefix = re.sub(r"[^a-z0-9_]", "_", job.name.lower())
        if not prefix[:1].isalpha():
            prefix = f"job_{prefix}"
        specs = [SourceSpec(DEFAULT_SOURCE, prefix, tuple(job.tables), source_dsn)]
    else:
        prefixes = job.source_prefixes(DEFAULT_TOPIC_PREFIX)
        specs = []
        for source in job.sources:
            tables = tuple(t for t in job.tables if t.source == source.name)
            if not tables:
                raise ConfigError(f"job {job.name!r} ({job.source_file}): source "
                                  f"{source.name!r} has no table; give a Table source="
                                  f"{source.name!r} or remove the source")
            specs.append(SourceSpec(source.name, prefixes[source.name], tables, source_dsn))
        if source_dsn is not None and len(specs) > 1:
            raise ConfigError(f"--source-dsn names one database, and job {job.name!r} reads "
                              f"{len(specs)} ({', '.join(s.name for s in specs)}); capture "
                              f"one source per stack, or drop --source-dsn")
    if source_dsn is not None:
        return specs
    databases = [s.database for s in specs]
    clash = {d for d in databases if databases.count(d) > 1 or d in _RESERVED_DATABASES}
    if clash and not job.sources:
        raise ConfigError(f"job {job.name!r} ({job.source_file}): a job without sources gets "
                          f"a source database and topic prefix named after it, and "
                          f"{databases[0]!r} is taken: rename the job")
    if clash:
        raise ConfigError(f"job {job.name!r} ({job.source_file}): topic prefix(es) "
                          f"{sorted(clash)} name the source databases and must be distinct and "
                          f"not one of {_RESERVED_DATABASES}")
    return specs


@dataclass(frozen=True)
class SourceInfo:
    """One running source database of a multi-source stack."""

    name: str
    prefix: str
    database: str
    dsn: str
    tables: tuple[str, ...]

    @property
    def transaction_topic(self) -> str:
        return transaction_topic(self.prefix)

    @property
    def topics(self) -> tuple[str, ...]:
        return (*(table_topic(self.prefix, t) for t in self.tables), self.transaction_topic)


@dataclass(frozen=True)
class StackInfo:
    """Where a running local stack is: what the pipeline needs to default to it."""

    pg_dsn_source: str
    pg_dsn_sink: str
    bootstrap_servers: str
    topic_prefix: str
    tables: tuple[str, ...] = ()
    sources: tuple[SourceInfo, ...] = ()
    """The source databases of a multi-source stack (``up --job``); empty otherwise."""

    @property
    def transaction_topic(self) -> str:
        """Debezium's BEGIN/END topic."""
        return transaction_topic(self.topic_prefix)

    @property
    def topics(self) -> tuple[str, ...]:
        """Every topic Debezium writes: one per captured table, then the transaction topic."""
        if self.sources:
            return tuple(t for s in self.sources for t in s.topics)
        return (*(table_topic(self.topic_prefix, t) for t in self.tables),
                self.transaction_topic)

    def source(self, name: str) -> SourceInfo:
        """The source database of the job's source ``name`` (ConfigError if not started)."""
        for source in self.sources:
            if source.name == name:
                return source
        started = ", ".join(s.name for s in self.sources) or "none (a single-source stack)"
        raise ConfigError(f"the local stack has no source database for source {name!r} "
                          f"(started: {started}); restart it with `txjoin down` and "
                          f"`txjoin up --job <job file>`")


@dataclass(frozen=True)
class UpResult:
    """What ``up`` did: the stack, whether it was already running, how long starting took."""

    info: StackInfo
    already_running: bool
    seconds: float
    resumed: bool = False
    """Started again on the data of a stack that was stopped or whose processes died."""


@dataclass(frozen=True)
class ComponentStatus:
    """One line of ``txjoin status``."""

    name: str
    pid: int
    port: int | None
    running: bool
    health: str


def _noop(_: str) -> None:
    pass


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Serialise up/down on one stack directory (two shells, or a test and a shell)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _read_state(directory: Path) -> dict[str, Any] | None:
    try:
        state = json.loads((directory / STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise ServiceError(f"{directory / STATE_FILE} is corrupt ({exc}): run "
                           f"`txjoin down --dir {directory} --wipe`") from exc
    return state if isinstance(state, dict) else None


def _write_state(directory: Path, state: dict[str, Any]) -> None:
    tmp = directory / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.chmod(0o600)  # it holds DSNs with passwords (a --source-dsn one among them)
    tmp.replace(directory / STATE_FILE)


_COMPONENTS = ("postgres", "broker", "debezium")
_RESERVED_DATABASES = ("postgres", "template0", "template1", postgres_mod.SOURCE_DB,
                       postgres_mod.SINK_DB)


def _components(state: dict[str, Any]) -> tuple[str, ...]:
    """The recorded components: one Debezium worker, or one per source database."""
    sources = state.get("sources") or []
    if not sources:
        return _COMPONENTS
    return ("postgres", "broker", *(s["component"] for s in sources))


def _debezium_components(state: dict[str, Any]) -> list[str]:
    return [c for c in _components(state) if c.startswith("debezium")]


def _process(state: dict[str, Any], name: str) -> ProcessId | None:
    entry = state.get(name)
    if not entry or "pid" not in entry:
        return None
    return ProcessId(int(entry["pid"]), int(entry["start_ticks"]))


def _alive(state: dict[str, Any]) -> dict[str, bool]:
    """Liveness of each component that got as far as having a pid."""
    alive = {}
    for name in _components(state):
        proc = _process(state, name)
        if proc is not None:
            alive[name] = proc.alive()
    return alive


def _info(state: dict[str, Any]) -> StackInfo:
    sources = tuple(SourceInfo(s["name"], s["prefix"], s["database"], s["dsn"],
                               tuple(s["tables"])) for s in state.get("sources") or [])
    return StackInfo(state["pg_dsn_source"], state["pg_dsn_sink"], state["bootstrap_servers"],
                     state["topic_prefix"], tuple(state["tables"]), sources)


def load_stack(directory: str | os.PathLike[str] = DEFAULT_DIR) -> StackInfo | None:
    """The running local stack in ``directory``, or None if none runs there.

    None also when the stack was stopped or any of its processes died, so a caller never
    defaults to servers that are gone.
    """
    state = _read_state(Path(directory))
    if state is None or state.get("stopped"):
        return None
    alive = _alive(state)
    if len(alive) != len(_components(state)) or not all(alive.values()):
        return None
    return _info(state)


def up(directory: str | os.PathLike[str] = DEFAULT_DIR, *, pg_port: int | None = None,
       broker_port: int | None = None, timeout: float = 180.0,
       progress: Progress = _noop, sources: Sequence[SourceSpec] = (),
       partitions: int = 1, job_file: str | os.PathLike[str] | None = None) -> UpResult:
    """Start PostgreSQL, the broker and Debezium in the background; wait until all are healthy.

    With ``sources`` (:func:`job_sources`), one database and one Debezium worker per
    source instead of the single ``shop`` connector. ``partitions``: each table topic is
    created with that many partitions (Debezium spreads records by row key); transaction
    topics always have one. ``job_file``: the job the sources come from (``up --job``),
    recorded so that messages can say how to start this stack again.

    Harmless when the stack already runs (``already_running``). A stack stopped by
    ``down`` (without ``--wipe``) or whose processes died (``kill -9``, a crash) is
    started again on its recorded ports and data (``resumed``): only what is not running
    is started, and a live connector whose task failed is restarted. Asking an existing
    stack for other sources, partitions or ports than it has is a ServiceError (use
    another directory, or ``down --wipe`` it). Raises ServiceError for a busy port,
    missing Java or jars, or a component that does not become healthy within ``timeout``
    seconds; whatever it started by then is stopped again (data is kept).
    """
    directory = Path(directory).resolve()
    with _locked(directory):
        state = _read_state(directory)
        if state is not None and state.get("version") != STATE_VERSION:
            if not state.get("stopped"):
                raise ServiceError(
                    f"stale stack in {directory}, made by an older txjoin (no broker data "
                    f"to resume): run `txjoin down --dir {directory} --wipe` first")
            _remove_data(directory, state)  # an older stopped stack: start over
            state = None
        if state is not None:
            _check_same_stack(directory, state, sources, partitions, pg_port, broker_port)
            for spec in sources:
                if spec.schema is not None:
                    progress(f"--schema {spec.schema.path} not applied: the stack in "
                             f"{directory} has its database {spec.database} already; "
                             f"`txjoin down --dir {directory} --wipe` first to build it "
                             f"from the file")
            alive = _alive(state)
            if (not state.get("stopped") and len(alive) == len(_components(state))
                    and all(alive.values())):
                return UpResult(_info(state), True, 0.0)
            return _resume(directory, state, timeout, progress)
        return _start_new(directory, pg_port, broker_port, timeout, progress, sources,
                          partitions, None if job_file is None else str(Path(job_file)))


def _up_command(directory: Path, state: dict[str, Any]) -> str:
    """The ``txjoin up`` that starts the recorded stack as it was started."""
    job_file = state.get("job_file")
    return f"txjoin up --dir {directory}" + (f" --job {job_file}" if job_file else "")


def start_hint(directory: str | os.PathLike[str]) -> str:
    """How to start the stack in ``directory``: as it was started (a ``--job`` stack names
    its job file), or a new one. Never a command that deletes data."""
    directory = Path(directory).resolve()
    state = _read_state(directory)
    if state is None or state.get("version") != STATE_VERSION:
        return f"start one with `txjoin up --dir {directory}` (add --job FILE for a job's own)"
    return f"start it again with `{_up_command(directory, state)}` (its data is kept)"


def recorded_start(directory: str | os.PathLike[str]) -> tuple[list[SourceSpec], int] | None:
    """(sources, partitions) the stack in ``directory`` was started with, to start it again
    as it was (``txjoin up`` without --job); None if no stack is recorded there."""
    state = _read_state(Path(directory).resolve())
    if state is None or state.get("version") != STATE_VERSION:
        return None
    return _recorded_sources(state), int(state.get("partitions", 1))


def _check_same_stack(directory: Path, state: dict[str, Any], sources: Sequence[SourceSpec],
                      partitions: int, pg_port: int | None, broker_port: int | None) -> None:
    """ServiceError if ``up``'s arguments ask for another stack than the one recorded. The
    way out it names loses nothing: start the recorded stack as it was, or give the other
    one its own directory."""
    own = (f"start this one as it was with `{_up_command(directory, state)}`, or give the "
           f"other its own directory (`txjoin up --dir OTHER ...`)")
    recorded = [s["prefix"] for s in state.get("sources") or []]
    wanted = [s.prefix for s in sources]
    if recorded != wanted:
        started = f" (started with --job {state['job_file']})" if state.get("job_file") else ""
        raise ServiceError(f"the stack in {directory} has source databases "
                           f"{recorded or [postgres_mod.SOURCE_DB]}{started}, not "
                           f"{wanted or [postgres_mod.SOURCE_DB]}: {own}")
    if state.get("partitions", 1) != partitions:
        raise ServiceError(f"the stack in {directory} has table topics with "
                           f"{state.get('partitions', 1)} partition(s), not {partitions}: "
                           f"{own}")
    for name, port in (("postgres", pg_port), ("broker", broker_port)):
        if port is not None and state.get(name, {}).get("port") != port:
            raise ServiceError(f"the stack in {directory} has its {name} on port "
                               f"{state.get(name, {}).get('port')}, not {port}: {own}")


def _start_new(directory: Path, pg_port: int | None, broker_port: int | None, timeout: float,
               progress: Progress, sources: Sequence[SourceSpec], partitions: int,
               job_file: str | None = None) -> UpResult:
    """Record a new stack's ports and directories, then start it (see :func:`up`)."""
    # Fail on the cheap checks before starting anything.
    broker_mod.java_binary()
    for jars in ("kafka", "connect", "connect-plugins"):
        jvm.jars_dir(jars)
    connector = debezium_mod.connector_config(
        {"PG_HOST": "", "PG_PORT": "", "PG_USER": "", "PG_PASSWORD": ""})
    if pg_port is not None:
        ensure_port_free(pg_port, "PostgreSQL")
    if broker_port is not None:
        ensure_port_free(broker_port, "the broker")
    for spec in sources:
        if spec.external_dsn is not None:
            progress(f"source {spec.name!r}: checking {mask_dsn(spec.external_dsn)} for "
                     f"logical decoding")
            external_mod.check_capture(spec.external_dsn, spec.tables,
                                       debezium_mod.slot_name(spec.prefix),
                                       debezium_mod.publication_name(spec.prefix))
    given_broker_port = broker_port is not None
    # Every port of this stack, held until the stack has started (each server binds beside
    # the socket holding its port): no two of its servers are given the same one, and no
    # other stack's pick takes one meanwhile.
    with PortReservations([port for port in (pg_port, broker_port) if port is not None]) \
            as ports:
        return _start_new_on(directory, pg_port or ports.pick(), broker_port or ports.pick(),
                             given_broker_port, ports, timeout, progress, sources, partitions,
                             connector, job_file)


def _start_new_on(directory: Path, pg_port: int, broker_port: int, given_broker_port: bool,
                  ports: PortReservations, timeout: float, progress: Progress,
                  sources: Sequence[SourceSpec], partitions: int, connector: dict[str, str],
                  job_file: str | None) -> UpResult:
    """:func:`_start_new` once its ports are picked (``ports`` holds the ones it picked)."""
    started = time.monotonic()
    logs = directory / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    prefix = connector["topic.prefix"]
    tables = tuple(t.strip() for t in connector["table.include.list"].split(",") if t.strip())
    state: dict[str, Any] = {
        "version": STATE_VERSION, "dir": str(directory), "stopped": False,
        "started_at": time.time(),
        "pg_dsn_source": postgres_mod.dsn(pg_port, postgres_mod.SOURCE_DB),
        "pg_dsn_sink": postgres_mod.dsn(pg_port, postgres_mod.SINK_DB),
        "bootstrap_servers": f"127.0.0.1:{broker_port}",
        "topic_prefix": prefix, "tables": list(tables), "partitions": partitions,
        "job_file": job_file,
        "sources": [{"name": s.name, "prefix": s.prefix, "database": s.database,
                     "dsn": s.external_dsn or postgres_mod.dsn(pg_port, s.database),
                     "external": s.external_dsn is not None, "component": s.component,
                     "tables": [t.name for t in s.tables]} for s in sources],
        "postgres": {"port": pg_port, "data_root": str(postgres_mod.data_root(directory)),
                     "log": str(logs / "postgres.log")},
        "broker": {"port": broker_port, "controller_port": ports.pick(),
                   "data_dir": str(directory / KAFKA_DATA), "log": str(logs / "broker.log")},
    }
    if len(sources) == 1:  # the job's one database is the stack's source
        only = state["sources"][0]
        state.update(pg_dsn_source=only["dsn"], topic_prefix=only["prefix"],
                     tables=only["tables"])
    workers = [("debezium", directory / "connect", logs / "debezium.log", None)] \
        if not sources else \
        [(s.component, directory / f"connect-{s.prefix}", logs / f"debezium-{s.prefix}.log",
          entry["dsn"]) for s, entry in zip(sources, state["sources"], strict=True)]
    for name, work_dir, log, dsn in workers:
        state[name] = {"work_dir": str(work_dir), "rest_port": ports.pick(), "log": str(log),
                       **({"dsn": dsn} if dsn else {})}
    _write_state(directory, state)
    unfit = False  # the user's schema does not fit the job
    try:
        with _stopped_on_failure(directory, state):
            _start_postgres(directory, state, timeout, progress)
            for spec in sources:
                if spec.external_dsn is not None:
                    continue
                built = f" from {spec.schema.path}" if spec.schema else ""
                progress(f"postgres: database {spec.database} for source {spec.name!r}{built}")
                try:
                    url = postgres_mod.create_source_database(pg_port, spec.database,
                                                              spec.tables, spec.schema)
                except ConfigError:
                    unfit = spec.schema is not None
                    raise
                if len(sources) == 1:
                    # verify's own record of the history, from the empty tables on, so an
                    # as_of_fact job is verifiable on any writes (docs/verify.md).
                    from txjoin.verify.history import start_record

                    start_record(url, directory, [t.name for t in spec.tables])
            _repick_taken_ports(directory, state, given_broker_port, ports)
            _start_broker(directory, state, timeout, progress)
            for name in _debezium_components(state):
                _start_debezium(directory, state, name, progress)
            for name in _debezium_components(state):
                _wait_debezium(state, timeout, name)
    finally:
        if unfit:  # nothing of this new stack is worth keeping: the next `up` builds anew
            _remove_data(directory, state)
            for name in (STATE_FILE, STATE_FILE + ".tmp"):
                (directory / name).unlink(missing_ok=True)
    return _started(directory, state, started, progress, resumed=False)


def _repick_taken_ports(directory: Path, state: dict[str, Any], keep_broker_port: bool,
                        ports: PortReservations) -> None:
    """For a new stack, before its broker starts: replace each port txjoin picked for the broker
    and the Connect workers that something else has begun to listen on since (PostgreSQL and
    the source databases start in between; ``ports`` keeps txjoin's own picks elsewhere off
    them, not a server that chose its port another way). A port the user gave is kept: a busy one
    fails with the usual one line. A resumed stack keeps its recorded ports (the controller's
    is in the broker's formatted data)."""
    broker = state["broker"]
    picked = [(broker, "controller_port")] + [
        (state[name], "rest_port") for name in _debezium_components(state)]
    if not keep_broker_port:
        picked.append((broker, "port"))
    for entry, key in picked:
        if not _port_free(entry[key]):
            entry[key] = ports.pick()
    state["bootstrap_servers"] = f"127.0.0.1:{broker['port']}"
    _write_state(directory, state)


def _port_free(port: int) -> bool:
    try:
        ensure_port_free(port, "")
    except ServiceError:
        return False
    return True


@contextlib.contextmanager
def _stopped_on_failure(directory: Path, state: dict[str, Any]) -> Iterator[None]:
    """Stop every component started so far, and record the stack stopped, if starting fails."""
    try:
        yield
    except BaseException:
        _stop_all(state)
        state["stopped"] = True
        _write_state(directory, state)
        raise


def _resume(directory: Path, state: dict[str, Any], timeout: float,
            progress: Progress) -> UpResult:
    """Start what of a recorded stack is not running, on its ports and data (see :func:`up`)."""
    started = time.monotonic()
    broker_mod.java_binary()
    state["stopped"] = False
    with _stopped_on_failure(directory, state):
        for name in _components(state):
            proc = _process(state, name)
            if proc is not None and proc.alive():
                if name.startswith("debezium"):
                    entry = state[name]
                    rest = debezium_mod.rest_url(entry["rest_port"])
                    if debezium_mod.task_state(rest, entry["connector"]) == "FAILED":
                        progress(f"{name}: restarting the failed connector task")
                        debezium_mod.restart_failed(rest, entry["connector"])
                continue
            if name == "postgres":
                _start_postgres(directory, state, timeout, progress)
            elif name == "broker":
                _start_broker(directory, state, timeout, progress)
            else:
                _start_debezium(directory, state, name, progress)
        for name in _debezium_components(state):
            _wait_debezium(state, timeout, name)
    return _started(directory, state, started, progress, resumed=True)


def _started(directory: Path, state: dict[str, Any], started: float, progress: Progress,
             resumed: bool) -> UpResult:
    seconds = time.monotonic() - started
    state["start_seconds"] = round(seconds, 2)
    _write_state(directory, state)
    progress(f"stack {'resumed on its data' if resumed else 'up'} in {seconds:.1f}s")
    return UpResult(_info(state), False, seconds, resumed)


def _start_postgres(directory: Path, state: dict[str, Any], timeout: float,
                    progress: Progress) -> None:
    entry = state["postgres"]
    progress(f"postgres: starting on 127.0.0.1:{entry['port']}")
    ensure_port_free(entry["port"], "PostgreSQL", wait=RECORDED_PORT_WAIT_S)
    pg = postgres_mod.start_postgres(Path(entry["data_root"]), entry["port"],
                                     Path(entry["log"]), timeout)
    entry.update(pid=pg.process.pid, start_ticks=pg.process.start_ticks)
    _write_state(directory, state)


def _start_broker(directory: Path, state: dict[str, Any], timeout: float,
                  progress: Progress) -> None:
    """Start Kafka on the recorded ports and data; create the topics it does not have yet."""
    entry = state["broker"]
    progress(f"broker: starting Kafka on {state['bootstrap_servers']}")
    ensure_port_free(entry["port"], "the broker", wait=RECORDED_PORT_WAIT_S)
    ensure_port_free(entry["controller_port"], "the broker's KRaft controller",
                     wait=RECORDED_PORT_WAIT_S)
    br = broker_mod.start_broker(Path(entry["data_dir"]), entry["port"], Path(entry["log"]),
                                 controller_port=entry["controller_port"], timeout=timeout)
    entry.update(pid=br.process.pid, start_ticks=br.process.start_ticks)
    _write_state(directory, state)
    info = _info(state)
    transaction_topics = ({s.transaction_topic for s in info.sources}
                          or {info.transaction_topic})
    broker_mod.create_topics(info.bootstrap_servers, sorted(transaction_topics), timeout)
    broker_mod.create_topics(info.bootstrap_servers,
                             [t for t in info.topics if t not in transaction_topics], timeout,
                             partitions=state.get("partitions", 1))
    # Debezium captures its signal table too (the watermarks of an incremental snapshot):
    # without its topic (no auto-creation) the connector's producer waits for it forever.
    prefixes = [s.prefix for s in info.sources] or [info.topic_prefix]
    broker_mod.create_topics(info.bootstrap_servers,
                             [table_topic(p, debezium_mod.signal_table()) for p in prefixes],
                             timeout)


def _start_debezium(directory: Path, state: dict[str, Any], name: str,
                    progress: Progress) -> None:
    """Start the Connect worker ``name`` on its recorded work directory and REST port."""
    entry = state[name]
    source = next((s for s in state.get("sources") or [] if s["component"] == name), None)
    overrides = None if source is None else debezium_mod.source_overrides(
        source["name"], source["prefix"], source["database"], list(source["tables"]))
    if source is not None and source.get("external"):
        assert overrides is not None
        overrides.update(external_mod.connection_settings(source["dsn"]))
        overrides.update(debezium_mod.NO_SIGNAL)
    what = "" if source is None else f" for source {source['name']!r} (prefix {source['prefix']})"
    progress(f"{name}: starting Kafka Connect{what}, REST on 127.0.0.1:{entry['rest_port']}")
    ensure_port_free(entry["rest_port"], f"{name}'s Kafka Connect REST API",
                     wait=RECORDED_PORT_WAIT_S)
    dbz = debezium_mod.start_debezium(
        Path(entry["work_dir"]), state["bootstrap_servers"], state["postgres"]["port"],
        postgres_mod.DB_USER, postgres_mod.DB_PASSWORD, Path(entry["log"]),
        overrides=overrides, rest_port=entry["rest_port"],
        cluster=debezium_mod.cluster_name(None if source is None else source["prefix"]))
    entry.update(pid=dbz.process.pid, start_ticks=dbz.process.start_ticks,
                 connector=dbz.connector, slot=dbz.slot_name)
    _write_state(directory, state)


def restart(directory: str | os.PathLike[str], component: str, *,
            timeout: float = 180.0) -> float:
    """Stop one component of a running stack (SIGTERM: Debezium flushes its offsets, Kafka
    shuts down cleanly) and start it again on the same ports and data; wait until every
    connector streams again. Returns the seconds it took."""
    started = time.monotonic()
    directory = Path(directory).resolve()
    with _locked(directory):
        state = _read_state(directory)
        if state is None or state.get("stopped") or component not in _components(state):
            raise ServiceError(f"no running stack with a {component} in {directory}: "
                               f"`txjoin up --dir {directory}` first")
        proc = _process(state, component)
        if proc is not None:
            _STOPPERS.get(component, debezium_mod.stop_debezium)(proc)
    up(directory, sources=_recorded_sources(state), partitions=state.get("partitions", 1),
       timeout=timeout)
    return time.monotonic() - started


def _recorded_sources(state: dict[str, Any]) -> list[SourceSpec]:
    """The SourceSpecs ``up`` was given (the tables only by name: enough to compare)."""
    return [SourceSpec(s["name"], s["prefix"], ()) for s in state.get("sources") or []]


def _slot_active(dsn: str, slot: str) -> bool:
    """True once Debezium streams from its replication slot (i.e. the snapshot is done)."""
    try:
        with contextlib.closing(psycopg2.connect(dsn, connect_timeout=2)) as conn, \
                conn.cursor() as cur:
            cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            row = cur.fetchone()
    except psycopg2.Error:
        return False
    return bool(row and row[0])


def _wait_debezium(state: dict[str, Any], timeout: float, name: str = "debezium") -> None:
    entry = state[name]
    dsn = entry.get("dsn", state["pg_dsn_source"])
    rest = debezium_mod.rest_url(entry["rest_port"])

    registered = False

    def healthy() -> bool:
        nonlocal registered
        if not registered:  # the connector's settings, through the worker's REST API
            registered = debezium_mod.register(rest, entry["connector"],
                                               Path(entry["work_dir"]))
            if not registered:
                return False
        task = debezium_mod.task_state(rest, entry["connector"])
        if task == "FAILED":
            trace = (debezium_mod.task_trace(rest, entry["connector"]) or "").strip()
            raise ServiceError(
                f"{name}: the connector task FAILED: "
                f"{trace.splitlines()[0] if trace else 'no trace'}; see {entry['log']}"
            )
        return task == "RUNNING" and _slot_active(dsn, entry["slot"])

    wait_until(healthy, timeout, f"{name} (task RUNNING and streaming from its slot)",
               _process(state, name), entry["log"], interval=0.25)


_STOPPERS: dict[str, Callable[[ProcessId], bool]] = {
    "postgres": postgres_mod.stop_postgres, "broker": broker_mod.stop_broker}


def _stop_all(state: dict[str, Any]) -> list[str]:
    """Stop the recorded processes (Debezium first: it needs the others to shut down cleanly)."""
    stopped = []
    for name in (*_debezium_components(state), "postgres", "broker"):
        proc = _process(state, name)
        if proc is not None and _STOPPERS.get(name, debezium_mod.stop_debezium)(proc):
            stopped.append(name)
    return stopped


DERIVED = ("checkpoints", "output")
"""What ``txjoin run`` keeps in the stack's directory by default, derived from its topics."""


def stale_checkpoints(directory: str | os.PathLike[str]) -> list[str]:
    """Jobs with a checkpoint in ``directory/checkpoints`` (after ``up``: of an earlier stack)."""
    root = Path(directory) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "offsets").is_dir())


def _remove_data(directory: Path, state: dict[str, Any] | None) -> None:
    """Remove what the stack created in ``directory`` (never anything else that lives there)."""
    roots = [directory / "postgres", directory / "connect", directory / KAFKA_DATA,
             *(directory / f"connect-{s['prefix']}" for s in (state or {}).get("sources") or [])]
    pg_root = (state or {}).get("postgres", {}).get("data_root")
    if pg_root:
        roots.append(Path(pg_root))
    for path in roots:
        shutil.rmtree(path, ignore_errors=True)


def _drop_verify_record(dsn: str, directory: Path) -> str | None:
    """Drop verify's slot from a database the user runs (it keeps WAL while unread);
    what is left, if it cannot."""
    from txjoin.verify.history import SLOT, drop_record

    try:
        drop_record(dsn, directory)
    except (TxjoinError, psycopg2.Error) as exc:
        return (f"verify's replication slot {SLOT} may remain on the source database "
                f"({' '.join(str(exc).split())}): `txjoin verify JOB --drop-record` or "
                f"`SELECT pg_drop_replication_slot('{SLOT}')`, or the server keeps WAL for it")
    return None


def down(directory: str | os.PathLike[str] = DEFAULT_DIR, *, wipe: bool = False,
         warn: Progress = _noop) -> list[str]:
    """Stop exactly the processes ``up`` recorded; return the names of those that were running.

    Keeps data and logs for a post-mortem unless ``wipe``, which removes them, the state
    file, and the default checkpoints and Delta outputs under ``directory`` (``DERIVED``)
    too, and drops the connector's replication slot and publication from a database the
    user runs (``up --source-dsn``; ``warn`` says what is left if it cannot). Harmless
    when nothing runs.
    """
    directory = Path(directory).resolve()
    if not directory.exists():
        return []
    with _locked(directory):
        state = _read_state(directory)
        stopped = _stop_all(state) if state else []
        if state is not None:
            state["stopped"] = True
            _write_state(directory, state)
        if wipe:
            for source in (state or {}).get("sources") or []:
                if source.get("external"):
                    left = external_mod.drop_capture(
                        source["dsn"], debezium_mod.slot_name(source["prefix"]),
                        debezium_mod.publication_name(source["prefix"]))
                    if left:
                        warn(left)
                    left = _drop_verify_record(source["dsn"], directory)
                    if left:
                        warn(left)
            _remove_data(directory, state)
            # verify's records of the stack's own databases go with them.
            shutil.rmtree(directory / "verify", ignore_errors=True)
            shutil.rmtree(directory / "logs", ignore_errors=True)
            # Checkpoints and outputs made from this stack's topics mean nothing to the
            # next stack's (new topics, new offsets): they go with the data.
            for derived in DERIVED:
                shutil.rmtree(directory / derived, ignore_errors=True)
            for name in (STATE_FILE, STATE_FILE + ".tmp", ".lock"):
                (directory / name).unlink(missing_ok=True)
    if wipe:
        with contextlib.suppress(OSError):
            directory.rmdir()  # only if nothing else lives there
    return stopped


def status(directory: str | os.PathLike[str] = DEFAULT_DIR) -> list[ComponentStatus]:
    """Each recorded component with pid, port, whether it runs and a health check."""
    directory = Path(directory).resolve()
    state = _read_state(directory)
    if state is None:
        return []
    result = []
    for name in _components(state):
        entry = state.get(name)
        proc = _process(state, name)
        if entry is None or proc is None:
            continue
        running = proc.alive()
        port = entry.get("port", entry.get("rest_port"))  # Connect: its REST API's port
        if not running:
            health = "stopped" if state.get("stopped") else "DEAD (stale: run txjoin down)"
        elif name == "postgres":
            health = "accepting connections" if _accepts(state["pg_dsn_sink"]) else "unreachable"
        elif name == "broker":
            health = "listening" if listening(int(port)) else "not listening"
        else:
            rest = debezium_mod.rest_url(entry["rest_port"])
            task = debezium_mod.task_state(rest, entry["connector"])
            streaming = _slot_active(entry.get("dsn", state["pg_dsn_source"]), entry["slot"])
            health = f"task {task}, " + ("streaming" if streaming else "not streaming yet")
        result.append(ComponentStatus(name, proc.pid, port, running, health))
    return result


def _accepts(dsn: str) -> bool:
    try:
        psycopg2.connect(dsn, connect_timeout=2).close()
    except psycopg2.Error:
        return False
    return True
