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

import string
from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame

from txjoin.job import Job
from txjoin.join.placement import Placement

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
    grouping label (``shards.shard_labels``).

    The expressions are SQL text, one ``selectExpr`` per step: built with Spark's Column
    functions they took ~1,700 calls into the JVM at every query start (0.35-0.5 s warm,
    1.4 s in a new session); the text is parsed into the same expressions in the JVM."""
    rows = envelopes(source, job, prefixes, len(labels), every_table=False)
    exploded = rows.selectExpr(
        "*", f"posexplode(array({', '.join(str(int(label)) for label in labels)})) AS (i, shard)")
    owner = "(i = before_shard OR i = after_shard)"
    return exploded.selectExpr(
        "CAST(shard AS INT) AS shard", *_READ[:3],
        f"CASE WHEN NOT routed OR {owner} THEN `value` END AS `value`",
        # a marker row (txjoin.ingest.spark.markers.is_marker: a negative offset)
        "CASE WHEN `offset` < 0 THEN false "
        "WHEN routed THEN i = least(before_shard, after_shard) ELSE i = 0 END AS counted",
        *_METADATA, f"{_ELSEWHERE} AS after_elsewhere",
    )


def envelopes(source: DataFrame, job: Job, prefixes: str | Mapping[str, str], n: int,
              every_table: bool, placement: Placement | None = None) -> DataFrame:
    """``source`` rows with what routing reads of each record, computed once per record:
    ``routed`` (routing read it: the metadata columns below are set), the fact key's shard
    of its ``before`` and ``after`` image (of ``n``), and the metadata columns. Only the
    fact table's records are read, or ``every_table`` of the job (the staged engine's
    sequencer takes every record's metadata: ``join/spark/staged.py``).

    With ``placement``'s split tables (``join/placement.py``), also ``split_topic`` (a split
    table's record: no shard gets it), ``owner_depth`` and ``owners``: the owner stage and
    the owners (of ``n``) that get the record, those of a split row's ``before`` and
    ``after`` keys (a truncate: every owner; a record routing could not read: owner 0,
    whose decoding says what is wrong), and at depth 1 those of the keys a fact row's
    ``after`` image references; and ``refs``, a streaming fact row's shard and the text of
    each key it reads (JSON ``{"s": shard, "r": [{"a": alias, "k": [text, ...]}, ...]}``:
    what a depth-1 owner takes instead of the record, ``placement.FactReads``). A fact's
    shard is then ``placement.fact_shard``'s hash."""
    fact = job.table(job.fact)
    topics = fact_topics(job, prefixes)
    read = ([t for t, stream in job.streams(prefixes).items() if stream in job.table_names]
            if every_table else topics)
    is_read = f"`topic` IN ({', '.join(map(_text, read))})" if read else "false"
    is_fact = f"`topic` IN ({', '.join(map(_text, topics))})" if topics else "false"
    # (one select per step: each parse runs once, not once per column it feeds)
    rows = source.selectExpr(
        *_READ,
        f"CASE WHEN {is_read} AND `value` IS NOT NULL THEN "
        f"from_json(CAST(`value` AS STRING), {_text(ENVELOPE_SCHEMA)}) END AS doc",
        f"{is_fact} AS fact_topic")
    top = ", ".join(f"{_text(f)}, doc.{_name(f)}"
                    for f in ("op", "source", "transaction", "before", "after"))
    rows = rows.selectExpr(
        *_READ, "fact_topic",
        f"CASE WHEN doc.op IS NULL AND doc.payload IS NOT NULL THEN doc.payload "
        f"ELSE named_struct({top}) END AS env")
    rows = rows.selectExpr(
        *_READ, "fact_topic", "env.op AS op",
        "concat(env.source.`schema`, '.', env.source.`table`) AS tbl",
        "env.source.txId AS tx_id", "env.source.lsn AS raw_lsn",
        "env.source.ts_ms AS raw_ts", f"{_ascii_lower('env.source.snapshot')} AS snapshot",
        "env.`transaction`.id AS tx",
        "env.`transaction`.data_collection_order AS raw_dco",
        "env.`before` AS `before`", "env.`after` AS `after`")
    keys = _text(f"struct<{', '.join(f'{_name(k)}: string' for k in fact.key)}>")
    rows = rows.selectExpr("*", f"CASE WHEN fact_topic THEN from_json(`before`, {keys}) END "
                                f"AS before_key",
                           f"CASE WHEN fact_topic THEN from_json(`after`, {keys}) END "
                           f"AS after_key")
    xid_text = "substring_index(tx, ':', 1)"
    lsn_text = "substr(tx, instr(tx, ':') + 1)"  # after the first colon
    rows = rows.selectExpr(
        "*", f"CASE WHEN {xid_text} RLIKE {_text(_INT)} "
             f"THEN try_cast({xid_text} AS BIGINT) END AS xid")
    tables = sorted(job.table_names) if every_table else [fact.name]
    routed = _routable(fact.name, tables, list(fact.key), lsn_text)
    split = placement is not None and bool(placement)
    place = _owner if split else _shard
    before_shard = place([f"before_key.{_name(c)}" for c in fact.key], n)
    after_shard = place([f"after_key.{_name(c)}" for c in fact.key], n)
    # Everything that is the same in every shard's copy of a record (its metadata, its
    # digest) is computed once per record, before the copies: computed after them, each
    # copy paid for the md5, the regular expressions and the casts again.
    rows = rows.selectExpr("*", f"{routed} AS routed")
    owned: list[str] = []
    if split:
        assert placement is not None
        parsed, owned = _owned(placement, prefixes, n, after_shard)
        rows = rows.selectExpr("*", *parsed)
    return rows.selectExpr(
        *_READ, "routed", "fact_topic", *owned,
        f"CASE WHEN routed AND fact_topic AND `before` IS NOT NULL THEN {before_shard} END "
        f"AS before_shard",
        f"CASE WHEN routed AND fact_topic AND `after` IS NOT NULL THEN {after_shard} END "
        f"AS after_shard",
        "CASE WHEN routed THEN op END AS op",
        "CASE WHEN routed THEN tbl END AS tbl",
        # integers as decimal text: pandas would turn a nullable bigint into floats
        "CASE WHEN routed THEN CAST(xid AS STRING) END AS xid",
        "CASE WHEN routed AND raw_lsn RLIKE '^[0-9]+$' "
        "THEN CAST(try_cast(raw_lsn AS BIGINT) AS STRING) END AS lsn",
        "CASE WHEN routed THEN CAST(try_cast(raw_ts AS BIGINT) AS STRING) END AS ts_ms",
        "CASE WHEN routed THEN snapshot END AS snapshot",
        f"CASE WHEN routed AND raw_dco RLIKE {_text(_INT)} "
        "THEN CAST(try_cast(raw_dco AS BIGINT) AS STRING) END AS dco",
        "CASE WHEN routed THEN unhex(md5(coalesce(`after`, `before`))) END AS digest")


