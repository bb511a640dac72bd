"""An open transaction's events on disk: what keeps a large transaction out of memory.

A transaction is applied whole, so its events wait until its END's counts are met. Most
transactions hold a handful of events and keep them in a list. One that grows past
:data:`SPILL_EVENTS` moves them into an :class:`EventLog`: the events of each table in
chunks of at most :data:`SPILL_EVENTS`, pickled, LZ4-compressed and appended to a file of
its own on the worker's local disk (unlinked at once: the operating system reclaims it
when the log is closed or its process ends), with only the last chunk's events in memory.
So an open transaction costs its worker memory for its identities and counts
(``PendingTransaction``), not its rows.

The file is a cache, like the shard's engine it belongs to: what a shard's checkpoint
keeps of a transaction is in its state log (``join/state_log.py``: each batch's segment
carries the events the batch added), and a log pickled into a snapshot of the engine
carries its chunks' bytes, which a restore writes to a new file.

The log hands its events back in table order (tables by name, each table's events in the
order they were added), the order :meth:`Assembler.take <txjoin.sequence.assembly.
Assembler.take>` applies a transaction in, one chunk in memory at a time
(:meth:`EventLog.drain`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

from txjoin.errors import ConfigError
from txjoin.ingest.debezium import ChangeEvent
from txjoin.join.state import pack, unpack

SPILL_ENV = "TXJOIN_SPILL_EVENTS"


def _spill_events() -> int:
    text = os.environ.get(SPILL_ENV, "4096")
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{SPILL_ENV}={text!r} is not a positive integer (events of an "
                          f"open transaction kept in memory); unset it for the default 4096")
    return int(text)


SPILL_EVENTS = _spill_events()
"""Events of one open transaction kept in memory (``TXJOIN_SPILL_EVENTS``, default 4,096):
a transaction with more spills them, a chunk of at most this many events per table at a
time (~0.3-1 MB of events in memory, ~100 kB on disk for the pizzeria's rows)."""

def spill_dir() -> str | None:
    """Where spill files go: the first of Spark's local directories of this worker
    (``SPARK_LOCAL_DIRS``, set by a cluster's worker for its executors), else the system's
    temporary directory (None: :mod:`tempfile`'s choice, ``TMPDIR`` first)."""
    local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0].strip()
    return local or None


