"""Temporal values' reference points and units: the epochs integers count from, the unit a precision
implies, and a zoned moment as UTC."""

from __future__ import annotations

import datetime as dt
from typing import Any

from cdcflow.formats.errors import FieldError, excerpt

EPOCH = dt.datetime(1970, 1, 1)
EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
EPOCH_DATE = dt.date(1970, 1, 1)


def units_per_second(precision: int | None) -> int:
    """The integer unit Debezium uses for a temporal column of this precision."""
    if precision is None or precision <= 3:
        return 1_000
    if precision <= 6:
        return 1_000_000
    return 1_000_000_000


def in_utc(moment: dt.datetime, value: Any = None) -> dt.datetime:
    """``moment`` (with a zone) as UTC; a :class:`FieldError` when that falls outside years 1-9999
    (``0001-01-01T00:00:00+01:00``)."""
    try:
        return moment.astimezone(dt.UTC)
    except (OverflowError, ValueError):
        shown = excerpt(value) if value is not None else moment.isoformat()
        raise FieldError("", f"{shown} is out of the TIMESTAMP range (years 1 to 9999 in UTC)") from None
