"""One micro-batch of a changelog as Arrow columns: checked, numbered, sequenced, reduced per key."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.connectors.errors import ChangelogConsistencyError
from cdcflow.connectors.lakehouse.delta.merge import OP
from cdcflow.connectors.lakehouse.delta.sequence import sortable
from cdcflow.formats.base import METADATA_MARK

ROW_KINDS = ("+I", "-U", "+U", "-D")
INTERNAL = "_cdcflow_"
"""The prefix of the columns the applier adds to a batch (never written to the table)."""
IDX, SEQ = "_cdcflow_idx", "_cdcflow_seq"
EPOCH = "_cdcflow_epoch"
"""Optional: how many restarts of the log position precede a change of its key (see ``sequence_order``)."""
ORDER = "_cdcflow_order"
"""Optional: the sequence a change sorts by when it has none of its own (see ``arrival_order``)."""
_COORDINATES = (("topic", "partition", "offset"), ("file", "line"))
_SPARK_FIELD_METADATA = b"SPARK::metadata::json"
"""Where pyspark's ``toArrow`` keeps a Spark field's metadata (JSON) in the Arrow field's metadata."""


@dataclass(frozen=True)
class ChangeBatch:
    """The changes of one batch: data columns plus ``_cdcflow_idx`` (arrival), ``_cdcflow_seq``, kinds."""

    data: pa.Table
    kinds: np.ndarray
    origin: pa.Table
    batch_id: int
    restart: pa.Array | None = None
    """``restart_by`` as sortable bytes, one per arrival position (None without restart_by)."""
    extra: pa.Table = field(default_factory=lambda: pa.table({}))
    """Per-change columns kept out of the table that the applier reads (unavailable columns, PK links)."""
    event_columns: tuple[str, ...] = ()
    """Data columns that describe the change, not the row: the metadata columns a source marked (where
    and when the change happened, its envelope) and the ``sequence_by`` / ``restart_by`` columns. A
    retraction's values in them are its own, never the added row's, so they never decide a match."""

    @property
    def num_rows(self) -> int:
        return int(self.data.num_rows)

    def where(self, index: int) -> str:
        """Where row ``index`` came from (topic/partition@offset or file:line when the batch has them)."""
        return describe(self.origin, index, index, self.batch_id)

    def keep(self, mask: np.ndarray) -> ChangeBatch:
        """The changes where ``mask`` is true, renumbered (``_cdcflow_idx`` stays the position)."""
        take = pa.array(np.flatnonzero(mask))
        data = self.data.take(take)
        data = data.set_column(
            data.schema.get_field_index(IDX), IDX, pa.array(np.arange(data.num_rows, dtype=np.int64))
        )
        return ChangeBatch(
            data,
            self.kinds[np.asarray(mask, dtype=bool)],
            self.origin.take(take),
            self.batch_id,
            self.restart.take(take) if self.restart is not None else None,
            self.extra.take(take),
            self.event_columns,
        )


def coordinates(table: pa.Table) -> pa.Table:
    """The columns of ``table`` that say where a row came from."""
    names = {c for group in _COORDINATES for c in group}
    return table.select([n for n in table.schema.names if n in names])


def describe(origin: pa.Table, index: int, arrival: int, batch_id: int) -> str:
    """Row ``index`` of ``origin`` as topic/partition@offset or file:line, else its arrival position."""
    for names in _COORDINATES:
        if all(name in origin.schema.names for name in names):
            values = [origin.column(name)[index].as_py() for name in names]
            return f"{values[0]}/{values[1]}@{values[2]}" if len(values) == 3 else f"{values[0]}:{values[1]}"
    return f"row {arrival} of batch {batch_id}"


