"""The batch and streaming readers of the ``cdc-*`` sources, over Kafka or recorded files.

Offsets are Spark's checkpointed dicts: ``{"topic": {"0": 42}}`` (next offset to read per Kafka
partition) or ``{"files": {"/path": 1024}, "split": {"bytes": 4096}}`` (bytes read per replayed file,
and the length of the micro-batch's ranges). Planning runs on the driver; ``read`` runs on an
executor with a pickled copy of the reader and creates its clients there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from cdcflow.connectors.errors import ReplayFormatError, SchemaChangedError
from cdcflow.connectors.kafka import admin as kafka_admin
from cdcflow.connectors.kafka import offsets as kafka_offsets
from cdcflow.connectors.kafka import options as kafka_options
from cdcflow.connectors.kafka import reader as kafka_reader
from cdcflow.connectors.replay import dumps as replay
from cdcflow.connectors.spark import handoff
from cdcflow.connectors.spark.accounting import range_name
from cdcflow.connectors.spark.arrow_types import arrow_schema
from cdcflow.connectors.spark.read_plan import KafkaInput, ReadPlan, ReplayInput, columns_ddl
from cdcflow.connectors.spark.worker_process import prepare_worker
from cdcflow.formats.base import Message
from cdcflow.formats.errors import NewColumnsError

BYTES_PER_RECORD = 400
"""A replayed file is split as if a record were this long (Debezium envelopes are ~0.4-2 kB)."""
MAX_SPLIT_BYTES = 128 << 20
"""A replayed file's splits are at most this long (and equal, so that the cores finish together)."""
MIN_SPLIT_BYTES = 1 << 20
"""``minPartitions`` splits a file's micro-batch no finer than this: each range has a fixed cost."""

Offsets = dict[str, dict[str, int]]
SPLIT_KEY = "split"
"""A recorded files' end offset keeps the length of its batch's ranges here: ``{"bytes": n}``."""


@dataclass(frozen=True)
class FileRange:
    """The lines of a file starting in ``[start, end)``; ``lines_before`` of them, counted once by the
    planner, number them (the ``line`` column, dead letters) without a rescan from the file's start."""

    path: str
    start: int
    end: int
    lines_before: int | None = None


class CdcInputPartition(InputPartition):
    def __init__(self, split: FileRange | kafka_options.OffsetRange) -> None:
        super().__init__(split)
        self.split = split


def _messages(split: FileRange) -> Iterator[Message]:
    return replay.read_messages(split.path, split.start, split.end, split.lines_before)


_CONSUMERS = kafka_reader.ConsumerPool()
"""The Kafka consumers of this process's input ranges (a reused Python worker reads one after another)."""


def _read(plan: ReadPlan, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, CdcInputPartition):
        # With no ranges to read (an empty topic) Spark still runs one task with its own partition.
        return iter(())
    # Imported here, on executors: the process that plans a stream's offsets never decodes.
    from cdcflow.connectors.spark.decode import BatchDecoder

    prepare_worker()

    split = partition.split
    name = _range_name(split)
    decoder = BatchDecoder(plan, name)
    if isinstance(split, FileRange) and decoder.reads_lines and not replay.is_dump(split.path):
        lines = decoder.file_batches(split.path, split.start, split.end, split.lines_before)
        batches = _schema_checked(lines)
    elif isinstance(split, kafka_options.OffsetRange):
        assert isinstance(plan.input, KafkaInput)  # noqa: S101 - Kafka ranges come from a Kafka input
        chunks = kafka_reader.read_range_chunks(
            plan.input.options,
            split,
            fail_on_data_loss=plan.input.options.fail_on_data_loss,
            # A dead letter keeps the record's headers, whether or not the output shows them.
            include_headers=plan.include_headers or plan.dead_letters is not None,
            pool=_CONSUMERS,
        )
        batches = _schema_checked(decoder.record_batches(chunks))
    else:
        batches = _schema_checked(decoder.batches(_messages(split)))
    if plan.handoff_path is None:
        return batches
    from pyspark.sql.pandas.types import to_arrow_schema

    assert plan.changelog is not None  # noqa: S101 - set with handoff_path
    # The table DataFrame.toArrow would give (its types, time zone UTC, small string offsets).
    schema = to_arrow_schema(plan.changelog, timezone="UTC")
    return handoff.write(batches, schema, plan.handoff_path, name, arrow_schema(plan.output))


