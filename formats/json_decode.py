"""Convert JSON values into Python values of a declared column type, built once per schema.

What each type accepts (a superset of Flink's JSON format, which only reads text for temporal types):

- integers: JSON integers or integer strings, range-checked; BOOLEAN: true/false or "true"/"false".
- FLOAT/DOUBLE: numbers, numeric strings, "NaN"/"Infinity"/"-Infinity" (as Debezium writes them).
- DECIMAL: numbers, numeric strings, Debezium's base64 two's-complement bytes (scaled by the declared
  scale) and its ``{"scale", "value"}`` variable-scale struct; rounded half-up to the declared scale.
- DATE: ISO strings or integer days since 1970-01-01.
- TIME / TIMESTAMP_NTZ / TIMESTAMP_LTZ: ISO strings (``T`` or space), or integers since midnight /
  the epoch in the unit the declared precision implies (≤3 ms, ≤6 µs, else ns). LTZ values carry UTC.
- BINARY: base64 strings (Kafka Connect's JSON converter). STRING: text; other JSON is kept as its
  JSON text; bytes (Avro, or a Connect ``bytes`` field) as base64 text, also inside a struct kept as
  JSON text, as Flink keeps them: never decoded lossily. ARRAY / MAP / STRUCT: recursively.

Python keeps microseconds: nanosecond digits are truncated.

Every conversion takes time linear in the value's length, and a value it cannot convert fails its
record with a :class:`FieldError` (a short excerpt, never the whole value). Limits, documented in
docs/formats.md: a decimal's digits and scale (see :mod:`.decimals`); JSON kept as text in a STRING
column nests at most :data:`MAX_JSON_TEXT_DEPTH` levels.

The Avro and Connect formats build their rows with :class:`RowConverter` too, with converters of their
own for some columns.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import math
import re
import struct
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

import orjson

from cdcflow.formats.decimals import (
    InexactNumber,
    decimal_from_base64,
    decimal_from_text,
    fits_decimal,
    variable_scale_decimal,
)
from cdcflow.formats.errors import FieldError, excerpt, expected
from cdcflow.formats.numbers import BLANKS, numeric_text, shown
from cdcflow.formats.temporal import EPOCH, EPOCH_DATE, EPOCH_UTC, in_utc, units_per_second
from cdcflow.formats.types import INTEGER_RANGES, DataType, Schema, TypeKind

Converter = Callable[[Any], Any]

#: The deepest JSON value kept as text in a STRING column (orjson writes at most this many levels).
MAX_JSON_TEXT_DEPTH = 254
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
_LONG_FRACTION = re.compile(r"(\.[0-9]{6})[0-9]+")
_TIMESTAMP_FORMS = "a timestamp (yyyy-MM-dd HH:mm:ss[.fff][zone] or an epoch integer)"
_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _integer(kind: TypeKind) -> Converter:
    low, high = INTEGER_RANGES[kind]

    def convert(value: Any) -> Any:
        if value.__class__ is int:
            number = value
        elif isinstance(value, str):
            text = value.strip(BLANKS)
            if len(text) > _MAX_INTEGER_TEXT:
                raise FieldError("", f"{excerpt(value)} is too long to be a {kind.value}")
            if not _INTEGER_TEXT.fullmatch(text):
                raise expected(value, f"an integer for {kind.value}")
            number = int(text)
        elif isinstance(value, (float, Decimal)) and _is_whole(value):
            if not low <= value <= high:
                raise FieldError("", f"{shown(value)} is out of range for {kind.value}")
            number = int(value)
        else:
            raise expected(value, f"an integer for {kind.value}")
        if not low <= number <= high:
            raise FieldError("", f"{shown(number)} is out of range for {kind.value}")
        return number

    return convert


#: The longest integer text read (digits, sign and padding); a BIGINT has 19 digits.
_MAX_INTEGER_TEXT = 100


def _is_whole(value: float | Decimal) -> bool:
    if isinstance(value, Decimal):
        return value.is_finite() and value == value.to_integral_value()
    return math.isfinite(value) and value.is_integer()


def _boolean(value: Any) -> bool:
    if value is True or value is False:
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise expected(value, "a boolean")


def _float64(value: Any) -> float:
    if value.__class__ is float:
        return value
    if isinstance(value, str):
        special = _SPECIAL_FLOATS.get(value)
        if special is not None:
            return special
        text = numeric_text(value)
        if text is None:
            raise expected(value, "a number")
        return _finite(float(text), value, "DOUBLE")
    if isinstance(value, (int, Decimal)) and not isinstance(value, bool):
        try:
            return _finite(float(value), value, "DOUBLE")
        except OverflowError:
            raise FieldError("", f"{shown(value)} is out of range for DOUBLE") from None
    raise expected(value, "a number")


def _finite(number: float, value: Any, kind: str) -> float:
    """``number`` converted from a finite ``value``: beyond the type's range it became infinite."""
    if math.isinf(number):
        raise FieldError("", f"{shown(value)} is out of range for {kind}")
    return number


