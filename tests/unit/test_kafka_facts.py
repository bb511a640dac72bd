"""The caught-up rule for Spark's kafka source under a read limit (``KafkaFacts.caught_up``),
and the split of small topics into a source of their own (``split_topics``).

``spark_rate_limit`` is Spark 4.2's ``KafkaMicroBatchStream.rateLimit`` (spark-sql-kafka
4.2.0), in Python with the same float arithmetic: the end offsets a batch is planned with
when ``maxOffsetsPerTrigger`` is set (each kafka source of a query plans its own). The
rule must never call a topic caught up while one of its partitions was cut short (that
would settle a snapshot or confirm a restarted transaction too early), and must call a
batch caught up once the backlog is small.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txjoin.errors import CheckpointError
from txjoin.ingest.spark.kafka import (
    KafkaFacts,
    batch_offset_spans,
    checkpoint_sources,
    last_offsets,
    split_topics,
)


def spark_rate_limit(limit: int, start: dict[int, int], latest: dict[int, int]) -> dict[int, int]:
    sizes = {tp: latest[tp] - start[tp] for tp in latest if latest[tp] - start[tp] > 0}
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(latest)
    ends = {}
    for tp, end in latest.items():
        if tp not in sizes:
            ends[tp] = end
            continue
        prorate = limit * (sizes[tp] / total)
        prorate_long = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        ends[tp] = min(end, start[tp] + prorate_long)
    return ends


backlogs = st.lists(st.integers(0, 5000), min_size=1, max_size=12)


@given(backlogs, st.integers(1, 20000), st.integers(0, 10**6))
def test_a_batch_called_caught_up_read_every_partition_to_its_end(
        backlog: list[int], limit: int, base: int) -> None:
    start = {tp: base + 17 * tp for tp in range(len(backlog))}
    latest = {tp: start[tp] + n for tp, n in enumerate(backlog)}
    ends = spark_rate_limit(limit, start, latest)
    records = sum(ends[tp] - start[tp] for tp in start)
    facts = KafkaFacts({"t": len(backlog)}, max_events=limit)
    if facts.caught_up({"t": records}):
        assert ends == latest, (backlog, limit, ends)


@given(backlogs, st.integers(1, 20000))
def test_a_small_backlog_is_caught_up_in_one_batch(backlog: list[int], limit: int) -> None:
    facts = KafkaFacts({"t": len(backlog)}, max_events=limit)
    if sum(backlog) < limit - len(backlog):
        start = dict.fromkeys(range(len(backlog)), 0)
        latest = dict(enumerate(backlog))
        assert spark_rate_limit(limit, start, latest) == latest
        assert facts.caught_up({"t": sum(backlog)}) == {"t"}


def test_without_a_limit_every_batch_is_caught_up() -> None:
    assert KafkaFacts({"a": 3, "b": 1}).caught_up({"a": 10**9}) == {"a", "b"}
    assert KafkaFacts({"a": 3, "b": 1}).several() == {"a": 3}


topic_backlogs = st.dictionaries(st.sampled_from("abcdef"),
                                 st.lists(st.integers(0, 3000), min_size=1, max_size=3),
                                 min_size=1)


@given(topic_backlogs, st.integers(1, 5000), st.integers(0, 10**6))
def test_with_small_topics_apart_a_topic_called_caught_up_was_read_to_its_end(
        backlog: dict[str, list[int]], limit: int, base: int) -> None:
    """Each source plans its batch alone (its own limit): the rule, per source, never calls
    a topic caught up while a partition of it was cut short."""
    sources = split_topics({t: sum(ns) for t, ns in backlog.items()}, limit)
    facts = KafkaFacts({t: len(ns) for t, ns in backlog.items()}, max_events=limit,
                       sources=sources)
    start = {(t, p): base + 17 * p for t, ns in backlog.items() for p in range(len(ns))}
    latest = {(t, p): start[(t, p)] + n for t, ns in backlog.items() for p, n in enumerate(ns)}
    ends = {}
    for group in facts.groups():
        parts = [tp for tp in start if tp[0] in group]
        ends.update(spark_rate_limit(limit, {tp: start[tp] for tp in parts},
                                     {tp: latest[tp] for tp in parts}))
    read = {t: sum(ends[tp] - start[tp] for tp in start if tp[0] == t) for t in backlog}
    for topic in facts.caught_up(read):
        assert all(ends[tp] == latest[tp] for tp in start if tp[0] == topic), (topic, read)
    if sources:  # a small topic arrives whole once the other sources' share is ignored
        small = sources[1]
        if sum(sum(backlog[t]) for t in small) < limit - sum(len(backlog[t]) for t in small):
            assert set(small) <= facts.caught_up(read)


def test_small_topics_get_a_source_of_their_own_only_beside_a_larger_one() -> None:
    assert split_topics({"orders": 400_000, "tx": 200_000, "tables": 8, "pizzas": 0},
                        25_000) == (("orders", "tx"), ("tables", "pizzas"))
    assert split_topics({"orders": 400_000, "tables": 8}, None) == ()  # no limit: one
    assert split_topics({"orders": 20_000, "tables": 8}, 25_000) == ()  # all small: one
    assert split_topics({"orders": 30_000, "tx": 30_000}, 25_000) == ()  # all large: one


def _offset_log(checkpoint: Path, batch: int, *sources: dict[str, dict[str, int]]) -> None:
    """A batch of Spark's offset log as Spark writes it: version, metadata, a line per source."""
    folder = checkpoint / "offsets"
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["v1", json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}),
             *(json.dumps(s) for s in sources)]
    (folder / str(batch)).write_text("\n".join(lines))