def _range_name(split: FileRange | kafka_options.OffsetRange) -> str:
    """The same range always has the same name: a retried task or a restarted micro-batch replaces
    its dead letters and counts rather than adding to them."""
    if isinstance(split, FileRange):
        return range_name(split.path, None, split.start, split.end)
    return range_name(split.topic, split.partition, split.start, split.end)


def _schema_checked(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The batches; a message with columns the inferred ones lack fails the task, so the micro-batch
    writes nothing (:class:`SchemaChangedError`)."""
    try:
        yield from batches
    except NewColumnsError as error:
        raise SchemaChangedError(error.origin, columns_ddl(error.columns)) from None


def _file_ranges(path: str, start: int, end: int, target_bytes: int) -> list[FileRange]:
    """``[start, end)`` in equal ranges of at most ``target_bytes``: tasks of equal length finish together."""
    if end <= start:
        return []
    count = -(-(end - start) // target_bytes)
    bounds = [start + (end - start) * i // count for i in range(count + 1)]
    pieces = [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    lines = replay.lines_before_splits(path, [a for a, _ in pieces])
    return [FileRange(path, a, b, n) for (a, b), n in zip(pieces, lines, strict=True)]


def _split_bytes(plan: ReadPlan, end: Offsets) -> int:
    """How long a micro-batch's file ranges are: the length its end offset records (so a batch that a
    restart replays is read in the same ranges, whatever the options or the machine are now), else
    ``maxRecordsPerPartition`` records' worth, as every batch logged without ``minPartitions`` is."""
    recorded = end.get(SPLIT_KEY, {}).get("bytes")
    return max(1, recorded) if recorded is not None else _records_split(plan)


def _records_split(plan: ReadPlan) -> int:
    """``maxRecordsPerPartition`` records' worth of a file (capped at ``MAX_SPLIT_BYTES``)."""
    return min(plan.max_records_per_partition * BYTES_PER_RECORD, MAX_SPLIT_BYTES)


