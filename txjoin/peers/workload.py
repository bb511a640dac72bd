"""The benchmark's workload, generated once and archived in Kafka Connect's sink layout."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txjoin.export import write_records
from txjoin.ingest.debezium import DEFAULT_TOPIC_PREFIX
from txjoin.job import Job
from txjoin.join.oracle import SourceTransaction
from txjoin.scenarios.synthesize import Produced, Synthesizer
from txjoin.scenarios.workload import pizzeria_workload

# One file per topic-partition: Flink's file source reads the files of a folder
# in no particular order, which would scramble a changelog split across files.
ONE_FILE = 10**9


@dataclass
class ArchivedWorkload:
    """What was written: the source transactions (for the oracle) and record counts."""

    directory: Path
    prefix: str
    snapshot: dict[str, list[dict[str, Any]]]
    transactions: list[SourceTransaction]
    records: int
    data_events: int
    topics: list[str]


def archive_workload(job: Job, directory: Path, transactions: int, seed: int,
                     prefix: str = DEFAULT_TOPIC_PREFIX, records_per_file: int = ONE_FILE
                     ) -> ArchivedWorkload:
    """Generate ``pizzeria_workload(transactions, seed)``, synthesize its records, archive."""
    snapshot, txs = pizzeria_workload(transactions, seed)
    synth = Synthesizer(job, prefix=prefix)
    produced: list[Produced] = list(synth.snapshot(snapshot))
    for tx in txs:
        produced.extend(synth.transaction(tx))
    for topic, records in synth.topics.items():
        if records:
            write_records(directory, topic, 0, 0, [r.value for r in records], records_per_file)
    return ArchivedWorkload(
        directory, prefix, snapshot, txs, len(produced),
        sum(1 for r in produced if r.kind in ("data", "snapshot")), list(synth.topics))
