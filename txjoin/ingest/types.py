"""Column types and values: a declared SQL column type, and a JSON value as Debezium writes
it read into the Python value of that type.

One place parses a column type (:func:`column_kind`) and reads a value
(:func:`convert_value`, :func:`convert`), for every ``decimal.handling.mode``,
``time.precision.mode`` and ``binary.handling.mode`` (``Modes``) and for rows that carry
their schema (``schemas.enable=true``: :data:`SCHEMA_MODE`). A job's tables
(``txjoin.job.Table.convert_row``) read their rows through it; the output's Arrow and
PostgreSQL types, the scenario synthesizer and ``txjoin verify`` parse types with it.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import functools
import json
import re
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from txjoin.errors import JobError
from txjoin.ingest.debezium import (
    DEFAULT_BINARY_HANDLING_MODE,
    DEFAULT_DECIMAL_HANDLING_MODE,
    DEFAULT_TIME_PRECISION_MODE,
    Modes,
)

# Debezium's placeholder for an unchanged TOASTed value it did not receive.
UNAVAILABLE = "__debezium_unavailable_value"

DECIMAL_TYPE = re.compile(r"^(?:numeric|decimal)\((\d+),\s*(\d+)\)$")
# JSON already yields these Python types for these SQL types.
FAST_TYPES: dict[str, type] = {"int": int, "bigint": int, "smallint": int, "text": str,
                               "bool": bool, "double": float}
_SCALARS = {"int", "bigint", "smallint", "text", "bool", "double", "timestamp", "timestamptz",
            "date", "time", "timetz", "interval", "uuid", "json", "jsonb", "bytea", "real",
            "money", "numeric"}
# Types with a precision (fractional digits of seconds, 0..6) or a length (ignored).
_PRECISION = re.compile(r"^(timestamp|timestamptz|time|timetz)\(([0-6])\)$")
_LENGTH = re.compile(r"^(?:varchar|char)(?:\(\d+\))?$")


@functools.lru_cache(maxsize=1024)  # called once per value read: parse each type once
def column_kind(sql_type: str) -> tuple[str, int | None]:
    """A scalar column type as (kind, parameter), e.g. ``timestamp(3)`` -> ("timestamp", 3).

    Kinds are the types of ``_SCALARS`` (``varchar(n)``/``char(n)`` are ``text``,
    ``jsonb`` is ``json``) and ``decimal``, whose parameter is the scale. A time
    or timestamp without a precision has PostgreSQL's default, 6.
    """
    if sql_type in _SCALARS:
        if sql_type in ("timestamp", "timestamptz", "time", "timetz"):
            return sql_type, 6
        return ("json" if sql_type == "jsonb" else sql_type), None
    if _LENGTH.match(sql_type):
        return "text", None
    precise = _PRECISION.match(sql_type)
    if precise:
        return precise.group(1), int(precise.group(2))
    decimal = DECIMAL_TYPE.match(sql_type)
    if decimal:
        return "decimal", int(decimal.group(2))
    raise ValueError(sql_type)


def check_type(sql_type: str, where: str) -> None:
    base = sql_type[:-2] if sql_type.endswith("[]") else sql_type
    try:
        column_kind(base)
    except ValueError:
        raise JobError(
            f"{where}: unknown column type {sql_type!r}; use one of {sorted(_SCALARS)}, "
            f"numeric(p,s), varchar(n), char(n), timestamp(p), timestamptz(p), time(p), "
            f"timetz(p), or any of them followed by []; declare an enum as text and a domain "
            f"as its base type"
        ) from None



_INT_WIDTH = {"smallint": 2, "int": 4, "bigint": 8}
_INT_DIGITS = {"smallint": 5, "int": 10, "bigint": 19}
_MILLIS_MODES = {"timestamp": (None, "adaptive", "adaptive_time_microseconds"),
                 "time": (None, "adaptive")}


def type_fits(declared: str, actual: str, time_precision_mode: str | None = None) -> bool:
    """Whether a column the source has as ``actual`` (txjoin's spelling of its catalog type,
    :func:`txjoin.catalog.column_type`) reads correctly as ``declared``: the same kind, or one
    whose every value the declared type holds (a wider integer; a decimal or ``numeric`` for
    an integer; ``double``/``real`` for an integer; ``text`` for a uuid or json document).
    Refused: what cannot read (``int`` for ``numeric(3,2)``: '3.60'), what reads wrongly (a
    ``timestamp(3)`` declared ``timestamp``: Debezium's milliseconds read as microseconds,
    under the adaptive ``time_precision_mode``), or what can overflow (``int`` for
    ``bigint``, a decimal of smaller scale or fewer integer digits)."""
    if declared.endswith("[]") or actual.endswith("[]"):
        return (declared.endswith("[]") and actual.endswith("[]")
                and type_fits(declared[:-2], actual[:-2], time_precision_mode))
    try:
        want, want_p = column_kind(declared)
        have, have_p = column_kind(actual)
    except ValueError:
        return declared == actual
    if want in _INT_WIDTH:
        return have in _INT_WIDTH and _INT_WIDTH[want] >= _INT_WIDTH[have]
    if want == "decimal":
        assert want_p is not None
        want_digits = int(DECIMAL_TYPE.match(declared).group(1))  # type: ignore[union-attr]
        if have in _INT_WIDTH:
            return want_digits - want_p >= _INT_DIGITS[have]
        if have != "decimal":
            return False
        assert have_p is not None
        have_digits = int(DECIMAL_TYPE.match(actual).group(1))  # type: ignore[union-attr]
        return want_p >= have_p and want_digits - want_p >= have_digits - have_p
    if want == "numeric":
        return have in ("numeric", "decimal", *_INT_WIDTH)
    if want in ("double", "real"):
        return have in (want, "real", *_INT_WIDTH) and not (want == "real" and have == "bigint")
    if want == "text":
        return have in ("text", "uuid", "json")
    if want != have:
        return False
    if want in _MILLIS_MODES and time_precision_mode in _MILLIS_MODES[want]:
        # Debezium sends (0..3) as milliseconds and (4..6) as microseconds.
        assert want_p is not None and have_p is not None
        return (want_p <= 3) == (have_p <= 3)
    return True


SCHEMA_MODE = "schema"
"""The decimal mode of a row that carries its schema: a JSON number is a double."""


def convert_value(value: Any, sql_type: str, *, where: str = "",
                  decimal_handling_mode: str | None = None,
                  time_precision_mode: str | None = None,
                  binary_handling_mode: str | None = None) -> Any:
    """Convert one JSON value as Debezium writes it into a Python value of ``sql_type``.

    ``decimal_handling_mode`` is the connector's setting (default: the one txjoin
    ships, ``string``): ``string`` reads decimal literals, ``precise`` reads
    base64 unscaled bytes at the declared scale, ``double`` reads JSON numbers.
    Debezium's variable-scale ``{"scale", "value"}`` form is read in every mode.
    ``time_precision_mode`` (default ``adaptive``: ``timestamp`` = microseconds since the
    epoch, ``timestamp(0..3)`` milliseconds) says a time's or timestamp's unit; ISO strings
    are accepted too. ``binary_handling_mode`` (default ``bytes``: base64 text through the
    JSON converter) says how ``bytea`` is spelled. One reader per type (``_READERS``).
    """
    return convert(value, sql_type, where, Modes(
        decimal_handling_mode or DEFAULT_DECIMAL_HANDLING_MODE,
        time_precision_mode or DEFAULT_TIME_PRECISION_MODE,
        binary_handling_mode or DEFAULT_BINARY_HANDLING_MODE))


def convert(value: Any, sql_type: str, where: str, modes: Modes) -> Any:
    """:func:`convert_value` with the connector settings already gathered (once per row)."""
    if value is None or value == UNAVAILABLE:
        return value
    if sql_type.endswith("[]"):
        if value == [UNAVAILABLE]:
            return UNAVAILABLE
        if not isinstance(value, list):
            raise ColumnValueError(f"{where}: expected a JSON array for {sql_type}, got "
                                   f"{value!r}", _TYPE_HINT)
        fast = FAST_TYPES.get(sql_type[:-2])
        if fast is not None and all(type(v) is fast for v in value):
            return list(value)  # every element already the right Python type (int[], text[])
        return [convert(v, sql_type[:-2], where, modes) for v in value]
    try:
        kind, param = column_kind(sql_type)
    except ValueError:
        raise JobError(f"{where}: unsupported type {sql_type}") from None
    try:
        return _READERS[kind](value, param, modes)
    except (ValueError, TypeError, ArithmeticError, OverflowError, binascii.Error) as exc:
        decimal = kind in ("decimal", "money", "numeric")
        hint = _decimal_hint(value, modes.decimal) if decimal else _TYPE_HINT
        raise ColumnValueError(f"{where}: cannot read {value!r} as {sql_type}", hint) from exc


# -- one reader per kind: (JSON value as Debezium writes it, parameter, decimal mode) -> value.
# Each also takes the readable form a scenario file or a hand-written record holds (ISO text).

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_DAY = dt.date(1970, 1, 1)
# Debezium's MicroDuration counts a month as 365.25 / 12 days (PostgresValueConverter).
_DAYS_PER_MONTH = 365.25 / 12


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_int(value: Any, _p: int | None, _m: Modes) -> int:
    """An integer: a JSON number, its text, or a whole Decimal (a jsonb number as verify
    reads it); never a float or a fraction, which would be truncated."""
    if isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError
    return int(value)


def _read_text(value: Any, _p: int | None, _m: Modes) -> str:
    """Text; a number or a date (a scenario file's unquoted ``123`` or ``2024-01-02``) reads
    as its text. A boolean, bytes, a timestamp, a duration, a document or a list would read
    as Python's spelling of it, not the column's."""
    if isinstance(value, bool | bytes | bytearray | memoryview | dict | list | dt.datetime
                  | dt.timedelta):
        raise ValueError
    return str(value)


def _read_bool(value: Any, _p: int | None, _m: Modes) -> bool:
    if not isinstance(value, bool):
        raise ValueError
    return value


def _read_float(value: Any, _p: int | None, _m: Modes) -> float:
    """``double``/``real``: a JSON number, its text ('NaN', 'Infinity' too), or a Decimal
    (a jsonb number read with ``parse_float=Decimal``, as verify reads its databases)."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal | str):
        raise ValueError
    return float(value)


def _read_timestamp(value: Any, precision: int | None, modes: Modes) -> dt.datetime:
    """``timestamp(0..3)``: Debezium's epoch milliseconds; (4..6): epoch microseconds
    (``time.precision.mode`` ``connect``: milliseconds at every precision).

    ``timestamptz`` arrives as ISO text (``ZonedTimestamp``); either reads as an
    aware UTC datetime.
    """
    if _is_int(value):
        if modes.time_precision == "connect" or (precision is not None and precision <= 3):
            return _EPOCH + dt.timedelta(milliseconds=value)
        return _EPOCH + dt.timedelta(microseconds=value)
    if isinstance(value, dt.datetime):
        parsed = value
    elif isinstance(value, str):
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    else:
        raise ValueError
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def _read_date(value: Any, _p: int | None, _m: Modes) -> dt.date:
    """``date``: Debezium's days since the epoch (``io.debezium.time.Date``)."""
    if _is_int(value):
        return _EPOCH_DAY + dt.timedelta(days=value)
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    if isinstance(value, str):
        return dt.date.fromisoformat(value)
    raise ValueError


def _read_time(value: Any, precision: int | None, modes: Modes) -> dt.time:
    """``time(0..3)``: milliseconds since midnight (``Time``); (4..6): microseconds
    (``time.precision.mode`` ``connect``: milliseconds at every precision;
    ``adaptive_time_microseconds``: microseconds at every precision)."""
    if _is_int(value):
        millis = modes.time_precision == "connect" or (
            modes.time_precision == "adaptive" and precision is not None and precision <= 3)
        micros = value * 1000 if millis else value
        if not 0 <= micros < 86_400_000_000:
            raise ValueError("24:00:00 or beyond has no Python time")
        return (dt.datetime.min + dt.timedelta(microseconds=micros)).time()
    if isinstance(value, dt.time):
        return value.replace(tzinfo=None)
    if isinstance(value, str):
        return dt.time.fromisoformat(value)
    raise ValueError


def _read_timetz(value: Any, _p: int | None, _m: Modes) -> dt.time:
    """``timetz``: ISO text in UTC (``ZonedTime``); reads as the time of day in UTC, without
    a zone, as the sinks hold it (Arrow times have no zone)."""
    if isinstance(value, str):
        value = dt.time.fromisoformat(value.replace("Z", "+00:00"))
    if not isinstance(value, dt.time):
        raise ValueError
    if value.tzinfo is None:
        return value
    moment = dt.datetime.combine(dt.date(2000, 1, 3), value).astimezone(dt.UTC)
    return moment.time()


_ISO_DURATION = re.compile(
    r"(-)?P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)W)?(?:(-?\d+)D)?"
    r"(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?\d+(?:\.\d+)?)S)?)?")


def _read_interval(value: Any, _p: int | None, _m: Modes) -> dt.timedelta:
    """``interval``: microseconds (``interval.handling.mode=numeric``, ``MicroDuration``)
    or ISO 8601 text (``string``); a month counts 365.25/12 days, as Debezium counts it."""
    if _is_int(value):
        return dt.timedelta(microseconds=value)
    if isinstance(value, dt.timedelta):
        return value
    m = _ISO_DURATION.fullmatch(value) if isinstance(value, str) else None
    if m is None or value in ("P", "-P") or value.endswith("T"):
        raise ValueError
    years, months, weeks, days, hours, minutes = (int(g or 0) for g in m.groups()[1:7])
    seconds = Decimal(m.group(8) or 0)
    total = dt.timedelta(days=(years * 12 + months) * _DAYS_PER_MONTH + weeks * 7 + days,
                         hours=hours, minutes=minutes,
                         microseconds=int(seconds * 1_000_000))
    return -total if m.group(1) else total


def _read_uuid(value: Any, _p: int | None, _m: Modes) -> str:
    """``uuid``: its canonical text (lower case, hyphenated), as the sinks hold it."""
    if not isinstance(value, str | uuid.UUID):
        raise ValueError
    return str(uuid.UUID(str(value)))


def _read_json(value: Any, _p: int | None, _m: Modes) -> str:
    """``json``/``jsonb``: the document's text, as Debezium sends it (``io.debezium.data.Json``).

    An object or array already parsed (written in a scenario file, or a jsonb read with its
    numbers as Decimal) is written back as jsonb spells it. A bare number or boolean is
    refused: Debezium always sends the text, so one means the column is not json."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return _json_text(value)
    raise ValueError


def _json_text(doc: Any) -> str:
    """``doc`` as jsonb writes it, a Decimal as its own text (``json.dumps`` has no Decimal,
    and a float would round it: jsonb keeps ``1.50``)."""
    numbers: list[str] = []

    def marked(value: Any) -> Any:
        if isinstance(value, Decimal):
            numbers.append(str(value))
            return f"\0{len(numbers) - 1}\0"
        if isinstance(value, dict):
            return {k: marked(v) for k, v in value.items()}
        if isinstance(value, list):
            return [marked(v) for v in value]
        return value

    text = json.dumps(marked(doc), separators=(", ", ": "))
    for n, number in enumerate(numbers):
        text = text.replace(f'"\\u0000{n}\\u0000"', number, 1)
    return text


_URL_SAFE = str.maketrans("-_", "+/")


def _read_bytes(value: Any, _p: int | None, modes: Modes) -> bytes:
    """``bytea``: base64 text (``binary.handling.mode`` ``bytes`` through the JSON converter,
    or ``base64``) or URL-safe base64 (``base64-url-safe``), either alphabet read in those
    three modes; hex text in ``hex`` mode (which the job must say: hex text is valid base64
    too)."""
    if isinstance(value, bytes | bytearray | memoryview):  # bytea as psycopg2 reads it
        return bytes(value)
    if not isinstance(value, str):
        raise ValueError
    if modes.binary == "hex":
        return bytes.fromhex(value)
    return base64.b64decode(value.translate(_URL_SAFE), validate=True)


def _read_decimal(value: Any, scale: int | None, modes: Modes) -> Decimal:
    return _decimal(value, scale or 0, modes.decimal)


def _read_money(value: Any, _p: int | None, modes: Modes) -> Decimal:
    """``money``: a decimal at scale 2 (the connector's ``money.fraction.digits``)."""
    return _decimal(value, 2, modes.decimal)


def _read_numeric(value: Any, _p: int | None, modes: Modes) -> str:
    """``numeric`` without a scale (``VariableScaleDecimal``): each value has its own scale,
    which no fixed Arrow decimal holds, so it reads as its exact decimal text ("12.3450"),
    as the sinks hold it (``verify`` compares it as a number)."""
    if isinstance(value, dict):  # VariableScaleDecimal's {scale, value} (precise mode)
        return str(_decimal(value, 0, modes.decimal))
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(Decimal(repr(value)))
    if not isinstance(value, str) or not _LITERAL.fullmatch(value):
        raise ValueError("not a decimal literal")
    return str(Decimal(value))


_Reader = Callable[[Any, "int | None", Modes], Any]
_READERS: dict[str, _Reader] = {
    "int": _read_int, "bigint": _read_int, "smallint": _read_int, "text": _read_text,
    "bool": _read_bool, "double": _read_float, "real": _read_float,
    "timestamp": _read_timestamp, "timestamptz": _read_timestamp, "date": _read_date,
    "time": _read_time, "timetz": _read_timetz, "interval": _read_interval,
    "uuid": _read_uuid, "json": _read_json, "bytea": _read_bytes, "decimal": _read_decimal,
    "money": _read_money, "numeric": _read_numeric,
}


class ColumnValueError(JobError):
    """A column value that cannot be read as its declared type.

    ``reason`` says what and where; the message adds what to do about it when
    the value came from the source (``hint``).
    """

    def __init__(self, reason: str, hint: str) -> None:
        super().__init__(reason + hint)
        self.reason = reason


_TYPE_HINT = (" (source column type changed?). Declare the column's type in the job's Table "
              "as the source has it, then restart the job on the same checkpoint.")


def _decimal(value: Any, scale: int, mode: str) -> Decimal:
    """A ``numeric(p, scale)`` value as the connector's ``decimal.handling.mode`` writes it."""
    if isinstance(value, dict):  # io.debezium.data.VariableScaleDecimal: its own scale
        if set(value) != {"scale", "value"} or not isinstance(value["scale"], int):
            raise ValueError("not a {scale, value} decimal")
        return _unscaled(value["value"]).scaleb(-value["scale"])
    if isinstance(value, bool):
        raise ValueError("a boolean")
    exponent = Decimal(1).scaleb(-scale)
    if isinstance(value, Decimal):  # already read (a value written by hand)
        return _exact(value, exponent)
    if isinstance(value, int | float):  # double mode (or a JSON number in any mode)
        number = Decimal(repr(value))
        if mode in ("double", SCHEMA_MODE):  # with a schema, a number is a double
            return number.quantize(exponent)  # a double is approximate: round to the scale
        return _exact(number, exponent)
    if not isinstance(value, str):
        raise ValueError("not a decimal")
    if mode == "precise":  # base64 of the unscaled value; the scale is the declared one
        return _unscaled(value).scaleb(-scale)
    if not _LITERAL.fullmatch(value):
        raise ValueError("not a decimal literal")
    return _exact(Decimal(value), exponent)


_LITERAL = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:NaN|Infinity)")


def _unscaled(text: Any) -> Decimal:
    if not isinstance(text, str):
        raise ValueError("not base64")
    raw = base64.b64decode(text, validate=True)
    if not raw:
        raise ValueError("empty bytes")
    return Decimal(int.from_bytes(raw, "big", signed=True))


def _exact(number: Decimal, exponent: Decimal) -> Decimal:
    """``number`` at the declared scale; more decimal places than declared is an error."""
    if not number.is_finite():
        return number
    rounded = number.quantize(exponent)
    if rounded != number:
        raise ValueError("more decimal places than declared")
    return rounded


def _decimal_hint(value: Any, mode: str | None) -> str:
    mode = mode or DEFAULT_DECIMAL_HANDLING_MODE
    if mode == SCHEMA_MODE:
        return _TYPE_HINT
    looks_base64 = isinstance(value, str) and not _LITERAL.fullmatch(value)
    if mode == "string" and looks_base64:
        return (" with decimal.handling.mode=string: it looks like base64 (precise mode). Set "
                "the job's decimal_handling_mode (or --decimal-handling-mode) to the "
                "connector's decimal.handling.mode, then restart the job on the same checkpoint.")
    return (f" with decimal.handling.mode={mode}: is that the connector's setting, and is the "
            f"declared scale the column's? Set the job's decimal_handling_mode (or "
            f"--decimal-handling-mode) and the column's type as the source has them, then "
            f"restart the job on the same checkpoint.")
