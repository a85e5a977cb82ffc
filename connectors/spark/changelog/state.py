"""Each key's engine state on Spark's state store: the codec of a :class:`~cdcflow.core.KeyState` and the
engine's store over the ``ValueState`` of the key Spark is processing."""

from __future__ import annotations

import pickle
from collections.abc import Hashable, Iterator
from typing import Any

from pyspark.sql import types as st
from pyspark.sql.streaming.stateful_processor import ValueState

from cdcflow.connectors.spark.changelog.conversion import Record
from cdcflow.core.state import KeyState

STATE_SCHEMA = st.StructType([st.StructField("key_state", st.BinaryType(), False)])
"""One pickled :class:`KeyState` per key: images keep their exact Python values (tz-aware times, Decimals)."""


class StateCodec:
    """:class:`KeyState` ↔ bytes; an image with the expected columns is stored as a bare tuple.

    Next to the state goes the time (ms) of the timer that will free it once expired, if one is set.
    """

    def __init__(self, fields: tuple[str, ...]) -> None:
        self.fields = fields

    def encode(self, state: KeyState, timer_ms: int | None = None) -> bytes:
        image, pending = self._pack(state.image), self._pack(state.pending_before)
        return pickle.dumps((image, pending, state.expires_at, timer_ms), 5)

    def decode(self, data: bytes) -> tuple[KeyState, int | None]:
        image, pending, expires_at, *rest = pickle.loads(data)  # noqa: S301 - written by encode, in our checkpoint
        timer_ms = rest[0] if rest else None
        return KeyState(self._unpack(image), self._unpack(pending), expires_at), timer_ms

    def _pack(self, image: Record | None) -> tuple[Any, ...] | Record | None:
        if image is not None and tuple(image) == self.fields:
            return tuple(image.values())
        return image

    def _unpack(self, packed: tuple[Any, ...] | Record | None) -> Record | None:
        if isinstance(packed, tuple):
            return dict(zip(self.fields, packed, strict=True))
        return packed


class ValueStateStore:
    """The engine's :class:`StateStore` over the ``ValueState`` of the key Spark is processing.

    Spark scopes the value to the current grouping key, which is the engine's key, so the ``key``
    arguments are not needed to address it. Reads and writes go to a cache for the duration of one
    key's rows; :meth:`commit` writes the result back once.
    """

    def __init__(self, value: ValueState, codec: StateCodec) -> None:
        self._value = value
        self._codec = codec
        self.start()

    def start(self) -> None:
        """A new grouping key: forget the previous key's state."""
        self._loaded = False
        self._dirty = False
        self._state: KeyState | None = None
        self._timer_ms: int | None = None
        self._key: Hashable = None

    def _load(self) -> None:
        if not self._loaded:
            stored = self._value.get()
            if stored is not None:
                self._state, self._timer_ms = self._codec.decode(stored[0])
            self._loaded = True

    def get(self, key: Hashable) -> KeyState | None:
        self._key = key
        self._load()
        return self._state

    def put(self, key: Hashable, state: KeyState) -> None:
        self._load()
        self._key, self._state, self._dirty = key, state, True

    def delete(self, key: Hashable) -> None:
        self._key = key
        self.clear()

    def items(self) -> Iterator[tuple[Hashable, KeyState]]:
        state = self.get(self._key)
        return iter([(self._key, state)] if state is not None else [])

    @property
    def current(self) -> KeyState | None:
        """The state of the key Spark is processing."""
        self._load()
        return self._state

    def clear(self) -> None:
        """Forget the key's state (and its expiry timer) at :meth:`commit`."""
        self._load()
        self._state, self._timer_ms, self._dirty = None, None, True

    @property
    def timer_ms(self) -> int | None:
        """The timer set to free this key's state when it expires (None: none is set)."""
        self._load()
        return self._timer_ms

    @timer_ms.setter
    def timer_ms(self, value: int | None) -> None:
        self._load()
        self._timer_ms, self._dirty = value, True

    def commit(self) -> None:
        if not self._dirty:
            return
        if self._state is None:
            self._value.clear()
        else:
            self._value.update((self._codec.encode(self._state, self._timer_ms),))
        self._dirty = False
