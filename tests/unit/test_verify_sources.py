"""`txjoin verify` for a job over two source databases, on hand-made sink rows.

The oracle side (the job evaluated on each database's state, read separately) and the
per-source prefix check on the changelog are plain functions: these tests feed them rows
a correct engine would write, and rows a broken one would, and expect the verdict to
follow.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from txjoin.job import load_job
from txjoin.verify.verify import (
    SourceHistory,
    StateAnswers,
    _states_after_each,
    check_sink,
    evaluate_on_states,
    prefix_violations,
    state_violations,
)

JOB = load_job(Path(__file__).resolve().parents[2] / "jobs" / "users_colors_two_dbs.py")

USERS = [{"id": 1, "full_name": "leo"}, {"id": 2, "full_name": "raph"},
         {"id": 3, "full_name": "donnie"}]
COLOURS = [
    {"id": 10, "user_id": 1, "favorite_color": "blue"},
    {"id": 12, "user_id": 1, "favorite_color": "red"},  # greatest id wins
    {"id": 11, "user_id": 1, "favorite_color": "green"},
    {"id": 13, "user_id": 7, "favorite_color": "teal"},  # no such user (yet)
    {"id": 14, "user_id": 2, "favorite_color": "black"},
]
COLOUR_TABLE = "public.users_favorite_color"
STATES = {"public.users": USERS, "public.users_favorite_color": COLOURS}

# Each source's commit order (xid -> position), as the generator's commit log records it.
ORDERS: dict[str, dict[int, int] | None] = {
    "users": {500: 1, 502: 2, 504: 3},
    "colors": {700: 1, 701: 2},
}


def change(seq: int, source: str, xid: int | None, user: int, name: str | None = "x",
           colour: str | None = None) -> dict[str, Any]:
    return {"id": user, "full_name": name, "favorite_color": colour, "_op": "u",
            "_commit_seq": seq, "_xid": xid, "_source": source, "_commit_ts": None}


def good_changelog() -> list[dict[str, Any]]:
    return [
        change(0, "users", None, 1),  # the snapshot: no transaction
        change(1, "users", 500, 1),
        change(1, "users", 500, 2),  # one transaction, two rows, one _commit_seq
        change(2, "colors", 700, 1, colour="blue"),
        change(3, "users", 502, 3),
        change(4, "colors", 701, 2, colour="black"),
        change(5, "users", 504, 1),
    ]


def test_two_db_job_is_the_left_join_with_the_greatest_colour_id() -> None:
    rows = sorted(evaluate_on_states(JOB, STATES), key=lambda r: r["id"])
    assert rows == [
        {"id": 1, "full_name": "leo", "favorite_color": "red"},
        {"id": 2, "full_name": "raph", "favorite_color": "black"},
        {"id": 3, "full_name": "donnie", "favorite_color": None},
    ]


def test_interleaved_sources_in_commit_order_have_no_violation() -> None:
    assert prefix_violations(good_changelog(), ORDERS) == []


def test_a_transaction_split_across_commit_seqs_is_a_violation() -> None:
    rows = good_changelog()
    rows[2]["_commit_seq"] = 2  # xid 500's second row lands with colours' xid 700
    found = prefix_violations(rows, ORDERS)
    assert any("xid 500 is split across _commit_seq [1, 2]" in v for v in found), found
    assert any("_commit_seq 2 mixes transactions colors:700, users:500" in v for v in found)


def test_a_source_going_back_in_its_commit_order_is_a_violation() -> None:
    rows = good_changelog()
    rows[4]["_commit_seq"], rows[6]["_commit_seq"] = 5, 3  # xid 504 before 502
    found = prefix_violations(rows, ORDERS)
    assert found == ["source 'users': xid 502 (commit #2) applied at _commit_seq 5, after "
                     "xid 504 (commit #3) at _commit_seq 3: its commit order went back"]


def test_sources_are_checked_independently_and_unknown_orders_only_group() -> None:
    rows = good_changelog()
    rows[3]["_commit_seq"], rows[5]["_commit_seq"] = 4, 2  # colours back, users fine
    found = prefix_violations(rows, ORDERS)
    assert len(found) == 1 and found[0].startswith("source 'colors': xid 700"), found
    assert prefix_violations(rows, {"users": ORDERS["users"], "colors": None}) == []


def test_snapshot_rows_as_the_engine_writes_them_are_no_transaction() -> None:
    """The engine writes the initial snapshots at _commit_seq 0 with _xid 0 and _source
    null; on main the check called that an unknown source 'None'."""
    rows = [change(0, "users", 0, 2), *good_changelog()]
    rows[0]["_source"] = None
    assert prefix_violations(rows, ORDERS) == []


def test_a_changelog_without_the_source_column_is_reported() -> None:
    rows = [{k: v for k, v in r.items() if k != "_source"} for r in good_changelog()]
    assert prefix_violations(rows, ORDERS)[0].startswith("the changelog has no _source column")


class HandMadeSink:
    name = "hand-made"

    def __init__(self, current: list[dict[str, Any]], changelog: list[dict[str, Any]]) -> None:
        self.current, self.changelog = current, changelog

    def read_current(self) -> list[dict[str, Any]]:
        return self.current

    def read_changelog(self) -> list[dict[str, Any]]:
        return self.changelog


def test_check_sink_counts_wrong_rows_and_prefix_violations_as_mismatches() -> None:
    expected = evaluate_on_states(JOB, STATES)
    right = HandMadeSink([dict(r) for r in expected], good_changelog())
    check = check_sink(right, "memory", ["id"], expected, orders=ORDERS)  # type: ignore[arg-type]
    assert check.ok, check

    stale = [dict(r) for r in expected]
    stale[0]["favorite_color"] = "green" if stale[0]["id"] == 1 else "blue"
    bad_log = good_changelog()
    bad_log[5]["_commit_seq"] = 2  # colours' 701 inside 700's commit
    wrong = HandMadeSink(stale, bad_log)
    check = check_sink(wrong, "memory", ["id"], expected, orders=ORDERS)  # type: ignore[arg-type]
    assert not check.ok
    assert len(check.diff.different) == 1
    assert check.prefix_violations == ["_commit_seq 2 mixes transactions colors:700, colors:701"]
    assert check.mismatches == 2


# -- every observable state is the job on some state of each source --------------------------

HISTORIES = {
    "users": SourceHistory([500, 502, 504], {
        500: [("public.users", None, {"id": 1, "full_name": "leo"}),
              ("public.users", None, {"id": 2, "full_name": "raph"})],
        502: [("public.users", None, {"id": 3, "full_name": "donnie"})],
        504: [("public.users", {"id": 1, "full_name": "leo"}, {"id": 1, "full_name": "LEO"})],
    }),
    "colors": SourceHistory([700, 701, 702], {
        700: [(COLOUR_TABLE, None, {"id": 10, "user_id": 1, "favorite_color": "blue"})],
        701: [(COLOUR_TABLE, None, {"id": 14, "user_id": 2, "favorite_color": "black"})],
        # A colour of a user that does not exist: changes no output, leaves no changelog row.
        702: [(COLOUR_TABLE, None, {"id": 13, "user_id": 7, "favorite_color": "teal"})],
    }),
}


def state_changelog() -> list[dict[str, Any]]:
    return [
        change(1, "users", 500, 1, "leo"), change(1, "users", 500, 2, "raph"),
        change(2, "colors", 700, 1, "leo", "blue"),
        change(3, "users", 502, 3, "donnie"),
        change(4, "colors", 701, 2, "raph", "black"),
        change(5, "users", 504, 1, "LEO", "blue"),
    ]


def test_a_changelog_through_combined_source_states_has_no_state_violation() -> None:
    assert state_violations(JOB, state_changelog(), HISTORIES) == []


def test_a_sink_showing_part_of_a_transaction_is_a_state_violation() -> None:
    rows = [r for r in state_changelog() if not (r["_commit_seq"] == 1 and r["id"] == 2)]
    found = state_violations(JOB, rows, HISTORIES)
    assert found and found[0].startswith("after _commit_seq 1 the sink equals no state of "
                                         "the sources (colors after #0, users after #1"), found


def test_a_colour_from_a_later_transaction_of_its_source_is_a_state_violation() -> None:
    rows = state_changelog()
    rows[2]["favorite_color"] = "black"  # colours' 700 shown with a value no state has
    found = state_violations(JOB, rows, HISTORIES)
    # Wrong until user 1's row is written again (by users' 504 at _commit_seq 5).
    assert [v.split(" the sink")[0] for v in found] == [
        "after _commit_seq 2", "after _commit_seq 3", "after _commit_seq 4"], found


def test_sinks_sharing_their_state_evaluations_find_what_each_finds_alone() -> None:
    """verify_job shares one StateAnswers between the sinks' checks: a sink checked after
    another finds exactly its own violations, with no evaluation beyond the first's."""
    good = state_changelog()
    torn = [r for r in good if not (r["_commit_seq"] == 1 and r["id"] == 2)]
    later = state_changelog()
    later[2]["favorite_color"] = "black"
    alone = [state_violations(JOB, rows, HISTORIES) for rows in (good, torn, later)]
    answers = StateAnswers(JOB, HISTORIES)
    shared = [state_violations(JOB, rows, HISTORIES, answers=answers)
              for rows in (good, torn, later)]
    assert shared == alone and alone[0] == [] and alone[1] and alone[2]
    evaluated = dict(answers._answers)
    assert state_violations(JOB, later, HISTORIES, answers=answers) == alone[2]
    assert answers._answers == evaluated  # nothing evaluated twice
    with pytest.raises(ValueError, match="other histories"):  # never another's answers
        state_violations(JOB, good, dict(HISTORIES), answers=answers)
    # Past its row budget it still answers, keeping nothing.
    tight = StateAnswers(JOB, HISTORIES, max_rows=0)
    assert state_violations(JOB, torn, HISTORIES, answers=tight) == alone[1]
    assert tight._answers == {}


