"""ORDER BY (``order_by`` / ``on_time``) on DataFrames: rows released in event-time order by the watermark.

A stream runs in micro-batches; Spark's watermark after a micro-batch is the highest event time seen so
far minus the delay. The expectation is the core engine fed the same rows and those watermarks in the
order Spark applies them:

* from_changelog: a micro-batch's rows, then the watermark it runs under (Spark drops the rows at or
  below the previous micro-batch's watermark before the operator, and counts them);
* to_changelog: the watermark a micro-batch runs under, then its rows (a change at or below it is
  written at once).

Every run of a stream is a new query start from its checkpoint, so rows waiting for the watermark
cross restarts. The input is spread over three partitions; ``sequence_by`` restores arrival order.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from changelog_streams import JsonStream, per_key, rows_of
from pyspark.sql import DataFrame, SparkSession

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.spark.changelog.frames import from_changelog, to_changelog
from cdcflow.core import (
    Change,
    ChangelogMetrics,
    FromChangelog,
    RowKind,
    ToChangelog,
    Watermark,
)
from cdcflow.core.params import plan_from_changelog, plan_to_changelog

pytestmark = pytest.mark.integration

Record = dict[str, Any]

FLAT = "op string, id int, name string, event_time timestamp, seq long"
CHANGELOG = "_row_kind string, id int, name string, event_time timestamp, seq long"
DELAY = timedelta(minutes=5)
COMBINED = {"INSERT": "c", "UPDATE_BEFORE, UPDATE_AFTER": "u", "DELETE": "d"}


def at(clock: str) -> datetime:
    hours, minutes = clock.split(":")
    return datetime(2024, 1, 1, int(hours), int(minutes), tzinfo=UTC)


def rec(op: str, key: int, name: str, clock: str, seq: int, kind_column: str = "op") -> Record:
    return {kind_column: op, "id": key, "name": name, "event_time": at(clock).isoformat(), "seq": seq}


def for_engine(record: Record) -> Record:
    """The record as the engine reads it: the event time as a datetime, no ``sequence_by`` column."""
    return {
        **{k: v for k, v in record.items() if k != "seq"},
        "event_time": datetime.fromisoformat(record["event_time"]),
    }


def watermarks(batches: Sequence[Sequence[Record]]) -> list[datetime]:
    """Spark's watermark after each micro-batch: the highest event time so far, minus the delay."""
    highest: list[datetime] = []
    for batch in batches:
        times = [datetime.fromisoformat(r["event_time"]) for r in batch]
        highest.append(max([*times, *highest[-1:]]))
    return [time - DELAY for time in highest]


def micro_batches(
    stream: JsonStream, files: Sequence[Sequence[Record]]
) -> list[tuple[list[Record], datetime]]:
    """Each micro-batch Spark ran: its rows (one file each, in order; none for a batch that only moved
    the watermark) and the watermark it ran under (epoch 0 before any)."""
    pending = iter(files)
    return [
        (
            list(next(pending)) if report["numInputRows"] else [],
            datetime.fromisoformat(report["eventTime"]["watermark"]),
        )
        for report in stream.progress
    ]


def dropped_as_late(stream: JsonStream) -> int:
    return sum(operator["numRowsDroppedByWatermark"] for operator in stream.state_operators())


# --- from_changelog(order_by=...) ------------------------------------------------------------------

# Runs of files; each file is one micro-batch (maxFilesPerTrigger=1). Spec 4.1.2.2.3's updates of key 5
# arrive out of order and are compacted; 4.1.2.2.1's late record (7) is dropped. Key 10 comes in a
# micro-batch whose watermark already passed it, and that raises no watermark: it is released there.
FROM_RUNS: list[list[list[Record]]] = [
    [
        [rec("INSERT", 5, "A", "09:55", 1), rec("UPDATE_AFTER", 5, "Updated A", "09:57", 2)],
        [rec("UPDATE_AFTER", 5, "Between updates A", "09:56", 3), rec("INSERT", 6, "B", "10:20", 4)],
    ],
    [
        [rec("INSERT", 7, "late", "10:10", 5), rec("UPDATE_AFTER", 6, "B2", "10:25", 6)],
        [rec("INSERT", 10, "edge", "10:18", 7), rec("DELETE", 5, "Updated A", "10:22", 8)],
    ],
    [[rec("INSERT", 8, "C", "10:50", 9)], [rec("INSERT", 9, "D", "11:30", 10)]],
]


