"""Issue 71's first figure: ``txjoin verify jobs/users_colors.py`` at a million rows.

    nice -n 5 .venv/bin/python scripts/verify_million.py [--dir .txjoin] [--users 1000000]
        [--runs 3] [--skip-build] [--out verify_million.json]

On the local stack in ``--dir`` (``txjoin up --dir DIR`` first): the source database's
``users`` and ``users_favorite_color`` emptied and refilled by ``generate_series`` in 100
transactions (``--users`` users, one colour each, ``user_id`` without an index), then
``ANALYZE``d. The sinks are filled with the job's answer as one snapshot batch leaves
them (docs/benchmarks.md, "verify at a million rows"): PostgreSQL's rows of the job's
query written through ``PostgresSink.write`` (100,000-row batches) into a database of
their own (``verify_bench_sink``), and the Delta current and changelog tables written by
delta-rs in the sink's schema under ``<dir>/bench-output``. Then, ``--runs`` times,

    /usr/bin/time -v txjoin verify jobs/users_colors.py --dir DIR --postgres-dsn SINK \\
        --output-dir DIR/bench-output

with the load average before and after each run. ``--skip-build`` measures the data
already there. Prints JSON (wall, user and system CPU, peak RSS, exit code, verify's
summary line, load) and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
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
JOB_FILE = ROOT / "jobs" / "users_colors.py"
SINK_DB = "verify_bench_sink"
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


def build_sinks(source: str, sink: str, output_dir: Path) -> dict[str, float]:
    """Both sinks holding the job's answer, as one snapshot batch leaves them."""
    from deltalake import write_deltalake

    from txjoin.join.output import changes_to_table, output_schema
    from txjoin.join.temporal import OutputChange
    from txjoin.sinks import OP, current_schema
    from txjoin.sinks.delta import stored_schema
    from txjoin.sinks.postgres import PostgresSink
    from txjoin.verify.verify import StreamedAnswer, _connect, answer_in_key_order

    job = _load_job()
    started = time.monotonic()
    with contextlib.closing(psycopg2.connect(_database(sink, "postgres"))) as admin:
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {SINK_DB} WITH (FORCE)")
            cur.execute(f"CREATE DATABASE {SINK_DB}")
    shutil.rmtree(output_dir, ignore_errors=True)
    table_dir = output_dir / job.output.table
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

        for rows in answer_in_key_order(job, conn, StreamedAnswer("")):
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


def _load_job() -> Any:
    from txjoin.job import load_job

    return load_job(str(JOB_FILE))


_TIME = {"wall": re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)"),
         "user": re.compile(r"User time \(seconds\): (\S+)"),
         "sys": re.compile(r"System time \(seconds\): (\S+)"),
         "rss_kb": re.compile(r"Maximum resident set size \(kbytes\): (\d+)")}


def _seconds(clock: str) -> float:
    total = 0.0
    for part in clock.split(":"):
        total = total * 60 + float(part)
    return total


def measure(directory: Path, sink: str, output_dir: Path) -> dict[str, Any]:
    """One ``/usr/bin/time -v txjoin verify`` run."""
    txjoin = Path(sys.executable).with_name("txjoin")
    command = ["/usr/bin/time", "-v", str(txjoin), "verify", str(JOB_FILE), "--dir",
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
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("verify_million.json"))
    args = parser.parse_args()
    from txjoin.stack.stack import load_stack

    stack = load_stack(args.dir)
    if stack is None:
        raise SystemExit(f"no stack in {args.dir}: `txjoin up --dir {args.dir}` first")
    source = stack.pg_dsn_source
    sink = _database(stack.pg_dsn_sink, SINK_DB)
    output_dir = args.dir.absolute() / "bench-output"
    result: dict[str, Any] = {"users": args.users, "colours": args.users,
                              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                                       cwd=ROOT, capture_output=True,
                                                       text=True).stdout.strip(),
                              "nice": os.nice(0)}
    if not args.skip_build:
        result |= build_source(source, args.users)
        result |= build_sinks(source, sink, output_dir)
    result["runs"] = []
    for _ in range(args.runs):
        run = measure(args.dir, sink, output_dir)
        print(json.dumps(run), file=sys.stderr)
        result["runs"].append(run)
    text = json.dumps(result, indent=2)
    print(text)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
