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


def stat_fields(stat: int | str | os.PathLike[str]) -> list[str] | None:
    """The fields of a ``/proc/<pid>/stat`` (or ``/proc/<pid>/task/<tid>/stat``) file after
    the command name, ``STAT_STATE`` first; None if the process is gone (or not ours to
    read). The command name may hold spaces and parentheses, so the split is after its last
    ``)``. ``stat`` is the file's path, or a pid."""
    path = f"/proc/{stat}/stat" if isinstance(stat, int) else stat
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(fields: list[str], reaped: bool = False) -> float:
    """A process's (or thread's) CPU seconds, user and system, from its :func:`stat_fields`;
    with ``reaped``, also what its exited children used (those it waited for)."""
    used = ([STAT_UTIME, STAT_STIME, STAT_CUTIME, STAT_CSTIME] if reaped
            else [STAT_UTIME, STAT_STIME])
    return sum(int(fields[i]) for i in used) / os.sysconf("SC_CLK_TCK")
