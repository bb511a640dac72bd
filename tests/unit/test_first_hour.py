"""A new user's first hour: messages that name a next step that loses nothing, joins named on
the command line, typos answered with a "did you mean". No server starts here; the stack's
state file is written as `txjoin up` writes it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from txjoin.catalog import CatalogTable, ForeignKey, add_lookups, parse_lookup, propose, render_job
from txjoin.errors import ConfigError, JobError, ServiceError
from txjoin.job import load_job
from txjoin.stack import stack as stack_mod

pytestmark = pytest.mark.unit

LIBRARY = textwrap.dedent("""
    from txjoin.job import Job, Lookup, Output, Table

    job = Job(
        name="library",
        tables=[Table("public.members", {"id": "int", "name": "text"}),
                Table("public.books", {"id": "int", "title": "text"}),
                Table("public.loans", {"id": "int", "member_id": "int", "book_id": "int"})],
        fact="public.loans", fact_alias="loan",
        lookups=[Lookup("member", "public.members", parent="loan", on={"id": "member_id"}),
                 Lookup("book", "public.books", parent="loan", on={"id": "book_id"})],
        output=Output("loans_enriched", key={"id": "loan.id"},
                      columns={"member": "member.name", "title": "book.%s"}),
    )
""")


def _catalog() -> list[CatalogTable]:
    return [CatalogTable("public.members", {"id": "int", "name": "text"}, {}, set(), ["id"]),
            CatalogTable("public.books", {"id": "int", "title": "text"}, {}, set(), ["id"]),
            CatalogTable("public.loans", {"id": "int", "member_id": "int", "book_id": "int"},
                         {}, {"book_id"}, ["id"])]


def _stack_state(directory: Path, **extra: object) -> None:
    """A stopped stack's state file, as `txjoin up --job` records it."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {"version": stack_mod.STATE_VERSION, "dir": str(directory), "stopped": True,
             "pg_dsn_source": "postgresql://u:p@127.0.0.1:1/library",
             "pg_dsn_sink": "postgresql://u:p@127.0.0.1:1/sink",
             "bootstrap_servers": "127.0.0.1:2", "topic_prefix": "library",
             "tables": ["public.loans"], "partitions": 1,
             "sources": [{"name": "default", "prefix": "library", "database": "library",
                          "dsn": "postgresql://u:p@127.0.0.1:1/library", "external": False,
                          "component": "debezium-library", "tables": ["public.loans"]}],
             **extra}
    (directory / stack_mod.STATE_FILE).write_text(json.dumps(state))


def test_a_typo_in_an_output_column_names_the_file_and_the_near_column(tmp_path: Path) -> None:
    path = tmp_path / "library.py"
    path.write_text(LIBRARY % "titel")
    with pytest.raises(JobError) as exc:
        load_job(path)
    message = str(exc.value)
    assert message.startswith(f"{path}: job 'library': "), message
    assert "<inline>" not in message
    assert "column 'titel' is not declared on public.books (did you mean 'title'?)" in message
    path.write_text(LIBRARY % "title")
    assert load_job(path).source_file == str(path)


def test_lookup_on_the_command_line_becomes_a_join() -> None:
    tables = _catalog()
    add_lookups(tables, ["loans.member_id=members.id", "public.loans.book_id=public.books.id"])
    proposal = propose(tables, "public.loans")
    assert [(lk.alias, lk.table.name, lk.on, lk.how) for lk in proposal.lookups] == [
        ("member", "public.members", {"id": "member_id"}, "inner"),
        ("book", "public.books", {"id": "book_id"}, "left")]
    text = render_job(proposal)
    assert "No foreign key joins" not in text
    assert parse_lookup("a.x+y=b.p+q") == ("a", ["x", "y"], "b", ["p", "q"])


