"""Apply a changelog to a Delta table by primary key, one micro-batch at a time, exactly once.

Per batch: ``+I``/``+U`` upsert and ``-D`` deletes (a delete needs only the key); ``-U`` is checked,
not applied. Of several changes to one key the last wins: by ``sequence_by`` when given, else by
arrival. The whole batch is ONE delta-rs merge whose commit records ``(app_id, batch_id)`` as a Delta
application transaction, so a batch replayed after a crash finds its id and is skipped.

Two optional behaviours keep per-key state (a Delta table at ``state_path``, see ``key_state``):

- ``sequence_by``: a change older than the key's last applied sequence is late and ignored (counted);
  a delete leaves a tombstone for ``delete_retention`` so a late insert cannot resurrect the row;
- upsert materialization (spec 002): the live rows per key, so retractions that arrive after their
  additions, or a changelog keyed differently from the table, still leave the right row.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.lakehouse import key_state
from cdcflow.connectors.lakehouse.changes import (
    IDX,
    SEQ,
    ChangeBatch,
    check_update_pairs,
    last_per_key,
    prepare,
    sequence_order,
)
from cdcflow.connectors.lakehouse.delta_io import OP, applied_version, merge_marked, open_table
from cdcflow.connectors.lakehouse.delta_schema import create_table, to_delta_columns
from cdcflow.connectors.lakehouse.key_state import DELETED_AT, SLOT, STATE_SEQ, UPDATED_AT
from cdcflow.core import Change, RowKind
from cdcflow.core.materialize import UpsertMaterializer

log = logging.getLogger(__name__)
POS = "_cdcflow_pos"


class Materialize(enum.Enum):
    AUTO = "auto"
    FORCE = "force"
    NONE = "none"

    @classmethod
    def parse(cls, value: str | Materialize) -> Materialize:
        if isinstance(value, Materialize):
            return value
        try:
            return cls(value.strip().lower())
        except ValueError:
            raise ConnectorOptionError(
                f"materialize must be one of auto, force, none, not {value!r}"
            ) from None


@dataclass(frozen=True)
class ApplyOptions:
    """How a changelog lands in its table; checked once, on the driver."""

    key: tuple[str, ...]
    sequence_by: str | None = None
    materialize: Materialize = Materialize.AUTO
    upsert_key: tuple[str, ...] | None = None
    """The changelog's upsert key (its rows are ordered per this key); None when unknown."""
    row_kind_column: str = "_row_kind"
    exclude: tuple[str, ...] = ()
    """Columns of the changelog kept out of the table (ordering helpers, metadata)."""
    delete_retention: timedelta = timedelta(days=7)
    state_ttl: timedelta | None = None

    def __post_init__(self) -> None:
        if not self.key:
            raise ConnectorOptionError("key: name the table's primary key columns, e.g. key=['id']")
        clash = set(self.key) & set(self.exclude)
        if clash:
            raise ConnectorOptionError(f"key columns cannot be excluded from the table: {sorted(clash)}")
        if self.delete_retention <= timedelta(0):
            raise ConnectorOptionError("delete_retention must be positive")

    @property
    def materializes(self) -> bool:
        if self.materialize is Materialize.AUTO:
            return self.upsert_key is None or set(self.upsert_key) != set(self.key)
        return self.materialize is Materialize.FORCE

    @property
    def stateful(self) -> bool:
        return self.materializes or self.sequence_by is not None


@dataclass
class BatchApplied:
    """What one batch did to the table."""

    batch_id: int
    skipped: bool = False
    changes: int = 0
    upserts: int = 0
    deletes: int = 0
    late: int = 0
    unmatched_retractions: int = 0
    table_version: int | None = None
    seconds: float = 0.0


