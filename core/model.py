"""The values that flow through the engine: changes, watermarks, rejected records and counters."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cdcflow.core.render import format_row
from cdcflow.core.rowkind import RowKind

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Change:
    """One row of a changelog: a row kind and the row's columns."""

    kind: RowKind
    row: Row

    def __str__(self) -> str:
        return f"{self.kind.value}{format_row(self.row)}"

    def to_json_obj(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "row": self.row}

    @classmethod
    def parse_kind(cls, kind: str | RowKind, row: Mapping[str, Any]) -> Change:
        """Build a change from ``"+I"``-style kinds, convenient in tests and fixtures."""
        return cls(kind if isinstance(kind, RowKind) else RowKind.from_short_string(kind), dict(row))


@dataclass(frozen=True, slots=True)
class Watermark:
    """Event time has progressed to ``timestamp``: no row with an earlier time is still expected.

    The timestamp is compared with the values of the ``order_by`` / ``on_time`` column, so it must be
    of a comparable type (datetime, int, float, ISO string).
    """

    timestamp: Any


@dataclass(frozen=True, slots=True)
class Rejected:
    """An input record that was not turned into changes, with the reason; never dropped silently."""

    record: Mapping[str, Any]
    reason: str
    record_index: int


RejectHandler = Callable[[Rejected], None]


@dataclass
class ChangelogMetrics:
    """Counters a conversion updates while it runs.

    ``rejected`` keeps the first ``keep_rejected`` rejected records for inspection; pass an
    ``on_reject`` handler to the conversion to dead-letter every one of them.
    """

    records_in: int = 0
    changes_out: int = 0
    invalid_ops: int = 0
    late_records: int = 0
    expired_states: int = 0
    compacted_changes: int = 0
    rejected: list[Rejected] = field(default_factory=list)
    keep_rejected: int = 1000

    def reject(self, rejected: Rejected, handler: RejectHandler | None) -> None:
        if len(self.rejected) < self.keep_rejected:
            self.rejected.append(rejected)
        if handler is not None:
            handler(rejected)
