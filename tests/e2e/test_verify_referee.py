"""`verify` asks PostgreSQL for the final rows of a job with `sources=` too (issue 39).

A rule the engine and txjoin's own oracle share (a value conversion) or state alike (the
`Pick` order before issue 38) passes any check that uses the oracle as referee. Here the
engine runs in-process with such a rule broken, on databases of a real PostgreSQL, its
output goes into a real PostgreSQL sink, and `verify_job` must flag it, for a job with one
declared source (the job's query on that database) and with two (the query on a copy of
both databases' tables). The same run with the engine intact verifies clean.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from tests.unit.strategies import Workload, produce
from txjoin import expr
from txjoin.job import Children, Job, Lookup, Output, Pick, Source, Table
from txjoin.join import temporal
from txjoin.join.engine import Engine
from txjoin.join.output import changes_to_table, output_schema
from txjoin.sinks.postgres import PostgresSink
from txjoin.stack.postgres import table_ddl
from txjoin.verify.verify import VerifyResult, verify_job

USERS = [{"id": i, "full_name": f"user {i}", "score": s}
         for i, s in ((1, 0.5), (2, None), (3, 2.25), (4, 1e-7))]
COLOURS = [  # rank: nullable and repeated; weight: a double that is no binary fraction
    {"id": 10, "user_id": 1, "favorite_color": "red", "rank": 2, "weight": 3.14},
    {"id": 11, "user_id": 1, "favorite_color": "teal", "rank": None, "weight": None},
    {"id": 12, "user_id": 1, "favorite_color": "blue", "rank": 1, "weight": 0.1},
    {"id": 13, "user_id": 1, "favorite_color": "green", "rank": 1, "weight": -2.5},
    {"id": 20, "user_id": 2, "favorite_color": "black", "rank": None, "weight": 1.5},
    {"id": 21, "user_id": 2, "favorite_color": "white", "rank": None, "weight": 7.0},
    {"id": 30, "user_id": 3, "favorite_color": "pink", "rank": 5, "weight": 1e300},
]


def ranked_job(sources: list[str]) -> Job:
    """Users with the colour of least rank; users from the first source, colours from the
    last (one source: both from it)."""
    return Job(
        name="ranked",
        sources=[Source(s, prefix=f"{s}_db") for s in sources],
        tables=[Table("public.users", {"id": "int", "full_name": "text", "score": "real"},
                      source=sources[0]),
                Table("public.users_favorite_color", {
                    "id": "int", "user_id": "int", "favorite_color": "text", "rank": "int",
                    "weight": "double"}, source=sources[-1])],
        fact="public.users", fact_alias="u",
        lookups=[Lookup("ufc", "public.users_favorite_color", parent="u",
                        on={"user_id": "id"}, how="left", pick=Pick("rank", "min"))],
        output=Output(table="ranked_out", key={"id": "u.id"},
                      columns={"full_name": "u.full_name", "score": "u.score",
                               "favorite_color": "ufc.favorite_color", "rank": "ufc.rank",
                               "weight": "ufc.weight"}),
        semantics="current")


@pytest.fixture(scope="module")
def cluster(pg_server: str) -> Iterator[dict[str, str]]:
    """Databases users_db, colors_db (one table each) and shop_db (both) on the session's
    PostgreSQL server, and a sink database."""
    from tests.fixtures.postgres import new_database

    two = ranked_job(["users", "colors"])
    dsn = new_database(pg_server, "referee_sink")
    dsns = {db: new_database(pg_server, f"referee_{db}")
            for db in ("users_db", "colors_db", "shop_db")}
    for db, tables in (("users_db", [USERS]), ("colors_db", [COLOURS]),
                       ("shop_db", [USERS, COLOURS])):
        with contextlib.closing(psycopg2.connect(dsns[db])) as conn, conn, \
                conn.cursor() as cur:
            for rows in tables:
                table = two.tables[0] if rows is USERS else two.tables[1]
                cur.execute(table_ddl(table))
                columns = list(table.columns)
                for row in rows:
                    cur.execute(f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES "
                                f"({', '.join(['%s'] * len(columns))})",
                                [row[c] for c in columns])
    with contextlib.closing(psycopg2.connect(dsns["shop_db"])) as conn, conn, \
            conn.cursor() as cur:
        cur.execute(table_ddl(FANS_TABLE))
        for fan in FANS:
            cur.execute("INSERT INTO public.fans (id, likes) VALUES (%s, %s)",
                        (fan["id"], fan["likes"]))
    yield {"sink": dsn, **dsns}


FANS_TABLE = Table("public.fans", {"id": "int", "likes": "int[]"}, source="shop")
FANS = [{"id": 1, "likes": [1, 2, 1, 3, 9]}, {"id": 2, "likes": []}, {"id": 3, "likes": [2]}]


def fans_job() -> Job:
    """An array lookup with a Pick: each liked user's colour of least rank, in array order."""
    from txjoin.job import Collect

    return Job(
        name="fans", sources=[Source("shop", prefix="shop_db")],
        tables=[FANS_TABLE, ranked_job(["shop"]).tables[1]],
        fact="public.fans", fact_alias="f",
        lookups=[Lookup("c", "public.users_favorite_color", parent="f",
                        on={"user_id": "likes"}, how="left", array=True,
                        pick=Pick("rank", "min"))],
        output=Output(table="fans_out", key={"id": "f.id"},
                      columns={"colours": Collect("c", {"colour": "c.favorite_color",
                                                        "weight": "c.weight"})}),
        semantics="current")


