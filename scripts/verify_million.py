"""Issue 71's figures: ``txjoin verify`` at a million rows, users or orders.

    nice -n 5 .venv/bin/python scripts/verify_million.py [--dir .txjoin] [--job users|orders]
        [--users 1000000] [--orders 1000000] [--runs 3] [--skip-build] [--out FILE]

On the local stack in ``--dir`` (``txjoin up --dir DIR`` first), the source database's
tables of the job are emptied and refilled by ``generate_series`` in 100 transactions,
then ``ANALYZE``d:

- ``--job users`` (``jobs/users_colors.py``, the first figure): ``users`` and
  ``users_favorite_color``, ``--users`` users with one colour each, ``user_id`` without
  an index.
- ``--job orders`` (``jobs/orders.py``, ``as_of_fact``, the second figure): the shape of
  ``txjoin bench --snapshot-orders N`` (:func:`txjoin.scenarios.workload.pizzeria_workload`)
  on the stack's menu and dining room: a quarter of ``--orders`` clients and as many table
  assignments (a random table each) in the first transaction, then ``--orders`` orders of
  1 to 4 random pizzas at a random assignment. Each order transaction takes the
  generator's advisory lock first and, as its last statement, records every order it
  wrote with ``record_order_expected`` (schema.sql), as ``txjoin generate`` does:
  ``public.orders_expected`` is what verify compares an ``as_of_fact`` job with, and
  nothing else can answer for a database whose facts predate any record of its history.

The sinks are filled with the job's answer as one snapshot batch leaves them
(docs/benchmarks.md, "verify at a million rows"): the rows of the job's query (compiled by
verify, ``job_query``; on a database no transaction changed after its facts were written,
an ``as_of_fact`` job's answer is that query's) written through ``PostgresSink.write``
(100,000-row batches) into a database of their own (``verify_bench_sink``, for orders
``verify_bench_sink_orders``), and the Delta
current and changelog tables written by delta-rs in the sink's schema under
``<dir>/bench-output``. Then, ``--runs`` times,

    /usr/bin/time -v txjoin verify JOB --dir DIR --postgres-dsn SINK \\
        --output-dir DIR/bench-output

with the load average before and after each run. ``--skip-build`` measures the data
already there. Prints JSON (wall, user and system CPU, peak RSS, exit code, verify's
summary line, load) and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
JOB_FILES = {"users": ROOT / "jobs" / "users_colors.py", "orders": ROOT / "jobs" / "orders.py"}
SINK_DBS = {"users": "verify_bench_sink", "orders": "verify_bench_sink_orders"}
TRANSACTIONS = 100
SINK_BATCH = 100_000
COLOURS = ["red", "green", "blue", "yellow", "purple", "orange", "black"]


def _database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + name))


def build_source(source: str, users: int) -> dict[str, float]:
    """The two tables refilled in ``TRANSACTIONS`` transactions, analyzed."""
    started = time.monotonic()
    per = -(-users // TRANSACTIONS)
    colours = "ARRAY[" + ", ".join(f"'{c}'" for c in COLOURS) + "]"
    with contextlib.closing(psycopg2.connect(source)) as conn:
        with conn, conn.cursor() as cur:
            # No index on user_id but the tables' keys (issue 71: a user's table may well
            # lack the one a lookup would want).
            cur.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'public' AND "
                        "tablename = 'users_favorite_color' AND indexdef LIKE '%(user_id%'")
            for (index,) in cur.fetchall():
                cur.execute(f'DROP INDEX public."{index}"')
            cur.execute("TRUNCATE public.users_favorite_color, public.users")
        for t in range(TRANSACTIONS):
            low, high = t * per + 1, min(users, (t + 1) * per)
            if low > high:
                break
            with conn, conn.cursor() as cur:
                cur.execute("INSERT INTO public.users SELECT i, 'user ' || i "
                            "FROM generate_series(%s, %s) i", (low, high))
                cur.execute(f"INSERT INTO public.users_favorite_color SELECT i, i, "
                            f"({colours})[i %% {len(COLOURS)} + 1] "
                            f"FROM generate_series(%s, %s) i", (low, high))
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("ANALYZE public.users")
            cur.execute("ANALYZE public.users_favorite_color")
    return {"source_build_s": time.monotonic() - started}


ORDER_TIME = "2023-09-22 21:00:00"
"""Every order's ``order_time``, as in ``pizzeria_workload``'s snapshot."""


def build_orders_source(source: str, orders: int) -> dict[str, float]:
    """The pizzeria's clients, table assignments and orders refilled (the stack's menu and
    tables kept), ``orders_expected`` recorded with each order transaction, analyzed."""
    from txjoin.stack.postgres import ADVISORY_LOCK_KEY

    started = time.monotonic()
    assignments = max(1, orders // 4)
    per = -(-orders // TRANSACTIONS)
    with contextlib.closing(psycopg2.connect(source)) as conn:
        with conn, conn.cursor() as cur:
            ids = {}
            for table in ("tables", "pizzas"):  # random ids: a range without gaps
                cur.execute(f"SELECT min(id), count(*), max(id) - min(id) + 1 FROM public.{table}")
                low, count, span = cur.fetchone()
                if not count or count != span:
                    raise SystemExit(f"public.{table} holds no rows or has gaps in its ids: "
                                     f"`txjoin up` builds the stack's menu and dining room")
                ids[table] = f"{low} + floor(random() * {count})::int"
            cur.execute("TRUNCATE public.orders_expected")  # not captured
            # Captured: a TRUNCATE only when there is something to empty (a fresh stack's
            # Debezium then streams inserts alone).
            cur.execute("SELECT EXISTS (SELECT FROM public.orders) "
                        "OR EXISTS (SELECT FROM public.table_assignment)")
            if cur.fetchone()[0]:
                cur.execute("TRUNCATE public.orders, public.table_assignment")
            cur.execute("DELETE FROM public.clients WHERE id > 3")  # the seed's regulars kept
            cur.execute("SELECT setseed(0.71)")  # one session: the same data every build
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
            cur.execute("INSERT INTO public.clients (id, name) SELECT 3 + i, 'client-' || (3 + i) "
                        "FROM generate_series(1, %s) i", (assignments,))
            cur.execute("INSERT INTO public.table_assignment (id, client_id, table_id, time_in, "
                        f"time_out) SELECT i, 3 + i, {ids['tables']}, timestamp "
                        f"'2023-09-22 20:00:00', timestamp '2023-09-22 22:00:00' "
                        f"FROM generate_series(1, %s) i", (assignments,))
        pizza = ids["pizzas"]
        for t in range(TRANSACTIONS):
            low, high = t * per + 1, min(orders, (t + 1) * per)
            if low > high:
                break
            with conn, conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
                cur.execute(f"INSERT INTO public.orders (id, table_assignment_id, order_time, "
                            f"pizzas) SELECT i, 1 + floor(random() * %s)::int, "
                            f"timestamp '{ORDER_TIME}', (ARRAY[{pizza}, {pizza}, {pizza}, "
                            f"{pizza}])[1:1 + floor(random() * 4)::int] "
                            f"FROM generate_series(%s, %s) i", (assignments, low, high))
                cur.execute("SELECT count(public.record_order_expected(i)) "
                            "FROM generate_series(%s, %s) i", (low, high))
        with conn, conn.cursor() as cur:  # later writers (txjoin generate) take fresh ids
            for table in ("clients", "table_assignment", "orders"):
                cur.execute(f"SELECT setval(pg_get_serial_sequence('public.{table}', 'id'), "
                            f"(SELECT max(id) FROM public.{table}))")
        conn.autocommit = True
        with conn.cursor() as cur:
            for table in ("clients", "table_assignment", "orders", "orders_expected"):
                cur.execute(f"ANALYZE public.{table}")
    return {"source_build_s": time.monotonic() - started}


def build_sinks(job_file: Path, source: str, sink: str, output_dir: Path) -> dict[str, float]:
    """Both sinks holding the job's answer, as one snapshot batch leaves them: the rows of
    the job's query on the source (an ``as_of_fact`` job's too: no transaction changed the
    source after its facts were written), in key order."""
    from deltalake import write_deltalake

    from txjoin.join.output import changes_to_table, output_schema
    from txjoin.join.temporal import OutputChange
    from txjoin.sinks import OP, current_schema
    from txjoin.sinks.delta import stored_schema
    from txjoin.sinks.postgres import PostgresSink
    from txjoin.verify.verify import StreamedAnswer, _connect, answer_in_key_order

    job = _load_job(job_file)
    started = time.monotonic()
    database = urlsplit(sink).path.lstrip("/")
    with contextlib.closing(psycopg2.connect(_database(sink, "postgres"))) as admin:
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
            cur.execute(f"CREATE DATABASE {database}")
    table_dir = output_dir / job.output.table
    shutil.rmtree(table_dir, ignore_errors=True)
    schema = output_schema(job)
    stored = stored_schema(schema)
    keys = list(job.output.key)
    changelogs: list[pa.Table] = []
    with contextlib.closing(PostgresSink(sink, job.output.table, job.name, keys,
                                         schema)) as pg, _connect(source, "source") as conn:
        pending: list[Any] = []
        batch_id = 0

        def flush() -> None:
            nonlocal batch_id, pending
            changes = [OutputChange(tuple(r[k] for k in keys), "c", r, 1, 1, 0)
                       for r in pending]
            table = changes_to_table(job, changes)
            assert pg.write(batch_id, table)
            changelogs.append(table.cast(stored))
            batch_id += 1
            pending = []

        now = dataclasses.replace(job, semantics="current")
        for rows in answer_in_key_order(now, conn, StreamedAnswer("")):
            pending += rows
            if len(pending) >= SINK_BATCH:
                flush()
        if pending:
            flush()
    changelog = pa.concat_tables(changelogs)
    write_deltalake(str(table_dir / "changelog"), changelog)
    current = changelog.drop_columns([OP]).cast(current_schema(stored))
    write_deltalake(str(table_dir / "current"), current)
    return {"sinks_build_s": time.monotonic() - started, "sink_rows": changelog.num_rows}


def _load_job(job_file: Path) -> Any:
    from txjoin.job import load_job

    return load_job(str(job_file))


_TIME = {"wall": re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)"),
         "user": re.compile(r"User time \(seconds\): (\S+)"),
         "sys": re.compile(r"System time \(seconds\): (\S+)"),
         "rss_kb": re.compile(r"Maximum resident set size \(kbytes\): (\d+)")}


def _seconds(clock: str) -> float:
    total = 0.0
    for part in clock.split(":"):
        total = total * 60 + float(part)
    return total


def measure(job_file: Path, directory: Path, sink: str, output_dir: Path) -> dict[str, Any]:
    """One ``/usr/bin/time -v txjoin verify`` run."""
    txjoin = Path(sys.executable).with_name("txjoin")
    command = ["/usr/bin/time", "-v", str(txjoin), "verify", str(job_file), "--dir",
               str(directory), "--postgres-dsn", sink, "--output-dir", str(output_dir)]
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    found = {name: pattern.search(done.stderr) for name, pattern in _TIME.items()}
    missing = [name for name, m in found.items() if m is None]
    if missing:
        raise SystemExit(f"no {missing} in /usr/bin/time's output:\n{done.stderr}")
    wall = _seconds(found["wall"].group(1))  # type: ignore[union-attr]
    user = float(found["user"].group(1))  # type: ignore[union-attr]
    system = float(found["sys"].group(1))  # type: ignore[union-attr]
    return {"wall_s": wall, "user_s": user, "sys_s": system, "cpu_s": round(user + system, 2),
            "cpu_share": round((user + system) / wall, 2) if wall else None,
            "peak_rss_kb": int(found["rss_kb"].group(1)),  # type: ignore[union-attr]
            "exit_code": done.returncode,
            "summary": done.stdout.splitlines()[0] if done.stdout else done.stderr[-2000:],
            "loadavg_before": load_before, "loadavg_after": load_after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=ROOT / ".txjoin")
    parser.add_argument("--job", choices=sorted(JOB_FILES), default="users")
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: verify_million.json (users), verify_million_orders.json")
    args = parser.parse_args()
    job_file = JOB_FILES[args.job]
    out = args.out or Path("verify_million.json" if args.job == "users"
                           else f"verify_million_{args.job}.json")
    from txjoin.stack.stack import load_stack

    stack = load_stack(args.dir)
    if stack is None:
        raise SystemExit(f"no stack in {args.dir}: `txjoin up --dir {args.dir}` first")
    source = stack.pg_dsn_source
    sink = _database(stack.pg_dsn_sink, SINK_DBS[args.job])
    output_dir = args.dir.absolute() / "bench-output"
    sizes = ({"users": args.users, "colours": args.users} if args.job == "users" else
             {"orders": args.orders, "clients": 3 + args.orders // 4,
              "table_assignments": args.orders // 4})
    result: dict[str, Any] = {"job": str(job_file.relative_to(ROOT)), **sizes,
                              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                                       cwd=ROOT, capture_output=True,
                                                       text=True).stdout.strip(),
                              "nice": os.nice(0)}
    if not args.skip_build:
        result |= (build_source(source, args.users) if args.job == "users"
                   else build_orders_source(source, args.orders))
        print(json.dumps(result), file=sys.stderr)
        result |= build_sinks(job_file, source, sink, output_dir)
        print(json.dumps(result), file=sys.stderr)
    result["runs"] = []
    for _ in range(args.runs):
        run = measure(job_file, args.dir, sink, output_dir)
        print(json.dumps(run), file=sys.stderr)
        result["runs"].append(run)
    text = json.dumps(result, indent=2)
    print(text)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
