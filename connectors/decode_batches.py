"""Executor side of a read: messages → Arrow record batches of changes, dead letters written aside."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.connectors.columnar import ColumnarDecoder
from cdcflow.connectors.dead_letters import DeadLetterWriter
from cdcflow.connectors.metadata import metadata_array
from cdcflow.connectors.read_plan import ReadPlan
from cdcflow.connectors.replay import lines_before, read_line_chunks
from cdcflow.connectors.spark_types import ChangeBatchBuilder, arrow_schema, struct_type
from cdcflow.formats.base import DecodeOutput, Message

logger = logging.getLogger(__name__)

BLOCK_SIZE = 8192


class BatchDecoder:
    """Decodes one input partition. The columnar path is used where the format has one; a block it
    cannot take (a placeholder, a parse error, a control event) goes through the per-message decoder."""

    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan
        self.decoder = plan.decoder
        self.target = arrow_schema(plan.output)
        decoded = plan.decoded_columns
        canonical = arrow_schema(struct_type(decoded))
        self._changes = ChangeBatchBuilder(
            decoded,
            plan.row_kind_column,
            pa.schema([*canonical, pa.field(plan.row_kind_column, pa.string())]),
        )
        self._columnar = ColumnarDecoder.for_decoder(
            plan.decoder, canonical, row_kind_column=plan.row_kind_column
        )
        self._dead_letters = DeadLetterWriter(plan.dead_letters) if plan.dead_letters is not None else None

    def batches(self, messages: Iterable[Message]) -> Iterator[pa.RecordBatch]:
        iterator = iter(messages)
        try:
            while block := list(itertools.islice(iterator, BLOCK_SIZE)):
                batch = self._decode_block(block)
                if batch is not None and batch.num_rows:
                    yield batch
        finally:
            if self._dead_letters is not None:
                self._dead_letters.close()

    @property
    def reads_lines(self) -> bool:
        """Whether plain files can skip per-line messages: chunks of lines go to the columnar decoder."""
        return self._columnar is not None

    def file_batches(self, path: str, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """The changes of the lines of a plain file starting in ``[start, end)``, a chunk at a time.

        Line numbers cost a count of the file's newlines before the split: they are counted only once
        something needs them (the ``line`` column, or a chunk decoded line by line).
        """
        assert self._columnar is not None  # noqa: S101 - callers check reads_lines
        line_counter = _LineCounter(path, needed="line" in self.plan.connector_metadata)
        try:
            for position, chunk in read_line_chunks(path, start, end):
                result = self._columnar.decode_lines(chunk)
                if result is not None:
                    if result.rows.num_rows:
                        first_line = line_counter.first_line_of(position, chunk)
                        yield self._arrange_lines(result.rows, result.message_index, path, first_line)
                    else:
                        line_counter.skip(chunk)
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
        finally:
            if self._dead_letters is not None:
                self._dead_letters.close()

    def _arrange_lines(
        self, rows: pa.RecordBatch, origins: pa.Array, path: str, first_line: int
    ) -> pa.RecordBatch:
        names = [*self.plan.decoded_columns.names, self.plan.row_kind_column]
        columns = dict(zip(names, rows.columns, strict=True))
        for key in self.plan.connector_metadata:
            arrow_type = self.target.field(key).type
            if key == "file":
                columns[key] = pa.array([path] * rows.num_rows, type=arrow_type)
            elif key == "line":
                columns[key] = pc.add(origins.cast(pa.int64()), first_line).cast(arrow_type)
            else:
                columns[key] = pa.nulls(rows.num_rows, type=arrow_type)
        return pa.RecordBatch.from_arrays([columns[f.name] for f in self.target], schema=self.target)

    def _decode_block(self, block: Sequence[Message], *, columnar: bool = True) -> pa.RecordBatch | None:
        if columnar and self._columnar is not None:
            # Keys, because a decoder that fills unchanged values keeps its state per Kafka key.
            result = self._columnar.decode([m.value for m in block], [m.key for m in block])
            if result is not None:
                return self._arrange(result.rows, result.message_index, block)
        out = DecodeOutput()
        origins: list[int] = []
        for index, message in enumerate(block):
            before = len(out.changes)
            self.decoder.decode(message, out)
            origins.extend(itertools.repeat(index, len(out.changes) - before))
        for event in out.events:
            log = logger.warning if event.kind == "truncate" else logger.info
            log(
                "%s: %s event not in the changelog (%s)",
                event.message.origin(),
                event.kind,
                self.plan.format_name,
            )
        if out.dead_letters and self._dead_letters is not None:
            self._dead_letters.write(out.dead_letters)
        if not out.changes:
            return None
        return self._arrange(self._changes.build(out.changes), pa.array(origins, type=pa.int32()), block)

    def _arrange(self, rows: pa.RecordBatch, origins: pa.Array, block: Sequence[Message]) -> pa.RecordBatch:
        names = [*self.plan.decoded_columns.names, self.plan.row_kind_column]
        columns = dict(zip(names, rows.columns, strict=True))
        for key in self.plan.connector_metadata:
            arrow_type = self.target.field(key).type
            columns[key] = metadata_array(key, block, arrow_type).take(origins)
        return pa.RecordBatch.from_arrays([columns[f.name] for f in self.target], schema=self.target)


class _LineCounter:
    """The 1-based number of each chunk's first line, counted lazily (0 while nobody needs it)."""

    def __init__(self, path: str, *, needed: bool) -> None:
        self.path = path
        self.needed = needed
        self._next_line: int | None = None

    def first_line_of(self, position: int, chunk: bytes, *, needed: bool = False) -> int:
        if self._next_line is None:
            if not (needed or self.needed):
                return 0
            self._next_line = lines_before(self.path, position) + 1
        first = self._next_line
        self._next_line += chunk.count(b"\n")
        return first

    def skip(self, chunk: bytes) -> None:
        if self._next_line is not None:
            self._next_line += chunk.count(b"\n")
