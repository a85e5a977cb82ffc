"""FROM_CHANGELOG: an append stream of change envelopes → a changelog (spec 4.1)."""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import Any, Unpack

from cdcflow.core.errors import (
    ChangelogDataError,
    ChangelogValidationError,
    InvalidOperationError,
    NullOperationError,
)
from cdcflow.core.keys import key_of
from cdcflow.core.model import Change, ChangelogMetrics, Rejected, RejectHandler, Row, Watermark
from cdcflow.core.ordering import EventTimeBuffer, compact, group_by_key
from cdcflow.core.params import (
    FromChangelogArgs,
    FromChangelogParams,
    InvalidOpHandling,
    plan_from_changelog,
)
from cdcflow.core.rowkind import DEL, INS, UA, UB, RowKind
from cdcflow.core.state import Clock, InMemoryStateStore, KeyState, StateStore, TtlState

logger = logging.getLogger(__name__)


class FromChangelog:
    """A FROM_CHANGELOG conversion: feed records and watermarks, collect changes.

    ``process`` and ``on_watermark`` return the changes they release; ``flush`` releases what is
    still buffered at the end of a finite input.
    """

    def __init__(
        self,
        params: FromChangelogParams,
        *,
        clock: Clock = time.time,
        state_store: StateStore | None = None,
        metrics: ChangelogMetrics | None = None,
        on_reject: RejectHandler | None = None,
    ) -> None:
        self.params = params
        self.metrics = metrics if metrics is not None else ChangelogMetrics()
        self.on_reject = on_reject
        self._state = (
            TtlState(
                InMemoryStateStore() if state_store is None else state_store, params.state_ttl_seconds, clock
            )
            if params.state_ttl_seconds is not None
            else None
        )
        self._buffer: EventTimeBuffer[tuple[int, Mapping[str, Any]]] | None = (
            EventTimeBuffer() if params.order_by is not None else None
        )
        self._single_image = params.before if params.after is None else params.after
        self._drop_from_flat = {params.op} | ({params.order_by} if params.order_by else set())
        self._drop_from_flat -= set(params.passthrough)
        # process_images may skip building the envelope when nothing reads it: no state, ordering,
        # passthrough or key check, and no unknown code whose record is handed over as rejected.
        self._images_direct = (
            self._state is None
            and self._buffer is None
            and params.nested
            and not params.passthrough
            and not params.partition_by
            and params.invalid_op_handling is InvalidOpHandling.FAIL
        )

    def process(self, record: Mapping[str, Any]) -> list[Change]:
        index = self.metrics.records_in
        self.metrics.records_in += 1
        if self._buffer is None:
            changes = self._convert(record, index)[1]
            self.metrics.changes_out += len(changes)
            return changes
        order_by = self.params.order_by
        assert order_by is not None  # noqa: S101 - a buffer exists only with order_by
        timestamp = record.get(order_by)
        if timestamp is None:
            raise ChangelogDataError(
                "the ORDER BY time is NULL: every row needs an event time to be sorted",
                record_index=index,
                field=order_by,
            )
        if self._buffer.is_late(timestamp):
            self.metrics.late_records += 1
            self.metrics.reject(
                Rejected(
                    record,
                    f"late: {order_by}={timestamp!r} is below the watermark {self._buffer.watermark!r}",
                    index,
                ),
                self.on_reject,
            )
            logger.debug("record #%d dropped as late (%s=%r)", index, order_by, timestamp)
            return []
        self._buffer.add(timestamp, (index, record))
        return []

    def process_images(self, code: Any, before: Row | None, after: Row | None) -> list[Change]:
        """``process`` for a record that is already split into its operation code and images.

        Format decoders call this: it skips building and unpacking an envelope dict when nothing
        needs the whole record, and is exactly ``process`` otherwise.
        """
        params = self.params
        if not self._images_direct:
            record = {params.op: code}
            if params.before is not None:
                record[params.before] = before
            if params.after is not None:
                record[params.after] = after
            return self.process(record)
        index = self.metrics.records_in
        self.metrics.records_in += 1
        kinds = self._kinds_of({params.op: code}, index)
        if kinds is None:
            return []
        if not params.has_before_image:
            before = after = after if after is not None else before
        changes = self._changes(kinds, before, after, None, {}, index)
        self.metrics.changes_out += len(changes)
        return changes

    def on_watermark(self, watermark: Watermark) -> list[Change]:
        if self._buffer is None:
            return []
        return self._release(self._buffer.advance(watermark.timestamp))

    def flush(self) -> list[Change]:
        if self._buffer is None:
            return []
        return self._release(self._buffer.drain())

    def run(self, items: Iterable[Mapping[str, Any] | Watermark]) -> Iterator[Change]:
        for item in items:
            if isinstance(item, Watermark):
                yield from self.on_watermark(item)
            else:
                yield from self.process(item)
        yield from self.flush()
        if self._state is not None:
            self.metrics.expired_states = self._state.expired

    def _release(self, released: list[tuple[int, Mapping[str, Any]]]) -> list[Change]:
        converted = [self._convert(record, index) for index, record in released]
        if not self.params.partition_by:
            changes = [change for _, batch in converted for change in batch]
        else:
            allowed = self.params.op_mapping.output_kinds
            groups = group_by_key((key, change) for key, batch in converted for change in batch)
            changes = [change for group in groups.values() for change in compact(group, allowed)]
            self.metrics.compacted_changes += sum(len(b) for _, b in converted) - len(changes)
        self.metrics.changes_out += len(changes)
        return changes

    def _convert(self, record: Mapping[str, Any], index: int) -> tuple[Hashable, list[Change]]:
        params = self.params
        kinds = self._kinds_of(record, index)
        if kinds is None:
            return None, []
        if params.nested:
            before, after = self._images(record, index)
        else:
            before = after = {k: v for k, v in record.items() if k not in self._drop_from_flat}
        new_image = after if after is not None else before
        key_source = new_image if (INS in kinds or UA in kinds) else (before if before is not None else after)
        if key_source is None:
            raise ChangelogDataError(
                "the record has neither a before nor an after image",
                record_index=index,
                field=params.after or params.before,
            )
        key = key_of(key_source, params.partition_by, index) if params.partition_by else None
        state = self._state.get(key) if self._state is not None else None
        changes = self._changes(kinds, before, after, state, record, index)
        if self._state is not None:
            self._remember(key, changes)
        return key, changes

    def _kinds_of(self, record: Mapping[str, Any], index: int) -> frozenset[RowKind] | None:
        params = self.params
        code = record.get(params.op)
        if code is None:
            raise NullOperationError(
                "the operation code is NULL: the record is corrupt or not a change envelope; fix the "
                "producer, or filter such records out before from_changelog",
                record_index=index,
                field=params.op,
            )
        kinds = params.op_mapping.lookup(_code_string(code))
        if kinds is not None:
            return kinds
        known = sorted(params.op_mapping.groups)
        self.metrics.invalid_ops += 1
        if params.invalid_op_handling is InvalidOpHandling.FAIL:
            raise InvalidOperationError(
                f"unknown operation code {code!r}; op_mapping knows {known}. Add it to op_mapping, or "
                "set invalid_op_handling='LOG' or 'SKIP' to skip such records",
                record_index=index,
                field=params.op,
            )
        if params.invalid_op_handling is InvalidOpHandling.LOG:
            logger.warning(
                "record #%d skipped: unknown operation code %r in field '%s' (known: %s)",
                index,
                code,
                params.op,
                known,
            )
        self.metrics.reject(Rejected(record, f"unknown operation code {code!r}", index), self.on_reject)
        return None

    def _images(self, record: Mapping[str, Any], index: int) -> tuple[Row | None, Row | None]:
        params = self.params
        if params.has_before_image:
            before = self._image(record, params.before, index)
            after = self._image(record, params.after, index)
        else:
            before = after = self._image(record, self._single_image, index)
        return before, after

    def _image(self, record: Mapping[str, Any], field: str | None, index: int) -> Row | None:
        if field is None:
            return None
        value = record.get(field)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ChangelogDataError(
                f"the image must be a row (a mapping of columns), got {type(value).__name__}",
                record_index=index,
                field=field,
            )
        image = dict(value)
        for name in self.params.passthrough:
            if name in image:
                raise ChangelogValidationError(
                    f"passthrough field '{name}' is also a column of the '{field}' image: passthrough "
                    "fields and image columns must be disjoint (rename one of them)"
                )
            if name not in record:
                raise ChangelogDataError(
                    f"passthrough field '{name}' is not in the record (fields: {sorted(record)})",
                    record_index=index,
                    field=name,
                )
            image[name] = record[name]
        return image

    def _changes(
        self,
        kinds: frozenset[RowKind],
        before: Row | None,
        after: Row | None,
        state: KeyState | None,
        record: Mapping[str, Any],
        index: int,
    ) -> list[Change]:
        params = self.params
        stored = state.image if state is not None else None
        if len(kinds) == 1:
            (kind,) = kinds
            if kind in (INS, UA):
                return [Change(kind, self._require(after, params.after, index))]
            image = before if before is not None else after
            return [Change(kind, self._require(image, params.before, index))]
        new = self._require(after, params.after, index)
        if INS in kinds:
            if stored is None:
                return [Change(INS, new)]
            return [Change(UB, stored), Change(UA, new)] if UB in kinds else [Change(UA, new)]
        old = before if params.has_before_image and before is not None else stored
        if old is not None:
            return [Change(UB, old), Change(UA, new)]
        if self._state is not None:
            return [Change(INS, new)]
        raise ChangelogDataError(
            f"the update has no before image ('{params.before}' is NULL) to build its -U row. For "
            "Debezium on PostgreSQL run ALTER TABLE ... REPLICA IDENTITY FULL; or derive -U from state "
            "with state_ttl and partition_by",
            record_index=index,
            field=params.before,
        )

    def _remember(self, key: Hashable, changes: list[Change]) -> None:
        assert self._state is not None  # noqa: S101 - called only when stateful
        if not changes:
            return
        last = changes[-1]
        if last.kind is DEL:
            self._state.delete(key)
        elif last.kind in (INS, UA):
            self._state.put(key, KeyState(image=last.row))

    @staticmethod
    def _require(image: Row | None, field: str | None, index: int) -> Row:
        if image is None:
            raise ChangelogDataError(
                "the image this operation needs is NULL", record_index=index, field=field
            )
        return image


def _code_string(code: Any) -> str:
    if isinstance(code, bool):
        return "true" if code else "false"
    return code if isinstance(code, str) else str(code)


def from_changelog(
    rows: Iterable[Mapping[str, Any] | Watermark],
    *,
    clock: Clock = time.time,
    state_store: StateStore | None = None,
    metrics: ChangelogMetrics | None = None,
    on_reject: RejectHandler | None = None,
    **args: Unpack[FromChangelogArgs],
) -> Iterator[Change]:
    """Turn an append stream of change records into a changelog (spec 4.1).

    The parameters are validated here, before the first row is read, so a bad ``op_mapping`` fails
    at the call, not at iteration.

    ``args`` are FROM_CHANGELOG's parameters (:class:`~cdcflow.core.params.FromChangelogArgs`): ``op``
    ("op"), ``before``, ``after``, ``op_mapping``, ``invalid_op_handling`` ("FAIL"), ``partition_by``,
    ``order_by``, ``state_ttl``, ``consume_full_deletes`` (False), ``passthrough``, ``uid``.
    """
    params = plan_from_changelog(**args)
    conversion = FromChangelog(
        params, clock=clock, state_store=state_store, metrics=metrics, on_reject=on_reject
    )
    return conversion.run(rows)
