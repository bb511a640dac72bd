"""Issue 67's first figure: one source transaction of 2 x ``--rows`` changes, then one of
``--rows`` updates, through the real stack with every default; the run's peak memory.

    .venv/bin/python scripts/large_transaction.py [--dir .txjoin-i67] [--rows 1000000]
        [--timeout 7200] [--no-pss] [--out FILE] [--reuse] [--run-arg ARG ...]

1. A freshly initialised local stack in ``--dir``: ``txjoin down --wipe --dir DIR`` (the
   stack there, its databases, topics, checkpoints and outputs are deleted: use a directory
   of its own), then ``txjoin up --dir DIR``. Debezium's initial snapshot holds the seed
   rows only (the menu, the four tables, three clients).
2. Two source transactions on the pizzeria of ``jobs/orders.py``, each taking the
   generator's advisory lock first and recording, as its last statement, every order it
   wrote with ``record_order_expected`` (schema.sql; ``public.orders_expected`` is not
   captured, and is what ``txjoin verify`` compares an ``as_of_fact`` job with):

   - T1: ``--rows`` ``table_assignment`` rows (the looked-up table: ids 1..rows, each at one
     of the seed's clients and tables, round robin; no client rows are written) and
     ``--rows`` orders (ids 1..rows, order i at assignment i, one or two of the menu's
     pizzas), by ``INSERT ... SELECT generate_series``: 2 x rows captured changes.
   - T2: every one of those orders updated (a pizza appended to ``pizzas``, which the job
     outputs): rows captured changes.

   Then it waits until Debezium has put every event of both into Kafka (the END of T2 and
   every data event the two ENDs announce, read by ``txjoin generate --bulk``'s capture
   watch), so ``--until-idle`` sees the whole input at its start. ``capture_s`` runs from
   T1's commit until the last of those events was read.
3. ``txjoin run jobs/orders.py --dir DIR --until-idle`` with every default (no ``TXJOIN_*``
   variable of the caller's environment passed on; Spark's log goes to
   ``DIR/large_transaction-spark.log``), while every 0.5 s the memory of its whole process
   tree is read from ``/proc``: the ``txjoin run`` process, Spark's JVM, Spark's Python
   workers (the worker daemon and its forks), the shards' hosts (``txjoin.join.spark.host``,
   counted also once their worker has gone and they were re-parented, by the worker daemon
   they watch) and anything else in the tree (``other``: Spark's launcher scripts,
   ``jspawnhelper``). A fork of the JVM before its exec (it shares the JVM's memory for an
   instant) is not counted. Reported: the peak of the sum of RSS (with each kind's share
   at that instant), each kind's own peak, and every sample. The sum of RSS counts the
   pages a forked worker shares with its daemon once per process, an upper bound of the
   tree's memory; so the same peaks are reported for the sum of PSS too (the Python
   processes' proportional set size from ``smaps_rollup``, the JVM's RSS; ``--no-pss``
   leaves it out, it costs ~1.5 ms of CPU per 100 MB of RSS a sample). The run is killed
   (its process group) after ``--timeout`` seconds.
4. ``txjoin verify jobs/orders.py --dir DIR``: its exit code and summary line.

Prints one JSON object (the commit and the files under ``txjoin/`` that differ from it,
which the editable install ran with; sizes, write and capture seconds, the run's wall
seconds, exit code and last stderr and stdout lines, the memory peaks in MB, verify's exit
code and lines, load averages) and writes it, with every memory sample, to ``--out``
(default ``DIR/large_transaction.json``); the run's and verify's output are kept beside it
in ``DIR/large_transaction-run.{log,err}`` and ``DIR/large_transaction-verify.log``. The
stack is left running (``txjoin down --dir DIR`` stops it). Exit 0 when the run and verify
both exited 0.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg2
from verify_million import ORDER_TIME, ROOT

from txjoin.procfs import STAT_PPID, read_stat

JOB_FILE = ROOT / "jobs" / "orders.py"
TXJOIN = Path(sys.executable).with_name("txjoin")
SAMPLE_S = 0.5
CAPTURE_STALL_S = 600.0
"""How long the capture may go without a new event of the two transactions: PostgreSQL
decodes a large transaction whole at its commit before Debezium gets its first event."""
PAGE = os.sysconf("SC_PAGE_SIZE")
KINDS = ("txjoin_run", "spark_jvm", "python_workers", "shard_hosts", "other")


def _txjoin(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TXJOIN), *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, check=False)


def fresh_stack(directory: Path) -> dict[str, float]:
    """``down --wipe`` then ``up`` in ``directory``: a stack with the seed rows only."""
    started = time.monotonic()
    for args in (("down", "--wipe"), ("up",)):
        done = _txjoin(*args, "--dir", str(directory))
        if done.returncode != 0:
            raise SystemExit(f"txjoin {' '.join(args)} --dir {directory} exited "
                             f"{done.returncode}:\n{done.stdout}{done.stderr}")
    return {"stack_up_s": round(time.monotonic() - started, 1)}


def _ids(cur: Any, table: str) -> list[int]:
    cur.execute(f"SELECT id FROM public.{table} ORDER BY id")
    ids = [int(r[0]) for r in cur.fetchall()]
    if not ids:
        raise SystemExit(f"public.{table} holds no rows: `txjoin up` seeds it")
    return ids


def _pick(ids: list[int], column: str, k: int) -> str:
    """SQL: the ``(column + k)``-th of ``ids``, round robin (``%%``: in a statement with
    parameters)."""
    return f"(ARRAY[{', '.join(str(i) for i in ids)}])[1 + ({column} + {k}) %% {len(ids)}]"


def write_transactions(directory: Path, rows: int) -> dict[str, Any]:
    """T1 (rows assignments + rows orders) and T2 (rows order updates), each under the
    advisory lock with its orders recorded last; wait until both are in Kafka."""
    from txjoin.stack.bulk import _CaptureWatch
    from txjoin.stack.postgres import ADVISORY_LOCK_KEY
    from txjoin.stack.stack import load_stack

    info = load_stack(directory)
    if info is None:
        raise SystemExit(f"no stack runs in {directory}")
    result: dict[str, Any] = {}
    with contextlib.closing(psycopg2.connect(info.pg_dsn_source)) as conn:
        with conn, conn.cursor() as cur:
            clients, tables, pizzas = (_ids(cur, t) for t in ("clients", "tables", "pizzas"))
            cur.execute("SELECT (SELECT count(*) FROM public.orders), "
                        "(SELECT count(*) FROM public.table_assignment), "
                        "(SELECT count(*) FROM public.orders_expected)")
            if any(cur.fetchone()):
                raise SystemExit("the fresh stack's orders, table_assignment or "
                                 "orders_expected are not empty")
            # Every xid assigned from now on is at least this one.
            cur.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
            floor = int(cur.fetchone()[0])
        watch = _CaptureWatch(info, floor)  # tails every topic from its end
        watch.start()
        try:
            started = time.monotonic()
            with conn, conn.cursor() as cur:  # T1
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
                cur.execute("INSERT INTO public.table_assignment (id, client_id, table_id, "
                            "time_in, time_out) SELECT i, "
                            f"{_pick(clients, 'i', 0)}, {_pick(tables, 'i', 0)}, "
                            "timestamp '2023-09-22 20:00:00', timestamp '2023-09-22 22:00:00' "
                            "FROM generate_series(1, %s) i", (rows,))
                # One pizza, or two for every third order.
                cur.execute("INSERT INTO public.orders (id, table_assignment_id, order_time, "
                            f"pizzas) SELECT i, i, timestamp '{ORDER_TIME}', "
                            f"(ARRAY[{_pick(pizzas, 'i', 0)}, {_pick(pizzas, 'i', 1)}])"
                            "[1:1 + (i %% 3 = 0)::int] "
                            "FROM generate_series(1, %s) i", (rows,))
                cur.execute("SELECT count(public.record_order_expected(i)) "
                            "FROM generate_series(1, %s) i", (rows,))
            t1_commit = time.monotonic()
            with conn, conn.cursor() as cur:  # T2
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
                cur.execute(f"UPDATE public.orders SET pizzas = pizzas || "
                            f"{_pick(pizzas, 'id', 2)} WHERE id BETWEEN 1 AND %s", (rows,))
                if cur.rowcount != rows:
                    raise SystemExit(f"T2 updated {cur.rowcount} orders, not {rows}")
                cur.execute("SELECT count(public.record_order_expected(i)) "
                            "FROM generate_series(1, %s) i", (rows,))
                cur.execute("SELECT pg_current_xact_id()::text::bigint")
                last_xid = int(cur.fetchone()[0])
            t2_commit = time.monotonic()
            result |= {"t1_write_s": round(t1_commit - started, 1),
                       "t2_write_s": round(t2_commit - t1_commit, 1)}
            print(json.dumps(result), file=sys.stderr, flush=True)
            watch.expect(last_xid)
            done_at = watch.wait(CAPTURE_STALL_S)
        finally:
            watch.close()
        result |= {"capture_s": round(done_at - t1_commit, 1),
                   "capture_after_last_commit_s": round(done_at - t2_commit, 1),
                   "events_captured": watch.events, "transactions_captured": watch.ends}
        conn.autocommit = True
        with conn.cursor() as cur:  # later writers (txjoin generate) take fresh ids
            for table in ("table_assignment", "orders"):
                cur.execute(f"SELECT setval(pg_get_serial_sequence('public.{table}', 'id'), "
                            f"{rows})")
            for table in ("table_assignment", "orders", "orders_expected"):
                cur.execute(f"ANALYZE public.{table}")
    return result


# -- the process tree's RSS ------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:  # gone meanwhile, or not ours to read
        return None


class TreeRss:
    """Samples the memory of ``pid`` and all its descendants (plus the shards' hosts that
    watch one of them) every ``SAMPLE_S`` seconds: RSS, and with ``pss`` the PSS of its
    Python processes; keeps the peaks per kind and of the sum.

    Not counted: a child of the JVM still running the JVM's binary under another name
    than ``java``: a fork (vfork) of the JVM before its exec, sharing the JVM's memory for
    an instant (seen as a second ~1 GB process as Spark started its Python workers)."""

    def __init__(self, pid: int, pss: bool = True) -> None:
        from txjoin.join.spark import host

        self.root = pid
        self.pss = pss
        self.host_module = host.__name__
        self.seen: set[int] = {pid}  # every pid ever in the tree (hosts name their watch)
        self.started = time.monotonic()
        self.samples: list[dict[str, Any]] = []
        self.peak = {"rss": 0, "pss": 0}
        self.peak_at: dict[str, dict[str, Any]] = {"rss": {}, "pss": {}}
        self.peak_kind = {m: dict.fromkeys(KINDS, 0) for m in ("rss", "pss")}
        self.most_processes = dict.fromkeys(KINDS, 0)
        self.clones_skipped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-rss", daemon=True)

    def _kind(self, pid: int, comm: str, cmdline: list[str]) -> str:
        if pid == self.root:
            return "txjoin_run"
        if comm == "java":
            return "spark_jvm"
        if self.host_module in cmdline:
            return "shard_hosts"
        if comm.startswith("python"):
            return "python_workers"
        return "other"

    def _processes(self) -> dict[int, tuple[int, str]]:
        """The tree's processes (and the hosts watching one): pid -> (parent, comm)."""
        procs: dict[int, tuple[int, str]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            read = read_stat(int(entry))
            if read is None:
                continue
            comm, fields = read
            procs[int(entry)] = (int(fields[STAT_PPID]), comm)
        children: dict[int, list[int]] = collections.defaultdict(list)
        for pid, (ppid, _) in procs.items():
            children[ppid].append(pid)
        tree, todo = set(), [self.root] if self.root in procs else []
        while todo:
            pid = todo.pop()
            tree.add(pid)
            todo.extend(children.get(pid, ()))
        self.seen |= tree
        return {pid: p for pid, p in procs.items() if pid in tree or p[1].startswith("python")}

    def sample(self) -> None:
        procs = self._processes()
        tree_pids = set(procs)
        mem = {m: dict.fromkeys(KINDS, 0) for m in ("rss", "pss")}
        count = dict.fromkeys(KINDS, 0)
        for pid, (ppid, comm) in procs.items():
            raw = _read(f"/proc/{pid}/cmdline")
            cmdline = raw.split("\0") if raw else []
            if pid not in self.seen:
                # A shard's host outlives the worker that started it: `-m host NAME WATCH`
                if not (self.host_module in cmdline and cmdline[-1].isdigit()
                        and int(cmdline[-1]) in self.seen):
                    continue
            elif (ppid in tree_pids and procs[ppid][1] == "java" and comm != "java"
                  and _exe(pid) is not None and _exe(pid) == _exe(ppid)):
                self.clones_skipped += 1
                continue
            statm = _read(f"/proc/{pid}/statm")
            if statm is None:
                continue
            kind = self._kind(pid, comm, cmdline)
            rss = int(statm.split()[1]) * PAGE
            mem["rss"][kind] += rss
            mem["pss"][kind] += _pss(pid, rss) if self.pss and kind != "spark_jvm" else rss
            count[kind] += 1
        t = round(time.monotonic() - self.started, 1)
        sample: dict[str, Any] = {"t_s": t, "total_mb": _mb(sum(mem["rss"].values()))}
        if self.pss:
            sample["total_pss_mb"] = _mb(sum(mem["pss"].values()))
        self.samples.append(sample | {k: _mb(v) for k, v in mem["rss"].items() if v})
        for m in ("rss", "pss") if self.pss else ("rss",):
            total = sum(mem[m].values())
            if total > self.peak[m]:
                self.peak[m] = total
                self.peak_at[m] = {"t_s": t, **{k: _mb(v) for k, v in mem[m].items()},
                                   "processes": {k: n for k, n in count.items() if n}}
            for kind in KINDS:
                self.peak_kind[m][kind] = max(self.peak_kind[m][kind], mem[m][kind])
        for kind in KINDS:
            self.most_processes[kind] = max(self.most_processes[kind], count[kind])

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> TreeRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def report(self) -> dict[str, Any]:
        result = {"peak_tree_rss_mb": _mb(self.peak["rss"]), "at_rss_peak": self.peak_at["rss"],
                  "peak_rss_mb_by_kind": {k: _mb(v) for k, v in self.peak_kind["rss"].items()}}
        if self.pss:
            result |= {"peak_tree_pss_mb": _mb(self.peak["pss"]),
                       "at_pss_peak": self.peak_at["pss"],
                       "peak_pss_mb_by_kind": {k: _mb(v)
                                               for k, v in self.peak_kind["pss"].items()}}
        return result | {"most_processes_by_kind": self.most_processes,
                         "jvm_clones_skipped": self.clones_skipped,
                         "memory_samples": len(self.samples)}


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _pss(pid: int, rss: int) -> int:
    """The process's proportional set size (its shared pages split among their sharers),
    from ``smaps_rollup``; its RSS where that cannot be read."""
    rollup = _read(f"/proc/{pid}/smaps_rollup")
    for line in (rollup or "").splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return rss


def _mb(n: int) -> float:
    return round(n / 2**20, 1)


def _default_env(directory: Path) -> dict[str, str]:
    """The caller's environment without a ``TXJOIN_*`` setting: every default."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXJOIN_")}
    env["TXJOIN_SPARK_LOG"] = str(directory / "large_transaction-spark.log")
    return env


def run_job(directory: Path, timeout: float, pss: bool, extra: Sequence[str] = ()
            ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``txjoin run`` with every default but ``--until-idle`` and ``extra``, its tree's
    memory sampled."""
    command = [str(TXJOIN), "run", str(JOB_FILE), "--dir", str(directory), "--until-idle",
               *extra]
    print(f"# {' '.join(command)}", file=sys.stderr, flush=True)
    last: collections.deque[str] = collections.deque(maxlen=1)
    with open(directory / "large_transaction-run.log", "w") as out, \
            open(directory / "large_transaction-run.err", "w") as err:
        started = time.monotonic()
        proc = subprocess.Popen(command, cwd=ROOT, env=_default_env(directory), stdout=out,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

        def drain() -> None:  # a pipe, not a file: Spark's own output stays in its log
            assert proc.stderr is not None
            for line in proc.stderr:
                err.write(line)
                err.flush()
                if line.strip():
                    last.append(line.strip())

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        timed_out = False
        with TreeRss(proc.pid, pss) as rss:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        wall = time.monotonic() - started
        reader.join(10)
    stdout = (directory / "large_transaction-run.log").read_text().strip().splitlines()
    return ({"run_command": " ".join(command[1:]), "run_wall_s": round(wall, 1),
             "run_exit_code": proc.returncode, "run_timed_out": timed_out,
             "run_last_stderr_line": last[0] if last else "",
             "run_last_stdout_line": stdout[-1] if stdout else "", **rss.report()}, rss.samples)


def verify(directory: Path) -> dict[str, Any]:
    """``txjoin verify jobs/orders.py --dir DIR``: exit code, its last ``verify:`` line and
    its first line (the rows compared and mismatches per sink)."""
    started = time.monotonic()
    done = _txjoin("verify", str(JOB_FILE), "--dir", str(directory),
                   env=_default_env(directory))
    (directory / "large_transaction-verify.log").write_text(done.stdout + done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("verify: ")]
    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"verify_wall_s": round(time.monotonic() - started, 1),
            "verify_exit_code": done.returncode, "verify_line": lines[-1] if lines else tail,
            "verify_summary": (done.stdout.splitlines() or [tail])[0]}


def _load() -> list[str]:
    return Path("/proc/loadavg").read_text().split()[:3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=ROOT / ".txjoin-i67",
                        help="the stack's directory: WIPED and started afresh")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--timeout", type=float, default=7200.0,
                        help="seconds before the run's process group is killed")
    parser.add_argument("--no-pss", dest="pss", action="store_false",
                        help="sample RSS only (reading PSS costs ~1.5 ms of CPU per 100 MB of RSS "
                             "a sample)")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: DIR/large_transaction.json")
    parser.add_argument("--reuse", action="store_true",
                        help="the stack in DIR as an earlier run left it (its two transactions "
                             "captured): no wipe, no writes; the run starts a new checkpoint "
                             "(--rebuild)")
    parser.add_argument("--run-arg", action="append", default=[], metavar="ARG",
                        help="one more argument of txjoin run (repeatable; the figure is "
                             "measured with none)")
    args = parser.parse_args()
    if args.rows < 1:
        parser.error("--rows must be at least 1")
    directory = args.dir.absolute()
    out = args.out or directory / "large_transaction.json"
    result: dict[str, Any] = {
        "job": str(JOB_FILE.relative_to(ROOT)), "rows": args.rows,
        "t1_changes": 2 * args.rows, "t2_changes": args.rows,
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                 capture_output=True, text=True).stdout.strip(),
        # What of txjoin the run used beyond that commit (an editable install)
        "uncommitted": subprocess.run(["git", "status", "--porcelain", "--", "txjoin"],
                                      cwd=ROOT, capture_output=True,
                                      text=True).stdout.splitlines(),
        "cpus": os.cpu_count(), "nice": os.nice(0)}
    extra = list(args.run_arg)
    if args.reuse:
        extra.append("--rebuild")
    else:
        result |= fresh_stack(directory)
        directory.mkdir(parents=True, exist_ok=True)
        result |= write_transactions(directory, args.rows)
    result["run_args"] = extra
    print(json.dumps(result), file=sys.stderr, flush=True)
    result["loadavg_before_run"] = _load()
    run, samples = run_job(directory, args.timeout, args.pss, extra)
    result |= run
    result["loadavg_after_run"] = _load()
    print(json.dumps(result), file=sys.stderr, flush=True)
    result |= verify(directory)
    text = json.dumps(result, indent=2)
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "samples": samples}, indent=2) + "\n")
    sys.exit(0 if result["run_exit_code"] == 0 and result["verify_exit_code"] == 0 else 1)


if __name__ == "__main__":
    main()
