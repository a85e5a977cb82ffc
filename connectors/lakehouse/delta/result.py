"""What applying one batch did to the table: the counts the applier reports."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass
class BatchApplied:
    """What one batch did to the table."""

    batch_id: int
    skipped: bool = False
    changes: int = 0
    upserts: int = 0
    deletes: int = 0
    late: int = 0
    restarts: int = 0
    unmatched_retractions: int = 0
    unavailable_unfilled: int = 0
    """Changes that landed with an unavailable column NULL: no earlier value of their key anywhere."""
    truncates: int = 0
    control_events: int = 0
    """Control events other than TRUNCATE (messages, schema changes), skipped."""
    unsequenced: int = 0
    """Changes whose ``sequence_by`` value is NULL: dead letters, or applied in arrival order."""
    table_version: int | None = None
    seconds: float = 0.0

    def plus(self, other: BatchApplied) -> BatchApplied:
        """Counts and seconds of both added up (a running total; its batch id and version: ``other``'s)."""
        summed = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in fields(self)
            if f.name not in ("batch_id", "skipped", "table_version")
        }
        return replace(other, **summed)
