"""Restarted log positions: telling a change whose position went backwards from a late one.

A change whose sequence is lower than its key's last one is late, unless its ``restart_by`` value
(the commit timestamp) is newer than that change's: then the source's position restarted (failover,
``RESET MASTER``, a new cluster) and the change is newer after all. Each restart starts a new *epoch*
of the key: epochs apply in arrival order, the changes within one by sequence (see
:func:`~cdcflow.connectors.lakehouse.changes.sequence_order`).

Only keys whose sequence goes backwards (within the batch in arrival order, or below the key's known
sequence) can restart; they are walked in Python, every other key stays in epoch 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.connectors.lakehouse.changes import IDX, SEQ, ChangeBatch
from cdcflow.connectors.lakehouse.key_state import STATE_RESTART, STATE_SEQ

_KID, _POS = "_cdcflow_kid", "_cdcflow_pos"


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
    key = list(key)
    probe = batch.data.select(key).append_column(_POS, pa.array(np.arange(n, dtype=np.int64)))
    ids = probe.select(key).group_by(key, use_threads=False).aggregate([])
    ids = ids.append_column(_KID, pa.array(np.arange(ids.num_rows, dtype=np.int64)))
    if known is not None and known.num_rows:
        # The state table's types (string_view, binary) as the batch's, so the join and comparisons match.
        state = {c: known.column(c).cast(probe.schema.field(c).type) for c in key}
        state |= {c: known.column(c).cast(pa.large_binary()) for c in (STATE_SEQ, STATE_RESTART)}
        ids = ids.join(pa.table(state), key, use_threads=False)
    else:
        ids = ids.append_column(STATE_SEQ, pa.nulls(ids.num_rows, pa.large_binary()))
        ids = ids.append_column(STATE_RESTART, pa.nulls(ids.num_rows, pa.large_binary()))
    rows = probe.join(ids, key, use_threads=False).sort_by(_POS)
    kid = np.asarray(rows.column(_KID), dtype=np.int64)
    seq = batch.data.column(SEQ).combine_chunks()
    # Arrival order within each key: where does the sequence step back, or fall below the known one?
    arrival = np.lexsort((np.asarray(batch.data.column(IDX), dtype=np.int64), kid))
    ordered = seq.take(pa.array(arrival))
    back = np.zeros(n, dtype=bool)
    if n > 1:
        step = pc.fill_null(pc.less(ordered.slice(1), ordered.slice(0, n - 1)), False)
        back[arrival[1:]] = np.asarray(step, dtype=bool) & (kid[arrival[1:]] == kid[arrival[:-1]])
    below = pc.fill_null(pc.less(seq, rows.column(STATE_SEQ).combine_chunks()), False)
    back |= np.asarray(below, dtype=bool)
    suspects = np.unique(kid[back])
    if len(suspects) == 0:
        return result
    walk = arrival[np.isin(kid[arrival], suspects)]
    take = pa.array(walk)
    known_seq = rows.column(STATE_SEQ).take(take).to_pylist()
    known_restart = rows.column(STATE_RESTART).take(take).to_pylist()
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
