"""Python values → JSON, as Flink's JSON format writes them (the encoders' side of :mod:`values`).

Decimals are written as exact JSON numbers, FLOAT as the shortest text that reads back as the same
32-bit float (``3.14``, as Java's ``Float.toString``), dates and times as ISO text, timestamps in the
``timestamp-format.standard`` (``SQL``: ``2020-01-01 10:00:00.123``; ``ISO-8601``: with ``T``),
instants with a ``Z``, bytes as base64.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable, Mapping
from decimal import Decimal
from enum import Enum
from typing import Any

import orjson

from cdcflow.core.render import float32_repr
from cdcflow.formats.errors import EncodeError
from cdcflow.formats.options import Option, boolean, choice
from cdcflow.formats.types import DataType, Schema, TypeKind

Encode = Callable[[Any], Any]


class TimestampStandard(Enum):
    SQL = "SQL"
    ISO_8601 = "ISO-8601"


class MapNullKeyMode(Enum):
    FAIL = "FAIL"
    DROP = "DROP"
    LITERAL = "LITERAL"


IGNORE_PARSE_ERRORS = Option(
    "ignore-parse-errors", boolean, False, "dead-letter records that cannot be decoded"
)
TIMESTAMP_STANDARD = Option(
    "timestamp-format.standard",
    choice(TimestampStandard),
    TimestampStandard.SQL,
    "SQL (2020-01-01 10:00:00) or ISO-8601 (2020-01-01T10:00:00): how timestamps are written (both are read)",
)
MAP_NULL_KEY_OPTIONS = (
    Option("map-null-key.mode", choice(MapNullKeyMode), MapNullKeyMode.FAIL, "FAIL, DROP or LITERAL"),
    Option("map-null-key.literal", str, "null", "the key written for a NULL map key in LITERAL mode"),
)
IGNORE_NULL_FIELDS = Option(
    "encode.ignore-null-fields", boolean, False, "leave NULL columns out of written rows"
)


def _fraction(value: dt.time | dt.datetime) -> str:
    if not value.microsecond:
        return ""
    micros = f"{value.microsecond:06d}"
    return "." + (micros[:3] if micros.endswith("000") else micros)


def format_time(value: dt.time) -> str:
    return f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}{_fraction(value)}"


def format_timestamp(value: dt.datetime, standard: TimestampStandard, *, zoned: bool) -> str:
    if zoned:
        value = value.astimezone(dt.UTC) if value.tzinfo else value
    separator = "T" if standard is TimestampStandard.ISO_8601 else " "
    text = f"{value.date().isoformat()}{separator}{format_time(value.time())}"
    return text + "Z" if zoned else text


def value_encoder(
    data_type: DataType,
    standard: TimestampStandard,
    *,
    map_null_key: MapNullKeyMode = MapNullKeyMode.FAIL,
    map_null_key_literal: str = "null",
) -> Encode:
    kind = data_type.kind
    if kind is TypeKind.DECIMAL:
        return _decimal
    if kind is TypeKind.FLOAT:
        return lambda v: orjson.Fragment(float32_repr(v)) if v == v and abs(v) != float("inf") else _double(v)
    if kind is TypeKind.DOUBLE:
        return _double
    if kind is TypeKind.DATE:
        return lambda v: v.isoformat()
    if kind is TypeKind.TIME:
        return format_time
    if kind is TypeKind.TIMESTAMP_NTZ:
        return lambda v: format_timestamp(v, standard, zoned=False)
    if kind is TypeKind.TIMESTAMP_LTZ:
        return lambda v: format_timestamp(v, standard, zoned=True)
    if kind is TypeKind.BINARY:
        return lambda v: base64.b64encode(v).decode("ascii")
    if kind is TypeKind.ARRAY:
        assert data_type.element is not None  # noqa: S101
        element = value_encoder(
            data_type.element, standard, map_null_key=map_null_key, map_null_key_literal=map_null_key_literal
        )
        return lambda v: [None if item is None else element(item) for item in v]
    if kind is TypeKind.MAP:
        assert data_type.key is not None and data_type.value is not None  # noqa: S101
        return _map(
            value_encoder(
                data_type.value,
                standard,
                map_null_key=map_null_key,
                map_null_key_literal=map_null_key_literal,
            ),
            map_null_key,
            map_null_key_literal,
        )
    if kind is TypeKind.STRUCT:
        return RowEncoder(
            Schema(data_type.fields),
            standard,
            map_null_key=map_null_key,
            map_null_key_literal=map_null_key_literal,
        ).encode
    return _identity


def _double(value: float) -> Any:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _identity(value: Any) -> Any:
    return value


def _decimal(value: Decimal) -> Any:
    return orjson.Fragment(str(value))


def _map(encode_value: Encode, mode: MapNullKeyMode, literal: str) -> Encode:
    def encode(value: Mapping[Any, Any]) -> dict[str, Any]:
        out = {}
        for key, item in value.items():
            if key is None:
                if mode is MapNullKeyMode.FAIL:
                    raise EncodeError(
                        "a map has a NULL key, which JSON cannot hold: set map-null-key.mode to DROP or "
                        "LITERAL"
                    )
                if mode is MapNullKeyMode.DROP:
                    continue
                key = literal
            out[str(key)] = None if item is None else encode_value(item)
        return out

    return encode


class RowEncoder:
    """A row dict → a JSON-ready dict, column by column; ``ignore_nulls`` leaves NULL columns out."""

    def __init__(
        self,
        schema: Schema,
        standard: TimestampStandard,
        *,
        ignore_nulls: bool = False,
        map_null_key: MapNullKeyMode = MapNullKeyMode.FAIL,
        map_null_key_literal: str = "null",
    ) -> None:
        self._columns = [
            (
                f.name,
                value_encoder(
                    f.type, standard, map_null_key=map_null_key, map_null_key_literal=map_null_key_literal
                ),
            )
            for f in schema
        ]
        self._ignore_nulls = ignore_nulls

    def encode(self, row: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, encode in self._columns:
            value = row.get(name)
            if value is None:
                if not self._ignore_nulls:
                    out[name] = None
            else:
                out[name] = encode(value)
        return out
