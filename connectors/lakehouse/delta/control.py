"""Control events in a changelog batch (TRUNCATE, messages, schema changes), split from its changes.

A row whose control column is set is an event about the table, not a change of a row: its row kind and
data columns are null. A ``truncate`` empties the table at its position in the batch (by sequence when
the batch has one, else by arrival): the batch's changes before it are void, the ones after it apply
to the empty table. Every other control event is counted and skipped.
"""

from __future__ import annotations

import enum
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.connectors.errors import ChangelogConsistencyError, ConnectorOptionError
from cdcflow.connectors.lakehouse.delta.backend import TableHandle
from cdcflow.connectors.lakehouse.delta.batch import IDX, SEQ, ChangeBatch, coordinates, describe
from cdcflow.connectors.lakehouse.delta.sequence import sortable

log = logging.getLogger(__name__)
TRUNCATE = "truncate"


class OnTruncate(enum.Enum):
    APPLY = "apply"
    IGNORE = "ignore"
    FAIL = "fail"

    @classmethod
    def parse(cls, value: str | OnTruncate) -> OnTruncate:
        if isinstance(value, OnTruncate):
            return value
        try:
            return cls(value.strip().lower())
        except ValueError:
            raise ConnectorOptionError(
                f"on_truncate must be one of apply, ignore, fail, not {value!r}"
            ) from None


@dataclass(frozen=True)
class Controls:
    """The control rows of a batch: kind, how many change rows arrived before each, where it came from."""

    kinds: list[str]
    before: np.ndarray
    origin: pa.Table
    sequence: pa.Array | None
    restart: pa.Array | None
    batch_id: int

    def where(self, index: int) -> str:
        return describe(self.origin, index, int(self.before[index]) + index, self.batch_id)


@dataclass(frozen=True)
class Truncation:
    """The batch's last TRUNCATE: the changes that sort before it are void."""

    before: int
    sequence: bytes | None
    restart: bytes | None
    where: str

    def void(self, batch: ChangeBatch) -> np.ndarray:
        """Which of ``batch``'s changes the truncate supersedes (by arrival, those without a sequence)."""
        arrival = np.asarray(batch.data.column(IDX), dtype=np.int64) < self.before
        if self.sequence is None or SEQ not in batch.data.schema.names:
            return arrival
        unsequenced = np.asarray(pc.is_null(batch.data.column(SEQ)), dtype=bool)
        seq = pc.fill_null(batch.data.column(SEQ), b"")
        earlier = _earlier(batch, self.sequence, self.restart, seq)
        same = np.asarray(pc.equal(seq, pa.scalar(self.sequence, pa.large_binary())), dtype=bool)
        return np.where(unsequenced, arrival, earlier | (same & arrival))


FLOOR = "cdcflow.truncated"
"""State table property: the last applied TRUNCATE's sequence (with ``sequence_by``)."""


@dataclass(frozen=True)
class Floor:
    """A TRUNCATE applied in an earlier batch: changes of any key that happened before it are late.

    Input partitions reach a batch at different positions, so changes from before a truncate can
    arrive after it (a TRUNCATE event has no key: it sits in any partition). Kept for the delete
    retention, like a tombstone.
    """

    sequence: bytes
    restart: bytes | None
    at: datetime

    def to_json(self) -> str:
        restart = self.restart.hex() if self.restart is not None else None
        return json.dumps({"sequence": self.sequence.hex(), "restart": restart, "at": self.at.isoformat()})

    @classmethod
    def of(cls, state: TableHandle | None, now: datetime, retention: timedelta) -> Floor | None:
        text = state.properties().get(FLOOR) if state is not None else None
        if not text:
            return None
        value = json.loads(text)
        restart = bytes.fromhex(value["restart"]) if value.get("restart") else None
        floor = cls(bytes.fromhex(value["sequence"]), restart, datetime.fromisoformat(value["at"]))
        return floor if floor.at >= now - retention else None

    def late(self, batch: ChangeBatch) -> np.ndarray:
        """Which of ``batch``'s changes happened before the truncate (a change with no sequence never)."""
        if SEQ not in batch.data.schema.names:
            return np.zeros(batch.num_rows, dtype=bool)
        return _earlier(batch, self.sequence, self.restart, batch.data.column(SEQ))