def test_from_changelog_releases_rows_in_event_time_order(spark: SparkSession, tmp_path: Path) -> None:
    params: dict[str, Any] = {"partition_by": "id", "order_by": "event_time"}
    stream = JsonStream(spark, tmp_path, FLAT, maxFilesPerTrigger="1")

    def convert(df: DataFrame) -> DataFrame:
        watermarked = df.withWatermark("event_time", "5 minutes").repartition(3)
        return from_changelog(watermarked, sequence_by="seq", **params)

    written: list[list[Record]] = []
    for run in FROM_RUNS:
        for records in run:
            stream.append(records)
        written.append(stream.run(convert))

    files = [batch for run in FROM_RUNS for batch in run]
    marks = watermarks(files)
    batches = micro_batches(stream, files)
    # A run's files, then a batch without data if the last file moved the watermark (f4 does not).
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert marks[2] == marks[3]
    assert [mark for _, mark in batches] == [epoch, marks[0], marks[1], marks[1], marks[2], *marks[3:]]

    # A micro-batch's rows, then its watermark: its rows are late against the one before.
    metrics = ChangelogMetrics()
    engine = FromChangelog(plan_from_changelog(**params), metrics=metrics)
    expected: list[Record] = []
    for rows, mark in batches:
        changes = [c for r in rows for c in engine.process(for_engine(r))]
        changes += engine.on_watermark(Watermark(mark))
        expected += [{**c.row, "_row_kind": c.kind.value} for c in changes]
    everything = [r for run in written for r in run]
    assert per_key(everything) == per_key(expected)

    # Key 5's three updates, sorted by event time and compacted to their net effect (spec 4.1.2.2.3).
    assert per_key(everything)[5] == [
        {"id": 5, "name": "Updated A", "_row_kind": "+I"},
        {"id": 5, "name": "Updated A", "_row_kind": "-D"},
    ]
    # The late row (10:10 under the watermark 10:15): dropped by Spark and counted, as by the engine.
    assert 7 not in per_key(everything)
    assert dropped_as_late(stream) == metrics.late_records == 1
    # B waited in the state store across a restart; B2 and the delete of 5 across another; D still waits.
    assert 6 not in per_key(written[0])
    assert sorted(r["name"] for r in written[1]) == ["B", "edge"]
    assert sorted((r["id"], r["_row_kind"]) for r in written[2]) == [(5, "-D"), (6, "+U"), (8, "+I")]
    assert 9 not in per_key(everything)


def test_order_by_on_a_stream_needs_a_watermarked_timestamp(spark: SparkSession, tmp_path: Path) -> None:
    stream = spark.readStream.schema(FLAT).json(str(tmp_path))
    with pytest.raises(ConnectorOptionError, match="needs a watermark on 'event_time'.*withWatermark"):
        from_changelog(stream, partition_by="id", order_by="event_time")
    with pytest.raises(ConnectorOptionError, match="'seq' is bigint; the event time must be a TIMESTAMP"):
        to_changelog(stream.withColumnRenamed("op", "_row_kind"), on_time="seq")


