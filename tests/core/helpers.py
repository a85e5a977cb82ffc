"""Small builders shared by the core tests."""

from __future__ import annotations

from typing import Any

from cdcflow import Change, RowKind


class FakeClock:
    """Processing time under the test's control, in epoch seconds."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def at(self, hh_mm: str) -> None:
        hours, minutes = hh_mm.split(":")
        self.now = int(hours) * 3600 + int(minutes) * 60


def ins(**row: Any) -> Change:
    return Change(RowKind.INSERT, row)


def ub(**row: Any) -> Change:
    return Change(RowKind.UPDATE_BEFORE, row)


def ua(**row: Any) -> Change:
    return Change(RowKind.UPDATE_AFTER, row)


def dele(**row: Any) -> Change:
    return Change(RowKind.DELETE, row)
