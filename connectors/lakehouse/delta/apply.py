"""Apply a changelog to a Delta table by primary key, one micro-batch at a time, exactly once.

Per batch: ``+I``/``+U`` upsert and ``-D`` deletes (a delete needs only the key); ``-U`` is checked,
not applied. Of several changes to one key the last wins: by ``sequence_by`` when given, else by
arrival. The whole batch is ONE delta-rs merge whose commit records ``(app_id, batch_id)`` as a Delta
application transaction, so a batch replayed after a crash finds its id and is skipped.

Columns a change lacks (unchanged TOAST) keep the key's previous value and a primary-key change
carries the old row to the new key (see ``unavailable``); a TRUNCATE empties the table in the batch's
commit (see ``control``); a column absent from the batch keeps the table's value on update.

Optional behaviours keep per-key state (a Delta table at ``state_path``, see ``key_state``):

- ``sequence_by``: a change older than the key's last applied sequence is late and ignored (counted);
  a delete leaves a tombstone for ``delete_retention`` so a late insert cannot resurrect the row; a
  change without a sequence is a dead letter (see ``dead_letters``), or, by option, applied where it
  arrived (counted either way);
- upsert materialization (spec 002): the live rows per key, so retractions that arrive after their
  additions, or a changelog keyed differently from the table, still leave the right row.
"""

from __future__ import annotations

import dataclasses
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

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.lakehouse.delta import key_index, key_state, restarts, unavailable
from cdcflow.connectors.lakehouse.delta.backend import DELTA_RS, Every, TableBackend, TableHandle, applied
from cdcflow.connectors.lakehouse.delta.batch import (
    EPOCH,
    IDX,
    ORDER,
    SEQ,
    ChangeBatch,
    arrival_order,
    check_update_pairs,
    last_per_key,
    prepare,
    sequence_order,
)
from cdcflow.connectors.lakehouse.delta.control import (
    FLOOR,
    Floor,
    OnTruncate,
    Truncation,
    decide,
    split_controls,
)
from cdcflow.connectors.lakehouse.delta.dead_letters import DeadLetterFiles, letters
from cdcflow.connectors.lakehouse.delta.key_state import (
    DELETED_AT,
    SLOT,
    STATE_RESTART,
    STATE_SEQ,
    UPDATED_AT,
)
from cdcflow.connectors.lakehouse.delta.schema import to_delta_columns
from cdcflow.connectors.lakehouse.delta.tables import OP
from cdcflow.connectors.lakehouse.delta.unavailable import INTERNAL, UNAVAILABLE, Filled, Links
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


