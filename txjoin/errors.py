"""The one exception hierarchy of txjoin, and how the CLI reports errors.

Every error a user can cause says what was wrong, where (topic/partition/offset,
file/line, table/column) and what to do about it. The CLI turns any
``TxjoinError``, and the errors of the services and libraries below it that a
user can cause (an unreachable database, a missing file, a failed Spark query),
into one line and an exit code instead of a traceback; ``txjoin --verbose``
prints the traceback too.

Exit codes, the same for every command: 0 ok, 1 a check or verification
failed, 2 a usage, configuration or data error (``TxjoinError.exit_code``).
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

VERBOSE_ENV = "TXJOIN_VERBOSE"
"""Set to ``1`` by ``txjoin --verbose``; read by the error reporting and the Spark session."""
SPARK_LOG_ENV = "TXJOIN_SPARK_LOG"
"""The file Spark's output goes to when not verbose (``txjoin.pipeline.session``)."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to a mistyped ``name``; empty
    when none is close."""
    found = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {found[0]!r}?)" if found else ""


def verbose() -> bool:
    """Whether the user asked for tracebacks and the libraries' own logs."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


class TxjoinError(Exception):
    """Base class of every error txjoin raises on purpose (exit code 2: usage, config, data)."""

    exit_code = 2


class ConfigError(TxjoinError):
    """Wrong options, environment variables or config file."""


class JobError(TxjoinError):
    """A job file that cannot be loaded or fails validation."""


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


class TransactionTooLargeError(TxjoinError):
    """A transaction whose buffered events exceed ``--max-transaction-bytes``."""


class OrderingError(TxjoinError):
    """Input that breaks the ordering facts txjoin relies on (e.g. a late snapshot row)."""


class ExpressionValueError(TxjoinError):
    """A job expression whose value on some row PostgreSQL would refuse (``integer out of
    range``, ``numeric field overflow``, text that is not a number): the batch is not written."""


class ServiceError(TxjoinError):
    """An external service (broker, PostgreSQL, Debezium) that is unreachable or unhealthy."""


class ScenarioError(TxjoinError):
    """An invalid scenario file (exit code 2 of `txjoin replay`)."""


class SparkError(TxjoinError):
    """A Spark failure that carries no txjoin error (bad ``--spark-conf``, master, ...)."""


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


def user_error(exc: BaseException) -> TxjoinError | None:
    """``exc`` as the one-line error a user can act on, or ``None`` for a bug (traceback).

    Covers txjoin's own errors, those raised in Spark's Python workers (they reach
    the driver inside Java exceptions), an unreachable PostgreSQL, a missing or
    unreadable file or refused connection, and any other failed Spark call.
    """
    if isinstance(exc, TxjoinError):
        return exc
    recovered = from_worker(exc)
    if recovered is not None:
        return recovered
    kind = f"{type(exc).__module__}.{type(exc).__name__}"
    first = _first_line(str(exc))
    if kind.startswith("psycopg2.") and type(exc).__name__ == "OperationalError":
        return ServiceError(f"PostgreSQL: {first}")
    if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError
                  | NotADirectoryError | ConnectionError):
        return ConfigError(first)
    if kind.startswith(("pyspark.", "py4j.")):
        return SparkError(f"Spark: {_java_cause(str(exc))}")
    return None


def _java_cause(text: str) -> str:
    """The first line of what the JVM said: py4j's message is ``An error occurred while
    calling o213.save.`` then ``\n: <Java exception class>: <its message>`` (a Delta write's
    constraint violation, say), and its first line alone names no cause."""
    _, sep, java = text.partition("\n: ")
    if not sep:
        return _first_line(text)
    line = _first_line(java)
    cls, sep, message = line.partition(": ")
    return message if sep and "." in cls and " " not in cls else line


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else "(no message)"


def report(exc: BaseException) -> int | None:
    """Print ``exc`` as one red line (with the traceback under ``--verbose``); its exit code.

    ``None`` when ``exc`` is not an error a user can cause: let it propagate.
    """
    import click

    err = user_error(exc)
    if err is None:
        return None
    if verbose():
        traceback.print_exception(exc)
    message = str(err)
    if isinstance(err, SparkError) and not verbose():
        log = os.environ.get(SPARK_LOG_ENV)
        message += f" (Spark's log: {log}; " if log else " ("
        message += "txjoin --verbose shows the stack trace)"
    click.secho(f"error: {message}", fg="red", err=True)
    return err.exit_code


def cli_errors(fn: F) -> F:
    """Known errors (also from Spark workers) end with one red line and their exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            code = report(exc)
            if code is None:
                raise
            sys.exit(code)

    return wrapper  # type: ignore[return-value]


class LineageError(TxjoinError):
    """A sink whose contents come from another checkpoint than the run's (or from none)."""

    exit_code = 2


class CheckpointError(TxjoinError):
    """A checkpoint whose source offsets no longer match the topics (recreated, truncated)."""

    exit_code = 2


RECOVER = ("start a new checkpoint and re-derive the sinks from the topics with "
           "`txjoin run --rebuild`")
"""The way out of a checkpoint txjoin cannot continue, for the end of its one-line error."""


class SinkSchemaError(TxjoinError):
    """A sink table altered underneath the job (a column dropped or its type changed)."""

    exit_code = 2
