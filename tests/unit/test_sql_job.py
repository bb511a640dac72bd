"""`txjoin job from-sql`: the seeds' queries compile to the hand-written jobs, and what a job
cannot keep transaction-consistent (or does not support yet) is refused on one line naming
the construct's line and column.

The proof runs without Spark: the compiled job and the hand-written one go through the core
runner (the engine, restarts included) on every shipped scenario that uses the hand-written
job; their outputs after every batch and their changelogs must be equal row for row, and the
compiled job must pass the scenario's own checks (the oracle's answer, expectations).
"""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from txjoin.cli import main
from txjoin.errors import JobError
from txjoin.job import Collect, Job, load_job
from txjoin.join.oracle import Oracle
from txjoin.scenarios.checks import RunObservation, check_scenario
from txjoin.scenarios.core_runner import observe_core
from txjoin.scenarios.schedule import compile_schedule
from txjoin.scenarios.spec import load_scenario
from txjoin.sql_job import from_sql

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "jobs" / "sql"
ORDERS = ROOT / "jobs" / "orders.py"
USERS_COLORS = ROOT / "jobs" / "users_colors.py"
TWO_DBS = ROOT / "jobs" / "users_colors_two_dbs.py"


def scenarios_of(job_file: Path) -> list[Path]:
    found = [p for p in sorted((ROOT / "scenarios").glob("*.yaml"))
             if f"job: ../jobs/{job_file.name}\n" in p.read_text()]
    assert found, job_file
    return found


def compiled(tmp_path: Path, query: Path, name: str, job_file: Path, **kw: Any) -> Job:
    """The job file from-sql writes, loaded as `txjoin run` loads it."""
    out = tmp_path / f"{query.stem}_{job_file.stem}_{kw.get('semantics', '')}.py"
    out.write_text(from_sql(query, name, job_file=job_file, **kw).source)
    return load_job(out)


def rows(batch: list[dict[str, Any]]) -> list[str]:
    return sorted(repr(sorted(r.items())) for r in batch)


def same_output(scenario_file: Path, hand: Job, job: Job, *, checks: bool = True
                ) -> RunObservation:
    """Both jobs through the core on the scenario's schedule: equal row for row, and (with
    ``checks``) the compiled job passes the scenario's checks. Returns the compiled job's
    observation."""
    scenario = load_scenario(scenario_file)
    hand_scenario = dataclasses.replace(scenario, job=hand)
    sql_scenario = dataclasses.replace(scenario, job=job)
    schedule = compile_schedule(sql_scenario)
    expected = observe_core(hand_scenario, compile_schedule(hand_scenario))
    seen = observe_core(sql_scenario, schedule)
    assert seen.error == expected.error
    assert len(seen.outputs) == len(expected.outputs)
    for i, (got, want) in enumerate(zip(seen.outputs, expected.outputs, strict=True)):
        assert rows(got) == rows(want), f"{scenario_file.name} batch {i}"
    assert rows(seen.changelog) == rows(expected.changelog), scenario_file.name
    if checks:
        assert check_scenario(sql_scenario, schedule, seen) == []
    return seen


def declarations(job: Job) -> dict[str, Any]:
    return {"tables": {t.name: (t.columns, t.key, t.source) for t in job.tables},
            "fact": (job.fact, job.fact_alias), "lookups": sorted(map(repr, job.lookups)),
            "output": job.output, "semantics": job.semantics, "where": job.where,
            "sources": job.sources}


# -- the seeds' queries are the hand-written jobs ---------------------------------------


def test_seed_001_in_flink_sql_is_the_orders_job(tmp_path: Path) -> None:
    # FOR SYSTEM_TIME AS OF the order's time on every join: as_of_fact, as jobs/orders.py.
    job = compiled(tmp_path, SQL / "orders_flink.sql", "orders", ORDERS)
    hand = load_job(ORDERS)
    assert job.semantics == "as_of_fact"
    assert job.output.table == "orders_enriched"  # INSERT INTO names it, not --name
    assert isinstance(job.output.columns["pizzas"], Collect)
    changes = 0
    for scenario in scenarios_of(ORDERS):
        changes += len(same_output(scenario, hand, job).changelog)
    assert changes > 50  # the scenarios emit real output, not empty tables


