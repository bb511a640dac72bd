"""Where a command's CPU goes, by kind of process: the suite's budget, measured.

    .venv/bin/python scripts/cpu_by_process.py [--out cpu-by-process.json] [--interval 0.25]
        -- COMMAND [ARG ...]

Runs COMMAND (e.g. ``bash scripts/test.sh``) and, until it exits, reads every process's CPU
seconds (user + system, ``/proc/PID/stat``) every ``--interval`` seconds. A process started
after the sampling began counts whole; one that was running before counts what it spent
during the run. Each process is put in a kind by its executable and command line (a Spark
driver JVM, the broker's, Kafka Connect's, a shard host, a query's pre-init process, Spark's
Python worker daemons, PostgreSQL, a pytest worker, ...), again when its executable changes
(a ``spark-submit`` script execs its JVM). Prints per kind the CPU seconds, the processes and
the seconds each took on average, then the command's wall time, and writes them to
``--out`` as JSON with each process's figures. What a process spends between two readings
before it exits is lost (a quarter second at most, by default), so short-lived processes
count a little low. Linux only (``/proc``); exits with the command's code.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from txjoin.bench import SPARK_SUBMIT
from txjoin.join.spark import host
from txjoin.pipeline import worker_daemon
from txjoin.procfs import STAT_START, cpu_seconds, stat_fields

TICK = os.sysconf("SC_CLK_TCK")

JVM_KINDS = (
    ("kafka.Kafka", "jvm: Kafka broker"),
    ("ConnectDistributed", "jvm: Kafka Connect"),
    ("deploy.master.Master", "jvm: Spark master"),
    ("deploy.worker.Worker", "jvm: Spark worker"),
    ("DriverWrapper", "jvm: Spark driver (cluster mode)"),
    ("CoarseGrainedExecutorBackend", "jvm: Spark executor"),
    ("org.apache.spark.launcher.Main", "jvm: spark-submit's launcher"),
    (SPARK_SUBMIT, "jvm: Spark driver"),
)
"""A JVM's kind by a word of its command line, the first that matches."""

PYTHON_KINDS = (
    (host.__name__, "python: shard host"),
    ("transform_with_state_driver", "python: a query's pre-init (transformWithState)"),
    ("python_streaming_source_run", "python: a query's data source planner"),
    (worker_daemon.__name__, "python: Spark worker (txjoin's daemon)"),
    ("pyspark.daemon", "python: Spark worker (PySpark's daemon)"),
    ("pyspark.worker", "python: Spark worker"),
    ("tests.spark.kill_target", "python: kill target"),
    ("bin/txjoin", "python: txjoin command"),
    ("-m txjoin", "python: txjoin command"),
    ("import sys;exec(eval(sys.stdin.readline()))", "python: pytest worker (xdist)"),
    ("pytest", "python: pytest"),
)
"""A Python process's kind by a word of its command line, the first that matches."""


def executable(pid: str) -> str:
    """Process ``pid``'s executable ('': gone, a kernel thread, or not ours to read)."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def kind_of(pid: str, exe: str) -> str | None:
    """The kind of process ``pid`` running ``exe`` (None: gone, or a kernel thread)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    line = " ".join(a.decode(errors="replace") for a in argv if a)
    if not line:
        return None
    name = os.path.basename(exe)
    if name == "java":
        return next((k for word, k in JVM_KINDS if word in line), "jvm: other")
    if name.startswith("python"):
        return next((k for word, k in PYTHON_KINDS if word in line), "python: other")
    if name in ("postgres", "postmaster"):
        return "postgres"
    return f"other: {name or argv[0].decode(errors='replace')}"


def read_cpu(pid: str) -> tuple[float, int] | None:
    """Process ``pid``'s CPU seconds and start time (clock ticks after boot)."""
    fields = stat_fields(int(pid))
    if fields is None:
        return None
    return cpu_seconds(fields), int(fields[STAT_START])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("cpu-by-process.json"))
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    if not Path("/proc/self/stat").exists():
        parser.error("reads Linux's /proc")
    began = float(Path("/proc/uptime").read_text().split()[0]) * TICK
    seen: dict[str, dict] = {}  # pid -> kind, exe, cpu, start, base (cpu before the run)
    started = time.monotonic()
    proc = subprocess.Popen(command)
    try:
        while True:
            done = proc.poll() is not None
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                cpu = read_cpu(pid)
                if cpu is None:
                    continue
                exe = executable(pid)
                entry = seen.get(pid)
                if entry is None or entry["start"] != cpu[1]:  # new, or a reused pid
                    kind = kind_of(pid, exe)
                    if kind is not None:
                        seen[pid] = {"kind": kind, "exe": exe, "cpu": cpu[0], "start": cpu[1],
                                     "base": 0.0 if cpu[1] >= began else cpu[0]}
                    continue
                if exe != entry["exe"]:  # an exec (spark-submit's script -> its JVM)
                    entry.update(kind=kind_of(pid, exe) or entry["kind"], exe=exe)
                entry["cpu"] = cpu[0]
            if done:
                break
            time.sleep(args.interval)
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        proc.wait()
    wall = time.monotonic() - started
    spent: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for entry in seen.values():
        spent[entry["kind"]] += entry["cpu"] - entry["base"]
        count[entry["kind"]] += 1
    total = sum(spent.values())
    print(f"{'CPU s':>8} {'share':>6} {'procs':>6} {'s each':>7}  kind")
    for kind, seconds in spent.most_common():
        if seconds >= 0.05:
            print(f"{seconds:8.1f} {seconds / total:6.1%} {count[kind]:6d} "
                  f"{seconds / count[kind]:7.2f}  {kind}")
    print(f"{total:8.1f} CPU s in {wall:.0f} s wall ({total / wall:.2f} cores busy on "
          f"average); exit {proc.returncode}")
    args.out.write_text(json.dumps({
        "command": command, "wall_s": round(wall, 1), "cpu_s": round(total, 1),
        "exit": proc.returncode,
        "kinds": {k: {"cpu_s": round(s, 1), "processes": count[k]}
                  for k, s in spent.most_common()},
        "processes": sorted(({"pid": int(p), **{k: (round(v, 2) if isinstance(v, float) else v)
                                                for k, v in e.items()}}
                             for p, e in seen.items()), key=lambda e: -(e["cpu"] - e["base"])),
    }, indent=1) + "\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