class EventLog:
    """Events of one open transaction, each table's in chunks on disk (module docstring).

    Appending keeps a tail per table in memory; when the tails hold :data:`SPILL_EVENTS`
    events together, each table's tail is written as one chunk. :meth:`drain` reads them
    back once, in table order, and closes the file; :meth:`__reduce__` carries the chunks'
    bytes (a snapshot of the engine, a copy)."""

    __slots__ = ("_chunks", "_count", "_end", "_fd", "_latest_ts", "_tail_count", "_tails")

    def __init__(self, events: Iterable[ChangeEvent] = ()) -> None:
        self._chunks: list[tuple[str, int, int]] = []  # (table, offset, length) in the file
        self._tails: dict[str, list[ChangeEvent]] = {}
        self._count = self._tail_count = self._end = 0
        # the latest commit time among its events (0 for one without), None while empty
        self._latest_ts: int | None = None
        self._fd: int | None = None
        self.extend(events)

    def __len__(self) -> int:
        return self._count

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        """Let the file go (its space returns to the disk); the log is empty after."""
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            os.close(fd)

    def append(self, event: ChangeEvent) -> None:
        tail = self._tails.get(event.table)
        if tail is None:
            tail = self._tails[event.table] = []
        tail.append(event)
        self._count += 1
        self._tail_count += 1
        ts = event.commit_ts_ms or 0
        if self._latest_ts is None or ts > self._latest_ts:
            self._latest_ts = ts
        if self._tail_count >= SPILL_EVENTS:
            self._spill()

    def extend(self, events: Iterable[ChangeEvent]) -> None:
        for event in events:
            self.append(event)

    def _spill(self) -> None:
        """Write every table's tail as a chunk (tables by name: the file's order is the
        events' order, so a replay of the same appends writes the same file)."""
        for table in sorted(self._tails):
            self._write(table, pack(self._tails[table]))
        self._tails = {}
        self._tail_count = 0

    def _write(self, table: str, blob: bytes) -> None:
        if self._fd is None:
            # O_TMPFILE where the file system has it, else a named file unlinked at once
            handle, path = tempfile.mkstemp(prefix="txjoin-spill-", dir=spill_dir())
            os.unlink(path)
            self._fd = handle
        written = os.pwrite(self._fd, blob, self._end)
        while written < len(blob):
            written += os.pwrite(self._fd, blob[written:], self._end + written)
        self._chunks.append((table, self._end, len(blob)))
        self._end += len(blob)

    def _read(self, offset: int, length: int) -> bytes:
        assert self._fd is not None
        blob = os.pread(self._fd, length, offset)
        while len(blob) < length:  # a short read: the rest
            more = os.pread(self._fd, length - len(blob), offset + len(blob))
            if not more:
                raise OSError(f"txjoin's spill file ended early ({len(blob)} of {length} "
                              f"bytes at {offset}): the worker's local disk lost it")
            blob += more
        return blob

    def _blobs(self) -> list[tuple[str, bytes]]:
        return [(table, self._read(offset, length)) for table, offset, length in self._chunks]

    def _in_order(self, chunks: list[tuple[str, int, int]],
                  tails: dict[str, list[ChangeEvent]]) -> Iterator[list[ChangeEvent]]:
        """``chunks`` (read from the file) and ``tails`` as lists of events, in table order
        (module docstring)."""
        for table in sorted({t for t, _, _ in chunks} | set(tails)):
            for t, offset, length in chunks:
                if t == table:
                    yield unpack(self._read(offset, length))
            yield tails.get(table, [])

    def __iter__(self) -> Iterator[ChangeEvent]:
        """The events in table order, the log unchanged."""
        for events in self._in_order(self._chunks, self._tails):
            yield from events

    def drain(self) -> Iterator[ChangeEvent]:
        """The events in table order, each let go once handed out; the file is closed at
        the end (the log is empty after)."""
        chunks, tails = self._chunks, self._tails
        self._chunks, self._tails, self._count, self._tail_count = [], {}, 0, 0
        self._latest_ts = None
        try:
            for events in self._in_order(chunks, tails):
                yield from drain(events)
        finally:
            self.close()
            self._end = 0

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _restored, (self._blobs(), self._tails, self._count, self._latest_ts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EventLog):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"EventLog({self._count} events, {len(self._chunks)} chunks on disk)"


def _restored(blobs: list[tuple[str, bytes]], tails: dict[str, list[ChangeEvent]],
              count: int, latest_ts: int | None) -> EventLog:
    """An :class:`EventLog` from what :meth:`EventLog.__reduce__` carried (chunks written to
    a new file of this process)."""
    log = EventLog()
    for table, blob in blobs:
        log._write(table, blob)
    log._tails = {table: list(events) for table, events in tails.items()}
    log._tail_count = sum(len(events) for events in log._tails.values())
    log._count = count
    log._latest_ts = latest_ts
    return log



def in_table_order(events: list[ChangeEvent] | EventLog) -> list[ChangeEvent] | EventLog:
    """A transaction's events as it is applied: tables by name, each table's events in the
    order they were added (a list is sorted; a log already hands them out so)."""
    if isinstance(events, EventLog):
        return events
    return sorted(events, key=lambda e: e.table)


def latest_commit_ts(events: list[ChangeEvent] | EventLog) -> int | None:
    """The latest commit time among ``events`` (0 for an event without one; None: no
    events), of a log without reading it back."""
    if isinstance(events, EventLog):
        return events._latest_ts
    return max((e.commit_ts_ms or 0 for e in events), default=None)


def drain(events: list[ChangeEvent] | EventLog) -> Iterator[ChangeEvent]:
    """Hand out a taken transaction's events once each, letting each go as it is handed
    out (a list is emptied; a log, :meth:`EventLog.drain`)."""
    if isinstance(events, EventLog):
        yield from events.drain()
        return
    events.reverse()
    while events:
        yield events.pop()