def test_seed_001_in_postgresql_is_the_orders_job(tmp_path: Path) -> None:
    # The same aliases as jobs/orders.py: the declarations are equal, not only the rows.
    hand = load_job(ORDERS)
    job = compiled(tmp_path, SQL / "orders_postgres.sql", "orders", ORDERS,
                   semantics="as_of_fact")
    assert declarations(job) == declarations(hand)
    for scenario in scenarios_of(ORDERS):
        same_output(scenario, hand, job)


def test_seed_001_in_postgresql_without_semantics_is_kept_current(tmp_path: Path) -> None:
    # Plain joins mean the current state: the orders job with semantics current (the
    # scenarios' expectations are written for as_of_fact: only the rows are compared).
    job = compiled(tmp_path, SQL / "orders_postgres.sql", "orders", ORDERS)
    assert job.semantics == "current"
    hand = dataclasses.replace(load_job(ORDERS), semantics="current")
    for scenario in scenarios_of(ORDERS):
        same_output(scenario, hand, job, checks=False)


def test_flink_aliases_after_the_temporal_clause(tmp_path: Path) -> None:
    # Flink SQL writes `t FOR SYSTEM_TIME AS OF o.time AS alias`: with jobs/orders.py's
    # aliases the declarations are the hand-written job's.
    query = tmp_path / "aliased.sql"
    query.write_text(textwrap.dedent("""\
        INSERT INTO orders_enriched
        SELECT o.id AS order_id, c.name AS client_name, t.name AS table_name,
               JSON_ARRAYAGG(JSON_OBJECT('pizza' VALUE p.name, 'price' VALUE p.price)) AS pizzas
        FROM orders AS o CROSS JOIN UNNEST(o.pizzas) AS u(pizza_id)
          JOIN pizzas FOR SYSTEM_TIME AS OF o.order_time AS p ON p.id = u.pizza_id
          JOIN table_assignment FOR SYSTEM_TIME AS OF o.order_time AS ta
            ON o.table_assignment_id = ta.id
          JOIN clients FOR SYSTEM_TIME AS OF o.order_time AS c ON ta.client_id = c.id
          JOIN tables FOR SYSTEM_TIME AS OF o.order_time AS t ON ta.table_id = t.id
        GROUP BY o.id, c.name, t.name
        """))
    assert declarations(compiled(tmp_path, query, "orders", ORDERS)) == declarations(
        load_job(ORDERS))


def test_seed_000_is_the_users_colors_job(tmp_path: Path) -> None:
    # A LEFT JOIN on users_favorite_color.user_id, not its key: the greatest id wins, as
    # jobs/users_colors.py's Pick("id", "max") says.
    hand = load_job(USERS_COLORS)
    job = compiled(tmp_path, SQL / "users_colors.sql", "users_colors", USERS_COLORS)
    assert declarations(job) == declarations(hand)
    for scenario in scenarios_of(USERS_COLORS):
        same_output(scenario, hand, job)


def test_seed_000_over_two_databases_keeps_the_sources(tmp_path: Path) -> None:
    hand = load_job(TWO_DBS)
    job = compiled(tmp_path, SQL / "users_colors.sql", hand.name, TWO_DBS)
    # The query's INSERT names the output table; the rest is the hand-written job's.
    assert job.output.table == "users_full_name_and_favorite_color"
    job = dataclasses.replace(job, output=hand.output)
    assert job.sources == hand.sources and declarations(job) == declarations(hand)
    for scenario in scenarios_of(TWO_DBS):
        same_output(scenario, hand, job)


