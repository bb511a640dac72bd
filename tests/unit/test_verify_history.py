"""verify's record: test_decoding's text read back to every column type the readers take.

The lines are test_decoding's output as PostgreSQL 18 printed it for the e2e test's
schema of a user's own database (tests/e2e/test_own_database.py), in a session with
``TIME ZONE 'UTC'`` and ``intervalstyle = 'iso_8601'`` as verify decodes: numbers and
booleans unquoted, other values single-quoted with '' for ', ``null``, arrays as
literals, an UPDATE's old tuple after ``old-key:`` without its null columns.
"""

from __future__ import annotations

import datetime as dt
import json
import marshal
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txjoin.job import Job, Lookup, Output, Table
from txjoin.verify.history import (
    DecodedChange,
    ParsedRecord,
    Record,
    _whole_transactions,
    decode_change,
    expected_as_of,
    parse_array,
    parse_record,
    parsed_path,
    row_values,
)
from txjoin.verify.verify import _read_logged

pytestmark = pytest.mark.unit

CUSTOMER = ("table public.customers: INSERT: id[integer]:2 name[character varying]:'cust 6''9' "
            "code[character]:null mood[mood]:'curious' signup[date]:'2024-02-15' "
            "vip[boolean]:false score[real]:-3.75 balance[money]:'-$3,659.85' "
            "ref[uuid]:'966baea1-48be-ab13-4da9-8f1d3099fdf5' "
            "profile[jsonb]:'{\"n\": [1, 2], \"tier\": 2.5}' "
            "tags[text[]]:'{\"x,y\",\"q\\\"z\",NULL,a}' "
            "avatar[bytea]:'\\x11f57cce' opens[time without time zone]:'09:52:00.181411' "
            "closes[time with time zone]:'23:30:00-05:30' grace[interval]:'PT-1.5S' "
            "small[smallint]:-7 big[bigint]:9000000000 ints[integer[]]:'{1,NULL,3}'")
ORDER = ("table public.orders: INSERT: id[bigint]:2 customer_id[integer]:2 qty[posint]:'2' "
         "amount[numeric]:7191.84 exact[numeric]:0.000001 rate[double precision]:77.84426150001458 "
         "placed_at[timestamp with time zone]:'2025-03-09 14:30:00+00' "
         "local_at[timestamp without time zone]:'2025-03-06 08:15:00.501' "
         "meta[json]:'[1, 2.5, \"x\"]' lines[numeric[]]:'{1.50,2.25}' note[text]:null "
         "logged[timestamp without time zone]:'2025-04-01 07:00:00.323516' "
         "refs[uuid[]]:'{8cfe5cd1-2d5d-b79b-a2a7-ae1f3ac7652c,NULL}' "
         "days[date[]]:'{2024-02-29,1999-12-31}' blobs[bytea[]]:'{\"\\\\x0001\",\"\\\\x\"}' "
         "slots[time without time zone[]]:'{10:00:00.5,23:59:59}' moods[mood[]]:'{happy,sad}' "
         "flags[boolean[]]:'{t,f}'")

CUSTOMERS = Table("public.customers", {
    "id": "int", "name": "varchar(40)", "code": "char(4)", "mood": "text", "signup": "date",
    "vip": "bool", "score": "real", "balance": "money", "ref": "uuid", "profile": "jsonb",
    "tags": "text[]", "avatar": "bytea", "opens": "time", "closes": "timetz(3)",
    "grace": "interval", "small": "smallint", "big": "bigint", "ints": "int[]"})
ORDERS = Table("public.orders", {
    "id": "bigint", "customer_id": "int", "qty": "int", "amount": "numeric(10,2)",
    "exact": "numeric", "rate": "double", "placed_at": "timestamptz", "local_at": "timestamp(3)",
    "meta": "json", "lines": "numeric(8,2)[]", "note": "text", "logged": "timestamp",
    "refs": "uuid[]", "days": "date[]", "blobs": "bytea[]", "slots": "time[]", "moods": "text[]",
    "flags": "bool[]"})
JOB = Job(name="orders", tables=[CUSTOMERS, ORDERS], fact="public.orders", fact_alias="o",
          lookups=[Lookup("c", "public.customers", parent="o", on={"id": "customer_id"})],
          output=Output(table="out", key={"order_id": "o.id"},
                        columns={"name": "c.name", "qty": "o.qty"}))


def read(table: Table, line: str) -> dict[str, object]:
    change = decode_change(line)
    assert change is not None and change.op == "INSERT" and change.old is None
    row = _read_logged(JOB, table.name, row_values(change.new), "test")
    assert row is not None
    return row


