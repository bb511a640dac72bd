"""Scenario files: every shipped story passes through the core, and bad files fail clearly.

A scenario file is a public interface (SCENARIOS.md): an invalid file must stop
with exit code 2 and a message naming the field and the line; a wrong
expectation must fail with a row diff.
"""

from __future__ import annotations

import datetime as dt
import textwrap
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from txjoin.errors import ScenarioError
from txjoin.scenarios.checks import (
    check_exactly_once,
    check_expect_final,
    check_frontier,
    check_prefix_consistent,
)
from txjoin.scenarios.core_runner import run_scenario_core
from txjoin.scenarios.schedule import ReplayBatch, Restart, compile_schedule
from txjoin.scenarios.spec import load_scenario, load_scenarios
from txjoin.verify.diff import values_equal

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
JOB = (ROOT / "jobs" / "orders.py").as_posix()

BASE = """\
name: sample
about: An order for the tests.
job: {job}
snapshot:
  public.clients:
    - {{id: 1, name: Leonardo}}
  public.pizzas:
    - {{id: 2, name: Diavola, price: 9.00}}
  public.tables:
    - {{id: 4, name: T4}}
  public.table_assignment:
    - {{id: 4, client_id: 1, table_id: 4, time_in: "2023-09-23T22:45:00", time_out: null}}
transactions:
  - name: t1
    ops:
      - insert: public.orders
        row: {{id: 100, table_assignment_id: 4, order_time: "2023-09-23T23:00:00", pizzas: [2]}}
  - name: t2
    ops:
      - update: public.orders
        row: {{id: 100, table_assignment_id: 4, order_time: "2023-09-23T23:00:00", pizzas: [2, 2]}}
"""


