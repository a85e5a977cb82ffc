"""TO_CHANGELOG: a changelog → an append stream of change envelopes (spec 4.2)."""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Iterator
from typing import Any, Unpack

from cdcflow.core.errors import ChangelogDataError
from cdcflow.core.keys import GLOBAL_KEY, key_of
from cdcflow.core.model import Change, ChangelogMetrics, Row, Watermark
from cdcflow.core.ordering import EventTimeBuffer, compact, group_by_key
from cdcflow.core.params import ToChangelogArgs, ToChangelogParams, plan_to_changelog
from cdcflow.core.rowkind import DEL, INS, UA, UB, RowKind
from cdcflow.core.state import Clock, InMemoryStateStore, KeyState, StateStore, TtlState

_ALL_KINDS = frozenset(RowKind)

Envelope = dict[str, Any]


class ToChangelog:
    """A TO_CHANGELOG conversion: feed changes and watermarks, collect envelope records."""

    def __init__(
        self,
        params: ToChangelogParams,
        *,
        clock: Clock = time.time,
        state_store: StateStore | None = None,
        metrics: ChangelogMetrics | None = None,
    ) -> None:
        self.params = params
        self.metrics = metrics if metrics is not None else ChangelogMetrics()
        # A buffered -U needs state even without state_ttl (then it waits forever: spec 4.2.1.2.2).
        store = InMemoryStateStore() if state_store is None else state_store
        self._state = TtlState(store, params.state_ttl_seconds or 0.0, clock)
        self._buffer: EventTimeBuffer[tuple[int, Change]] | None = (
            EventTimeBuffer() if params.on_time is not None else None
        )
        mapping = params.op_mapping
        self._combine = mapping.combines_updates
        self._stateful = self._combine or params.keeps_images
        self._drop_update_before = mapping.is_default and not params.nested
        self._hidden = {params.on_time} - set(params.passthrough) if params.on_time else set()

    def process(self, change: Change) -> list[Envelope]:
        index = self.metrics.records_in
        self.metrics.records_in += 1
        if self._buffer is not None:
            on_time = self.params.on_time
            timestamp = change.row.get(on_time) if on_time else None
            if timestamp is None:
                raise ChangelogDataError(
                    "the event time is NULL: watermark compaction needs a time on every change",
                    record_index=index,
                    field=on_time,
                )
            # A change at or below the watermark has nothing buffered before it: write it now.
            if self._buffer.watermark is None or timestamp > self._buffer.watermark:
                self._buffer.add(timestamp, (index, change))
                return []
        return self._emit(self._encode(change, index))

    def on_watermark(self, watermark: Watermark) -> list[Envelope]:
        if self._buffer is None:
            return []
        return self._release(self._buffer.advance(watermark.timestamp))

    def flush(self) -> list[Envelope]:
        """End of input: release buffered changes and write any ``-U`` still waiting for its ``+U``."""
        records = self._release(self._buffer.drain()) if self._buffer is not None else []
        for key, state in self._state.items():
            if state.pending_before is not None:
                records.extend(self._emit(self._orphan(state.pending_before)))
                state.pending_before = None
                self._state.put(key, state)
        return records

    def run(self, items: Iterable[Change | Watermark]) -> Iterator[Envelope]:
        for item in items:
            if isinstance(item, Watermark):
                yield from self.on_watermark(item)
            else:
                yield from self.process(item)
        yield from self.flush()
        self.metrics.expired_states = self._state.expired

    def _emit(self, records: list[Envelope]) -> list[Envelope]:
        self.metrics.changes_out += len(records)
        return records

    def _release(self, released: list[tuple[int, Change]]) -> list[Envelope]:
        if not self.params.partition_by:
            return self._emit([r for index, change in released for r in self._encode(change, index)])
        keyed = ((key_of(c.row, self.params.partition_by, i), (i, c)) for i, c in released)
        records: list[Envelope] = []
        for key, group in group_by_key(keyed).items():
            compacted = compact([change for _, change in group], _ALL_KINDS)
            self.metrics.compacted_changes += len(group) - len(compacted)
            last_index = group[-1][0]
            for change in compacted:
                records.extend(self._encode(change, last_index, key))
        return self._emit(records)

    def _encode(self, change: Change, index: int, key: Hashable | None = None) -> list[Envelope]:
        """One change as envelope records; ``key`` is the change's key when the caller knows it."""
        params = self.params
        if key is None:
            key = key_of(change.row, params.partition_by, index) if params.partition_by else GLOBAL_KEY
        state = (self._state.get(key) if self._stateful else None) or KeyState()
        kind, row = change.kind, change.row
        records: list[Envelope] = []
        if state.pending_before is not None and not (kind is UA and self._combine):
            records.extend(self._orphan(state.pending_before))
            state.pending_before = None
        code = params.op_mapping.code_for(kind)
        if kind is UB:
            if self._combine:
                state.pending_before = row
            elif code is not None and not self._drop_update_before:
                records.append(self._record(code, row, None, row, index))
        elif kind is UA:
            before = state.pending_before if self._combine else None
            state.pending_before = None
            if before is None and params.keeps_images:
                before = state.image
            if before is None and (self._combine or params.keeps_images):
                code = params.op_mapping.code_for(INS) or code
            if code is not None:
                records.append(self._record(code, before, row, row, index))
        elif kind is INS:
            if code is not None:
                records.append(self._record(code, None, row, row, index))
        else:
            if code is not None:
                records.append(self._record(code, self._delete_image(row, state), None, row, index))
        if self._stateful:
            self._remember(key, kind, row, state)
        return records

    def _delete_image(self, row: Row, state: KeyState) -> Row:
        params = self.params
        if params.produces_full_deletes:
            return state.image if params.keeps_images and state.image is not None else row
        if params.partition_by:
            return {column: row[column] for column in params.partition_by}
        return row

    def _remember(self, key: Hashable, kind: RowKind, row: Row, state: KeyState) -> None:
        if self.params.keeps_images:
            if kind in (INS, UA):
                state.image = row
            elif kind is DEL:
                state.image = None
        self._state.put(key, state)

    def _orphan(self, before: Row) -> list[Envelope]:
        """A ``-U`` whose ``+U`` never came is written on its own, never lost."""
        code = self.params.op_mapping.code_for(UB)
        assert code is not None  # noqa: S101 - only combined mappings buffer a -U
        return [self._record(code, before, None, before, -1)]

    def _record(self, code: str, before: Row | None, after: Row | None, source: Row, index: int) -> Envelope:
        params = self.params
        record: Envelope = {params.op: code}
        hidden = self._hidden
        if not params.nested:
            image = after if after is not None else before
            assert image is not None  # noqa: S101 - every kind carries a row
            if params.op in image:
                raise ChangelogDataError(
                    f"the row already has a column '{params.op}', which the op field would overwrite: "
                    "name another op field with op='...'",
                    record_index=index,
                    field=params.op,
                )
            record.update((k, v) for k, v in image.items() if k not in hidden)
            return record
        passthrough = params.passthrough
        for name in passthrough:
            if name not in source:
                raise ChangelogDataError(
                    f"passthrough field '{name}' is not a column of the row (columns: {sorted(source)})",
                    record_index=index,
                    field=name,
                )
            record[name] = source[name]
        strip = hidden.union(passthrough)
        before_image = _without(before, strip)
        after_image = _without(after, strip)
        if params.before is None or params.after is None or params.before == params.after:
            single = params.after or params.before
            assert single is not None  # noqa: S101 - nested means one of them is set
            record[single] = after_image if after_image is not None else before_image
        else:
            record[params.before] = before_image
            record[params.after] = after_image
        return record


def _without(image: Row | None, names: set[str]) -> Row | None:
    if image is None or not names:
        return image
    return {k: v for k, v in image.items() if k not in names}


def to_changelog(
    changes: Iterable[Change | Watermark],
    *,
    clock: Clock = time.time,
    state_store: StateStore | None = None,
    metrics: ChangelogMetrics | None = None,
    **args: Unpack[ToChangelogArgs],
) -> Iterator[Envelope]:
    """Turn a changelog into an append stream of change records (spec 4.2).

    The parameters are validated here, before the first change is read.

    ``args`` are TO_CHANGELOG's parameters (:class:`~cdcflow.core.params.ToChangelogArgs`): ``op``
    ("op"), ``before``, ``after``, ``op_mapping``, ``partition_by``, ``on_time``, ``state_ttl``,
    ``produces_full_deletes`` (False), ``passthrough``, ``uid``.
    """
    params = plan_to_changelog(**args)
    return ToChangelog(params, clock=clock, state_store=state_store, metrics=metrics).run(changes)
