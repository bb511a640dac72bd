"""Routing in the JVM: Debezium JSON -> which shard gets which record, before any Python.

The shards (``txjoin/join/spark/shards.py``) need each record once, in the form
``join/routing.py`` describes: a fact event with its rows in the shard(s) that own
its key, as metadata elsewhere; everything else (looked-up tables, markers,
truncates, tombstones) in every shard. This stage decides that with Spark
expressions, so a record enters Python once, in the shard that reads it:

- the fact table's records are parsed with ``from_json`` against a schema of only
  what routing needs (``op``; ``source`` schema, table, txId, lsn, ts_ms,
  snapshot; ``transaction`` id and order; ``before``/``after`` as JSON text, and
  from that text the key columns as text), with ``schemas.enable`` true or
  false (the ``payload`` is read when the envelope has no ``op``);
- a fact key's shard is ``pmod(xxhash64(key columns as JSON text), n)``, so it
  does not depend on ``decimal.handling.mode`` or any other typing: the shards
  type values themselves, once;
- an owner gets the record's bytes; the other shards get its metadata as columns
  (op, xid, LSN, commit time, snapshot flag, order) and a digest of its row
  image (``md5`` of the image's JSON text) that every copy shares, so all shards
  recognise the event again when it is delivered twice;
- a fact record this stage cannot read (malformed, a missing key, an op it does
  not know) goes whole to every shard, where decoding reports what is wrong
  (one line naming ``topic[partition]@offset``); one that decodes after all is
  refused there too (:func:`txjoin.join.spark.shards.routed_items`), never applied twice.

The routed rows are ``ROUTED_SCHEMA``: one per record and shard that receives it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from txjoin.ingest.spark.markers import is_marker
from txjoin.job import Job

ROUTED_COLUMNS = ("shard", "topic", "partition", "offset", "value", "counted", "routed",
                  "op", "tbl", "xid", "lsn", "ts_ms", "snapshot", "dco", "digest",
                  "after_elsewhere")
"""A routed row: the shard's label; where the record was read; its bytes (null: metadata
only, or a marker row); whether this shard counts it in the batch's statistics (one
shard per record); whether routing read it (then the metadata columns are set: op,
table, xid, LSN, source ts_ms, snapshot, data collection order (the integers as
decimal text), row-image digest, and whether its ``after`` row belongs to another
shard)."""

_SOURCE = ("struct<schema: string, table: string, txId: string, lsn: string, ts_ms: string, "
           "snapshot: string>")
_ENVELOPE = (f"op: string, source: {_SOURCE}, "
             "transaction: struct<id: string, data_collection_order: string>, "
             "before: string, after: string")
ENVELOPE_SCHEMA = f"struct<{_ENVELOPE}, payload: struct<{_ENVELOPE}>>"
"""What routing reads of a fact record (``payload``: the same with ``schemas.enable``)."""

_INT = "^-?[0-9]+$"


def fact_topics(job: Job, prefixes: str | Mapping[str, str]) -> list[str]:
    """The topics the job reads its fact table from."""
    return [topic for topic, stream in job.streams(prefixes).items() if stream == job.fact]


def route(source: DataFrame, job: Job, prefixes: str | Mapping[str, str],
          labels: Sequence[int]) -> DataFrame:
    """``source`` rows (``topic, partition, offset, key, value``) -> routed rows, one per
    record and shard that receives it (``ROUTED_COLUMNS``); ``labels``: each shard's
    grouping label (``shards.shard_labels``)."""
    n = len(labels)
    fact = job.table(job.fact)
    topics = fact_topics(job, prefixes)
    doc = F.from_json(F.col("value").cast("string"), ENVELOPE_SCHEMA)
    parsed = F.when(F.col("topic").isin(topics) & F.col("value").isNotNull(), doc)
    # (one select per step: each parse runs once, not once per column it feeds)
    rows = source.select("topic", "partition", "offset", "value", parsed.alias("doc"))
    doc = F.col("doc")
    top = F.struct(*[doc[f].alias(f) for f in ("op", "source", "transaction", "before",
                                                "after")])
    env = F.when(doc["op"].isNull() & doc["payload"].isNotNull(), doc["payload"]) \
        .otherwise(top)
    rows = rows.select("topic", "partition", "offset", "value", env.alias("env"))
    env = F.col("env")
    keys = f"struct<{', '.join(f'`{k}`: string' for k in fact.key)}>"
    rows = rows.select(
        "topic", "partition", "offset", "value",
        env["op"].alias("op"),
        F.concat(env["source"]["schema"], F.lit("."), env["source"]["table"]).alias("tbl"),
        env["source"]["txId"].alias("tx_id"),
        env["source"]["lsn"].alias("raw_lsn"),
        env["source"]["ts_ms"].alias("raw_ts"),
        F.lower(env["source"]["snapshot"]).alias("snapshot"),
        env["transaction"]["id"].alias("tx"),
        env["transaction"]["data_collection_order"].alias("raw_dco"),
        env["before"].alias("before"), env["after"].alias("after"))
    rows = rows.select("*", F.from_json("before", keys).alias("before_key"),
                       F.from_json("after", keys).alias("after_key"))
    xid_text = F.substring_index(F.col("tx"), ":", 1)
    lsn_text = F.expr("substr(tx, instr(tx, ':') + 1)")  # after the first colon
    xid = F.when(xid_text.rlike(_INT), xid_text.try_cast("bigint"))
    rows = rows.select("*", xid.alias("xid"))
    routed = _routable(rows, fact.name, list(fact.key), xid_text, lsn_text)
    before_shard = _shard(F.col("before_key"), list(fact.key), n)
    after_shard = _shard(F.col("after_key"), list(fact.key), n)
    rows = rows.select(
        "*", routed.alias("routed"),
        F.when(routed & F.col("before").isNotNull(), before_shard).alias("before_shard"),
        F.when(routed & F.col("after").isNotNull(), after_shard).alias("after_shard"))
    index = F.posexplode(F.array(*[F.lit(label) for label in labels])).alias("i", "shard")
    exploded = rows.select("*", index)
    i = F.col("i")
    owner = (i == F.col("before_shard")) | (i == F.col("after_shard"))
    return exploded.select(
        F.col("shard").cast("int").alias("shard"), "topic", "partition", "offset",
        F.when(~F.col("routed") | owner, F.col("value")).alias("value"),
        F.when(is_marker(F.col("offset")), F.lit(False))
        .when(F.col("routed"), i == F.least("before_shard", "after_shard"))
        .otherwise(i == 0).alias("counted"),
        "routed",
        F.when(F.col("routed"), F.col("op")).alias("op"),
        F.when(F.col("routed"), F.col("tbl")).alias("tbl"),
        # integers as decimal text: pandas would turn a nullable bigint into floats
        F.when(F.col("routed"), F.col("xid").cast("string")).alias("xid"),
        F.when(F.col("routed") & F.col("raw_lsn").rlike("^[0-9]+$"),
               F.col("raw_lsn").try_cast("bigint").cast("string")).alias("lsn"),
        F.when(F.col("routed"), F.col("raw_ts").try_cast("bigint").cast("string"))
        .alias("ts_ms"),
        F.when(F.col("routed"), F.col("snapshot")).alias("snapshot"),
        F.when(F.col("routed") & F.col("raw_dco").rlike(_INT),
               F.col("raw_dco").try_cast("bigint").cast("string")).alias("dco"),
        F.when(F.col("routed"), F.unhex(F.md5(F.coalesce("after", "before")))).alias("digest"),
        F.coalesce(F.col("routed") & (i == F.col("before_shard"))
                   & (F.col("after_shard") != F.col("before_shard")),
                   F.lit(False)).alias("after_elsewhere"),
    )


def _routable(rows: DataFrame, fact: str, key: list[str], xid_text: Column,
              lsn_text: Column) -> Column:
    """Whether routing read everything a shard without the rows needs (else the record
    goes whole to every shard, whose decoding says what is wrong)."""
    op, tx = F.col("op"), F.col("tx")
    images_ok = (F.when(op.isin("c", "r", "u"), F.col("after").isNotNull())
                 .otherwise(F.col("before").isNotNull()))
    keys_ok = F.lit(True)
    for k in key:
        keys_ok = keys_ok & (F.col("before").isNull() | F.col("before_key")[k].isNotNull()) \
            & (F.col("after").isNull() | F.col("after_key")[k].isNotNull())
    tx_ok = (F.when(op == "r", tx.isNull())
             .otherwise(F.col("xid").isNotNull()
                        & (~tx.contains(":") | (lsn_text == "") | lsn_text.rlike(_INT))
                        & (F.col("tx_id").isNull()
                           | (F.col("tx_id") == F.col("xid").cast("string")))))
    ts_ok = F.col("raw_ts").isNull() | F.col("raw_ts").rlike(_INT)
    return F.coalesce(op.isin("c", "u", "d", "r") & (F.col("tbl") == fact) & images_ok
                      & keys_ok & tx_ok & ts_ok, F.lit(False))


def _shard(key: Column, columns: list[str], n: int) -> Column:
    """The shard index of a fact key (its columns' JSON text)."""
    return F.pmod(F.xxhash64(*[key[c] for c in columns]), F.lit(n)).cast("int")