def _float32(value: Any) -> float:
    number = _float64(value)
    single: float = struct.unpack("f", struct.pack("f", number))[0]
    # Rounding to the nearest FLOAT overflows to an infinity only beyond FLOAT's largest value.
    return single if math.isinf(number) else _finite(single, value, "FLOAT")


def _decimal(precision: int | None, scale: int | None) -> Converter:
    exact_digits = precision if precision is None or precision > 15 else None

    def convert(value: Any) -> Decimal:
        if isinstance(value, Decimal):
            number = value
        elif isinstance(value, int) and not isinstance(value, bool):
            number = Decimal(value)
        elif isinstance(value, float):
            if exact_digits is not None:
                # orjson read the JSON number as a double, which may have lost digits this column
                # keeps: read the message again with exact decimals.
                raise InexactNumber()
            number = Decimal(repr(value))
        elif isinstance(value, str):
            text = value.strip(BLANKS)
            parsed = decimal_from_text(text)
            number = parsed if parsed is not None else decimal_from_base64(text, scale or 0, precision)
        elif isinstance(value, Mapping):
            number = variable_scale_decimal(value)
        else:
            raise expected(value, "a decimal")
        return fits_decimal(number, precision, scale)

    return convert


def _string(value: Any) -> str:
    if value.__class__ is str:
        return value
    if isinstance(value, dict) and value.keys() == {"scale", "value"} and isinstance(value["value"], str):
        # Debezium's VariableScaleDecimal (an unconstrained numeric) read as text: its exact digits.
        return str(variable_scale_decimal(value))
    return as_text(value)


def as_text(value: Any) -> str:
    """A value kept in a STRING column, losslessly: bytes as base64 (the text Kafka Connect's JSON
    converter writes, which Flink keeps), decimals as their digits, anything else as JSON text
    (:func:`json_text`)."""
    if value.__class__ is str:
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Decimal):
        return str(value)
    return json_text(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Decimal):
        return orjson.Fragment(str(value))
    raise TypeError(type(value).__name__)


def json_text(value: Any) -> str:
    """A value as compact JSON text: nested bytes as base64 strings, decimals as exact numbers,
    temporal values as ISO text; never a Python repr (an unknown type is a :class:`FieldError`)."""
    try:
        return orjson.dumps(value, default=_json_default).decode()
    except orjson.JSONEncodeError as error:
        if "Recursion limit" in str(error):
            raise FieldError(
                "",
                f"the JSON value is nested deeper than {MAX_JSON_TEXT_DEPTH} levels, the most a STRING "
                "column keeps as text",
            ) from None
        raise expected(value, "a value that can be written as JSON text") from None


def _binary(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise expected(value, "base64-encoded bytes") from None
    raise expected(value, "base64-encoded bytes")


def _date(value: Any) -> dt.date:
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return EPOCH_DATE + dt.timedelta(days=value)
        except OverflowError:
            raise FieldError("", f"{value} days is out of the DATE range") from None
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value.strip()[:10])
        except ValueError:
            raise expected(value, "a date (yyyy-MM-dd or days since 1970-01-01)") from None
    raise expected(value, "a date (yyyy-MM-dd or days since 1970-01-01)")


def _trim_fraction(text: str) -> str:
    return _LONG_FRACTION.sub(r"\1", text.strip())


def _time(precision: int | None) -> Converter:
    per_second = units_per_second(precision)

    def convert(value: Any) -> dt.time:
        if isinstance(value, int) and not isinstance(value, bool):
            micros = value * 1_000_000 // per_second
            if not 0 <= micros < 86_400_000_000:
                raise FieldError("", f"{value} is not a time of day in units of 1/{per_second} s")
            return (EPOCH + dt.timedelta(microseconds=micros)).time()
        if isinstance(value, str):
            try:
                return dt.time.fromisoformat(_trim_fraction(value).rstrip("Z"))
            except ValueError:
                pass
        raise expected(value, "a time (HH:mm:ss[.fff] or an integer since midnight)")

    return convert


