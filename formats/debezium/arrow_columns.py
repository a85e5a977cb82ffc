"""Column conversions of the columnar Debezium JSON path, each the vectorised twin of one converter in
:mod:`cdcflow.formats.json_decode` for the JSON values Arrow's reader accepts for the column.

A conversion returns None wherever the per-record converter would give anything else (another
value or an error): the caller then decodes the block message by message.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.formats.debezium.envelope import PLACEHOLDER, is_unavailable
from cdcflow.formats.temporal import units_per_second
from cdcflow.formats.types import Field, TypeKind

_INTEGER_TYPES = {
    TypeKind.TINYINT: pa.int8(),
    TypeKind.SMALLINT: pa.int16(),
    TypeKind.INT: pa.int32(),
    TypeKind.BIGINT: pa.int64(),
}
#: What Spark's Arrow schema has for each type (``to_arrow_schema``); TIMESTAMP_LTZ has the session zone.
_SPARK_ARROW_TYPES = {
    **_INTEGER_TYPES,
    TypeKind.BOOLEAN: pa.bool_(),
    TypeKind.DOUBLE: pa.float64(),
    TypeKind.FLOAT: pa.float32(),
    TypeKind.STRING: pa.string(),
    TypeKind.DATE: pa.date32(),
    TypeKind.TIMESTAMP_NTZ: pa.timestamp("us"),
    TypeKind.TIME: pa.time64("ns"),
}
#: The type Arrow's JSON reader parses each column as, before the checked conversion.
_PARSED_AS = {
    **dict.fromkeys(_INTEGER_TYPES, pa.int64()),
    TypeKind.DATE: pa.int64(),
    TypeKind.TIMESTAMP_LTZ: pa.int64(),
    TypeKind.TIMESTAMP_NTZ: pa.int64(),
    TypeKind.TIME: pa.int64(),
    TypeKind.BOOLEAN: pa.bool_(),
    TypeKind.FLOAT: pa.float64(),
    TypeKind.DOUBLE: pa.float64(),
    TypeKind.STRING: pa.string(),
}

_EPOCH = dt.datetime(1970, 1, 1)
_MICROS = dt.timedelta(microseconds=1)
#: Python's datetime range, which bounds what the per-record path accepts, in microseconds since the epoch.
_MIN_MICROS = (dt.datetime.min - _EPOCH) // _MICROS
_MAX_MICROS = (dt.datetime.max - _EPOCH) // _MICROS
_MIN_DAYS = (dt.date.min - _EPOCH.date()).days
_MAX_DAYS = (dt.date.max - _EPOCH.date()).days
_MICROS_PER_DAY = 86_400_000_000

Int64s = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


@functools.cache
def placeholder_texts() -> pa.Array:
    """The text forms of Debezium's unchanged-TOAST placeholder (as is, and base64 for bytes columns).

    Built on first use: a first ``pa.array`` of Python values imports pandas (0.2 s), which the
    process planning a stream's offsets never needs."""
    texts = [PLACEHOLDER, base64.b64encode(PLACEHOLDER.encode()).decode()]
    assert all(is_unavailable(text) for text in texts)  # noqa: S101 - the per-record path's own test
    return pa.array(texts, pa.string())


@dataclass(frozen=True)
class ColumnPlan:
    """How one declared column is read: the type Arrow's JSON reader parses it as, and the target."""

    name: str
    kind: TypeKind
    precision: int | None
    nullable: bool
    target: pa.DataType

    @property
    def parsed_as(self) -> pa.DataType:
        return _PARSED_AS[self.kind]

    def convert(self, parsed: pa.Array) -> pa.Array | None:
        """The column's values as ``target``, or None where the per-record path would differ."""
        kind = self.kind
        if kind in _INTEGER_TYPES:
            return _integers(parsed, self.target)
        if kind is TypeKind.BOOLEAN:
            return parsed
        if kind is TypeKind.STRING:
            return None if pc.any(pc.is_in(parsed, value_set=placeholder_texts())).as_py() else parsed
        if kind in (TypeKind.FLOAT, TypeKind.DOUBLE):
            return _floats(parsed, single=kind is TypeKind.FLOAT)
        values, valid = _int64_values(parsed)
        if kind is TypeKind.DATE:
            if not _within(values, valid, _MIN_DAYS, _MAX_DAYS):
                return None
            return pa.array(values.astype(np.int32), pa.int32(), mask=~valid).view(self.target)
        micros = _micros(values, valid, self.precision)
        if micros is None:
            return None
        if kind is TypeKind.TIME:
            if not _within(micros, valid, 0, _MICROS_PER_DAY - 1):
                return None
            return pa.array(micros * 1000, pa.int64(), mask=~valid).view(self.target)
        if not _within(micros, valid, _MIN_MICROS, _MAX_MICROS):
            return None
        return pa.array(micros, pa.int64(), mask=~valid).view(self.target)