def write(tmp_path: Path, text: str, name: str = "sample.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text.replace("{job}", JOB) if "{job}" in text else text, encoding="utf-8")
    return path


def base(extra: str = "") -> str:
    return BASE.format(job=JOB) + textwrap.dedent(extra)


def error_of(tmp_path: Path, text: str) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        compile_schedule(load_scenario(write(tmp_path, text)))
    assert info.value.exit_code == 2
    return info.value


# -- the shipped scenarios ------------------------------------------------------------------


def test_there_are_scenarios_for_every_story() -> None:
    names = {p.stem for p in SCENARIOS}
    assert len(names) >= 14
    for seed in range(1, 7):
        assert any(n.startswith(f"seed_{seed}_") for n in names), seed


def test_scenario_names_are_unique_and_match_their_files() -> None:
    scenarios = load_scenarios(SCENARIOS)
    assert [s.name for s in scenarios] == [p.stem for p in SCENARIOS]


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_scenario_passes_through_the_core(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.expect.final is not None, "expect.final is written by hand"
    report = run_scenario_core(scenario)
    assert report.passed, "\n".join(report.failures)
    assert report.to_json()["passed"] is True


# -- invalid files: exit 2, field and line -------------------------------------------------------


def test_unknown_key_names_the_field_and_line(tmp_path: Path) -> None:
    text = base().replace("      - insert: public.orders\n        row: {id: 100",
                          "      - insert: public.orders\n        rows: {id: 100", 1)
    err = str(error_of(tmp_path, text))
    assert "sample.yaml:17:" in err and "transactions[0].ops[0].rows" in err
    assert "unknown key 'rows'" in err


def test_unknown_top_level_key_says_where_it_belongs(tmp_path: Path) -> None:
    err = str(error_of(tmp_path, base("withhold: [t2:*]\n")))
    assert "sample.yaml:22:" in err and "withhold" in err and "delivery" in err


def test_bad_selector_names_the_selector_and_line(tmp_path: Path) -> None:
    err = str(error_of(tmp_path, base("""\
        delivery:
          batches:
            - [snapshot:*, t1:*]
            - [t2:*, t9:begin]
        """)))
    assert "sample.yaml:25:" in err and "delivery.batches[1][1]" in err
    assert "'t9:begin'" in err and "unknown transaction 't9'" in err


@pytest.mark.parametrize(("selector", "complaint"), [
    ("t1:public.orders#3", "index 3 is out of range"),
    ("t1:public.clients", "t1 has no events on public.clients"),
    ("t1:public.nope", "unknown table 'public.nope'"),
    ("t1:middle", "unknown table 'middle'"),
    ("snapshot:public.orders", "the snapshot has no rows of public.orders"),
    ("nocolon", "is not '<tx>:begin'"),
])
def test_selectors_that_name_nothing_are_rejected(tmp_path: Path, selector: str,
                                                  complaint: str) -> None:
    err = str(error_of(tmp_path, base(f"""\
        delivery:
          batches:
            - [snapshot:*, t1:begin, "{selector}"]
        """)))
    assert "sample.yaml:24:" in err and selector in err and complaint in err


def test_out_of_order_delivery_within_a_topic_names_both_events(tmp_path: Path) -> None:
    err = str(error_of(tmp_path, base("""\
        delivery:
          batches:
            - [snapshot:*, t1:begin, t1:end, t2:public.orders]
            - [t1:public.orders, t2:begin, t2:end]
        """)))
    assert "sample.yaml:24:" in err and "delivery.batches[0][3]" in err
    assert "t2:public.orders#0" in err and "t1:public.orders#0" in err
    assert "shop.public.orders" in err


def test_the_transaction_topic_is_ordered_too(tmp_path: Path) -> None:
    err = str(error_of(tmp_path, base("""\
        delivery:
          batches:
            - [snapshot:*, t2:*]
            - [t1:*]
        """)))
    assert "t2:begin" in err and "t1:begin" in err


def test_redelivery_is_allowed_only_after_a_restart(tmp_path: Path) -> None:
    err = str(error_of(tmp_path, base("""\
        delivery:
          batches:
            - [snapshot:*, t1:*]
            - [t1:begin, t2:*]
        """)))
    assert "sample.yaml:25:" in err and "'t1:begin' selects only events already delivered" in err
    scenario = load_scenario(write(tmp_path, base("""\
        delivery:
          batches:
            - [snapshot:*, t1:*]
            - restart
            - [t1:*, t2:*]
        """), "rewind.yaml"))
    steps = compile_schedule(scenario).steps
    assert isinstance(steps[1], Restart)
    assert isinstance(steps[2], ReplayBatch)
    assert {r.tx for r in steps[2].records} == {"t1", "t2"}
    assert run_scenario_core(scenario).passed


def test_undelivered_event_without_withhold_is_an_error(tmp_path: Path) -> None:
    err = str(error_of(tmp_path, base("""\
        delivery:
          batches:
            - [snapshot:*, t1:*, t2:begin]
        """)))
    assert "sample.yaml:22:" in err and "delivery.batches" in err
    assert "never delivered" in err and "t2:public.orders#0" in err and "t2:end" in err
    assert "withhold" in err


def test_withheld_events_are_not_delivered_and_keep_their_topic_behind(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, base("""\
        delivery:
          batches:
            - [snapshot:*, t1:*, t2:begin, t2:end]
          withhold: [t2:public.orders]
        expect:
          final:
            - {order_id: 100, pizzas: [{pizza: Diavola, price: 9.0}]}
          frontier: {0: t1}
        """)))
    assert "final_equals_oracle" not in scenario.expect.invariants
    schedule = compile_schedule(scenario)
    (batch,) = schedule.batches
    assert "shop.public.orders" not in batch.caught_up
    assert "shop.public.clients" in batch.caught_up
    report = run_scenario_core(scenario)
    assert report.passed, report.failures


def test_unknown_table_names_field_and_line(tmp_path: Path) -> None:
    text = base().replace("- update: public.orders", "- update: public.order", 1)
    err = str(error_of(tmp_path, text))
    assert "sample.yaml:20:" in err and "transactions[1].ops[0].update" in err
    assert "'public.order' is not read by job 'orders'" in err


@pytest.mark.parametrize(("old", "new", "line", "complaint"), [
    ("- update: public.orders", "- insert: public.orders", 21, "already exists"),
    ("{id: 1, name: Leonardo}", "{id: 1, nickname: Leonardo}", 6, "unknown key 'nickname'"),
    ("- name: t2", "- name: t1", 18, "already used at line 14"),
    ("pizzas: [2, 2]", "pizzas: two", 21, "expected a JSON array for int[], got 'two'"),
])
def test_rows_are_checked_against_the_job_and_the_model(tmp_path: Path, old: str, new: str,
                                                         line: int, complaint: str) -> None:
    err = str(error_of(tmp_path, base().replace(old, new, 1)))
    assert f"sample.yaml:{line}:" in err and complaint in err


def test_delete_of_a_missing_row_is_an_error(tmp_path: Path) -> None:
    text = base() + "  - name: t3\n    ops:\n      - delete: public.clients\n        key: {id: 7}\n"
    err = str(error_of(tmp_path, text))
    assert "sample.yaml:25:" in err and "transactions[2].ops[0].key" in err
    assert "there is no public.clients row with id=7" in err


def test_duplicate_yaml_key_is_an_error(tmp_path: Path) -> None:
    err = str(error_of(tmp_path, base("name: again\n")))
    assert "sample.yaml:22:" in err and "'name' appears twice" in err


def test_frontier_names_a_listed_batch_and_a_known_transaction(tmp_path: Path) -> None:
    err = str(error_of(tmp_path, base("expect:\n  frontier: {0: t1, 1: t2}\n")))
    assert "expect.frontier.1" in err
    err = str(error_of(tmp_path, base("expect:\n  frontier: {0: t7}\n")))
    assert "sample.yaml:23:" in err and "'t7' is not a transaction" in err


# -- schedules -----------------------------------------------------------------------------------


def test_a_batch_is_a_set_delivered_in_topic_order(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, base("""\
        delivery:
          batches:
            - [t2:*, t1:*, snapshot:*]
        """)))
    (batch,) = compile_schedule(scenario).batches
    for topic in {r.topic for r in batch.records}:
        offsets = [r.offset for r in batch.records if r.topic == topic]
        assert offsets == sorted(offsets), topic
    assert run_scenario_core(scenario).passed