def test_every_column_type_of_a_customer_reads_as_its_declared_type() -> None:
    assert read(CUSTOMERS, CUSTOMER) == {
        "id": 2, "name": "cust 6'9", "code": None, "mood": "curious",
        "signup": dt.date(2024, 2, 15), "vip": False, "score": -3.75,
        "balance": Decimal("-3659.85"), "ref": "966baea1-48be-ab13-4da9-8f1d3099fdf5",
        "profile": '{"n": [1, 2], "tier": 2.5}', "tags": ["x,y", 'q"z', None, "a"],
        "avatar": b"\x11\xf5\x7c\xce", "opens": dt.time(9, 52, 0, 181411),
        "closes": dt.time(5, 0),  # 23:30-05:30 in UTC
        "grace": dt.timedelta(seconds=-1.5), "small": -7, "big": 9000000000, "ints": [1, None, 3]}


def test_every_column_type_of_an_order_reads_as_its_declared_type() -> None:
    assert read(ORDERS, ORDER) == {
        "id": 2, "customer_id": 2, "qty": 2, "amount": Decimal("7191.84"),
        "exact": "0.000001", "rate": 77.84426150001458,
        "placed_at": dt.datetime(2025, 3, 9, 14, 30, tzinfo=dt.UTC),
        "local_at": dt.datetime(2025, 3, 6, 8, 15, 0, 501000, tzinfo=dt.UTC),
        "meta": '[1, 2.5, "x"]', "lines": [Decimal("1.50"), Decimal("2.25")],
        "note": None, "logged": dt.datetime(2025, 4, 1, 7, 0, 0, 323516, tzinfo=dt.UTC),
        "refs": ["8cfe5cd1-2d5d-b79b-a2a7-ae1f3ac7652c", None],
        "days": [dt.date(2024, 2, 29), dt.date(1999, 12, 31)], "blobs": [b"\x00\x01", b""],
        "slots": [dt.time(10, 0, 0, 500000), dt.time(23, 59, 59)], "moods": ["happy", "sad"],
        "flags": [True, False]}


def test_an_update_keeps_its_old_tuple_and_a_delete_its_replica_identity() -> None:
    update = decode_change(
        "table public.customers: UPDATE: old-key: id[integer]:1 name[character varying]:'a b' "
        "new-tuple: id[integer]:1 name[character varying]:'a b''' code[character]:null")
    assert update == DecodedChange("public.customers", "UPDATE",
                                   {"id": ("integer", "1"), "name": ("character varying", "a b")},
                                   {"id": ("integer", "1"), "name": ("character varying", "a b'"),
                                    "code": ("character", None)})
    plain = decode_change("table public.t: UPDATE: id[integer]:1 v[text]:'x'")
    assert plain is not None and plain.old is None and plain.new == {
        "id": ("integer", "1"), "v": ("text", "x")}
    delete = decode_change("table public.orders: DELETE: id[bigint]:5")
    assert delete == DecodedChange("public.orders", "DELETE", {"id": ("bigint", "5")}, None)
    assert decode_change("table public.orders: TRUNCATE: (no-flags)") == DecodedChange(
        "public.orders", "TRUNCATE", None, None)
    assert decode_change("BEGIN 754") is None and decode_change("COMMIT 754") is None


def test_array_literals_keep_quotes_commas_backslashes_and_nulls() -> None:
    assert parse_array("{}") == []
    assert parse_array('{"a,b","q\\"z","\\\\x00",NULL,"NULL",plain}') == [
        "a,b", 'q"z', "\\x00", None, "NULL", "plain"]
    assert parse_array('{""}') == [""]


def _insert(table: str, **values: tuple[str, str | None]) -> DecodedChange:
    return DecodedChange(table, "INSERT", None, dict(values))


