"""Event-time buffering released by watermarks, and per-key compaction (spec 4.1.2.2, 4.3.2)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterable
from typing import Any, Generic, TypeVar

from cdcflow.core.model import Change
from cdcflow.core.rowkind import DEL, INS, UA, UB, RowKind

T = TypeVar("T")


class EventTimeBuffer(Generic[T]):
    """Holds items until the watermark passes their event time, then releases them in time order.

    Items with equal times keep their arrival order. Watermarks only move forward.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[Any, int, T]] = []
        self._sequence = itertools.count()
        self.watermark: Any = None

    def is_late(self, timestamp: Any) -> bool:
        """A row below the current watermark arrives after its time was declared complete."""
        return self.watermark is not None and timestamp < self.watermark

    def add(self, timestamp: Any, item: T) -> None:
        heapq.heappush(self._heap, (timestamp, next(self._sequence), item))

    def advance(self, watermark: Any) -> list[T]:
        """Move the watermark and release every item whose time is at or below it."""
        if self.watermark is None or watermark > self.watermark:
            self.watermark = watermark
        released = []
        while self._heap and self._heap[0][0] <= self.watermark:
            released.append(heapq.heappop(self._heap)[2])
        return released

    def drain(self) -> list[T]:
        """Release everything (end of input acts as the final watermark)."""
        released = [item for _, _, item in sorted(self._heap, key=lambda entry: entry[:2])]
        self._heap.clear()
        return released

    def __len__(self) -> int:
        return len(self._heap)


def group_by_key(keyed: Iterable[tuple[Hashable, T]]) -> dict[Hashable, list[T]]:
    """Items per key, keys in order of first appearance, items in arrival order."""
    groups: dict[Hashable, list[T]] = {}
    for key, item in keyed:
        groups.setdefault(key, []).append(item)
    return groups


def compact(changes: list[Change], allowed: frozenset[RowKind]) -> list[Change]:
    """Reduce one key's changes inside a watermark window to their net effect.

    The first change tells what the key held before the window (``+I``: nothing; ``-U``/``-D``: that
    image; ``+U``: something not shown), the last what it holds after. When the net effect needs a
    row kind the stream does not carry, the changes are kept as they are.
    """
    if len(changes) < 2:
        return changes
    first, last = changes[0], changes[-1]
    if last.kind is UB:
        return changes
    existed_before = first.kind is not INS
    old_image = first.row if first.kind in (UB, DEL) else None
    exists_after = last.kind in (INS, UA)
    result: list[Change]
    if not existed_before:
        result = [Change(INS, last.row)] if exists_after else []
    elif not exists_after:
        result = [Change(DEL, old_image if old_image is not None else last.row)]
    elif old_image is None:
        result = [Change(UA, last.row)]
    elif old_image == last.row:
        result = []
    else:
        result = [Change(UB, old_image), Change(UA, last.row)]
    if any(change.kind not in allowed for change in result):
        return changes
    return result
