"""Offset arithmetic of Spark's Kafka source, with no Kafka client: resolving ``startingOffsets`` /
``endingOffsets`` against watermarks, the ranges of a batch or micro-batch, ``maxOffsetsPerTrigger``
and splitting ranges into input partitions.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Literal

from cdcflow.connectors.errors import ConnectorOptionError, DataLossError, KafkaConnectorError
from cdcflow.connectors.kafka.options import (
    EARLIEST,
    LATEST,
    JsonOffsets,
    OffsetRange,
    Offsets,
    OffsetSpec,
    TopicPartition,
    offsets_from_json,
    offsets_to_json,
)

log = logging.getLogger(__name__)


def resolve_offsets(
    spec: OffsetSpec,
    bounds: Mapping[TopicPartition, tuple[int, int]],
    *,
    which: Literal["starting", "ending"],
) -> Offsets:
    """Concrete offsets for ``spec`` given each partition's (low, high) watermarks.

    Specific offsets must name exactly the partitions read, as in Spark; -2 is the low watermark,
    -1 the high one.
    """
    if spec.kind != "specific":
        side = 0 if spec.kind == "earliest" else 1
        return {tp: edges[side] for tp, edges in bounds.items()}
    given = spec.offsets
    if set(given) != set(bounds):
        missing = ", ".join(map(str, sorted(set(bounds) - set(given)))) or "none"
        extra = ", ".join(map(str, sorted(set(given) - set(bounds)))) or "none"
        raise ConnectorOptionError(
            f"option '{which}Offsets' must give an offset for every partition read (-2 earliest, -1 latest); "
            f"missing: {missing}; not read: {extra}"
        )
    resolved = {}
    for tp, offset in given.items():
        low, high = bounds[tp]
        resolved[tp] = low if offset == EARLIEST else high if offset == LATEST else offset
    return resolved


def batch_ranges(
    starting: Mapping[TopicPartition, int], ending: Mapping[TopicPartition, int]
) -> list[OffsetRange]:
    """The ranges of a batch read; a start after its end is an error, as in Spark."""
    ranges = []
    for tp in sorted(ending):
        start, end = starting[tp], ending[tp]
        if start > end:
            raise KafkaConnectorError(
                f"topic '{tp.topic}' partition {tp.partition}: starting offset {start} is after the "
                f"ending offset {end}; fix startingOffsets/endingOffsets, or the topic was recreated"
            )
        ranges.append(OffsetRange(tp.topic, tp.partition, start, end))
    return ranges


def stream_ranges(
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    *,
    new_partition_start: Mapping[TopicPartition, int],
    fail_on_data_loss: bool,
) -> list[OffsetRange]:
    """The ranges of a micro-batch from ``start`` to ``end``, reporting lost data as Spark does.

    Partitions in ``end`` but not in ``start`` are new and start at ``new_partition_start`` (their
    low watermarks); partitions gone from ``end`` and offsets that went backwards are data loss.
    """
    for tp in sorted(set(end) - set(start)):
        if tp not in new_partition_start:
            report_data_loss(f"cannot find the earliest offset of new partition {tp}", fail_on_data_loss)
        elif new_partition_start[tp] != 0:
            report_data_loss(
                f"added partition {tp} starts from offset {new_partition_start[tp]} instead of 0",
                fail_on_data_loss,
            )
    gone = sorted(set(start) - set(end))
    if gone:
        report_data_loss(f"partitions {', '.join(map(str, gone))} are gone", fail_on_data_loss)
    ranges = []
    for tp in sorted(end):
        begin = start.get(tp, new_partition_start.get(tp))
        if begin is None:
            continue
        if end[tp] < begin:
            report_data_loss(
                f"partition {tp}'s offset was changed from {begin} to {end[tp]}", fail_on_data_loss
            )
        elif end[tp] > begin:
            ranges.append(OffsetRange(tp.topic, tp.partition, begin, end[tp]))
    return ranges


def rate_limit(
    limit: int, start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int]
) -> Offsets:
    """End offsets reading at most about ``limit`` records, shared in proportion (maxOffsetsPerTrigger).

    As Spark's ``KafkaMicroBatchStream.rateLimit``: a partition of ``latest`` missing from ``start``
    (a new one whose earliest offset is unknown) is left at its latest offset, for the planning of
    the batch to report.
    """
    sizes = {tp: latest[tp] - start[tp] for tp in latest if tp in start and latest[tp] > start[tp]}
    total = sum(sizes.values())
    if total < 1:
        return dict(latest)
    limited = {}
    for tp, end in latest.items():
        if tp not in sizes:
            limited[tp] = end
            continue
        share = limit * sizes[tp] / total
        # Don't starve small partitions: a share below one record rounds up.
        limited[tp] = min(end, start[tp] + (math.ceil(share) if share < 1 else math.floor(share)))
    return limited


def limit_offsets(
    start: JsonOffsets,
    latest: JsonOffsets,
    limit: int,
    *,
    new_partition_start: Mapping[TopicPartition, int],
) -> JsonOffsets:
    """:func:`rate_limit` over Spark's offset JSON.

    Partitions missing from ``start`` are new: they start at ``new_partition_start`` (their earliest
    offsets), as in Spark, so their share of the limit counts only the records they hold.
    """
    begin, end = _offsets(start, "start"), _offsets(latest, "latest")
    for tp in set(end) - set(begin):
        if tp in new_partition_start:
            begin[tp] = new_partition_start[tp]
    return offsets_to_json(rate_limit(limit, begin, end))


def _offsets(obj: JsonOffsets, what: str) -> Offsets:
    try:
        return offsets_from_json(obj)
    except ValueError as error:
        raise KafkaConnectorError(f"malformed {what} offsets {obj!r}: {error}") from None


def split_ranges(
    ranges: Sequence[OffsetRange], max_records: int | None = None, *, min_partitions: int | None = None
) -> list[OffsetRange]:
    """Input partitions: one per non-empty range, split as Spark's KafkaOffsetRangeCalculator does.

    ``max_records`` (maxRecordsPerPartition) caps each piece; ``min_partitions`` splits large ranges
    in proportion to their size until there are about that many pieces.
    """
    pieces = [r for r in ranges if r.size > 0]
    if max_records is not None and max_records > 0:
        pieces = [p for r in pieces for p in _divide(r, math.ceil(r.size / max_records))]
    if min_partitions is None or min_partitions <= len(pieces):
        return pieces
    total = sum(r.size for r in pieces)

    def parts_of(size: int, of_total: int, wanted: int) -> int:
        return max(math.floor(size / of_total * wanted + 0.5), 1)  # Scala's Math.round: half up

    unsplit = [r for r in pieces if parts_of(r.size, total, min_partitions) == 1]
    split_total = total - sum(r.size for r in unsplit)
    split_wanted = max(min_partitions - len(unsplit), 1)
    out = []
    for r in pieces:
        parts = (
            1 if parts_of(r.size, total, min_partitions) == 1 else parts_of(r.size, split_total, split_wanted)
        )
        out.extend(_divide(r, parts))
    return out


def _divide(r: OffsetRange, parts: int) -> list[OffsetRange]:
    remaining, start, out = r.size, r.start, []
    for part in range(parts):
        size = remaining // (parts - part)
        remaining -= size
        if size > 0:
            out.append(OffsetRange(r.topic, r.partition, start, start + size))
        start += size
    return out


def report_data_loss(problem: str, fail_on_data_loss: bool) -> None:
    """Raise :class:`DataLossError`, or log a warning when ``failOnDataLoss`` is false."""
    if fail_on_data_loss:
        raise DataLossError(
            f"{problem}. Some data may have been lost because it is not available in Kafka any more: "
            "it aged out (retention) or the topic was deleted before it was read. To skip lost data "
            "instead of failing, set the source option failOnDataLoss=false"
        )
    log.warning("%s; some data may have been lost (failOnDataLoss=false: skipped)", problem)
