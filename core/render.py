"""Render values the way Flink's ``Row.toString()`` does, for Flink-style changelog output.

Strings are unquoted, NULL is ``null``, booleans are lower case, doubles follow Java's
``Double.toString`` (``1.0``, ``1.0E7``), nested rows and maps print as ``{k=v}``, arrays as ``[a, b]``.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any


def java_double(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e7:
        text = repr(value)
        return text if "." in text else f"{text}.0"
    sign, digits, exponent = Decimal(repr(value)).as_tuple()
    assert isinstance(exponent, int)  # noqa: S101 - finite by the checks above
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
        return base64.b64encode(bytes(value)).decode("ascii")
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
