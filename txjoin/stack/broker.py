"""The local broker: Apache Kafka 4.3 in KRaft mode, one node that is broker and controller.

The jars come from ``.jars/kafka/`` (``scripts/jars.sh``, pinned by ``jvm/kafka/pom.xml``).
Everything of one broker lives in its data directory: ``server.properties``,
``log4j2.properties`` and the logs themselves (``log.dirs`` is the directory; Kafka only
reads the subdirectories as partitions). The directory is formatted once (``StorageTool
format --standalone``); starting again on the same directory and ports, after a stop or
a ``kill -9``, keeps every topic and offset.

Topics are created here (``create_topics``), not auto-created: the transaction topic must
have exactly one partition, table topics as many as ``txjoin up --partitions`` says.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from txjoin import jvm
from txjoin.errors import ServiceError
from txjoin.stack.processes import (
    LOG4J2_PROPERTIES,
    PortReservations,
    ProcessId,
    listening,
    log4j2_config,
    stop,
    wait_until,
)

SERVER_PROPERTIES = "server.properties"
CLUSTER_ID_FILE = "cluster.id"

# Config dumps (hundreds of lines per client), per-partition load and request chatter.
LOG4J2 = log4j2_config({"config": "org.apache.kafka.common.config",
                        "clients": "org.apache.kafka.clients",
                        "state": "state.change.logger",
                        "log": "org.apache.kafka.storage.internals.log",
                        "partition": "kafka.cluster.Partition"})


def java_binary() -> str:
    """The ``java`` on PATH (ServiceError saying what to install if there is none)."""
    java = shutil.which("java")
    if java is None:
        raise ServiceError("java not found on PATH: Kafka and Debezium need a Java 17+ runtime "
                           "(e.g. apt-get install openjdk-17-jre-headless)")
    return java


@dataclass(frozen=True)
class Broker:
    """A started broker: its process and its two ports (clients, KRaft controller)."""

    process: ProcessId
    port: int
    controller_port: int
    data_dir: Path

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"


def server_properties(data_dir: Path, port: int, controller_port: int) -> dict[str, str]:
    """The settings of a single-node KRaft broker on 127.0.0.1 that keeps its data in
    ``data_dir``."""
    return {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        # One node: every internal topic has one replica.
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "num.partitions": "1",
        "group.initial.rebalance.delay.ms": "0",
        # Debezium's topics are created by the stack with the partitions txjoin needs; a
        # typo'd topic name should fail loudly, not appear with one partition.
        "auto.create.topics.enable": "false",
    }


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (as
    ``kafka-storage random-uuid``; like Kafka, never starting with '-')."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _format(java: str, data_dir: Path, log_path: Path) -> None:
    """Format ``data_dir`` once; an already formatted directory keeps its data."""
    id_file = data_dir / CLUSTER_ID_FILE
    if not id_file.exists():
        id_file.write_text(_cluster_id() + "\n")
    with open(log_path, "ab") as log:
        done = subprocess.run(
            [java, "-Xmx256m", *jvm.stack_java_options(),
             f"-Dlog4j2.configurationFile={data_dir / LOG4J2_PROPERTIES}",
             "-cp", jvm.classpath("kafka"), "kafka.tools.StorageTool", "format",
             "--standalone", "--ignore-formatted", "-t", id_file.read_text().strip(),
             "-c", str(data_dir / SERVER_PROPERTIES)],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, check=False, timeout=120,
        )
    if done.returncode != 0:
        raise ServiceError(f"kafka-storage format of {data_dir} failed (exit "
                           f"{done.returncode}); see {log_path}")


def start_broker(data_dir: Path, port: int | None, log_path: Path, *,
                 controller_port: int | None = None, timeout: float = 90.0,
                 heap: str = "512m") -> Broker:
    """Start a Kafka broker on 127.0.0.1:``port`` with its data in ``data_dir``; wait until
    it accepts clients.

    Usable on its own, e.g. a throwaway broker for a benchmark or a test::

        broker = start_broker(work / "kafka", None, work / "broker.log")
        create_topics(broker.bootstrap_servers, ["t"], partitions=1)
        ...
        stop_broker(broker.process)       # then remove work / "kafka"

    ``port``/``controller_port`` None: a free one. ``data_dir`` is created and formatted
    if new; a directory used before is started again with its topics and offsets (give
    the same ports then: the controller's address is part of its metadata). The JVM's
    log (stdout and stderr) is appended to ``log_path``. The process runs in its own
    session, so a Ctrl-C in the caller's shell does not reach it; stop it with
    ``stop_broker``. Start takes ~2 s on a new directory, ~12 s after a ``kill -9`` (the
    controller waits out the dead incarnation's session).
    """
    java = java_binary()
    classpath = jvm.classpath("kafka")  # ConfigError naming setup.sh if the jars are missing
    # The ports it picks are held until it listens (processes.PortReservations).
    with PortReservations([p for p in (port, controller_port) if p]) as ports:
        port = port or ports.pick()
        controller_port = controller_port or ports.pick()
        data_dir = data_dir.resolve()
        data_dir.mkdir(parents=True, exist_ok=True)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        props = server_properties(data_dir, port, controller_port)
        (data_dir / SERVER_PROPERTIES).write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (data_dir / LOG4J2_PROPERTIES).write_text(LOG4J2)
        _format(java, data_dir, log_path)
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                [java, f"-Xmx{heap}", f"-Xms{heap}", "-XX:+UseG1GC", *jvm.stack_java_options(),
                 f"-Dlog4j2.configurationFile={data_dir / LOG4J2_PROPERTIES}",
                 "-cp", classpath, "kafka.Kafka", str(data_dir / SERVER_PROPERTIES)],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=data_dir,
                # Own session: a Ctrl-C in the shell that ran `txjoin up` must not kill it.
                start_new_session=True,
            )
        broker = Broker(ProcessId.of(popen.pid), port, controller_port, data_dir)
        # The client listener opens once the broker registered with its controller.
        wait_until(lambda: listening(port), timeout, f"Kafka broker on 127.0.0.1:{port}",
                   broker.process, str(log_path))
    return broker


def create_topics(bootstrap_servers: str, names: list[str], timeout: float = 30.0,
                  partitions: int = 1) -> None:
    """Create ``names`` with ``partitions`` partitions each (transaction topics: always 1);
    topics that already exist must have as many."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    if not names:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1) for name in names],
        operation_timeout=timeout, request_timeout=timeout,
    )
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc.args[0]):
                raise ServiceError(f"cannot create topic {name} on {bootstrap_servers}: {exc}") \
                    from exc
    # A created topic reaches the broker's metadata a moment after the controller
    # committed it (longer on a busy machine): wait for every name before judging.
    deadline = time.monotonic() + timeout
    while True:
        metadata = admin.list_topics(timeout=timeout)
        if all(name in metadata.topics for name in names) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for name in names:
        topic = metadata.topics.get(name)
        if topic is None or len(topic.partitions) != partitions:
            found = "missing" if topic is None else f"{len(topic.partitions)} partitions"
            raise ServiceError(
                f"topic {name} on {bootstrap_servers} must have exactly {partitions} "
                f"partition(s) ({found}); recreate it (`txjoin down --wipe`, then `txjoin up`)"
            )


def stop_broker(process: ProcessId, timeout: float = 30.0) -> bool:
    """Stop the broker (SIGTERM: a controlled shutdown; its data stays in its directory)."""
    return stop(process, timeout=timeout)
