"""Which Delta tables txjoin commits to without a Spark job, and the statistics it records."""

from __future__ import annotations

import json
from datetime import date

import pyarrow as pa
import pytest

from txjoin.sinks.delta_commit import file_stats, plain

SCHEMA = {"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": False, "metadata": {}}]}
METADATA = {"partitionColumns": [], "configuration": {"delta.checkpointInterval": "100"},
            "schemaString": json.dumps(SCHEMA)}
FEATURES = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["timestampNtz"],
            "writerFeatures": ["timestampNtz", "invariants", "appendOnly"]}


def test_a_table_delta_spark_created_from_the_sinks_schema_is_plain() -> None:
    assert plain(METADATA, FEATURES, SCHEMA)
    assert plain(METADATA, {"minReaderVersion": 1, "minWriterVersion": 2}, SCHEMA)


def _with_column(kind: dict) -> dict:
    return {**SCHEMA, "fields": [*SCHEMA["fields"],
                                 {"name": "c", "type": kind, "nullable": True, "metadata": {}}]}


@pytest.mark.parametrize("kind, nullable_inside", [
    ({"type": "array", "elementType": "long", "containsNull": True}, True),
    ({"type": "array", "elementType": "long", "containsNull": False}, False),
    ({"type": "struct", "fields": [
        {"name": "x", "type": "long", "nullable": False, "metadata": {}}]}, False),
    ({"type": "array", "containsNull": True, "elementType": {"type": "struct", "fields": [
        {"name": "x", "type": "long", "nullable": True, "metadata": {}}]}}, True),
    ({"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": False},
     False),
])
def test_not_null_inside_a_column_is_left_to_delta_spark(kind: dict,
                                                         nullable_inside: bool) -> None:
    schema = _with_column(kind)
    metadata = {**METADATA, "schemaString": json.dumps(schema)}
    assert plain(metadata, FEATURES, schema) is nullable_inside


@pytest.mark.parametrize("metadata, protocol", [
    ({**METADATA, "partitionColumns": ["id"]}, FEATURES),
    ({**METADATA, "configuration": {"delta.constraints.positive": "id > 0"}}, FEATURES),
    ({**METADATA, "configuration": {"delta.columnMapping.mode": "name"}}, FEATURES),
    ({**METADATA, "configuration": {"delta.enableChangeDataFeed": "true"}}, FEATURES),
    ({**METADATA, "schemaString": json.dumps({**SCHEMA, "fields": [
        {**SCHEMA["fields"][0], "nullable": True}]})}, FEATURES),
    (METADATA, {**FEATURES, "writerFeatures": ["invariants", "deletionVectors"]}),
    (METADATA, {**FEATURES, "writerFeatures": ["invariants", "domainMetadata"]}),
    (METADATA, {**FEATURES, "readerFeatures": ["deletionVectors"]}),
    (METADATA, {"minReaderVersion": 1, "minWriterVersion": 3}),  # CHECK constraints
    (METADATA, {"minReaderVersion": 2, "minWriterVersion": 5}),  # column mapping
], ids=["partitioned", "constraint", "column-mapping", "cdf", "other-schema",
        "deletion-vectors", "domain-metadata", "reader-feature", "writer-3", "reader-2"])
def test_anything_a_writer_must_do_beyond_parquet_files_is_not_plain(
        metadata: dict, protocol: dict) -> None:
    assert not plain(metadata, protocol, SCHEMA)


def test_file_stats_are_exact_where_given_and_absent_where_not() -> None:
    table = pa.table({
        "id": pa.array([3, 1, 2], pa.int64()),
        "day": pa.array([date(2026, 1, 3), None, date(2026, 1, 1)]),
        "name": pa.array(["b", None, None]),
        "empty": pa.array([None, None, None], pa.int32()),
        "nested": pa.array([[1], None, []], pa.list_(pa.int64())),
    })
    assert json.loads(file_stats(table)) == {
        "numRecords": 3,
        "minValues": {"id": 1, "day": "2026-01-01"},
        "maxValues": {"id": 3, "day": "2026-01-03"},
        "nullCount": {"id": 0, "day": 1, "name": 2, "empty": 3},
    }
    assert json.loads(file_stats(table.slice(0, 0))) == {
        "numRecords": 0, "nullCount": {"id": 0, "day": 0, "name": 0, "empty": 0}}