_METADATA = ("routed", "op", "tbl", "xid", "lsn", "ts_ms", "snapshot", "dco", "digest")
"""The metadata columns of a routed row, after ``counted``."""

_ELSEWHERE = ("coalesce(routed AND i = before_shard AND after_shard != before_shard, false)")
"""Whether the copy for shard ``i`` is the before-owner's of a key that moved to another."""


_READ = ("`topic`", "`partition`", "`offset`", "`value`")
"""Where a record was read, and its bytes: the columns every step keeps."""


def _name(name: str) -> str:
    """A column or field name in SQL text."""
    return "`" + name.replace("`", "``") + "`"


def _text(value: str) -> str:
    """A string literal in SQL text."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ascii_lower(expr: str) -> str:
    """``expr`` with A-Z lowered, as Python's ``str.lower`` lowers Debezium's
    ``source.snapshot`` (its values are ASCII words). Not Spark's ``lower``: under
    ``spark.sql.icu.caseMappings.enabled`` (the default) its first call initialises ICU's
    case mapping tables, ~1 s of a new driver JVM's CPU (12% of a replay's samples)."""
    return f"translate({expr}, {_text(string.ascii_uppercase)}, {_text(string.ascii_lowercase)})"


def _routable(fact: str, tables: list[str], key: list[str], lsn_text: str) -> str:
    """Whether routing read everything a shard without the rows needs (else the record
    goes whole to every shard, whose decoding says what is wrong): a record of one of
    ``tables``, and of a fact topic a fact record with its key."""
    images_ok = ("CASE WHEN op IN ('c', 'r', 'u') THEN `after` IS NOT NULL "
                 "ELSE `before` IS NOT NULL END")
    keys_ok = " AND ".join(["true"] + [
        f"(`before` IS NULL OR before_key.{_name(k)} IS NOT NULL) "
        f"AND (`after` IS NULL OR after_key.{_name(k)} IS NOT NULL)" for k in key])
    tx_ok = (f"CASE WHEN op = 'r' THEN tx IS NULL ELSE xid IS NOT NULL "
             f"AND (NOT contains(tx, ':') OR {lsn_text} = '' OR {lsn_text} RLIKE {_text(_INT)}) "
             f"AND (tx_id IS NULL OR tx_id = CAST(xid AS STRING)) END")
    ts_ok = f"raw_ts IS NULL OR raw_ts RLIKE {_text(_INT)}"
    table_ok = (f"CASE WHEN fact_topic THEN tbl = {_text(fact)} AND ({keys_ok}) "
                f"ELSE tbl IN ({', '.join(map(_text, tables))}) END")
    return (f"coalesce(op IN ('c', 'u', 'd', 'r') AND ({table_ok}) AND ({images_ok}) "
            f"AND ({tx_ok}) AND ({ts_ok}), false)")


def _shard(texts: list[str], n: int) -> str:
    """The shard index of a fact key (its columns' JSON text)."""
    return f"CAST(pmod(xxhash64({', '.join(texts)}), {n}) AS INT)"


def _owner(texts: list[str], n: int) -> str:
    """``placement.owner_of`` of a key (its columns' JSON text: the typed value's text, for
    the key kinds a split allows; or one array of them)."""
    return (f"CAST(pmod(crc32(CAST(concat_ws(chr(31), {', '.join(texts)}) AS BINARY)), {n}) "
            f"AS INT)")


def _owned(placement: Placement, prefixes: str | Mapping[str, str], n: int,
           after_shard: str) -> tuple[list[str], list[str]]:
    """``envelopes``' owner columns (its docstring) as SQL over its columns (the raw ``op``,
    ``before`` and ``after`` text; ``after_shard``: the fact's shard): what to parse, in
    one step, then the columns, in the next (so each image is parsed once)."""
    job = placement.job
    streams = job.streams(prefixes)
    every = f"sequence(0, {n - 1})"
    parsed, depth_of, owners_of = [], [], []
    split_topics = [t for t, stream in streams.items() if stream in placement.table_alias]
    for i, (table, alias) in enumerate(sorted(placement.table_alias.items())):
        topics = ", ".join(_text(t) for t, stream in streams.items() if stream == table)
        key = job.table(table).key
        struct = _text(f"struct<{', '.join(f'{_name(k)}: string' for k in key)}>")
        images = []
        for image in ("before", "after"):
            name = f"_{image}_key_{i}"
            parsed.append(f"CASE WHEN `topic` IN ({topics}) THEN from_json(`{image}`, {struct}) "
                          f"END AS {name}")
            texts = [f"{name}.{_name(k)}" for k in key]
            known = " AND ".join(f"{t} IS NOT NULL" for t in texts)
            images.append(f"CASE WHEN `{image}` IS NULL THEN NULL "
                          f"WHEN {known} THEN {_owner(texts, n)} ELSE 0 END")
        depth_of.append(f"WHEN `topic` IN ({topics}) THEN {placement.depth[alias]}")
        owners_of.append(
            f"WHEN `topic` IN ({topics}) THEN CASE WHEN op = 't' THEN {every} "
            f"WHEN NOT routed THEN array(0) ELSE array_distinct(filter(array({images[0]}, "
            f"{images[1]}), x -> x IS NOT NULL)) END")
    references, reads, readable = "array()", "array()", "true"
    below = placement.below[job.fact_alias]
    if below:
        columns = sorted({c for lk in below for c in lk.on.values()})
        read = _text(f"struct<{', '.join(f'{_name(c)}: string' for c in columns)}>")
        parsed.append(f"CASE WHEN fact_topic THEN from_json(`after`, {read}) END AS _refs")
        keys, unread = [], []
        for j, lk in enumerate(below):
            alias = _text(lk.alias)
            if lk.array:
                column = _name(next(iter(lk.on.values())))
                elements = f"_elements_{j}.{column}"
                parsed.append(f"CASE WHEN fact_topic THEN from_json(`after`, "
                              f"{_text(f'struct<{column}: array<string>>')}) END "
                              f"AS _elements_{j}")
                keys.append(f"coalesce(transform(filter({elements}, x -> x IS NOT NULL), "
                            f"x -> named_struct('a', {alias}, 'k', array(x))), array())")
                unread.append(f"({elements} IS NULL AND _refs.{column} IS NOT NULL)")
            else:
                values = [f"_refs.{_name(c)}" for c in lk.on.values()]
                known = " AND ".join(f"{v} IS NOT NULL" for v in values)
                keys.append(f"CASE WHEN {known} THEN array(named_struct('a', {alias}, "
                            f"'k', array({', '.join(values)}))) ELSE array() END")
        # each key it reads (alias, its columns' text), and whether routing read them all
        reads = f"concat({', '.join(keys)})"
        readable = f"NOT ({' OR '.join(unread)})" if unread else "true"
        # the owners of those keys; an array routing cannot read as one (text where one is
        # expected): every owner, whose reading of the row decides
        references = (f"CASE WHEN {readable} THEN array_distinct(transform({reads}, "
                      f"r -> {_owner(['r.k'], n)})) ELSE {every} END")
    return parsed, [
        f"CASE {' '.join(depth_of)} WHEN fact_topic THEN 1 END AS owner_depth",
        f"`topic` IN ({', '.join(map(_text, split_topics)) or 'NULL'}) AS split_topic",
        f"CASE {' '.join(owners_of)} WHEN fact_topic AND routed AND `after` IS NOT NULL "
        f"THEN {references} END AS owners",
        # a streaming fact row the owners can take as its reads (placement.FactReads)
        f"CASE WHEN fact_topic AND routed AND op IN ('c', 'u') AND `after` IS NOT NULL "
        f"AND {readable} THEN to_json(named_struct('s', {after_shard}, 'r', {reads})) "
        f"END AS refs"]
