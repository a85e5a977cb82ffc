"""Builders and drivers shared by the core tests.

``run_steps`` feeds an input one item at a time, so a test can say what the engine emitted while it
handled each record or watermark, and move the fake wall clock between records (state TTL is
processing time).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, time
from typing import Any

from cdcflow import Change, RowKind, Watermark
from cdcflow.core import InMemoryStateStore

Row = dict[str, Any]
INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE = (
    RowKind.INSERT,
    RowKind.UPDATE_BEFORE,
    RowKind.UPDATE_AFTER,
    RowKind.DELETE,
)
DEBEZIUM_MAPPING = {"c, r": "INSERT", "d": "DELETE", "u": "UPDATE_AFTER"}
UPSERT_KINDS = {INSERT, UPDATE_AFTER, DELETE}
RETRACT_KINDS = set(RowKind)


def ins(**row: Any) -> Change:
    """``+I[...]``"""
    return Change(INSERT, dict(row))


def ub(**row: Any) -> Change:
    """``-U[...]``"""
    return Change(UPDATE_BEFORE, dict(row))


def ua(**row: Any) -> Change:
    """``+U[...]``"""
    return Change(UPDATE_AFTER, dict(row))


def dele(**row: Any) -> Change:
    """``-D[...]``"""
    return Change(DELETE, dict(row))


def t(hhmm: str) -> time:
    """An event time as the spec writes it: ``'10:05'``."""
    hours, minutes = hhmm.split(":")
    return time(int(hours), int(minutes))


def wm(hhmm: str) -> Watermark:
    """``Current Watermark: 10:00``."""
    return Watermark(t(hhmm))


def wall(hhmm: str) -> float:
    """``Wall Clock: 14:00`` as epoch seconds (on an arbitrary fixed day)."""
    return datetime.combine(datetime(2024, 1, 1).date(), t(hhmm), tzinfo=UTC).timestamp()


@dataclass
class FakeClock:
    """A processing-time clock the test moves by hand."""

    now: float = field(default_factory=lambda: wall("12:00"))

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class At:
    """An input item that arrives when the wall clock reads ``clock`` (``'14:03'``)."""

    clock: str
    item: Any


def run_steps(
    convert: Callable[..., Iterator[Any]],
    steps: Sequence[Any],
    *,
    probe: Callable[[], Any] | None = None,
    **kwargs: Any,
) -> tuple[list[list[Any]], list[Any]]:
    """Feed ``steps`` one by one to ``convert`` (from_changelog / to_changelog).

    Returns ``(emitted, probes)``: ``emitted[i]`` is what the engine produced while handling ``steps[i]``
    (it is handling step i until it asks for step i+1), and ``emitted[-1]`` what it produced at the end of
    the input. ``probes[i]`` is ``probe()`` called once step i is handled. A step is an input item, or
    ``At(clock, item)`` to set the fake clock (``kwargs['clock']``) first.
    """
    emitted: list[list[Any]] = [[] for _ in range(len(steps) + 1)]
    probes: list[Any] = []
    position = -1
    clock = kwargs.get("clock")

    def source() -> Iterator[Any]:
        nonlocal position
        for index, step in enumerate(steps):
            if index and probe is not None:
                probes.append(probe())
            if isinstance(step, At):
                assert isinstance(clock, FakeClock), "At(...) steps need clock=FakeClock()"
                clock.now = wall(step.clock)
                step = step.item
            position = index
            yield step
        if steps and probe is not None:
            probes.append(probe())
        position = len(steps)

    for out in convert(source(), **kwargs):
        emitted[position].append(out)
    return emitted, probes


class Tracked:
    """An input that remembers whether the engine pulled anything from it."""

    def __init__(self, items: Iterable[Any]) -> None:
        self.items = list(items)
        self.pulled = 0

    def __iter__(self) -> Iterator[Any]:
        for item in self.items:
            self.pulled += 1
            yield item


def ordered(value: Any) -> Any:
    """A value with the column order of every row made visible, for exact comparisons."""
    if isinstance(value, Change):
        return (value.kind.short_string, ordered(value.row))
    if isinstance(value, Mapping):
        return [(key, ordered(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [ordered(item) for item in value]
    return value


def assert_exact(actual: Any, expected: Any) -> None:
    """Equal, row for row and column for column, in order."""
    assert ordered(actual) == ordered(expected)


def materialize(changes: Iterable[Change], initial: Iterable[Row] = (), key: str = "id") -> list[Row]:
    """The table a changelog turns ``initial`` into (the spec's "Table" lines).

    Every retraction (-U, -D) must remove exactly the row the table holds for its key.
    """
    table: dict[Any, Row] = {row[key]: row for row in initial}
    for change in changes:
        if change.kind in (INSERT, UPDATE_AFTER):
            table[change.row[key]] = change.row
        else:
            assert table.pop(change.row[key], None) == change.row, f"{change} retracts a row the table lacks"
    return list(table.values())


def stored_images(store: InMemoryStateStore) -> list[tuple[Row | None, float | None]]:
    """What the engine keeps per key: last image and expiry time (how it encodes the key is its business)."""
    return [(state.image, state.expires_at) for _, state in store.items() if not state.is_empty]


def flat(emitted: list[list[Any]]) -> list[Any]:
    return [out for step in emitted for out in step]
