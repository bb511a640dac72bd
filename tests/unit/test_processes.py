"""The local stack's process helpers: ports picked where no outgoing connection can take them,
and a process known by its pid and start time (``txjoin/stack/processes.py``,
``txjoin/procfs.py``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from txjoin.procfs import STAT_PPID, STAT_STATE, cpu_seconds, read_stat, stat_fields
from txjoin.stack import processes
from txjoin.stack.processes import ProcessId, free_port


def test_a_free_port_is_below_the_ephemeral_range_and_free() -> None:
    low = int(processes.EPHEMERAL_RANGE.read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(max(1024, low - processes.LISTEN_PORTS) <= p < low for p in ports), ports
    assert len(ports) > 1  # picked at random, not one port for every caller
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.pop()))


def test_a_port_a_socket_holds_is_not_picked(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        # a range below the ephemeral one that holds that port alone: the kernel's pick then
        monkeypatch.setattr(processes, "LISTEN_PORTS", 1)
        monkeypatch.setattr(processes, "EPHEMERAL_RANGE", tmp_path / "range")
        (tmp_path / "range").write_text(f"{port + 1}\t60999\n")
        assert free_port() != port


def test_a_port_already_picked_is_not_picked_again(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    # A range of two free ports: excluding one leaves the other, every time.
    low = next(port for port in (_kernel_port() for _ in range(100))
               if _bindable(port) and _bindable(port + 1))
    monkeypatch.setattr(processes, "LISTEN_PORTS", 2)
    monkeypatch.setattr(processes, "EPHEMERAL_RANGE", tmp_path / "range")
    (tmp_path / "range").write_text(f"{low + 2}\t60999\n")
    first = free_port()
    assert {free_port(exclude=[first]) for _ in range(20)} == {low + (first == low)}


def _kernel_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_without_a_known_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setattr(processes, "EPHEMERAL_RANGE", tmp_path / "missing")
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_stat_fields_of_a_process_and_of_one_gone() -> None:
    mine = stat_fields(os.getpid())
    assert mine is not None and mine[STAT_STATE] in "RS"
    assert int(mine[STAT_PPID]) == os.getppid()
    assert cpu_seconds(mine) <= cpu_seconds(mine, reaped=True)
    read = read_stat(os.getpid())
    assert read is not None and read[0] == Path(f"/proc/{os.getpid()}/comm").read_text().strip()


def test_a_command_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("42 (a (b) c)) S 7 0 0\n")
    assert read_stat(tmp_path / "stat") == ("a (b) c)", ["S", "7", "0", "0"])
    (tmp_path / "stat").write_text("truncated")
    assert read_stat(tmp_path / "stat") is None
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert stat_fields(child.pid) is None
    assert not ProcessId(child.pid, 0).alive()
    assert ProcessId.of(os.getpid()).alive()
