"""Decimal values: their limits, exact arithmetic, and the exact decimal of each form a source writes one
in (numeric text, two's-complement bytes or their base64, Debezium's VariableScaleDecimal), fitted to a
declared ``DECIMAL(p, s)``; and JSON read with exact decimal numbers.

A decimal has at most :data:`MAX_DECIMAL_DIGITS` digits and a scale within ±:data:`MAX_DECIMAL_SCALE` (a
DECIMAL(p, s) column's own precision bounds it further, and its bytes are refused by their length before
any conversion: turning binary into digits is quadratic).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from decimal import ROUND_HALF_UP, Context, Decimal, DivisionByZero, InvalidOperation, Overflow
from functools import lru_cache
from typing import Any

from cdcflow.formats.errors import FieldError, excerpt, expected
from cdcflow.formats.numbers import NUMBER, shown

#: The most digits a decimal value may have (a VariableScaleDecimal has no declared precision; a STRING
#: column keeps its exact digits): the binary-to-digits conversion is quadratic, so longer values are
#: refused by their length before it.
MAX_DECIMAL_DIGITS = 10_000
#: The largest scale (digits after the point, negative: zeros before it) of a decimal value.
MAX_DECIMAL_SCALE = 10_000
#: Arithmetic on decimals must never round: 28 digits (Python's default context) is less than Spark's
#: 38, and a value may have up to MAX_DECIMAL_DIGITS digits; any rounding raises instead.
EXACT = Context(
    prec=MAX_DECIMAL_DIGITS + 2 * MAX_DECIMAL_SCALE,
    rounding=ROUND_HALF_UP,
    Emax=4 * (MAX_DECIMAL_DIGITS + MAX_DECIMAL_SCALE),
    Emin=-4 * (MAX_DECIMAL_DIGITS + MAX_DECIMAL_SCALE),
    traps=[InvalidOperation, Overflow, DivisionByZero],
)


@lru_cache(maxsize=128)
def decimal_bytes_limit(precision: int | None) -> int:
    """The most bytes a two's-complement unscaled value of ``precision`` digits takes (the limit's
    without a precision)."""
    digits = MAX_DECIMAL_DIGITS if precision is None else min(precision, MAX_DECIMAL_DIGITS)
    largest: int = 10**digits - 1
    return largest.bit_length() // 8 + 1


def _base64_limit(precision: int | None) -> int:
    return 4 * -(-decimal_bytes_limit(precision) // 3)


def _too_long(length: int, unit: str, precision: int | None) -> FieldError:
    bound = (
        f"a DECIMAL of precision {precision} has at most {decimal_bytes_limit(precision)}"
        if precision is not None and precision < MAX_DECIMAL_DIGITS
        else f"a decimal value has at most {MAX_DECIMAL_DIGITS:,} digits, {decimal_bytes_limit(None):,}"
    )
    return FieldError("", f"the decimal's unscaled value is {length:,} {unit} long: {bound} bytes")


def _check_scale(scale: int) -> None:
    if not -MAX_DECIMAL_SCALE <= scale <= MAX_DECIMAL_SCALE:
        raise FieldError(
            "",
            f"the decimal's scale {excerpt(scale)} is beyond ±{MAX_DECIMAL_SCALE:,}, the largest supported",
        )


class InexactNumber(Exception):  # noqa: N818 - a signal, not an error
    """A JSON number needs more digits than a double holds: parse the message again, exactly."""


def loads_exact(data: bytes) -> Any:
    """JSON with numbers as exact decimals (slow path, for messages with long decimals; orjson has
    read them already, so they are valid JSON nested at most 1,024 levels)."""
    try:
        return json.loads(data, parse_float=Decimal)
    except RecursionError:
        raise FieldError("", "the JSON is nested too deeply to read its numbers exactly") from None
    except ValueError as error:  # an integer over Python's 4,300-digit conversion limit
        raise FieldError("", f"a number cannot be read exactly ({str(error)[:80]})") from None


def decimal_from_bytes(data: bytes, scale: int, precision: int | None = None) -> Decimal:
    """The exact decimal of two's-complement unscaled bytes; refused by length beyond ``precision``
    digits (:data:`MAX_DECIMAL_DIGITS` without one) before converting."""
    _check_scale(scale)
    if len(data) > decimal_bytes_limit(precision):
        raise _too_long(len(data), "bytes", precision)
    unscaled = Decimal(int.from_bytes(data, "big", signed=True))
    if unscaled.adjusted() >= MAX_DECIMAL_DIGITS:
        raise _too_many_digits()
    return unscaled.scaleb(-scale, EXACT)


def _too_many_digits() -> FieldError:
    return FieldError("", f"the decimal has more than {MAX_DECIMAL_DIGITS:,} digits, the most supported")


def decimal_from_base64(text: str, scale: int, precision: int | None = None) -> Decimal:
    if len(text) > _base64_limit(precision):
        raise _too_long(len(text), "base64 characters", precision)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise expected(text, "a decimal (a number, or base64 two's-complement bytes)") from None
    return decimal_from_bytes(data, scale, precision)


def variable_scale_decimal(value: Mapping[str, Any]) -> Decimal:
    """Debezium's ``io.debezium.data.VariableScaleDecimal``: ``{"scale": s, "value": base64}``."""
    scale, unscaled = value.get("scale"), value.get("value")
    if scale.__class__ is not int or not isinstance(unscaled, str):
        raise expected(value, 'a VariableScaleDecimal {"scale": int, "value": base64}')
    return decimal_from_base64(unscaled, scale)


