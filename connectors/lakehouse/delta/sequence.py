"""Sequence values as sortable bytes, so one comparison orders any ``sequence_by`` column.

Integers, floats, dates, timestamps, strings, binaries and arrays of integers (Debezium's
``source.sequence``) all map to bytes whose lexicographic order is the values' order; an array
compares like a tuple. Nulls stay null: the applier dead-letters a change without a sequence, or
(``unsequenced='arrival'``) places it where it arrived, never as late.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.connectors.errors import ConnectorOptionError

_SIGN = np.uint64(1 << 63)


def sortable(values: pa.ChunkedArray | pa.Array, column: str) -> pa.Array:
    """The values of ``column`` as binary keys in the same order; nulls kept."""
    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    kind = array.type
    if pa.types.is_integer(kind) or pa.types.is_temporal(kind) or pa.types.is_boolean(kind):
        return _fixed(_int64(array), array)
    if pa.types.is_floating(kind):
        return _fixed(_float_bits(array), array)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pc.cast(array.cast(pa.large_string()), pa.large_binary())
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return array.cast(pa.large_binary())
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(kind.value_type):
        return _int_lists(array)
    raise ConnectorOptionError(
        f"sequence_by column {column!r} is {kind}; use an integer, floating point, date, timestamp, "
        "string or ARRAY<BIGINT> column"
    )


def _int64(array: pa.Array) -> np.ndarray:
    if pa.types.is_boolean(array.type):
        array = array.cast(pa.int8())
    elif pa.types.is_temporal(array.type):
        array = array.cast(pa.int64()) if not pa.types.is_date32(array.type) else array.cast(pa.int32())
    return np.asarray(array.cast(pa.int64()).fill_null(0), dtype=np.int64)


def _float_bits(array: pa.Array) -> np.ndarray:
    bits = np.asarray(array.cast(pa.float64()).fill_null(0.0), dtype=np.float64).view(np.uint64)
    negative = (bits & _SIGN) != 0
    # IEEE 754 order: flip every bit of negatives, only the sign bit of positives; then undo the
    # sign flip _fixed applies to integers.
    flipped = np.where(negative, ~bits, bits | _SIGN)
    return (flipped ^ _SIGN).view(np.int64)


def _fixed(numbers: np.ndarray, array: pa.Array) -> pa.Array:
    ordered = (numbers.view(np.uint64) ^ _SIGN).astype(">u8")
    data = pa.py_buffer(ordered.tobytes())
    fixed = pa.Array.from_buffers(pa.binary(8), len(array), [None, data])
    result = fixed.cast(pa.large_binary())
    return pc.if_else(pc.is_null(array), pa.scalar(None, pa.large_binary()), result)


def _int_lists(array: pa.Array) -> pa.Array:
    """Each list as the concatenation of its elements' 8-byte keys: the list's offsets times 8."""
    offsets = np.asarray(array.offsets, dtype=np.int64)
    values = array.values.slice(offsets[0], offsets[-1] - offsets[0])
    if pc.any(pc.is_null(array.flatten())).as_py():
        raise ConnectorOptionError("sequence_by arrays must not hold nulls")
    encoded = (
        np.asarray(values.cast(pa.int64()).fill_null(0), dtype=np.int64).view(np.uint64) ^ _SIGN
    ).astype(">u8")
    data = pa.py_buffer(encoded.tobytes())
    keys = pa.Array.from_buffers(
        pa.large_binary(), len(array), [None, pa.py_buffer((offsets - offsets[0]) * 8), data]
    )
    return pc.if_else(pc.is_null(array), pa.scalar(None, pa.large_binary()), keys)
