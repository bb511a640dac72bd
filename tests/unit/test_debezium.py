"""Decoding Debezium's JSON envelope: change events, markers, tombstones, and bad input."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.unit.delivery import delete, insert, only, update
from txjoin.errors import DecodeError
from txjoin.ingest.debezium import ChangeEvent, Position, TxMarker, decode
from txjoin.job import load_job
from txjoin.join.oracle import SourceTransaction
from txjoin.scenarios.synthesize import Produced, Synthesizer

ORDERS = load_job(Path(__file__).resolve().parents[2] / "jobs" / "orders.py")
HERE = Position("shop.public.pizzas", 3, 42)
WHERE = "shop.public.pizzas[3]@42"


def decoded(record: Produced) -> Any:
    return decode(record.value, Position(record.topic, 0, record.offset))


@pytest.fixture
def synth() -> Synthesizer:
    s = Synthesizer(ORDERS)
    s.snapshot({"public.pizzas": [{"id": 1, "name": "Margherita", "price": "8.50"},
                                  {"id": 2, "name": "Diavola", "price": "9.00"}]})
    return s


def test_snapshot_rows_decode_as_op_r_without_a_transaction(synth: Synthesizer) -> None:
    first, last = (decoded(r) for r in synth.topics["shop.public.pizzas"])
    assert isinstance(first, ChangeEvent) and isinstance(last, ChangeEvent)
    assert (first.table, first.op, first.xid, first.data_collection_order) == (
        "public.pizzas", "r", None, None)
    assert first.after == {"id": 1, "name": "Margherita", "price": "8.50"}
    assert first.before is None and first.is_snapshot
    assert (first.snapshot, last.snapshot) == ("first", "last")


def test_create_update_delete_decode_with_xid_commit_time_and_numbering(
        synth: Synthesizer) -> None:
    records = synth.transaction(SourceTransaction("t", [
        insert("pizzas", id=3, name="Napoli", price="12.25"),
        update("pizzas", id=1, name="Margherita", price="9.99"),
        delete("pizzas", id=2)]))
    created, updated, deleted = (decoded(r) for r in only(records, kind="data"))
    begin = decoded(only(records, kind="begin")[0])
    assert [e.op for e in (created, updated, deleted)] == ["c", "u", "d"]
    assert {e.xid for e in (created, updated, deleted)} == {begin.xid} == {synth.xid}
    assert [e.data_collection_order for e in (created, updated, deleted)] == [1, 2, 3]
    assert created.before is None and created.after["name"] == "Napoli"
    assert updated.before["price"] == "8.50" and updated.after["price"] == "9.99"
    assert deleted.before["id"] == 2 and deleted.after is None
    assert created.commit_ts_ms == begin.ts_ms and created.snapshot == "false"
    assert len({e.lsn for e in (created, updated, deleted)}) == 3
    assert not created.is_snapshot


def test_tombstone_after_a_delete_decodes_to_none(synth: Synthesizer) -> None:
    records = synth.transaction(SourceTransaction("t", [delete("pizzas", id=2)]))
    (tombstone,) = only(records, kind="tombstone")
    assert tombstone.value is None
    assert decoded(tombstone) is None
    assert decode(json.dumps({"schema": {}, "payload": None}), HERE) is None


def test_begin_and_end_match_on_the_xid_although_their_lsn_parts_differ(
        synth: Synthesizer) -> None:
    records = synth.transaction(SourceTransaction("t", [
        insert("pizzas", id=3, name="Napoli", price="12.25"),
        insert("orders", id=1, table_assignment_id=1, order_time="2023-09-23T22:00:00",
               pizzas=[3]),
        insert("orders", id=2, table_assignment_id=1, order_time="2023-09-23T22:00:00",
               pizzas=[3, 3])]))
    begin = decoded(only(records, kind="begin")[0])
    end = decoded(only(records, kind="end")[0])
    data = [decoded(r) for r in only(records, kind="data")]
    assert isinstance(begin, TxMarker) and isinstance(end, TxMarker)
    assert (begin.status, end.status) == ("BEGIN", "END")
    assert begin.id != end.id and begin.commit_lsn != end.commit_lsn
    assert begin.xid == end.xid == data[0].xid == int(end.id.split(":")[0])
    assert begin.event_count is None and begin.counts is None
    assert end.event_count == 3
    assert end.counts == {"public.pizzas": 1, "public.orders": 2}


def test_end_with_zero_events_decodes_with_empty_counts() -> None:
    end = decode(json.dumps({"status": "END", "id": "7:100", "event_count": 0,
                             "data_collections": [], "ts_ms": 5}), HERE)
    assert isinstance(end, TxMarker)
    assert (end.xid, end.commit_lsn, end.event_count, end.counts) == (7, 100, 0, {})


def test_decimal_strings_stay_raw_until_the_job_converts_them(synth: Synthesizer) -> None:
    event = decoded(synth.topics["shop.public.pizzas"][0])
    assert event.after["price"] == "8.50"
    assert ORDERS.table("public.pizzas").convert_row(event.after)["price"] == Decimal("8.50")


def test_event_identity_ignores_the_processing_time_of_a_resend(synth: Synthesizer) -> None:
    records = synth.transaction(SourceTransaction("t", [delete("pizzas", id=1)]))
    doc = json.loads(only(records, kind="data")[0].value or "")
    first = decode(json.dumps(doc), HERE)
    doc["ts_ms"] += 60_000
    doc["transaction"]["total_order"] = 9
    again = decode(json.dumps(doc), HERE)
    assert isinstance(first, ChangeEvent) and isinstance(again, ChangeEvent)
    assert first.identity == again.identity


# -- bad input -------------------------------------------------------------------------


def _event(**overrides: Any) -> str:
    doc: dict[str, Any] = {
        "before": None, "after": {"id": 1, "name": "Margherita", "price": "8.50"},
        "source": {"schema": "public", "table": "pizzas", "txId": 2238, "lsn": 72261064,
                   "ts_ms": 1, "snapshot": "false"},
        "transaction": {"id": "2238:72261064", "total_order": 1, "data_collection_order": 1},
        "op": "c", "ts_ms": 2}
    doc.update(overrides)
    return json.dumps(doc)


def _end(**overrides: Any) -> str:
    doc: dict[str, Any] = {
        "status": "END", "id": "2238:72261448", "event_count": 3,
        "data_collections": [{"data_collection": "public.orders", "event_count": 2},
                             {"data_collection": "public.clients", "event_count": 1}],
        "ts_ms": 1}
    doc.update(overrides)
    return json.dumps(doc)


BAD_INPUT = {
    "not JSON": ("{'op': 'c'", "not JSON"),
    "not UTF-8": (b"\xff\xfe{}", "not JSON"),
    "JSON array": ("[1, 2]", "JSON list, expected an object"),
    "neither event nor marker": ('{"hello": 1}', "neither a change event"),
    "missing source": (_event(source=None), "`source` block missing"),
    "source without table": (_event(source={"schema": "public"}), "lacks schema/table"),
    "unknown op": (_event(op="x"), "unknown op 'x'"),
    "logical message": (_event(op="m"), "'m' messages are not supported"),
    "create without after": (_event(after=None), "without `after`"),
    "delete without before": (_event(op="d", after=None), "REPLICA IDENTITY"),
    "no transaction block": (_event(transaction=None), "provide.transaction.metadata=true"),
    "snapshot row in a transaction": (_event(op="r"), "carries a transaction block"),
    "txId disagreeing with transaction.id": (
        _event(transaction={"id": "2239:72261064"}), "disagrees with source.txId"),
    "transaction id not xid:lsn": (_event(transaction={"id": "tx-2238"}), "'<xid>:<lsn>'"),
    "transaction id with a non-numeric xid": (
        _event(transaction={"id": "abc:72261064"}), "'<xid>:<lsn>'"),
    "transaction id not a string": (_event(transaction={"id": 22.38}), "is not a string"),
    "marker id not xid:lsn": (_end(id="2238/72261448"), "'<xid>:<lsn>'"),
    "marker with an unknown status": (_end(status="COMMIT"), "not BEGIN or END"),
    "END count differs from data_collections": (
        _end(event_count=4), "event_count 4 differs from the sum of data_collections 3"),
    "END without event_count": (_end(event_count=None), "expected an int"),
    "END with a malformed data_collections entry": (
        _end(event_count=1, data_collections=[{"data_collection": "public.orders"}]),
        "lacks data_collection/event_count"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUT))
def test_bad_input_raises_naming_topic_partition_and_offset(name: str) -> None:
    value, what = BAD_INPUT[name]
    with pytest.raises(DecodeError) as exc:
        decode(value, HERE)
    message = str(exc.value)
    assert WHERE in message, message
    assert what in message, message
    assert (exc.value.topic, exc.value.partition, exc.value.offset) == (
        "shop.public.pizzas", 3, 42)


def test_schemas_enable_true_payload_decodes_like_the_plain_value() -> None:
    plain = decode(_event(), HERE)
    wrapped = decode(json.dumps({"schema": {"type": "struct"},
                                 "payload": json.loads(_event())}), HERE)
    assert wrapped == plain
    with pytest.raises(DecodeError, match=r"shop\.public\.pizzas\[3\]@42.*payload"):
        decode(json.dumps({"schema": {}, "payload": [1]}), HERE)



def test_bytes_and_str_values_decode_alike_with_the_json_error_messages() -> None:
    assert decode(_event().encode(), HERE) == decode(_event(), HERE)
    assert decode(_end().encode(), HERE) == decode(_end(), HERE)
    for bad in ("{'op': 'c'", b"{'op': 'c'", ""):
        with pytest.raises(DecodeError) as exc:
            decode(bad, HERE)
        # The message is json's, as before decoding moved to orjson.
        with pytest.raises(ValueError) as reference:
            json.loads(bad)
        assert f"value is not JSON ({reference.value})" in str(exc.value)


def test_a_nan_double_as_jackson_writes_it_still_decodes() -> None:
    event = decode(_event().replace('"price": "8.50"', '"price": NaN'), HERE)
    assert isinstance(event, ChangeEvent) and event.after is not None
    assert event.after["price"] != event.after["price"]  # NaN


def test_row_columns_are_the_rows_names_and_none_where_a_record_has_no_row() -> None:
    """What `txjoin run` compares the declared columns with (the newest records of a topic)."""
    import json

    from txjoin.ingest.debezium import Position, row_columns

    pos = Position("shop.public.loans", 0, 3)
    source = {"schema": "public", "table": "loans", "txId": 7, "lsn": 7, "ts_ms": 1}
    tx = {"id": "7:7", "total_order": 1, "data_collection_order": 1}
    created = {"op": "c", "before": None, "after": {"id": 1, "book_id": 2}, "source": source,
               "transaction": tx}
    deleted = {"op": "d", "before": {"id": 1, "due": None}, "after": None, "source": source,
               "transaction": tx}
    assert row_columns(json.dumps(created), pos) == ["id", "book_id"]
    assert row_columns(json.dumps(deleted), pos) == ["id", "due"]
    assert row_columns(json.dumps({"schema": {}, "payload": created}), pos) == ["id", "book_id"]
    assert row_columns(None, pos) is None  # a tombstone
    assert row_columns(b"not json", pos) is None  # the run reports it, at its position
    assert row_columns(json.dumps({"status": "BEGIN", "id": "7:7"}), pos) is None


def test_routed_is_the_event_with_routings_fields_replaced() -> None:
    """ChangeEvent.routed (routing's hot path) gives what dataclasses.replace would."""
    from dataclasses import fields, replace

    event = ChangeEvent("public.orders", "u", {"id": 1}, {"id": 1, "x": 2}, 7, 90, 1000,
                        "false", 3, Position("shop.public.orders", 1, 5), b"old", True)
    for digest in (None, b"d"):
        for elsewhere in (False, True):
            assert event.routed(digest, elsewhere) == replace(
                event, digest=digest, after_elsewhere=elsewhere)
            assert event.routed(digest, elsewhere, rows=False) == replace(
                event, digest=digest, after_elsewhere=elsewhere, before=None, after=None)
    # a field added to ChangeEvent must be added to routed() too
    assert len(fields(ChangeEvent)) == 12
