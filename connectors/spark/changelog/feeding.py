"""Rows fed to the engine: prepared as it sees them (hidden columns off, ordered, event time), and run
through it, a record it rejects failing with its key and position named."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from cdcflow.connectors.spark.changelog.conversion import Conversion, Record
from cdcflow.core.errors import ChangelogDataError


class Prepared(NamedTuple):
    """A record as the engine will see it, with its grouping key, ``sequence_by`` values and, on a
    stream with an event-time column, that time in microseconds (also the record's time value)."""

    key: tuple[Any, ...]
    sequence: tuple[Any, ...]
    record: Record
    time: int | None = None


def prepare(
    conversion: Conversion, rows: Iterable[Mapping[str, Any]], *, sort: bool, stateful: bool = True
) -> list[Prepared]:
    """The rows without hidden columns, sorted by ``sequence_by`` (stably) if ``sort``.

    A stateful conversion needs every row's position: a NULL ``sequence_by`` value fails. On a stream
    the engine sees the event time as epoch microseconds, the unit of Spark's watermark.
    """
    layout = conversion.layout
    hidden = set(layout.hidden)
    time_column, time_values = layout.time_column, layout.time_values
    prepared = []
    for row in rows:
        record = {k: v for k, v in row.items() if k not in hidden}
        time = None
        if time_column is not None and time_values is not None:
            time = row[time_values]
            record[time_column] = time
        prepared.append(
            Prepared(
                tuple(row[name] for name in layout.key_columns),
                tuple(row[name] for name in layout.sequence_by),
                record,
                time,
            )
        )
    if layout.sequence_by and stateful:
        for item in prepared:
            if any(value is None for value in item.sequence):
                raise ChangelogDataError(
                    f"partition_by key {list(item.key)}: sequence_by {list(layout.sequence_by)} is NULL; "
                    "every row needs its position in the stream to be ordered"
                )
        if sort:
            prepared.sort(key=lambda item: item.sequence)
    if time_values is not None:
        for item in prepared:
            if item.time is None:
                raise ChangelogDataError(
                    f"{_where(item)}: the event time '{time_column}' is NULL; every row needs its event "
                    "time to be ordered by the watermark",
                    field=time_column,
                )
    return prepared


def _where(row: Prepared) -> str:
    where = [f"partition_by key {list(row.key)}"] if row.key else []
    if row.sequence:
        where.append(f"sequence_by {list(row.sequence)}")
    return ", ".join(where) or "record"


def run_rows(conversion: Conversion, engine: Any, rows: list[Prepared]) -> list[Record]:
    """Feed records to the engine; a record it rejects fails with its key and position named."""
    output: list[Record] = []
    for row in rows:
        try:
            output.extend(conversion.feed(engine, row.record))
        except ChangelogDataError as error:
            raise type(error)(f"{_where(row)}: {error.reason}", field=error.field) from error
    return output