def _earlier(batch: ChangeBatch, sequence: bytes, restart: bytes | None, seq: pa.ChunkedArray) -> np.ndarray:
    """Changes whose sequence is lower, unless their ``restart_by`` is newer (the position restarted)."""
    lower = pc.fill_null(pc.less(seq, pa.scalar(sequence, pa.large_binary())), False)
    if restart is not None and batch.restart is not None:
        newer = pc.fill_null(pc.greater(batch.restart, pa.scalar(restart, pa.large_binary())), False)
        lower = pc.and_(lower, pc.invert(newer))
    return np.asarray(lower, dtype=bool)


def split_controls(
    table: pa.Table,
    control_column: str | None,
    sequence_by: str | None,
    restart_by: str | None,
    batch_id: int,
) -> tuple[pa.Table, Controls | None]:
    """``table``'s change rows, and its control rows (None when it has none)."""
    if control_column is None or control_column not in table.schema.names:
        return table, None
    marks = table.column(control_column)
    is_control = np.asarray(pc.is_valid(marks), dtype=bool)
    if not is_control.any():
        return table, None
    at = np.flatnonzero(is_control)
    take = pa.array(at)
    sequence = restart = None
    if sequence_by is not None and sequence_by in table.schema.names:
        sequence = sortable(table.column(sequence_by).take(take), sequence_by)
    if restart_by is not None and restart_by in table.schema.names:
        restart = sortable(table.column(restart_by).take(take), restart_by)
    controls = Controls(
        kinds=[str(kind).strip().lower() for kind in marks.take(take).to_pylist()],
        before=at - np.arange(len(at)),
        origin=coordinates(table).take(take),
        sequence=sequence,
        restart=restart,
        batch_id=batch_id,
    )
    return table.filter(pa.array(~is_control)), controls


@dataclass
class ControlOutcome:
    truncation: Truncation | None = None
    truncates: int = 0
    others: int = 0


def decide(controls: Controls | None, on_truncate: OnTruncate) -> ControlOutcome:
    """Counts the control events and picks the truncate to apply (the last one), or refuses one."""
    outcome = ControlOutcome()
    if controls is None:
        return outcome
    truncates = [i for i, kind in enumerate(controls.kinds) if kind == TRUNCATE]
    outcome.truncates, outcome.others = len(truncates), len(controls.kinds) - len(truncates)
    if outcome.others:
        log.info(
            "batch %d: %d control event(s) skipped (%s)",
            controls.batch_id,
            outcome.others,
            ", ".join(sorted({k for k in controls.kinds if k != TRUNCATE})),
        )
    if not truncates:
        return outcome
    if on_truncate is OnTruncate.FAIL:
        raise ChangelogConsistencyError(
            f"{controls.where(truncates[0])}: the source table was truncated; on_truncate='fail' refuses "
            "it: set on_truncate='apply' to empty the Delta table too, or 'ignore' to keep its rows"
        )
    if on_truncate is OnTruncate.IGNORE:
        log.warning(
            "batch %d: %d TRUNCATE event(s) ignored (on_truncate='ignore'), first at %s; the Delta table "
            "keeps the rows the source deleted",
            controls.batch_id,
            len(truncates),
            controls.where(truncates[0]),
        )
        return outcome
    sequences = (
        controls.sequence.to_pylist() if controls.sequence is not None else [None] * len(controls.kinds)
    )
    last = max(truncates, key=lambda i: (sequences[i] or b"", controls.before[i], i))
    restart = controls.restart[last].as_py() if controls.restart is not None else None
    outcome.truncation = Truncation(
        int(controls.before[last]), sequences[last], restart, controls.where(last)
    )
    log.warning(
        "batch %d: TRUNCATE at %s empties the Delta table", controls.batch_id, outcome.truncation.where
    )
    return outcome
