"""Versioned tables: the history of each key of a changelog, and the deduplicated view of an append stream.

A version is the row a key held over ``[valid_from, valid_to)``, ``valid_to`` None while it still holds
(Flink's versioned tables: a primary key plus an event-time attribute). ``versions_of`` builds the
history from a changelog, ``as_of`` reads it at a point in time, and ``deduplicate_latest`` turns an
append-only stream into the changelog of its latest row per key (``ROW_NUMBER() ... ORDER BY time DESC
= 1``), which ``versions_of`` then versions.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdcflow.core.errors import ChangelogDataError, ChangelogValidationError, NullKeyError
from cdcflow.core.model import Change, ChangelogMetrics, Rejected, RejectHandler, Row
from cdcflow.core.rowkind import DEL, INS, UA, UB


@dataclass(frozen=True, slots=True)
class Version:
    """The row ``key`` held from ``valid_from`` (inclusive) to ``valid_to`` (exclusive; None: still valid)."""

    key: tuple[Any, ...]
    row: Row
    valid_from: Any
    valid_to: Any = None

    def is_valid_at(self, t: Any) -> bool:
        return self.valid_from <= t and (self.valid_to is None or t < self.valid_to)


def versions_of(
    changes: Iterable[Change], key: Sequence[str], time: str, *, keep_deletes: bool = False
) -> list[Version]:
    """The history of every key of ``changes``, ``time`` naming each change's event-time column.

    ``+I``/``+U`` open a version and close the key's open one at their time, ``-D`` closes it, ``-U`` is
    ignored (its ``+U`` does the work). Each key's changes are taken in time order, arrival order
    breaking ties; of several changes at the same time the last wins, so no version is zero-length and
    versions are unique on ``(key, valid_from)``. Keys come in order of first appearance, each key's
    versions by ``valid_from``.

    ``keep_deletes`` adds a tombstone, a zero-length version (``valid_from == valid_to``, valid at no
    time), for each delete that closed no version: a stored history then still applies it to an
    insert that arrives later with an earlier time (see :func:`changelog_of`).
    """
    columns = _columns(key, time)
    per_key: dict[tuple[Any, ...], list[tuple[Any, Change]]] = {}
    for index, change in enumerate(changes):
        if change.kind is UB:
            continue
        per_key.setdefault(key_tuple(change.row, columns, index), []).append(
            (event_time(change.row, time, index), change)
        )
    versions: list[Version] = []
    for key_value, timed in per_key.items():
        timed.sort(key=lambda entry: entry[0])
        versions.extend(_history(key_value, timed, keep_deletes))
    return versions


def _history(key: tuple[Any, ...], timed: list[tuple[Any, Change]], keep_deletes: bool) -> list[Version]:
    history: list[Version] = []
    current: Version | None = None
    for position, (at, change) in enumerate(timed):
        if position + 1 < len(timed) and timed[position + 1][0] == at:
            continue  # the last change at a time wins
        if current is not None:
            history.append(Version(key, current.row, current.valid_from, at))
        elif change.kind is DEL and keep_deletes:
            history.append(Version(key, change.row, at, at))
        current = Version(key, change.row, at) if change.kind in (INS, UA) else None
    if current is not None:
        history.append(current)
    return history


def changelog_of(versions: Iterable[Version], time: str) -> list[Change]:
    """A changelog ``versions_of`` turns back into ``versions`` (to add changes to a stored history).

    Each version opens with ``+I`` (``+U`` when it starts where the key's previous one ended); a
    version that ends before the next one starts, or ends with none after it, ended with a ``-D`` at
    its ``valid_to``; a tombstone (``keep_deletes``) is a ``-D``. The ``time`` column of each change is
    set to the time it happens.
    """
    per_key: dict[tuple[Any, ...], list[Version]] = {}
    for version in versions:
        per_key.setdefault(version.key, []).append(version)
    changes: list[Change] = []
    for history in per_key.values():
        history.sort(key=lambda version: version.valid_from)
        ended: Any = None
        for position, version in enumerate(history):
            if version.valid_to == version.valid_from:
                changes.append(Change(DEL, {**version.row, time: version.valid_from}))
                ended = None
                continue
            kind = UA if ended is not None and ended == version.valid_from else INS
            changes.append(Change(kind, {**version.row, time: version.valid_from}))
            ended = version.valid_to
            following = history[position + 1] if position + 1 < len(history) else None
            if ended is not None and (following is None or following.valid_from > ended):
                changes.append(Change(DEL, {**version.row, time: ended}))
    return changes


def as_of(versions: Iterable[Version], t: Any) -> list[Row]:
    """The rows valid at ``t``: ``valid_from <= t < valid_to`` (or ``valid_to`` None)."""
    return [version.row for version in versions if version.is_valid_at(t)]


def deduplicate_latest(
    rows: Iterable[Mapping[str, Any]],
    key: Sequence[str],
    time: str,
    *,
    update_before: bool = True,
    metrics: ChangelogMetrics | None = None,
    on_reject: RejectHandler | None = None,
) -> Iterator[Change]:
    """The changelog of the latest row per key of an append-only stream (Flink's deduplication on
    ``ROW_NUMBER() OVER (PARTITION BY key ORDER BY time DESC) = 1``).

    A key's first row is ``+I``; a row at least as recent as the key's current one replaces it with
    ``-U`` old, ``+U`` new (``update_before=False``: ``+U`` only, Flink's upsert mode, as the spec's
    table shows it). An older row changes nothing: it is counted in ``metrics.late_records`` and
    handed to ``on_reject``. Parameters are checked at the call, rows as they are read.
    """
    columns = _columns(key, time)
    counters = metrics if metrics is not None else ChangelogMetrics()
    return _deduplicate(rows, columns, time, update_before, counters, on_reject)


def _deduplicate(
    rows: Iterable[Mapping[str, Any]],
    columns: tuple[str, ...],
    time: str,
    update_before: bool,
    metrics: ChangelogMetrics,
    on_reject: RejectHandler | None,
) -> Iterator[Change]:
    latest: dict[tuple[Any, ...], tuple[Any, Row]] = {}
    for record in rows:
        index = metrics.records_in
        metrics.records_in += 1
        key_value = key_tuple(record, columns, index)
        at = event_time(record, time, index)
        current = latest.get(key_value)
        if current is not None and at < current[0]:
            metrics.late_records += 1
            metrics.reject(
                Rejected(record, f"late: {time}={at!r} is older than the key's latest {current[0]!r}", index),
                on_reject,
            )
            continue
        row = dict(record)
        latest[key_value] = (at, row)
        if current is None:
            changes = [Change(INS, row)]
        elif update_before:
            changes = [Change(UB, current[1]), Change(UA, row)]
        else:
            changes = [Change(UA, row)]
        metrics.changes_out += len(changes)
        yield from changes


def key_tuple(row: Mapping[str, Any], columns: Sequence[str], index: int) -> tuple[Any, ...]:
    """``row``'s key as a tuple; a NULL or missing key column fails."""
    values = tuple(row.get(column) for column in columns)
    for column, value in zip(columns, values, strict=True):
        if value is None:
            raise NullKeyError(
                f"the key column is NULL (or missing): a versioned table needs key={list(columns)} "
                "set on every row",
                record_index=index,
                field=column,
            )
    return values


def event_time(row: Mapping[str, Any], time: str, index: int) -> Any:
    """``row``'s event time; NULL fails (a version needs to know when it starts)."""
    value = row.get(time)
    if value is None:
        raise ChangelogDataError(
            f"the time column is NULL (or missing): every change of a versioned table needs its "
            f"event time in '{time}'",
            record_index=index,
            field=time,
        )
    return value


def _columns(key: Sequence[str], time: str) -> tuple[str, ...]:
    if isinstance(key, str):
        key = (key,)
    columns = tuple(key)
    if not columns:
        raise ChangelogValidationError("a versioned table needs a key: pass key=['column', ...]")
    if not time or time in columns:
        raise ChangelogValidationError(
            f"time={time!r} must name the event-time column, which is not part of the key {list(columns)}"
        )
    return columns
