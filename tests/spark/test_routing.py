"""Routing in the JVM (``txjoin/join/spark/routing.py``) against the contract of
``join/routing.py``: the shards get what the Python router would give them, without Python
touching a record."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

import pytest
from pyspark.sql import SparkSession

from tests.unit.delivery import pizzeria_rows
from tests.unit.test_properties import JOB_VARIANTS
from txjoin.errors import DecodeError
from txjoin.ingest.debezium import ChangeEvent, Position, decode
from txjoin.join.routing import Router
from txjoin.join.spark.routing import route
from txjoin.join.spark.shards import (
    LOG_KEY_SCHEMA,
    LOG_VALUE_SCHEMA,
    META_SCHEMA,
    routed_items,
    shard_labels,
    spark_hash_int,
)

pytestmark = pytest.mark.spark
SCHEMA = "topic string, partition int, offset long, key binary, value string"
LABELS = [7, 3, 11]


def _routed(spark: SparkSession, records: list[tuple[str, int, int, Any]],
            labels: list[int] = LABELS) -> dict[int, Any]:
    job, _ = JOB_VARIANTS["orders/current"]
    df = spark.createDataFrame([(t, p, o, None, v) for t, p, o, v in records], SCHEMA)
    frame = route(df, job, "shop", labels).toPandas()
    return {label: frame[frame["shard"] == label].reset_index(drop=True) for label in labels}


def test_every_shard_reads_each_record_once_and_a_fact_row_lives_in_one_shard(
        spark: SparkSession) -> None:
    job, _ = JOB_VARIANTS["orders/current"]
    records = pizzeria_rows(job, 60, seed=3, key_changes=12)
    by_shard = _routed(spark, records)
    n = len(LABELS)
    items = {label: routed_items(job, n, frame) for label, frame in by_shard.items()}
    where = sorted((t, o) for t, _, o, _ in records)
    for frame in by_shard.values():  # one row per record in every shard
        assert sorted(zip(frame["topic"], frame["offset"], strict=True)) == where
    counted: Counter[tuple[str, int]] = Counter()
    for frame in by_shard.values():
        counted.update(zip(frame.loc[frame["counted"], "topic"],
                           frame.loc[frame["counted"], "offset"], strict=True))
    assert set(counted.values()) == {1} and len(counted) == len(records)

    # the Python router's view of the same records: which get rows where
    python = Router(job, n)
    holders: dict[tuple[str, int], int] = defaultdict(int)
    identities: dict[tuple[str, int], set[Any]] = defaultdict(set)
    for label in LABELS:
        for routed in items[label]:
            event = routed.item
            if isinstance(event, ChangeEvent):
                at = (event.position.topic, event.position.offset)
                identities[at].add(event.identity)
                if event.after is not None or event.before is not None:
                    holders[at] += 1
    for topic, partition, offset, value in records:
        item = decode(value, Position(topic, partition, offset))
        if not isinstance(item, ChangeEvent) or item.table not in job.table_names:
            continue
        with_rows = [r for r in python.route(item, 0) if r is not None
                     and (r.item.after is not None or r.item.before is not None)]
        assert holders[topic, offset] == len(with_rows), (topic, offset)
        assert len(identities[topic, offset]) == 1  # every shard recognises the same event


def test_a_key_change_goes_to_both_owners_and_only_the_new_one_inserts(
        spark: SparkSession) -> None:
    def event(op: str, before: int | None, after: int, offset: int
              ) -> tuple[str, int, int, str]:
        doc = {"op": op, "before": None if before is None else {"id": before},
               "after": {"id": after, "x": 1},
               "source": {"schema": "public", "table": "orders", "txId": 9, "lsn": 50,
                          "ts_ms": 1},
               "transaction": {"id": "9:50", "total_order": 1, "data_collection_order": 1}}
        return "shop.public.orders", 0, offset, json.dumps(doc)

    # which shard owns each key, by the JVM's own hash: where its insert goes
    ids = range(1, 40)
    inserts = _routed(spark, [event("c", None, i, i) for i in ids])
    owner = {int(r["offset"]): label for label, f in inserts.items()
             for _, r in f.iterrows() if r["value"] is not None}
    assert sorted(owner) == list(ids)
    # old and new key on different shards, every ordered pair of shards
    chosen: dict[tuple[int, int], tuple[int, int]] = {}
    for b in ids:
        for a in ids:
            if owner[b] != owner[a]:
                chosen.setdefault((owner[b], owner[a]), (b, a))
    assert len(chosen) == len(LABELS) * (len(LABELS) - 1)
    pairs = list(chosen.values())
    by_shard = _routed(spark, [event("u", b, a, i) for i, (b, a) in enumerate(pairs)])
    for offset, (before, after) in enumerate(pairs):
        rows = [(label, f.loc[f["offset"] == offset].iloc[0]) for label, f in by_shard.items()]
        holding = {label: bool(r["after_elsewhere"]) for label, r in rows
                   if r["value"] is not None}
        # exactly two holders: the new key's owner inserts the row, the old key's owner
        # only removes it (after_elsewhere)
        assert holding == {owner[after]: False, owner[before]: True}, (before, after, holding)


def test_a_record_routing_cannot_read_goes_whole_to_every_shard_and_fails_there(
        spark: SparkSession) -> None:
    job, _ = JOB_VARIANTS["orders/current"]
    records = [("shop.public.orders", 0, 5, '{"op": "c", "after": {"id": 1}'),  # cut short
               ("shop.public.orders", 0, 6, json.dumps({"op": "c", "after": {"x": 1}}))]
    by_shard = _routed(spark, records)
    for frame in by_shard.values():
        assert frame["value"].notna().all() and not frame["routed"].any()
        with pytest.raises(DecodeError, match=r"shop\.public\.orders\[0\]@5: value is not JSON"):
            routed_items(job, len(LABELS), frame)


def test_a_fact_event_routing_could_not_read_but_python_can_is_refused(
        spark: SparkSession) -> None:
    job, _ = JOB_VARIANTS["orders/current"]
    doc = {"op": "c", "before": None,
           "after": {"id": 1, "table_assignment_id": 1, "order_time": 0, "pizzas": [1]},
           "source": {"schema": "public", "table": "orders", "txId": 9, "lsn": 50, "ts_ms": 1},
           "transaction": {"id": "+9:50", "total_order": 1, "data_collection_order": 1}}
    by_shard = _routed(spark, [("shop.public.orders", 0, 5, json.dumps(doc))])
    frame = by_shard[LABELS[0]]
    assert not frame["routed"].any()
    with pytest.raises(DecodeError, match="would be applied by every shard"):
        routed_items(job, len(LABELS), frame)


def test_schemas_enable_true_routes_like_the_schemaless_record(spark: SparkSession) -> None:
    payload = {"op": "c", "before": None, "after": {"id": 4, "x": 1},
               "source": {"schema": "public", "table": "orders", "txId": 9, "lsn": 50,
                          "ts_ms": 1, "snapshot": "false"},
               "transaction": {"id": "9:50", "total_order": 1, "data_collection_order": 1}}
    records = [("shop.public.orders", 0, 1, json.dumps(payload)),
               ("shop.public.orders", 0, 2, json.dumps({"schema": {"type": "struct"},
                                                        "payload": payload}))]
    by_shard = _routed(spark, records)
    for frame in by_shard.values():
        a, b = (frame.loc[frame["offset"] == o].iloc[0] for o in (1, 2))
        assert bool(a["routed"]) and bool(b["routed"])
        assert (a["value"] is None) == (b["value"] is None)
        assert [a[c] for c in ("op", "tbl", "xid", "lsn", "ts_ms", "snapshot", "dco", "digest")] \
            == [b[c] for c in ("op", "tbl", "xid", "lsn", "ts_ms", "snapshot", "dco", "digest")]


def test_shard_labels_hash_into_distinct_partitions_as_spark_hashes_them(
        spark: SparkSession) -> None:
    # spark_hash_int is Spark's hash() of an int, computed in Python: equal for every value
    # tried, negatives and the extremes among them
    values = [*range(-300, 700), 2**31 - 1, -2**31, 123456789, -987654321]
    rows = spark.createDataFrame([(v,) for v in values], "v int") \
        .selectExpr("v", "hash(v) AS h").collect()
    assert {r["v"]: r["h"] for r in rows} == {v: spark_hash_int(v) for v in values}
    # the labels land where Spark's shuffle puts them: one shard per partition while there
    # are enough partitions, the extra shards sharing
    for n_shards, partitions in ((1, 1), (2, 2), (3, 3), (4, 4), (8, 8), (4, 2), (2, 5)):
        labels = shard_labels(n_shards, partitions)
        assert len(labels) == len(set(labels)) == n_shards
        parts = spark.createDataFrame([(label,) for label in labels], "label int") \
            .selectExpr(f"pmod(hash(label), {partitions}) AS part").collect()
        assert len({r["part"] for r in parts}) == min(n_shards, partitions)


def test_the_shards_state_schemas_are_those_checkpoints_hold(spark: SparkSession) -> None:
    # ShardProcessor.init declares its state variables with types (no DDL parse on the
    # state server per task); a checkpoint's state schema is what Spark made of the DDL
    # text txjoin gave before, and a restarted query must find the same schema
    def parsed(ddl: str) -> str:
        return str(spark._jvm.org.apache.spark.sql.types.StructType.fromDDL(ddl).json())

    assert json.loads(META_SCHEMA.json()) == json.loads(parsed("blob binary"))
    assert json.loads(LOG_KEY_SCHEMA.json()) == json.loads(parsed("kind int, version long, "
                                                                  "chunk int"))
    assert json.loads(LOG_VALUE_SCHEMA.json()) == json.loads(parsed("blob binary"))


# -- split tables (the staged engine's owners: join/placement.py) --------------------------


def test_split_rows_and_fact_references_reach_the_owners_the_core_routes_them_to(
        spark: SparkSession) -> None:
    """With every looked-up table split, the JVM sends each split row's record to the owners
    of its before and after keys, each fact record to its shard and to the depth-1 owners of
    the keys it references, as the core's ``StagedEngine.route`` does (both by
    ``placement.owner_of`` and ``fact_shard``), and no shard gets a split row."""
    from txjoin.join.placement import FactReads, splittable
    from txjoin.join.spark.staged import SEQUENCER_LABEL, route_staged
    from txjoin.join.staged import StagedEngine

    job, _ = JOB_VARIANTS["orders/current"]
    n = 3
    records = pizzeria_rows(job, 60, seed=5, key_changes=12)
    core = StagedEngine(job, n, split=splittable(job))
    placement = core.placement
    assert placement.depths == 2
    _meta, per_shard, owned = core.route(records)
    owner_labels = [[100 + d * n + o for o in range(n)] for d in range(placement.depths)]
    df = spark.createDataFrame([(t, p, o, None, v) for t, p, o, v in records], SCHEMA)
    frame = route_staged(df, job, "shop", LABELS, placement, owner_labels).toPandas()
    got: dict[int, set[tuple[str, int]]] = defaultdict(set)
    reads: dict[int, list[Any]] = defaultdict(list)  # a fact's reads, where sent as them
    for label, topic, offset, value, xid, refs in zip(
            frame["shard"], frame["topic"], frame["offset"], frame["value"], frame["xid"],
            frame["refs"], strict=True):
        if label == SEQUENCER_LABEL:
            continue
        if refs is not None:
            doc = json.loads(refs)
            reads[int(label)].append((int(xid), doc["s"], sorted(placement.typed_reads(
                (r["a"], r["k"]) for r in doc["r"]))))
        elif value is not None:
            got[int(label)].add((topic, int(offset)))

    def where(events: list[Any]) -> set[tuple[str, int]]:
        return {(e.position.topic, e.position.offset) for e in events
                if isinstance(e, ChangeEvent)}

    for shard, label in enumerate(LABELS):
        assert got[label] == where(per_shard[shard]), shard
        assert not reads[label]
    compact = 0
    for (depth, owner), items in owned.items():
        label = owner_labels[depth - 1][owner]
        assert got[label] == where(items), (depth, owner)
        facts = sorted((r.xid, r.shard, sorted(r.reads)) for r in items
                       if isinstance(r, FactReads))
        assert sorted(reads[label]) == facts, (depth, owner)
        compact += len(facts)
    assert compact > 100  # the streaming fact events went as their reads
    # every owner got something: the test says something of each
    assert all(owned.values())


@pytest.mark.parametrize("values", [
    [0, 1, -1, 42, 2**31, -(2**63), 2**63 - 1],
    ["a", "", "Zürich", "naïve café", "日本語", "a\u001fb", "with space", "\u00e9t\u00e9"],
    ["0e8c6f5a-3f5e-4b7c-9a3d-2f1e5d6c7b8a", "00000000-0000-0000-0000-000000000000"],
])
def test_the_jvm_places_a_key_where_owner_of_does(spark: SparkSession, values: list[Any]
                                                   ) -> None:
    from txjoin.join.placement import owner_of
    from txjoin.join.spark.routing import _owner

    docs = [(json.dumps({"k": v, "k2": v}),) for v in values]
    df = spark.createDataFrame(docs, "doc string").selectExpr(
        "from_json(doc, 'k string, k2 string') AS r")
    for n in (2, 3, 7):
        one = df.selectExpr(_owner(["r.k"], n) + " AS o")
        two = df.selectExpr(_owner(["r.k", "r.k2"], n) + " AS o")
        assert [r.o for r in one.collect()] == [owner_of((v,), n) for v in values], n
        assert [r.o for r in two.collect()] == [owner_of((v, v), n) for v in values], n
