"""``txjoin bench --peer flink --peer pathway``: txjoin and its peers on one archived workload.

1. Generate the pizzeria workload (``pizzeria_workload`` + ``Synthesizer``) and
   write it once as Kafka Connect sink files (one file per topic).
2. txjoin: ``jobs/orders.py`` over ``--source files:DIR`` (both sinks: Delta and
   PostgreSQL), ``availableNow`` in micro-batches of ``--max-events-per-trigger``.
   A third, observing sink keeps each batch's changes; after the run they are
   replayed, one observation per batch commit (what a reader of either sink can
   see), against the oracle's ``as_of_fact`` prefixes, array order kept.
3. Flink SQL (PyFlink, streaming mode): seed 001's query over ``debezium-json``
   filesystem tables; its printed changelog is replayed row by row against the
   oracle's ``current`` prefixes (regular joins re-evaluate old orders when a price
   changes, which is the ``current`` semantics), pizzas compared as multisets
   (``JSON_ARRAYAGG`` has no defined order). ``upsert_view`` also reports the
   count without the states between a ``-U`` and its ``+U``.
4. Pathway (``txjoin.peers.pathway_job``): the same query over the same files, each
   table read as upserts by key and committed on Pathway's timer, once with its
   default cadence (``pathway``, 1,500 ms) and once every 100 ms (``pathway-100ms``);
   its output changes are replayed against the same ``current`` prefixes, one
   observation after each of Pathway's times (``every_row``: also inside them).

An inconsistent state is a materialized result equal to the oracle's output after
no committed prefix (``txjoin.peers.consistency``). Throughput is the archive's
records (every topic, BEGIN/END and tombstones included) over each system's
wall time for the query: Spark's after a warm-up query, Flink's from submitting
the job (its mini-cluster start included) to its end, Pathway's ``pw.run()`` (its
graph built before, its interpreter's start not counted).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import pyarrow as pa

from txjoin.errors import ConfigError
from txjoin.ingest.debezium import transaction_topic
from txjoin.job import Job, load_job
from txjoin.peers import PEERS
from txjoin.peers.consistency import (
    ChangelogReplay,
    grouped_prefix_hashes,
    prefix_hashes,
    row_hash,
)
from txjoin.peers.workload import ArchivedWorkload, archive_workload
from txjoin.sinks import OP, OP_DELETE, Upkeep, without_metadata

JOB = Path(__file__).resolve().parents[2] / "jobs" / "orders.py"
# Pathway's commit cadences (autocommit_duration_ms): its default, then a fast one.
PATHWAY_COMMITS_MS = {"pathway": 1500, "pathway-100ms": 100}
COLORS = {"txjoin": "#2b7bba", "flink": "#e6550d", "pathway": "#31a354"}  # the chart's bars


class ObservingSink:
    """Keeps every batch's changes as the real sinks receive them (replayed after the run)."""

    name = "observer"
    where = "memory"

    def __init__(self) -> None:
        self.batches: list[tuple[int, pa.Table]] = []

    def held(self) -> None:
        """Holds no lineage: it lives for one run."""
        return None

    def other_owner(self) -> None:
        """No other job's: it lives for one run."""
        return None

    def begin_rebuild(self, checkpoint_id: str) -> None:
        """Nothing to rebuild: it lives for one run."""

    def finish_rebuild(self) -> None:
        """Nothing to swap."""

    def maintain(self, retention_hours: float | None = None) -> list[Upkeep]:
        """Nothing to maintain: it lives for one run."""
        return []

    def last_applied_batch(self) -> int | None:
        """The last batch kept."""
        return self.batches[-1][0] if self.batches else None

    def write(self, batch_id: int, changes: pa.Table, lineage: Any = None) -> bool:
        """Keep the batch unless it is a replay."""
        if self.batches and batch_id <= self.batches[-1][0]:
            return False
        self.batches.append((batch_id, changes))
        return True

    def read_current(self) -> list[dict]:
        """Not a store: see ``replay``."""
        return []

    def read_changelog(self) -> list[dict]:
        """Every kept change, in order."""
        return [r for _, t in self.batches for r in t.to_pylist()]

    def close(self) -> None:
        """Nothing to release."""

    def replay(self, job: Job, hashes: list[int]) -> ChangelogReplay:
        """Materialize by output key, one observation per batch."""
        replay = ChangelogReplay(hashes, ordered=True)
        current: dict[tuple[Any, ...], dict[str, Any]] = {}
        keys = list(job.output.key)
        for _, table in self.batches:
            for row in table.to_pylist():
                key = tuple(row[k] for k in keys)
                old = current.pop(key, None)
                if old is not None:
                    replay.retract(old)
                if row[OP] != OP_DELETE:
                    value = without_metadata(row)
                    current[key] = value
                    replay.add(value)
            replay.observe()
        return replay


def _sink_hash(rows: list[dict]) -> int:
    return sum(row_hash(without_metadata(r)) for r in rows) % (1 << 128)


