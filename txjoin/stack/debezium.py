"""Debezium 3.7 on a stock Kafka Connect 4.3 worker (``ConnectDistributed``, a one-worker
cluster).

The worker's jars come from ``.jars/connect/``, the Debezium PostgreSQL plugin from
``.jars/connect-plugins/`` (``plugin.path``), both fetched by ``scripts/jars.sh``. Each
worker runs one connector, registered through the Connect REST API on 127.0.0.1 (which
``txjoin status`` also asks for the task's state), and keeps the connector's config,
offsets and status in three compacted Kafka topics of its own (:func:`cluster_name`).
Offsets in Kafka, not the standalone worker's file: ``FileOffsetBackingStore`` rewrites
its file in place, so a worker killed mid-write restarts with no offsets, and Debezium
then takes a new snapshot of tables it already published; a record in a log is there
whole or not at all.

The connector's settings live in ONE file, ``config/debezium-postgres.properties``; its
``${PG_*}`` placeholders are filled at ``up`` time. ``python -m txjoin.stack.render_connector``
prints the same settings for the Connect REST API (docker-compose registers that rendering).
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from txjoin import jvm
from txjoin.errors import ConfigError, ServiceError
from txjoin.stack.broker import java_binary
from txjoin.stack.processes import LOG4J2_PROPERTIES, ProcessId, free_port, log4j2_config, stop

# Measured here (`txjoin up`, worker start to task RUNNING): see docs/local-stack.md.
PLUGIN_DISCOVERY = "service_load"
REPO_CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"
CONNECTOR_PROPERTIES = REPO_CONFIG_DIR / "debezium-postgres.properties"
CONNECTOR_JSON = REPO_CONFIG_DIR / "debezium-postgres.json"
# The values docker-compose.yaml gives the placeholders (service `postgres`).
COMPOSE_VALUES = {"PG_HOST": "postgres", "PG_PORT": "5432",
                  "PG_USER": "postgres", "PG_PASSWORD": "postgres"}

# Client config dumps and metadata chatter drown the connector's own messages.
LOG4J2 = log4j2_config({"clients": "org.apache.kafka.clients",
                        "config": "org.apache.kafka.common.config"})


def parse_properties(text: str) -> dict[str, str]:
    """Parse the subset of java.util.Properties our config uses: ``key=value``, ``#`` comments."""
    props: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError(f"line {number}: expected key=value, got {raw!r}")
        props[key.strip()] = value.strip()
    return props


UNSET = "\0unset"
"""An override that leaves a setting out of the connector's configuration."""

NO_SIGNAL = {"signal.data.collection": UNSET, "signal.enabled.channels": UNSET}
"""The overrides of a database the user runs (``up --source-dsn``): txjoin did not create
the signal table there, and Debezium would put the missing table in its publication."""

SIGNAL_COLUMNS = "id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048)"
"""Debezium's signal table's columns (id, type, data; as schema.sql creates them)."""


def apply_overrides(connector: dict[str, str], overrides: dict[str, str] | None
                    ) -> dict[str, str]:
    """``connector`` with ``overrides`` replacing its settings; one set to :data:`UNSET`
    left out."""
    return {k: v for k, v in {**connector, **(overrides or {})}.items() if v != UNSET}


def signal_table(path: Path = CONNECTOR_PROPERTIES) -> str:
    """The signal table the shipped connector reads (``signal.data.collection``)."""
    return parse_properties(path.read_text())["signal.data.collection"]


def signal_ddl(table: str | None = None) -> str:
    """``CREATE TABLE`` of the signal table (a job's source database: schema.sql has its
    own)."""
    return f"CREATE TABLE IF NOT EXISTS {table or signal_table()} ({SIGNAL_COLUMNS})"


def execute_snapshot_sql(tables: list[str], signal: str | None = None) -> str:
    """The one SQL line that asks Debezium for an incremental snapshot of ``tables``."""
    collections = json.dumps({"data-collections": tables, "type": "incremental"})
    return (f"INSERT INTO {signal or signal_table()} (id, type, data) VALUES "
            f"(gen_random_uuid()::text, 'execute-snapshot', '{collections}');")