def _planned_split(plan: ReadPlan, start: Offsets, end: Offsets) -> int:
    """The length of the ranges of a new micro-batch ``[start, end)`` under ``minPartitions``: short
    enough for that many ranges (and for maxRecordsPerPartition), not below ``MIN_SPLIT_BYTES``."""
    begun = start.get("files", {})
    total = sum(max(0, size - begun.get(path, 0)) for path, size in end.get("files", {}).items())
    return min(_records_split(plan), max(MIN_SPLIT_BYTES, -(-total // plan.min_partitions)))


def _replay_partitions(plan: ReadPlan, start: Offsets, end: Offsets) -> list[CdcInputPartition]:
    target = _split_bytes(plan, end)
    begun, ended = start.get("files", {}), end.get("files", {})
    for path, size in ended.items():
        if size < begun.get(path, 0):
            raise ReplayFormatError(
                f"file {path} shrank from {begun[path]} to {size} bytes since the last micro-batch: "
                "replayed files must only grow; write new files instead of rewriting old ones"
            )
    return [
        CdcInputPartition(split)
        for path in sorted(ended)
        for split in _file_ranges(path, begun.get(path, 0), ended[path], target)
    ]


def _kafka_partitions(plan: ReadPlan, ranges: list[kafka_options.OffsetRange]) -> list[CdcInputPartition]:
    return [
        CdcInputPartition(split)
        for split in kafka_offsets.split_ranges(
            ranges, plan.max_records_per_partition, min_partitions=plan.min_partitions or None
        )
    ]


def _new_partition_starts(plan: ReadPlan, start: Offsets, end: Offsets) -> kafka_options.Offsets:
    """The earliest offsets of the partitions in ``end`` but not in ``start``: where new ones start."""
    assert isinstance(plan.input, KafkaInput)  # noqa: S101
    new = sorted(set(kafka_options.offsets_from_json(end)) - set(kafka_options.offsets_from_json(start)))
    bounds = kafka_admin.offset_bounds(plan.input.options, new) if new else {}
    return {tp: low for tp, (low, _) in bounds.items()}


def _stream_ranges(plan: ReadPlan, start: Offsets, end: Offsets) -> list[kafka_options.OffsetRange]:
    """A micro-batch's ranges, with Spark's checks: partitions gone or offsets gone back are data loss."""
    assert isinstance(plan.input, KafkaInput)  # noqa: S101
    options = plan.input.options
    begin, stop = kafka_options.offsets_from_json(start), kafka_options.offsets_from_json(end)
    return kafka_offsets.stream_ranges(
        begin,
        stop,
        new_partition_start=_new_partition_starts(plan, start, end),
        fail_on_data_loss=options.fail_on_data_loss,
    )


def _limit_bytes(start: Offsets, latest: Offsets, budget: int) -> Offsets:
    """``latest``, or less so that about ``budget`` new bytes are read (files in name order).

    A file cut short ends where a line starts: the range before reads the line the budget runs out
    in to its end, so a cut inside it would leave the next micro-batch nothing but that line's tail.
    """
    if budget <= 0:
        return latest
    begun, sizes = start.get("files", {}), latest["files"]
    end = dict(begun)
    for path in sorted(sizes):
        at, size = begun.get(path, 0), sizes[path]
        if size - at <= budget:
            end[path] = size  # the rest fits; a file that shrank fails when the batch is planned
        elif budget == 0:
            end[path] = at
        else:
            end[path] = min(replay.next_line_start(path, at + budget), size)
        budget = max(budget - (end[path] - at), 0)
    return {"files": end}


def _file_sizes(plan: ReadPlan, *, list_again: bool = False) -> Offsets:
    """Bytes per file: the planned files, or (streams) the files the path names now."""
    assert isinstance(plan.input, ReplayInput)  # noqa: S101
    files = replay.list_files(plan.input.path) if list_again else plan.input.files
    return {"files": {path: replay.file_size(path) for path in files}}


class CdcBatchReader(DataSourceReader):
    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan

    def partitions(self) -> Sequence[InputPartition]:
        plan = self.plan
        if isinstance(plan.input, ReplayInput):
            sizes = _file_sizes(plan)
            if plan.min_partitions > 0:  # read once: no restart to plan the same ranges for
                sizes = {**sizes, SPLIT_KEY: {"bytes": _planned_split(plan, {}, sizes)}}
            return _replay_partitions(plan, {}, sizes)
        assert isinstance(plan.input, KafkaInput)  # noqa: S101 - a source reads Kafka or files
        options = plan.input.options
        ranges = kafka_offsets.batch_ranges(
            kafka_admin.batch_offsets(options, "starting"), kafka_admin.batch_offsets(options, "ending")
        )
        return _kafka_partitions(plan, ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.plan, partition)


class CdcStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan
        self._available_now: Offsets | None = None
        self._last_latest: Offsets | None = None

    def initialOffset(self) -> Offsets:
        if isinstance(self.plan.input, ReplayInput):
            return {"files": {}}
        assert isinstance(self.plan.input, KafkaInput)  # noqa: S101 - a source reads Kafka or files
        return kafka_options.offsets_to_json(kafka_admin.stream_starting_offsets(self.plan.input.options))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.plan.max_offsets_per_trigger > 0 and isinstance(self.plan.input, KafkaInput):
            return ReadMaxRows(self.plan.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._latest()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        latest = self._available_now if self._available_now is not None else self._latest()
        self._last_latest = latest
        if isinstance(self.plan.input, ReplayInput):
            end = _limit_bytes(start, latest, self.plan.max_bytes_per_trigger)
            if end["files"] == start.get("files", {}):
                return start  # nothing new: the same offset, so Spark plans no micro-batch
            if self.plan.min_partitions > 0:
                return {**end, SPLIT_KEY: {"bytes": _planned_split(self.plan, start, end)}}
            return end
        if isinstance(limit, ReadMaxRows):
            new_starts = _new_partition_starts(self.plan, start, latest)
            return kafka_offsets.limit_offsets(start, latest, limit.max_rows, new_partition_start=new_starts)
        return latest

    def reportLatestOffset(self) -> Offsets:
        """What the last ``latestOffset`` saw (Spark asks right after it, every micro-batch, for its
        progress report): asking Kafka again cost a metadata and a watermark query per batch."""
        return self._last_latest if self._last_latest is not None else self._latest()

    def _latest(self) -> Offsets:
        if isinstance(self.plan.input, ReplayInput):
            return _file_sizes(self.plan, list_again=True)
        assert isinstance(self.plan.input, KafkaInput)  # noqa: S101 - a source reads Kafka or files
        return kafka_options.offsets_to_json(kafka_admin.latest_offsets(self.plan.input.options))

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        if isinstance(self.plan.input, ReplayInput):
            return _replay_partitions(self.plan, start, end)
        return _kafka_partitions(self.plan, _stream_ranges(self.plan, start, end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.plan, partition)

    def commit(self, end: Offsets) -> None:
        """The offsets live in Spark's checkpoint; nothing is committed to Kafka."""
