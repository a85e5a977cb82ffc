"""Flink's SinkUpsertMaterializer: turn an out-of-order update stream into what a primary-key sink holds.

An update stream whose upsert key differs from the sink's primary key (or has none, as after a join
shuffled by another column) can reach the sink out of order: only the events of one upsert key keep
their order, an ADD (+I/+U) always before its RETRACT (-U/-D). Applied naively as upserts and deletes
by primary key, ``+U(1, 20), +I(1, 10), -U(1, 10)`` deletes id 1 although (1, 20) is live. The
materializer keeps, per primary key, the live rows in arrival order and emits what the sink must hold:
after every change the sink holds the last live row, or nothing when none is live.

It follows Flink 1.16+ (FLINK-20374, FLINK-28569) with three deliberate differences:

* a -D carries the stored row, not the retraction's image (which may hold only the key columns);
* with an upsert key, an ADD for a live upsert key drops the old version and appends the new one.
  Flink replaces it in place yet emits it, so when that row is later retracted from a non-last
  position the sink keeps a row that is no longer live;
* nothing is dropped silently: an unmatched retraction is counted and handed to ``on_unmatched``;
  with ``retract_unmatched`` (a sink whose primary key is declared) it still retracts a row of its key.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any

from cdcflow.core.errors import ChangelogDataError, ChangelogValidationError
from cdcflow.core.model import Change, Row
from cdcflow.core.rowkind import DEL, INS, UA

UnmatchedHandler = Callable[[Change], None]


class UpsertMaterializer:
    """Per sink primary key: the list of live rows (state) and what the sink table must hold.

    ``upsert_key`` names the columns whose events stay in order; rows with equal upsert key are
    versions of one row. Without one (None or empty), rows are matched whole, on ``compare_columns``
    (all row fields when None), and the live rows are a multiset: two equal ADDs need two RETRACTs.
    The instance holds no per-key state, so one materializer serves every primary key.

    ``retract_unmatched``: a retraction that matches no live row (its image differs from the row that
    was added, or the state expired) still retracts one of its primary key: the oldest live row (a
    key's rows are retracted in the order they were added), or, with none live, it is emitted as a
    DELETE so the sink drops whatever row it holds for the key. Off, it emits nothing (Flink).
    """

    def __init__(
        self,
        upsert_key: Sequence[str] | None,
        compare_columns: Sequence[str] | None = None,
        on_unmatched: UnmatchedHandler | None = None,
        *,
        retract_unmatched: bool = False,
    ) -> None:
        self.upsert_key = tuple(upsert_key or ())
        self.compare_columns = None if compare_columns is None else tuple(compare_columns)
        self.on_unmatched = on_unmatched
        self.retract_unmatched = retract_unmatched
        self.unmatched = 0
        """Retractions that matched no live row (Flink logs "state cleared" for these)."""

    def apply(self, rows: list[Row], change: Change) -> tuple[list[Row], Change | None]:
        """Apply ``change`` to one primary key's live ``rows`` (arrival order; left unchanged).

        Returns the new live rows and the change the sink must apply, or None when the row it
        holds stays right.
        """
        if change.kind.is_retraction:
            return self._retract(rows, change)
        return self._add(rows, change.row)

    def _add(self, rows: list[Row], row: Row) -> tuple[list[Row], Change]:
        kind = UA if rows else INS
        if self.upsert_key:
            index = self._find(rows, row)
            if index is not None:
                rows = rows[:index] + rows[index + 1 :]
        return [*rows, row], Change(kind, row)

    def _retract(self, rows: list[Row], change: Change) -> tuple[list[Row], Change | None]:
        index = self._find(rows, change.row)
        if index is None:
            self.unmatched += 1
            if self.on_unmatched is not None:
                self.on_unmatched(change)
            if not self.retract_unmatched:
                return list(rows), None
            if not rows:
                return [], Change(DEL, change.row)
            index = 0
        remaining = rows[:index] + rows[index + 1 :]
        if not remaining:
            return remaining, Change(DEL, rows[index])
        if index == len(rows) - 1:
            return remaining, Change(UA, remaining[-1])
        return remaining, None

    def _find(self, rows: list[Row], row: Row) -> int | None:
        """Index of the first live row matching ``row``, by upsert key or else whole."""
        wanted = self._identity(row)
        for index, candidate in enumerate(rows):
            if self._identity(candidate) == wanted:
                return index
        return None

    def _identity(self, row: Row) -> Any:
        if self.upsert_key:
            return tuple(row.get(column) for column in self.upsert_key)
        if self.compare_columns is not None:
            return tuple(row.get(column) for column in self.compare_columns)
        return row


def materialize(
    changes: Iterable[Change],
    key: Sequence[str],
    upsert_key: Sequence[str] | None,
    *,
    compare_columns: Sequence[str] | None = None,
    on_unmatched: UnmatchedHandler | None = None,
    retract_unmatched: bool = False,
) -> Iterator[Change]:
    """The changes a sink with primary key ``key`` must apply, for an update stream ``changes``."""
    materializer = UpsertMaterializer(
        upsert_key, compare_columns, on_unmatched, retract_unmatched=retract_unmatched
    )
    columns = tuple(key)
    if not columns:
        raise ChangelogValidationError(
            "materialize needs the sink's primary key columns: pass key=['id', ...]"
        )
    live: dict[Hashable, list[Row]] = {}
    for index, change in enumerate(changes):
        pk = _primary_key(change.row, columns, index)
        rows, out = materializer.apply(live.get(pk, []), change)
        if rows:
            live[pk] = rows
        else:
            live.pop(pk, None)
        if out is not None:
            yield out


def _primary_key(row: Row, columns: tuple[str, ...], index: int) -> Hashable:
    for column in columns:
        if row.get(column) is None:
            raise ChangelogDataError(
                "the sink's primary key column is NULL or missing: every change must carry the "
                f"primary key {list(columns)} to be materialized",
                record_index=index,
                field=column,
            )
    return tuple(row[column] for column in columns)
