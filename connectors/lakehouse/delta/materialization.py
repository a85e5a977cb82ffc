"""Upsert materialization (spec 002), row by row: the live rows per key, kept in the key state, so that
retractions that arrive after their additions, or a changelog keyed differently from the table, still
leave the right row."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.connectors.lakehouse.delta import key_state, sequencing
from cdcflow.connectors.lakehouse.delta.batch import EPOCH, IDX, ORDER, SEQ, ChangeBatch, sequence_order
from cdcflow.connectors.lakehouse.delta.key_state import (
    DELETED_AT,
    SLOT,
    STATE_RESTART,
    STATE_SEQ,
    UPDATED_AT,
)
from cdcflow.connectors.lakehouse.delta.merge import OP
from cdcflow.connectors.lakehouse.delta.options import ApplyOptions
from cdcflow.connectors.lakehouse.delta.result import BatchApplied
from cdcflow.connectors.lakehouse.delta.sequencing import report_restarts
from cdcflow.core import Change, RowKind
from cdcflow.core.materialize import UpsertMaterializer

log = logging.getLogger(__name__)

Key = tuple[Any, ...]


def materialize(
    batch: ChangeBatch,
    known: pa.Table | None,
    epochs: sequencing.Epochs,
    options: ApplyOptions,
    now: datetime,
    result: BatchApplied,
) -> tuple[pa.Table, pa.Table]:
    """The batch's live rows per key and their key state rows, given ``known`` (the state rows of its
    keys) and ``epochs`` (computed against ``known``'s sequences)."""
    key = list(options.key)
    data_columns = [n for n in batch.data.schema.names if n not in (IDX, SEQ, ORDER)]
    if known is not None:  # primary-key carries (slots below -1) are not live rows
        known = known.filter(pc.greater_equal(known.column(SLOT), -1))
    live: dict[Key, list[tuple[int, dict[str, Any]]]] = {}
    sequences: dict[Key, bytes | None] = {}
    restart_values: dict[Key, bytes | None] = {}
    slots_before: dict[Key, set[int]] = {}
    for row in known.to_pylist() if known is not None else []:
        k = tuple(row[c] for c in key)
        slots_before.setdefault(k, set()).add(row[SLOT])
        if row[SLOT] == -1:
            sequences[k] = row[STATE_SEQ]
            restart_values[k] = row.get(STATE_RESTART)
        else:
            live.setdefault(k, []).append((row[SLOT], {c: row.get(c) for c in data_columns}))
    ordered = {k: [r for _, r in sorted(slots, key=lambda p: p[0])] for k, slots in live.items()}
    materializer = UpsertMaterializer(
        options.upsert_key or None,
        compare_columns=[c for c in data_columns if c not in batch.event_columns],
        on_unmatched=lambda change: log.warning(
            "batch %d: retraction %s matched no live row of its key (its values differ from the row "
            "added, or the state expired, or it was never added): it retracts the key's oldest live "
            "row, or deletes the key's row when none is live",
            batch.batch_id,
            change,
        ),
        retract_unmatched=True,
    )
    order = np.arange(batch.num_rows)
    report_restarts(batch, epochs, options, result)
    if SEQ in batch.data.schema.names:
        order = np.asarray(
            sequence_order(batch.data.append_column(EPOCH, pa.array(epochs.epoch)))
            if epochs.any()
            else sequence_order(batch.data)
        )
    rows = batch.data.to_pylist()
    restart_of = batch.restart.to_pylist() if batch.restart is not None else [None] * batch.num_rows
    epoch_seen: dict[Key, int] = {}
    outcome: dict[Key, tuple[str, dict[str, Any]]] = {}
    touched: dict[Key, None] = {}
    for index in order:
        row = rows[index]
        k = tuple(row[c] for c in key)
        seq = row.get(SEQ)
        if epochs.epoch[index] > epoch_seen.get(k, 0):
            # The key's log position restarted: this epoch's sequences start afresh.
            epoch_seen[k], sequences[k] = int(epochs.epoch[index]), None
        if seq is not None and sequences.get(k) is not None and seq < sequences[k]:
            result.late += 1
            continue
        if seq is not None:
            sequences[k], restart_values[k] = seq, restart_of[index]
        touched[k] = None
        change = Change(RowKind.from_short_string(batch.kinds[index]), {c: row[c] for c in data_columns})
        ordered[k], emitted = materializer.apply(ordered.get(k, []), change)
        if emitted is not None:
            outcome[k] = (
                "D" if emitted.kind is RowKind.DELETE else "U",
                {**emitted.row, IDX: int(index), SEQ: seq},
            )
    result.unmatched_retractions = materializer.unmatched
    schema = batch.data.schema
    winners = pa.Table.from_pylist(
        [{**row, OP: op} for op, row in outcome.values()],
        schema=schema.append(pa.field(OP, pa.string())),
    ).take(pa.array(np.argsort([row[IDX] for _, row in outcome.values()], kind="stable").astype(np.int64)))
    state_rows = _state_rows(
        touched, ordered, sequences, slots_before, schema, data_columns, now, restart_values, options
    )
    return winners, state_rows


def _state_rows(
    touched: dict[Key, None],
    ordered: dict[Key, list[dict[str, Any]]],
    sequences: dict[Key, bytes | None],
    slots_before: dict[Key, set[int]],
    schema: pa.Schema,
    data_columns: list[str],
    now: datetime,
    restart_values: dict[Key, bytes | None],
    options: ApplyOptions,
) -> pa.Table:
    """The key state rows of the ``touched`` keys: their live rows (slots 0, 1, ...), their sequence
    (slot -1), and removals of the slots they no longer fill."""
    key = list(options.key)
    restart_by = options.restart_by is not None
    out: list[dict[str, Any]] = []
    for k in touched:
        rows = ordered.get(k, [])
        marker = dict(zip(key, k, strict=True))
        kept: set[int] = set()
        for slot, row in enumerate(rows):
            out.append(
                {
                    **row,
                    SLOT: slot,
                    STATE_SEQ: sequences.get(k),
                    STATE_RESTART: restart_values.get(k),
                    DELETED_AT: None,
                    UPDATED_AT: now,
                    OP: "U",
                }
            )
            kept.add(slot)
        # Slot -1 remembers the key's sequence, and its deletion (a tombstone) when no row is live.
        if (rows and sequences.get(k) is not None) or (not rows and options.sequence_by is not None):
            tombstone = now if not rows else None
            out.append(
                {
                    **marker,
                    SLOT: -1,
                    STATE_SEQ: sequences.get(k),
                    STATE_RESTART: restart_values.get(k),
                    DELETED_AT: tombstone,
                    UPDATED_AT: now,
                    OP: "U",
                }
            )
            kept.add(-1)
        for gone in slots_before.get(k, set()) - kept:
            out.append({**marker, SLOT: gone, OP: "D"})
    fields = [schema.field(c) for c in data_columns]
    state_schema = pa.schema(
        [
            *(f.with_nullable(f.name not in key) for f in fields),
            pa.field(SLOT, pa.int32(), nullable=False),
            pa.field(STATE_SEQ, pa.large_binary()),
            *([pa.field(STATE_RESTART, pa.large_binary())] if restart_by else []),
            pa.field(DELETED_AT, key_state.TIMESTAMP),
            pa.field(UPDATED_AT, key_state.TIMESTAMP),
            pa.field(OP, pa.string()),
        ]
    )
    return pa.Table.from_pylist(out, schema=state_schema)