def test_each_fact_is_the_job_as_of_the_commit_that_last_changed_it() -> None:
    cust = {"id": ("integer", "1"), "name": ("character varying", "Ann")}
    renamed = {"id": ("integer", "1"), "name": ("character varying", "Anna")}
    order = {"id": ("bigint", "10"), "customer_id": ("integer", "1"), "qty": ("integer", "1")}
    old_order = {"id": ("bigint", "9"), "customer_id": ("integer", "1"), "qty": ("integer", "1")}
    record = Record(
        snapshot={"public.customers": [], "public.orders": [row_values(old_order) or {}]},
        transactions=[
            (1, [_insert("public.customers", **cust), _insert("public.orders", **order)]),
            (2, [DecodedChange("public.customers", "UPDATE", None, renamed)]),
            (3, [_insert("public.orders", id=("bigint", "11"), customer_id=("integer", "1"),
                         qty=("integer", "2")),
                 _insert("public.orders", id=("bigint", "12"), customer_id=("integer", "1"),
                         qty=("integer", "3"))]),
            (4, [DecodedChange("public.orders", "DELETE", {"id": ("bigint", "12")}, None)]),
        ])
    answer = expected_as_of(JOB, record, "test")
    # Order 10 keeps the name as of its own commit; 11 sees the rename; 12 was deleted;
    # 9 predates the record: its customer as of its commit is unknown.
    assert sorted(answer.present, key=lambda r: r["order_id"]) == [
        {"order_id": 10, "name": "Ann", "qty": 1}, {"order_id": 11, "name": "Anna", "qty": 2}]
    assert answer.absent == {(12,)}
    assert answer.unchecked == [(9,)]
    assert answer.transactions == 4


def test_a_recorded_value_that_is_not_the_declared_type_names_the_fix() -> None:
    from txjoin.errors import ConfigError

    record = Record(snapshot={}, transactions=[(7, [_insert(
        "public.orders", id=("bigint", "1"), customer_id=("integer", "1"),
        qty=("text", "many"))])])
    with pytest.raises(ConfigError, match=r"xid 7.*declare the column's type in the job's "
                                          r"Table as that database has it"):
        expected_as_of(JOB, record, "the source")


def test_a_child_rows_change_re_evaluates_the_facts_it_leaves_and_joins() -> None:
    # Issue 73 item 5: the facts a changed child row references are found by its link
    # values in one pass over the facts (no longer a scan of every fact per child row).
    from txjoin.job import Aggregate, Children

    trips = Table("public.trips", {"id": "int", "fare": "int"})
    stops = Table("public.stops", {"id": "int", "trip_id": "int", "place": "text"})
    job = Job(name="trips", tables=[trips, stops], fact="public.trips", fact_alias="t",
              lookups=[Children("s", "public.stops", parent="t", on={"trip_id": "id"})],
              output=Output(table="out", key={"trip_id": "t.id"},
                            columns={"stops": Aggregate("s", "count"), "fare": "t.fare"}))

    def stop(id_: int, trip: int) -> dict[str, tuple[str, str]]:
        return {"id": ("integer", str(id_)), "trip_id": ("integer", str(trip)),
                "place": ("text", f"p{id_}")}

    record = Record(snapshot={"public.trips": [], "public.stops": []}, transactions=[
        (1, [_insert("public.trips", id=("integer", "1"), fare=("integer", "5")),
             _insert("public.trips", id=("integer", "2"), fare=("integer", "7")),
             _insert("public.trips", id=("integer", "3"), fare=("integer", "9")),
             _insert("public.stops", **stop(10, 1)), _insert("public.stops", **stop(11, 1))]),
        # Stop 11 moves to trip 2: both trips change as of this commit; trip 3 does not.
        (2, [DecodedChange("public.stops", "UPDATE", stop(11, 1), stop(11, 2))]),
        (3, [DecodedChange("public.stops", "DELETE", stop(10, 1), None)]),
    ])
    answer = expected_as_of(job, record, "test")
    assert sorted(answer.present, key=lambda r: r["trip_id"]) == [
        {"trip_id": 1, "stops": 0, "fare": 5}, {"trip_id": 2, "stops": 1, "fare": 7},
        {"trip_id": 3, "stops": 0, "fare": 9}]


