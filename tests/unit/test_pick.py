"""One `Pick` rule, PostgreSQL's (issue 38 item 3): engine, oracle and verify's SQL agree.

`Pick(col, "max"|"min")` takes the match with the greatest (least) value of ``col``; a
NULL never wins while any match has a value; ties go to the looked-up table's greatest
(least) key: ``ORDER BY col DESC|ASC NULLS LAST, key DESC|ASC LIMIT 1``. The engine
(`join/temporal.py`) and the oracle (`join/oracle.py`) each state it in their own code, so
the property test below compares two statements of the rule, on a nullable pick column
with repeated values.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.strategies import workloads
from tests.unit.test_properties import run_and_check
from txjoin.job import Job, Lookup, Output, Pick, Table
from txjoin.join.engine import Engine
from txjoin.join.oracle import Oracle
from txjoin.verify.verify import job_query


def ranked_job(order: str, semantics: str = "current") -> Job:
    """Users with the colour of the greatest (least) ``rank``: nullable, not unique."""
    return Job(
        name=f"pick_{order}",
        tables=[Table("public.users", {"id": "int", "full_name": "text"}),
                Table("public.users_favorite_color", {"id": "int", "user_id": "int",
                                                      "favorite_color": "text",
                                                      "rank": "int"})],
        fact="public.users", fact_alias="u",
        lookups=[Lookup("ufc", "public.users_favorite_color", parent="u",
                        on={"user_id": "id"}, how="left", pick=Pick("rank", order))],  # type: ignore[arg-type]
        output=Output(table=f"pick_{order}", key={"id": "u.id"},
                      columns={"favorite_color": "ufc.favorite_color", "rank": "ufc.rank"}),
        semantics=semantics)  # type: ignore[arg-type]


# built once (see tests/unit/strategies.py)
_NAMES = st.sampled_from(["Ann", "Bo"])
_COLORS = st.sampled_from(["red", "blue", "green"])
_RANKS = st.sampled_from([None, 1, 2])  # NULLs and ties, often

RANKED_ROWS: dict[str, Any] = {
    "public.users": lambda d, i: {"id": i, "full_name": d(_NAMES)},
    "public.users_favorite_color": lambda d, i: {
        "id": i, "user_id": d(st.integers(1, 3)), "favorite_color": d(_COLORS),
        "rank": d(_RANKS)},
}

VARIANTS = [(o, s) for o in ("max", "min") for s in ("current", "as_of_fact")]


@pytest.mark.parametrize(("order", "semantics"), VARIANTS)
@given(data=st.data())
def test_pick_on_a_nullable_repeated_column_is_the_same_in_engine_and_oracle(
        order: str, semantics: str, data: Any) -> None:
    workload = data.draw(workloads(RANKED_ROWS), label="workload")
    run_and_check(ranked_job(order, semantics), workload, data)


COLOURS = [  # user 1: values 2, NULL, 1, 1 (a tie on 1, and on 2 below for user 2)
    {"id": 10, "user_id": 1, "favorite_color": "a", "rank": 2},
    {"id": 11, "user_id": 1, "favorite_color": "b", "rank": None},
    {"id": 12, "user_id": 1, "favorite_color": "c", "rank": 1},
    {"id": 13, "user_id": 1, "favorite_color": "d", "rank": 1},
    {"id": 20, "user_id": 2, "favorite_color": "e", "rank": 2},
    {"id": 21, "user_id": 2, "favorite_color": "f", "rank": 2},
    {"id": 30, "user_id": 3, "favorite_color": "g", "rank": None},  # only NULLs: a tie
    {"id": 31, "user_id": 3, "favorite_color": "h", "rank": None},
]
USERS = [{"id": i, "full_name": f"u{i}"} for i in (1, 2, 3)]
# PostgreSQL's choices (ORDER BY rank ... NULLS LAST, id ... LIMIT 1).
CHOSEN = {"max": {1: "a", 2: "f", 3: "h"}, "min": {1: "c", 2: "e", 3: "g"}}


@pytest.mark.parametrize("order", ["max", "min"])
def test_nulls_lose_and_ties_go_to_the_key_in_engine_and_oracle(order: str) -> None:
    """On main, min picked the NULL (NULLs sorted lowest) where PostgreSQL picks 1."""
    job = ranked_job(order)
    oracle = Oracle(job)
    oracle.load_snapshot({"public.users": USERS, "public.users_favorite_color": COLOURS})
    assert {k[0]: r["favorite_color"] for k, r in oracle.output.items()} == CHOSEN[order]
    engine = Engine(job)
    from tests.unit.strategies import Workload, produce

    records = produce(job, Workload({"public.users": USERS,
                                     "public.users_favorite_color": COLOURS}, [])).records
    engine.process([(r.topic, 0, r.offset, r.value) for r in records],
                   caught_up={"public.users", "public.users_favorite_color", "transaction"})
    assert {k[0]: r["favorite_color"] for k, r in engine.outputs().items()} == CHOSEN[order]


def test_verify_sql_breaks_ties_by_the_key_with_nulls_last() -> None:
    assert ('DISTINCT ON (x."user_id") x."id", x."user_id", x."favorite_color", x."rank" '
            'FROM "public"."users_favorite_color" AS x '
            'ORDER BY x."user_id", x."rank" DESC NULLS LAST, x."id" DESC)'
            in job_query(ranked_job("max")))
    assert ('ORDER BY x."user_id", x."rank" ASC NULLS LAST, x."id" ASC)'
            in job_query(ranked_job("min")))


def test_verify_sql_orders_text_as_txjoin_compares_it() -> None:
    """Python compares text by code point ('B' < 'a'); PostgreSQL by the database's
    collation ('a' < 'B' in en_US), and an enum by its position: order by the text in C."""
    job = ranked_job("max")
    colours = job.table("public.users_favorite_color")
    by_colour = Job(name="by_colour", tables=job.tables, fact=job.fact, fact_alias="u",
                    lookups=[Lookup("ufc", colours.name, parent="u", on={"user_id": "id"},
                                    how="left", pick=Pick("favorite_color", "min"))],
                    output=job.output, semantics="current")
    assert ('ORDER BY x."user_id", x."favorite_color"::text COLLATE "C" ASC NULLS LAST, '
            'x."id" ASC'
            in job_query(by_colour))
