"""Last wins by ``sequence_by``: late changes, restarts of a key's log position, and the batch's winners
with the key state rows that remember each key's sequence (and its deletion, a tombstone).

Restarts: a change whose sequence is lower than its key's last one is late, unless its ``restart_by`` value
(the commit timestamp) is newer than that change's: then the source's position restarted (failover,
``RESET MASTER``, a new cluster) and the change is newer after all. Each restart starts a new *epoch*
of the key: epochs apply in arrival order, the changes within one by sequence (see
:func:`~cdcflow.connectors.lakehouse.delta.batch.sequence_order`).

Only keys whose sequence goes backwards (within the batch in arrival order, or below the key's known
sequence) can restart; they are walked in Python, every other key stays in epoch 0.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.connectors.lakehouse.delta import key_state
from cdcflow.connectors.lakehouse.delta.batch import (
    EPOCH,
    IDX,
    ORDER,
    SEQ,
    ChangeBatch,
    group_ids,
    last_per_key,
    positions_in,
    take_or_null,
)
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

log = logging.getLogger(__name__)


@dataclass
class Epochs:
    """Per arrival position: how many restarts of its key's position precede it in this batch."""

    epoch: np.ndarray
    restarts: list[int] = field(default_factory=list)
    """Arrival positions of the changes that restarted their key's position."""

    def any(self) -> bool:
        return bool(self.restarts)


def epochs(batch: ChangeBatch, key: Sequence[str], known: pa.Table | None) -> Epochs:
    """The epochs of ``batch``'s changes given ``known`` (key, sequence and restart value per key)."""
    n = batch.num_rows
    result = Epochs(np.zeros(n, dtype=np.int64))
    if batch.restart is None or n == 0:
        return result
    at = positions_in(batch.data, known, key) if known is not None and known.num_rows else None

    def known_values(column: str) -> pa.Array:
        if known is None or at is None:
            return pa.nulls(n, pa.large_binary())
        return take_or_null(known.column(column).cast(pa.large_binary()), at)

    known_seqs = known_values(STATE_SEQ)
    seq = batch.data.column(SEQ).combine_chunks()
    idx = np.asarray(batch.data.column(IDX), dtype=np.int64)
    # Where does a key's sequence fall below the known one, or step back in arrival order?
    back = np.array(pc.fill_null(pc.less(seq, known_seqs), False), dtype=bool)
    if not back.any() and _never_back(seq, idx):
        return result
    known_restarts = known_values(STATE_RESTART)
    kid = group_ids(batch.data, key)
    arrival = np.lexsort((idx, kid))
    ordered = seq.take(pa.array(arrival))
    if n > 1:
        step = pc.fill_null(pc.less(ordered.slice(1), ordered.slice(0, n - 1)), False)
        back[arrival[1:]] |= np.asarray(step, dtype=bool) & (kid[arrival[1:]] == kid[arrival[:-1]])
    suspects = np.unique(kid[back])
    if len(suspects) == 0:
        return result
    walk = arrival[np.isin(kid[arrival], suspects)]
    take = pa.array(walk)
    known_seq = known_seqs.take(take).to_pylist()
    known_restart = known_restarts.take(take).to_pylist()
    current: dict[int, tuple[bytes, bytes | None]] = {}
    epoch_of: dict[int, int] = {}
    for position, k, s, r, ks, kr in zip(
        walk.tolist(),
        kid[walk].tolist(),
        seq.take(take).to_pylist(),
        batch.restart.take(take).to_pylist(),
        known_seq,
        known_restart,
        strict=True,
    ):
        if k not in current and ks is not None:
            current[k] = (ks, kr)
        last = current.get(k)
        if s is not None:
            if last is None or s >= last[0]:
                current[k] = (s, r)
            elif r is not None and last[1] is not None and r > last[1]:
                epoch_of[k] = epoch_of.get(k, 0) + 1
                current[k] = (s, r)
                result.restarts.append(position)
        result.epoch[position] = epoch_of.get(k, 0)
    return result


def _never_back(seq: pa.Array, idx: npt.NDArray[np.int64]) -> bool:
    """Whether the rows are in arrival order and their sequences never step back along it (NULLs left
    out): then no key's do."""
    if len(idx) > 1 and not bool(np.all(idx[1:] > idx[:-1])):
        return False
    present = seq.drop_null()
    n = len(present)
    return n < 2 or not pc.any(pc.less(present.slice(1), present.slice(0, n - 1))).as_py()