def run_engine_into_sink(job: Job, sink_dsn: str,
                         tables: Mapping[str, list[dict[str, Any]]] | None = None) -> None:
    """The engine on the databases' rows (Debezium's snapshot of ``tables``, by default
    this module's), into a fresh PostgreSQL sink."""
    if tables is None:
        tables = {"public.users": USERS, "public.fans": FANS,
                  "public.users_favorite_color": COLOURS}
    records = produce(job, Workload(dict(tables), [])).records
    engine = Engine(job)
    streams = set(job.streams(job.source_prefixes("shop")).values())
    changes = engine.process([(r.topic, 0, r.offset, r.value) for r in records],
                             caught_up=streams)
    assert changes, "the engine released nothing"
    with contextlib.closing(psycopg2.connect(sink_dsn)) as conn, conn, conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {job.output.table}, {job.output.table}_changelog, "
                    f"txjoin_progress")
    sink = PostgresSink(sink_dsn, job.output.table, job.name, list(job.output.key),
                        output_schema(job))
    try:
        assert sink.write(0, changes_to_table(job, changes))
    finally:
        sink.close()


def verify_postgres_sink(job: Job, cluster: dict[str, str], tmp_path: Path) -> VerifyResult:
    dsns = ({"shop": cluster["shop_db"]} if len(job.sources) == 1 else
            {"users": cluster["users_db"], "colors": cluster["colors_db"]})
    return verify_job(job, ("", cluster["sink"]), tmp_path / "no-delta", dsns)


def nulls_lowest(candidates: Any, rule: Pick, key: Any) -> Any:
    """main's Pick order: NULLs sorted lowest, so `min` takes a NULL row."""
    chooser = max if rule.order == "max" else min
    return chooser(candidates, key=lambda r: (r.get(rule.column) is not None,
                                              r.get(rule.column), [r.get(k) for k in key]))


def truncating_real(value: Any, _p: Any, _m: Any) -> float:
    """A conversion bug the oracle shares with the engine: both read a real through it."""
    return float(int(float(value)))