def test_a_restart_takes_the_sources_from_the_checkpoints_offset_log(tmp_path: Path) -> None:
    assert checkpoint_sources(tmp_path, ["o", "t"]) is None  # nothing planned: decide anew
    _offset_log(tmp_path, 0, {"o": {"0": 5}})
    assert checkpoint_sources(tmp_path, ["o", "t"]) == ()  # one source: kept one
    _offset_log(tmp_path, 1, {"o": {"0": 9}, "x": {"0": 2, "1": 3}}, {"t": {"0": 8}})
    # the newest batch decides; a topic no source read yet goes to the first
    assert checkpoint_sources(tmp_path, ["o", "x", "t", "new"]) == (("o", "x", "new"), ("t",))
    assert last_offsets(tmp_path) == {"o": {"0": 9}, "x": {"0": 2, "1": 3}, "t": {"0": 8}}
    with pytest.raises(CheckpointError, match=r"reads t through a kafka source of their own, "
                                              r"and the job subscribes none of them now; .*"
                                              r"--rebuild"):
        checkpoint_sources(tmp_path, ["o", "x"])


def _initial(checkpoint: Path, source: int, offsets: dict[str, dict[str, int]]) -> None:
    """A kafka source's starting offsets as spark-sql-kafka 4.2 keeps them: a zero byte,
    a version line, the offsets (``KafkaSourceInitialOffsetWriter``)."""
    folder = checkpoint / "sources" / str(source)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "0").write_bytes(b"\0v1\n" + json.dumps(offsets).encode())


gapped_backlogs = st.lists(st.tuples(st.integers(0, 400), st.sets(st.integers(0, 600))),
                           min_size=1, max_size=4)


@given(gapped_backlogs, st.integers(1, 800), st.integers(0, 10**6), st.integers(0, 3))
def test_the_offsets_a_batch_was_planned_over_tell_caught_up_with_gaps_in_the_offsets(
        tmp_path_factory: pytest.TempPathFactory, backlog: list[tuple[int, set[int]]],
        limit: int, base: int, batch: int) -> None:
    """Offsets with gaps (an exactly-once connector's transaction markers, compaction):
    Spark's read limit shares out offsets, so a batch it cut short can hold fewer than
    ``N - P`` records. The spans read from the offset log (:func:`batch_offset_spans`,
    from the source's starting offsets for its first batch) are what Spark planned, and
    the rule on them never calls a cut-short topic caught up."""
    checkpoint = tmp_path_factory.mktemp("ckpt")
    start = {str(p): base + 17 * p for p in range(len(backlog))}
    latest = {p: start[p] + n for p, (n, _) in zip(start, backlog, strict=True)}
    if batch == 0:
        _initial(checkpoint, 0, {"t": start})
    else:
        _offset_log(checkpoint, batch - 1, {"t": start})
    ends = spark_rate_limit(limit, start, latest)
    _offset_log(checkpoint, batch, {"t": ends})
    spans = batch_offset_spans(checkpoint, batch)
    assert spans == {"t": sum(ends[p] - start[p] for p in start)}
    facts = KafkaFacts({"t": len(backlog)}, max_events=limit)
    if facts.caught_up(spans):
        assert ends == latest, (backlog, limit, ends)


def test_a_batch_cut_short_over_gaps_is_not_caught_up_though_it_read_few_records(
        tmp_path: Path) -> None:
    """One partition, a limit of 10, 30 offsets waiting of which 3 of the first 10 are
    transaction markers: Spark plans 10 offsets, the batch reads 7 records (fewer than
    N - P = 9, which counting records took for caught up); its 10 offsets say cut short."""
    _initial(tmp_path, 0, {"t": {"0": 100}})
    ends = spark_rate_limit(10, {0: 100}, {0: 130})
    assert ends == {0: 110}
    _offset_log(tmp_path, 0, {"t": {"0": ends[0]}})
    facts = KafkaFacts({"t": 1}, max_events=10)
    assert facts.caught_up({"t": 7}) == {"t"}  # the records the batch read, markers skipped
    assert facts.caught_up(batch_offset_spans(tmp_path, 0)) == set()


def test_a_batch_missing_from_the_offset_log_is_a_checkpoint_error(tmp_path: Path) -> None:
    _offset_log(tmp_path, 0, {"t": {"0": 5}})
    with pytest.raises(CheckpointError, match=r"micro-batch 3 is not in the offset log"):
        batch_offset_spans(tmp_path, 3)
    # a second source's partitions it had not read before start from its starting offsets
    _initial(tmp_path, 1, {"u": {"0": 2, "1": 4}})
    _offset_log(tmp_path, 1, {"t": {"0": 9}}, {"u": {"0": 7, "1": 4}})
    assert batch_offset_spans(tmp_path, 1) == {"t": 4, "u": 5}
