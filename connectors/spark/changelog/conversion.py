"""The engine's two directions (FROM_CHANGELOG, TO_CHANGELOG) as conversions of rows (dicts) to rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from cdcflow.connectors.spark.changelog.layout import FrameLayout
from cdcflow.core.errors import ChangelogDataError
from cdcflow.core.from_changelog_engine import FromChangelog
from cdcflow.core.model import Change, Watermark
from cdcflow.core.params import FromChangelogParams, ToChangelogParams
from cdcflow.core.rowkind import RowKind
from cdcflow.core.state import Clock, StateStore
from cdcflow.core.to_changelog_engine import ToChangelog

Record = dict[str, Any]

_ROW_KINDS = {kind.value: kind for kind in RowKind}


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