BREAKAGES = {"pick order": ("pick", nulls_lowest), "real conversion": ("real", truncating_real)}
SHAPES = {"one source": ["shop"], "two sources": ["users", "colors"]}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_an_intact_engine_verifies_clean_against_postgresql(
        shape: str, cluster: dict[str, str], tmp_path: Path) -> None:
    job = ranked_job(SHAPES[shape])
    run_engine_into_sink(job, cluster["sink"])
    result = verify_postgres_sink(job, cluster, tmp_path)
    postgres = next(s for s in result.sinks if s.sink == "postgres")
    assert postgres.ok and postgres.rows == len(USERS), result.format()
    referees = dict(result.referees)
    assert referees["rows"].startswith("PostgreSQL: the job's query on "), referees
    # These databases keep no change log: the state check says it did not run.
    assert result.note is not None and "keep(s) no change log" in result.note
    assert referees["every state"] == "not checked (see note)"


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_broken_engine_rule_shared_with_the_oracle_is_caught_by_verify(
        shape: str, breakage: str, cluster: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On main, verify judged a job with `sources=` by txjoin's oracle, which read text the
    same broken way and sorted NULLs the same way: 0 mismatches."""
    job = ranked_job(SHAPES[shape])
    what, broken = BREAKAGES[breakage]
    with monkeypatch.context() as patched:
        if what == "pick":
            patched.setattr(temporal, "pick", broken)
        else:
            from txjoin.ingest import types

            patched.setitem(types._READERS, "real", broken)
        run_engine_into_sink(job, cluster["sink"])
        result = verify_postgres_sink(job, cluster, tmp_path)
    postgres = next(s for s in result.sinks if s.sink == "postgres")
    print(result.format())
    assert not postgres.ok and postgres.diff.different, result.format()
    if what == "pick":  # user 1: PostgreSQL's min rank is blue's 1 (id 12), not teal's NULL
        (exp, act), = [(e, a) for e, a in postgres.diff.different if e["id"] == 1]
        assert (exp["favorite_color"], act["favorite_color"]) == ("blue", "teal")


def test_an_array_lookup_with_a_pick_verifies_against_postgresql(
        cluster: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verify's SQL for an array lookup (unnest WITH ORDINALITY, one LATERAL per element)
    carries the same Pick rule; with main's NULLs-lowest order the engine disagrees."""
    job = fans_job()
    run_engine_into_sink(job, cluster["sink"])
    result = verify_job(job, ("", cluster["sink"]), tmp_path / "no-delta",
                        {"shop": cluster["shop_db"]})
    postgres = next(s for s in result.sinks if s.sink == "postgres")
    assert postgres.ok and postgres.rows == len(FANS), result.format()
    monkeypatch.setattr(temporal, "pick", nulls_lowest)
    run_engine_into_sink(job, cluster["sink"])
    result = verify_job(job, ("", cluster["sink"]), tmp_path / "no-delta",
                        {"shop": cluster["shop_db"]})
    postgres = next(s for s in result.sinks if s.sink == "postgres")
    assert [e["id"] for e, _ in postgres.diff.different] == [1], result.format()


def tiers_job() -> Job:
    """Users with expressions over their colours' aggregates, kept while they have two."""
    colours = ranked_job(["shop"]).tables[1]
    return Job(
        name="tiers", sources=[Source("shop", prefix="shop_db")],
        tables=[ranked_job(["shop"]).tables[0], colours],
        fact="public.users", fact_alias="u",
        lookups=[Children("c", "public.users_favorite_color", parent="u",
                          on={"user_id": "id"})],
        output=Output(table="tiers_out", key={"id": "u.id"}, columns={
            "tier": "CASE WHEN max(c.rank) > 1 THEN 'many' ELSE 'few' END",
            "mean_weight": "sum(c.weight) / nullif(count(c.weight), 0)",
            "ranks": "coalesce(sum(c.rank), 0) * 2 + count(c.id)"}),
        having="count(c.id) >= 2", semantics="current")


def test_expressions_over_aggregates_and_having_are_refereed_by_postgresql(
        cluster: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The PostgreSQL sink declares the computed columns' types; verify's SQL (each
    aggregate its own subquery, HAVING a filter on the user's group) agrees with the engine,
    and catches a comparison broken in txjoin/expr.py, which the oracle shares."""
    job = tiers_job()
    run_engine_into_sink(job, cluster["sink"])
    result = verify_job(job, ("", cluster["sink"]), tmp_path / "no-delta",
                        {"shop": cluster["shop_db"]})
    postgres = next(s for s in result.sinks if s.sink == "postgres")
    assert postgres.ok and postgres.rows == 2, result.format()  # users 3, 4: under two
    with monkeypatch.context() as patched:
        compare = expr._cmp
        patched.setattr(expr, "_cmp", lambda op: compare("<" if op == ">" else op))
        broken = tiers_job()
        run_engine_into_sink(broken, cluster["sink"])
        result = verify_job(broken, ("", cluster["sink"]), tmp_path / "no-delta",
                            {"shop": cluster["shop_db"]})
    postgres = next(s for s in result.sinks if s.sink == "postgres")
    (want, got), = postgres.diff.different  # user 1's greatest rank is 2: many
    assert (want["id"], want["tier"], got["tier"]) == (1, "many", "few"), result.format()