def connector_config(values: dict[str, str], path: Path = CONNECTOR_PROPERTIES) -> dict[str, str]:
    """The connector settings from ``path`` with their ``${NAME}`` placeholders filled."""
    if not path.exists():
        raise ConfigError(f"connector config {path} not found (run from a txjoin checkout)")
    rendered: dict[str, str] = {}
    for key, value in parse_properties(path.read_text()).items():
        try:
            rendered[key] = Template(value).substitute(values)
        except KeyError as exc:
            raise ConfigError(f"{path}: {key} uses placeholder {exc} that has no value") from exc
    return rendered


def _properties_text(props: dict[str, str]) -> str:
    # Values here hold no characters Properties would unescape, except backslashes in paths.
    return "".join(f"{key}={value.replace(chr(92), chr(92) * 2)}\n" for key, value in
                   props.items())


def plugin_path() -> Path:
    """The folder Kafka Connect loads the Debezium connector plugin from."""
    return jvm.jars_dir("connect-plugins")


@dataclass(frozen=True)
class Debezium:
    """A started Connect worker running one connector, and where its REST API listens."""

    process: ProcessId
    rest_port: int
    connector: str
    slot_name: str

    @property
    def rest_url(self) -> str:
        return rest_url(self.rest_port)


def rest_url(port: int) -> str:
    """The base URL of a worker's REST API on 127.0.0.1:``port``."""
    return f"http://127.0.0.1:{port}"


# How often the worker records the connector's offsets (a restarted or killed worker
# resends what came after the last record).
OFFSET_FLUSH_INTERVAL_MS = 1000


# The Connect cluster (group id and internal topics) of the single `shop` connector;
# docker-compose's worker uses the same names.
CONNECT_CLUSTER = "txjoin-connect"
# The internal topics of a cluster: f"{cluster}.{suffix}" (compacted, one replica).
INTERNAL_TOPIC_SUFFIXES = ("configs", "offsets", "status")
# What a standalone worker of an older txjoin left in its work directory.
STANDALONE_OFFSETS_FILE = "offsets.dat"


def cluster_name(prefix: str | None = None) -> str:
    """The Connect cluster of the worker for topic prefix ``prefix`` (None: the single
    ``shop`` connector's): its group id and the prefix of its internal topics."""
    return CONNECT_CLUSTER if prefix is None else f"{CONNECT_CLUSTER}-{prefix}"


def worker_properties(bootstrap_servers: str, rest_port: int,
                      cluster: str = CONNECT_CLUSTER) -> dict[str, str]:
    """The worker's settings: a one-worker cluster ``cluster`` whose config, offsets and
    status live in Kafka (kept across restarts: a restarted worker resumes where its last
    offset flush left it)."""
    configs, offsets, status = (f"{cluster}.{suffix}" for suffix in INTERNAL_TOPIC_SUFFIXES)
    return {
        "bootstrap.servers": bootstrap_servers,
        "listeners": f"http://127.0.0.1:{rest_port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.advertised.port": str(rest_port),
        "group.id": cluster,
        "config.storage.topic": configs,
        "config.storage.replication.factor": "1",
        "offset.storage.topic": offsets,
        "offset.storage.replication.factor": "1",
        "offset.storage.partitions": "1",
        "status.storage.topic": status,
        "status.storage.replication.factor": "1",
        "status.storage.partitions": "1",
        # One worker: a task of a worker that died is not held back for it (the default
        # waits 5 minutes for the lost worker to return), and the restarted worker's join
        # waits out the dead member's session for no longer than the broker allows.
        "scheduled.rebalance.max.delay.ms": "0",
        "session.timeout.ms": "6000",
        "heartbeat.interval.ms": "2000",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "offset.flush.interval.ms": str(OFFSET_FLUSH_INTERVAL_MS),
        "plugin.path": str(plugin_path()),
        # The plugin's jars carry ServiceLoader manifests: no reflective scan of every class.
        "plugin.discovery": PLUGIN_DISCOVERY,
        "producer.enable.idempotence": "true",
        "producer.acks": "all",
    }


