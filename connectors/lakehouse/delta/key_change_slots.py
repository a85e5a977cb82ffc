"""The key state's slots of primary-key changes: carries and claims under a new key, as rows and a table.

A carry (slot -2) is the old key's image, left when the old key's delete came first; a claim (slot -3)
is left when the create came first and took the image: ``_cdcflow_pending`` lists the columns still
waiting for the old key's last values.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa

from cdcflow.connectors.lakehouse.delta.key_links import Key, canonical, link_text, parse
from cdcflow.connectors.lakehouse.delta.key_state import (
    DELETED_AT,
    PENDING,
    SLOT,
    STATE_SEQ,
    TIMESTAMP,
    UPDATED_AT,
)
from cdcflow.connectors.lakehouse.delta.merge import OP

CARRY_FROM = "_cdcflow_carry_from"
"""The old key (JSON of its values) a carry or claim slot belongs to."""
OWED_BY, MOVED_TO = "_cdcflow_owed_by", "_cdcflow_moved_to"
"""On a carry, the key whose delete owes its ``_cdcflow_pending`` columns; on a claim, the key its wait
moved to."""
CARRY, CLAIM = -2, -3
"""The slots under a new key: the old key's image (its delete came first), or a claim (the create came
first and took the image)."""


@dataclass
class Claim:
    """A key's claim: the key whose delete gives its values, the columns still waiting for them, and
    the key the wait moved to when this key's row moved on (a key change of its own) first."""

    source: str
    pending: set[str]
    stored: bool
    """A claim slot of the key is in the key state (this claim's, or one this batch replaces)."""
    moved_to: Key | None = None
    dirty: bool = False
    removed: bool = False


def stored_claim(
    row: dict[str, Any], key: Sequence[str], key_types: Sequence[pa.DataType], batch_id: int, truncated: bool
) -> tuple[Key, Claim]:
    """The key of a claim slot read from the key state, and its claim (a truncate ended its wait)."""
    text, moved = row.get(PENDING), row.get(MOVED_TO)
    pending = json.loads(text) if text and not truncated else []
    moved_to = parse([moved], key, key_types, batch_id)[0] if moved and not truncated else None
    claim = Claim(str(row[CARRY_FROM]), {str(c) for c in pending}, stored=True, moved_to=moved_to)
    return tuple(row[c] for c in key), claim


@dataclass(frozen=True)
class SlotWriter:
    """Writes the slot rows of one batch: ``key`` and the data ``columns`` of its changes, at ``now``."""

    key: Sequence[str]
    columns: Sequence[str]
    now: datetime

    def row(
        self,
        new: Key,
        slot: int,
        op: str,
        *,
        source: Key | str | None = None,
        values: dict[str, Any] | None = None,
        sequence: bytes | None = None,
        pending: set[str] | None = None,
        owed_by: str | None = None,
        moved_to: Key | None = None,
    ) -> dict[str, Any]:
        """The slot ``slot`` of key ``new``: written (``op`` U) with these values, or removed (D)."""
        row = {c: v for c, v in (values or {}).items() if c in self.columns and c not in self.key}
        row |= dict(zip(self.key, new, strict=True))
        if op == "D":
            return {**row, SLOT: slot, OP: "D"}
        return {
            **row,
            SLOT: slot,
            STATE_SEQ: sequence,
            CARRY_FROM: canonical(source) if isinstance(source, tuple) else source,
            PENDING: json.dumps(sorted(pending)) if pending else None,
            OWED_BY: owed_by if pending else None,
            MOVED_TO: link_text(self.key, moved_to) if moved_to is not None else None,
            DELETED_AT: self.now,
            UPDATED_AT: self.now,
            OP: "U",
        }

    def table(self, rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table | None:
        """``rows`` as a key state update; ``schema`` has the types of the data columns."""
        if not rows:
            return None
        fields = [
            *(schema.field(c).with_nullable(c not in self.key) for c in self.columns),
            pa.field(SLOT, pa.int32(), nullable=False),
            pa.field(STATE_SEQ, pa.large_binary()),
            pa.field(CARRY_FROM, pa.string()),
            pa.field(PENDING, pa.string()),
            pa.field(OWED_BY, pa.string()),
            pa.field(MOVED_TO, pa.string()),
            pa.field(DELETED_AT, TIMESTAMP),
            pa.field(UPDATED_AT, TIMESTAMP),
            pa.field(OP, pa.string()),
        ]
        return pa.Table.from_pylist(rows, schema=pa.schema(fields))
