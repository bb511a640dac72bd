"""Start the Flink SQL peer (``flink_job``) in an interpreter that has PyFlink; replay its output.

PyFlink 2.3 pins numpy, pandas, pyarrow and py4j below what pyspark 4.2 needs, so
it normally lives in its own virtualenv. The interpreter is, in this order:
``$TXJOIN_FLINK_PYTHON``, this one if it can import pyflink, ``.venv-flink/bin/python``
at the repository root. Anything missing (interpreter, Java, a usable archive)
makes the peer unavailable with a one-line reason; the benchmark goes on without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from txjoin.peers.consistency import (
    PRIME,
    ROW_CONSTANT,
    ChangelogReplay,
    Observation,
    value_hash,
)
from txjoin.peers.environment import ROOT, PeerEnvironment, PeerUnavailable, last_error
from txjoin.peers.flink_job import TABLES, parse_line, table_folder

FLINK = PeerEnvironment("PyFlink", ".venv-flink", "pyflink.table", "pyflink")


@dataclass
class FlinkRun:
    """One run of the Flink job: its printed changelog and timings."""

    changelog: Path
    setup_s: float
    query_s: float
    process_s: float
    parallelism: int


def check_archive(archive: Path, prefix: str) -> None:
    """Flink's file source reads the files of a folder in no defined order: one file per table."""
    for table in TABLES:
        folder = Path(table_folder(str(archive), prefix, table))
        files = [p for p in folder.glob("*.json")] if folder.is_dir() else []
        if len(files) > 1:
            raise PeerUnavailable(f"{folder} holds {len(files)} files; Flink's filesystem source "
                                  "would read them in no defined order (one file per table)")


def run_flink(archive: Path, prefix: str, workdir: Path, parallelism: int = 2,
              timeout_s: float = 3600.0) -> FlinkRun:
    """Run the Flink job over ``archive``; the changelog lands in ``workdir``."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise PeerUnavailable("no Java found (PyFlink needs Java 11 or 17)")
    check_archive(archive, prefix)
    python = FLINK.python()
    workdir.mkdir(parents=True, exist_ok=True)
    changelog, log, summary = (workdir / "flink-changelog.txt", workdir / "flink.log",
                               workdir / "flink-summary.json")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    started = time.monotonic()
    with changelog.open("w") as out, log.open("w") as err:
        proc = subprocess.run(
            [python, "-m", "txjoin.peers.flink_job", "--archive", str(archive), "--prefix",
             prefix, "--summary", str(summary), "--parallelism", str(parallelism)],
            stdout=out, stderr=err, env=env, cwd=str(workdir), timeout=timeout_s, check=False)
    process_s = time.monotonic() - started
    if proc.returncode != 0 or not summary.exists():
        raise PeerUnavailable(f"the Flink job failed (exit {proc.returncode}): "
                              f"{last_error(log)} (log: {log})")
    info = json.loads(summary.read_text())
    return FlinkRun(changelog, info["setup_s"], info["query_s"], process_s, parallelism)


@dataclass
class FlinkReplay:
    """The Flink changelog against the prefixes, at every row and in an upsert view."""

    every_row: Observation
    upsert_view: Observation  # not observing between a -U and the +U that follows it
    rows: int


def replay_changelog(changelog: Path, hashes: list[int]) -> FlinkReplay:
    """Materialize the printed changelog in emission order and check every state.

    ``hashes``: ``grouped_prefix_hashes`` of the ``current`` output (pizzas as a multiset).
    """
    # grouped_row_hash, from the printed fields with caches: millions of rows repeat
    # a few thousand element lists, and each order's key many times.
    bases: dict[tuple[int, str, str], int] = {}
    element_sums: dict[str, int] = {}
    every = ChangelogReplay(hashes, modulus=PRIME)
    upsert = ChangelogReplay(hashes, modulus=PRIME)
    rows = 0
    with changelog.open(encoding="utf-8") as fh:
        for line in fh:
            parsed = parse_line(line)
            if parsed is None:
                continue
            kind, order_id, client, table, pizzas = parsed
            base = bases.get((order_id, client, table))
            if base is None:
                base = bases[(order_id, client, table)] = value_hash(
                    {"order_id": order_id, "client_name": client, "table_name": table})
            elements = element_sums.get(pizzas)
            if elements is None:
                elements = element_sums[pizzas] = (ROW_CONSTANT + sum(
                    value_hash(e) for e in json.loads(pizzas))) % PRIME
            h = base * elements % PRIME
            rows += 1
            for replay in (every, upsert):
                replay.hash = (replay.hash + (h if kind[0] == "+" else -h)) % PRIME
            every.observe()
            if kind != "-U":
                upsert.observe()
    return FlinkReplay(every.result, upsert.result, rows)
