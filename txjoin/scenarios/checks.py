"""The checks of a scenario run, independent of where the rows come from.

The core runner feeds them the engine's output; the Spark harness feeds them
what the sinks hold. Rows are plain dicts (output columns, possibly with extra
columns such as ``_commit_seq``, which are ignored). Values compare by value
(SCENARIOS.md): numbers numerically whatever their type (``Decimal("9.50")``
equals ``9.5``; a string is never a number), timestamps as instants (a
``datetime`` or an ISO string; naive means UTC), lists in order, and only the
columns (and struct fields) the expected row lists. Rows compare in any order.

Every check returns a :class:`CheckResult` (``ok, message``);
:func:`check_prefix_consistent` also returns the prefix it matched after each
batch. Messages carry a row diff: missing, extra and different rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from txjoin.join.oracle import outputs_after_each, outputs_by_source_prefixes
from txjoin.sinks import without_metadata
from txjoin.verify.diff import (
    canonical,
    diff_rows,
    row_key,
    rows_match,
    show,
)

if TYPE_CHECKING:
    from txjoin.scenarios.schedule import Schedule
    from txjoin.scenarios.spec import Scenario

Row = dict[str, Any]



class CheckResult(NamedTuple):
    """Outcome of one check."""

    ok: bool
    message: str


class PrefixResult(NamedTuple):
    """Outcome of the prefix check: ``k_per_batch[i]`` is the oracle prefix matched after
    batch i (``None``: empty, nothing released yet)."""

    ok: bool
    k_per_batch: list[int | None]
    message: str


def _oracle_rows(state: Mapping[Any, Row]) -> list[Row]:
    return list(state.values())


def _prefix_name(k: int | None, names: Sequence[str] | None) -> str:
    if k is None:
        return "nothing released"
    if k == 0:
        return "the snapshot"
    if names is not None and 0 < k <= len(names):
        return f"{names[k - 1]} (#{k})"
    return f"T{k}"


# -- the checks -----------------------------------------------------------------------------------


def check_prefix_consistent(observed: Sequence[Sequence[Mapping[str, Any]]],
                            oracle_prefixes: Sequence[Mapping[Any, Row]],
                            key_columns: Sequence[str] = (),
                            labels: Sequence[str] | None = None,
                            tx_names: Sequence[str] | None = None) -> PrefixResult:
    """After every batch the output equals the oracle after some prefix, k never decreasing.

    ``observed[i]``: the current rows after batch i. ``oracle_prefixes``: from
    :func:`~txjoin.join.oracle.outputs_after_each` (index 0 = after the
    snapshot). An empty output before anything is released matches "nothing"
    (``None``), which ranks below every prefix. When several prefixes match (a
    transaction that changed no output), the smallest one not below the
    previous batch's is taken: that choice never rules out a later batch.
    """
    ks: list[int | None] = []
    last = -1
    for i, rows in enumerate(observed):
        label = labels[i] if labels is not None else f"batch {i}"
        rows = list(rows)
        found = None
        if not rows and last == -1:
            found = -1
        else:
            for k in range(max(last, 0), len(oracle_prefixes)):
                if diff_rows(_oracle_rows(oracle_prefixes[k]), rows, key_columns).ok:
                    found = k
                    break
        if found is None:
            candidates = range(max(last, 0), len(oracle_prefixes))
            best = min(candidates, key=lambda k: diff_rows(
                _oracle_rows(oracle_prefixes[k]), rows, key_columns).size, default=None)
            detail = ""
            if best is not None:
                diff = diff_rows(_oracle_rows(oracle_prefixes[best]), rows, key_columns)
                detail = (f"\n  closest: the oracle's output after "
                          f"{_prefix_name(best, tx_names)}; expected vs actual rows:\n"
                          + diff.format("    "))
            went_back = any(diff_rows(_oracle_rows(oracle_prefixes[k]), rows, key_columns).ok
                            for k in range(0, last))
            why = (f"it equals an earlier prefix than after batch {i - 1} "
                   f"(the output went back)" if went_back else
                   "it is not the oracle's output after any committed prefix "
                   "(a torn transaction or a lookup of the wrong state)")
            since = "" if last < 0 else f" at or after {_prefix_name(last, tx_names)}"
            return PrefixResult(False, ks, f"prefix_consistent failed after {label}: {why}"
                                           f"{since}.{detail}")
        ks.append(None if found == -1 else found)
        last = found
    return PrefixResult(True, ks, "")


def check_source_prefixes_consistent(observed: Sequence[Sequence[Mapping[str, Any]]],
                                     grid: Mapping[tuple[int, ...], Mapping[Any, Row]],
                                     sources: Sequence[str],
                                     key_columns: Sequence[str] = (),
                                     labels: Sequence[str] | None = None) -> PrefixResult:
    """Several sources: after every batch the output equals the oracle's on (S1 after some
    k1, S2 after some k2, ...), no k ever decreasing (``grid``: from
    :func:`~txjoin.join.oracle.outputs_by_source_prefixes`).

    Every tuple that matches is kept (a transaction that changed no output makes
    several match), so no choice made after one batch rules out a later one.
    ``k_per_batch`` holds the number of batches that passed (no single k exists).
    """
    possible: set[tuple[int, ...]] | None = None  # None: nothing released yet
    for i, rows in enumerate(observed):
        label = labels[i] if labels is not None else f"batch {i}"
        rows = list(rows)
        if not rows and possible is None:
            continue
        candidates = [c for c in grid if possible is None or any(
            all(a >= b for a, b in zip(c, p, strict=True)) for p in possible)]
        matched = {c for c in candidates
                   if diff_rows(_oracle_rows(grid[c]), rows, key_columns).ok}
        if not matched:
            best = min(candidates, key=lambda c: diff_rows(
                _oracle_rows(grid[c]), rows, key_columns).size, default=None)
            detail = ""
            if best is not None:
                diff = diff_rows(_oracle_rows(grid[best]), rows, key_columns)
                named = ", ".join(f"{s} after {k}" for s, k in zip(sources, best, strict=True))
                detail = (f"\n  closest: the oracle's output on ({named}); expected vs actual "
                          f"rows:\n" + diff.format("    "))
            return PrefixResult(
                False, [None] * i,
                f"prefix_consistent failed after {label}: the output is not the job on one "
                f"committed prefix per source, each at or after the previous batch's (a torn "
                f"transaction, a lookup of the wrong state, or a source going back).{detail}")
        possible = matched
    return PrefixResult(True, [None] * len(observed), "")


def check_final(actual: Sequence[Mapping[str, Any]], oracle_final: Mapping[Any, Row],
                key_columns: Sequence[str] = ()) -> CheckResult:
    """At the end the output equals the oracle after the last transaction."""
    diff = diff_rows(_oracle_rows(oracle_final), actual, key_columns)
    if diff.ok:
        return CheckResult(True, "")
    return CheckResult(False, "final_equals_oracle failed at the end: the output is not the "
                              "oracle's after the last transaction; expected vs actual rows:\n"
                       + diff.format())


def check_expect_final(expected: Sequence[Mapping[str, Any]], actual: Sequence[Mapping[str, Any]],
                       key_columns: Sequence[str] = ()) -> CheckResult:
    """The hand-written ``expect.final`` rows (listed columns, any order) are exactly the output."""
    diff = diff_rows(expected, actual, key_columns)
    if diff.ok:
        return CheckResult(True, "")
    return CheckResult(False, "expect.final failed at the end; expected vs actual rows:\n"
                       + diff.format())


def frontier_name(commit_seq: int | None, tx_names: Sequence[str]) -> str | None:
    """``None`` (nothing released), ``"snapshot"`` (0) or the name of transaction #commit_seq."""
    if commit_seq is None:
        return None
    if commit_seq == 0:
        return "snapshot"
    return tx_names[commit_seq - 1] if commit_seq <= len(tx_names) else f"#{commit_seq}"


