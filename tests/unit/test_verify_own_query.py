"""`verify --against-sql`: the user's own query's rows against a sink's (issue 73).

The query joins every vehicle of a trip's driver and lists a trip's stops in its own order
among equal `seq`; the job keeps the vehicle of greatest id (a Pick) and lists tied stops by
id. Rows that differ only so are explained by those rules, one line per key; any other
change of a sink row, and a row only one side has, is a mismatch.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from txjoin.job import Aggregate, Children, Collect, Job, Lookup, Output, Pick, Table
from txjoin.verify.own_query import compare_own_rows

JOB = Job(
    name="trips",
    tables=[Table("public.trips", {"id": "int", "driver_id": "int"}),
            Table("public.drivers", {"id": "int", "name": "text"}),
            Table("public.vehicles", {"id": "int", "driver_id": "int", "plate": "text"}),
            Table("public.stops", {"id": "int", "trip_id": "int", "seq": "int",
                                   "place": "text"})],
    fact="public.trips", fact_alias="t",
    lookups=[Lookup("d", "public.drivers", "t", {"id": "driver_id"}),
             Lookup("v", "public.vehicles", "d", {"driver_id": "id"}, how="left",
                    pick=Pick("id", "max")),
             Children("st", "public.stops", "t", {"trip_id": "id"}, order_by="seq")],
    output=Output(table="trips", key={"id": "t.id"}, columns={
        "driver": "d.name", "plate": "v.plate",
        "route": Aggregate("st", "string_agg", "st.place", " > "),
        "stops": Collect("st", {"place": "st.place"})}),
    semantics="current")

places = st.lists(st.sampled_from(["a", "b", "c", "home"]), max_size=4)


@st.composite
def trips(draw: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int, int]:
    """(the query's rows, the sink's rows, keys with several vehicles, keys reordered)."""
    yours, sink, picked, reordered = [], [], 0, 0
    for key in range(draw(st.integers(0, 6))):
        route = draw(places)
        row = {"id": key, "driver": draw(st.sampled_from(["Ann", "Bob"])),
               "plate": draw(st.sampled_from(["P1", "P2"])),
               "route": " > ".join(route) or None,
               "stops": [{"place": p} for p in route]}
        sink.append(row)
        theirs = draw(st.permutations(route))
        mine = {**row, "route": " > ".join(theirs) or None,
                "stops": [{"place": p} for p in theirs]}
        reordered += list(theirs) != route
        others = draw(st.lists(st.sampled_from(["Q1", "Q2", None]), max_size=2))
        picked += bool(others)
        yours += [mine] + [{**mine, "plate": plate} for plate in others]
    return yours, sink, picked, reordered


@given(trips())
def test_rows_that_differ_only_by_a_pick_or_a_tie_are_explained_not_mismatched(
        drawn: tuple[list[dict[str, Any]], list[dict[str, Any]], int, int]) -> None:
    yours, sink, picked, reordered = drawn
    check = compare_own_rows(JOB, "postgres", yours, sink)
    assert check.ok, check.format(10)
    counts = {e.rule.kind: len(e.lines) for e in check.explained}
    assert counts.get("pick", 0) == picked and counts.get("order", 0) == reordered


@given(trips(), st.data())
def test_any_other_change_of_a_sink_row_is_a_mismatch(
        drawn: tuple[list[dict[str, Any]], list[dict[str, Any]], int, int],
        data: st.DataObject) -> None:
    yours, sink, _, _ = drawn
    if not sink:
        return
    n = data.draw(st.integers(0, len(sink) - 1))
    change = data.draw(st.sampled_from(["driver", "route", "stops", "drop", "add"]))
    changed = [dict(r) for r in sink]
    if change == "driver":
        changed[n]["driver"] = "Eve"
    elif change == "route":
        changed[n]["route"] = (changed[n]["route"] or "") + " > z"
    elif change == "stops":
        changed[n]["stops"] = [*changed[n]["stops"], {"place": "z"}]
    elif change == "drop":
        del changed[n]
    else:
        changed.append({**changed[n], "id": 99})
    check = compare_own_rows(JOB, "postgres", yours, changed)
    assert check.mismatches == 1, (change, check.format(10))
    kind = {"drop": check.missing, "add": check.extra}.get(change, check.different)
    assert len(kind) == 1


def test_a_row_the_query_repeats_in_a_column_no_pick_reads_is_a_mismatch() -> None:
    """Two rows of one trip that differ in the driver's name: no Pick decides that (the
    driver is matched on its key), so it is not explained."""
    row = {"id": 1, "driver": "Ann", "plate": "P1", "route": None, "stops": []}
    check = compare_own_rows(JOB, "postgres", [row, {**row, "driver": "Bob"}], [row])
    assert check.different and not check.explained
