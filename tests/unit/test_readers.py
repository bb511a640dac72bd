"""Every column type's reader against every Python type its callers can hand it (issue 33).

Callers: Debezium's JSON (int, float, str, bool, dict, list), scenario files (YAML adds
date, datetime and bytes), rows written by hand (Decimal, time, timedelta), and verify,
which reads PostgreSQL with psycopg2 (Decimal, date/time types, memoryview, dict) and
replays ``txjoin_changes``, a jsonb column whose fractional numbers it reads as Decimal.
A value that exactly stands for one of the type's values is read; anything else is a
ColumnValueError, never Python's spelling of the value and never a rounded number.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from decimal import Decimal
from typing import Any

import pytest

from txjoin.ingest.types import _READERS, ColumnValueError, convert_value

UTC = dt.UTC
NO = ColumnValueError  # refused

SAMPLES: dict[str, Any] = {
    "int": 3, "float": 2.5, "Decimal": Decimal("2.50"), "whole Decimal": Decimal("3"),
    "str": "3", "bool": True, "bytes": b"\x01", "memoryview": memoryview(b"\x01"),
    "date": dt.date(2024, 1, 2), "time": dt.time(10, 0), "timetz": dt.time(10, 0, tzinfo=UTC),
    "datetime": dt.datetime(2024, 1, 2, 3, 4, tzinfo=UTC),
    "timedelta": dt.timedelta(seconds=1), "dict": {"a": Decimal("1.50")}, "list": [1],
}

# (type, Python type) -> what the reader makes of SAMPLES[Python type]; NO: refused.
READ: dict[str, dict[str, Any]] = {
    "int": {"int": 3, "float": NO, "Decimal": NO, "whole Decimal": 3, "str": 3, "bool": NO,
            "bytes": NO, "memoryview": NO, "date": NO, "time": NO, "timetz": NO,
            "datetime": NO, "timedelta": NO, "dict": NO, "list": NO},
    "text": {"int": "3", "float": "2.5", "Decimal": "2.50", "whole Decimal": "3", "str": "3",
             "bool": NO, "bytes": NO, "memoryview": NO, "date": "2024-01-02",
             "time": "10:00:00", "timetz": "10:00:00+00:00", "datetime": NO, "timedelta": NO,
             "dict": NO, "list": NO},
    "bool": {"int": NO, "float": NO, "Decimal": NO, "whole Decimal": NO, "str": NO,
             "bool": True, "bytes": NO, "memoryview": NO, "date": NO, "time": NO,
             "timetz": NO, "datetime": NO, "timedelta": NO, "dict": NO, "list": NO},
    "double": {"int": 3.0, "float": 2.5, "Decimal": 2.5, "whole Decimal": 3.0, "str": 3.0,
               "bool": NO, "bytes": NO, "memoryview": NO, "date": NO, "time": NO,
               "timetz": NO, "datetime": NO, "timedelta": NO, "dict": NO, "list": NO},
    "timestamp": {"int": dt.datetime(1970, 1, 1, 0, 0, 0, 3, tzinfo=UTC), "float": NO,
                  "Decimal": NO, "whole Decimal": NO, "str": NO, "bool": NO, "bytes": NO,
                  "memoryview": NO, "date": NO, "time": NO, "timetz": NO,
                  "datetime": dt.datetime(2024, 1, 2, 3, 4, tzinfo=UTC), "timedelta": NO,
                  "dict": NO, "list": NO},
    "date": {"int": dt.date(1970, 1, 4), "float": NO, "Decimal": NO, "whole Decimal": NO,
             "str": NO, "bool": NO, "bytes": NO, "memoryview": NO,
             "date": dt.date(2024, 1, 2), "time": NO, "timetz": NO, "datetime": NO,
             "timedelta": NO, "dict": NO, "list": NO},
    "time": {"int": dt.time(0, 0, 0, 3), "float": NO, "Decimal": NO, "whole Decimal": NO,
             "str": NO, "bool": NO, "bytes": NO, "memoryview": NO, "date": NO,
             "time": dt.time(10, 0), "timetz": dt.time(10, 0), "datetime": NO,
             "timedelta": NO, "dict": NO, "list": NO},
    "timetz": {"int": NO, "float": NO, "Decimal": NO, "whole Decimal": NO, "str": NO,
               "bool": NO, "bytes": NO, "memoryview": NO, "date": NO,
               "time": dt.time(10, 0), "timetz": dt.time(10, 0), "datetime": NO,
               "timedelta": NO, "dict": NO, "list": NO},
    "interval": {"int": dt.timedelta(microseconds=3), "float": NO, "Decimal": NO,
                 "whole Decimal": NO, "str": NO, "bool": NO, "bytes": NO, "memoryview": NO,
                 "date": NO, "time": NO, "timetz": NO, "datetime": NO,
                 "timedelta": dt.timedelta(seconds=1), "dict": NO, "list": NO},
    "uuid": {"int": NO, "float": NO, "Decimal": NO, "whole Decimal": NO, "str": NO,
             "bool": NO, "bytes": NO, "memoryview": NO, "date": NO, "time": NO,
             "timetz": NO, "datetime": NO, "timedelta": NO, "dict": NO, "list": NO},
    "json": {"int": NO, "float": NO, "Decimal": NO, "whole Decimal": NO, "str": "3",
             "bool": NO, "bytes": NO, "memoryview": NO, "date": NO, "time": NO,
             "timetz": NO, "datetime": NO, "timedelta": NO, "dict": '{"a": 1.50}',
             "list": "[1]"},
    "bytea": {"int": NO, "float": NO, "Decimal": NO, "whole Decimal": NO, "str": NO,
              "bool": NO, "bytes": b"\x01", "memoryview": b"\x01", "date": NO, "time": NO,
              "timetz": NO, "datetime": NO, "timedelta": NO, "dict": NO, "list": NO},
    "decimal": {"int": Decimal("3.00"), "float": Decimal("2.50"), "Decimal": Decimal("2.50"),
                "whole Decimal": Decimal("3.00"), "str": Decimal("3.00"), "bool": NO,
                "bytes": NO, "memoryview": NO, "date": NO, "time": NO, "timetz": NO,
                "datetime": NO, "timedelta": NO, "dict": NO, "list": NO},
    "money": {"int": Decimal("3.00"), "float": Decimal("2.50"), "Decimal": Decimal("2.50"),
              "whole Decimal": Decimal("3.00"), "str": Decimal("3.00"), "bool": NO,
              "bytes": NO, "memoryview": NO, "date": NO, "time": NO, "timetz": NO,
              "datetime": NO, "timedelta": NO, "dict": NO, "list": NO},
    "numeric": {"int": "3", "float": "2.5", "Decimal": "2.50", "whole Decimal": "3",
                "str": "3", "bool": NO, "bytes": NO, "memoryview": NO, "date": NO,
                "time": NO, "timetz": NO, "datetime": NO, "timedelta": NO, "dict": NO,
                "list": NO},
}
# Kinds that share a reader with one above, as declared in a job.
SAME_READER = {"bigint": "int", "smallint": "int", "real": "double", "varchar(5)": "text",
               "timestamptz": "timestamp", "jsonb": "json", "numeric(5,2)": "decimal"}
DECLARED = {"decimal": "numeric(5,2)"}


def test_the_table_covers_every_reader_and_every_python_type() -> None:
    assert set(READ) | {SAME_READER.get(k, k) for k in _READERS} == set(READ)
    assert {SAME_READER.get(k, k) for k in _READERS} == set(READ)
    assert all(set(row) == set(SAMPLES) for row in READ.values())


CASES = [(kind, name) for kind in READ for name in SAMPLES]


@pytest.mark.parametrize(("kind", "python_type"), CASES, ids=[f"{k}-{n}" for k, n in CASES])
def test_each_reader_reads_what_stands_for_its_value_and_refuses_the_rest(
        kind: str, python_type: str) -> None:
    expected = READ[kind][python_type]
    sql_types = [DECLARED.get(kind, kind)] + [t for t, k in SAME_READER.items() if k == kind]
    for sql_type in sql_types:
        if expected is NO:
            with pytest.raises(ColumnValueError, match=f"cannot read .* as {re.escape(sql_type)}"):
                convert_value(SAMPLES[python_type], sql_type, where="t.c")
        else:
            got = convert_value(SAMPLES[python_type], sql_type, where="t.c")
            assert got == expected and type(got) is type(expected), (sql_type, got)


def test_texts_the_readers_take() -> None:
    """The str column above is "3"; each type's own text (ISO, base64, JSON's non-numbers)."""
    texts = {
        "double": [("NaN", "nan"), ("-Infinity", "-inf"), ("1e+20", "1e+20")],
        "timestamp": [("2024-01-02T03:04:05Z", "2024-01-02 03:04:05+00:00")],
        "date": [("2024-02-29", "2024-02-29")], "time": [("10:15:30.5", "10:15:30.500000")],
        "timetz": [("10:15:30+02:00", "08:15:30")], "interval": [("PT1.5S", "0:00:01.500000")],
        "uuid": [("8C7E3F5A-1B2C-4D5E-8F90-1234567890AB",
                  "8c7e3f5a-1b2c-4d5e-8f90-1234567890ab")],
        "bytea": [("AQ==", "b'\\x01'")],
    }
    for sql_type, pairs in texts.items():
        for text, shown in pairs:
            assert str(convert_value(text, sql_type)) == shown, (sql_type, text)
    assert convert_value(uuid.UUID(int=1), "uuid") == "00000000-0000-0000-0000-000000000001"


def test_a_double_in_a_jsonb_change_log_reads_as_the_float_it_was() -> None:
    """verify reads txjoin_changes with ``parse_float=Decimal``: a double's 3.14 arrives as
    Decimal('3.14') (issue 33), a real's 0.1 as Decimal('0.1')."""
    assert convert_value(Decimal("3.14"), "double") == 3.14
    assert convert_value([Decimal("0.1"), None], "real[]") == [0.1, None]
