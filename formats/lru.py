"""A bounded mapping that forgets its least recently used entry: the decoders' per-message caches.

A decoder caches what it derives from a message's own description (a Debezium schema block, a Canal
``mysqlType`` map, a writer schema) and the last image of each key (unchanged-TOAST filling). Messages
decide how many distinct entries there are, so every such cache has a fixed size.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: Distinct schema descriptions a decoder keeps converters for (a Debezium schema block or Avro writer
#: schema, a Canal ``mysqlType`` map): about 6 KB each, so at most ~6 MB. A topic with more distinct
#: schemas than this still decodes, rebuilding the converters of a schema that was forgotten.
SCHEMA_CACHE_SIZE = 1024
#: Keys whose last image a Debezium decoder keeps to fill unchanged-TOAST values
#: (``unavailable-values=FILL``): about 0.5 KB each plus the row's values. Beyond it the least recently
#: changed key is forgotten and its next unchanged value is reported unavailable instead of filled.
FILL_STATE_KEYS = 10_000


#: Writes of :meth:`LruCache.put_all_later` that wait to be settled: at most this many blocks, of at
#: most this many times the cache's size in keys.
PENDING_BLOCKS, PENDING_SIZES = 8, 4


class LruCache(Generic[K, V]):
    """At most ``size`` entries; reading or writing an entry makes it the most recently used."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"an LRU cache holds at least one entry, not {size}")
        self.size = size
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._pending: list[tuple[Sequence[K], Callable[[list[int]], list[V]]]] = []
        self._pending_keys = 0

    def __getstate__(self) -> dict[str, Any]:
        self._settle()
        return self.__dict__.copy()

    def get(self, key: K) -> V | None:
        self._settle()
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._settle()
        self._entries[key] = value
        self._entries.move_to_end(key)
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def pop(self, key: K) -> None:
        self._settle()
        self._entries.pop(key, None)

    def entries(self) -> OrderedDict[K, V]:
        """A copy of the entries, least recently used first."""
        self._settle()
        return OrderedDict(self._entries)

    def put_all(self, keys: Sequence[K], values: Sequence[V]) -> None:
        """:meth:`put` each of ``keys`` (distinct) its value, in order: what the cache then holds is its
        newest entries that are not among ``keys``, then the last of ``keys``, ``size`` in all."""
        self._settle()
        self._put_all(keys, values)

    def put_all_later(self, keys: Sequence[K], values: Callable[[list[int]], list[V]]) -> None:
        """:meth:`put_all` of ``keys`` (distinct), whose values ``values`` makes for the positions of
        the keys it is asked for when the cache is next read or written: of successive blocks of keys
        only the values that stay (the newest ``size`` keys) are ever made."""
        self._pending.append((keys, values))
        self._pending_keys += len(keys)
        if len(self._pending) > PENDING_BLOCKS or self._pending_keys > PENDING_SIZES * self.size:
            self._settle()

    def _settle(self) -> None:
        """Apply the pending writes as successive :meth:`put_all` calls would."""
        if not self._pending:
            return
        pending = self._pending
        staying: dict[K, tuple[int, int]] = {}  # key -> its newest write: (block, position)
        for block in range(len(pending) - 1, -1, -1):
            keys = pending[block][0]
            for position in range(len(keys) - 1, -1, -1):
                staying.setdefault(keys[position], (block, position))
                if len(staying) == self.size:
                    break
            if len(staying) == self.size:
                break
        by_block: dict[int, list[tuple[int, K]]] = {}
        for key, (block, position) in staying.items():
            by_block.setdefault(block, []).append((position, key))
        keys_made: list[K] = []
        values_made: list[V] = []
        for block in sorted(by_block):
            found = sorted(by_block[block])
            keys_made += [key for _, key in found]
            values_made += pending[block][1]([position for position, _ in found])
        self._pending, self._pending_keys = [], 0  # once made: a failure leaves them waiting, and raised
        self._put_all(keys_made, values_made)

    def _put_all(self, keys: Sequence[K], values: Sequence[V]) -> None:
        keep = self.size - len(keys)
        kept: list[K] = []
        if keep > 0:
            fresh = set(keys)
            for key in reversed(self._entries):
                if key not in fresh:
                    kept.append(key)
                    if len(kept) == keep:
                        break
        entries = OrderedDict((key, self._entries[key]) for key in reversed(kept))
        entries.update(zip(keys[-self.size :], values[-self.size :], strict=True))
        self._entries = entries

    def replace(self, entries: OrderedDict[K, V]) -> None:
        """Hold ``entries`` (least recently used first, at most ``size``; taken, not copied) instead."""
        if len(entries) > self.size:
            raise ValueError(f"{len(entries)} entries for an LRU cache of {self.size}")
        self._pending, self._pending_keys = [], 0
        self._entries = entries

    def __len__(self) -> int:
        self._settle()
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        self._settle()
        return key in self._entries
