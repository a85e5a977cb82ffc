"""Numbers in text: what counts as one (ASCII digits, matched without quadratic backtracking), and how
an error message shows one."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from cdcflow.formats.errors import excerpt

# ASCII digits only (``\d`` and Python's int/float/Decimal also take other scripts' digits, "１").
# No nested quantifier that can trade digits (``[0-9]+\.?[0-9]*`` backtracks quadratically on a long run).
NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
#: The padding a numeric text may have (``str.strip()`` also strips control characters float() keeps).
BLANKS = " \t\n\r\f\v"


def numeric_text(value: str) -> str | None:
    """``value`` without its padding if it is a number in ASCII digits (``-1.5e3``), else None."""
    text = value.strip(BLANKS)
    return text if NUMBER.fullmatch(text) else None


def shown(number: Any) -> str:
    """A number as an error message shows it: its digits (a decimal's without ``Decimal(...)``), cut
    to about 60 characters."""
    if isinstance(number, Decimal):
        text = str(number)
        return text if len(text) <= 60 else text[:57] + "..."
    return excerpt(number)