def interleaved_changelog(histories: dict[str, SourceHistory], seed: int
                          ) -> list[dict[str, Any]]:
    """What a correct engine writes: both sources' transactions applied whole, each source
    in its commit order, interleaved at random; one _commit_seq per changed transaction."""
    rng = random.Random(seed)
    states = {s: _states_after_each(JOB, h) for s, h in histories.items()}
    at = dict.fromkeys(histories, 0)
    before: dict[Any, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    seq = 0
    while any(at[s] < len(h.order) for s, h in histories.items()):
        source = rng.choice([s for s, h in histories.items() if at[s] < len(h.order)])
        at[source] += 1
        tables: dict[str, list[dict[str, Any]]] = {}
        for s in histories:
            tables.update(states[s][at[s]])
        after = {r["id"]: r for r in evaluate_on_states(JOB, tables)}
        changed = [k for k in after.keys() | before.keys() if after.get(k) != before.get(k)]
        if changed:
            seq += 1
            xid = histories[source].order[at[source] - 1]
            for key in sorted(changed):
                row = after.get(key) or {**before[key]}
                rows.append({**row, "_op": "d" if key not in after else "u",
                             "_commit_seq": seq, "_xid": xid, "_source": source,
                             "_commit_ts": None})
        before = after
    return rows


def random_histories(seed: int, transactions: int) -> dict[str, SourceHistory]:
    rng = random.Random(seed)
    users: dict[int, dict[str, Any]] = {}
    colours: dict[int, dict[str, Any]] = {}
    result = {"users": SourceHistory([], {}), "colors": SourceHistory([], {})}
    for n in range(transactions):
        xid = 1000 + n
        source = rng.choice(["users", "colors"])
        changes: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]] = []
        for _ in range(rng.randint(1, 3)):
            if source == "users":
                uid = rng.randint(1, 12)
                old = users.get(uid)
                new = {"id": uid, "full_name": f"u{uid}-{n}"}
                users[uid] = new
                changes.append(("public.users", old, new))
            elif colours and rng.random() < 0.3:
                cid = rng.choice(sorted(colours))
                changes.append((COLOUR_TABLE, colours.pop(cid), None))
            else:
                cid = len(colours) + 100 * n
                new = {"id": cid, "user_id": rng.randint(1, 14),
                       "favorite_color": rng.choice(["red", "blue", "teal"])}
                colours[cid] = new
                changes.append((COLOUR_TABLE, None, new))
        result[source].order.append(xid)
        result[source].changes[xid] = changes
    return result