def plan_column(column: Field, arrow_field: pa.Field, *, relaxed: bool = False) -> ColumnPlan | None:
    """The plan of a declared column whose Spark-side Arrow field is ``arrow_field``; None if the
    columnar path does not read this type, or the Arrow field is not the one Spark expects for it.
    ``relaxed``: a NOT NULL column may be nullable in the output (an unsent value is NULL there)."""
    expected = _expected_arrow_type(column, arrow_field.type)
    nullable_ok = arrow_field.nullable == column.nullable or (relaxed and arrow_field.nullable)
    if expected is None or arrow_field.name != column.name or not nullable_ok:
        return None
    if arrow_field.type != expected:
        return None
    return ColumnPlan(column.name, column.type.kind, column.type.precision, column.nullable, expected)


def _expected_arrow_type(column: Field, given: pa.DataType) -> pa.DataType | None:
    kind = column.type.kind
    if kind in _SPARK_ARROW_TYPES:
        return _SPARK_ARROW_TYPES[kind]
    if kind is TypeKind.TIMESTAMP_LTZ and pa.types.is_timestamp(given) and given.tz is not None:
        # An instant: the values are UTC microseconds whatever zone name the session gives Arrow.
        return pa.timestamp("us", tz=given.tz)
    return None


def _integers(parsed: pa.Array, target: pa.DataType) -> pa.Array | None:
    if target == parsed.type:
        return parsed
    try:
        return pc.cast(parsed, target)  # a checked cast: an out-of-range value fails, never wraps
    except pa.ArrowInvalid:
        return None


def _floats(parsed: pa.Array, *, single: bool) -> pa.Array | None:
    values = parsed.to_numpy(zero_copy_only=False)
    valid = validity(parsed)
    with np.errstate(invalid="ignore"):
        # A JSON number never reads as NaN or an infinity per record (those arrive as strings, which
        # Arrow rejects for a number column): here they can only come from NaN/Infinity literals or
        # numbers beyond the double range, which the per-record parser refuses. A negative zero may
        # be the integer -0, which the per-record path reads as +0.0.
        odd = ~np.isfinite(values) | ((values == 0) & np.signbit(values))
    if np.any(odd & valid):
        return None
    if not single:
        return parsed
    with np.errstate(over="ignore"):
        narrowed = values.astype(np.float32)
    if np.any(np.isinf(narrowed) & valid):
        return None  # beyond FLOAT's range: the per-record path fails the record
    return pa.array(narrowed, pa.float32(), mask=~valid)


def validity(parsed: pa.Array) -> Mask:
    """Where ``parsed`` is not null, as a numpy mask."""
    if parsed.null_count == 0:
        return np.ones(len(parsed), dtype=np.bool_)
    return parsed.is_valid().to_numpy(zero_copy_only=False)  # type: ignore[no-any-return]


def _int64_values(parsed: pa.Array) -> tuple[Int64s, Mask]:
    values = parsed.fill_null(0).to_numpy(zero_copy_only=False)
    return values.astype(np.int64, copy=False), validity(parsed)


def _within(values: Int64s, valid: Mask, low: int, high: int) -> bool:
    inside = (values >= low) & (values <= high)
    return bool(np.all(inside | ~valid))


def _micros(values: Int64s, valid: Mask, precision: int | None) -> Int64s | None:
    """Epoch (or since-midnight) integers in the unit the precision implies, as microseconds (floored)."""
    per_second = units_per_second(precision)
    if per_second == 1_000_000:
        return values
    if per_second == 1_000_000_000:
        return np.floor_divide(values, 1000)
    # Milliseconds: beyond the datetime range the product could overflow, and the record fails anyway.
    if not _within(values, valid, _MIN_MICROS // 1000, _MAX_MICROS // 1000):
        return None
    return values * 1000
