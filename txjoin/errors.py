"""The one exception hierarchy of txjoin.

Every error a user can cause says what was wrong, where (topic/partition/offset,
file/line, table/column) and what to do about it. The CLI turns any
``TxjoinError`` into a clean message and an exit code instead of a traceback.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


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


def from_worker(exc: BaseException) -> TxjoinError | None:
    """A txjoin error raised inside a Spark Python worker, recovered from the JVM's message."""
    match = re.search(r"txjoin\.errors\.(\w+): (.+?)(?:\n\n|\n\tat |\nJVM stacktrace|$)",
                      str(exc), re.S)
    if match is None:
        return None
    cls = globals().get(match.group(1))
    if not (isinstance(cls, type) and issubclass(cls, TxjoinError)):
        cls = TxjoinError
    # Spark appends its SQLSTATE and a dump of the query after the Python message.
    message = re.split(r"\s+SQLSTATE:|\n=== Streaming Query ===", match.group(2))[0]
    err: TxjoinError = cls.__new__(cls)
    Exception.__init__(err, message.strip())
    return err


def cli_errors(fn: F) -> F:
    """Known errors (also from Spark workers) end with one red line and their exit code."""
    import click

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TxjoinError as exc:
            click.secho(f"error: {exc}", fg="red", err=True)
            sys.exit(exc.exit_code)
        except Exception as exc:
            recovered = from_worker(exc)
            if recovered is None:
                raise
            click.secho(f"error: {recovered}", fg="red", err=True)
            sys.exit(recovered.exit_code)

    return wrapper  # type: ignore[return-value]


class LineageError(TxjoinError):
    """A sink whose contents come from another checkpoint than the run's (or from none)."""

    exit_code = 2


class CheckpointError(TxjoinError):
    """A checkpoint whose source offsets no longer match the topics (recreated, truncated)."""

    exit_code = 2


class SinkSchemaError(TxjoinError):
    """A sink table altered underneath the job (a column dropped or its type changed)."""

    exit_code = 2