class DeltaChangeApplier:
    """Applies changelog batches (Arrow tables) to the Delta table at ``target``."""

    def __init__(
        self,
        target: str,
        options: ApplyOptions,
        *,
        app_id: str,
        state_path: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if options.stateful and not state_path:
            raise ConnectorOptionError(
                "sequence_by and upsert materialization keep state per key: pass state_path (the ingest "
                "job keeps it in its checkpoint directory)"
            )
        self.target = target
        self.options = options
        self.app_id = app_id
        self.state_path = state_path
        self.clock = clock

    def applied_batch(self) -> int:
        """The last batch id committed to the target table (-1 when none)."""
        return applied_version(open_table(self.target), self.app_id)

    def done(self, batch_id: int) -> bool:
        """Whether ``batch_id`` was applied (see :meth:`_progress`)."""
        return self._progress(batch_id)[2]

    def _progress(self, batch_id: int) -> tuple[DeltaTable | None, DeltaTable | None, bool, bool]:
        """The target, the key state, whether the batch is done, and whether the target has it.

        The key state commits after the target, so its id means the whole batch landed (a batch that
        changed only the state has no target commit at all).
        """
        target = open_table(self.target)
        state = open_table(self.state_path) if self.state_path and self.options.stateful else None
        target_done = applied_version(target, self.app_id) >= batch_id
        if self.options.stateful:
            return target, state, applied_version(state, self.app_id) >= batch_id, target_done
        return target, state, target_done, target_done

    def apply(self, table: pa.Table, batch_id: int) -> BatchApplied:
        started = time.perf_counter()
        result = BatchApplied(batch_id, changes=table.num_rows)
        target, state, done, target_done = self._progress(batch_id)
        if done:
            result.skipped = True
            return result
        options = self.options
        batch = prepare(
            table, batch_id, options.key, options.row_kind_column, options.sequence_by, options.exclude
        )
        now = key_state.utc_now(self.clock())
        if options.materializes:
            winners, state_rows = self._materialize(batch, state, now, result)
        elif options.sequence_by is not None:
            check_update_pairs(batch, options.key)
            winners, state_rows = self._sequence(batch, state, now, result)
        else:
            check_update_pairs(batch, options.key)
            winners, state_rows = last_per_key(batch, options.key), None
        ops = np.asarray(winners.column(OP).to_numpy(zero_copy_only=False), dtype=object)
        result.upserts, result.deletes = int((ops == "U").sum()), int((ops == "D").sum())
        if not target_done and winners.num_rows:
            result.table_version = self._merge(target, winners, batch_id)
        if state_rows is not None and state_rows.num_rows and self.state_path:
            key_state.save(
                self.state_path,
                state,
                state_rows,
                options.key,
                self.app_id,
                batch_id,
                now,
                options.delete_retention,
                options.state_ttl,
            )
        result.seconds = time.perf_counter() - started
        return result

    def _merge(self, target: DeltaTable | None, winners: pa.Table, batch_id: int) -> int:
        key = self.options.key
        data = to_delta_columns(
            winners.drop_columns([c for c in (IDX, SEQ, OP) if c in winners.schema.names])
        )
        if target is None:
            target = create_table(self.target, data.schema, key)
        source = data.append_column(OP, winners.column(OP))
        return merge_marked(target, self.target, source, key, self.app_id, batch_id)

    def _sequence(
        self, batch: ChangeBatch, state: DeltaTable | None, now: datetime, result: BatchApplied
    ) -> tuple[pa.Table, pa.Table]:
        options = self.options
        key = list(options.key)
        winners = last_per_key(batch, key)
        known = key_state.load(
            str(self.state_path), state, key, winners, now, options.delete_retention, options.state_ttl
        )
        if known is not None and known.num_rows:
            known = known.filter(pc.equal(known.column(SLOT), -1)).select([*key, STATE_SEQ])
            # Join on the keys alone: Arrow joins refuse nested payload columns.
            probe = winners.select(key).append_column(POS, pa.array(np.arange(winners.num_rows)))
            joined = probe.join(known, key, join_type="left outer", use_threads=False).sort_by(POS)
            known_seq = joined.column(STATE_SEQ)
            late = pc.fill_null(pc.less(winners.column(SEQ), known_seq), False)
            result.late = self._count_late(batch, known)
            if result.late:
                log.warning(
                    "batch %d: %d late changes ignored (older than the key's sequence)",
                    batch.batch_id,
                    result.late,
                )
            merged = pc.coalesce(winners.column(SEQ), known_seq)
            winners = winners.set_column(winners.schema.get_field_index(SEQ), SEQ, merged)
            winners = winners.filter(pc.invert(late))
        deleted = pc.equal(winners.column(OP), "D")
        state_rows = pa.table(
            {
                **{name: winners.column(name) for name in key},
                SLOT: pa.array(np.full(winners.num_rows, -1, dtype=np.int32)),
                STATE_SEQ: winners.column(SEQ),
                DELETED_AT: pc.if_else(deleted, key_state.stamp(now), pa.scalar(None, key_state.TIMESTAMP)),
                UPDATED_AT: pa.array([now] * winners.num_rows, key_state.TIMESTAMP),
                OP: pa.array(["U"] * winners.num_rows),
            }
        )
        return winners, state_rows

    def _count_late(self, batch: ChangeBatch, known: pa.Table) -> int:
        key = list(self.options.key)
        rows = batch.data.select([*key, SEQ]).join(known, key, join_type="inner", use_threads=False)
        return int(
            pc.sum(pc.fill_null(pc.less(rows.column(SEQ), rows.column(STATE_SEQ)), False)).as_py() or 0
        )

    def _materialize(
        self, batch: ChangeBatch, state: DeltaTable | None, now: datetime, result: BatchApplied
    ) -> tuple[pa.Table, pa.Table]:
        options = self.options
        key = list(options.key)
        data_columns = [n for n in batch.data.schema.names if n not in (IDX, SEQ)]
        known = key_state.load(
            str(self.state_path), state, key, batch.data, now, options.delete_retention, options.state_ttl
        )
        live: dict[tuple[Any, ...], list[tuple[int, dict[str, Any]]]] = {}
        sequences: dict[tuple[Any, ...], bytes | None] = {}
        slots_before: dict[tuple[Any, ...], set[int]] = {}
        for row in known.to_pylist() if known is not None else []:
            k = tuple(row[c] for c in key)
            slots_before.setdefault(k, set()).add(row[SLOT])
            if row[SLOT] == -1:
                sequences[k] = row[STATE_SEQ]
            else:
                live.setdefault(k, []).append((row[SLOT], {c: row.get(c) for c in data_columns}))
        ordered = {k: [r for _, r in sorted(slots, key=lambda p: p[0])] for k, slots in live.items()}
        materializer = UpsertMaterializer(
            options.upsert_key or None,
            compare_columns=data_columns,
            on_unmatched=lambda change: log.warning(
                "batch %d: retraction %s matched no live row of its key (state expired, or never added)",
                batch.batch_id,
                change,
            ),
        )
        order = np.arange(batch.num_rows)
        if SEQ in batch.data.schema.names:
            order = np.asarray(sequence_order(batch.data))
        rows = batch.data.to_pylist()
        outcome: dict[tuple[Any, ...], tuple[str, dict[str, Any]]] = {}
        touched: dict[tuple[Any, ...], None] = {}
        for index in order:
            row = rows[index]
            k = tuple(row[c] for c in key)
            seq = row.get(SEQ)
            if seq is not None and sequences.get(k) is not None and seq < sequences[k]:
                result.late += 1
                continue
            if seq is not None:
                sequences[k] = seq
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
        ).take(
            pa.array(np.argsort([row[IDX] for _, row in outcome.values()], kind="stable").astype(np.int64))
        )
        state_rows = self._materialized_state(
            touched, ordered, sequences, slots_before, schema, data_columns, now
        )
        return winners, state_rows

    def _materialized_state(
        self,
        touched: dict[tuple[Any, ...], None],
        ordered: dict[tuple[Any, ...], list[dict[str, Any]]],
        sequences: dict[tuple[Any, ...], bytes | None],
        slots_before: dict[tuple[Any, ...], set[int]],
        schema: pa.Schema,
        data_columns: list[str],
        now: datetime,
    ) -> pa.Table:
        key = list(self.options.key)
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
                        DELETED_AT: None,
                        UPDATED_AT: now,
                        OP: "U",
                    }
                )
                kept.add(slot)
            # Slot -1 remembers the key's sequence, and its deletion (a tombstone) when no row is live.
            if (rows and sequences.get(k) is not None) or (not rows and self.options.sequence_by is not None):
                tombstone = now if not rows else None
                out.append(
                    {
                        **marker,
                        SLOT: -1,
                        STATE_SEQ: sequences.get(k),
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
                pa.field(DELETED_AT, key_state.TIMESTAMP),
                pa.field(UPDATED_AT, key_state.TIMESTAMP),
                pa.field(OP, pa.string()),
            ]
        )
        return pa.Table.from_pylist(out, schema=state_schema)