def _timestamp(precision: int | None, *, zoned: bool) -> Converter:
    per_second = units_per_second(precision)
    epoch = EPOCH_UTC if zoned else EPOCH

    def convert(value: Any) -> dt.datetime:
        if isinstance(value, int) and not isinstance(value, bool):
            seconds, rest = divmod(value, per_second)
            try:
                return epoch + dt.timedelta(seconds=seconds, microseconds=rest * 1_000_000 // per_second)
            except OverflowError:
                raise FieldError("", f"{value} is out of the TIMESTAMP range") from None
        if isinstance(value, str):
            try:
                parsed = dt.datetime.fromisoformat(_trim_fraction(value))
            except ValueError:
                raise expected(
                    value, "a timestamp (yyyy-MM-dd HH:mm:ss[.fff][zone] or an epoch integer)"
                ) from None
            if parsed.tzinfo is None:
                return parsed.replace(tzinfo=dt.UTC) if zoned else parsed
            utc = in_utc(parsed, value)
            return utc if zoned else utc.replace(tzinfo=None)
        raise expected(value, _TIMESTAMP_FORMS)

    return convert


def _array(element: DataType) -> Converter:
    convert_element = converter(element)

    def convert(value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise expected(value, "an array")
        out = []
        for index, item in enumerate(value):
            try:
                out.append(None if item is None else convert_element(item))
            except FieldError as error:
                raise FieldError(join_path(f"[{index}]", error.field), error.reason) from None
        return out

    return convert


def _map(key: DataType, value_type: DataType) -> Converter:
    convert_key = converter(key)
    convert_value = converter(value_type)

    def convert(value: Any) -> dict[Any, Any]:
        if not isinstance(value, Mapping):
            raise expected(value, "an object (map)")
        out = {}
        for name, item in value.items():
            try:
                out[convert_key(name)] = None if item is None else convert_value(item)
            except FieldError as error:
                raise FieldError(join_path(f"[{excerpt(name, 40)}]", error.field), error.reason) from None
        return out

    return convert


def join_path(prefix: str, path: str) -> str:
    """A field path below ``prefix``: ``after`` + ``id`` → ``after.id``, ``data`` + ``[0]`` → ``data[0]``."""
    if not path:
        return prefix
    if not prefix:
        return path
    return f"{prefix}{path}" if path.startswith("[") else f"{prefix}.{path}"


def converter(data_type: DataType) -> Converter:
    """A function from a (non-null) JSON value to the Python value of ``data_type``."""
    kind = data_type.kind
    if kind in INTEGER_RANGES:
        return _integer(kind)
    simple: dict[TypeKind, Converter] = {
        TypeKind.BOOLEAN: _boolean,
        TypeKind.FLOAT: _float32,
        TypeKind.DOUBLE: _float64,
        TypeKind.STRING: _string,
        TypeKind.BINARY: _binary,
        TypeKind.DATE: _date,
    }
    if kind in simple:
        return simple[kind]
    if kind is TypeKind.DECIMAL:
        return _decimal(data_type.precision, data_type.scale)
    if kind is TypeKind.TIME:
        return _time(data_type.precision)
    if kind in (TypeKind.TIMESTAMP_NTZ, TypeKind.TIMESTAMP_LTZ):
        return _timestamp(data_type.precision, zoned=kind is TypeKind.TIMESTAMP_LTZ)
    if kind is TypeKind.ARRAY:
        assert data_type.element is not None  # noqa: S101
        return _array(data_type.element)
    if kind is TypeKind.MAP:
        assert data_type.key is not None and data_type.value is not None  # noqa: S101
        return _map(data_type.key, data_type.value)
    return RowConverter(Schema(data_type.fields)).convert_value


class RowConverter:
    """Converts a JSON object into a row dict with the schema's columns, in order.

    Absent fields are NULL (as in Flink); fields the schema does not declare are ignored. A NULL in a
    column declared NOT NULL is an error here, at the record, not later at the sink.
    ``unavailable`` optionally recognises a placeholder value (Debezium's unchanged-TOAST marker):
    such a column becomes :data:`UNAVAILABLE` in the row, for the caller to fill or report.
    """

    def __init__(
        self,
        schema: Schema,
        *,
        converters: Mapping[str, Converter] | None = None,
        unavailable: Callable[[Any], bool] | None = None,
        enforce_not_null: bool = False,
    ) -> None:
        self.schema = schema
        given = converters or {}
        self._columns = [(f.name, given.get(f.name) or converter(f.type)) for f in schema]
        self._not_null = (
            frozenset(f.name for f in schema if not f.nullable) if enforce_not_null else frozenset()
        )
        self._unavailable = unavailable

    def convert(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        row: dict[str, Any] = {}
        unavailable = self._unavailable
        name = ""
        try:
            for name, convert in self._columns:
                value = obj.get(name)
                if value is None:
                    if name in self._not_null:
                        raise FieldError("", "is NULL or missing, but the column is declared NOT NULL")
                    row[name] = value
                elif unavailable is not None and unavailable(value):
                    row[name] = UNAVAILABLE
                else:
                    row[name] = convert(value)
        except FieldError as error:
            raise FieldError(join_path(name, error.field), error.reason) from None
        return row

    def convert_value(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise expected(value, "an object (struct)")
        return self.convert(value)


class _Unavailable:
    """Marks a column whose value the source did not send (Debezium's unchanged TOASTed column)."""

    _instance: _Unavailable | None = None

    def __new__(cls) -> _Unavailable:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNAVAILABLE"

    def __reduce__(self) -> str:
        return "UNAVAILABLE"


UNAVAILABLE = _Unavailable()
