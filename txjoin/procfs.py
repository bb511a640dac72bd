"""What Linux's ``/proc`` says about a process: the fields of its ``stat`` file.

One reader for every part that looks at processes: the local stack's identities
(``stack/processes.py``: a pid and its start time), the crash points (the JVM above a
Spark worker), the driver's JIT compiler's CPU (``jvm.py``) and the scripts that measure
processes' CPU and memory. Linux only; elsewhere every read is None.
"""

from __future__ import annotations

import os

# Fields of /proc/<pid>/stat as :func:`stat_fields` returns them (after the command name):
# proc(5)'s field number minus 3.
STAT_STATE, STAT_PPID, STAT_UTIME, STAT_STIME, STAT_START = 0, 1, 11, 12, 19
STAT_CUTIME, STAT_CSTIME = 13, 14  # what its exited children used, once it waited for them


def read_stat(stat: int | str | os.PathLike[str]) -> tuple[str, list[str]] | None:
    """A ``/proc/<pid>/stat`` (or ``/proc/<pid>/task/<tid>/stat``) file read once: the
    command name and the fields after it, ``STAT_STATE`` first; None if the process is gone
    (or not ours to read). The command name may hold spaces and parentheses, so it ends at
    the last ``)``. ``stat`` is the file's path, or a pid."""
    path = f"/proc/{stat}/stat" if isinstance(stat, int) else stat
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    head, paren, rest = text.rpartition(")")
    if not paren:
        return None
    return head.partition("(")[2], rest.split()


def stat_fields(stat: int | str | os.PathLike[str]) -> list[str] | None:
    """The fields of :func:`read_stat` after the command name, ``STAT_STATE`` first."""
    read = read_stat(stat)
    return None if read is None else read[1]


def cpu_seconds(fields: list[str], reaped: bool = False) -> float:
    """A process's (or thread's) CPU seconds, user and system, from its :func:`stat_fields`;
    with ``reaped``, also what its exited children used (those it waited for)."""
    used = ([STAT_UTIME, STAT_STIME, STAT_CUTIME, STAT_CSTIME] if reaped
            else [STAT_UTIME, STAT_STIME])
    return sum(int(fields[i]) for i in used) / os.sysconf("SC_CLK_TCK")