def decimal_from_text(text: str) -> Decimal | None:
    """The decimal a numeric text stands for (None: not a number); refused beyond the digit limit."""
    if len(text) > _MAX_DECIMAL_TEXT:
        raise FieldError(
            "",
            f"the value is {len(text):,} characters long: a decimal has at most {MAX_DECIMAL_DIGITS:,} "
            "digits (or their base64 bytes)",
        )
    if not NUMBER.fullmatch(text):
        return None
    number = Decimal(text)
    if number and not -_MAX_EXPONENT <= number.adjusted() <= _MAX_EXPONENT:
        raise FieldError("", f"{excerpt(text)} is out of the decimal range (exponents to ±{_MAX_EXPONENT:,})")
    return number


_MAX_DECIMAL_TEXT = MAX_DECIMAL_DIGITS + 40
_MAX_EXPONENT = MAX_DECIMAL_DIGITS + MAX_DECIMAL_SCALE


def fits_decimal(number: Decimal, precision: int | None, scale: int | None) -> Decimal:
    """``number`` rounded half-up to ``scale`` (if any), or a :class:`FieldError` when it does not fit
    ``DECIMAL(precision, scale)``; the magnitude is checked before any rounding work."""
    if not number.is_finite():
        raise FieldError("", f"{shown(number)} is not a finite decimal")
    what = f"DECIMAL({precision}, {scale})" if scale is not None else "a decimal"
    if number and not -_MAX_EXPONENT <= number.adjusted() <= _MAX_EXPONENT:
        raise FieldError("", f"{shown(number)} is out of the decimal range (exponents to ±{_MAX_EXPONENT:,})")
    if precision is not None and number and number.adjusted() >= precision - (scale or 0):
        raise FieldError("", f"{shown(number)} does not fit {what}")
    if scale is None:
        if len(number.as_tuple().digits) > MAX_DECIMAL_DIGITS:
            raise _too_many_digits()
        return number
    try:
        number = number.quantize(_quantum(scale), context=EXACT)
    except InvalidOperation:
        raise FieldError("", f"{shown(number)} does not fit {what}") from None
    if precision is not None and number.copy_abs() >= _power_of_ten(precision - scale):
        raise FieldError("", f"{shown(number)} does not fit {what}")
    return number


def _power_of_ten(exponent: int) -> Decimal:
    return Decimal((0, (1,), exponent))


@lru_cache(maxsize=64)
def _quantum(scale: int) -> Decimal:
    _check_scale(scale)
    return _power_of_ten(-scale)
