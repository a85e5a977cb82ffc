"""What a fill of unavailable columns decides, and the :class:`Filled` batch made of it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from cdcflow.connectors.lakehouse.delta.batch import ChangeBatch
from cdcflow.connectors.lakehouse.delta.key_links import Key
from cdcflow.connectors.lakehouse.delta.merge import OP

KEPT_COLUMNS = "_cdcflow_unavailable"
"""The merge source's ``list<string>`` column: the columns of a row that keep the target's value."""


@dataclass
class Filled:
    """A batch with the values its changes lacked filled in where the batch or the state had them."""

    batch: ChangeBatch
    pending: pa.Array | None = None
    """Per change: the columns the target row must give (null when none); None when no change has any."""
    unfilled: dict[int, list[str]] = field(default_factory=dict)
    """Per change: the columns with no previous value at all (they land NULL)."""
    state: pa.Table | None = None
    """Carry and claim slots to write to the key state (``_cdcflow_op`` U or D)."""
    patches: pa.Table | None = None
    """Rows of the target to update (``_cdcflow_op`` U) with an old key's last values: the new keys of
    claims whose old key's delete came in this batch and that have no change in it; ``_cdcflow_unavailable``
    (:data:`KEPT_COLUMNS`) names the columns each keeps."""


@dataclass
class Fills:
    """The walk's decisions: per change (``local``, see ``fill.Changes``) or per key."""

    changed: dict[str, dict[int, Any]] = field(default_factory=dict)
    """Per column: the values filled in, by arrival position."""
    pending: dict[int, list[str]] = field(default_factory=dict)
    """Per change: the columns its target row must give."""
    unfilled: dict[int, list[str]] = field(default_factory=dict)
    """Per change: the columns nothing has a value for (they land NULL)."""
    slot_rows: list[dict[str, Any]] = field(default_factory=list)
    """Carry and claim slots to write to the key state."""
    carries: dict[Key, dict[str, Any]] = field(default_factory=dict)
    """The carries written in this batch, by new key (rows of ``slot_rows``)."""
    patches: dict[Key, dict[str, Any]] = field(default_factory=dict)
    """Per key the batch does not change: the values its target row takes."""


def filled(
    batch: ChangeBatch,
    key: Sequence[str],
    columns: Sequence[str],
    positions: Sequence[int],
    fills: Fills,
    state: pa.Table | None,
) -> Filled:
    """``batch`` with ``fills``' values; ``positions`` gives each change's (``local``) arrival position,
    ``state`` the slot rows as a table."""
    data = batch.data
    n = data.num_rows
    for column, values in fills.changed.items():
        at = np.fromiter(values.keys(), dtype=np.int64, count=len(values))
        index = np.arange(n, dtype=np.int64)
        index[at] = n + np.arange(len(at), dtype=np.int64)
        original = data.column(column)
        merged = pa.concat_arrays(
            [original.combine_chunks(), pa.array(list(values.values()), original.type)]
        ).take(pa.array(index))
        data = data.set_column(data.schema.get_field_index(column), data.schema.field(column), merged)
    pending = None
    if fills.pending:
        marks: list[list[str] | None] = [None] * n
        for local, kept in fills.pending.items():
            marks[positions[local]] = kept
        pending = pa.array(marks, pa.list_(pa.string()))
    unfilled = {positions[local]: lacking for local, lacking in fills.unfilled.items()}
    patches = _patch_table(batch.data.schema, key, columns, fills.patches)
    return Filled(dataclasses.replace(batch, data=data), pending, unfilled, state, patches)


def _patch_table(
    schema: pa.Schema, key: Sequence[str], columns: Sequence[str], patches: dict[Key, dict[str, Any]]
) -> pa.Table | None:
    if not patches:
        return None
    fields = [
        *(schema.field(c) for c in columns),
        pa.field(KEPT_COLUMNS, pa.list_(pa.string())),
        pa.field(OP, pa.string()),
    ]
    rows = [
        {
            **dict(zip(key, k, strict=True)),
            **values,
            KEPT_COLUMNS: [c for c in columns if c not in values and c not in key],
            OP: "U",
        }
        for k, values in patches.items()
        if values
    ]
    if not rows:
        return None
    return pa.Table.from_pylist(rows, schema=pa.schema(fields))
