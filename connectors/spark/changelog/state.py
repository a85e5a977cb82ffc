"""The engine (:mod:`cdcflow.core`) run inside Spark: per key on Spark's state store, or per partition.

Streaming queries run :class:`ChangelogProcessor` under ``transformWithState``: each key's
:class:`~cdcflow.core.KeyState` lives in a ``ValueState`` (so it is checkpointed and survives a
restart), and :class:`FromChangelog` / :class:`ToChangelog` run unchanged against it. With an
event-time column the rows wait in a ``ListState`` until Spark's watermark passes them; an
event-time timer then hands them to the engine, which sorts and compacts them as it does at a
watermark. Batch DataFrames run the same conversion with ``mapInArrow`` over partitions that hold
each key's rows together and in order, then end the input.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from pyspark.sql import Row
from pyspark.sql import types as st
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    ListState,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    ValueState,
)

from cdcflow.connectors.spark.changelog.layout import FrameLayout
from cdcflow.core.errors import ChangelogDataError
from cdcflow.core.from_changelog_engine import FromChangelog
from cdcflow.core.model import Change, Watermark
from cdcflow.core.params import FromChangelogParams, ToChangelogParams
from cdcflow.core.rowkind import RowKind
from cdcflow.core.state import Clock, InMemoryStateStore, KeyState, StateStore
from cdcflow.core.to_changelog_engine import ToChangelog

if TYPE_CHECKING:
    import pyarrow as pa

Record = dict[str, Any]

STATE_SCHEMA = st.StructType([st.StructField("key_state", st.BinaryType(), False)])
"""One pickled :class:`KeyState` per key: images keep their exact Python values (tz-aware times, Decimals)."""

BUFFER_SCHEMA = st.StructType(
    [st.StructField("event_time_us", st.LongType(), False), st.StructField("record", st.BinaryType(), False)]
)
"""A row waiting for the watermark: its event time and the pickled record, in arrival order."""

_ROW_KINDS = {kind.value: kind for kind in RowKind}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Conversion(Protocol):
    """One direction of the engine, fed with rows as dicts and returning output rows as dicts."""

    @property
    def layout(self) -> FrameLayout: ...

    def engine(self, clock: Clock, store: StateStore) -> Any: ...

    def feed(self, engine: Any, record: Record) -> list[Record]: ...

    def finish(self, engine: Any) -> list[Record]: ...

    def advance(self, engine: Any, watermark: int) -> list[Record]: ...


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

    def advance(self, engine: FromChangelog, watermark: int) -> list[Record]:
        column = self.layout.row_kind_column
        return [
            {**change.row, column: change.kind.value} for change in engine.on_watermark(Watermark(watermark))
        ]


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
        if short is None:
            raise ChangelogDataError("the row kind is NULL: each change needs +I, -U, +U or -D", field=column)
        kind = _ROW_KINDS.get(short)
        if kind is None:
            raise ChangelogDataError(f"{short!r} is not a row kind: use one of +I, -U, +U, -D", field=column)
        return engine.process(Change(kind, record))

    def finish(self, engine: ToChangelog) -> list[Record]:
        return engine.flush()

    def advance(self, engine: ToChangelog, watermark: int) -> list[Record]:
        return engine.on_watermark(Watermark(watermark))


class Prepared(NamedTuple):
    """A record as the engine will see it, with its grouping key, ``sequence_by`` values and, on a
    stream with an event-time column, that time in microseconds (also the record's time value)."""

    key: tuple[Any, ...]
    sequence: tuple[Any, ...]
    record: Record
    time: int | None = None


def prepare(
    conversion: Conversion, rows: Iterable[Mapping[str, Any]], *, sort: bool, stateful: bool = True
) -> list[Prepared]:
    """The rows without hidden columns, sorted by ``sequence_by`` (stably) if ``sort``.

    A stateful conversion needs every row's position: a NULL ``sequence_by`` value fails. On a stream
    the engine sees the event time as epoch microseconds, the unit of Spark's watermark.
    """
    layout = conversion.layout
    hidden = set(layout.hidden)
    time_column, time_values = layout.time_column, layout.time_values
    prepared = []
    for row in rows:
        record = {k: v for k, v in row.items() if k not in hidden}
        time = None
        if time_column is not None and time_values is not None:
            time = row[time_values]
            record[time_column] = time
        prepared.append(
            Prepared(
                tuple(row[name] for name in layout.key_columns),
                tuple(row[name] for name in layout.sequence_by),
                record,
                time,
            )
        )
    if layout.sequence_by and stateful:
        for item in prepared:
            if any(value is None for value in item.sequence):
                raise ChangelogDataError(
                    f"partition_by key {list(item.key)}: sequence_by {list(layout.sequence_by)} is NULL; "
                    "every row needs its position in the stream to be ordered"
                )
        if sort:
            prepared.sort(key=lambda item: item.sequence)
    if time_values is not None:
        for item in prepared:
            if item.time is None:
                raise ChangelogDataError(
                    f"{_where(item)}: the event time '{time_column}' is NULL; every row needs its event "
                    "time to be ordered by the watermark",
                    field=time_column,
                )
    return prepared


def _where(row: Prepared) -> str:
    where = [f"partition_by key {list(row.key)}"] if row.key else []
    if row.sequence:
        where.append(f"sequence_by {list(row.sequence)}")
    return ", ".join(where) or "record"


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


@dataclass(frozen=True)
class StreamPlan:
    """How a stream's processor keeps and releases each key's rows.

    ``state_name`` names the state variables (``uid``). ``ttl_seconds`` (> 0) sets event-time timers
    that free a key's state once expired: the engine already treats expired state as gone, the
    timers only reclaim the space of keys that do not come back. With ``watermark_first`` (to_changelog)
    a micro-batch first releases what Spark's current watermark passed, then writes the batch's rows
    at or below it at once (the engine's order: watermark, then rows); without it (from_changelog)
    Spark has dropped the rows at or below the previous watermark, and every row waits for its timer.
    """

    state_name: str
    ttl_seconds: float | None = None
    watermark_first: bool = False


class ChangelogProcessor(StatefulProcessor):
    """``transformWithState`` processor running one conversion per grouping key (``partition_by``).

    Time comes from Spark: the micro-batch's processing time is the engine's clock (every row of a
    batch sees the same), and its watermark (ms) releases waiting rows.
    """

    def __init__(self, conversion: Conversion, plan: StreamPlan) -> None:
        self.conversion = conversion
        self.plan = plan

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._handle = handle
        value = handle.getValueState(self.plan.state_name, STATE_SCHEMA)
        self._store = ValueStateStore(value, StateCodec(self.conversion.layout.image_fields))
        self._buffer: ListState | None = None
        if self.conversion.layout.time_values is not None:
            self._buffer = handle.getListState(self.plan.state_name + "_waiting", BUFFER_SCHEMA)
        self._now = 0.0
        self._engine = self.conversion.engine(self._clock, self._store)

    def _clock(self) -> float:
        return self._now

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Row]:
        self._now = timerValues.getCurrentProcessingTimeInMs() / 1000
        self._store.start()
        conversion = self.conversion
        prepared = prepare(conversion, (r.asDict() for r in rows), sort=True)
        if self._buffer is None:
            output = run_rows(conversion, self._engine, prepared)
        else:
            output = self._arrive(key, prepared, timerValues.getCurrentWatermarkInMs())
        self._schedule_expiry()
        self._store.commit()
        return self._rows(output)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Row]:
        self._now = timerValues.getCurrentProcessingTimeInMs() / 1000
        self._store.start()
        output: list[Record] = []
        if self._buffer is not None:
            output = self._release(key, timerValues.getCurrentWatermarkInMs(), [])
        self._expire(expiredTimerInfo.getExpiryTimeInMs())
        self._store.commit()
        return self._rows(output)

    def close(self) -> None:
        pass

    def _arrive(self, key: Any, rows: list[Prepared], watermark_ms: int) -> list[Record]:
        """A micro-batch's rows for one key, with an event-time column."""
        assert self._buffer is not None  # noqa: S101 - called only with an event-time column
        if not self.plan.watermark_first:
            self._wait(rows)
            return []
        return self._release(key, watermark_ms, rows)

    def _wait(self, rows: list[Prepared]) -> None:
        assert self._buffer is not None  # noqa: S101 - called only with an event-time column
        waiting = [_waiting(row) for row in rows]
        self._buffer.appendList(waiting)
        self._handle.registerTimer(_timer_ms(min(time for time, _ in waiting)))

    def _release(self, key: Any, watermark_ms: int, arriving: list[Prepared]) -> list[Record]:
        """Hand the waiting rows at or below the watermark to the engine, in arrival order (it sorts
        them by event time and compacts each key's changes, as at a watermark); ``arriving`` rows at
        or below it are written at once, the rest wait with the others."""
        assert self._buffer is not None  # noqa: S101 - called only with an event-time column
        watermark = watermark_ms * 1000
        waiting = [(int(time), bytes(data)) for time, data in self._buffer.get()]
        due = [item for item in waiting if item[0] <= watermark]
        now = [row for row in arriving if _time(row) <= watermark]
        later = [row for row in arriving if _time(row) > watermark]
        if not due and not arriving:
            return []
        conversion = self.conversion
        engine = conversion.engine(self._clock, self._store)
        output = run_rows(conversion, engine, [_restored(key, item) for item in due])
        try:
            output.extend(conversion.advance(engine, watermark))
        except ChangelogDataError as error:
            raise type(error)(f"partition_by key {list(key)}: {error.reason}", field=error.field) from error
        output.extend(run_rows(conversion, engine, now))
        if due:
            kept = [item for item in waiting if item[0] > watermark]
            if kept:
                self._buffer.put(kept)
                self._handle.registerTimer(_timer_ms(min(time for time, _ in kept)))
            else:
                self._buffer.clear()
        if later:
            self._wait(later)
        return output

    def _schedule_expiry(self) -> None:
        """Set a timer to free the key's state when it expires, unless one is set already."""
        if not self.plan.ttl_seconds:
            return
        store = self._store
        state = store.current
        if state is None or state.expires_at is None or store.timer_ms is not None:
            return
        at = _timer_ms(int(state.expires_at * 1_000_000))
        self._handle.registerTimer(at)
        store.timer_ms = at

    def _expire(self, fired_ms: int) -> None:
        """A timer fired: free the key's state if it has expired, else move its expiry timer on."""
        if not self.plan.ttl_seconds:
            return
        store = self._store
        state = store.current
        if state is None or state.expires_at is None:
            return
        if self._now >= state.expires_at:
            store.clear()
            return
        if store.timer_ms is None or store.timer_ms <= fired_ms:
            # Spark deletes the firing timer after this call: a new one must be later.
            at = max(_timer_ms(int(state.expires_at * 1_000_000)), fired_ms + 1)
            self._handle.registerTimer(at)
            store.timer_ms = at

    def _rows(self, output: list[Record]) -> Iterator[Row]:
        time_column = self.conversion.layout.time_column
        if time_column is not None and time_column in self.conversion.layout.output.names:
            for record in output:
                value = record.get(time_column)
                if isinstance(value, int):
                    record[time_column] = _EPOCH + timedelta(microseconds=value)
        return iter([Row(**record) for record in output])


def _timer_ms(time_us: int) -> int:
    """The timer for an event time: it fires once the watermark (ms) is at or past it."""
    return -(-time_us // 1000)


def _time(row: Prepared) -> int:
    assert row.time is not None  # noqa: S101 - prepare fails a row without its event time
    return row.time


def _waiting(row: Prepared) -> tuple[int, bytes]:
    return (_time(row), pickle.dumps((row.sequence, row.record), 5))


def _restored(key: Any, item: tuple[int, bytes]) -> Prepared:
    sequence, record = pickle.loads(item[1])  # noqa: S301 - written by _waiting, in our checkpoint
    return Prepared(tuple(key), tuple(sequence), record, item[0])


def run_rows(conversion: Conversion, engine: Any, rows: list[Prepared]) -> list[Record]:
    """Feed records to the engine; a record it rejects fails with its key and position named."""
    output: list[Record] = []
    for row in rows:
        try:
            output.extend(conversion.feed(engine, row.record))
        except ChangelogDataError as error:
            raise type(error)(f"{_where(row)}: {error.reason}", field=error.field) from error
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
