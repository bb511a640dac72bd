"""A shard's engine in a process of its own: one copy of each shard per executor.

Spark runs a shard's task in whichever of the executor's Python workers is idle, so
an engine cached in the worker ends up cached in every worker: at a 1M-order snapshot
on ``local[2]`` each of the two workers held both shards (8.9 GB together for what
is 3.6 GB once). So the task does not run the shard's engine itself: it hands the
batch to the shard's *host*, a long-lived process per executor and shard number that
keeps the engine between batches, and yields what the host returns. A host keeps
the engines of that shard number of the queries it served (keyed by query, as the
workers did, so a restarted query restores its shards from the log); an engine
unused for ``IDLE_S`` is dropped.

The task keeps the state store. The host reads and writes the shard's log
(``state_log.ShardLog``) through the task: each store call travels back over the
connection and the task makes it on Spark's state store, so what is durable, and
when, is exactly what it was. The host holds a cache only, validated against the
log's version and token like any cached engine: a host that missed a batch (the
task failed, or ran elsewhere) restores or advances the shard from the log.

Lifecycle. The first task of a shard on an executor starts its host; a host exits
when the process that watches over the executor's Python workers (the worker's
parent: PySpark's daemon) is gone, after ``IDLE_S`` seconds without a batch (as
Spark retires an idle Python worker, and its cache with it), or when its socket is
taken by another. The socket is in Linux's abstract namespace (no file to clean up
after a kill -9); the host serves only its own user (``SO_PEERCRED``), as the
protocol is pickle. Elsewhere than Linux the task runs the engine itself
(:func:`available`).

Run by the task as ``python -m txjoin.join.spark.host NAME WATCH_PID``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

IDLE_S = 60.0
"""A host with no batch for this long exits (its shard is restored from the log when it
runs again), as Spark's PythonWorkerFactory retires a worker idle for a minute."""

START_S = 60.0
"""How long a task waits for the host it started to listen."""

_LENGTH = struct.Struct("!Q")


def available() -> bool:
    """Whether shards run in hosts here (abstract Unix sockets: Linux)."""
    return sys.platform.startswith("linux") and os.environ.get("TXJOIN_SHARD_HOSTS") != "0"


def host_name(shard: int, watch_pid: int) -> str:
    """The abstract socket name of the host of shard number ``shard`` on this executor."""
    return f"\0txjoin-shard-{os.getuid()}-{watch_pid}-{shard}"


def send(conn: socket.socket, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) < 1 << 16:
        conn.sendall(_LENGTH.pack(len(data)) + data)
    else:
        conn.sendall(_LENGTH.pack(len(data)))
        conn.sendall(data)


def recv(conn: socket.socket) -> Any:
    (size,) = _LENGTH.unpack(_read(conn, _LENGTH.size))
    return pickle.loads(_read(conn, size))


def _read(conn: socket.socket, size: int) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = conn.recv_into(view[got:], size - got)
        if n == 0:
            raise ConnectionError("the shard's host closed the connection")
        got += n
    return buf


# -- the task's side -----------------------------------------------------------------


def connect(shard: int) -> socket.socket:
    """A connection to the host of shard number ``shard`` on this executor, starting the
    host if needed."""
    watch = os.getppid()
    name = host_name(shard, watch)
    try:
        return _connect(name)
    except OSError:
        pass
    # The worker's import path, so the host imports txjoin as the worker does.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    subprocess.Popen([sys.executable, "-m", __name__, name[1:], str(watch)],
                     stdin=subprocess.DEVNULL, close_fds=True, env=env)
    deadline = time.monotonic() + START_S
    while True:
        try:
            return _connect(name)
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"shard {shard}'s host did not start within {START_S:.0f} s "
                                   f"(see the Spark log); set TXJOIN_SHARD_HOSTS=0 to run "
                                   f"shards inside Spark's Python workers") from None
            time.sleep(0.02)


def _connect(name: str) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(name)
    except OSError:
        conn.close()
        raise
    return conn


