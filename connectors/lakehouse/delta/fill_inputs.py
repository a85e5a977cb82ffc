"""What a fill of unavailable columns reads: its inputs, and the changes of the keys involved, in order."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa

from cdcflow.connectors.lakehouse.delta.batch import EPOCH, IDX, INTERNAL, SEQ, ChangeBatch, sequence_order
from cdcflow.connectors.lakehouse.delta.key_links import Key, canonical, parse
from cdcflow.connectors.lakehouse.delta.schema import to_delta_columns
from cdcflow.connectors.lakehouse.delta.unavailable import Links

Lookup = Callable[[pa.Table], pa.Table | None]
"""The rows (of the target, or of the key state) of the keys in a table of key columns."""


@dataclass(frozen=True)
class FillInputs:
    """The batch, its key and links, where earlier values are looked up, and the order the batch
    applies in.

    ``late``: the changes older than their key's applied sequence (never a previous value); ``again``:
    the changes at their key's applied sequence, applied changes a source sent again (they link no key
    change a second time); ``epoch``: the restarts of each key's log position (see ``restarts``);
    ``truncated``: the batch empties the table, and with it the new keys the state's claims wait for.
    """

    source: ChangeBatch
    """The batch as the applier has it; :attr:`batch` is it in Delta's types."""
    key: Sequence[str]
    links: Links
    target_rows: Lookup
    state_rows: Lookup
    now: datetime
    late: np.ndarray | None = None
    again: np.ndarray | None = None
    epoch: np.ndarray | None = None
    truncated: bool = False

    @cached_property
    def batch(self) -> ChangeBatch:
        """The batch in Delta's types (values read back from the target and the state are in those)."""
        data = self.source.data
        internal = [c for c in data.schema.names if c.startswith(INTERNAL)]
        converted = to_delta_columns(data.drop_columns(internal))
        for name in internal:
            converted = converted.append_column(data.schema.field(name), data.column(name))
        return dataclasses.replace(self.source, data=converted)

    @cached_property
    def key_types(self) -> list[pa.DataType]:
        return [self.batch.data.schema.field(c).type for c in self.key]

    @cached_property
    def columns(self) -> list[str]:
        """The data columns (not the applier's own ``_cdcflow_*``)."""
        return [c for c in self.batch.data.schema.names if not c.startswith(INTERNAL)]

    def aside_values(self, name: str | None, at: np.ndarray) -> list[Any]:
        """The values of the batch's column ``name`` kept aside (see ``ChangeBatch.extra``) at ``at``."""
        if name is None or name not in self.batch.extra.schema.names:
            return [None] * len(at)
        values: list[Any] = self.batch.extra.column(name).take(pa.array(at)).to_pylist()
        return values

    def parse(self, texts: list[Any]) -> list[Key | None]:
        """Key links as key tuples of the batch's key types."""
        return parse(texts, self.key, self.key_types, self.batch.batch_id)

    def unlinked(self, keys: list[Key | None], at: np.ndarray) -> list[Key | None]:
        """``keys`` (links of the changes at ``at``) without those of changes sent again."""
        if self.again is None:
            return keys
        return [None if self.again[i] else k for k, i in zip(keys, at.tolist(), strict=True)]

    def keys_table(self, keys: Sequence[Key]) -> pa.Table:
        return pa.table(
            {c: pa.array([k[i] for k in keys], self.key_types[i]) for i, c in enumerate(self.key)}
        )

    def positions(self, keys: set[Key]) -> np.ndarray:
        """The arrival positions of the changes of ``keys``, ascending."""
        data = self.batch.data
        probe = data.select(self.key).append_column("_cdcflow_pos", data.column(IDX))
        wanted = self.keys_table(sorted(keys, key=canonical))
        hits = probe.join(wanted, self.key, join_type="inner", use_threads=False)
        return np.sort(np.asarray(hits.column("_cdcflow_pos"), dtype=np.int64))


@dataclass(frozen=True)
class Changes:
    """The changes of the keys involved, in the order last-wins applies them: ``local`` indexes these
    lists, ``positions[local]`` is the change's arrival position in the batch."""

    rows: list[dict[str, Any]]
    """The data columns of each change (the walk sets the values it fills in)."""
    positions: list[int]
    kinds: list[str]
    unavailable: list[Any]
    """The columns each change lacks (None: none)."""
    olds: list[Key | None]
    """The old key a create links (a primary-key change), else None."""
    news: list[Key | None]
    """The new key a delete links (a primary-key change), else None."""
    sequences: list[Any] | None
    groups: dict[Key, list[int]]
    """Per key, its changes (``local``) in order."""


def involved_changes(inputs: FillInputs, flagged: np.ndarray) -> Changes:
    """The changes of the keys ``flagged`` changes have or link (a create: its old key), late ones left
    out (a late change is not applied: it gives no value to another)."""
    batch, key = inputs.batch, inputs.key
    flagged_at = np.flatnonzero(flagged)
    flagged_keys = batch.data.select(key).take(pa.array(flagged_at)).to_pylist()
    olds = inputs.unlinked(inputs.parse(inputs.aside_values(inputs.links.old_key, flagged_at)), flagged_at)
    creating = batch.kinds[flagged_at] != "-D"
    involved = {tuple(r[c] for c in key) for r in flagged_keys}
    involved |= {o for o, c in zip(olds, creating, strict=True) if o is not None and c}
    positions = inputs.positions(involved)
    if inputs.late is not None:
        positions = positions[~inputs.late[positions]]
    # Rank in the order last-wins applies (epoch, sequence, then arrival) and walk each key's changes.
    order = None
    if SEQ in batch.data.schema.names:
        ranked = batch.data
        if inputs.epoch is not None:
            ranked = ranked.append_column(EPOCH, pa.array(inputs.epoch))
        order = np.asarray(sequence_order(ranked), dtype=np.int64)
    rank = np.empty(batch.num_rows, dtype=np.int64)
    rank[order if order is not None else np.arange(batch.num_rows)] = np.arange(batch.num_rows)
    positions = positions[np.argsort(rank[positions], kind="stable")]
    take = pa.array(positions)
    rows = batch.data.select(inputs.columns).take(take).to_pylist()
    kinds = batch.kinds[positions].tolist()
    unavailable = inputs.aside_values(inputs.links.unavailable, positions)
    olds = inputs.unlinked(inputs.parse(inputs.aside_values(inputs.links.old_key, positions)), positions)
    news = inputs.unlinked(inputs.parse(inputs.aside_values(inputs.links.new_key, positions)), positions)
    sequences = batch.data.column(SEQ).take(take).to_pylist() if SEQ in batch.data.schema.names else None
    groups: dict[Key, list[int]] = {}
    for local, row in enumerate(rows):
        groups.setdefault(tuple(row[c] for c in key), []).append(local)
    return Changes(rows, positions.tolist(), kinds, unavailable, olds, news, sequences, groups)
