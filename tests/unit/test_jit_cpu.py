"""txjoin.jvm.compiler_cpu_seconds reads a JVM's JIT compiler threads' CPU from /proc, and
the demo turns two readings into the timed window's share (txjoin.stack.demo.driver_jit)."""

from __future__ import annotations

import os
from pathlib import Path

from txjoin.jvm import compiler_cpu_seconds
from txjoin.stack.demo import driver_jit

TICK = os.sysconf("SC_CLK_TCK")


def _thread(proc: Path, pid: int, tid: int, comm: str, utime: int, stime: int) -> None:
    task = proc / str(pid) / "task" / str(tid)
    task.mkdir(parents=True)
    (task / "comm").write_text(comm + "\n")
    # a command name with a space and a parenthesis, as /proc allows
    (task / "stat").write_text(f"{tid} ({comm} x)) S 1 2 3 4 5 6 7 8 9 10 {utime} {stime} "
                               "0 0 20 0 1 0 100 0 0\n")


def test_sums_only_the_compiler_threads(tmp_path: Path) -> None:
    _thread(tmp_path, 42, 43, "C2 CompilerThre", 3 * TICK, 1 * TICK)
    _thread(tmp_path, 42, 44, "C1 CompilerThre", 1 * TICK, 0)
    _thread(tmp_path, 42, 45, "stream executio", 50 * TICK, 5 * TICK)
    assert compiler_cpu_seconds(42, proc=tmp_path) == 5.0


def test_no_such_process(tmp_path: Path) -> None:
    assert compiler_cpu_seconds(7, proc=tmp_path) is None


def test_a_process_without_a_jit_is_zero() -> None:
    assert compiler_cpu_seconds(os.getpid()) == 0.0


def test_the_timed_window_share() -> None:
    assert driver_jit([10.0, 40.0], 60.0) == {"cpu_s": 30.0, "share_of_a_core": 0.5,
                                              "cores": os.cpu_count()}
    assert driver_jit([None, None], 60.0) is None
    assert driver_jit([10.0], 60.0) is None  # the window never ended
