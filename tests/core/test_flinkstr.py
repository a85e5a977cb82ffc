"""Flink-style rendering of values (Row.toString)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from cdcflow.core.render import format_value, java_double, java_float


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1.0"),
        (3.14, "3.14"),
        (-0.5, "-0.5"),
        (0.0, "0.0"),
        (-0.0, "-0.0"),
        (1e7, "1.0E7"),
        (12345678.9, "1.23456789E7"),
        (0.001, "0.001"),
        (0.0001, "1.0E-4"),
        (1.5e-10, "1.5E-10"),
        (9999999.0, "9999999.0"),
        (float("nan"), "NaN"),
        (float("inf"), "Infinity"),
        (float("-inf"), "-Infinity"),
        (1e300, "1.0E300"),
        (5e-324, "4.9E-324"),
        (2e-10, "2.0E-10"),
    ],
)
def test_java_double_to_string(value: float, text: str) -> None:
    assert java_double(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "null"),
        (True, "true"),
        ("a b", "a b"),
        (Decimal("3.140"), "3.140"),
        (7, "7"),
        (dt.datetime(2020, 1, 1, 10, 0), "2020-01-01T10:00"),
        (dt.datetime(2020, 1, 1, 10, 0, 5, 120000), "2020-01-01T10:00:05.120"),
        (dt.datetime(2020, 1, 1, 10, 0, 5, 123456), "2020-01-01T10:00:05.123456"),
        (dt.datetime(2020, 1, 1, 10, 0, tzinfo=dt.UTC), "2020-01-01T10:00Z"),
        (dt.date(2020, 1, 2), "2020-01-02"),
        (dt.time(9, 5), "09:05"),
        ({"id": 1, "n": None}, "{id=1, n=null}"),
        ([1, "x"], "[1, x]"),
        (b"\x01\xff\x80\x7f", "[1, -1, -128, 127]"),
        ([b"\x00"], "[[0]]"),
    ],
)
def test_format_value(value: Any, text: str) -> None:
    assert format_value(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (3.140000104904175, "3.14"),
        (1e7, "1.0E7"),
        (1e-5, "1.0E-5"),
        (1.2345678e-8, "1.2345678E-8"),
        (0.001, "0.001"),
        (1000000.0, "1000000.0"),
        (9999999.0, "9999999.0"),
        (-2.5, "-2.5"),
        (3.4028234663852886e38, "3.4028235E38"),
        (1.401298464324817e-45, "1.4E-45"),
        (0.0, "0.0"),
        (-0.0, "-0.0"),
        (float("nan"), "NaN"),
        (float("-inf"), "-Infinity"),
    ],
)
def test_java_float_to_string(value: float, text: str) -> None:
    """Java's Float.toString of the 32-bit float a FLOAT column holds (jshell: Float.toString(1e7f))."""
    assert java_float(value) == text