def check_frontier(expected: Mapping[int, str | None],
                   released: Mapping[int, int | None] | Sequence[int | None],
                   tx_names: Sequence[str]) -> CheckResult:
    """The last released transaction after each listed batch is the one ``expect.frontier`` says.

    ``released[i]``: the commit sequence of the last transaction released
    after batch i: ``c > 0`` is transaction #c in file order, ``0`` means
    only the snapshot was released, ``None`` nothing at all.
    """
    seqs = dict(enumerate(released)) if not isinstance(released, Mapping) else released
    for batch in sorted(expected):
        want = expected[batch]
        if batch not in seqs:
            return CheckResult(False, f"frontier failed after batch {batch}: the run did not "
                                      f"report that batch")
        got = frontier_name(seqs[batch], tx_names)
        if got != want:
            return CheckResult(False, f"frontier failed after batch {batch}: expected the "
                                      f"output to reflect {_frontier_text(want)}, it reflects "
                                      f"{_frontier_text(got)}")
    return CheckResult(True, "")


def _frontier_text(name: str | None) -> str:
    if name is None:
        return "nothing yet (null)"
    if name == "snapshot":
        return "only the snapshot"
    return f"transactions up to {name}"


def check_exactly_once(changelog: Sequence[Mapping[str, Any]], key_columns: Sequence[str],
                       current: Sequence[Mapping[str, Any]],
                       oracle_prefixes: Sequence[Mapping[Any, Row]] | None = None,
                       upto: int | None = None,
                       tx_names: Sequence[str] | None = None) -> CheckResult:
    """Each change applied once, checked against the source when the oracle is given.

    - no (key, ``_xid``) twice and no (key, ``_commit_seq``) twice (a transaction is its
      ``_xid`` in its ``_source`` where the changelog has that column);
    - each source transaction (``_xid``) under one ``_commit_seq``, and one ``_xid`` per
      ``_commit_seq`` (a transaction applied again under a new sequence fails);
    - with ``oracle_prefixes`` (the oracle's output after the snapshot, T1, T2, ...): the
      changelog replayed in ``_commit_seq`` order up to each k in ``0..upto`` equals the
      oracle's output after T_k (a lost intermediate version fails, even when a later
      change to the key hides it in the current rows). ``upto`` defaults to the last
      oracle prefix: pass the sink's frontier when it is not at the end;
    - the changelog replayed to its end gives ``current`` (the sink's own current rows).

    Changelog rows carry ``_op`` (``c``/``u``/``d``; ``insert``/``update``/
    ``delete`` accepted), ``_commit_seq``, ``_xid`` and the output columns.
    """
    if any(row.get("_xid") is None for row in changelog):
        return CheckResult(False, "exactly_once failed: a changelog row has no _xid (the "
                                  "source transaction), so a replay cannot be told apart")
    by_xid: Counter[tuple[Any, ...]] = Counter()
    by_seq: Counter[tuple[Any, ...]] = Counter()
    seqs_of: dict[Any, set[int]] = {}
    xids_of: dict[int, set[Any]] = {}
    for row in changelog:
        key = row_key(row, key_columns)
        seq = int(row.get("_commit_seq") or 0)
        # a transaction is its xid in its source database (xids of two databases collide)
        xid = canonical(row["_xid"]) if row.get("_source") is None \
            else f"{row['_source']}:{canonical(row['_xid'])}"
        by_xid[(*key, xid)] += 1
        by_seq[(*key, seq)] += 1
        seqs_of.setdefault(xid, set()).add(seq)
        xids_of.setdefault(seq, set()).add(xid)
    twice = [k for k, n in by_xid.items() if n > 1]
    if twice:
        shown = ", ".join(f"key {show(list(k[:-1]))} of _xid {k[-1]}" for k in twice[:5])
        return CheckResult(False, f"exactly_once failed: the changelog holds a change twice for "
                                  f"{shown} (a transaction's effect applied twice)")
    twice = [k for k, n in by_seq.items() if n > 1]
    if twice:
        shown = ", ".join(f"key {show(list(k[:-1]))} at _commit_seq {k[-1]}" for k in twice[:5])
        return CheckResult(False, f"exactly_once failed: the changelog holds a change twice for "
                                  f"{shown} (a transaction's effect applied twice)")
    again = {x: sorted(s) for x, s in seqs_of.items() if len(s) > 1}
    if again:
        shown = ", ".join(f"_xid {x} at _commit_seq {s}" for x, s in list(again.items())[:5])
        return CheckResult(False, f"exactly_once failed: a source transaction is in the "
                                  f"changelog under several commit sequences: {shown} (applied "
                                  f"again as a new transaction)")
    shared = {q: sorted(map(str, x)) for q, x in xids_of.items() if len(x) > 1}
    if shared:
        shown = ", ".join(f"_commit_seq {q}: _xid {x}" for q, x in list(shared.items())[:5])
        return CheckResult(False, f"exactly_once failed: several source transactions under one "
                                  f"commit sequence: {shown}")
    ordered = [row for _, row in sorted(enumerate(changelog), key=lambda p: (
        int(p[1].get("_commit_seq") or 0), p[0]))]
    replayed: dict[tuple[Any, ...], Row] = {}
    at = 0  # next changelog row to replay
    if oracle_prefixes is not None:
        if not key_columns:
            raise ValueError("check_exactly_once: the oracle replay needs the output's key")
        last = len(oracle_prefixes) - 1 if upto is None else upto
        if last >= len(oracle_prefixes):
            return CheckResult(False, f"exactly_once failed: the sink's frontier T{last} is past "
                                      f"the source's last transaction T{len(oracle_prefixes) - 1}")
        beyond = [int(r.get("_commit_seq") or 0) for r in ordered[-1:]
                  if int(r.get("_commit_seq") or 0) > last]
        if beyond:
            return CheckResult(False, f"exactly_once failed: the changelog holds _commit_seq "
                                      f"{beyond[0]}, past the frontier T{last}")
        oracle_keyed = [{row_key(r, key_columns): r for r in _oracle_rows(p)}
                        for p in oracle_prefixes[:last + 1]]
        for k in range(last + 1):
            touched: set[tuple[Any, ...]] = set()
            while at < len(ordered) and int(ordered[at].get("_commit_seq") or 0) <= k:
                row = ordered[at]
                key = row_key(row, key_columns)
                touched.add(key)
                if str(row.get("_op", "")).lower() in ("d", "delete"):
                    replayed.pop(key, None)
                else:
                    replayed[key] = without_metadata(dict(row))
                at += 1
            want, before = oracle_keyed[k], oracle_keyed[k - 1] if k else {}
            # Keys neither the changelog nor the oracle changed at k were checked at k-1.
            if k:
                touched |= {key for key in want.keys() | before.keys()
                            if key not in want or key not in before
                            or (want[key] is not before[key] and want[key] != before[key])}
            else:
                touched |= want.keys() | replayed.keys()
            wrong = [key for key in touched if (key in want) != (key in replayed) or (
                key in want and not rows_match(want[key], replayed[key]))]
            if wrong:
                diff = diff_rows([want[key] for key in wrong if key in want],
                                 [replayed[key] for key in wrong if key in replayed],
                                 key_columns)
                return CheckResult(False, f"exactly_once failed: the changelog replayed up to "
                                          f"_commit_seq {k} is not the source's output after "
                                          f"{_prefix_name(k, tx_names)}; oracle vs changelog "
                                          f"replay:\n" + diff.format())
    for row in ordered[at:]:
        key = row_key(row, key_columns)
        if str(row.get("_op", "")).lower() in ("d", "delete"):
            replayed.pop(key, None)
        else:
            replayed[key] = without_metadata(dict(row))
    diff = diff_rows(list(replayed.values()), current, key_columns)
    if diff.ok:
        return CheckResult(True, "")
    return CheckResult(False, "exactly_once failed: replaying the changelog in _commit_seq order "
                              "does not give the current rows; changelog replay vs current "
                              "rows:\n" + diff.format())