def run_txjoin(job: Job, workload: ArchivedWorkload, hashes: list[int], work: Path,
               master: str, max_events: int) -> dict[str, Any]:
    """txjoin over the archive, both sinks; figures and consistency."""
    from txjoin.ingest.spark.files import read_stream
    from txjoin.pipeline.pipeline import Pipeline, RunConfig
    from txjoin.pipeline.run import source_frame
    from txjoin.pipeline.session import get_session
    from txjoin.sinks.build import build_sinks
    from txjoin.stack.postgres import data_root, dsn, start_postgres, stop_postgres
    from txjoin.stack.processes import free_port

    pg_root = data_root(work)
    pg = start_postgres(pg_root, free_port(), work / "logs" / "postgres.log")
    try:
        spark = get_session(master, app_name="txjoin-bench-peers")
        # Warm up (JVM, Python workers) so the measurement does not pay the first query.
        warm = read_stream(spark, str(workload.directory), [], transaction_topic(workload.prefix),
                           1000)
        def count(df: Any, _id: int) -> None:
            df.count()

        (warm.writeStream.foreachBatch(count)
         .option("checkpointLocation", str(work / "warmup-ckpt"))
         .trigger(availableNow=True).start().awaitTermination())

        config = RunConfig(topic_prefix=workload.prefix,
                           source=f"files:{workload.directory}",
                           max_events_per_trigger=max_events,
                           checkpoint_dir=str(work / "ckpt"), output_dir=str(work / "out"),
                           postgres_dsn=dsn(pg.port, "sink"), master=master)
        sinks = build_sinks(job, config, spark)
        observer = ObservingSink()
        # The observer takes the pipeline's writes only: nothing reads it as a sink table
        # (verify's batched reads are not its part).
        pipeline = Pipeline(spark, job, config, [*sinks, observer])  # type: ignore[list-item]
        started = time.monotonic()
        query = pipeline.start(source_frame(spark, job, config, pipeline), available_now=True)
        query.awaitTermination()
        wall = time.monotonic() - started
        reports = pipeline.reports
        replay = observer.replay(job, hashes)
        stages: dict[str, float] = {}
        for r in reports:
            for k, v in r.breakdown.items():
                stages[k] = stages.get(k, 0.0) + v
        sinks_final = {s.name: _sink_hash(s.read_current()) == hashes[-1] for s in sinks}
        for sink in sinks:
            sink.close()
    finally:
        stop_postgres(pg.process)
        shutil.rmtree(pg_root, ignore_errors=True)
    return {
        **throughput(workload, wall),
        "inconsistent_states": replay.result.inconsistent_states,
        "observed_states": replay.result.observed_states,
        "final_equals_oracle": replay.result.final_equals(hashes) and all(sinks_final.values()),
        "sinks_equal_oracle": sinks_final,
        "micro_batches": len(reports),
        "compared_with": "as_of_fact oracle (the job's semantics), array order kept",
        "seconds_by_stage": {k: round(v, 2) for k, v in stages.items()},
    }


def throughput(workload: ArchivedWorkload, seconds: float) -> dict[str, Any]:
    """A system's wall seconds over the archive and its rates: every system's figures
    (txjoin's and each peer's) in the same keys, from the same counts."""
    return {"wall_seconds": round(seconds, 2),
            "events_per_s": round(workload.records / seconds),
            "data_events_per_s": round(workload.data_events / seconds)}


def run_flink_peer(workload: ArchivedWorkload, hashes: list[int], work: Path
                   ) -> dict[str, Any]:
    """Flink SQL over the archive; figures and consistency, or ``skipped`` with the reason."""
    from txjoin.peers.flink import PeerUnavailable, replay_changelog, run_flink

    try:
        run = run_flink(workload.directory, workload.prefix, work / "flink")
    except PeerUnavailable as exc:
        return {"skipped": str(exc)}
    replay = replay_changelog(run.changelog, hashes)
    return {
        **throughput(workload, run.query_s),
        "inconsistent_states": replay.every_row.inconsistent_states,
        "observed_states": replay.every_row.observed_states,
        "final_equals_oracle": replay.every_row.final_equals(hashes),
        "upsert_view": {"inconsistent_states": replay.upsert_view.inconsistent_states,
                        "observed_states": replay.upsert_view.observed_states},
        "changelog_rows": replay.rows,
        "parallelism": run.parallelism,
        "setup_seconds": round(run.setup_s, 2),
        "process_seconds": round(run.process_s, 2),
        "compared_with": "current oracle (regular joins), pizzas as a multiset",
    }