@pytest.mark.parametrize("lookup, fragment", [
    ("loans.member=members.id", "public.loans has no column 'member' (did you mean "
                                "'member_id'?)"),
    ("loans.member_id=member.id", "table 'member' is not one of --tables"),
    ("loans.member_id=members.name", "is not the primary key (id) of public.members"),
    ("loans.member_id", "expected TABLE.COLUMN=TABLE.COLUMN"),
    ("loans.member_id+book_id=members.id", "2 column(s) on the left, 1 on the right"),
])
def test_a_wrong_lookup_is_one_line_saying_what(lookup: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as exc:
        add_lookups(_catalog(), [lookup])
    assert fragment in str(exc.value), str(exc.value)


def test_a_job_without_foreign_keys_says_how_to_name_the_joins() -> None:
    text = render_job(propose(_catalog(), "public.loans"))
    assert "lookups=[\n        # No foreign key joins these tables" in text
    assert "--lookup loans.member_id=members.id" in text
    assert isinstance(ForeignKey("x", ["a"], "t", ["id"]), ForeignKey)


def test_a_stopped_job_stack_is_started_again_as_it_was_never_wiped(tmp_path: Path) -> None:
    directory = tmp_path / "stack"
    _stack_state(directory, job_file="jobs/library.py")
    hint = stack_mod.start_hint(directory)
    assert f"txjoin up --dir {directory.resolve()} --job jobs/library.py" in hint
    assert "--wipe" not in hint
    sources, partitions = stack_mod.recorded_start(directory) or ([], 0)
    assert [s.prefix for s in sources] == ["library"] and partitions == 1
    # Asked for another job's sources, the refusal names the non-destructive ways out.
    other = [stack_mod.SourceSpec("default", "shop", ())]
    with pytest.raises(ServiceError) as exc:
        stack_mod.up(directory, sources=other)
    message = str(exc.value)
    assert "has source databases ['library'] (started with --job jobs/library.py)" in message
    assert f"txjoin up --dir {directory.resolve()} --job jobs/library.py" in message
    assert "--wipe" not in message, message
    with pytest.raises(ServiceError, match="partition") as exc:
        stack_mod.up(directory, sources=sources, partitions=3)
    assert "--wipe" not in str(exc.value)


def test_no_stack_recorded_says_how_to_start_one(tmp_path: Path) -> None:
    hint = stack_mod.start_hint(tmp_path / "none")
    assert "txjoin up --dir" in hint and "--wipe" not in hint
    assert stack_mod.recorded_start(tmp_path / "none") is None


def test_ctrl_c_asks_the_run_to_stop_and_a_second_one_stops_at_once() -> None:
    import os
    import signal
    import threading

    from txjoin.pipeline.run import _ctrl_c_stops

    stop = threading.Event()
    before = signal.getsignal(signal.SIGINT)
    with _ctrl_c_stops(stop):
        os.kill(os.getpid(), signal.SIGINT)  # handled between two bytecodes: no traceback
        assert stop.wait(5)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            threading.Event().wait(5)
    assert signal.getsignal(signal.SIGINT) is before


def _record(after: dict[str, object]) -> bytes:
    """One Debezium change record of public.loans, as the connector writes it."""
    return json.dumps({
        "before": None, "after": after, "op": "c", "ts_ms": 1,
        "source": {"schema": "public", "table": "loans", "txId": 7, "lsn": 9, "ts_ms": 1,
                   "snapshot": "false"},
        "transaction": {"id": "7:9", "total_order": 1, "data_collection_order": 1}}).encode()


def test_a_declared_type_the_newest_record_cannot_read_stops_before_spark(
        tmp_path: Path) -> None:
    # Issue 73 item 2: a numeric column declared int, with no source database at hand (its
    # topics are): one line naming the record, table, column, value and declared type.
    from txjoin.pipeline.pipeline import check_record_types

    path = tmp_path / "library.py"
    path.write_text(LIBRARY % "title")
    job = load_job(path)
    loans = next(t for t in job.tables if t.name == "public.loans")
    good = _record({"id": 1, "member_id": 2, "book_id": 3})
    check_record_types(job, loans, "library.public.loans", [(0, 5, good)])
    bad = _record({"id": 1, "member_id": "3.60", "book_id": 3})
    # Only the newest decodable change record is read: a tombstone before it is skipped.
    with pytest.raises(ConfigError) as caught:
        check_record_types(job, loans, "library.public.loans",
                           [(0, 6, None), (0, 5, bad), (0, 4, good)])
    assert str(caught.value) == (
        f"{path}: the newest record of topic 'library.public.loans' (partition 0, offset 5): "
        f"public.loans.member_id: cannot read '3.60' as int; declare the column's type as "
        f"the source has it in the job file's Table (nothing was read or written)")
    check_record_types(job, loans, "library.public.loans", [(0, 6, good), (0, 5, bad)])


def test_spark_writes_no_warehouse_folder_into_the_working_directory() -> None:
    # Issue 73 item 6: a `spark-warehouse/` folder was left in the clone after a run.
    from txjoin.pipeline.session import default_conf

    warehouse = Path(default_conf()["spark.sql.warehouse.dir"])
    assert warehouse.is_absolute() and Path.cwd() not in (warehouse, *warehouse.parents)
