"""Keyed state with processing-time TTL (spec 4.3.2, 4.3.3).

The engine keeps, per upsert key, the last image it emitted and (to_changelog) a buffered ``-U``.
Stores are pluggable: the in-memory store serves plain Python use; the Spark connectors adapt
Spark's state store to the same protocol.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

Clock = Callable[[], float]
"""Processing time as epoch seconds."""


@dataclass(slots=True)
class KeyState:
    """What the engine remembers about one key.

    ``image`` is the last row emitted for the key (None: the key is absent), ``pending_before`` a
    ``-U`` waiting for its ``+U``, and ``expires_at`` the processing time at which the entry is
    gone (None: kept forever).
    """

    image: dict[str, Any] | None = None
    pending_before: dict[str, Any] | None = None
    expires_at: float | None = None

    @property
    def is_empty(self) -> bool:
        return self.image is None and self.pending_before is None


class StateStore(Protocol):
    """Where keyed state lives. A key is the ``partition_by`` value (a tuple for several columns)."""

    def get(self, key: Hashable) -> KeyState | None: ...

    def put(self, key: Hashable, state: KeyState) -> None: ...

    def delete(self, key: Hashable) -> None: ...

    def items(self) -> Iterator[tuple[Hashable, KeyState]]: ...


class InMemoryStateStore:
    """A dict-backed :class:`StateStore`."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, KeyState] = {}

    def get(self, key: Hashable) -> KeyState | None:
        return self._entries.get(key)

    def put(self, key: Hashable, state: KeyState) -> None:
        self._entries[key] = state

    def delete(self, key: Hashable) -> None:
        self._entries.pop(key, None)

    def items(self) -> Iterator[tuple[Hashable, KeyState]]:
        return iter(list(self._entries.items()))

    def __len__(self) -> int:
        return len(self._entries)


class TtlState:
    """A :class:`StateStore` seen through a processing-time TTL.

    An entry lives ``ttl_seconds`` after it was last written; the engine writes a key's entry on
    every record for that key, so this is the spec's "inactivity since last access".
    ``ttl_seconds`` of 0 keeps it forever.
    Expiry is checked on access, and every ``sweep_every`` writes :meth:`expire` frees the memory
    of keys that were not seen again.
    """

    sweep_every = 10_000

    def __init__(self, store: StateStore, ttl_seconds: float, clock: Clock = time.time) -> None:
        self.store = store
        self.ttl_seconds = ttl_seconds
        self.clock = clock
        self.expired = 0
        self._writes = 0

    def get(self, key: Hashable) -> KeyState | None:
        state = self.store.get(key)
        if state is None:
            return None
        if state.expires_at is not None and self.clock() >= state.expires_at:
            self.store.delete(key)
            self.expired += 1
            return None
        return state

    def put(self, key: Hashable, state: KeyState) -> None:
        if state.is_empty:
            self.store.delete(key)
            return
        if self.ttl_seconds > 0:
            state.expires_at = self.clock() + self.ttl_seconds
            self._writes += 1
            if self._writes % self.sweep_every == 0:
                self.expire()
        self.store.put(key, state)

    def delete(self, key: Hashable) -> None:
        self.store.delete(key)

    def items(self) -> Iterator[tuple[Hashable, KeyState]]:
        return self.store.items()

    def expire(self) -> int:
        """Drop every entry whose time is up; returns how many went."""
        now = self.clock()
        gone = 0
        for key, state in self.store.items():
            if state.expires_at is not None and now >= state.expires_at:
                self.store.delete(key)
                gone += 1
        self.expired += gone
        return gone
