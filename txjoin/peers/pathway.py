"""Start the Pathway peer (``pathway_job``) in an interpreter that has Pathway; replay its output.

Pathway lives in its own virtualenv (``scripts/pathway-env.sh`` makes ``.venv-pathway``;
``$TXJOIN_PATHWAY_PYTHON`` points at another interpreter): never in txjoin's. A missing
interpreter, or a job that fails, makes the peer unavailable with a one-line reason;
the benchmark goes on without it.

Its output (``pw.io.jsonlines.write``: every change of the result with Pathway's
``time`` and ``diff``) is replayed in file order. Pathway applies all the changes of
one ``time`` at once (a commit of its inputs), so a reader of its output can see the
result after each time: that is ``per_time``. A reader of the file as it is written
(or of a sink that applies rows one by one) can also see the states inside a time:
that is ``every_row``, counted as Flink's changelog rows are.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from txjoin.peers.consistency import (
    PRIME,
    ROW_CONSTANT,
    ChangelogReplay,
    Observation,
    value_hash,
)
from txjoin.peers.environment import ROOT, PeerEnvironment, PeerUnavailable, last_error
from txjoin.peers.pathway_job import DEFAULT_AUTOCOMMIT_MS

PATHWAY = PeerEnvironment("Pathway", ".venv-pathway", "pathway", "pathway")


@dataclass
class PathwayRun:
    """One run of the Pathway job: its output changes and timings."""

    changes: Path
    setup_s: float
    query_s: float
    process_s: float
    autocommit_ms: int
    version: str
    commit_to_output_ms: dict[str, float]  # per time: its output complete - its commit
    read_s: float  # the slowest table subject's feeding of the engine (Python)


def run_pathway(archive: Path, prefix: str, workdir: Path,
                autocommit_ms: int = DEFAULT_AUTOCOMMIT_MS, timeout_s: float = 3600.0
                ) -> PathwayRun:
    """Run the Pathway job over ``archive``; its output lands in ``workdir``."""
    python = PATHWAY.python()
    workdir.mkdir(parents=True, exist_ok=True)
    changes, log, summary = (workdir / "pathway-changes.jsonl", workdir / "pathway.log",
                             workdir / "pathway-summary.json")
    # Pathway's telemetry and licence checks are off: the run is offline by design.
    env = dict(os.environ, PYTHONPATH=str(ROOT), PATHWAY_TELEMETRY_DISABLED="1")
    started = time.monotonic()
    with log.open("w") as err:
        proc = subprocess.run(
            [python, "-m", "txjoin.peers.pathway_job", "--archive", str(archive), "--prefix",
             prefix, "--out", str(changes), "--summary", str(summary), "--autocommit-ms",
             str(autocommit_ms)],
            stdout=err, stderr=err, env=env, cwd=str(workdir), timeout=timeout_s, check=False)
    process_s = time.monotonic() - started
    if proc.returncode != 0 or not summary.exists():
        raise PeerUnavailable(f"the Pathway job failed (exit {proc.returncode}): "
                              f"{last_error(log)} (log: {log})")
    info = json.loads(summary.read_text())
    return PathwayRun(changes, info["setup_s"], info["query_s"], process_s,
                      info["autocommit_ms"], info["pathway_version"],
                      info["commit_to_output_ms"], info["read_s"])


@dataclass
class PathwayReplay:
    """Pathway's output against the prefixes, after each of its times and at every row."""

    per_time: Observation
    every_row: Observation
    rows: int
    times: int


def replay_changes(changes: Path, hashes: list[int]) -> PathwayReplay:
    """Materialize the output changes in file order and check every state.

    ``hashes``: ``grouped_prefix_hashes`` of the ``current`` output (pizzas as a multiset).
    """
    # grouped_row_hash from the written fields, with caches: rows repeat a few thousand
    # element lists, and each order's key several times.
    bases: dict[tuple[int, str, str], int] = {}
    element_sums: dict[str, int] = {}
    per_time = ChangelogReplay(hashes, modulus=PRIME)
    every = ChangelogReplay(hashes, modulus=PRIME)
    rows, times, current_time = 0, 0, None
    with changes.open(encoding="utf-8") as fh:
        for line in fh:
            change = json.loads(line)
            if change["time"] != current_time:
                if current_time is not None:
                    per_time.observe()
                current_time = change["time"]
                times += 1
            key = (change["order_id"], change["client_name"], change["table_name"])
            base = bases.get(key)
            if base is None:
                base = bases[key] = value_hash(dict(zip(
                    ("order_id", "client_name", "table_name"), key, strict=True)))
            pizzas = json.dumps(change["pizzas"])
            elements = element_sums.get(pizzas)
            if elements is None:
                # prices were read as Debezium's decimal strings: the oracle's values
                elements = element_sums[pizzas] = (ROW_CONSTANT + sum(
                    value_hash({"pizza": name, "price": Decimal(price)})
                    for name, price in change["pizzas"])) % PRIME
            h = base * elements % PRIME * change["diff"]
            rows += 1
            for replay in (per_time, every):
                replay.hash = (replay.hash + h) % PRIME
            every.observe()
    if current_time is not None:
        per_time.observe()
    return PathwayReplay(per_time.result, every.result, rows, times)
