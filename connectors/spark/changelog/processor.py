"""The engine per key on Spark's state store: the ``transformWithState`` processor of streaming queries.

:class:`ChangelogProcessor` keeps each key's :class:`~cdcflow.core.KeyState` in a ``ValueState`` (so it is
checkpointed and survives a restart), and the engine (:mod:`cdcflow.core`) runs unchanged against it.
With an event-time column the rows wait in a ``ListState`` until Spark's watermark passes them; an
event-time timer then hands them to the engine, which sorts and compacts them as it does at a watermark.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql import Row
from pyspark.sql import types as st
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    ListState,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from cdcflow.connectors.spark.changelog.conversion import Conversion, Record
from cdcflow.connectors.spark.changelog.feeding import Prepared, prepare, run_rows
from cdcflow.connectors.spark.changelog.state import STATE_SCHEMA, StateCodec, ValueStateStore
from cdcflow.core.errors import ChangelogDataError

BUFFER_SCHEMA = st.StructType(
    [st.StructField("event_time_us", st.LongType(), False), st.StructField("record", st.BinaryType(), False)]
)
"""A row waiting for the watermark: its event time and the pickled record, in arrival order."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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
