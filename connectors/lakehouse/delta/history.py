"""A changelog kept as a versioned table: SCD type 2 history rows in Delta, one merge per batch, exactly once.

Each row of the table is a :class:`cdcflow.core.Version`: the data columns of the change that opened it,
plus ``valid_from`` (that change's time) and ``valid_to`` (the time of the change that ended it, NULL
while it still holds). Rows are unique on ``(key, valid_from)``. A row with ``valid_from = valid_to`` is
a tombstone, valid at no time: a delete that ended no version yet, kept so that an insert arriving
later with an earlier time still ends there.

Per batch the writer reads the existing versions of the batch's keys, turns them back into changes (a
version whose ``valid_to`` is not the next version's ``valid_from`` ended with a delete), adds the
batch's changes and rebuilds those keys' history with :func:`cdcflow.core.versions_of`. Changes that
arrive late (older than versions already written) land where their time puts them. The difference is
written as ONE delta-rs merge on ``(key, valid_from)`` whose commit records ``(app_id, batch_id)``: new
versions are inserted, changed ones updated, vanished ones (replaced by a change at the same time)
deleted, and a replayed batch finds its id and is skipped.

A truncation (the time of a source TRUNCATE) ends every version open at that time: the batch's keys'
(a change from before a truncation that arrives in a later batch lands as a version ending there) and,
with ``open_keys``, every key the table holds open.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from cdcflow.connectors.errors import ChangelogConsistencyError, ConnectorOptionError
from cdcflow.connectors.lakehouse.delta.merge import OP, Merge
from cdcflow.connectors.lakehouse.delta.storage import LOCAL, Storage
from cdcflow.connectors.lakehouse.delta.tables import (
    applied_version,
    merge_marked,
    open_table,
    rows_of_keys,
    table_filesystem,
    to_delta_columns,
)
from cdcflow.core import CdcflowError, Change, RowKind, Version, versions_of
from cdcflow.core.versioned import changelog_of, event_time, key_tuple

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HistoryResult:
    """What one batch did to the history table."""

    batch_id: int
    skipped: bool = False
    changes: int = 0
    """Rows of the batch, ``-U`` included (they carry nothing a ``+U`` does not)."""
    keys: int = 0
    late: int = 0
    """Changes older than what the table already held for their key (placed in the past, not dropped)."""
    versions_inserted: int = 0
    versions_updated: int = 0
    versions_deleted: int = 0
    table_version: int | None = None


class DeltaHistoryWriter:
    """Writes changelog batches (Arrow tables with a row-kind column) as the SCD2 history at ``target``."""

    def __init__(
        self,
        target: str,
        key: Sequence[str],
        time: str,
        *,
        app_id: str,
        row_kind_column: str = "_row_kind",
        valid_from: str = "valid_from",
        valid_to: str = "valid_to",
        keep_time: bool = True,
        storage: Storage = LOCAL,
    ) -> None:
        """``keep_time=False``: the ``time`` column orders the changes but is no column of the table
        (``valid_from`` holds it)."""
        self.key = (key,) if isinstance(key, str) else tuple(key)
        names = [*self.key, time, row_kind_column, valid_from, valid_to, OP]
        if not self.key or len(set(names)) != len(names):
            raise ConnectorOptionError(
                f"key={list(self.key)}, time={time!r}, row_kind_column={row_kind_column!r}, "
                f"valid_from={valid_from!r} and valid_to={valid_to!r} must be distinct, non-empty names "
                f"(and not {OP!r})"
            )
        if not app_id:
            raise ConnectorOptionError(
                "app_id: name the writer (e.g. the query name); it makes batches idempotent"
            )
        self.target = target
        self.time = time
        self.app_id = app_id
        self.row_kind_column = row_kind_column
        self.valid_from = valid_from
        self.valid_to = valid_to
        self.keep_time = keep_time
        self.storage = storage
        """Where the table lives: local, or an object store's options (:mod:`.storage`)."""

    def applied_batch(self) -> int:
        """The last batch id committed to the table (-1 when none)."""
        return applied_version(open_table(self.target, self.storage), self.app_id)

    def apply(
        self,
        batch: pa.Table | pa.RecordBatch,
        batch_id: int,
        truncations: Sequence[Any] = (),
        open_keys: bool = False,
        patches: Mapping[tuple[tuple[Any, ...], Any], Mapping[str, Any]] | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> HistoryResult:
        """``truncations``: times at which every version ends (a source TRUNCATE); ``open_keys``: end
        there every version the table holds open too, not only the batch's keys'. ``patches``: values
        set on stored versions, by ``(key, valid_from)``. ``metadata``: the commit's custom metadata."""
        if isinstance(batch, pa.RecordBatch):
            batch = pa.Table.from_batches([batch])
        table = open_table(self.target, self.storage)
        if table is not None and applied_version(table, self.app_id) >= batch_id:
            log.info("batch %d already in %s (app %s): skipped", batch_id, self.target, self.app_id)
            return HistoryResult(batch_id, skipped=True, table_version=table.version())
        data, changes = self._changes(batch, batch_id)
        keys = {key_tuple(change.row, self.key, index) for index, change in enumerate(changes)}
        if table is not None and open_keys and truncations:
            keys |= self._open_keys(table)
        keys |= {key for key, _ in patches or {}}
        existing = self._existing(table, keys) if table is not None else []
        patched = [
            Version(
                v.key, {**v.row, **(patches or {}).get((v.key, v.valid_from), {})}, v.valid_from, v.valid_to
            )
            for v in existing
        ]
        stored = changelog_of(patched, self.time)
        ended = self._truncated([*stored, *changes], truncations)
        history = versions_of([*ended, *stored, *changes], self.key, self.time, keep_deletes=True)
        before = {(v.key, v.valid_from): v for v in existing}
        after = {(v.key, v.valid_from): v for v in history}
        upserts = [v for id_, v in after.items() if before.get(id_) != v]
        gone = [v for id_, v in before.items() if id_ not in after]
        inserted = sum(1 for v in upserts if (v.key, v.valid_from) not in before)
        source = self._rows(data.schema, [*upserts, *gone], len(upserts))
        commit = CommitProperties(
            app_transactions=[Transaction(self.app_id, batch_id)],
            custom_metadata=dict(metadata) if metadata else None,
        )
        if table is None:
            write_deltalake(
                self.target,
                source.drop_columns([OP]),
                mode="error",
                commit_properties=commit,
                storage_options=self.storage.table_options(),
            )
        elif source.num_rows == 0:
            # A merge without source rows commits nothing: record the batch id with an empty append.
            write_deltalake(table, source.drop_columns([OP]), mode="append", commit_properties=commit)
        else:
            merge = Merge(source, (*self.key, self.valid_from), self.app_id, batch_id, metadata=metadata)
            merge_marked(table, self.target, merge)
        result = HistoryResult(
            batch_id,
            changes=batch.num_rows,
            keys=len(keys),
            late=self._late(existing, changes),
            versions_inserted=inserted,
            versions_updated=len(upserts) - inserted,
            versions_deleted=len(gone),
            table_version=DeltaTable(self.target, storage_options=self.storage.table_options()).version(),
        )
        if result.late:
            log.info("batch %d: %d late changes rewrote the history of their keys", batch_id, result.late)
        return result

    def _changes(self, batch: pa.Table, batch_id: int) -> tuple[pa.Table, list[Change]]:
        names = batch.schema.names
        for column in (*self.key, self.time, self.row_kind_column):
            if column not in names:
                raise ChangelogConsistencyError(
                    f"batch {batch_id} has no column {column!r} (columns: {', '.join(names)}); key, time and "
                    "row_kind_column must name columns of the changelog"
                )
        for column in (self.valid_from, self.valid_to):
            if column in names:
                raise ChangelogConsistencyError(
                    f"batch {batch_id} already has a column {column!r}, which the history table adds; "
                    "rename it, or pass valid_from= / valid_to= names the changelog does not use"
                )
        data = to_delta_columns(batch.drop_columns([self.row_kind_column]))
        kinds = batch.column(self.row_kind_column).to_pylist()
        try:
            changes = [
                Change(RowKind.from_short_string(kind), row)
                for kind, row in zip(kinds, data.to_pylist(), strict=True)
            ]
            for index, change in enumerate(changes):
                key_tuple(change.row, self.key, index)
                event_time(change.row, self.time, index)
        except CdcflowError as error:
            raise ChangelogConsistencyError(
                f"batch {batch_id}: {error}; every change of a history needs a row kind (+I, -U, +U, -D), "
                f"its key {list(self.key)} and its time {self.time!r}"
            ) from error
        return data, changes

    def _open_keys(self, table: DeltaTable) -> set[tuple[Any, ...]]:
        rows = table.to_pyarrow_dataset(filesystem=table_filesystem(self.target, self.storage)).to_table(
            filter=pc.field(self.valid_to).is_null(), columns=list(self.key)
        )
        return {tuple(row[k] for k in self.key) for row in rows.to_pylist()}

    def _truncated(self, changes: list[Change], truncations: Sequence[Any]) -> list[Change]:
        """A delete at each truncation of each key open just before it (``changes`` in arrival order;
        placed before every change, a change at a truncation's time counts as after it)."""
        if not truncations:
            return []
        per_key: dict[tuple[Any, ...], list[Change]] = {}
        for index, change in enumerate(changes):
            if change.kind is not RowKind.UPDATE_BEFORE:
                per_key.setdefault(key_tuple(change.row, self.key, index), []).append(change)
        ends = []
        for timed in per_key.values():
            # (time, 0 for a truncation's delete: before the changes at its time, arrival order) each
            ordered = sorted(((c.row[self.time], 1, i, c) for i, c in enumerate(timed)), key=lambda t: t[:3])
            for at in sorted(set(truncations)):
                before = [entry for entry in ordered if entry[0] < at]
                if before and before[-1][3].kind is not RowKind.DELETE:
                    end = Change(RowKind.DELETE, {**before[-1][3].row, self.time: at})
                    ends.append(end)
                    ordered = sorted([*ordered, (at, 0, len(ordered), end)], key=lambda t: t[:3])
        return ends

    def _existing(self, table: DeltaTable, keys: set[tuple[Any, ...]]) -> list[Version]:
        if not keys:
            return []
        schema = pa.schema(table.schema().to_arrow())
        wanted = pa.table(
            {
                column: pa.array([k[i] for k in keys], schema.field(column).type)
                for i, column in enumerate(self.key)
            }
        )
        versions = []
        for index, row in enumerate(
            rows_of_keys(table, self.target, self.key, wanted, storage=self.storage).to_pylist()
        ):
            key = key_tuple(row, self.key, index)
            valid_from, valid_to = row.pop(self.valid_from), row.pop(self.valid_to)
            row.setdefault(self.time, valid_from)
            versions.append(Version(key, row, valid_from, valid_to))
        return versions

    def _late(self, existing: list[Version], changes: list[Change]) -> int:
        known: dict[tuple[Any, ...], Any] = {}
        for version in existing:
            latest = version.valid_from if version.valid_to is None else version.valid_to
            known[version.key] = max(known.get(version.key, latest), latest)
        return sum(
            1
            for index, change in enumerate(changes)
            if change.kind is not RowKind.UPDATE_BEFORE
            and (at := known.get(key_tuple(change.row, self.key, index))) is not None
            and change.row[self.time] < at
        )

    def _rows(self, data_schema: pa.Schema, versions: list[Version], upserts: int) -> pa.Table:
        """The merge source: the versions' rows with valid_from/valid_to, and the action per row."""
        time_type = data_schema.field(self.time).type
        schema = pa.schema(
            [
                *(
                    f.with_nullable(f.nullable and f.name not in self.key)
                    for f in data_schema
                    if self.keep_time or f.name != self.time
                ),
                pa.field(self.valid_from, time_type, nullable=False),
                pa.field(self.valid_to, time_type),
                pa.field(OP, pa.string(), nullable=False),
            ]
        )
        rows = [
            {
                **v.row,
                self.valid_from: v.valid_from,
                self.valid_to: v.valid_to,
                OP: "U" if i < upserts else "D",
            }
            for i, v in enumerate(versions)
        ]
        return pa.Table.from_pylist(rows, schema=schema)