def test_filters_and_computed_columns_compile(tmp_path: Path) -> None:
    # WHERE, an ON-clause filter on the joined table, expressions: the job's where, the
    # lookup's where and computed columns, checked through the core on the shipped scenario.
    hand = load_job(ROOT / "jobs" / "orders_filtered.py")
    lookup_filters = {lk.alias: lk.where for lk in hand.lookups if lk.where}
    assert hand.where is not None
    query = tmp_path / "filtered.sql"
    joins = []
    for lk in hand.lookups:
        if lk.array:
            continue
        ((mine, theirs),) = lk.on.items()
        on = f"{lk.alias}.{mine} = {lk.parent}.{theirs}"
        if lk.alias in lookup_filters:
            on += f" AND ({lookup_filters[lk.alias]})"
        word = "LEFT JOIN" if lk.how == "left" else "JOIN"
        joins.append(f"{word} {lk.table} {lk.alias} ON {on}")
    arrays = [lk for lk in hand.lookups if lk.array]
    select = [f"{ref} AS {name}" for name, ref in hand.output.key.items()]
    for name, proj in hand.output.columns.items():
        if isinstance(proj, Collect):
            fields = ", ".join(f"'{f}', {r}" for f, r in proj.fields.items())
            select.append(f"json_agg(json_build_object({fields}) ORDER BY u.n) AS {name}")
        else:
            select.append(f"{proj} AS {name}")
    unnest = ""
    group = ""
    if arrays:
        (arr,) = arrays
        ((mine, theirs),) = arr.on.items()
        unnest = (f"CROSS JOIN unnest({arr.parent}.{theirs}) WITH ORDINALITY AS u(x, n) "
                  f"JOIN {arr.table} {arr.alias} ON {arr.alias}.{mine} = u.x AND "
                  f"{arr.where}")
        group = "GROUP BY " + ", ".join([*hand.output.key.values(), *(
            p for p in hand.output.columns.values() if isinstance(p, str))])
    query.write_text(f"INSERT INTO {hand.output.table}\nSELECT {', '.join(select)}\n"
                     f"FROM {hand.fact} {hand.fact_alias} {unnest}\n" + "\n".join(joins)
                     + f"\nWHERE {hand.where}\n{group}\n")
    job = compiled(tmp_path, query, hand.name, ROOT / "jobs" / "orders_filtered.py",
                   semantics=hand.semantics)
    assert job.where is not None and any(lk.where for lk in job.lookups)
    assert declarations(job)["lookups"] == declarations(hand)["lookups"]
    for scenario in scenarios_of(ROOT / "jobs" / "orders_filtered.py"):
        same_output(scenario, hand, job)


# -- the command line ---------------------------------------------------------------------


