"""Apply a changelog to a Delta table by primary key, one micro-batch at a time, exactly once.

Per batch: ``+I``/``+U`` upsert and ``-D`` deletes (a delete needs only the key); ``-U`` is checked,
not applied. Of several changes to one key the last wins: by ``sequence_by`` when given, else by
arrival. The whole batch is ONE delta-rs merge whose commit records ``(app_id, batch_id)`` as a Delta
application transaction, so a batch replayed after a crash finds its id and is skipped.

Columns a change lacks (unchanged TOAST) keep the key's previous value and a primary-key change
carries the old row to the new key (see :mod:`.fill`); a TRUNCATE empties the table in the batch's
commit (see :mod:`.batch`); a column absent from the batch keeps the table's value on update.

Optional behaviours keep per-key state (a Delta table at ``state_path``, see ``key_state``):

- ``sequence_by`` (see ``sequencing``): a change older than the key's last applied sequence is late and
  ignored (counted); a delete leaves a tombstone for ``delete_retention`` so a late insert cannot
  resurrect the row; a change without a sequence is a dead letter (see ``dead_letters``), or, by
  option, applied where it arrived (counted either way);
- upsert materialization (spec 002, see ``materialization``): the live rows per key, so retractions
  that arrive after their additions, or a changelog keyed differently from the table, still leave the
  right row.

This module orchestrates one batch; its options are in ``options``, what it did in ``result``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.lakehouse.delta import key_state, sequencing
from cdcflow.connectors.lakehouse.delta.batch import (
    FLOOR,
    IDX,
    INTERNAL,
    SEQ,
    ChangeBatch,
    Floor,
    Truncation,
    arrival_order,
    check_update_pairs,
    decide,
    last_per_key,
    prepare,
    rows_with_keys,
    split_controls,
)
from cdcflow.connectors.lakehouse.delta.dead_letters import DeadLetterFiles, letters
from cdcflow.connectors.lakehouse.delta.fill import (
    FillInputs,
    covered,
    fill,
    link_keys,
    needs_filling,
    open_claims,
)
from cdcflow.connectors.lakehouse.delta.fill_result import KEPT_COLUMNS, Filled
from cdcflow.connectors.lakehouse.delta.key_state import (
    DELETED_AT,
    SLOT,
    STATE_RESTART,
    STATE_SEQ,
)
from cdcflow.connectors.lakehouse.delta.materialization import materialize
from cdcflow.connectors.lakehouse.delta.merge import OP, Every, Merge
from cdcflow.connectors.lakehouse.delta.options import ApplyOptions, Unsequenced
from cdcflow.connectors.lakehouse.delta.result import BatchApplied
from cdcflow.connectors.lakehouse.delta.sequencing import by_sequence, late_and_again, sequence_rows
from cdcflow.connectors.lakehouse.delta.state_cache import StateCache
from cdcflow.connectors.lakehouse.delta.tables import (
    DELTA_RS,
    TableBackend,
    TableHandle,
    applied,
    to_delta_columns,
)

log = logging.getLogger(__name__)
POS = "_cdcflow_pos"


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
        backend: TableBackend = DELTA_RS,
        dead_letters: DeadLetterFiles | None = None,
    ) -> None:
        """``dead_letters``: where the changes left out go (the Delta sink's are in its checkpoint);
        without it they are only counted and logged."""
        if options.stateful and not state_path:
            raise ConnectorOptionError(
                "sequence_by, upsert materialization and primary-key links (old_key_column, "
                "new_key_column) keep state per key: pass state_path (the ingest job keeps it in its "
                "checkpoint directory)"
            )
        self.target = target
        self.options = options
        self.app_id = app_id
        self.state_path = state_path
        self.clock = clock
        self.backend = backend
        """Reads and writes the target and the key state: delta-rs, or Spark with Delta's jars."""
        self.dead_letters = dead_letters
        self._state = StateCache()
        """The key state's rows between batches (see ``state_cache``)."""

    def applied_batch(self) -> int:
        """The last batch id committed to the target table (-1 when none)."""
        return applied(self.backend.open(self.target), self.app_id)

    def done(self, batch_id: int) -> bool:
        """Whether ``batch_id`` was applied (see :meth:`_progress`)."""
        return self._progress(batch_id)[2]

    def _progress(self, batch_id: int) -> tuple[TableHandle | None, TableHandle | None, bool, bool]:
        """The target, the key state, whether the batch is done, and whether the target has it.

        The key state commits after the target, so its id means the whole batch landed (a batch that
        changed only the state has no target commit at all).
        """
        target = self.backend.open(self.target)
        state = self.backend.open(self.state_path) if self.state_path and self.options.stateful else None
        target_done = applied(target, self.app_id) >= batch_id
        if self.options.stateful:
            return target, state, applied(state, self.app_id) >= batch_id, target_done
        return target, state, target_done, target_done

    def apply(self, table: pa.Table, batch_id: int) -> BatchApplied:
        started = time.perf_counter()
        result = BatchApplied(batch_id, changes=table.num_rows)
        target, state, done, target_done = self._progress(batch_id)
        if done:
            result.skipped = True
            return result
        state = self._state.wrap(state)
        options = self.options
        key = options.key
        now = key_state.utc_now(self.clock())
        batch, truncation, floor_late = self._changes(table, batch_id, state, now, result)
        # The state rows of the batch's keys and of the keys its key changes name, read once (a truncate
        # empties the keys claims wait for); the walk's lookups of those keys are answered from them.
        own = to_delta_columns(batch.data.select(list(key)))
        linked = link_keys(batch, options.links, key) if state is not None else None
        probe = own if linked is None else pa.concat_tables([own, linked], promote_options="permissive")
        read = self._state_rows(state, probe, now) if state is not None else None
        known = read if linked is None or read is None else rows_with_keys(read, own, key)
        sequences = sequence_rows(known, key)
        claims = open_claims(known) if truncation is None else None
        filling = needs_filling(batch, options.links, key, claims) is not None
        # A replay whose target commit landed reads the target as the first run did: before that commit.
        reads = target
        if target_done and target is not None and filling:
            reads = target.before(self.app_id, batch_id)
        # The restarts of the keys' log positions order the fill and then last-wins: computed once (the
        # fill changes no key, sequence or restart value).
        epochs: sequencing.Epochs | None = None
        late, again, epoch = (None, None, None)
        if filling and options.sequence_by:
            epochs = sequencing.epochs(batch, key, sequences)
            late, again, epoch = late_and_again(batch, sequences, epochs, key)
        inputs = FillInputs(
            batch,
            key,
            options.links,
            lambda keys: reads.rows_of_keys(key, keys) if reads is not None else None,
            covered(read, probe, key, lambda keys: self._state_rows(state, keys, now)),
            now,
            late=late,
            again=again,
            epoch=epoch,
            truncated=truncation is not None,
        )
        filled = fill(inputs, claims)
        batch = filled.batch
        if options.materializes:
            # After a truncate no row is live: the state's rows of the batch's keys are not used.
            live = None if truncation is not None else known
            if epochs is None or truncation is not None:
                epochs = sequencing.epochs(batch, key, sequence_rows(live, key))
            winners, state_rows = materialize(batch, live, epochs, options, now, result)
        elif options.sequence_by is not None:
            check_update_pairs(batch, key)
            if epochs is None:
                epochs = sequencing.epochs(batch, key, sequences)
            winners, state_rows = by_sequence(batch, sequences, epochs, options, now, result)
        else:
            check_update_pairs(batch, key)
            winners, state_rows = last_per_key(batch, key), None
        result.late += floor_late
        ops = np.asarray(winners.column(OP).to_numpy(zero_copy_only=False), dtype=object)
        result.upserts, result.deletes = int((ops == "U").sum()), int((ops == "D").sum())
        marks = self._unavailable_marks(batch, winners, filled)
        if not target_done:
            result.unavailable_unfilled = self._report_unfilled(batch, winners, filled, marks, target)
            winners, marks = _with_patches(winners, marks, filled.patches, list(key))
            if winners.num_rows or (truncation is not None and target is not None):
                kept = self._kept_after(state, truncation, winners)
                result.table_version = self._merge(target, winners, batch_id, marks, truncation, kept)
        self._save_state(state, _combine(state_rows, filled.state), batch, truncation, batch_id, now)
        result.seconds = time.perf_counter() - started
        return result

    def _changes(
        self, table: pa.Table, batch_id: int, state: TableHandle | None, now: datetime, result: BatchApplied
    ) -> tuple[ChangeBatch, Truncation | None, int]:
        """The batch's changes that still count: after its TRUNCATE, and after an earlier batch's."""
        options = self.options
        table, controls = split_controls(
            table, options.control_column, options.sequence_by, options.restart_by, batch_id
        )
        batch = prepare(
            table,
            batch_id,
            options.key,
            options.row_kind_column,
            options.sequence_by,
            (*options.exclude, *([options.control_column] if options.control_column else [])),
            restart_by=options.restart_by,
            extra=options.links.columns,
        )
        control = decide(controls, options.on_truncate)
        result.changes, result.truncates = batch.num_rows, control.truncates
        result.control_events = control.others
        batch = self._unsequenced(batch, result)
        truncation = control.truncation
        if truncation is not None:
            batch = batch.keep(~truncation.void(batch))
        floor = Floor.of(state, now, options.delete_retention) if options.sequence_by else None
        late = floor.late(batch) if floor is not None else None
        if late is None or not late.any():
            return batch, truncation, 0
        log.warning(
            "batch %d: %d change(s) happened before a TRUNCATE applied in an earlier batch; ignored as late",
            batch_id,
            int(late.sum()),
        )
        return batch.keep(~late), truncation, int(late.sum())

    def _unsequenced(self, batch: ChangeBatch, result: BatchApplied) -> ChangeBatch:
        """The batch without its changes that have no sequence (dead letters), or with them placed where
        they arrived (``unsequenced='arrival'``); counted either way."""
        options = self.options
        if options.sequence_by is None:
            return batch
        missing = np.asarray(pc.is_null(batch.data.column(SEQ).combine_chunks()), dtype=bool)
        result.unsequenced = int(missing.sum())
        if not result.unsequenced:
            return batch
        if options.unsequenced is Unsequenced.ARRIVAL:
            return arrival_order(batch, options.key)
        at = np.flatnonzero(missing)
        reason = (
            f"{options.sequence_by} is NULL: the change cannot be ordered among its key's changes; fill "
            f"{options.sequence_by}, or apply such changes in arrival order with unsequenced='arrival'"
        )
        if self.dead_letters is not None:
            self.dead_letters.write(batch.batch_id, letters(batch, at, reason, options.sequence_by))
        shown = [batch.where(int(i)) for i in at[:5]]
        log.warning(
            "batch %d: %d change(s) not applied, %s: %s%s (dead letters: %s)",
            batch.batch_id,
            len(at),
            reason,
            "; ".join(shown),
            ", ..." if len(at) > len(shown) else "",
            self.dead_letters.directory if self.dead_letters is not None else "not kept",
        )
        return batch.keep(~missing)

    def _kept_after(
        self, state: TableHandle | None, truncation: Truncation | None, winners: pa.Table
    ) -> pa.Table | None:
        """Under ``sequence_by``, the keys an earlier batch changed after this batch's TRUNCATE (input
        partitions reach a batch at different positions): the truncate keeps their rows."""
        if truncation is None or truncation.sequence is None or state is None or not self.state_path:
            return None
        key = list(self.options.key)
        rows = state.rows_where({SLOT: -1}, [DELETED_AT])
        binary = pa.large_binary()
        sequence = pa.scalar(truncation.sequence, binary)
        newer = pc.fill_null(pc.greater(rows.column(STATE_SEQ).cast(binary), sequence), False)
        if truncation.restart is not None and STATE_RESTART in rows.schema.names:
            restart = pa.scalar(truncation.restart, binary)
            restarted = pc.greater(rows.column(STATE_RESTART).cast(binary), restart)
            newer = pc.or_(newer, pc.fill_null(restarted, False))
        rows = rows.filter(newer)
        if not rows.num_rows:
            return None
        types = winners.select(key).schema
        kept = pa.table({c: rows.column(c).cast(types.field(c).type) for c in key})
        return kept.filter(pc.invert(_row_in(kept, winners, key)))

    def _save_state(
        self,
        state: TableHandle | None,
        rows: pa.Table | None,
        batch: ChangeBatch,
        truncation: Truncation | None,
        batch_id: int,
        now: datetime,
    ) -> None:
        """Commits the batch's key state (after the target: its application transaction means done)."""
        options = self.options
        if not self.state_path or (rows is None or not rows.num_rows) and truncation is None:
            return
        key_fields = [batch.data.schema.field(c) for c in options.key]
        if truncation is not None and truncation.sequence is not None and options.sequence_by:
            floor = Floor(truncation.sequence, truncation.restart, now)
            state = key_state.set_property(
                self.backend, self.state_path, state, key_fields, FLOOR, floor.to_json()
            )
        if state is None and (rows is None or not rows.num_rows):
            return
        key_state.save(
            self.backend,
            self.state_path,
            state,
            rows if rows is not None and rows.num_rows else key_state.no_rows(key_fields),
            options.key,
            self.app_id,
            batch_id,
            now,
            options.delete_retention,
            options.state_ttl,
            truncated=truncation is not None,
        )

    def _state_rows(self, state: TableHandle | None, keys: pa.Table, now: datetime) -> pa.Table | None:
        options = self.options
        if not self.state_path:
            return None
        return key_state.load(state, options.key, keys, now, options.delete_retention, options.state_ttl)

    def _unavailable_marks(self, batch: ChangeBatch, winners: pa.Table, filled: Filled) -> pa.Array | None:
        """Per winner: the columns its target row keeps (upserts of changes that lacked them)."""
        if filled.pending is None or not winners.num_rows:
            return None
        at = np.asarray(winners.column(IDX), dtype=np.int64)
        own = np.isin(batch.kinds[at], ("+I", "+U")) & (
            np.asarray(winners.column(OP).to_numpy(zero_copy_only=False), dtype=object) == "U"
        )
        marks = filled.pending.take(pa.array(at))
        marks = pc.if_else(pa.array(own), marks, pa.scalar(None, marks.type))
        return marks if marks.null_count < len(marks) else None

    def _report_unfilled(
        self,
        batch: ChangeBatch,
        winners: pa.Table,
        filled: Filled,
        marks: pa.Array | None,
        target: TableHandle | None,
    ) -> int:
        """Counts and logs the winners that land with an unavailable column NULL (nothing to keep)."""
        if not filled.unfilled and marks is None:
            return 0
        at = np.asarray(winners.column(IDX), dtype=np.int64)
        upserts = np.asarray(winners.column(OP).to_numpy(zero_copy_only=False), dtype=object) == "U"
        lost: dict[int, list[str]] = {
            int(i): filled.unfilled[int(i)] for i in at[upserts] if int(i) in filled.unfilled
        }
        if marks is not None:
            key = list(self.options.key)
            marked = np.asarray(pc.is_valid(marks), dtype=bool)
            wanted = winners.select(key).filter(pa.array(marked))
            present = (
                target.rows_of_keys(key, wanted, columns=key) if target is not None else wanted.slice(0, 0)
            )
            absent = np.asarray(pc.invert(_row_in(wanted, present, key)), dtype=bool)
            missing = marks.filter(pa.array(marked)).filter(pa.array(absent)).to_pylist()
            for i, columns in zip(at[marked][absent].tolist(), missing, strict=True):
                lost.setdefault(int(i), []).extend(columns or ())
        if lost:
            shown = [f"{batch.where(i)} ({', '.join(columns)})" for i, columns in list(lost.items())[:5]]
            log.warning(
                "batch %d: %d change(s) lack a value the source did not send (unchanged TOAST) and their "
                "key has no earlier value in the batch, the table or the key state; the column(s) land "
                "NULL: %s%s",
                batch.batch_id,
                len(lost),
                "; ".join(shown),
                ", ..." if len(lost) > len(shown) else "",
            )
        return len(lost)

    def _merge(
        self,
        target: TableHandle | None,
        winners: pa.Table,
        batch_id: int,
        marks: pa.Array | None = None,
        truncation: Truncation | None = None,
        kept: pa.Table | None = None,
    ) -> int:
        key = self.options.key
        data = to_delta_columns(
            winners.drop_columns([c for c in winners.schema.names if c.startswith(INTERNAL)])
        )
        if target is None:
            target = self.backend.create(self.target, data.schema, key)
        source = data.append_column(OP, winners.column(OP))
        if marks is not None:
            source = source.append_column(KEPT_COLUMNS, marks)
        if kept is not None and kept.num_rows:  # named by the source (so not truncated), not written
            marked = kept.append_column(OP, pa.repeat(pa.scalar("K", pa.string()), kept.num_rows))
            source = pa.concat_tables([source, marked], promote_options="permissive")
        return target.merge(
            Merge(
                source,
                key,
                self.app_id,
                batch_id,
                delete_unmatched=[Every()] if truncation is not None else (),
                unavailable=KEPT_COLUMNS if marks is not None else None,
            )
        )


def _with_patches(
    winners: pa.Table, marks: pa.Array | None, patches: pa.Table | None, key: list[str]
) -> tuple[pa.Table, pa.Array | None]:
    """``winners`` and their marks, plus the patch rows of keys the batch does not change itself."""
    if patches is None:
        return winners, marks
    patches = patches.filter(pc.invert(_row_in(patches, winners, key)))
    if not patches.num_rows:
        return winners, marks
    more = patches.column(KEPT_COLUMNS).combine_chunks()
    marks = pa.concat_arrays([marks if marks is not None else pa.nulls(winners.num_rows, more.type), more])
    rows = pa.concat_tables([winners, patches.drop_columns([KEPT_COLUMNS])], promote_options="default")
    return rows, marks


def _combine(rows: pa.Table | None, more: pa.Table | None) -> pa.Table | None:
    if rows is None or more is None:
        return rows if more is None else more
    return pa.concat_tables([rows, more], promote_options="permissive")


def _row_in(rows: pa.Table, found: pa.Table, key: list[str]) -> pa.Array:
    """Per row of ``rows``: whether ``found`` has its key."""
    probe = rows.select(key).append_column(POS, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    hits = probe.join(
        found.select(key).cast(rows.select(key).schema).group_by(key).aggregate([]),
        key,
        join_type="inner",
        use_threads=False,
    )
    mask = np.zeros(rows.num_rows, dtype=bool)
    mask[np.asarray(hits.column(POS), dtype=np.int64)] = True
    return pa.array(mask)
