"""Background processes of the local stack: ports, identities, waiting and stopping.

A pid alone is not an identity: after a reboot or a long pause the number can belong to
someone else. Every process the stack starts is recorded with its kernel start time, and
only a live process with the same pid *and* start time is treated as ours, so `down`
never signals a stranger.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from txjoin.errors import ServiceError
from txjoin.procfs import STAT_START, STAT_STATE, stat_fields


@dataclass(frozen=True)
class ProcessId:
    """A process started by the stack: its pid and its start time in clock ticks since boot."""

    pid: int
    start_ticks: int

    @classmethod
    def of(cls, pid: int) -> ProcessId:
        """Identify the running process ``pid`` (raise ServiceError if it is gone)."""
        ticks = _start_ticks(pid)
        if ticks is None:
            raise ServiceError(f"process {pid} exited right after it was started")
        return cls(pid, ticks)

    def alive(self) -> bool:
        """True while this very process runs (zombies count as gone)."""
        return _start_ticks(self.pid) == self.start_ticks


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat, or None if the process is gone or a zombie."""
    fields = stat_fields(pid)
    if fields is None or fields[STAT_STATE] in ("Z", "X"):
        return None
    return int(fields[STAT_START])


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS = 16384
"""How many ports below the kernel's ephemeral range :func:`free_port` picks from."""


def free_port(exclude: Collection[int] = ()) -> int:
    """A TCP port on 127.0.0.1 that is free right now and not in ``exclude`` (the ports already
    picked for servers that do not listen yet: picks are independent, so without it two servers
    of one stack could be given the same port), picked *below* the kernel's ephemeral range
    (32768-60999 by default) where the kernel has one.

    A port is picked a while before its server listens on it (the local stack picks every
    port, then starts PostgreSQL, then the broker), and a port of the ephemeral range can be
    taken meanwhile by any outgoing connection on the machine (a Kafka or Spark client
    connecting anywhere): then the server cannot bind and exits (a broker did, in a test
    beside another worker's Spark runs). Outgoing connections never get a port below that
    range, so only another server could take it there."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    if low > 1024:
        picks = random.SystemRandom()
        first = max(1024, low - LISTEN_PORTS)
        for _ in range(100):
            port = picks.randrange(first, low)
            if port in exclude:
                continue
            with socket.socket() as sock:
                try:  # without SO_REUSEADDR: a port any socket holds, or held, is not taken
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in exclude:
            return port


class PortReservations:
    """Ports picked for servers that do not listen yet, each held by a socket bound to it
    with ``SO_REUSEADDR`` and never listening, until :meth:`release` (or the ``with`` block
    ends).

    While one is held, :func:`free_port` anywhere on the machine (a parallel test's stack,
    say) finds the port taken (it binds without ``SO_REUSEADDR``), so it cannot give it to
    another server in the seconds before ours binds it; our server still binds it, as
    PostgreSQL, the JVM's server sockets and Jetty all set ``SO_REUSEADDR`` and Linux lets
    such a socket bind beside others that do and do not listen."""

    def __init__(self, given: Collection[int] = ()) -> None:
        self.given = set(given)  # the user's ports: never picked, not held
        self.held: dict[int, socket.socket] = {}

    def pick(self) -> int:
        """A :func:`free_port` other than the given and held ones, held from now on."""
        while True:
            port = free_port(exclude=self.given | self.held.keys())
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # taken since free_port looked: pick another
                sock.close()
                continue
            self.held[port] = sock
            return port

    def release(self) -> None:
        for sock in self.held.values():
            sock.close()
        self.held.clear()

    def __enter__(self) -> PortReservations:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def ensure_port_free(port: int, what: str, wait: float = 0.0) -> None:
    """Raise ServiceError naming ``what`` if 127.0.0.1:``port`` is taken (still, after up to
    ``wait`` seconds: a recorded port a killed process just left can be held a moment)."""
    deadline = time.monotonic() + wait
    while True:
        with socket.socket() as sock:
            # As the JVM servers bind: connections of a process that just stopped (TIME_WAIT)
            # do not make the port busy, a listener does.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
                return
            except OSError as exc:
                if time.monotonic() < deadline:
                    time.sleep(0.25)
                    continue
                raise ServiceError(
                    f"port {port} on 127.0.0.1 is busy, so {what} cannot listen there: "
                    f"stop whatever uses it (`ss -ltnp 'sport = :{port}'`) or pick another "
                    "port") from exc


def listening(port: int) -> bool:
    """True if something accepts TCP connections on 127.0.0.1:``port``."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


def wait_until(check: Callable[[], bool], timeout: float, what: str,
               proc: ProcessId | None = None, log: str | None = None,
               interval: float = 0.1) -> None:
    """Poll ``check`` until it holds; fail fast if ``proc`` dies, else after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        hint = f"; see {log}" if log else ""
        if proc is not None and not proc.alive():
            raise ServiceError(f"{what}: the process (pid {proc.pid}) exited{hint}")
        if time.monotonic() > deadline:
            raise ServiceError(f"{what}: not ready after {timeout:.0f}s{hint}")
        time.sleep(interval)


def stop(proc: ProcessId, sig: signal.Signals = signal.SIGTERM, timeout: float = 30.0) -> bool:
    """Send ``sig`` to ``proc`` if it is still ours; SIGKILL after ``timeout`` s.

    Returns True if the process was running. Children of the stack are started in their
    own sessions, so we wait by polling /proc rather than with waitpid.
    """
    if not proc.alive():
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, sig)
    deadline = time.monotonic() + timeout
    while proc.alive():
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
        time.sleep(0.05)
        _reap(proc.pid)
    _reap(proc.pid)
    return True


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is our own child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


LOG4J2_PROPERTIES = "log4j2.properties"


def log4j2_config(quiet: dict[str, str]) -> str:
    """A log4j2 configuration for the stack's JVMs: INFO to the console (the component's log
    file), and WARN for the loggers of ``quiet`` (short name -> logger name)."""
    lines = ["status = warn", "appender.out.type = Console", "appender.out.name = out",
             "appender.out.layout.type = PatternLayout",
             "appender.out.layout.pattern = %d{ISO8601} %-5p [%t] %c{1} - %m%n",
             "rootLogger.level = INFO", "rootLogger.appenderRef.out.ref = out"]
    for short, logger in quiet.items():
        lines += [f"logger.{short}.name = {logger}", f"logger.{short}.level = WARN"]
    return "\n".join(lines) + "\n"