def test_caught_up_follows_the_planning_point(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, base("""\
        delivery:
          batches:
            - [snapshot:public.clients]
            - [snapshot:*, t1:begin, t1:end]
            - [t1:*, t2:*]
        """)))
    first, second, third = compile_schedule(scenario).batches
    # the planning point is the first snapshot row: nothing else had been produced
    assert first.caught_up == {"shop.transaction", "shop.public.clients", "shop.public.pizzas",
                               "shop.public.tables", "shop.public.table_assignment",
                               "shop.public.orders"}
    # t1's END was read, so t1's order row (produced before it) is due on the orders topic
    assert "shop.public.orders" not in second.caught_up
    assert "shop.transaction" in second.caught_up
    assert len(third.caught_up) == 6


def test_duplicates_get_a_batch_of_their_own_right_after_the_first_delivery(
        tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, base("""\
        delivery:
          batches:
            - [snapshot:*, t1:*]
            - [t2:*]
          duplicate: [t1:public.orders, t2:end]
        expect:
          frontier: {0: t1, 1: t2}
        """)))
    steps = compile_schedule(scenario).batches
    assert [(b.number, b.duplicate) for b in steps] == [(0, False), (0, True), (1, False),
                                                        (1, True)]
    assert [(r.tx, r.kind) for r in steps[1].records] == [("t1", "data")]
    assert [(r.tx, r.kind) for r in steps[3].records] == [("t2", "end")]
    assert run_scenario_core(scenario).passed


# -- failing runs --------------------------------------------------------------------------------


def test_a_wrong_expectation_fails_with_a_row_diff(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, base("""\
        expect:
          final:
            - {order_id: 100, client_name: Leonardo, pizzas: [{pizza: Diavola, price: 9.0}]}
            - {order_id: 101, client_name: Leonardo}
        """)))
    report = run_scenario_core(scenario)
    assert not report.passed
    (failure,) = report.failures
    assert "expect.final" in failure and "sample.yaml:23" in failure
    assert "missing (expected, not in the output):\n    {order_id: 101" in failure
    assert "different:" in failure
    assert "expected {order_id: 100, client_name: Leonardo, pizzas: [{pizza: Diavola, " \
           "price: 9.0}]}" in failure
    assert "actual   {order_id: 100, client_name: Leonardo, pizzas: [{pizza: Diavola, " \
           "price: 9.00}, {pizza: Diavola, price: 9.00}]}" in failure
    assert report.to_json()["failures"] == report.failures