class Unsequenced(enum.Enum):
    """What becomes of a change whose ``sequence_by`` value is NULL (counted either way)."""

    DEAD_LETTER = "dead-letter"
    """Not applied: a dead letter with the reason (its key's order cannot place it)."""
    ARRIVAL = "arrival"
    """Applied where it arrived: after its key's earlier changes in the batch, and never late."""

    @classmethod
    def parse(cls, value: str | Unsequenced) -> Unsequenced:
        if isinstance(value, Unsequenced):
            return value
        try:
            return cls(value.strip().lower())
        except ValueError:
            raise ConnectorOptionError(
                f"unsequenced must be one of dead-letter, arrival, not {value!r}"
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
    restart_by: str | None = None
    """A column rising across restarts of the sequence's log position (the commit timestamp): a change
    with a lower sequence but a newer ``restart_by`` than its key's last change is applied, not late."""
    unavailable_column: str | None = None
    """A ``list<string>`` column naming the columns a change has no value for (unchanged TOAST)."""
    old_key_column: str | None = None
    """JSON of the old key on the create of a primary-key change: its unavailable columns take that
    key's values."""
    new_key_column: str | None = None
    """JSON of the new key on the delete of a primary-key change: the old row is kept for the create."""
    control_column: str | None = None
    """Set on control events (``truncate``, ``message``, ...): such rows are not changes."""
    on_truncate: OnTruncate = OnTruncate.APPLY
    unsequenced: Unsequenced = Unsequenced.DEAD_LETTER
    """With ``sequence_by``: what becomes of a change whose sequence is NULL."""

    def __post_init__(self) -> None:
        if not self.key:
            raise ConnectorOptionError("key: name the table's primary key columns, e.g. key=['id']")
        clash = set(self.key) & set(self.exclude)
        if clash:
            raise ConnectorOptionError(f"key columns cannot be excluded from the table: {sorted(clash)}")
        if self.delete_retention <= timedelta(0):
            raise ConnectorOptionError("delete_retention must be positive")
        aside = set(self.key) & {*self.links.columns, self.control_column}
        if aside:
            raise ConnectorOptionError(
                f"key columns cannot be the unavailable, old/new key or control columns: {sorted(aside)}"
            )
        if self.restart_by is not None and self.sequence_by in (None, self.restart_by):
            raise ConnectorOptionError(
                "restart_by tells a restarted sequence from a late change: give it with sequence_by, "
                "naming another column (e.g. sequence_by='source_sequence', restart_by='source_timestamp')"
            )

    @property
    def materializes(self) -> bool:
        if self.materialize is Materialize.AUTO:
            return self.upsert_key is None or set(self.upsert_key) != set(self.key)
        return self.materialize is Materialize.FORCE

    @property
    def links(self) -> Links:
        return Links(self.unavailable_column, self.old_key_column, self.new_key_column)

    @property
    def stateful(self) -> bool:
        return (
            self.materializes
            or self.sequence_by is not None
            or self.old_key_column is not None
            or self.new_key_column is not None
        )


@dataclass
class BatchApplied:
    """What one batch did to the table."""

    batch_id: int
    skipped: bool = False
    changes: int = 0
    upserts: int = 0
    deletes: int = 0
    late: int = 0
    restarts: int = 0
    unmatched_retractions: int = 0
    unavailable_unfilled: int = 0
    """Changes that landed with an unavailable column NULL: no earlier value of their key anywhere."""
    truncates: int = 0
    control_events: int = 0
    """Control events other than TRUNCATE (messages, schema changes), skipped."""
    unsequenced: int = 0
    """Changes whose ``sequence_by`` value is NULL: dead letters, or applied in arrival order."""
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
        options = self.options
        now = key_state.utc_now(self.clock())
        batch, truncation, floor_late = self._changes(table, batch_id, state, now, result)
        # The state rows of the batch's keys, read once (a truncate empties the keys claims wait for).
        known = self._state_rows(state, batch.data, now) if state is not None else None
        claims = unavailable.open_claims(known) if truncation is None else None
        filling = unavailable.needs_filling(batch, options.links, options.key, claims) is not None
        # A replay whose target commit landed reads the target as the first run did: before that commit.
        reads = target
        if target_done and target is not None and filling:
            reads = target.before(self.app_id, batch_id)
        late, again, epoch = (None, None, None)
        if filling and options.sequence_by:
            late, again, epoch = self._late(batch, known)
        filled = unavailable.fill(
            batch,
            options.key,
            options.links,
            lambda keys: reads.rows_of_keys(options.key, keys) if reads is not None else None,
            lambda keys: self._state_rows(state, keys, now),
            now,
            claims=claims,
            late=late,
            again=again,
            epoch=epoch,
            truncated=truncation is not None,
        )
        batch = filled.batch
        if options.materializes:
            # After a truncate no row is live: the state's rows of the batch's keys are not used.
            live = None if truncation is not None else known
            winners, state_rows = self._materialize(batch, live, now, result)
        elif options.sequence_by is not None:
            check_update_pairs(batch, options.key)
            winners, state_rows = self._sequence(batch, known, now, result)
        else:
            check_update_pairs(batch, options.key)
            winners, state_rows = last_per_key(batch, options.key), None
        result.late += floor_late
        ops = np.asarray(winners.column(OP).to_numpy(zero_copy_only=False), dtype=object)
        result.upserts, result.deletes = int((ops == "U").sum()), int((ops == "D").sum())
        marks = self._unavailable_marks(batch, winners, filled)
        if not target_done:
            result.unavailable_unfilled = self._report_unfilled(batch, winners, filled, marks, target)
            winners, marks = _with_patches(winners, marks, filled.patches, list(options.key))
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

    def _late(
        self, batch: ChangeBatch, known: pa.Table | None
    ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """Which changes are late (older than their key's applied sequence), which are at it, and the
        keys' epochs."""
        sequences = None
        if known is not None:
            sequences = known.filter(pc.equal(known.column(SLOT), -1)).select(
                [*self.options.key, STATE_SEQ, STATE_RESTART]
            )
        epochs = restarts.epochs(batch, self.options.key, sequences)
        if sequences is None:
            return None, None, (epochs.epoch if epochs.any() else None)
        late = self._late_mask(batch, sequences, epochs)
        again = self._late_mask(batch, sequences, epochs, again=True) & ~late
        return (
            late if late.any() else None,
            again if again.any() else None,
            epochs.epoch if epochs.any() else None,
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
            source = source.append_column(UNAVAILABLE, marks)
        if kept is not None and kept.num_rows:  # named by the source (so not truncated), not written
            marked = kept.append_column(OP, pa.repeat(pa.scalar("K", pa.string()), kept.num_rows))
            source = pa.concat_tables([source, marked], promote_options="permissive")
        return target.merge(
            source,
            key,
            self.app_id,
            batch_id,
            delete_unmatched=[Every()] if truncation is not None else (),
            unavailable=UNAVAILABLE if marks is not None else None,
        )

    def _sequence(
        self, batch: ChangeBatch, known: pa.Table | None, now: datetime, result: BatchApplied
    ) -> tuple[pa.Table, pa.Table]:
        """The batch's winners by sequence, given ``known`` (the state rows of its keys)."""
        options = self.options
        key = list(options.key)
        if known is not None:
            known = known.filter(pc.equal(known.column(SLOT), -1)).select([*key, STATE_SEQ, STATE_RESTART])
        epochs = self._epochs(batch, known, result)
        winners = last_per_key(
            dataclasses.replace(batch, data=batch.data.append_column(EPOCH, pa.array(epochs.epoch)))
            if epochs.any()
            else batch,
            key,
        )
        restarted = pa.array(epochs.epoch[np.asarray(winners.column(IDX), dtype=np.int64)] > 0)
        winners = winners.drop_columns([c for c in (EPOCH,) if c in winners.schema.names])
        restart = self._restart_values(batch, winners)
        # A winner without a sequence (unsequenced='arrival') keeps the highest its key reached.
        inherited = winners.column(ORDER) if ORDER in winners.schema.names else None
        if known is not None and known.num_rows:
            at = key_index.positions_in(winners, known, key)
            known_seq = key_index.take_or_null(known.column(STATE_SEQ), at)
            late = pc.and_(pc.fill_null(pc.less(winners.column(SEQ), known_seq), False), pc.invert(restarted))
            result.late = self._count_late(batch, known, epochs)
            if result.late:
                log.warning(
                    "batch %d: %d late changes ignored (older than the key's sequence)",
                    batch.batch_id,
                    result.late,
                )
            sequenced = pc.is_valid(winners.column(SEQ))
            known_restart = key_index.take_or_null(known.column(STATE_RESTART).cast(pa.large_binary()), at)
            restart = pc.if_else(sequenced, restart, known_restart)
            merged = pc.coalesce(winners.column(SEQ), _highest(inherited, known_seq))
            winners = winners.set_column(winners.schema.get_field_index(SEQ), SEQ, merged)
            winners, restart = winners.filter(pc.invert(late)), restart.filter(pc.invert(late))
        elif inherited is not None:
            merged = pc.coalesce(winners.column(SEQ), inherited)
            winners = winners.set_column(winners.schema.get_field_index(SEQ), SEQ, merged)
        deleted = pc.equal(winners.column(OP), "D")
        restart_state = {STATE_RESTART: restart} if options.restart_by else {}
        state_rows = pa.table(
            {
                **{name: winners.column(name) for name in key},
                SLOT: pa.array(np.full(winners.num_rows, -1, dtype=np.int32)),
                STATE_SEQ: winners.column(SEQ),
                **restart_state,
                DELETED_AT: pc.if_else(deleted, key_state.stamp(now), pa.scalar(None, key_state.TIMESTAMP)),
                UPDATED_AT: pa.repeat(pa.scalar(now, key_state.TIMESTAMP), winners.num_rows),
                OP: pa.repeat(pa.scalar("U", pa.string()), winners.num_rows),
            }
        )
        return winners, state_rows

    def _count_late(self, batch: ChangeBatch, known: pa.Table, epochs: restarts.Epochs) -> int:
        return int(self._late_mask(batch, known, epochs).sum())

    def _late_mask(
        self, batch: ChangeBatch, known: pa.Table, epochs: restarts.Epochs, *, again: bool = False
    ) -> np.ndarray:
        """Changes older than their key's known sequence (``again``: or at it), before any restart of the
        key's position."""
        at = key_index.positions_in(batch.data, known, self.options.key)
        known_seq = key_index.take_or_null(known.column(STATE_SEQ), at)
        compare = pc.less_equal if again else pc.less
        older = compare(batch.data.column(SEQ).combine_chunks(), known_seq)
        late: np.ndarray = np.asarray(pc.fill_null(older, False), dtype=bool) & (epochs.epoch == 0)
        return late

    def _epochs(self, batch: ChangeBatch, known: pa.Table | None, result: BatchApplied) -> restarts.Epochs:
        """The restarts of each key's log position in ``batch`` (counted and logged in ``result``)."""
        epochs = restarts.epochs(batch, self.options.key, known)
        result.restarts = len(epochs.restarts)
        if epochs.restarts:
            key = self.options.key
            shown = [
                f"{batch.where(at)} (key {', '.join(str(batch.data.column(c)[at].as_py()) for c in key)})"
                for at in epochs.restarts[:5]
            ]
            log.warning(
                "batch %d: %d change(s) have a lower %s than their key's last change but a newer %s: the "
                "source's log position restarted (failover, RESET MASTER, new cluster); applied as newer: "
                "%s%s",
                batch.batch_id,
                len(epochs.restarts),
                self.options.sequence_by,
                self.options.restart_by,
                "; ".join(shown),
                ", ..." if len(epochs.restarts) > len(shown) else "",
            )
        return epochs

    @staticmethod
    def _restart_values(batch: ChangeBatch, rows: pa.Table) -> pa.Array:
        if batch.restart is None:
            return pa.nulls(rows.num_rows, pa.large_binary())
        return batch.restart.take(rows.column(IDX).combine_chunks())

    def _materialize(
        self, batch: ChangeBatch, known: pa.Table | None, now: datetime, result: BatchApplied
    ) -> tuple[pa.Table, pa.Table]:
        """The batch's live rows per key, given ``known`` (the state rows of its keys)."""
        options = self.options
        key = list(options.key)
        data_columns = [n for n in batch.data.schema.names if n not in (IDX, SEQ, ORDER)]
        if known is not None:  # primary-key carries (slots below -1) are not live rows
            known = known.filter(pc.greater_equal(known.column(SLOT), -1))
        live: dict[tuple[Any, ...], list[tuple[int, dict[str, Any]]]] = {}
        sequences: dict[tuple[Any, ...], bytes | None] = {}
        restart_values: dict[tuple[Any, ...], bytes | None] = {}
        slots_before: dict[tuple[Any, ...], set[int]] = {}
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
        epochs = self._epochs(
            batch, known.filter(pc.equal(known.column(SLOT), -1)) if known is not None else None, result
        )
        if SEQ in batch.data.schema.names:
            order = np.asarray(
                sequence_order(batch.data.append_column(EPOCH, pa.array(epochs.epoch)))
                if epochs.any()
                else sequence_order(batch.data)
            )
        rows = batch.data.to_pylist()
        restart_of = batch.restart.to_pylist() if batch.restart is not None else [None] * batch.num_rows
        epoch_seen: dict[tuple[Any, ...], int] = {}
        outcome: dict[tuple[Any, ...], tuple[str, dict[str, Any]]] = {}
        touched: dict[tuple[Any, ...], None] = {}
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
        ).take(
            pa.array(np.argsort([row[IDX] for _, row in outcome.values()], kind="stable").astype(np.int64))
        )
        state_rows = self._materialized_state(
            touched, ordered, sequences, slots_before, schema, data_columns, now, restart_values
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
        restart_values: dict[tuple[Any, ...], bytes | None],
    ) -> pa.Table:
        key = list(self.options.key)
        restart_by = self.options.restart_by is not None
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
            if (rows and sequences.get(k) is not None) or (not rows and self.options.sequence_by is not None):
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


def _with_patches(
    winners: pa.Table, marks: pa.Array | None, patches: pa.Table | None, key: list[str]
) -> tuple[pa.Table, pa.Array | None]:
    """``winners`` and their marks, plus the patch rows of keys the batch does not change itself."""
    if patches is None:
        return winners, marks
    patches = patches.filter(pc.invert(_row_in(patches, winners, key)))
    if not patches.num_rows:
        return winners, marks
    more = patches.column(UNAVAILABLE).combine_chunks()
    marks = pa.concat_arrays([marks if marks is not None else pa.nulls(winners.num_rows, more.type), more])
    rows = pa.concat_tables([winners, patches.drop_columns([UNAVAILABLE])], promote_options="default")
    return rows, marks


def _highest(values: pa.ChunkedArray | None, others: pa.Array) -> pa.Array:
    """Per row, the higher of two sequences, either of which may be null (``values`` None: all null)."""
    if values is None:
        return others
    values = values.combine_chunks()
    pick = pc.fill_null(pc.greater(others, values), False)
    return pc.coalesce(pc.if_else(pick, others, values), others)


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
