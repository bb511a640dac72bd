"""Lineage: which checkpoint, and how far into the source, a sink's contents come from.

Spark's batch ids restart at 0 with every new checkpoint, so a sink that only
remembers the last batch id would take a wiped checkpoint's batch 0 for a
replay and silently skip it. Every sink therefore records, in the same commit
as each batch, the checkpoint's identity (a UUID written into the checkpoint
directory when txjoin creates it), the batch id within that checkpoint, the
frontier (last released commit sequence) and the xid of the last change it
applied. ``check_lineage`` compares that with the checkpoint before a run
starts: a sink written from another checkpoint, or a sink behind its
checkpoint, stops the run with one line naming the sink, what it holds and the
two ways out (restore the checkpoint, or ``txjoin run --rebuild``). The lineage also
names the job that wrote it: ``check_owners`` stops a run whose sink tables another job
wrote, naming that job.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from txjoin.errors import LineageError

if TYPE_CHECKING:
    from txjoin.sinks import Sink

LINEAGE_FILE = "txjoin-lineage.json"


@dataclass(frozen=True)
class Lineage:
    """What a run tells a sink with each batch: its checkpoint and the frontier after it."""

    checkpoint_id: str | None
    frontier_commit_seq: int | None = None


@dataclass(frozen=True)
class Held:
    """What a sink holds: the last batch it applied and where that batch came from."""

    checkpoint_id: str | None  # None: written before sinks recorded lineage
    last_batch_id: int  # -1: rebuilt from a source that had nothing yet
    frontier_commit_seq: int | None
    last_change_xid: int | None
    job: str | None = None  # the job whose run wrote it; None: not recorded

    def describe(self) -> str:
        origin = (f"checkpoint {short(self.checkpoint_id)}" if self.checkpoint_id
                  else "an unrecorded checkpoint")
        frontier = ("" if self.frontier_commit_seq is None
                    else f", frontier commit_seq {self.frontier_commit_seq}")
        return f"batch {self.last_batch_id}{frontier} of {origin}"


def short(checkpoint_id: str | None) -> str:
    return "-" if checkpoint_id is None else checkpoint_id[:8]


def checkpoint_id(path: str | Path) -> str | None:
    """The identity recorded in checkpoint ``path``, ``None`` if txjoin did not create it."""
    try:
        return str(json.loads((Path(path) / LINEAGE_FILE).read_text())["id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class Checkpoint:
    """A job's Spark checkpoint directory and its txjoin identity."""

    path: Path
    id: str
    new: bool  # no batch was ever committed in it
    adopted: bool  # it predates lineage files (sinks with no recorded lineage match it)
    last_committed_batch: int | None

    @classmethod
    def open(cls, path: str | Path) -> Checkpoint:
        """The checkpoint at ``path``, created (with a new identity) if missing.

        A checkpoint with batches but no identity predates lineage: it gets one,
        marked ``adopted`` for good, so sinks written before lineage existed (no
        recorded checkpoint) keep matching it until their next batch records it.
        """
        path = Path(path)
        committed = _last_committed(path)
        lineage = path / LINEAGE_FILE
        try:
            doc = json.loads(lineage.read_text())
            return cls(path, str(doc["id"]), committed is None, bool(doc.get("adopted")),
                       committed)
        except (OSError, ValueError, KeyError, TypeError):
            pass
        doc = {"id": uuid.uuid4().hex, "adopted": committed is not None}
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / f".{LINEAGE_FILE}.tmp"
        tmp.write_text(json.dumps(doc) + "\n")
        tmp.replace(lineage)
        return cls(path, doc["id"], committed is None, doc["adopted"], committed)

    @classmethod
    def fresh(cls, path: str | Path) -> tuple[Checkpoint, Path | None]:
        """A new checkpoint at ``path``; an existing one is moved to ``<path>.before-rebuild``."""
        path = Path(path)
        moved = None
        if path.exists():
            moved = path.with_name(path.name + ".before-rebuild")
            shutil.rmtree(moved, ignore_errors=True)
            path.rename(moved)
        return cls.open(path), moved

    def describe(self) -> str:
        state = ("new, no batch yet" if self.last_committed_batch is None
                 else f"at batch {self.last_committed_batch}")
        return f"the checkpoint {self.path} is {short(self.id)} ({state})"


def _last_committed(path: Path) -> int | None:
    commits = path / "commits"
    ids = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    return max(ids) if ids else None


def mismatch(sink: Sink, held: Held | None, checkpoint: Checkpoint) -> str | None:
    """Why ``sink`` cannot continue from ``checkpoint`` (``None``: it can)."""
    if held is None:
        if checkpoint.last_committed_batch is None:
            return None
        holds = "nothing"
    elif held.checkpoint_id == checkpoint.id or (held.checkpoint_id is None
                                                 and checkpoint.adopted):
        if (checkpoint.last_committed_batch is None
                or held.last_batch_id >= checkpoint.last_committed_batch):
            return None
        holds = held.describe() + ", behind it"
    else:
        holds = held.describe()
    return (f"{sink.name} sink {sink.where} holds {holds}, but {checkpoint.describe()}: "
            "continuing would skip or lose changes; run with --rebuild to re-derive the sinks "
            "from the source (readers keep the old state until the rebuild is complete), or "
            "restore the checkpoint the sink was written with")


def with_handed_off(held: Held | None, checkpoint: Checkpoint, pending: list[int]) -> Held | None:
    """What a sink will hold once the batches of ``checkpoint`` handed off to it and not
    committed yet (``pending``, in the checkpoint's hand-off folder) are committed: they
    follow its last batch when it is of the same checkpoint (or holds nothing)."""
    if not pending or (held is not None and held.checkpoint_id != checkpoint.id):
        return held
    following = 0 if held is None else held.last_batch_id + 1
    for batch_id in sorted(pending):  # only an unbroken run of batches after its last counts
        if batch_id == following:
            following += 1
        elif batch_id > following:
            break
    if held is not None and following == held.last_batch_id + 1:
        return held
    if held is None and following == 0:
        return None
    return Held(checkpoint.id, following - 1, None if held is None else held.frontier_commit_seq,
                None if held is None else held.last_change_xid)


def check_owners(sinks: Iterable[Sink], job: str, job_file: str) -> None:
    """Raise ``LineageError`` for the first sink whose tables another job's lineage holds:
    two jobs writing one table would interleave their rows and progress (a second job
    compiled from the same view, with the same output table). Checked with ``--rebuild``
    too, which would replace the other job's output with this one's."""
    for sink in sinks:
        other = sink.other_owner()
        if other is not None:
            owner, release = other
            raise LineageError(
                f"{sink.name} sink {sink.where} is job {owner!r}'s output (its lineage names "
                f"that job), not job {job!r}'s: this run would write another job's table; give "
                f"{job!r} a table of its own with Output(table=...) in {job_file} (`txjoin job "
                f"from-sql --output-table T`), or, if job {owner!r} is retired, {release}")


def check_lineage(sinks: Iterable[Sink], checkpoint: Checkpoint,
                  handed_off: dict[str, list[int]] | None = None) -> None:
    """Raise ``LineageError`` for the first sink that does not match ``checkpoint``;
    ``handed_off``: sink name -> batches handed off to it and not committed yet."""
    for sink in sinks:
        held = with_handed_off(sink.held(), checkpoint, (handed_off or {}).get(sink.name, []))
        problem = mismatch(sink, held, checkpoint)
        if problem is not None:
            raise LineageError(problem)