# -- a whole run -----------------------------------------------------------------------------------


@dataclass
class RunObservation:
    """What a runner saw: the output after every micro-batch, the changelog, the frontier.

    ``outputs[i]`` and ``released[i]`` belong to ``schedule.batches[i]``;
    ``released`` holds the last released commit sequence (see
    :func:`check_frontier`), or is None when the runner cannot tell. ``error``
    is set when the run stopped early (after ``len(outputs)`` batches).
    """

    outputs: list[list[Row]]
    changelog: list[Row]
    released: list[int | None] | None = None
    error: str | None = None


@dataclass
class ScenarioReport:
    """The outcome of one scenario: what ``txjoin replay`` prints (a line, or JSON)."""

    name: str
    passed: bool
    batches: int
    seconds: float
    failures: list[str] = field(default_factory=list)
    path: str = ""
    runner: str = "core"

    def to_json(self) -> dict[str, Any]:
        """The same facts as a JSON-ready dict."""
        return {"name": self.name, "path": self.path, "runner": self.runner,
                "passed": self.passed, "batches": self.batches,
                "seconds": round(self.seconds, 3), "failures": list(self.failures)}

    def line(self) -> str:
        """``name  PASS  5 batches  0.01s``."""
        verdict = "PASS" if self.passed else "FAIL"
        return f"{self.name}  {verdict}  {self.batches} batches  {self.seconds:.2f}s"


