"""Executor side of a read: messages → Arrow record batches of changes, dead letters written aside."""

from __future__ import annotations

import contextlib
import itertools
import logging
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.connectors.kafka.reader import RecordChunk, blocks
from cdcflow.connectors.replay.dumps import lines_before, read_line_chunks
from cdcflow.connectors.spark.accounting import MessageCounts, write_counts
from cdcflow.connectors.spark.arrow_types import ChangeBatchBuilder, arrow_schema, struct_type
from cdcflow.connectors.spark.dead_letters import DeadLetterWriter
from cdcflow.connectors.spark.metadata import metadata_array
from cdcflow.connectors.spark.read_plan import ReadPlan
from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats.base import ControlEvent, DecodeOutput, FormatMetrics, Message
from cdcflow.formats.debezium.arrow import ColumnarBatch, ColumnarDecoder
from cdcflow.formats.registry import load, resolve_format

logger = logging.getLogger(__name__)

BLOCK_SIZE = 8192


class BatchDecoder:
    """Decodes one input partition. The columnar path is used where the format has one; a block it
    cannot take (a placeholder, a parse error, a control event) goes through the per-message decoder.

    ``range_name`` names the input range (:func:`~cdcflow.connectors.spark.accounting.range_name`): its dead
    letters and counts are committed under it once the range is read, so a retry replaces them.
    """

    def __init__(self, plan: ReadPlan, range_name: str | None = None) -> None:
        self.plan = plan
        self.range_name = range_name or uuid.uuid4().hex
        self.metrics = FormatMetrics()
        """What became of the messages read so far (every one lands in exactly one outcome counter)."""
        self.decoder = plan.decoder
        self.target = arrow_schema(plan.changelog if plan.changelog is not None else plan.output)
        decoded = plan.decoded_columns
        canonical = arrow_schema(struct_type(decoded))
        built = canonical
        if plan.control_column is not None:  # a control event's row has nulls in every data column
            built = pa.schema([f.with_nullable(True) for f in canonical])
        self._changes = ChangeBatchBuilder(
            decoded, plan.row_kind_column, pa.schema([*built, pa.field(plan.row_kind_column, pa.string())])
        )
        self._columnar = _columnar(plan, canonical)
        self._dead_letters = (
            DeadLetterWriter(plan.dead_letters, self.range_name) if plan.dead_letters is not None else None
        )
        self._unfilled = 0

    def batches(self, messages: Iterable[Message]) -> Iterator[pa.RecordBatch]:
        iterator = iter(messages)
        with self._range():
            while block := list(itertools.islice(iterator, BLOCK_SIZE)):
                batch = self._decode_block(block)
                if batch is not None and batch.num_rows:
                    yield batch

    def record_batches(self, chunks: Iterable[RecordChunk]) -> Iterator[pa.RecordBatch]:
        """:meth:`batches` of Kafka records read a chunk at a time: a block the columnar decoder takes
        never becomes messages."""
        with self._range():
            for block in blocks(chunks, BLOCK_SIZE):
                if self._columnar is not None:
                    keys = block.keys if self._columnar.keyed_state else None
                    headers = block.record_headers() if self._columnar.reads_headers else None
                    result = self._columnar.decode(block.values, keys, headers)
                    if result is not None:
                        self._count_columnar(result, messages=len(block))
                        if result.rows.num_rows:
                            yield self._arrange_records(result.rows, result.message_index, block)
                        continue
                batch = self._decode_block(block.messages(), columnar=False)
                if batch is not None and batch.num_rows:
                    yield batch

    @contextlib.contextmanager
    def _range(self) -> Iterator[None]:
        """Reading the range: commit its dead letters and counts when it is read to its end, drop them
        when the read fails (Spark retries the task, or the query restarts, and writes them then)."""
        try:
            yield
        except BaseException:
            if self._dead_letters is not None:
                self._dead_letters.abort()
            raise
        else:
            self._commit()
        finally:
            self._warn_unfilled()

    def _commit(self) -> None:
        if self._dead_letters is not None:
            self._dead_letters.commit()
        counts = MessageCounts.of(self.metrics)
        if self.plan.accounting_path is not None:
            write_counts(self.plan.accounting_path, self.range_name, counts)
        log = logger.info if counts.read == counts.accounted() else logger.warning
        log("input range %s: %s", self.range_name, counts)

    def _warn_unfilled(self) -> None:
        if self._unfilled and "unavailable_columns" not in self.plan.decoded_columns:
            logger.warning(
                "%d value(s) Debezium did not send (unchanged TOAST) could not be filled in this input "
                "partition and are NULL; add metadata 'unavailable-columns' to see which",
                self._unfilled,
            )

    @property
    def reads_lines(self) -> bool:
        """Whether plain files can skip per-line messages: chunks of lines go to the columnar decoder."""
        return self._columnar is not None

    def file_batches(
        self, path: str, start: int, end: int, lines_before: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        """The changes of the lines of a plain file starting in ``[start, end)``, a chunk at a time.

        Line numbers start after ``lines_before`` (the planner's count); without it they cost a count
        of the file's newlines before the split, made only once something needs them (the ``line``
        column, or a chunk decoded line by line).
        """
        assert self._columnar is not None  # noqa: S101 - callers check reads_lines
        needed = "line" in self.plan.connector_metadata
        line_counter = _LineCounter(path, needed=needed, lines_before=lines_before)
        with self._range():
            for position, chunk in read_line_chunks(path, start, end):
                result = self._columnar.decode_lines(chunk)
                if result is not None:
                    self._count_columnar(result, messages=None)
                    if result.rows.num_rows:
                        first_line = line_counter.first_line_of(position, chunk, lines=result.messages)
                        yield self._arrange_lines(result.rows, result.message_index, path, first_line)
                    else:
                        line_counter.skip(result.messages)
                    continue
                first_line = line_counter.first_line_of(position, chunk, needed=True)
                messages = [
                    Message(line.rstrip(b"\r"), file=path, line=first_line + index)
                    for index, line in enumerate(chunk.split(b"\n"))
                    if line.strip()
                ]
                for offset in range(0, len(messages), BLOCK_SIZE):
                    batch = self._decode_block(messages[offset : offset + BLOCK_SIZE], columnar=False)
                    if batch is not None and batch.num_rows:
                        yield batch

    def _count_columnar(self, result: ColumnarBatch, messages: int | None) -> None:
        """Count a block the columnar path decoded: every message in it gave rows or is a tombstone
        (blank lines of a file are no messages)."""
        changed = result.changed
        metrics = self.metrics
        metrics.messages += changed if messages is None else messages
        metrics.changed_messages += changed
        metrics.changes += result.rows.num_rows
        metrics.tombstones += 0 if messages is None else messages - changed
        metrics.unavailable_values += result.unavailable_values
        metrics.filled_values += result.filled_values
        self._unfilled += result.unavailable_values

    def _arrange_lines(
        self, rows: pa.RecordBatch, origins: pa.Array, path: str, first_line: int
    ) -> pa.RecordBatch:
        columns = self._data_columns(rows)
        for key in self.plan.connector_metadata:
            arrow_type = self.target.field(key).type
            if key == "file":
                columns[key] = pa.repeat(pa.scalar(path, arrow_type), rows.num_rows)
            elif key == "line":
                columns[key] = pc.add(origins.cast(pa.int64()), first_line).cast(arrow_type)
            else:
                columns[key] = pa.nulls(rows.num_rows, type=arrow_type)
        return pa.RecordBatch.from_arrays([columns[f.name] for f in self.target], schema=self.target)

    def _decode_block(self, block: Sequence[Message], *, columnar: bool = True) -> pa.RecordBatch | None:
        if columnar and self._columnar is not None:
            # Keys, because a decoder that fills unchanged values keeps its state per Kafka key.
            keys = [m.key for m in block] if self._columnar.keyed_state else None
            headers = [m.headers for m in block] if self._columnar.reads_headers else None
            result = self._columnar.decode([m.value for m in block], keys, headers)
            if result is not None:
                self._count_columnar(result, messages=len(block))
                return self._arrange(result.rows, result.message_index, block)
        out = DecodeOutput()
        origins: list[int] = []
        event_origins: list[int] = []
        for index, message in enumerate(block):
            before, events = len(out.changes), len(out.events)
            self.decoder.decode(message, out)
            origins.extend(itertools.repeat(index, len(out.changes) - before))
            event_origins.extend(itertools.repeat(index, len(out.events) - events))
        self._unfilled += out.metrics.unavailable_values
        for counter in fields(FormatMetrics):
            setattr(
                self.metrics,
                counter.name,
                getattr(self.metrics, counter.name) + getattr(out.metrics, counter.name),
            )
        if out.dead_letters and self._dead_letters is not None:
            self._dead_letters.write(out.dead_letters)
        if self.plan.control_column is None:
            self._log_skipped(out.events)
        elif out.events:
            return self._with_events(out, origins, event_origins, block)
        if not out.changes:
            return None
        return self._arrange(self._changes.build(out.changes), pa.array(origins, type=pa.int32()), block)

    def _log_skipped(self, events: Sequence[ControlEvent]) -> None:
        for event in events:
            log = logger.warning if event.kind == "truncate" else logger.info
            log(
                "%s: %s event not in the changelog (%s); controlEvents=emit makes it a row",
                event.message.origin(),
                event.kind,
                self.plan.format_name,
            )

    def _with_events(
        self, out: DecodeOutput, origins: list[int], event_origins: list[int], block: Sequence[Message]
    ) -> pa.RecordBatch:
        """The block's changes and control event rows, each at its message's place."""
        rows = pa.Table.from_batches([self._with_control(self._changes.build(out.changes))])
        merged = pa.concat_tables([rows, pa.Table.from_batches([self._event_rows(out.events)])])
        at = np.array([*origins, *event_origins], dtype=np.int32)
        order = np.argsort(at, kind="stable")  # a message's rows keep their order
        taken = merged.take(pa.array(order)).combine_chunks().to_batches()[0]
        return self._arrange(taken, pa.array(at[order]), block)

    def _event_rows(self, events: Sequence[ControlEvent]) -> pa.RecordBatch:
        """One row per control event: its kind, the format's metadata columns, nulls elsewhere."""
        rows = self._changes.build([Change(RowKind.INSERT, dict(event.metadata)) for event in events])
        kinds = [pa.nulls(len(events), pa.string()), pa.array([e.kind for e in events], pa.string())]
        return pa.RecordBatch.from_arrays(
            [*rows.columns[:-1], *kinds], schema=self._with_control(rows).schema
        )

    def _with_control(self, rows: pa.RecordBatch) -> pa.RecordBatch:
        control = self.plan.control_column
        if control is None or control in rows.schema.names:
            return rows
        return rows.append_column(pa.field(control, pa.string()), pa.nulls(rows.num_rows, pa.string()))

    def _data_columns(self, rows: pa.RecordBatch) -> dict[str, pa.Array]:
        names = [*self.plan.decoded_columns.names, self.plan.row_kind_column]
        if self.plan.control_column is not None and rows.num_columns > len(names):
            names.append(self.plan.control_column)
        columns = dict(zip(names, rows.columns, strict=True))
        if self.plan.control_column is not None:
            columns.setdefault(self.plan.control_column, pa.nulls(rows.num_rows, pa.string()))
        return columns

    def _arrange_records(self, rows: pa.RecordBatch, origins: pa.Array, block: RecordChunk) -> pa.RecordBatch:
        columns = self._data_columns(rows)
        for key in self.plan.connector_metadata:
            columns[key] = block.metadata_array(key, self.target.field(key).type).take(origins)
        return pa.RecordBatch.from_arrays([columns[f.name] for f in self.target], schema=self.target)

    def _arrange(self, rows: pa.RecordBatch, origins: pa.Array, block: Sequence[Message]) -> pa.RecordBatch:
        columns = self._data_columns(rows)
        for key in self.plan.connector_metadata:
            arrow_type = self.target.field(key).type
            columns[key] = metadata_array(key, block, arrow_type).take(origins)
        return pa.RecordBatch.from_arrays([columns[f.name] for f in self.target], schema=self.target)


class _LineCounter:
    """The 1-based number of each chunk's first line, counted lazily (0 while nobody needs it)."""

    def __init__(self, path: str, *, needed: bool, lines_before: int | None = None) -> None:
        self.path = path
        self.needed = needed
        self._next_line: int | None = None if lines_before is None else lines_before + 1

    def first_line_of(
        self, position: int, chunk: bytes, *, lines: int | None = None, needed: bool = False
    ) -> int:
        """``lines``: the chunk's, when the caller has counted them."""
        if self._next_line is None:
            if not (needed or self.needed):
                return 0
            self._next_line = lines_before(self.path, position) + 1
        first = self._next_line
        self._next_line += chunk.count(b"\n") if lines is None else lines
        return first

    def skip(self, lines: int) -> None:
        if self._next_line is not None:
            self._next_line += lines


def _columnar(plan: ReadPlan, physical: pa.Schema) -> ColumnarDecoder | None:
    """The columnar twin of the plan's decoder, where its format declares one and it takes the read."""
    target = resolve_format(plan.format_name).columnar_decoder
    if target is None:
        return None
    columnar: type[ColumnarDecoder] = load(target)
    return columnar.for_decoder(plan.decoder, physical, row_kind_column=plan.row_kind_column)