def run_pathway_peer(workload: ArchivedWorkload, hashes: list[int], work: Path,
                     autocommit_ms: int) -> dict[str, Any]:
    """Pathway over the archive at one commit cadence; figures and consistency, or
    ``skipped`` with the reason."""
    from txjoin.peers.environment import PeerUnavailable
    from txjoin.peers.pathway import replay_changes, run_pathway

    try:
        run = run_pathway(workload.directory, workload.prefix,
                          work / f"pathway-{autocommit_ms}ms", autocommit_ms)
    except PeerUnavailable as exc:
        return {"skipped": str(exc)}
    replay = replay_changes(run.changes, hashes)
    return {
        **throughput(workload, run.query_s),
        "inconsistent_states": replay.per_time.inconsistent_states,
        "observed_states": replay.per_time.observed_states,
        "final_equals_oracle": replay.per_time.final_equals(hashes),
        "every_row": {"inconsistent_states": replay.every_row.inconsistent_states,
                      "observed_states": replay.every_row.observed_states},
        "changelog_rows": replay.rows,
        "autocommit_ms": run.autocommit_ms,
        "commit_to_output_ms": run.commit_to_output_ms,
        "pathway_version": run.version,
        "setup_seconds": round(run.setup_s, 2),
        "process_seconds": round(run.process_s, 2),
        "read_seconds": round(run.read_s, 2),
        "compared_with": "current oracle (regular joins), pizzas as a multiset; "
                         "one observation per Pathway time",
    }


def run_peer_bench(transactions: int, seed: int, out: Path, chart: Path | None,
                   peers: tuple[str, ...], source_dir: Path | None, master: str,
                   max_events: int, keep: bool = False) -> dict[str, Any]:
    """The whole comparison; writes ``out`` (JSON) and ``chart`` (PNG) if given."""
    job = load_job(JOB)
    work = Path(tempfile.mkdtemp(prefix="txjoin-peers-"))
    archive = source_dir if source_dir is not None else work / "archive"
    if archive.exists() and any(archive.iterdir()):
        raise ConfigError(f"--source files:{archive}: the directory must be empty or missing "
                          "(the benchmark writes its workload there)")
    try:
        workload = archive_workload(job, archive, transactions, seed)
        click.echo(f"workload: {len(workload.transactions)} transactions, "
                   f"{workload.data_events} data events, {workload.records} records, "
                   f"archived in {archive}")
        started = time.monotonic()
        as_of = prefix_hashes(job, workload.snapshot, workload.transactions)
        current = (grouped_prefix_hashes(job, workload.snapshot, workload.transactions)
                   if peers else [])
        oracle_s = time.monotonic() - started
        result: dict[str, Any] = {
            "transactions": len(workload.transactions), "records": workload.records,
            "data_events": workload.data_events, "seed": seed, "master": master,
            "max_events_per_trigger": max_events, "oracle_seconds": round(oracle_s, 2),
            "peers": {}}
        click.echo(f"oracle prefixes: {oracle_s:.1f}s")
        result["peers"]["txjoin"] = run_txjoin(job, workload, as_of, work, master, max_events)
        click.echo(f"txjoin: {_line(result['peers']['txjoin'])}")
        for name in peers:
            if name not in PEERS:
                raise ConfigError(f"--peer {name!r}: known peers are {', '.join(PEERS)}")
            runs = ({name: lambda: run_flink_peer(workload, current, work)} if name == "flink"
                    else {label: lambda ms=ms: run_pathway_peer(workload, current, work, ms)
                          for label, ms in PATHWAY_COMMITS_MS.items()})
            for label, run in runs.items():
                result["peers"][label] = run()
                click.echo(f"{label}: {_line(result['peers'][label])}")
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if chart is not None:
        draw_chart(result, chart)
    return result


def _line(peer: dict[str, Any]) -> str:
    if "skipped" in peer:
        return f"skipped: {peer['skipped']}"
    return (f"{peer['events_per_s']} records/s ({peer['wall_seconds']}s), "
            f"{peer['inconsistent_states']:,} inconsistent of {peer['observed_states']:,} "
            f"observed states, final equals oracle: {peer['final_equals_oracle']}")


def draw_chart(result: dict[str, Any], path: Path) -> None:
    """Throughput bars and inconsistent-state counts, side by side (matplotlib, PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = {n: p for n, p in result["peers"].items() if "skipped" not in p}
    names = list(ran)
    colors = [COLORS.get(n.split("-")[0], "#e6550d") for n in names]
    fig, (left, right) = plt.subplots(1, 2, figsize=(4 + 1.6 * len(names), 3.8))
    speed = [ran[n]["events_per_s"] for n in names]
    left.bar(names, speed, color=colors)
    left.set_title("source records/s (higher is better)")
    for i, v in enumerate(speed):
        left.annotate(f"{v:,}", (i, v), ha="center", va="bottom")
    bad = [ran[n]["inconsistent_states"] for n in names]
    right.bar(names, bad, color=colors)
    right.set_title("inconsistent observable states")
    for i, n in enumerate(names):
        right.annotate(f"{bad[i]:,} of {ran[n]['observed_states']:,}", (i, bad[i]),
                       ha="center", va="bottom")
    for ax in (left, right):
        ax.margins(y=0.2)
    fig.suptitle(f"{result['transactions']:,} transactions, {result['records']:,} records, "
                 "same archived Debezium files")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
