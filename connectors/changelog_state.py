"""The engine (:mod:`cdcflow.core`) run inside Spark: per key on Spark's state store, or per partition.

Streaming queries run :class:`ChangelogProcessor` under ``transformWithState``: each key's
:class:`~cdcflow.core.KeyState` lives in a ``ValueState`` (so it is checkpointed and survives a
restart), and :class:`FromChangelog` / :class:`ToChangelog` run unchanged against it. Batch
DataFrames run the same conversion with ``mapInArrow`` over partitions that hold each key's rows
together and in order, then end the input.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from pyspark.sql import Row
from pyspark.sql import types as st
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    ValueState,
)

from cdcflow.connectors.changelog_layout import FrameLayout
from cdcflow.core.errors import ChangelogDataError
from cdcflow.core.from_envelopes import FromChangelog
from cdcflow.core.model import Change
from cdcflow.core.params import FromChangelogParams, ToChangelogParams
from cdcflow.core.rowkind import RowKind
from cdcflow.core.state import Clock, InMemoryStateStore, KeyState, StateStore
from cdcflow.core.to_envelopes import ToChangelog

if TYPE_CHECKING:
    import pyarrow as pa

Record = dict[str, Any]

STATE_SCHEMA = st.StructType([st.StructField("key_state", st.BinaryType(), False)])
"""One pickled :class:`KeyState` per key: images keep their exact Python values (tz-aware times, Decimals)."""

_ROW_KINDS = {kind.value: kind for kind in RowKind}

TTL_GRACE_MS = 1000
"""Spark's own TTL frees state a little after the engine's TTL has already ignored it."""


class Conversion(Protocol):
    """One direction of the engine, fed with rows as dicts and returning output rows as dicts."""

    @property
    def layout(self) -> FrameLayout: ...

    def engine(self, clock: Clock, store: StateStore) -> Any: ...

    def feed(self, engine: Any, record: Record) -> list[Record]: ...

    def finish(self, engine: Any) -> list[Record]: ...


@dataclass(frozen=True)
class FromRows:
    """FROM_CHANGELOG: envelope rows in, changes out as image columns plus the row kind column."""

    params: FromChangelogParams
    layout: FrameLayout

    def engine(self, clock: Clock, store: StateStore) -> FromChangelog:
        return FromChangelog(self.params, clock=clock, state_store=store)

    def feed(self, engine: FromChangelog, record: Record) -> list[Record]:
        column = self.layout.row_kind_column
        return [{**change.row, column: change.kind.value} for change in engine.process(record)]

    def finish(self, engine: FromChangelog) -> list[Record]:
        column = self.layout.row_kind_column
        return [{**change.row, column: change.kind.value} for change in engine.flush()]


@dataclass(frozen=True)
class ToRows:
    """TO_CHANGELOG: changelog rows (with their row kind column) in, envelope records out."""

    params: ToChangelogParams
    layout: FrameLayout

    def engine(self, clock: Clock, store: StateStore) -> ToChangelog:
        return ToChangelog(self.params, clock=clock, state_store=store)

    def feed(self, engine: ToChangelog, record: Record) -> list[Record]:
        column = self.layout.row_kind_column
        short = record.pop(column)
        kind = _ROW_KINDS.get(short)
        if kind is None:
            raise ChangelogDataError(f"{short!r} is not a row kind: use one of +I, -U, +U, -D", field=column)
        return engine.process(Change(kind, record))

    def finish(self, engine: ToChangelog) -> list[Record]:
        return engine.flush()


class Prepared(NamedTuple):
    """A record as the engine will see it, with its grouping key and ``sequence_by`` values."""

    key: tuple[Any, ...]
    sequence: tuple[Any, ...]
    record: Record


def prepare(
    conversion: Conversion, rows: Iterable[Mapping[str, Any]], *, sort: bool, stateful: bool = True
) -> list[Prepared]:
    """The rows without hidden columns, sorted by ``sequence_by`` (stably) if ``sort``.

    A stateful conversion needs every row's position: a NULL ``sequence_by`` value fails.
    """
    layout = conversion.layout
    hidden = set(layout.hidden)
    prepared = [
        Prepared(
            tuple(row[name] for name in layout.key_columns),
            tuple(row[name] for name in layout.sequence_by),
            {k: v for k, v in row.items() if k not in hidden},
        )
        for row in rows
    ]
    if layout.sequence_by and stateful:
        for item in prepared:
            if any(value is None for value in item.sequence):
                raise ChangelogDataError(
                    f"partition_by key {list(item.key)}: sequence_by {list(layout.sequence_by)} is NULL; "
                    "every row needs its position in the stream to be ordered"
                )
        if sort:
            prepared.sort(key=lambda item: item.sequence)
    return prepared


class StateCodec:
    """:class:`KeyState` ↔ bytes; an image with the expected columns is stored as a bare tuple."""

    def __init__(self, fields: tuple[str, ...]) -> None:
        self.fields = fields

    def encode(self, state: KeyState) -> bytes:
        return pickle.dumps((self._pack(state.image), self._pack(state.pending_before), state.expires_at), 5)

    def decode(self, data: bytes) -> KeyState:
        image, pending, expires_at = pickle.loads(data)  # noqa: S301 - written by encode, in our checkpoint
        return KeyState(self._unpack(image), self._unpack(pending), expires_at)

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
        self._key: Hashable = None

    def get(self, key: Hashable) -> KeyState | None:
        self._key = key
        if not self._loaded:
            stored = self._value.get()
            self._state = self._codec.decode(stored[0]) if stored is not None else None
            self._loaded = True
        return self._state

    def put(self, key: Hashable, state: KeyState) -> None:
        self._key, self._state, self._loaded, self._dirty = key, state, True, True

    def delete(self, key: Hashable) -> None:
        self._key, self._state, self._loaded, self._dirty = key, None, True, True

    def items(self) -> Iterator[tuple[Hashable, KeyState]]:
        state = self.get(self._key)
        return iter([(self._key, state)] if state is not None else [])

    def commit(self) -> None:
        if not self._dirty:
            return
        if self._state is None:
            self._value.clear()
        else:
            self._value.update((self._codec.encode(self._state),))
        self._dirty = False


class ChangelogProcessor(StatefulProcessor):
    """``transformWithState`` processor running one conversion per grouping key (``partition_by``)."""

    def __init__(self, conversion: Conversion, state_name: str, ttl_seconds: float | None) -> None:
        self.conversion = conversion
        self.state_name = state_name
        self.ttl_seconds = ttl_seconds

    def init(self, handle: StatefulProcessorHandle) -> None:
        ttl_ms = int(self.ttl_seconds * 1000) + TTL_GRACE_MS if self.ttl_seconds else None
        value = handle.getValueState(self.state_name, STATE_SCHEMA, ttl_ms)
        self._store = ValueStateStore(value, StateCodec(self.conversion.layout.image_fields))
        self._now = 0.0
        self._engine = self.conversion.engine(self._clock, self._store)

    def _clock(self) -> float:
        return self._now

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Row]:
        # Processing time is the micro-batch's: every row of a batch sees the same clock.
        self._now = timerValues.getCurrentProcessingTimeInMs() / 1000
        self._store.start()
        conversion = self.conversion
        prepared = prepare(conversion, (r.asDict() for r in rows), sort=True)
        output = run_rows(conversion, self._engine, prepared)
        self._store.commit()
        return iter([Row(**record) for record in output])

    def close(self) -> None:
        pass


def run_rows(conversion: Conversion, engine: Any, rows: list[Prepared]) -> list[Record]:
    """Feed records to the engine; a record it rejects fails with its key and position named."""
    output: list[Record] = []
    for row in rows:
        try:
            output.extend(conversion.feed(engine, row.record))
        except ChangelogDataError as error:
            where = [f"partition_by key {list(row.key)}"] if row.key else []
            if row.sequence:
                where.append(f"sequence_by {list(row.sequence)}")
            raise type(error)(f"{', '.join(where) or 'record'}: {error.reason}", field=error.field) from error
    return output


def partition_function(
    conversion: Conversion, schema: pa.Schema, *, stateful: bool
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``mapInArrow`` function running the engine over one partition of a batch DataFrame, in order.

    A stateful conversion gets each key's rows together, ordered by ``sequence_by`` (the caller sorts
    the partition); the end of the partition is the end of the input for its keys.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        now = time.time()  # one processing time for the whole batch: nothing expires within it
        engine = conversion.engine(lambda: now, InMemoryStateStore())
        for batch in batches:
            rows = prepare(conversion, batch.to_pylist(), sort=False, stateful=stateful)
            yield pa.RecordBatch.from_pylist(run_rows(conversion, engine, rows), schema=schema)
        tail = conversion.finish(engine)
        if tail:
            yield pa.RecordBatch.from_pylist(tail, schema=schema)

    return run