def test_batch_order_by_is_one_window(spark: SparkSession) -> None:
    records = [r for run in FROM_RUNS for batch in run for r in batch]
    params: dict[str, Any] = {"partition_by": "id", "order_by": "event_time"}
    df = spark.createDataFrame([for_engine(r) | {"seq": r["seq"]} for r in records], FLAT)
    out = rows_of(from_changelog(df.repartition(3), sequence_by="seq", **params))
    engine = FromChangelog(plan_from_changelog(**params))
    expected = [{**c.row, "_row_kind": c.kind.value} for c in engine.run(for_engine(r) for r in records)]
    assert per_key(out) == per_key(expected)
    # The end of a batch releases everything: key 5 inserted and deleted within it leaves nothing.
    assert 5 not in per_key(out)


# --- to_changelog(on_time=...) ---------------------------------------------------------------------

# Spec 4.2.1.3.2, plus a change under the watermark (written at once) and one file per micro-batch.
TO_RUNS: list[list[list[Record]]] = [
    [
        [rec("+I", 5, "Alice", "10:05", 1, "_row_kind")],
        [
            rec("-U", 5, "Alice", "10:06", 2, "_row_kind"),
            rec("+U", 5, "Alice Updated", "10:06", 3, "_row_kind"),
        ],
    ],
    [[rec("+I", 6, "Bob", "10:30", 4, "_row_kind")]],
    [
        [
            rec("+I", 8, "Late", "10:20", 5, "_row_kind"),
            rec("-U", 5, "Alice Updated", "10:50", 6, "_row_kind"),
            rec("+U", 5, "Alice Final", "10:50", 7, "_row_kind"),
        ],
        [rec("+I", 7, "Carol", "11:10", 8, "_row_kind")],
    ],
]


def test_to_changelog_compacts_each_watermark_window(spark: SparkSession, tmp_path: Path) -> None:
    params: dict[str, Any] = {
        "before": "before",
        "after": "after",
        "partition_by": "id",
        "state_ttl": timedelta(days=7),
        "op_mapping": COMBINED,
        "on_time": "event_time",
    }
    stream = JsonStream(spark, tmp_path, CHANGELOG, maxFilesPerTrigger="1")

    def convert(df: DataFrame) -> DataFrame:
        watermarked = df.withWatermark("event_time", "5 minutes").repartition(3)
        return to_changelog(watermarked, sequence_by="seq", **params)

    written: list[list[Record]] = []
    for run in TO_RUNS:
        for records in run:
            stream.append(records)
        written.append(stream.run(convert))

    files = [batch for run in TO_RUNS for batch in run]
    marks = watermarks(files)
    batches = micro_batches(stream, files)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert [mark for _, mark in batches] == [
        epoch,
        marks[0],
        marks[1],
        marks[1],
        marks[2],
        marks[2],
        *marks[3:],
    ]

    # A micro-batch's watermark, then its rows: a change at or below it is written at once.
    engine = ToChangelog(plan_to_changelog(**params))
    expected: list[Record] = []
    for rows, mark in batches:
        expected += engine.on_watermark(Watermark(mark))
        for record in rows:
            row = for_engine(record)
            expected += engine.process(Change(RowKind.from_short_string(row.pop("_row_kind")), row))
    everything = [r for run in written for r in run]
    assert per_key(everything) == per_key(expected)

    def image(name: str, key: int = 5) -> Record:
        return {"id": key, "name": name}

    # Spec 4.2.1.3.2: the insert and the update of window 10:25 compacted to one 'c' with the last image,
    # then the next window's update written with the stored image as 'before'.
    assert per_key(everything)[5] == [
        {"op": "c", "before": None, "after": image("Alice Updated")},
        {"op": "u", "before": image("Alice Updated"), "after": image("Alice Final")},
    ]
    # Under the watermark (10:20 < 10:25): written at once, in the micro-batch it came in, not dropped.
    assert per_key(written[2])[8] == [{"op": "c", "before": None, "after": image("Late", 8)}]
    assert dropped_as_late(stream) == 0
    # Bob waited across a restart; Carol still waits.
    assert 6 not in per_key(written[1])
    assert per_key(written[2])[6] == [{"op": "c", "before": None, "after": image("Bob", 6)}]
    assert 7 not in per_key(everything)
