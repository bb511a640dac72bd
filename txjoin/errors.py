"""The one exception hierarchy of txjoin.

Every error a user can cause says what was wrong, where (topic/partition/offset,
file/line, table/column) and what to do about it. The CLI turns any
``TxjoinError`` into a clean message and an exit code instead of a traceback.
"""

from __future__ import annotations


class TxjoinError(Exception):
    """Base class of every error txjoin raises on purpose."""

    exit_code = 1


class ConfigError(TxjoinError):
    """Wrong options, environment variables or config file."""

    exit_code = 2


class JobError(TxjoinError):
    """A job file that cannot be loaded or fails validation."""

    exit_code = 2


class DecodeError(TxjoinError):
    """A source record that is not a well-formed Debezium event."""

    def __init__(self, message: str, *, topic: str | None = None,
                 partition: int | None = None, offset: int | None = None) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset
        where = f"{topic}[{partition}]@{offset}" if topic is not None else "unknown position"
        super().__init__(f"malformed record at {where}: {message}")


class SchemaChangeError(DecodeError):
    """A record whose columns no longer match the job's declared table."""


class IncompleteTransactionError(TxjoinError):
    """A transaction that did not complete within the configured policy."""


class OrderingError(TxjoinError):
    """Input that breaks the ordering facts txjoin relies on (e.g. a late snapshot row)."""


class ServiceError(TxjoinError):
    """An external service (broker, PostgreSQL, Debezium) that is unreachable or unhealthy."""


class ScenarioError(TxjoinError):
    """An invalid scenario file (exit code 2 of `txjoin replay`)."""

    exit_code = 2
