"""Row kinds and changelog modes (spec 2.1)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from cdcflow.core.errors import ChangelogValidationError


class RowKind(Enum):
    """The kind of change a row carries, with Flink's short strings as values."""

    INSERT = "+I"
    UPDATE_BEFORE = "-U"
    UPDATE_AFTER = "+U"
    DELETE = "-D"

    @property
    def short_string(self) -> str:
        return self.value

    @property
    def is_retraction(self) -> bool:
        """``-U`` and ``-D`` take a row away; ``+I`` and ``+U`` add one."""
        return self in (RowKind.UPDATE_BEFORE, RowKind.DELETE)

    @classmethod
    def from_name(cls, name: str) -> RowKind:
        """Parse ``INSERT``, ``UPDATE_BEFORE``, ``UPDATE_AFTER`` or ``DELETE``."""
        try:
            return cls[name]
        except KeyError:
            raise ChangelogValidationError(
                f"'{name}' is not a row kind name: use one of {', '.join(k.name for k in cls)}"
            ) from None

    @classmethod
    def from_short_string(cls, short: str) -> RowKind:
        """Parse ``+I``, ``-U``, ``+U`` or ``-D``."""
        try:
            return cls(short)
        except ValueError:
            raise ChangelogValidationError(
                f"'{short}' is not a row kind: use one of {', '.join(k.value for k in cls)}"
            ) from None

    def __str__(self) -> str:
        return self.value


INS, UB, UA, DEL = RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE
"""Short names for the engine's own code."""

_ALL = frozenset(RowKind)


@dataclass(frozen=True)
class ChangelogMode:
    """The set of row kinds a stream may carry, and whether its deletes carry only the key.

    ``append`` is {+I}; ``upsert`` is {+I, +U, -D} (partial image: no -U); ``retract`` is all four
    kinds (full image). ``key_only_deletes`` marks partial deletes (spec 2.1.4).
    """

    kinds: frozenset[RowKind]
    key_only_deletes: bool = False

    @classmethod
    def append(cls) -> ChangelogMode:
        return cls(frozenset({RowKind.INSERT}))

    @classmethod
    def upsert(cls, *, key_only_deletes: bool = True) -> ChangelogMode:
        return cls(frozenset({RowKind.INSERT, RowKind.UPDATE_AFTER, RowKind.DELETE}), key_only_deletes)

    @classmethod
    def retract(cls) -> ChangelogMode:
        return cls(_ALL)

    def contains(self, kind: RowKind) -> bool:
        return kind in self.kinds

    @property
    def is_insert_only(self) -> bool:
        return self.kinds == {RowKind.INSERT}

    @property
    def is_upsert(self) -> bool:
        """Updates without UPDATE_BEFORE: consumers must relate rows by an upsert key."""
        return RowKind.UPDATE_AFTER in self.kinds and RowKind.UPDATE_BEFORE not in self.kinds

    def __str__(self) -> str:
        kinds = ", ".join(k.value for k in RowKind if k in self.kinds)
        suffix = " (partial deletes)" if self.key_only_deletes and RowKind.DELETE in self.kinds else ""
        return f"[{kinds}]{suffix}"
