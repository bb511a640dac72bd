"""Delta group commits on delta-spark: many micro-batches, one commit per table.

The committer's protocol (hand-off, interval, backpressure, kills) is covered without Spark
in tests/unit/test_handoff.py; here the real Delta tables: what one group commit writes, its
lineage, its checksum files, a crash between the two tables' commits, and the hand-off's
byte limit with the committer thread running (the kill -9 of each of the committer's
crash points: tests/spark/test_kill.py).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from tests.spark.test_sinks import SCHEMA, batch, change
from txjoin.sinks.delta import DeltaSink
from txjoin.sinks.handoff import GroupCommitter, Handoff, Parcel
from txjoin.sinks.lineage import Lineage

pytestmark = pytest.mark.spark


def parcel(batch_id: int, *changes: dict) -> Parcel:
    return Parcel(batch_id, batch(*changes), Lineage("ckpt", batch_id + 10), time.time())


def _commit_infos(path: str) -> list[dict]:
    return [json.loads(c["userMetadata"])
            for log in sorted((Path(path) / "_delta_log").glob("*.json"))
            for action in map(json.loads, log.read_text().splitlines())
            if (c := action.get("commitInfo")) and "userMetadata" in c]


def test_a_group_is_one_commit_per_table_and_a_crash_between_them_applies_nothing_twice(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sink = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    group = [parcel(0, change("c", 1, 1), change("c", 2, 2)),
             parcel(1),  # a batch that only buffered
             parcel(2, change("u", 1, 3, total="7.00"), change("d", 2, 4))]
    assert set(sink.write_group(group)) == {"changelog", "current"}

    # One commit per table after its creation, carrying the range's lineage.
    for path in (sink.changelog_path, sink.current_path):
        assert DeltaTable(path).version() == 1
        assert _commit_infos(path)[-1] == {
            "txjoin.job": "job", "txjoin.checkpoint": "ckpt", "txjoin.first_batch_id": 0,
            "txjoin.batch_id": 2, "txjoin.frontier_commit_seq": 12,
            "txjoin.last_change_xid": 1004}
        # Delta's checksum chain is kept (the next commit need not rebuild the log state).
        assert (Path(path) / "_delta_log" / f"{1:020d}.crc").exists()
    assert [r["_commit_seq"] for r in sink.read_changelog()] == [1, 2, 3, 4]
    assert [(r["order_id"], r["total"]) for r in sink.read_current()] == \
        [(1, pytest.approx(7))]

    # The next group dies between the changelog's commit and the current table's.
    def die(*args: object) -> None:
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(sink, "_merge_current", die)
    with pytest.raises(KeyboardInterrupt):
        sink.write_group([parcel(3, change("c", 3, 5)), parcel(4, change("u", 3, 6))])
    assert [r["_commit_seq"] for r in sink.read_changelog()] == [1, 2, 3, 4, 5, 6]
    assert [r["order_id"] for r in sink.read_current()] == [1]

    # A new process commits what the hand-off still holds, and one batch more.
    restarted = DeltaSink(str(tmp_path), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    wrote = restarted.write_group([parcel(3, change("c", 3, 5)), parcel(4, change("u", 3, 6)),
                                   parcel(5, change("c", 4, 7))])
    assert set(wrote) == {"changelog", "current"}
    assert [r["_commit_seq"] for r in restarted.read_changelog()] == [1, 2, 3, 4, 5, 6, 7]
    assert [(r["order_id"], r["_commit_seq"]) for r in restarted.read_current()] == \
        [(1, 3), (3, 6), (4, 7)]
    # The changelog took only batch 5 (3 and 4 were in it): its commit says so.
    assert _commit_infos(restarted.changelog_path)[-1]["txjoin.first_batch_id"] == 5
    assert _commit_infos(restarted.current_path)[-1]["txjoin.first_batch_id"] == 3
    # And the whole range again is a replay: nothing written.
    assert restarted.write_group([parcel(4, change("u", 3, 6)),
                                  parcel(5, change("c", 4, 7))]) == {}


def test_a_hand_off_of_fewer_bytes_than_two_parcels_blocks_the_third_and_drops_nothing(
        spark: SparkSession, tmp_path: Path) -> None:
    """``max_bytes`` (``--delta-handoff-max-bytes``) on the real sink: two parcels fill it,
    the third waits until the committer's group commit of the two made room, then all
    three are in both tables once."""
    sink = DeltaSink(str(tmp_path / "out"), "orders", "job", ["order_id"], SCHEMA, spark=spark)
    handoff = Handoff(tmp_path / "ckpt")
    parcels = [parcel(i, change("c", i, i + 1), change("u", i, i + 2, total="3.00"))
               for i in range(3)]
    one = handoff.store(parcels[0])  # the size of one parcel (the committer rewrites it)
    committer = GroupCommitter(sink, handoff, interval_s=0, max_bytes=one + one // 2)
    assert committer.put(parcels[0]) < 0.5 and committer.put(parcels[1]) < 0.5  # no wait
    waited: list[float] = []
    third = threading.Thread(target=lambda: waited.append(committer.put(parcels[2])))
    third.start()
    third.join(1.5)
    # full: the third waits (the committer is not running yet), nothing of it on disk
    assert third.is_alive() and handoff.stored() == [0, 1]
    committer.start()
    third.join(120)
    assert not third.is_alive() and waited[0] >= 1.5
    committer.close()
    assert handoff.stored() == []
    assert [c.first_batch for c in committer.commits][:1] == [0]
    assert committer.commits[0].last_batch == 1  # the two that filled it, in one group
    assert [(r["order_id"], r["_commit_seq"]) for r in sink.read_changelog()] == \
        [(0, 1), (0, 2), (1, 2), (1, 3), (2, 3), (2, 4)]
    assert [(r["order_id"], r["total"]) for r in sink.read_current()] == \
        [(i, pytest.approx(3)) for i in range(3)]