def start_debezium(work_dir: Path, bootstrap_servers: str, pg_port: int, pg_user: str,
                   pg_password: str, log_path: Path,
                   config_path: Path = CONNECTOR_PROPERTIES,
                   overrides: dict[str, str] | None = None,
                   rest_port: int | None = None,
                   cluster: str = CONNECT_CLUSTER) -> Debezium:
    """Start a Kafka Connect worker (one-worker cluster ``cluster``) in the background.

    ``work_dir`` holds the worker's properties and the connector's settings
    (``connector.json``), which :func:`register` hands to the worker once its REST API
    answers; the worker keeps them, and the connector's offsets, in its Kafka topics, so
    starting again resumes from its offsets (and the connector's replication slot).
    ``overrides`` replace settings of ``config_path`` (a second source database's
    connector: its name, database, topic prefix, slot, publication and tables); one set
    to :data:`UNSET` is left out.
    ``rest_port`` None: a free one. The caller registers the connector and waits for
    health (``task_state`` and the replication slot); this returns as soon as the JVM runs.
    """
    java = java_binary()
    classpath = jvm.classpath("connect")
    connector = connector_config({"PG_HOST": "127.0.0.1", "PG_PORT": str(pg_port),
                                  "PG_USER": pg_user, "PG_PASSWORD": pg_password}, config_path)
    connector = apply_overrides(connector, overrides)
    if (work_dir / STANDALONE_OFFSETS_FILE).exists():
        raise ServiceError(
            f"{work_dir} holds a Kafka Connect standalone worker's offsets file from an older "
            f"txjoin (offsets now live in Kafka): `txjoin down --wipe` on the stack, then "
            f"`txjoin up`")
    work_dir.mkdir(parents=True, exist_ok=True)
    rest_port = rest_port or free_port()
    worker_file = work_dir / "worker.properties"
    worker_file.write_text(_properties_text(worker_properties(bootstrap_servers, rest_port,
                                                              cluster)))
    connector_file = work_dir / CONNECTOR_FILE
    connector_file.write_text(json.dumps(connector, indent=2) + "\n")
    connector_file.chmod(0o600)  # it holds the database password
    (work_dir / LOG4J2_PROPERTIES).write_text(LOG4J2)

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            [java, "-Xms256m", "-Xmx1g", "-XX:+UseG1GC", *jvm.stack_java_options(),
             f"-Dlog4j2.configurationFile={work_dir / LOG4J2_PROPERTIES}",
             "-cp", classpath, "org.apache.kafka.connect.cli.ConnectDistributed",
             str(worker_file)],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=work_dir,
            start_new_session=True,
        )
    return Debezium(ProcessId.of(popen.pid), rest_port, connector["name"],
                    connector["slot.name"])


# The connector's settings in a worker's work directory (JSON, as the REST API takes them).
CONNECTOR_FILE = "connector.json"


def register(rest: str, connector: str, work_dir: Path) -> bool:
    """Hand the connector's settings (``work_dir/connector.json``) to the worker at ``rest``
    unless it runs the connector with them already (a restarted worker reads them from its
    config topic; settings changed since are handed over, and the worker restarts the
    connector with them). True once the worker has them; False while it cannot take them
    yet (starting, joining its group, rebalancing): call again. Settings the worker refuses
    (HTTP 400: an invalid value, an unknown connector class) raise :class:`ConfigError`."""
    settings = work_dir / CONNECTOR_FILE
    body = settings.read_bytes()
    try:
        with urllib.request.urlopen(f"{rest}/connectors", timeout=5) as response:
            known = json.loads(response.read())
        if connector in known:
            with urllib.request.urlopen(f"{rest}/connectors/{connector}/config",
                                        timeout=5) as response:
                if json.loads(response.read()) == json.loads(body):
                    return True
        request = urllib.request.Request(
            f"{rest}/connectors/{connector}/config", method="PUT", data=body,
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30):
            return True
    except urllib.error.HTTPError as exc:
        if exc.code != 400:  # 404/409/503 while the worker starts, joins or rebalances
            return False
        raise ConfigError(
            f"Kafka Connect refused the connector settings ({CONNECTOR_PROPERTIES.name}, "
            f"rendered to {settings}): {refusal(exc.read())}; fix them and run `txjoin up` "
            f"again") from None
    except (OSError, ValueError, TypeError):  # refused, a timeout, half a body
        return False