def test_the_replay_says_how_far_it_got_and_reads_only_the_jobs_tables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 73 item 5: a line every PROGRESS_SECONDS while the record replays (on a
    # terminal, verify's own progress lines); a table outside the job is not parsed.
    from txjoin.verify import verify

    monkeypatch.setattr(verify, "PROGRESS_SECONDS", 0.0)
    record = Record(snapshot={}, transactions=[
        (n, [_insert("public.customers", id=("integer", str(n)),
                     name=("character varying", "x"))]) for n in range(1, 4)])
    lines: list[str] = []
    expected_as_of(JOB, record, "test", lines.append)
    assert lines[-1] == "verify: replaying the record: 2 of 3 transactions, 0 facts evaluated"
    assert decode_change("table public.txjoin_changes: INSERT: id[bigint]:1",
                         {"public.orders"}) is None
    assert decode_change(CUSTOMER, {"public.customers"}) is not None


def test_a_record_cut_in_an_append_keeps_its_whole_transactions_and_drops_the_rest(
        tmp_path: Path) -> None:
    """What a verify killed in the middle of an append leaves (the kill itself, on a real
    PostgreSQL: tests/e2e/test_verify_record_kill.py): a transaction without its COMMIT and
    a line cut short after the last whole one. The next verify cuts them off, so it appends
    that transaction again from the slot instead of skipping its xid for ever."""
    def line(xid: int, data: str) -> str:
        return json.dumps({"lsn": "0/1", "xid": xid, "data": data}) + "\n"

    whole = (json.dumps({"slot": "txjoin_verify", "lsn": "0/0", "snapshot": {}}) + "\n"
             + line(7, "BEGIN 7") + line(7, "table public.t: INSERT: id[integer]:1")
             + line(7, "COMMIT 7") + line(8, "BEGIN 8") + line(8, "COMMIT 8"))
    path = tmp_path / "record.jsonl"
    cut = line(9, "BEGIN 9") + line(9, "table public.t: INSERT: id[integer]:2")
    for tail in ("", cut, cut + line(9, "table public.t: DELETE: id[integer]:1")[:25]):
        path.write_text(whole + tail)
        assert _whole_transactions(path) == {7, 8}
        assert path.read_text() == whole


# -- the parsed record kept beside the record file (issue 73 item 5) -------------------------

_LINE_TABLES = ("public.a", "public.b")


def _fresh_parse(path: Path, tables: set[str] | None) -> Record:
    """The record read as verify read it before it kept its parse: every line of the whole
    transactions, parsed again."""
    lines = path.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    whole = 1
    for n, line in enumerate(lines[1:], 1):
        if line.endswith("\n") and json.loads(line)["data"].startswith("COMMIT"):
            whole = n + 1
    order: list[int] = []
    changes: dict[int, list[DecodedChange]] = {}
    for line in lines[1:whole]:
        entry = json.loads(line)
        if entry["data"].startswith("BEGIN"):
            order.append(entry["xid"])
            changes[entry["xid"]] = []
        elif (change := decode_change(entry["data"], tables)) is not None:
            changes.setdefault(entry["xid"], []).append(change)
    snapshot = {t: [row_values(r) or {} for r in rows] for t, rows in header["snapshot"].items()}
    return Record(snapshot, [(x, changes.get(x, [])) for x in order])


def _record_lines(transactions: list[tuple[int, list[tuple[str, str, int]]]]) -> str:
    def line(xid: int, data: str) -> str:
        return json.dumps({"lsn": "0/1", "xid": xid, "data": data}) + "\n"

    text = ""
    for xid, changes in transactions:
        text += line(xid, f"BEGIN {xid}")
        for table, op, key in changes:
            text += line(xid, f"table {table}: {op}: id[integer]:{key} "
                              f"name[text]:'n''{key}'")
        text += line(xid, f"COMMIT {xid}")
    return text


_CHANGES = st.lists(st.tuples(st.sampled_from(_LINE_TABLES), st.sampled_from(
    ["INSERT", "UPDATE", "DELETE"]), st.integers(-5, 5)), max_size=4)


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.lists(_CHANGES, max_size=5), then=st.lists(_CHANGES, max_size=5),
       cut=st.integers(0, 200), tables=st.sampled_from([None, {"public.a"}, set(_LINE_TABLES)]),
       later_tables=st.sampled_from([None, {"public.b"}, {"public.a"}]))
def test_the_kept_parse_always_reads_as_a_fresh_parse_of_the_whole_file(
        tmp_path_factory: pytest.TempPathFactory,
        first: list[list[tuple[str, str, int]]], then: list[list[tuple[str, str, int]]],
        cut: int, tables: set[str] | None, later_tables: set[str] | None) -> None:
    # A verify after the first parses only the lines appended since the last; the record
    # it returns is the one a parse of the whole file gives: after an append, with a
    # partial transaction at the end (a killed append), once that is cut off and appended
    # again, for other tables than the parse kept, and for a record started again.
    path = tmp_path_factory.mktemp("record") / "record.jsonl"
    header = json.dumps({"slot": "txjoin_verify", "lsn": "0/0", "snapshot": {
        "public.a": [{"id": ["integer", "1"], "name": ["text", None]}]}}) + "\n"
    old = list(enumerate(first, 100))
    new = list(enumerate(then, 200))
    path.write_text(header + _record_lines(old))
    assert parse_record(path, tables) == _fresh_parse(path, tables)
    assert parsed_path(path).exists()
    whole_then = _record_lines(new)
    partial = whole_then[:cut] if cut < len(whole_then) else ""
    with path.open("a") as out:
        out.write(partial)  # a verify killed in the middle of its append
    assert parse_record(path, tables) == _fresh_parse(path, tables)
    assert _whole_transactions(path, ParsedRecord.load(parsed_path(path), path.read_bytes())
                               .length) <= {x for x, _ in new}
    commits = sum(1 for line in partial.splitlines(keepends=True)
                  if line.endswith("\n") and '"data": "COMMIT' in line)
    assert path.read_text() == header + _record_lines(old) + _record_lines(new[:commits])
    path.write_text(header + _record_lines(old) + whole_then)  # appended again, whole
    assert parse_record(path, tables) == _fresh_parse(path, tables)
    assert parse_record(path, later_tables) == _fresh_parse(path, later_tables)
    assert parse_record(path, tables) == _fresh_parse(path, tables)
    path.write_text(header + _record_lines(new))  # --drop-record, then --record again
    assert parse_record(path, tables) == _fresh_parse(path, tables)