def test_a_wrong_frontier_fails_naming_the_batch(tmp_path: Path) -> None:
    # t1's order row is due on the orders topic, which has no snapshot row: until it
    # is read, nothing (not even the snapshot) can be released.
    scenario = load_scenario(write(tmp_path, base("""\
        delivery:
          batches:
            - [snapshot:*, t1:begin, t1:end]
            - [t1:*, t2:*]
        expect:
          frontier: {0: t1}
        """)))
    report = run_scenario_core(scenario)
    assert report.failures == [
        "frontier failed after batch 0: expected the output to reflect transactions up to t1, "
        f"it reflects nothing yet (null) (expect.frontier at {scenario.path}:27)"]


# -- the checks on their own -------------------------------------------------------------------


def test_values_compare_by_value() -> None:
    assert values_equal(9.5, Decimal("9.50"))
    assert values_equal(Decimal("9.50"), 9.5)
    assert not values_equal("9.5", Decimal("9.5"))
    assert not values_equal(True, 1)
    assert values_equal("2023-09-23T23:00:00",
                        dt.datetime(2023, 9, 23, 23, 0, tzinfo=dt.UTC))
    assert values_equal("2023-09-24T01:00:00+02:00", "2023-09-23T23:00:00Z")
    assert values_equal([{"pizza": "Diavola"}], [{"pizza": "Diavola", "price": Decimal(9)}])
    assert not values_equal([1, 2], [2, 1])


ORACLE = [{}, {(1,): {"id": 1, "v": "a"}}, {(1,): {"id": 1, "v": "b"}, (2,): {"id": 2, "v": "c"}}]


def test_prefix_consistency_accepts_committed_prefixes_in_order() -> None:
    observed: list[list[dict[str, object]]] = [
        [], [{"id": 1, "v": "a", "_commit_seq": 1}], [{"id": 1, "v": "a"}],
        [{"id": 2, "v": "c"}, {"id": 1, "v": "b"}]]
    result = check_prefix_consistent(observed, ORACLE, ["id"])
    assert result.ok and result.k_per_batch == [None, 1, 1, 2]


def test_prefix_consistency_rejects_a_torn_state_and_going_back() -> None:
    torn = check_prefix_consistent([[{"id": 1, "v": "b"}]], ORACLE, ["id"])
    assert not torn.ok and "after batch 0" in torn.message and "closest" in torn.message
    back = check_prefix_consistent(
        [[{"id": 1, "v": "b"}, {"id": 2, "v": "c"}], [{"id": 1, "v": "a"}]], ORACLE, ["id"])
    assert not back.ok and "went back" in back.message and back.k_per_batch == [2]


def test_frontier_check() -> None:
    names = ["t1", "t2"]
    assert check_frontier({0: None, 1: "snapshot", 2: "t2"}, [None, 0, 2], names).ok
    bad = check_frontier({1: "t1"}, [None, 0], names)
    assert not bad.ok and "after batch 1" in bad.message


def test_exactly_once_check() -> None:
    log: list[dict[str, Any]] = [
        {"id": 1, "v": "a", "_op": "c", "_commit_seq": 1, "_xid": 101},
        {"id": 1, "v": "b", "_op": "u", "_commit_seq": 2, "_xid": 102},
        {"id": 2, "v": "c", "_op": "c", "_commit_seq": 2, "_xid": 102},
        {"id": 2, "v": None, "_op": "d", "_commit_seq": 3, "_xid": 103}]
    assert check_exactly_once(log, ["id"], [{"id": 1, "v": "b"}]).ok
    twice = check_exactly_once([*log, log[1]], ["id"], [{"id": 1, "v": "b"}])
    assert not twice.ok and "twice" in twice.message
    wrong = check_exactly_once(log, ["id"], [{"id": 1, "v": "a"}])
    assert not wrong.ok and "different" in wrong.message
    no_xid = check_exactly_once([{k: v for k, v in r.items() if k != "_xid"} for r in log],
                                ["id"], [{"id": 1, "v": "b"}])
    assert not no_xid.ok and "_xid" in no_xid.message