def check_scenario(scenario: Scenario, schedule: Schedule, seen: RunObservation) -> list[str]:
    """Every check the scenario asks for; the failures, earliest batch first."""
    job = scenario.job
    key_columns = list(job.output.key)
    names = scenario.tx_names
    batches = schedule.batches
    labels = [b.label for b in batches]
    invariants = scenario.expect.invariants
    grid: dict[tuple[int, ...], dict[Any, Row]] | None = None
    if scenario.multi_source:
        grid = outputs_by_source_prefixes(job, scenario.snapshot, scenario.transactions)
        oracle = [grid[max(grid)]]  # the last entry: every source's last transaction
    else:
        oracle = outputs_after_each(job, scenario.snapshot, scenario.transactions)
    failures: list[tuple[float, str]] = []  # (micro-batch position, message)
    if seen.error is not None:
        at = len(seen.outputs)
        label = labels[at] if at < len(labels) else "the end"
        failures.append((at, f"the run stopped in {label}: {seen.error}"))
    if "prefix_consistent" in invariants and grid is not None:
        result_s = check_source_prefixes_consistent(seen.outputs, grid, job.source_names,
                                                    key_columns, labels)
        if not result_s.ok:
            failures.append((len(result_s.k_per_batch), result_s.message))
    elif "prefix_consistent" in invariants:
        result = check_prefix_consistent(seen.outputs, oracle, key_columns, labels, names)
        if not result.ok:
            failures.append((len(result.k_per_batch), result.message))
    if scenario.expect.frontier:
        if seen.released is None:
            failures.append((len(batches), "frontier: the runner did not report the last "
                                            "released commit sequence per batch"))
        else:
            last_of: dict[int, int | None] = {}
            for batch, seq in zip(batches, seen.released, strict=False):
                last_of[batch.number] = seq
            for number in sorted(scenario.expect.frontier):
                want = {number: scenario.expect.frontier[number]}
                result_f = check_frontier(want, last_of, names)
                if not result_f.ok:
                    pos = max((i for i, b in enumerate(batches) if b.number == number),
                              default=len(batches))
                    line = scenario.expect.frontier_lines.get(number)
                    where = f" (expect.frontier at {scenario.where(line)})" if line else ""
                    failures.append((pos, result_f.message + where))
                    break
    final = seen.outputs[-1] if seen.outputs else []
    end = float(len(batches)) + 0.5
    if seen.error is None:
        if "final_equals_oracle" in invariants:
            result_c = check_final(final, oracle[-1], key_columns)
            if not result_c.ok:
                failures.append((end, result_c.message))
        if scenario.expect.final is not None:
            result_c = check_expect_final(scenario.expect.final, final, key_columns)
            if not result_c.ok:
                where = scenario.where(scenario.expect.final_line)
                failures.append((end, result_c.message.replace(
                    "expect.final failed", f"expect.final ({where}) failed", 1)))
    if "exactly_once" in invariants:
        # Against the source up to the frontier the run reached (several sources: their
        # commit sequences interleave, and the prefix check covers them).
        upto = seen.released[-1] if seen.released else max(
            (int(r.get("_commit_seq") or 0) for r in seen.changelog), default=None)
        against = oracle if grid is None and upto is not None else None
        result_c = check_exactly_once(seen.changelog, key_columns, final, against, upto, names)
        if not result_c.ok:
            failures.append((end, result_c.message))
    failures.sort(key=lambda f: f[0])
    return [message for _, message in failures]
