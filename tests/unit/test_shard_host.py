"""A shard's host answers the task first and collects after (``txjoin/join/spark/host.py``).

The collection that ends a shard's batch (``shard.long_lived_state``) walks what the
batch allocated; in a host it runs once the task has the batch's output, between two
batches, so it is not on the task's path. These tests run the host's side of one
connection in a thread, with the task's side (``host.serve_batch``) over a socket pair
and an in-memory state store.
"""

from __future__ import annotations

import gc
import pickle
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from txjoin.job import load_job
from txjoin.join import shard as shard_mod
from txjoin.join.spark import host
from txjoin.join.spark.routing import ROUTED_COLUMNS
from txjoin.join.spark.shards import ShardProcessor
from txjoin.join.state_log import MemoryStore
from txjoin.sequence.assembly import IncompletePolicy

ORDERS = Path(__file__).resolve().parents[2] / "jobs" / "orders.py"


def _request() -> tuple[bytes, int, pa.Table, float, None, None, None]:
    """What a task sends for a batch that read nothing (shard 0 of 2), no sink's stage
    given (its output comes back whole)."""
    processor = ShardProcessor(load_job(ORDERS), [0, 1], IncompletePolicy("fail", 300.0),
                               "shop", "test-token")
    frame = pd.DataFrame({c: pd.Series([], dtype=object) for c in ROUTED_COLUMNS
                          if c != "shard"})
    frame["offset"] = frame["offset"].astype("int64")
    frame["counted"] = frame["counted"].astype(bool)
    return processor.spec(), 0, pa.Table.from_pandas(frame, preserve_index=False), \
        time.perf_counter(), None, None, None


@pytest.fixture
def connection() -> Iterator[tuple[socket.socket, socket.socket]]:
    task, served = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield task, served
    task.close()
    served.close()
    gc.enable()  # whatever a failed test left


def test_the_host_replies_before_it_collects(
        connection: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    task, served = connection
    replied = threading.Event()
    seen: list[bool] = []
    settle = shard_mod.settle_state

    def settle_after_reply() -> None:
        # the batch's collector is still off here: the reply must not wait for this
        seen.append(not gc.isenabled())
        seen.append(replied.wait(10))
        settle()

    monkeypatch.setattr(shard_mod, "settle_state", settle_after_reply)
    thread = threading.Thread(target=host._serve, args=(served,), daemon=True)
    thread.start()
    out = list(host.serve_batch(task, _request(), MemoryStore()))
    replied.set()
    thread.join(10)
    assert not thread.is_alive()
    assert len(out) == 1 and list(out[0]["shard"]) == [0]  # the shard's (empty) output
    assert seen == [True, True]  # collected with the collector off, after the reply
    assert gc.isenabled()


def test_a_failed_batch_is_reported_and_the_collector_is_back_on(
        connection: tuple[socket.socket, socket.socket]) -> None:
    task, served = connection
    _spec, shard, frame, started, batch, spans, sinks = _request()
    thread = threading.Thread(target=host._serve, args=(served,), daemon=True)
    thread.start()
    with pytest.raises(pickle.UnpicklingError, match="invalid load key"):  # raised in the task
        list(host.serve_batch(task, (b"not a pickle", shard, frame, started, batch, spans,
                                                    sinks),
                              MemoryStore()))
    thread.join(10)
    assert not thread.is_alive()
    assert gc.isenabled()


def test_the_output_comes_row_by_row_as_the_host_sends_it(
        connection: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard's output of several rows (each of at most ``OUTPUT_CHUNK_ROWS`` changes)
    goes one row a message, and the task has each row before the host sends the next:
    neither side holds a large release's output as one message."""
    task, served = connection
    rows = {"shard": [0, 0, 0], "changes": [b"a", b"bb", b"ccc"]}
    sent_after: list[int] = []
    taken = threading.Semaphore(0)
    from txjoin.join.spark import shards

    monkeypatch.setattr(shards, "run_batch", lambda request, store, settle=True: [rows])
    send = host.send

    def paced(conn: socket.socket, obj: object) -> None:
        send(conn, obj)
        if isinstance(obj, tuple) and obj[0] == "part":
            sent_after.append(int(taken.acquire(timeout=10)))  # the task took this row

    monkeypatch.setattr(host, "send", paced)
    thread = threading.Thread(target=host._serve, args=(served,), daemon=True)
    thread.start()
    out = []
    for row in host.serve_batch(task, _request(), MemoryStore()):
        out.append(row)
        taken.release()
    thread.join(10)
    assert not thread.is_alive()
    assert out == [{"shard": [0], "changes": [b"a"]}, {"shard": [0], "changes": [b"bb"]},
                   {"shard": [0], "changes": [b"ccc"]}]
    assert sent_after == [1, 1, 1]
