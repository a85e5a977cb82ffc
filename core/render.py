"""Render values the way Flink's ``Row.toString()`` does, for Flink-style changelog output.

Strings are unquoted, NULL is ``null``, booleans are lower case, doubles follow Java's
``Double.toString`` (``1.0``, ``1.0E7``) and 32-bit floats ``Float.toString`` (:func:`java_float`), byte
strings print as Java's signed ``byte[]`` (``[1, -1]``), maps as ``{k=v}``, arrays as ``[a, b]``.
These are the only leaf rules: ``cdcflow.formats.render`` picks one by a column's declared type (a
nested row there prints as ``+I[...]``; without a type a dict cannot tell a ROW from a MAP).
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from collections.abc import Mapping
from decimal import Decimal
from typing import Any


def java_double(value: float) -> str:
    return _java_decimal(value, repr(value))


def java_float(value: float) -> str:
    """A 32-bit float held in a Python float, as Java's ``Float.toString``: ``3.14``, ``1.0E7``."""
    return _java_decimal(value, float32_repr(value))


def float32_repr(value: float) -> str:
    """The shortest decimal text that reads back as the same 32-bit float (Python's syntax: ``1e+07``)."""
    if value != value or value in (float("inf"), float("-inf")):
        return repr(value)
    target = struct.pack("f", value)
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        if struct.pack("f", float(text)) == target:
            return text if any(c in text for c in ".en") else f"{text}.0"
    return repr(value)


def java_bytes(value: bytes | bytearray) -> str:
    """Java's ``Arrays.toString(byte[])``: signed bytes, ``[1, -1]``."""
    return "[" + ", ".join(str(b - 256 if b > 127 else b) for b in value) + "]"


def _java_decimal(value: float, shortest: str) -> str:
    """``value`` in Java's notation from its shortest decimal text: plain in [1e-3, 1e7), else ``d.dddEn``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e7:
        text = format(Decimal(shortest), "f")
        return text if "." in text else f"{text}.0"
    sign, digits, exponent = Decimal(shortest).as_tuple()
    assert isinstance(exponent, int)  # noqa: S101 - finite by the checks above
    mantissa = "".join(map(str, digits)).rstrip("0") or "0"
    if len(mantissa) == 1:
        # Java writes at least one fraction digit, the nearest one: 1.4E-45, not 1.0E-45.
        sign, digits, exponent = Decimal(f"{Decimal(value):.1e}").as_tuple()
        assert isinstance(exponent, int)  # noqa: S101
        mantissa = "".join(map(str, digits)).rstrip("0") or "0"
    scientific_exponent = len(digits) - 1 + exponent
    fraction = mantissa[1:] or "0"
    return f"{'-' if sign else ''}{mantissa[0]}.{fraction}E{scientific_exponent}"


def format_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return java_double(value)
    if isinstance(value, dt.datetime):
        return _java_local_date_time(value)
    if isinstance(value, dt.time):
        return _java_local_time(value)
    if isinstance(value, (bytes, bytearray)):
        return java_bytes(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{format_value(k)}={format_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return str(value)


def format_row(row: Mapping[str, Any]) -> str:
    return "[" + ", ".join(format_value(v) for v in row.values()) + "]"


def _java_local_time(value: dt.time) -> str:
    # java.time.LocalTime.toString drops zero seconds and trims the fraction to ms/us/ns groups.
    text = f"{value.hour:02d}:{value.minute:02d}"
    if value.second or value.microsecond:
        text += f":{value.second:02d}"
        if value.microsecond:
            micros = f"{value.microsecond:06d}"
            text += "." + (micros[:3] if micros.endswith("000") else micros)
    return text


def _java_local_date_time(value: dt.datetime) -> str:
    text = f"{value.date().isoformat()}T{_java_local_time(value.time())}"
    if value.tzinfo is not None:
        offset = value.strftime("%z")
        text += "Z" if value.utcoffset() == dt.timedelta(0) else f"{offset[:3]}:{offset[3:]}"
    return text
