"""Marker rows: what a Python source writes (``caught_up_batch``) is what the shards read."""

from __future__ import annotations

import pyarrow as pa

from txjoin.ingest.spark.markers import caught_up_batch, is_marker, read_markers
from txjoin.sequence.assembly import TopicPartitions

STREAMS = {"shop.public.orders": "public.orders", "shop.public.clients": "public.clients",
           "shop.transaction": "transaction"}


def _rows(batch: pa.RecordBatch) -> list[tuple[str, int, int]]:
    cols = batch.to_pydict()
    return list(zip(cols["topic"], cols["partition"], cols["offset"], strict=True))


def test_marker_rows_read_back_as_the_streams_and_partitions_they_declare() -> None:
    batch = caught_up_batch(["shop.public.clients", "shop.transaction"],
                            {"shop.public.orders": 3}, {"shop.public.orders": [0, 2]})
    rows = _rows(batch)
    assert all(is_marker(offset) for _, _, offset in rows)
    caught, partitions = read_markers(rows, STREAMS)
    assert caught == {"public.clients", "transaction"}
    assert partitions == TopicPartitions({"public.orders": 3},
                                         {"public.orders": frozenset({0, 2})})


def test_markers_of_topics_the_job_does_not_read_say_nothing() -> None:
    rows = _rows(caught_up_batch(["other.public.x"], {"other.public.x": 2}))
    assert read_markers(rows, STREAMS) == (set(), None)
    assert read_markers([], STREAMS) == (set(), None)
    assert not is_marker(0)