def prepare(
    table: pa.Table,
    batch_id: int,
    key: Sequence[str],
    row_kind_column: str,
    sequence_by: str | None,
    exclude: Sequence[str],
    restart_by: str | None = None,
    extra: Sequence[str] = (),
) -> ChangeBatch:
    """``table``'s changes, checked; ``extra`` names columns kept aside (see ``ChangeBatch.extra``)."""
    names = table.schema.names
    ordering = [c for c in (sequence_by, restart_by) if c]
    for column in (*key, row_kind_column, *ordering):
        if column not in names:
            raise ChangelogConsistencyError(
                f"batch {batch_id} has no column {column!r} (columns: {', '.join(names)}); the key, the "
                "row kind column, sequence_by and restart_by must name columns of the changelog"
            )
    kinds = np.asarray(table.column(row_kind_column).to_numpy(zero_copy_only=False), dtype=object)
    bad = ~np.isin(kinds, ROW_KINDS)
    origin = coordinates(table)
    batch = ChangeBatch(table, kinds, origin, batch_id)
    if bad.any():
        at = int(np.argmax(bad))
        raise ChangelogConsistencyError(
            f"{batch.where(at)}: row kind {kinds[at]!r} is not one of {', '.join(ROW_KINDS)}"
        )
    for column in key:
        nulls = table.column(column).is_null()
        if pc.any(nulls).as_py():
            at = int(np.argmax(np.asarray(nulls)))
            raise ChangelogConsistencyError(
                f"{batch.where(at)}: key column {column!r} is null; a Delta table keyed by "
                f"{', '.join(key)} cannot hold it (fix the key, or filter such rows into a dead-letter table)"
            )
    aside = [c for c in extra if c in names]
    data = table.drop_columns([c for c in {row_kind_column, *exclude, *aside} if c in names and c not in key])
    events = tuple(c for c in (*marked_columns(data.schema), *ordering) if c in data.schema.names)
    # Spark's field metadata (the marks) stays out of the key state's schema.
    data = pa.Table.from_arrays(data.columns, schema=pa.schema([f.remove_metadata() for f in data.schema]))
    data = data.append_column(IDX, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    if sequence_by:
        data = data.append_column(SEQ, sortable(table.column(sequence_by), sequence_by))
    restart = sortable(table.column(restart_by), restart_by) if sequence_by and restart_by else None
    return ChangeBatch(
        data, kinds, origin, batch_id, restart, table.select(aside), tuple(dict.fromkeys(events))
    )


def marked_columns(schema: pa.Schema) -> list[str]:
    """The columns a cdcflow source marked as metadata (:data:`cdcflow.formats.base.METADATA_MARK`)."""
    marked = []
    for column in schema:
        spark = (column.metadata or {}).get(_SPARK_FIELD_METADATA)
        try:
            if spark is not None and METADATA_MARK in json.loads(spark):
                marked.append(column.name)
        except (ValueError, TypeError):  # not Spark's JSON object: not marked
            continue
    return marked


def arrival_order(batch: ChangeBatch, key: Sequence[str]) -> ChangeBatch:
    """``batch`` with a change without a sequence sorted by the highest sequence of its key's changes
    that arrived before it in the batch (``_cdcflow_order``), so that it applies after them; one with
    none before it sorts first. Its own sequence stays null: it is never late."""
    from cdcflow.connectors.lakehouse.delta.key_index import group_ids

    seq = batch.data.column(SEQ).combine_chunks()
    missing = np.asarray(pc.is_null(seq), dtype=bool)
    if missing.all() or not missing.any():
        return batch
    kid = group_ids(batch.data, key)
    mixed = np.intersect1d(kid[missing], kid[~missing])
    values = seq.to_pylist()
    highest: dict[int, bytes] = {}
    for at in np.flatnonzero(np.isin(kid, mixed)).tolist():  # rows are in arrival order
        k, value = int(kid[at]), values[at]
        if value is None:
            values[at] = highest.get(k)
        elif k not in highest or value > highest[k]:
            highest[k] = value
    return dataclasses.replace(
        batch, data=batch.data.append_column(ORDER, pa.array(values, pa.large_binary()))
    )


def check_update_pairs(batch: ChangeBatch, key: Sequence[str]) -> None:
    """Each -U is directly followed by the +U of the same key (what an ordered upsert changelog is)."""
    before = np.flatnonzero(batch.kinds == "-U")
    if len(before) == 0:
        return
    n = batch.num_rows
    following = before + 1
    ok = following < n
    ok[ok] &= batch.kinds[following[ok]] == "+U"
    for column in key:
        values = batch.data.column(column)
        valid = np.flatnonzero(ok)
        if len(valid):
            same = pc.equal(values.take(before[valid]), values.take(following[valid]))
            ok[valid] &= np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)
    if not ok.all():
        at = int(before[np.argmax(~ok)])
        raise ChangelogConsistencyError(
            f"{batch.where(at)}: a -U is not followed by the +U of the same key, so the changelog is not "
            "ordered per primary key (a shuffle or a join reordered it); apply it with materialize='force', "
            "which keeps the live rows per key in state"
        )


def last_per_key(batch: ChangeBatch, key: Sequence[str]) -> pa.Table:
    """The last +I/+U/-D of each key (by sequence, then arrival), with ``_cdcflow_op`` U (upsert) or D."""
    from cdcflow.connectors.lakehouse.delta.key_index import group_ids

    names = batch.data.schema.names
    keep = np.flatnonzero(batch.kinds != "-U")
    # Ordered on the key and ordering columns; the whole rows are taken once, for the winners.
    narrow = batch.data.select([*key, *(c for c in (SEQ, ORDER, IDX, EPOCH) if c in names)]).take(
        pa.array(keep)
    )
    if SEQ in names:
        order = np.asarray(sequence_order(narrow), dtype=np.int64)
        narrow, keep = narrow.take(pa.array(order)), keep[order]
    ids = group_ids(narrow, key)
    _, from_end = np.unique(ids[::-1], return_index=True)
    picked = keep[np.sort(len(ids) - 1 - from_end)]
    rows = batch.data.take(pa.array(picked))
    return rows.append_column(OP, pa.array(np.where(batch.kinds[picked] == "-D", "D", "U")))


def sequence_order(rows: pa.Table) -> pa.Array:
    """Row positions by epoch (restarts of the key's log position, when known), sequence, then arrival;
    a change without a sequence sorts first in its epoch (unless ``arrival_order`` placed it)."""
    ordered = rows.column(ORDER if ORDER in rows.schema.names else SEQ)
    keys = pa.table({"seq": pc.fill_null(ordered, b""), "idx": rows.column(IDX)})
    order = [("seq", "ascending"), ("idx", "ascending")]
    if EPOCH in rows.schema.names:
        keys = keys.append_column("epoch", rows.column(EPOCH))
        order.insert(0, ("epoch", "ascending"))
    return pc.sort_indices(keys, order)