def sequence_rows(known: pa.Table | None, key: Sequence[str]) -> pa.Table | None:
    """The keys' sequence records among ``known`` (key state rows, slot -1): key, sequence, restart."""
    if known is None:
        return None
    return known.filter(pc.equal(known.column(SLOT), -1)).select([*key, STATE_SEQ, STATE_RESTART])


def late_mask(
    batch: ChangeBatch,
    sequences: pa.Table,
    epochs: Epochs,
    key: Sequence[str],
    *,
    again: bool = False,
) -> np.ndarray:
    """Changes older than their key's known sequence (``again``: or at it), before any restart of the
    key's position."""
    at = positions_in(batch.data, sequences, key)
    known_seq = take_or_null(sequences.column(STATE_SEQ), at)
    compare = pc.less_equal if again else pc.less
    older = compare(batch.data.column(SEQ).combine_chunks(), known_seq)
    late: np.ndarray = np.asarray(pc.fill_null(older, False), dtype=bool) & (epochs.epoch == 0)
    return late


def late_and_again(
    batch: ChangeBatch, sequences: pa.Table | None, epochs: Epochs, key: Sequence[str]
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """Which changes are late (older than their key's applied sequence), which are at it, and the
    keys' epochs (each None when there are none)."""
    if sequences is None:
        return None, None, (epochs.epoch if epochs.any() else None)
    late = late_mask(batch, sequences, epochs, key)
    again = late_mask(batch, sequences, epochs, key, again=True) & ~late
    return (
        late if late.any() else None,
        again if again.any() else None,
        epochs.epoch if epochs.any() else None,
    )


def report_restarts(batch: ChangeBatch, epochs: Epochs, options: ApplyOptions, result: BatchApplied) -> None:
    """Counts the restarts of each key's log position in ``batch`` in ``result``, and logs them."""
    result.restarts = len(epochs.restarts)
    if not epochs.restarts:
        return
    key = options.key
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
        options.sequence_by,
        options.restart_by,
        "; ".join(shown),
        ", ..." if len(epochs.restarts) > len(shown) else "",
    )


def by_sequence(
    batch: ChangeBatch,
    sequences: pa.Table | None,
    epochs: Epochs,
    options: ApplyOptions,
    now: datetime,
    result: BatchApplied,
) -> tuple[pa.Table, pa.Table]:
    """The batch's winners by sequence and their key state rows, given ``sequences`` (the keys' known
    sequences, see :func:`sequence_rows`) and ``epochs`` (computed against them)."""
    key = list(options.key)
    report_restarts(batch, epochs, options, result)
    winners = last_per_key(
        dataclasses.replace(batch, data=batch.data.append_column(EPOCH, pa.array(epochs.epoch)))
        if epochs.any()
        else batch,
        key,
    )
    restarted = pa.array(epochs.epoch[np.asarray(winners.column(IDX), dtype=np.int64)] > 0)
    winners = winners.drop_columns([c for c in (EPOCH,) if c in winners.schema.names])
    restart = _restart_values(batch, winners)
    # A winner without a sequence (unsequenced='arrival') keeps the highest its key reached.
    inherited = winners.column(ORDER) if ORDER in winners.schema.names else None
    if sequences is not None and sequences.num_rows:
        at = positions_in(winners, sequences, key)
        known_seq = take_or_null(sequences.column(STATE_SEQ), at)
        late = pc.and_(pc.fill_null(pc.less(winners.column(SEQ), known_seq), False), pc.invert(restarted))
        result.late = int(late_mask(batch, sequences, epochs, key).sum())
        if result.late:
            log.warning(
                "batch %d: %d late changes ignored (older than the key's sequence)",
                batch.batch_id,
                result.late,
            )
        sequenced = pc.is_valid(winners.column(SEQ))
        known_restart = take_or_null(sequences.column(STATE_RESTART).cast(pa.large_binary()), at)
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


def _restart_values(batch: ChangeBatch, rows: pa.Table) -> pa.Array:
    if batch.restart is None:
        return pa.nulls(rows.num_rows, pa.large_binary())
    return batch.restart.take(rows.column(IDX).combine_chunks())


def _highest(values: pa.ChunkedArray | None, others: pa.Array) -> pa.Array:
    """Per row, the higher of two sequences, either of which may be null (``values`` None: all null)."""
    if values is None:
        return others
    values = values.combine_chunks()
    pick = pc.fill_null(pc.greater(others, values), False)
    return pc.coalesce(pc.if_else(pick, others, values), others)
