"""Values a change does not carry (Debezium's unchanged TOAST columns) and primary-key changes.

A column listed in a change's unavailable columns has no value in that change: it keeps the key's
previous value, the latest earlier change of the key in the batch that has it, else the target's
current row (the merge reads it: :func:`~cdcflow.connectors.lakehouse.delta.tables.merge_marked`'s
``unavailable``). After a delete of the key in the batch there is no previous value: the column lands
NULL and is reported.

A primary-key change arrives as a delete of the old key (with the new key) and a create of the new key
(with the old key), in either order, possibly in different batches. The create's unavailable columns
take the old key's last image before its delete. When both are in the batch they pair here; otherwise
the first to arrive leaves a slot in the key state under the new key: the delete its row's image (a
carry), the create a claim. The second finds the slot and removes it.

A create that arrives first takes the old key's image as it is then, which may be behind: the old key's
partition may not have delivered its last changes yet. So the claim lists the create's unavailable
columns as pending; each later change of the new key that carries one of them takes it off (a delete
of the new key empties the list). When the old key's delete arrives, its last image gives the columns
still pending, written to the new key's row in the same commit: on the new key's changes of the batch,
else as a patch row for the target (only when the target has the key). When the new key's row moves on
again (a key change of its own) while it waits, the wait moves with it: the claim keeps a pointer to
the next key, which waits in its turn (its own claim, or a mark on the carry its create will take), and
the old key's delete follows the pointers.

Only the changes of keys involved are walked in Python (:mod:`.fill`); a batch without any stays
columnar. This module holds what the applier asks before and gets after: the links, which changes need
the walk, the open claims, the :class:`Filled` batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.connectors.lakehouse.delta.batch import IDX, ChangeBatch
from cdcflow.connectors.lakehouse.delta.key_change_slots import CLAIM
from cdcflow.connectors.lakehouse.delta.key_state import PENDING, SLOT

KEPT_COLUMNS = "_cdcflow_unavailable"
"""The merge source's ``list<string>`` column: the columns of a row that keep the target's value."""


@dataclass(frozen=True)
class Links:
    """Where a batch says which columns are unavailable and which keys a key change links."""

    unavailable: str | None = None
    old_key: str | None = None
    new_key: str | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(c for c in (self.unavailable, self.old_key, self.new_key) if c is not None)


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


def open_claims(known: pa.Table | None) -> pa.Table | None:
    """The claims among ``known`` (key state rows) that still wait for values (None when none)."""
    if known is None or PENDING not in known.schema.names or not known.num_rows:
        return None
    waiting = pc.and_(pc.equal(known.column(SLOT), CLAIM), pc.is_valid(known.column(PENDING)))
    claims = known.filter(pc.fill_null(waiting, False))
    return claims if claims.num_rows else None


def needs_filling(
    batch: ChangeBatch, links: Links, key: Sequence[str] = (), claims: pa.Table | None = None
) -> np.ndarray | None:
    """The changes that lack values, link keys, or change a key with an open claim (None when there are
    none: the columnar path)."""
    extra = batch.extra
    flagged = np.zeros(batch.num_rows, dtype=bool)
    if links.unavailable in extra.schema.names:
        flagged |= np.asarray(
            pc.fill_null(pc.greater(pc.list_value_length(extra[links.unavailable]), 0), False)
        )
    for name in (links.old_key, links.new_key):
        if name in extra.schema.names:
            flagged |= np.asarray(pc.is_valid(extra[name]), dtype=bool)
    if claims is not None and batch.num_rows:
        names = list(key)
        probe = batch.data.select(names).append_column("_cdcflow_pos", batch.data.column(IDX))
        wanted = pa.table({c: claims.column(c).cast(probe.schema.field(c).type) for c in names})
        hits = probe.join(wanted.group_by(names).aggregate([]), names, use_threads=False)
        flagged[np.asarray(hits.column("_cdcflow_pos"), dtype=np.int64)] = True
    return flagged if flagged.any() else None