def refusal(body: bytes) -> str:
    """The reason in a Connect REST error body, on one line: its validation errors (without
    the pointer to the validate endpoint), or its message without the exception class and
    the list of installed plugins."""
    try:
        message = str(json.loads(body).get("message") or "")
    except (ValueError, AttributeError):
        message = body.decode(errors="replace")
    message = message.removeprefix("org.apache.kafka.connect.errors.ConnectException: ")
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Connector configuration is invalid"):
        lines = [line for line in lines[1:] if not line.startswith("You can also find")]
    reason = "; ".join(lines).split(", available connectors are")[0]
    return reason or "no reason given"


def source_overrides(name: str, prefix: str, database: str,
                     tables: list[str]) -> dict[str, str]:
    """Connector settings for one source database of a multi-source job (a single-source
    stack runs config/debezium-postgres.properties as shipped).

    Its own slot and publication (both are per database; distinct names keep logs and
    ``pg_replication_slots`` legible) and its own topic prefix, hence its own
    ``<prefix>.transaction`` topic.
    """
    return {"name": f"txjoin-{prefix}", "database.dbname": database, "topic.prefix": prefix,
            "slot.name": slot_name(prefix), "publication.name": publication_name(prefix),
            "table.include.list": ",".join(tables)}


def slot_name(prefix: str) -> str:
    """The replication slot of the connector with topic prefix ``prefix``."""
    return f"txjoin_{prefix}"


def publication_name(prefix: str) -> str:
    """The publication of the connector with topic prefix ``prefix``."""
    return f"dbz_{prefix}"


def connector_status(rest: str, connector: str) -> dict[str, Any] | None:
    """``GET /connectors/<connector>/status`` of the worker at ``rest``, or None while the
    worker does not answer or does not know the connector yet."""
    try:
        with urllib.request.urlopen(f"{rest}/connectors/{connector}/status",
                                    timeout=5) as response:
            loaded = json.loads(response.read())
    except (OSError, ValueError):  # refused, 404 while starting, timeout, half a body
        return None
    return loaded if isinstance(loaded, dict) else None


def _task(rest: str, connector: str) -> dict[str, Any] | None:
    status = connector_status(rest, connector)
    tasks = status.get("tasks") if status else None
    if not tasks or not isinstance(tasks, list) or not isinstance(tasks[0], dict):
        return None
    return tasks[0]


def task_state(rest: str, connector: str) -> str:
    """RUNNING / FAILED / UNASSIGNED / ... of task 0, or STARTING before the worker reports."""
    task = _task(rest, connector)
    return "STARTING" if task is None else str(task.get("state", "UNKNOWN"))


def task_trace(rest: str, connector: str) -> str | None:
    """The failed task's stack trace, if the worker reports one."""
    task = _task(rest, connector)
    trace = task.get("trace") if task else None
    return str(trace) if trace else None


def restart_failed(rest: str, connector: str) -> None:
    """Ask the worker to restart the connector's failed instances (a no-op if none failed)."""
    request = urllib.request.Request(
        f"{rest}/connectors/{connector}/restart?includeTasks=true&onlyFailed=true",
        method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30):
            pass
    except OSError as exc:
        raise ServiceError(f"Kafka Connect at {rest} did not restart {connector}: {exc}") \
            from exc


def stop_debezium(process: ProcessId, timeout: float = 45.0) -> bool:
    """SIGTERM: Connect's shutdown hook stops the task and flushes its offsets."""
    return stop(process, timeout=timeout)


def render_json() -> str:
    """The connector settings as the Connect REST API takes them (PUT .../config)."""
    return json.dumps(connector_config(COMPOSE_VALUES), indent=2) + "\n"