def test_the_command_prints_or_writes_a_job_that_loads(tmp_path: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(main, ["job", "from-sql", str(SQL / "users_colors.sql"), "--job",
                                str(USERS_COLORS), "--name", "colours"])
    assert done.exit_code == 0, done.output
    assert "note: " in done.stderr and "greatest id" in done.stderr
    assert "# ufc: matched on user_id, not its key: the greatest id wins" in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 100
    printed = tmp_path / "printed.py"
    printed.write_text(done.stdout)
    assert load_job(printed).name == "colours"
    out = tmp_path / "colours.py"
    args = ["job", "from-sql", str(SQL / "orders_flink.sql"), "--job", str(ORDERS),
            "--name", "o2", "--out", str(out)]
    assert runner.invoke(main, args).exit_code == 0
    assert load_job(out).output.table == "orders_enriched"
    again = runner.invoke(main, args)
    assert again.exit_code == 2 and "exists" in again.output


def test_without_an_insert_the_output_table_is_the_name(tmp_path: Path) -> None:
    query = tmp_path / "q.sql"
    query.write_text("SELECT u.id, upper(u.full_name) AS shout FROM users u")
    job = compiled(tmp_path, query, "shouting", USERS_COLORS)
    assert job.output.table == "shouting" and job.output.columns == {
        "shout": "UPPER(u.full_name)"}
    # A view's name is the query's name in the source database, not the job's table: two
    # jobs from one view (one per semantics) would otherwise write one table (issue 73).
    query.write_text("CREATE VIEW loud AS SELECT id, full_name FROM public.users")
    assert compiled(tmp_path, query, "x", USERS_COLORS).output.table == "x"


def test_output_table_names_the_table_over_the_query(tmp_path: Path) -> None:
    out = tmp_path / "o.py"
    done = CliRunner().invoke(main, [
        "job", "from-sql", str(SQL / "orders_flink.sql"), "--job", str(ORDERS), "--name",
        "orders_asof", "--output-table", "orders_asof_out", "--out", str(out)])
    assert done.exit_code == 0, done.output
    job = load_job(out)
    assert (job.name, job.output.table) == ("orders_asof", "orders_asof_out")


def test_the_command_needs_a_place_for_the_declarations(tmp_path: Path) -> None:
    done = CliRunner().invoke(main, ["job", "from-sql", str(SQL / "users_colors.sql"),
                                     "--name", "x"], env={"TXJOIN_SOURCE_DSN": ""})
    assert done.exit_code == 2 and "--dsn DSN" in done.output


# -- refusals: one line, the construct's line and column, why -------------------------------

PIZZERIA_SEED_PG = """\
select orders.id order_id, clients.name client_name, tables.name table_name,
       JSON_AGG(JSON_BUILD_OBJECT('pizza', pizzas.name, 'price', pizzas.price))
from orders
  join table_assignment on orders.table_assignment_id = table_assignment.id
  join pizzas on pizzas.id = ANY (orders.pizzas)
  join clients on table_assignment.client_id = clients.id
  join tables on table_assignment.table_id = tables.id
where orders.order_time > date_trunc('hour', current_timestamp) - interval '1' hour
group by orders.id, clients.name, tables.name;
"""

REFUSED = [
    # (query, line, column, words the line must say)
    (PIZZERIA_SEED_PG, 8, 46, ["current_timestamp reads the clock", "committed state"]),
    ("SELECT o.id FROM orders o WHERE 3 = ANY(o.pizzas)", 1, 37,
     ["= ANY(array) outside a JOIN's ON", "JOIN t ON t.id = ANY(o.col)"]),
    ("SELECT o.id, json_agg(p.name) AS n FROM orders o\n"
     "  LEFT JOIN pizzas p ON p.id = ANY(o.pizzas) GROUP BY o.id", 2, 13,
     ["LEFT JOIN pizzas ON ... = ANY(...)", "one row of NULLs"]),
    ("SELECT o.id, json_agg(json_build_object('n', p.name) ORDER BY p.id) AS n\n"
     "FROM orders o JOIN pizzas p ON p.id = ANY(o.pizzas) GROUP BY o.id", 1, 14,
     ["over = ANY(...)", "first occurrence"]),
    ("SELECT o.id, json_agg(p.name) AS n FROM orders o\n"
     "  JOIN pizzas p ON p.id = ANY(o.table_assignment_id) GROUP BY o.id", 2, 20,
     ["is not an array column"]),
    (PIZZERIA_SEED_PG.replace("= ANY (orders.pizzas)", "= orders.table_assignment_id"),
     8, 46, ["current_timestamp reads the clock", "committed state"]),
    ("SELECT o.id, now() AS t FROM orders o", 1, 14, ["now reads the clock"]),
    ("SELECT o.id,\n  row_number() OVER (ORDER BY o.id) AS r FROM orders o", 2, 3,
     ["window function", "other facts' rows"]),
    ("SELECT DISTINCT ON (o.id) o.id FROM orders o", 1, 8, ["DISTINCT ON"]),
    ("SELECT o.id FROM orders o\nWHERE o.table_assignment_id IN (SELECT id FROM tables)",
     2, 33, ["a subquery"]),
    ("SELECT count(*) AS n FROM orders o", 1, 8, ["count(...)", "an aggregate across facts"]),
    ("SELECT o.id, count(*) AS n FROM orders o GROUP BY o.id", 1, 14,
     ["count", "not supported here", "over child rows"]),
    ("SELECT o.id, c.name FROM orders o\n  JOIN clients c ON c.id = o.id\n"
     "  JOIN tables t ON t.id = c.id AND t.name = o.id::text", 3, 36,
     ["a join not rooted at one fact key"]),
    ("SELECT o.id FROM orders o CROSS JOIN clients c", 1, 38,
     ["CROSS JOIN clients", "a join not rooted at one fact key"]),
    ("SELECT o.id FROM orders o RIGHT JOIN clients c ON c.id = o.id", 1, 38,
     ["RIGHT JOIN clients", "a join not rooted at one fact key"]),
    ("SELECT o.id, p.name FROM orders o\n"
     "  CROSS JOIN unnest(o.pizzas) WITH ORDINALITY AS u(x, n)\n"
     "  JOIN pizzas p ON p.id = u.x", 1, 14, ["p.name", "outside an aggregate"]),
    ("SELECT o.id FROM orders o\n"
     "  CROSS JOIN unnest(o.pizzas) WITH ORDINALITY AS u(x, n)\n"
     "  JOIN pizzas p ON p.id = u.x", 2, 14, ["not aggregated"]),
    ("SELECT o.id, p.name FROM orders o\n"
     "  CROSS JOIN unnest(o.pizzas) WITH ORDINALITY AS u(x, n)\n"
     "  JOIN pizzas p ON p.id = u.x GROUP BY o.id, p.name", 3, 46, ["array element"]),
    ("SELECT c.name FROM orders o JOIN clients c ON c.id = o.table_assignment_id", 1, 1,
     ["primary key o.id"]),
    ("SELECT o.id FROM orders o\n  JOIN tables FOR SYSTEM_TIME AS OF o.order_time ON "
     "tables.id = o.id\n  JOIN clients c ON c.id = o.id", 3, 8, ["every join or on none"]),
    ("SELECT o.id FROM orders o\n"
     "  JOIN tables FOR SYSTEM_TIME AS OF o.proctime AS t ON t.id = o.id",
     2, 37, ["processing time reads the clock"]),
    ("SELECT o.id FROM orders o\n  JOIN tables FOR SYSTEM_TIME AS OF t.id AS t ON t.id = o.id",
     2, 19, ["must be a column of the fact 'o'"]),
    ("SELECT o.id FROM orders o JOIN tables t ON t.id = c.id", 1, 51,
     ["no table or unnest named 'c'"]),
    ("SELECT o.id, p.name FROM orders o\n  JOIN pizzas p ON p.id = o.pizzas", 2, 20,
     ["o.pizzas is an array", "unnest it first"]),
    ("SELECT o.id, o.pizas FROM orders o", 1, 14, ["no (supported) column 'pizas'",
                                                    "did you mean 'pizzas'"]),
    ("SELECT o.id, o.order_time + 1 AS x FROM orders o", 1, 14, ["output column 'x'"]),
    ("SELECT o.id FROM orders o; SELECT 1", 0, 0, ["expected one SELECT"]),
    ("SELECT o.id FROM orders o WHERE )", 1, 33, ["cannot parse the query"]),
]


@pytest.mark.parametrize(("query", "line", "col", "words"), REFUSED,
                         ids=[f"{i}" for i in range(len(REFUSED))])
def test_what_a_job_cannot_be_is_refused_with_its_place(tmp_path: Path, query: str, line: int,
                                                        col: int, words: list[str]) -> None:
    path = tmp_path / "q.sql"
    path.write_text(query)
    with pytest.raises(JobError) as info:
        from_sql(path, "x", job_file=ORDERS)
    message = str(info.value)
    assert "\n" not in message and info.value.exit_code == 2
    assert message.startswith(f"{path}:{line}:{col}: " if line else f"{path}: "), message
    for word in words:
        assert word in message, message


def test_a_refusal_through_the_command_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "seed.sql"
    path.write_text(PIZZERIA_SEED_PG)
    done = CliRunner().invoke(main, ["job", "from-sql", str(path), "--job", str(ORDERS),
                                     "--name", "x"])
    assert done.exit_code == 2
    assert done.output.count("\n") == 1
    assert f"{path}:8:46: current_timestamp reads the clock" in done.output


def test_an_unknown_table_names_the_declarations(tmp_path: Path) -> None:
    path = tmp_path / "q.sql"
    path.write_text(textwrap.dedent("SELECT o.id FROM order o"))
    with pytest.raises(JobError, match=r"declares no table named 'order'.*did you mean"):
        from_sql(path, "x", job_file=ORDERS)


def test_seed_001s_equals_any_is_a_distinct_array_lookup(tmp_path: Path) -> None:
    # The seed's own join (`pizzas.id = ANY (orders.pizzas)`) without its clock filter:
    # each matching pizza once, where the orders job lists every element of the array.
    query = tmp_path / "seed_any.sql"
    query.write_text(PIZZERIA_SEED_PG.replace(
        "where orders.order_time > date_trunc('hour', current_timestamp) - interval '1' hour\n",
        ""))
    job = compiled(tmp_path, query, "orders_any", ORDERS)
    pizzas = job.lookup("pizzas")
    assert (pizzas.array, pizzas.distinct, pizzas.how) == (True, True, "inner")
    assert pizzas.on == {"id": "pizzas"} and pizzas.parent == "orders"
    hand = dataclasses.replace(load_job(ORDERS), semantics="current")
    order = {"id": 1, "table_assignment_id": 1, "order_time": None, "pizzas": [2, None, 1, 2]}
    rows = {"public.pizzas": [{"id": 1, "name": "a", "price": 1}, {"id": 2, "name": "b",
                                                                   "price": 2}],
            "public.orders": [order],
            "public.table_assignment": [{"id": 1, "client_id": 1, "table_id": 1}],
            "public.clients": [{"id": 1, "name": "c"}], "public.tables": [{"id": 1, "name": "t"}]}
    listed = []
    for one in (hand, job):
        oracle = Oracle(one)
        oracle.load_snapshot({t: rows.get(t, []) for t in one.table_names})
        (row,) = oracle.output.values()
        listed.append([p["pizza"] for p in next(v for v in row.values()
                                                 if isinstance(v, list))])
    assert listed == [["b", "a", "b"], ["b", "a"]]  # every element; each row once, in order
