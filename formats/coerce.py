"""Exact conversions from a message schema's type to a declared column type.

Debezium's schema block (or Avro writer schema) says how a value is encoded: a base64 decimal's
scale, an epoch integer's unit. A value is decoded with that type first; this module then converts
the decoded value to the declared type without changing it (a decimal rescaled only when no digit is
lost, an epoch timestamp read as the same instant), or fails. A pair of types with no exact
conversion is refused when the message schema is first seen.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from cdcflow.formats.decimals import EXACT, MAX_DECIMAL_DIGITS
from cdcflow.formats.errors import FieldError, excerpt
from cdcflow.formats.json_decode import converter
from cdcflow.formats.numbers import numeric_text, shown
from cdcflow.formats.temporal import in_utc
from cdcflow.formats.types import INTEGER_KINDS, INTEGER_RANGES, DataType, TypeKind

Cast = Callable[[Any], Any]

_DECIMALS = INTEGER_KINDS | {TypeKind.DECIMAL}
_NUMBERS = _DECIMALS | {TypeKind.FLOAT, TypeKind.DOUBLE}
_TIMESTAMPS = {TypeKind.TIMESTAMP_NTZ, TypeKind.TIMESTAMP_LTZ}
_MIDNIGHT = dt.time()


def exact_cast(source: DataType, target: DataType, text: Cast) -> Cast | None:
    """How a decoded value of ``source`` becomes a value of ``target``; None if no exact way exists.

    ``text`` is how any decoded value becomes a STRING. A cast raises :class:`FieldError` for a value
    it cannot convert exactly (a decimal that would be rounded or does not fit, a timestamp with a time
    of day declared DATE).
    """
    kind = target.kind
    if kind is TypeKind.STRING:
        return _same if source.kind is TypeKind.STRING else text
    if kind is TypeKind.DECIMAL and (source.kind in _DECIMALS or source.kind is TypeKind.STRING):
        return _to_decimal(target)
    if kind is TypeKind.DECIMAL and source.kind in (TypeKind.FLOAT, TypeKind.DOUBLE):
        to_decimal = _to_decimal(target)
        return lambda v: to_decimal(_float_decimal(v))
    if kind in INTEGER_KINDS and (source.kind in _NUMBERS or source.kind is TypeKind.STRING):
        return _to_integer(kind)
    if kind in (TypeKind.FLOAT, TypeKind.DOUBLE) and (
        source.kind in _NUMBERS or source.kind is TypeKind.STRING
    ):
        # The declared type is approximate: the nearest FLOAT/DOUBLE is what was asked for.
        return converter(target)
    if kind in _TIMESTAMPS and source.kind in _TIMESTAMPS | {TypeKind.DATE}:
        return _to_timestamp(zoned=kind is TypeKind.TIMESTAMP_LTZ)
    if kind is TypeKind.DATE and source.kind in _TIMESTAMPS:
        return _to_date
    if kind is source.kind and kind in (TypeKind.DATE, TypeKind.TIME, TypeKind.BOOLEAN, TypeKind.BINARY):
        return _same
    if kind is TypeKind.ARRAY and source.kind is TypeKind.ARRAY:
        assert source.element is not None and target.element is not None  # noqa: S101
        element = exact_cast(source.element, target.element, text)
        return None if element is None else lambda v: [None if x is None else element(x) for x in v]
    if kind is TypeKind.MAP and source.kind is TypeKind.MAP:
        assert source.key is not None and target.key is not None  # noqa: S101
        assert source.value is not None and target.value is not None  # noqa: S101
        key = exact_cast(source.key, target.key, text)
        value = exact_cast(source.value, target.value, text)
        if key is None or value is None:
            return None
        return lambda v: {key(k): None if x is None else value(x) for k, x in v.items()}
    if kind is TypeKind.STRUCT and source.kind is TypeKind.STRUCT:
        return _to_struct(source, target, text)
    return None


def _same(value: Any) -> Any:
    return value


def _to_decimal(target: DataType) -> Cast:
    precision, scale = target.precision, target.scale
    quantum = Decimal(1).scaleb(-scale) if scale is not None else None
    limit = Decimal(10) ** (precision - (scale or 0)) if precision is not None else None

    def cast(value: Any) -> Decimal:
        if isinstance(value, str) and len(value) > _MAX_NUMBER_TEXT:
            raise FieldError("", f"{excerpt(value, 40)} is too long for {target.ddl()}")
        try:
            number = Decimal(_number_text(value) if isinstance(value, str) else value)
        except (InvalidOperation, TypeError, ValueError):
            raise FieldError("", f"{excerpt(value, 40)} is not a decimal number") from None
        if limit is not None and number.is_finite() and number and number.adjusted() >= limit.adjusted():
            raise FieldError("", f"{shown(number)} does not fit {target.ddl()}")  # before any rounding work
        try:
            exact = number.quantize(quantum, context=EXACT) if quantum is not None else number
        except InvalidOperation:
            raise FieldError("", f"{shown(number)} does not fit {target.ddl()}") from None
        if not exact.is_finite() or exact != number:
            raise FieldError("", f"{shown(number)} has more decimal places than {target.ddl()} keeps")
        if limit is not None and exact.copy_abs() >= limit:
            raise FieldError("", f"{shown(number)} does not fit {target.ddl()}")
        return exact

    return cast


#: The longest numeric text cast to a DECIMAL or an integer (what a decimal of the digit limit takes).
_MAX_NUMBER_TEXT = MAX_DECIMAL_DIGITS + 40


def _number_text(value: str) -> str:
    """A numeric text in ASCII digits without its padding (anything else: what Decimal refuses)."""
    text = numeric_text(value)
    if text is None:
        raise ValueError(value)
    return text


def _float_decimal(value: Any) -> Decimal:
    number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if not number.is_finite():
        raise FieldError("", f"{value} has no decimal value")
    return number


def _to_integer(kind: TypeKind) -> Cast:
    low, high = INTEGER_RANGES[kind]

    def cast(value: Any) -> int:
        if isinstance(value, str) and len(value) > _MAX_NUMBER_TEXT:
            raise FieldError("", f"{excerpt(value, 40)} is too long for {kind.value}")
        try:
            number = Decimal(_number_text(value)) if isinstance(value, str) else _float_decimal(value)
        except (InvalidOperation, ValueError):
            raise FieldError("", f"{excerpt(value, 40)} is not a number") from None
        if not number.is_finite():
            raise FieldError("", f"{excerpt(value, 40)} is not a finite number")
        if not low <= number <= high:
            raise FieldError("", f"{shown(number)} is out of range for {kind.value}")
        if number != number.to_integral_value():
            raise FieldError("", f"{shown(number)} is not a whole number, so it does not fit {kind.value}")
        return int(number)

    return cast


def _to_timestamp(*, zoned: bool) -> Cast:
    """Debezium's timestamps count from the epoch as if in UTC, so a local date-time and an instant
    with the same epoch value are the same value; a date is its midnight."""

    def cast(value: Any) -> dt.datetime:
        moment = value if isinstance(value, dt.datetime) else dt.datetime.combine(value, _MIDNIGHT)
        if moment.tzinfo is not None:
            moment = in_utc(moment)
        return moment.replace(tzinfo=dt.UTC if zoned else None)

    return cast


def _to_date(value: Any) -> dt.date:
    utc = in_utc(value) if value.tzinfo is not None else value
    if utc.time() != _MIDNIGHT:
        raise FieldError("", f"{value.isoformat()} has a time of day, so it is not a DATE")
    return utc.date()


def _to_struct(source: DataType, target: DataType, text: Cast) -> Cast | None:
    source_fields = {f.name: f.type for f in source.fields}
    casts: list[tuple[str, Cast]] = []
    for field in target.fields:
        field_source = source_fields.get(field.name)
        if field_source is None:
            continue  # absent fields are NULL, as in a message without them
        cast = exact_cast(field_source, field.type, text)
        if cast is None:
            return None
        casts.append((field.name, cast))

    def convert(value: Any) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: None for f in target.fields}
        for name, cast in casts:
            item = value.get(name)
            if item is not None:
                try:
                    out[name] = cast(item)
                except FieldError as error:
                    raise FieldError(name, error.reason) from None
        return out

    return convert