def serve_batch(conn: socket.socket, request: Any, store: Any) -> Iterator[Any]:
    """Send a batch to the host, make its store calls on ``store``, yield its output."""
    send(conn, request)
    while True:
        msg = recv(conn)
        op = msg[0]
        if op == "get_meta":
            send(conn, store.get_meta())
        elif op == "get":
            send(conn, store.get(*msg[1:]))
        elif op == "put_meta":
            store.put_meta(msg[1])
        elif op == "put":
            store.put(*msg[1:])
        elif op == "clear":
            store.clear()
        elif op == "part":
            yield msg[1]
        elif op == "done":
            yield from msg[1]
            return
        elif op == "error":
            raise _rebuilt(*msg[1:])
        else:
            raise RuntimeError(f"unexpected message from a shard's host: {op!r}")


def _rebuilt(module: str, name: str, args: tuple[Any, ...], attrs: dict[str, Any]
             ) -> BaseException:
    """The host's exception, as it was: its class, arguments and attributes (not made again
    by its constructor, which may format its arguments: txjoin.errors.DecodeError)."""
    try:
        cls: Any = importlib.import_module(module)
    except ImportError:
        cls = None
    for part in name.split("."):
        cls = getattr(cls, part, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return RuntimeError(f"{module}.{name}: {' '.join(map(str, args))}")
    err = cls.__new__(cls)
    err.args = args
    vars(err).update(attrs)
    return err


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


# -- the host's side -----------------------------------------------------------------


class RemoteStore:
    """``state_log.BlobStore`` whose calls the task makes on Spark's state store."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.written = 0

    def get_meta(self) -> dict[str, Any] | None:
        send(self.conn, ("get_meta",))
        meta: dict[str, Any] | None = recv(self.conn)
        return meta

    def put_meta(self, meta: dict[str, Any]) -> None:
        send(self.conn, ("put_meta", meta))

    def get(self, kind: int, version: int, chunk: int) -> bytes | None:
        send(self.conn, ("get", kind, version, chunk))
        blob: bytes | None = recv(self.conn)
        return blob

    def put(self, kind: int, version: int, chunk: int, blob: bytes) -> None:
        self.written += len(blob)
        send(self.conn, ("put", kind, version, chunk, blob))

    def clear(self) -> None:
        send(self.conn, ("clear",))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _rows(columns: dict[str, list[Any]]) -> Iterator[dict[str, list[Any]]]:
    """The rows of an output frame given by column, each as a frame of one row."""
    count = len(next(iter(columns.values()), []))
    for i in range(count):
        yield {name: values[i:i + 1] for name, values in columns.items()}


def _serve(conn: socket.socket) -> None:
    from txjoin.join.shard import settle_state
    from txjoin.join.spark.shards import run_batch

    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.getuid():
        return
    request = recv(conn)
    store = RemoteStore(conn)
    try:
        try:
            out = run_batch(request, store, settle=False)
        except Exception as exc:  # the task raises it, as if it had run the batch itself
            args = tuple(a if _picklable(a) else str(a) for a in exc.args)
            attrs = {k: v for k, v in vars(exc).items() if _picklable(v)}
            send(conn, ("error", type(exc).__module__, type(exc).__qualname__, args, attrs))
            return
        # Row by row (a row holds at most OUTPUT_CHUNK_ROWS changes): neither side holds the
        # batch's whole output as one message (a release of a 2M-change transaction is
        # ~1M changes a shard), and the task passes each row on to Spark as it comes.
        for columns in out:
            for row in _rows(columns):
                send(conn, ("part", row))
        del out
        send(conn, ("done", []))
    finally:
        # The collection after a batch (shard.long_lived_state), once the task has its
        # output: between two batches, while Spark and the sinks finish this one.
        settle_state()


def main(name: str, watch_pid: int) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind("\0" + name)
    except OSError:
        return  # another task started this shard's host first
    server.listen(4)
    server.settimeout(1.0)
    last = time.monotonic()
    while _alive(watch_pid) and time.monotonic() - last < IDLE_S:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        # A task that dies mid-batch is re-run by Spark; the log tells what is valid.
        with conn, contextlib.suppress(ConnectionError, OSError):
            _serve(conn)
        last = time.monotonic()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
