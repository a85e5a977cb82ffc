"""Restarted log positions: telling a change whose position went backwards from a late one.

A change whose sequence is lower than its key's last one is late, unless its ``restart_by`` value
(the commit timestamp) is newer than that change's: then the source's position restarted (failover,
``RESET MASTER``, a new cluster) and the change is newer after all. Each restart starts a new *epoch*
of the key: epochs apply in arrival order, the changes within one by sequence (see
:func:`~cdcflow.connectors.lakehouse.delta.batch.sequence_order`).

Only keys whose sequence goes backwards (within the batch in arrival order, or below the key's known
sequence) can restart; they are walked in Python, every other key stays in epoch 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.connectors.lakehouse.delta import key_index
from cdcflow.connectors.lakehouse.delta.batch import IDX, SEQ, ChangeBatch
from cdcflow.connectors.lakehouse.delta.key_state import STATE_RESTART, STATE_SEQ


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
    kid = key_index.group_ids(batch.data, key)
    if known is not None and known.num_rows:
        at = key_index.positions_in(batch.data, known, key)
        known_seqs = key_index.take_or_null(known.column(STATE_SEQ).cast(pa.large_binary()), at)
        known_restarts = key_index.take_or_null(known.column(STATE_RESTART).cast(pa.large_binary()), at)
    else:
        known_seqs = known_restarts = pa.nulls(n, pa.large_binary())
    seq = batch.data.column(SEQ).combine_chunks()
    # Arrival order within each key: where does the sequence step back, or fall below the known one?
    arrival = np.lexsort((np.asarray(batch.data.column(IDX), dtype=np.int64), kid))
    ordered = seq.take(pa.array(arrival))
    back = np.zeros(n, dtype=bool)
    if n > 1:
        step = pc.fill_null(pc.less(ordered.slice(1), ordered.slice(0, n - 1)), False)
        back[arrival[1:]] = np.asarray(step, dtype=bool) & (kid[arrival[1:]] == kid[arrival[:-1]])
    below = pc.fill_null(pc.less(seq, known_seqs), False)
    back |= np.asarray(below, dtype=bool)
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
