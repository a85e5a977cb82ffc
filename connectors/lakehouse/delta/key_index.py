"""Rows matched by key: within a batch (which rows share a key) and against the key state.

A single key column is matched with a hash lookup (``dictionary_encode``, ``index_in``); a composite
key with one Arrow join. Keys are never null here (:func:`.batch.prepare` refuses null keys).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_POS, _FOUND, _KID = "_cdcflow_pos", "_cdcflow_found", "_cdcflow_kid"


def group_ids(rows: pa.Table, key: Sequence[str]) -> np.ndarray:
    """Per row of ``rows``, a dense id of its key: rows with equal keys have equal ids."""
    if len(key) == 1:
        try:
            encoded = rows.column(key[0]).combine_chunks().dictionary_encode()
            return np.asarray(encoded.indices, dtype=np.int64)
        except pa.ArrowNotImplementedError:
            pass
    keys = list(key)
    ids = rows.select(keys).group_by(keys, use_threads=False).aggregate([])
    ids = ids.append_column(_KID, pa.array(np.arange(ids.num_rows, dtype=np.int64)))
    return _matched(rows, ids, keys, _KID)


def positions_in(rows: pa.Table, known: pa.Table, key: Sequence[str]) -> np.ndarray:
    """Per row of ``rows``, the position of the row of ``known`` (at most one per key) with its key,
    or -1. ``known``'s key columns are cast to ``rows``' types (the state table reads strings as views)."""
    if known.num_rows == 0:
        return np.full(rows.num_rows, -1, dtype=np.int64)
    keys = list(key)
    cast = {c: known.column(c).cast(rows.schema.field(c).type) for c in keys}
    if len(keys) == 1:
        try:
            values = rows.column(keys[0]).combine_chunks()
            found = pc.index_in(values, value_set=cast[keys[0]].combine_chunks())
            return np.asarray(found.fill_null(-1), dtype=np.int64)
        except pa.ArrowNotImplementedError:
            pass
    table = pa.table({**cast, _FOUND: pa.array(np.arange(known.num_rows, dtype=np.int64))})
    return _matched(rows, table, keys, _FOUND)


def take_or_null(column: pa.ChunkedArray | pa.Array, positions: np.ndarray) -> pa.Array:
    """``column``'s values at ``positions``; null where a position is -1."""
    indices = pa.array(positions, mask=positions < 0)
    values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return values.take(indices)


def _matched(rows: pa.Table, table: pa.Table, keys: list[str], column: str) -> np.ndarray:
    probe = rows.select(keys).append_column(_POS, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    joined = probe.join(table, keys, join_type="left outer", use_threads=False)
    out = np.full(rows.num_rows, -1, dtype=np.int64)
    found = np.asarray(joined.column(column).fill_null(-1), dtype=np.int64)
    out[np.asarray(joined.column(_POS), dtype=np.int64)] = found
    return out
