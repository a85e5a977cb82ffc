"""Debezium JSON straight to Arrow: a block of envelopes → one record batch of changelog rows.

The hot path of the ``cdc-debezium`` sources. Arrow's JSON reader parses the whole block against an
explicit ``{op, before, after}`` schema, numpy builds the changelog's take indices (``c``/``r`` → +I,
``u`` → -U +U, ``d`` → -D) and each column is converted vectorised. No per-message Python objects.

The result is exactly what :class:`~cdcflow.formats.debezium_json.DebeziumJsonDecoder` gives message
by message, or None: whatever the per-record decoder would treat differently from plain data (a parse
error, a control event, an unchanged-TOAST placeholder, a NULL in a NOT NULL column, an update
without its before image, JSON that Arrow's reader accepts but the per-record parser refuses) sends
the whole block back to the per-record path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from cdcflow.connectors.columnar_block import Block, Positions
from cdcflow.connectors.columnar_types import ColumnPlan, plan_column
from cdcflow.formats.base import Decoder
from cdcflow.formats.debezium import DebeziumMode, UnavailableHandling
from cdcflow.formats.debezium_json import DebeziumJsonDecoder

_OPS = pa.array(["c", "r", "u", "d"])
_UPDATE, _DELETE = 2, 3
_KINDS = pa.array(["+I", "-U", "+U", "-D"])
#: The first row kind of each op code (its index in _OPS); an update adds +U after its -U.
_FIRST_KIND = np.array([0, 0, 1, 3], dtype=np.int8)


@dataclass(frozen=True)
class ColumnarBatch:
    """The changelog of a block: ``rows`` has the physical columns then the row kind (``+I`` ...);
    ``message_index[i]`` is the index, in the decoded block, of the message row ``i`` came from;
    ``changed`` is how many messages gave rows (every one that is not a tombstone or blank)."""

    rows: pa.RecordBatch
    message_index: pa.Array
    changed: int


class ColumnarDecoder:
    """Decodes blocks of Debezium JSON envelopes (no schema block) into changelog record batches.

    Build it with :meth:`for_decoder`; it pickles to its plan, for Spark's executors.
    """

    def __init__(
        self, columns: tuple[ColumnPlan, ...], physical: pa.Schema, row_kind_column: str, keyed_state: bool
    ) -> None:
        self.columns = columns
        self.physical = physical
        self.row_kind_column = row_kind_column
        self.keyed_state = keyed_state
        self._output = pa.schema([*physical, pa.field(row_kind_column, pa.string(), nullable=False)])
        image = pa.struct([pa.field(c.name, c.parsed_as) for c in columns])
        self._parse_options = pa_json.ParseOptions(
            explicit_schema=pa.schema([("op", pa.string()), ("before", image), ("after", image)]),
            unexpected_field_behavior="ignore",
            newlines_in_values=True,
        )

    def __reduce__(self) -> tuple[type[ColumnarDecoder], tuple[object, ...]]:
        return type(self), (self.columns, self.physical, self.row_kind_column, self.keyed_state)

    @classmethod
    def for_decoder(
        cls, decoder: Decoder, physical: pa.Schema, *, row_kind_column: str = "_row_kind"
    ) -> ColumnarDecoder | None:
        """The columnar twin of ``decoder`` producing ``physical`` (Spark's Arrow schema of the declared
        columns), or None when its configuration has no columnar path: not ``debezium-json``, the
        schema-include form, upsert mode, metadata columns, key columns that index the TOAST-filling
        state, or a column type this path does not read (DECIMAL, BINARY, nested types)."""
        if not isinstance(decoder, DebeziumJsonDecoder):
            return None
        config = decoder.config
        if config.schema is None or config.schema_include or config.metadata:
            return None
        if config.mode is not DebeziumMode.RETRACT:
            return None
        fill = config.unavailable is UnavailableHandling.FILL
        if fill and config.key_columns:
            return None
        if len(physical) != len(config.schema):
            return None
        plans = [plan_column(column, field) for column, field in zip(config.schema, physical, strict=True)]
        if any(plan is None for plan in plans):
            return None
        columns = tuple(plan for plan in plans if plan is not None)
        return cls(columns, physical, row_kind_column, keyed_state=fill)

    def decode(
        self, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None
    ) -> ColumnarBatch | None:
        """The changelog of ``values`` (message values; None or blank is a tombstone, giving no row), or
        None when the block must be decoded message by message.

        Pass the messages' Kafka ``keys`` when they have any: with ``unavailable-values=fill`` the
        per-record decoder keeps each key's last image to fill unchanged TOAST values from, so a block
        with keys goes through it to keep that state whole.
        """
        if self.keyed_state and keys is not None and any(key is not None for key in keys):
            return None
        return self._decode(Block.of_values(values))

    def decode_array(self, values: pa.Array, keys: pa.Array | None = None) -> ColumnarBatch | None:
        """:meth:`decode` of message values and keys as Arrow arrays (binary, null for a tombstone)."""
        if self.keyed_state and keys is not None and keys.null_count < len(keys):
            return None
        if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
            return self._decode(Block.of_values(values.to_pylist()))
        return self._decode(Block.of_array(values))

    def decode_lines(self, block: bytes) -> ColumnarBatch | None:
        """:meth:`decode` of the lines of ``block`` (a chunk of a file of messages, one per line, as the
        file reader splits it: no line break, blank lines skipped); ``message_index`` counts lines."""
        return self._decode(Block.of_lines(block))

    def _decode(self, block: Block | None) -> ColumnarBatch | None:
        if block is None or not block.is_strict_json():
            return None
        if len(block.positions) == 0:
            return ColumnarBatch(_empty(self._output), pa.array([], pa.int64()), 0)
        try:
            table = pa_json.read_json(
                pa.py_buffer(block.data),
                read_options=pa_json.ReadOptions(use_threads=False, block_size=len(block.data) + 1),
                parse_options=self._parse_options,
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if table.num_rows != len(block.positions):
            return None  # some value held more than one JSON document
        return self._changelog(table.combine_chunks().to_batches()[0], block.positions)

    def _changelog(self, parsed: pa.RecordBatch, positions: Positions) -> ColumnarBatch | None:
        codes_array = pc.index_in(parsed.column(0), value_set=_OPS)
        if codes_array.null_count:
            return None  # a control event (t, m), an unknown or missing op
        codes = codes_array.to_numpy()
        before, after = parsed.column(1), parsed.column(2)
        needs_before = codes >= _UPDATE
        if not _valid_where(after, codes != _DELETE) or not _valid_where(before, needs_before):
            return None  # an image the operation needs is null (e.g. REPLICA IDENTITY DEFAULT)
        message, kinds = _expand(codes)
        from_before = (kinds & 1).astype(np.int64)  # -U and -D are the odd kinds
        take = pa.array(message + len(codes) * from_before)  # the before images follow the after ones
        arrays = []
        for index, plan in enumerate(self.columns):
            images = [_column(image, index, plan) for image in (after, before)]
            if images[0] is None or images[1] is None:
                return None
            arrays.append(pa.concat_arrays(images).take(take))
        arrays.append(_KINDS.take(pa.array(kinds)))
        rows = pa.RecordBatch.from_arrays(arrays, schema=self._output)
        return ColumnarBatch(rows, pa.array(positions[message]), len(codes))


def _expand(codes: npt.NDArray[np.int8]) -> tuple[Positions, npt.NDArray[np.int8]]:
    """For each changelog row: the message it comes from and its kind (an index in _KINDS)."""
    rows_per_message = 1 + (codes == _UPDATE)
    message = np.repeat(np.arange(len(codes)), rows_per_message)
    kinds = np.repeat(_FIRST_KIND[codes], rows_per_message)
    first_row = np.cumsum(rows_per_message) - rows_per_message
    kinds[first_row[codes == _UPDATE] + 1] = 2
    return message, kinds


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def _valid_where(image: pa.StructArray, needed: npt.NDArray[np.bool_]) -> bool:
    if image.null_count == 0:
        return True
    valid = image.is_valid().to_numpy(zero_copy_only=False)
    return bool(np.all(valid | ~needed))


def _column(image: pa.StructArray, index: int, plan: ColumnPlan) -> pa.Array | None:
    """One column of every image (those the changelog does not use are checked too, as per record)."""
    parsed = image.field(index)
    if (
        not plan.nullable
        and parsed.null_count
        and pc.any(pc.and_(parsed.is_null(), image.is_valid())).as_py()
    ):
        return None  # a NULL in a NOT NULL column of an image that is there
    return plan.convert(parsed)