def test_a_torn_or_foreign_kept_parse_is_rebuilt_from_the_record(tmp_path: Path) -> None:
    path = tmp_path / "record.jsonl"
    path.write_text(json.dumps({"slot": "txjoin_verify", "lsn": "0/0", "snapshot": {}}) + "\n"
                    + _record_lines([(7, [("public.a", "INSERT", 1)])]))
    fresh = _fresh_parse(path, None)
    assert parse_record(path) == fresh
    kept = parsed_path(path).read_bytes()
    for broken in (kept[:len(kept) // 2], b"", b"not marshal", marshal.dumps({"layout": 0})):
        parsed_path(path).write_bytes(broken)
        assert parse_record(path) == fresh
        assert parsed_path(path).read_bytes() == kept


def test_the_records_parse_says_how_far_it_got(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 73 item 5: the first verify after a workload parses what it appended, on a
    # terminal with a line every PROGRESS_SECONDS; a later one only what came since.
    from txjoin.verify import verify

    monkeypatch.setattr(verify, "PROGRESS_SECONDS", 0.0)
    path = tmp_path / "record.jsonl"
    path.write_text(json.dumps({"slot": "txjoin_verify", "lsn": "0/0", "snapshot": {}}) + "\n"
                    + _record_lines([(7, [("public.a", "INSERT", 1)]), (8, [])]))
    lines: list[str] = []
    parse_record(path, None, None, lines.append)
    assert lines == ["verify: reading the record: 0.0 of 0.0 MB new since the last verify"] * 2
    lines.clear()
    parse_record(path, None, None, lines.append)
    assert lines == []


_FAST = Table("public.fast", {"id": "int", "n": "bigint", "s": "text", "b": "bool",
                              "d": "double", "m": "money"})
_VALUES = st.one_of(st.none(), st.integers(-3, 3), st.booleans(), st.text(max_size=3),
                    st.floats(allow_nan=False), st.just("-$1,234.50"))


_OF_TYPE = {"id": st.integers(), "n": st.integers(), "s": st.text(max_size=3),
            "b": st.booleans(), "d": st.floats(allow_nan=False), "m": st.just("-$1,234.50")}


@settings(max_examples=200, deadline=None)
@given(row=st.fixed_dictionaries({c: st.one_of(v, v, v, _VALUES) for c, v in _OF_TYPE.items()},
                                 optional={"extra": _VALUES}),
       money=st.booleans(), drop=st.sets(st.sampled_from(sorted(_OF_TYPE)), max_size=1))
def test_a_row_whose_values_are_already_their_types_reads_as_the_full_reading_reads_it(
        row: dict[str, object], money: bool, drop: set[str]) -> None:
    # _read_logged skips its two steps for a row of every declared column with each value
    # of its type's Python type; the answer is the two steps' (or the same error).
    from txjoin.verify.verify import Modes, _as_captured

    table = _FAST if money else Table("public.fast", {
        c: t for c, t in _FAST.columns.items() if c != "m"})
    row = {c: v for c, v in row.items() if c not in drop and (money or c != "m")}
    job = Job(name="fast", tables=[table], fact="public.fast", fact_alias="f", lookups=[],
              output=Output(table="fast", key={"id": "f.id"}, columns={"s": "f.s"}))

    def both_steps() -> object:
        captured = {c: _as_captured(v, table.columns[c]) if c in table.columns else v
                    for c, v in row.items()}
        return table.convert_row(captured, where="w", modes=Modes())

    try:
        expected = both_steps()
    except Exception as exc:  # the same error either way
        with pytest.raises(type(exc)):
            _read_logged(job, "public.fast", row, "w")
        return
    assert _read_logged(job, "public.fast", row, "w") == expected
    assert list(_read_logged(job, "public.fast", row, "w") or {}) == list(expected or {})