# The source: T1 creates 1=a, T2 sets 1=b and creates 2=c, T3 deletes 2, T4 sets 1=a again.
SOURCE_OUTPUTS = [{}, {(1,): {"id": 1, "v": "a"}},
          {(1,): {"id": 1, "v": "b"}, (2,): {"id": 2, "v": "c"}},
          {(1,): {"id": 1, "v": "b"}},
          {(1,): {"id": 1, "v": "a"}}]
SINK_LOG: list[dict[str, Any]] = [
    {"id": 1, "v": "a", "_op": "c", "_commit_seq": 1, "_xid": 101},
    {"id": 1, "v": "b", "_op": "u", "_commit_seq": 2, "_xid": 102},
    {"id": 2, "v": "c", "_op": "c", "_commit_seq": 2, "_xid": 102},
    {"id": 2, "v": None, "_op": "d", "_commit_seq": 3, "_xid": 103},
    {"id": 1, "v": "a", "_op": "u", "_commit_seq": 4, "_xid": 104}]


def test_exactly_once_check_holds_a_changelog_that_replays_the_source() -> None:
    assert check_exactly_once(SINK_LOG, ["id"], [{"id": 1, "v": "a"}], SOURCE_OUTPUTS).ok
    # a sink whose frontier is T2: the changelog up to T2, checked up to T2
    assert check_exactly_once(SINK_LOG[:3], ["id"], [{"id": 1, "v": "b"}, {"id": 2, "v": "c"}],
                              SOURCE_OUTPUTS, upto=2).ok


def test_exactly_once_check_fails_a_transaction_applied_again_under_a_new_commit_seq() -> None:
    # T2's change to key 2 applied again as if it were a new transaction, after T4: the
    # (key, _commit_seq) pairs are all distinct and the current rows are what it replays to
    again = [*SINK_LOG, {"id": 2, "v": "c", "_op": "c", "_commit_seq": 5, "_xid": 102}]
    current = [{"id": 1, "v": "a"}, {"id": 2, "v": "c"}]
    result = check_exactly_once(again, ["id"], current)
    assert not result.ok and "twice" in result.message and "_xid 102" in result.message
    # the same transaction's other key under the new sequence: no (key, _xid) twice, but
    # one source transaction under two commit sequences
    moved = [*SINK_LOG[:4], {"id": 3, "v": "x", "_op": "c", "_commit_seq": 4, "_xid": 102}]
    result = check_exactly_once(moved, ["id"], [{"id": 1, "v": "b"}, {"id": 3, "v": "x"}])
    assert not result.ok and "several commit sequences" in result.message


def test_exactly_once_check_fails_a_lost_intermediate_version() -> None:
    # T2's update of key 1 lost: T4 sets the same value T1 did, so the sink's current rows
    # still equal the changelog's replay and the oracle's final output
    lost = [r for r in SINK_LOG if not (r["id"] == 1 and r["_commit_seq"] == 2)]
    assert check_exactly_once(lost, ["id"], [{"id": 1, "v": "a"}]).ok  # the sink vs itself
    result = check_exactly_once(lost, ["id"], [{"id": 1, "v": "a"}], SOURCE_OUTPUTS,
                                tx_names=["t1", "t2", "t3", "t4"])
    assert not result.ok and "after t2 (#2)" in result.message, result.message
    # the last transaction's change lost while the sink's frontier is T4
    short = SINK_LOG[:4]
    result = check_exactly_once(short, ["id"], [{"id": 1, "v": "b"}], SOURCE_OUTPUTS)
    assert not result.ok and "_commit_seq 4" in result.message


def test_expect_final_without_key_columns_matches_rows_in_any_order() -> None:
    assert check_expect_final([{"v": "b"}, {"v": "a"}], [{"id": 1, "v": "a"},
                                                         {"id": 2, "v": "b"}], ["id"]).ok
    result = check_expect_final([{"v": "z"}], [{"id": 1, "v": "a"}], ["id"])
    assert not result.ok and "missing" in result.message and "extra" in result.message