@pytest.mark.parametrize("seed", range(5))
def test_every_serial_interleaving_of_the_sources_passes_both_checks(seed: int) -> None:
    histories = random_histories(seed, 80)
    rows = interleaved_changelog(histories, seed)
    orders: dict[str, dict[int, int] | None] = {
        s: {x: i for i, x in enumerate(h.order)} for s, h in histories.items()}
    assert prefix_violations(rows, orders) == []
    assert state_violations(JOB, rows, histories) == []


def test_swapping_two_transactions_of_one_source_is_caught() -> None:
    histories = random_histories(1, 80)
    rows = interleaved_changelog(histories, 1)
    users_seqs = sorted({r["_commit_seq"] for r in rows if r["_source"] == "users"})
    a, b = users_seqs[3], users_seqs[4]
    for r in rows:
        if r["_commit_seq"] in (a, b):
            r["_commit_seq"] = b if r["_commit_seq"] == a else a
    orders: dict[str, dict[int, int] | None] = {
        s: {x: i for i, x in enumerate(h.order)} for s, h in histories.items()}
    assert any("its commit order went back" in v for v in prefix_violations(rows, orders))


def test_an_unreachable_source_database_is_one_line_naming_the_source(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from txjoin.cli import main

    result = CliRunner().invoke(main, [
        "verify", str(JOB.source_file), "--no-postgres", "--output-dir", str(tmp_path),
        "--source-dsn", "users=postgresql://nobody@127.0.0.1:1/x",
        "--source-dsn", "colors=postgresql://nobody@127.0.0.1:1/y"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: cannot connect to the 'users' source database: ")


def test_transactions_missing_from_the_commit_order_are_counted_not_placed() -> None:
    """A change log with xids the commit log lacks (a database built before the commit-order
    trigger): verify says the states are unchecked instead of counting mismatches."""
    row = {"id": 1, "full_name": "a"}
    history = SourceHistory(order=[10], changes={10: [("public.users", None, row)],
                                                 11: [("public.users", row, row)]})
    assert history.unordered == 1
    assert SourceHistory(order=[10], changes={10: []}).unordered == 0


def weights_job() -> Any:
    from txjoin.job import Job, Lookup, Output, Pick, Source, Table

    return Job(name="weights",
               sources=[Source("users", prefix="u"), Source("colors", prefix="c")],
               tables=[Table("public.users", {"id": "int"}, source="users"),
                       Table(COLOUR_TABLE, {"id": "int", "user_id": "int", "weight": "double",
                                            "ratio": "real"}, source="colors")],
               fact="public.users", fact_alias="u",
               lookups=[Lookup("c", COLOUR_TABLE, parent="u", on={"user_id": "id"},
                               how="left", pick=Pick("weight", "min"))],
               output=Output("out", {"id": "u.id"}, {"weight": "c.weight", "ratio": "c.ratio"}),
               semantics="current")


def test_a_change_log_value_verify_cannot_read_says_what_verify_was_reading() -> None:
    """Issue 33: verify reads txjoin_changes (jsonb, fractions as Decimal) itself, so the
    error names that read and gives no advice about restarting the job."""
    from decimal import Decimal

    from txjoin.errors import ConfigError
    from txjoin.verify.verify import typed_history

    job = weights_job()
    row = {"id": 1, "user_id": 1, "weight": Decimal("3.14"), "ratio": Decimal("0.5")}
    typed = typed_history(job, "colors", SourceHistory([7], {7: [(COLOUR_TABLE, None, row)]}))
    assert typed.changes[7][0][2] == {"id": 1, "user_id": 1, "weight": 3.14, "ratio": 0.5}
    bad = {**row, "weight": "heavy"}
    with pytest.raises(ConfigError) as caught:
        typed_history(job, "colors", SourceHistory([7], {7: [(COLOUR_TABLE, row, bad)]}))
    message = str(caught.value)
    assert message.startswith("verify, replaying public.txjoin_changes of source 'colors' "
                              "(xid 7): public.users_favorite_color.weight: cannot read "
                              "'heavy' as double; declare"), message
    assert "restart" not in message and "changed?" not in message and "\n" not in message


def test_a_real_held_as_float32_in_the_sink_is_no_state_violation() -> None:
    """The Delta sink holds a real as float32 (0.1 reads back as 0.10000000149...): the
    state check compares by value as the final rows are (found by the e2e test)."""
    from decimal import Decimal

    from txjoin.verify.verify import typed_history

    job = weights_job()
    colour = {"id": 5, "user_id": 1, "weight": Decimal("3.14"), "ratio": Decimal("0.1")}
    histories = {
        "users": typed_history(job, "users", SourceHistory(
            [1], {1: [("public.users", None, {"id": 1})]})),
        "colors": typed_history(job, "colors", SourceHistory(
            [9], {9: [(COLOUR_TABLE, None, colour)]})),
    }
    log = [{"id": 1, "weight": None, "ratio": None, "_op": "c", "_commit_seq": 1, "_xid": 1,
            "_source": "users", "_commit_ts": None},
           {"id": 1, "weight": 3.14, "ratio": 0.10000000149011612, "_op": "u",
            "_commit_seq": 2, "_xid": 9, "_source": "colors", "_commit_ts": None}]
    assert state_violations(job, log, histories) == []
    log[1]["ratio"] = 0.2
    assert len(state_violations(job, log, histories)) == 1
