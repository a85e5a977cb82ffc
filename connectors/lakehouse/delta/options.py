"""How a changelog lands in its Delta table: the applier's options, parsed and checked once, on the driver."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import timedelta

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.lakehouse.delta.batch import OnTruncate


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


@dataclass(frozen=True)
class Links:
    """Where a batch says which columns are unavailable and which keys a key change links."""

    unavailable: str | None = None
    old_key: str | None = None
    new_key: str | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(c for c in (self.unavailable, self.old_key, self.new_key) if c is not None)
