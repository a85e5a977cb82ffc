"""What ``cdcflow ingest`` tells its user: the line per applied batch and the run's summary."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdcflow.connectors.lakehouse.sink import Progress
from cdcflow.connectors.spark.accounting import MessageCounts

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery


@dataclass
class IngestSummary:
    batches: int
    progress: Progress
    seconds: float
    table_version: int | None
    table_rows: int | None
    messages: MessageCounts | None = None
    """What became of the messages this run read (None without an accounting directory)."""
    interrupted: bool = False
    """Whether Ctrl-C (KeyboardInterrupt) stopped the run before its input was applied."""
    batch_seconds: float | None = None
    """From the start of the first batch to the end: the rate leaves out the session's start."""
    dead_letters_to: str | None = None
    """Where the source wrote its dead letters (``deadLetterPath`` or ``deadLetterTopic``)."""
    key: tuple[str, ...] = ()
    """The primary key the job applied by: ``--key``, or the one the messages name."""
    tables: Mapping[str, IngestSummary] = field(default_factory=dict)
    """A whole-database job's summary of each table (by qualified name); these fields are their totals."""
    skipped_tables: tuple[str, ...] = ()
    """The tables a whole-database job left out (``--include-tables`` / ``--exclude-tables``)."""
    isolated_tables: Mapping[str, str] = field(default_factory=dict)
    """The tables ``--on-table-error isolate`` stopped, and why."""

    def __str__(self) -> str:
        """One line, non-zero counts only: ``done: ...``, or ``interrupted (Ctrl-C): ... committed``."""
        p = self.progress
        seconds = self.seconds if self.batch_seconds is None else self.batch_seconds
        rate = f" ({p.totals.changes / seconds:,.0f}/s)" if seconds > 0 and p.totals.changes else ""
        applied = _counted(_applied_counts(p))
        work = f"{_plural(self.batches, 'batch', 'batches')}, {p.totals.changes:,} changes{rate}" + (
            f": {applied}" if applied else ""
        )
        if self.tables:
            table = f"{_plural(len(self.tables), 'table', 'tables')}, {self.table_rows or 0:,} rows"
            if self.skipped_tables:
                table += f" ({len(self.skipped_tables):,} more left out: {', '.join(self.skipped_tables)})"
        else:
            table = f"table version {self.table_version}, {self.table_rows or 0:,} rows"
        if self.interrupted:
            parts = [f"interrupted (Ctrl-C): committed {work}", table]
        elif self.batches == 0:
            parts = ["done: nothing new since the last run (0 changes)", table]
        else:
            parts = [f"done: {work}", table]
        if self.messages is not None and self.messages.read:
            parts.append(_messages_text(self.messages, self.dead_letters_to))
        if self.isolated_tables:
            isolated = ", ".join(f"{name} ({why})" for name, why in self.isolated_tables.items())
            parts.append(f"ISOLATED {_plural(len(self.isolated_tables), 'table', 'tables')}: {isolated}")
        if self.interrupted:
            parts.append("run again to go on from the checkpoint")
        return "; ".join(parts)


def _plural(count: int, one: str, many: str) -> str:
    return f"{count:,} {one if count == 1 else many}"


def _counted(counts: list[tuple[int, str]]) -> str:
    """``"4 upserted, 3 deleted"``: the non-zero ``(count, what)`` pairs."""
    return ", ".join(f"{count:,} {what}" for count, what in counts if count)


def _applied_counts(p: Progress) -> list[tuple[int, str]]:
    t = p.totals
    return [
        (t.upserts, "upserted"),
        (t.deletes, "deleted"),
        (t.late, "late"),
        (t.restarts, "restarted positions"),
        (t.unmatched_retractions, "unmatched retractions"),
        (t.unsequenced, "without a sequence"),
        (t.truncates, "truncate(s)"),
        (t.control_events, "other control event(s) skipped"),
        (t.unavailable_unfilled, "unavailable value(s) left NULL"),
        (p.skipped, "replayed batch(es) skipped"),
    ]


def _messages_text(m: MessageCounts, dead_letters_to: str | None) -> str:
    """What became of the messages read, non-zero outcomes only, and where the dead letters went."""
    dead = f"{m.dead_letters:,} dead letter(s)" if m.dead_letters else ""
    if dead and m.internal_errors:
        dead += f" ({m.internal_errors:,} internal errors)"
    if dead and dead_letters_to:
        dead += f" in {dead_letters_to}"
    outcomes = [
        f"{m.changed:,} with changes ({m.changes:,} rows)" if m.changed else "",
        dead,
        _counted([(m.control_events, "control event(s)"), (m.filtered, "filtered")]),
        _counted([(m.tombstones, "tombstone(s)"), (m.empty, "empty")]),
    ]
    text = f"{m.read:,} messages read: " + ", ".join(filter(None, outcomes))
    missing = m.read - m.accounted()
    return text if missing == 0 else f"{text}; {missing:,} UNACCOUNTED (a cdcflow bug: please report)"


def progress_line(
    progress: Progress,
    seconds: float | None,
    lag: str | None,
    messages: MessageCounts | None = None,
    label: str = "",
) -> str:
    """``batches: 3, changes: 1,200 (400 changes/s), upserted: 1,000, ...``: non-zero counts only, the
    rate over ``seconds`` (since the first batch started), ``messages`` those of committed batches."""
    rate = (
        f" ({progress.totals.changes / seconds:,.0f} changes/s)"
        if seconds and progress.totals.changes
        else ""
    )
    counts = [(progress.batches, "batches"), (progress.totals.changes, "changes")]
    counts += _applied_counts(progress)
    counts.append((messages.dead_letters if messages is not None else 0, "dead letters"))
    shown = [f"{what}: {count:,}" + (rate if what == "changes" else "") for count, what in counts if count]
    if progress.last is not None:
        shown.append(f"last batch: {progress.last.seconds * 1000:,.0f} ms")
    if lag is not None:
        shown.append(f"lag: {lag}")
    return f"cdcflow ingest: {label}" + ", ".join(shown)


def reported_batch(query: StreamingQuery) -> int:
    last = query.lastProgress
    batch = last.get("batchId") if last else None
    return batch if isinstance(batch, int) else -1


def lag_text(last: Mapping[str, Any] | None) -> str | None:
    """How far the source is behind its latest offsets: records (Kafka) or bytes (recorded files)."""
    if not last or not last.get("sources"):
        return None
    source = last["sources"][0]
    end, latest = _parse(source.get("endOffset")), _parse(source.get("latestOffset"))
    if latest is None or end is None:
        return None
    if "files" in latest:  # recorded files: bytes per file (the end offset also has its split length)
        return _size(max(0, _total(latest["files"]) - _total(end.get("files"))))
    return _plural(max(0, _total(latest) - _total(end)), "record", "records")


def _size(count: int) -> str:
    """``count`` bytes in binary units: ``512 B``, ``35.3 MiB``."""
    size, unit = float(count), "B"
    for larger in ("KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, larger
    return f"{count:,} B" if unit == "B" else f"{size:,.1f} {unit}"


def _parse(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _total(offsets: Any) -> int:
    if isinstance(offsets, Mapping):
        return sum(_total(v) for v in offsets.values())
    return int(offsets) if isinstance(offsets, int) and offsets >= 0 else 0
