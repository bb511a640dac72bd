"""verify's referee on one ride-hailing workload, as_of_fact against current (issue 73 item 5).

    .venv/bin/python scripts/verify_replay_cost.py [--trips-per-tx 14] [--stops 20]
        [--transactions 220] [--out verify_replay_cost.json]

Starts a PostgreSQL of its own (the stack's embedded server, in a temporary directory),
builds a database for the job below with txjoin's DDL, starts verify's record (the
replication slot ``txjoin_verify``), then commits ``--transactions`` transactions, each
inserting ``--trips-per-tx`` trips with ``--stops`` stops each and renaming one driver
(defaults: 3,080 trips, 61,600 stops, 220 transactions, ~65k row changes: issue 73's
size). Then it times, on the same data, each semantics' referee as ``txjoin verify``
runs it before it compares a sink: ``as_of_fact``, verify's record read and replayed by
txjoin's oracle (``read_record``, then ``expected_as_of``: what ``recorded_answer``
does; rows read by the job's types); ``current``, the job's query on the database read
in key order (``streamed_checks`` with no sink). Then the whole ``verify_job`` of each
against a PostgreSQL sink filled with its answer (the record's slot already read: a
verify after the first), in this process and as ``txjoin verify`` processes (no Delta
table: each notes it). Prints JSON (seconds of wall clock and of this process's CPU
each, and the ratios) and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import psycopg2

from txjoin.job import Aggregate, Children, Job, Lookup, Output, Pick, Table
from txjoin.join.output import changes_to_table, output_schema
from txjoin.join.temporal import OutputChange
from txjoin.sinks.postgres import PostgresSink
from txjoin.stack import postgres
from txjoin.stack.processes import free_port
from txjoin.verify.history import expected_as_of, read_record, start_record
from txjoin.verify.verify import comparable_rows, expected_rows, streamed_checks, verify_job

JOB = Job(
    name="rides",
    tables=[Table("public.drivers", {"id": "int", "name": "text"}),
            Table("public.vehicles", {"id": "int", "driver_id": "int", "plate": "text"}),
            Table("public.trips", {"id": "int", "driver_id": "int", "fare": "numeric(8,2)"}),
            Table("public.stops", {"id": "int", "trip_id": "int", "seq": "int",
                                   "place": "text"})],
    fact="public.trips", fact_alias="t",
    lookups=[Lookup("d", "public.drivers", "t", {"id": "driver_id"}, how="left"),
             Lookup("v", "public.vehicles", "d", {"driver_id": "id"}, how="left",
                    pick=Pick("id", "max")),
             Children("st", "public.stops", "t", {"trip_id": "id"}, order_by="seq")],
    output=Output(table="rides", key={"id": "t.id"}, columns={
        "fare": "t.fare", "driver": "d.name", "plate": "v.plate",
        "stops": Aggregate("st", "count"),
        "route": Aggregate("st", "string_agg", "st.place", " > ")}),
    semantics="as_of_fact")

CURRENT = replace(JOB, name="rides_now", semantics="current",
                  output=replace(JOB.output, table="rides_now"))

DRIVERS = 50


def write_workload(url: str, transactions: int, trips: int, stops: int) -> int:
    """The transactions; returns the row changes they made."""
    changed = 0
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        for n in range(transactions):
            for t in range(trips):
                trip = n * trips + t + 1
                cur.execute("INSERT INTO public.trips VALUES (%s, %s, %s)",
                            (trip, trip % DRIVERS + 1, f"{trip % 97}.50"))
                cur.executemany("INSERT INTO public.stops VALUES (%s, %s, %s, %s)",
                                [(trip * stops + s, trip, s // 2, f"place {s}")
                                 for s in range(stops)])
            cur.execute("UPDATE public.drivers SET name = name || '+' WHERE id = %s",
                        (n % DRIVERS + 1,))
            conn.commit()
            changed += trips * (stops + 1) + 1
    return changed


def measure(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="txjoin-verify-cost-") as tmp:
        root = Path(tmp)
        port = free_port()
        pg_root = postgres.data_root(root)  # under /var/tmp when /tmp's folder is private
        server = postgres.start_postgres(pg_root, port, root / "postgres.log")
        try:
            url = postgres.create_source_database(port, "rides", JOB.tables)
            with psycopg2.connect(url) as conn, conn.cursor() as cur:
                cur.executemany("INSERT INTO public.drivers VALUES (%s, %s)",
                                [(d, f"driver {d}") for d in range(1, DRIVERS + 1)])
                cur.executemany("INSERT INTO public.vehicles VALUES (%s, %s, %s)",
                                [(v, v % DRIVERS + 1, f"P-{v}") for v in range(1, 2 * DRIVERS)])
            start_record(url, root, JOB.table_names)
            changes = write_workload(url, args.transactions, args.trips_per_tx, args.stops)
            timings: dict[str, dict[str, float]] = {}

            wall, cpu = time.monotonic(), time.process_time()
            # what recorded_answer does, in two steps
            record = read_record(url, root, set(JOB.table_names))
            assert record is not None
            read_wall, read_cpu = time.monotonic() - wall, time.process_time() - cpu
            answer = expected_as_of(JOB, record, "the source")
            assert not answer.unchecked
            rows = len(comparable_rows(JOB, answer.present))
            timings["as_of_fact"] = {"wall_s": time.monotonic() - wall,
                                     "cpu_s": time.process_time() - cpu, "rows": rows,
                                     "record_read_wall_s": read_wall,
                                     "record_read_cpu_s": read_cpu}

            current = CURRENT
            wall, cpu = time.monotonic(), time.process_time()
            streamed, _ = streamed_checks(current, url, [])
            timings["current"] = {"wall_s": time.monotonic() - wall,
                                  "cpu_s": time.process_time() - cpu,
                                  "rows": streamed.present}

            # The whole verify of each, against a PostgreSQL sink holding its answer (no
            # Delta table: each verify notes it and reads nothing there). The slot was read
            # above: the as_of_fact verify reads the record file again, as a verify after
            # the first one does.
            sink = postgres.dsn(port, postgres.SINK_DB)
            jobs = {"as_of_fact": (JOB, answer.present),
                    "current": (current, expected_rows(current, url)[0])}
            for semantics, (job, rows_now) in jobs.items():
                fill_sink(job, sink, rows_now)
                wall, cpu = time.monotonic(), time.process_time()
                result = verify_job(job, (url, sink), root / "no-delta", record_dir=root)
                postgres_check = next(c for c in result.sinks if c.sink == "postgres")
                assert postgres_check.ok, result.format()
                timings[f"verify_{semantics}"] = {"wall_s": time.monotonic() - wall,
                                                  "cpu_s": time.process_time() - cpu}
                timings[f"cli_{semantics}"] = cli_verify(job, root, url, sink, len(rows_now))
        finally:
            postgres.stop_postgres(server.process)
            shutil.rmtree(pg_root, ignore_errors=True)
    verify_ratio = (timings["verify_as_of_fact"]["wall_s"]
                    / timings["verify_current"]["wall_s"])
    cli_ratio = timings["cli_as_of_fact"]["wall_s"] / timings["cli_current"]["wall_s"]
    return {"transactions": args.transactions, "trips": args.transactions * args.trips_per_tx,
            "stops": args.transactions * args.trips_per_tx * args.stops,
            "row_changes": changes, "load_1min": os.getloadavg()[0], **timings,
            "ratio_wall": timings["as_of_fact"]["wall_s"] / timings["current"]["wall_s"],
            "verify_ratio_wall": verify_ratio, "cli_ratio_wall": cli_ratio}


def cli_verify(job: Job, root: Path, source: str, sink: str, rows: int) -> dict[str, float]:
    """``txjoin verify`` of ``job`` as a process of its own (its start, imports and the
    Delta sink's note included): wall seconds and the process's CPU."""
    job_file = root / f"{job.name}.py"
    job_file.write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                        f"from verify_replay_cost import JOB, CURRENT\n"
                        f"job = {'JOB' if job is JOB else 'CURRENT'}\n")
    script = Path(sys.executable).with_name("txjoin")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.monotonic()
    done = subprocess.run([str(script), "verify", str(job_file), "--dir", str(root),
                           "--source-dsn", source, "--postgres-dsn", sink, "--output-dir",
                           str(root / "no-delta")], capture_output=True, text=True,
                          check=False)
    wall = time.monotonic() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert f"postgres {rows} rows, 0 mismatches" in done.stdout, done.stdout + done.stderr
    return {"wall_s": wall, "cpu_s": (after.ru_utime - before.ru_utime
                                      + after.ru_stime - before.ru_stime)}


def fill_sink(job: Job, sink_dsn: str, rows: list[dict[str, object]]) -> None:
    """``job``'s PostgreSQL sink holding ``rows``, as one committed batch leaves it."""
    changes = [OutputChange(tuple(r[k] for k in job.output.key), "c", r, 1, 1, None)
               for r in rows]
    with contextlib.closing(PostgresSink(sink_dsn, job.output.table, job.name,
                                         list(job.output.key), output_schema(job))) as sink:
        assert sink.write(0, changes_to_table(job, changes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=220)
    parser.add_argument("--trips-per-tx", type=int, default=14)
    parser.add_argument("--stops", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("verify_replay_cost.json"))
    args = parser.parse_args()
    result = measure(args)
    text = json.dumps(result, indent=2)
    print(text)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
