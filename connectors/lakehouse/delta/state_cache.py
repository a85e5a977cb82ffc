"""The key state kept in the driver between batches (the delta-rs back end).

A batch reads the key state of its keys and rewrites the rows of the keys it changed (:mod:`.key_state`):
a read and a merge, each a pass over a table whose every file a batch's keys usually reach. While the
state table is at the version this applier last saw, its rows are the ones kept in memory: reads answer
from them, and a batch's :class:`~.merge.Merge` is applied to them as delta-rs would apply it and
written as the table's whole new content in one commit, an overwrite that records the batch's
application transaction (exactly once, as the merge's commit). Another version (a restart, another
writer) reads the table again; a state of more than :data:`CACHED_ROWS` rows stays in the table and
merges as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import ColumnProperties, CommitProperties, Transaction, WriterProperties, write_deltalake

from cdcflow.connectors.lakehouse.delta.batch import group_ids, rows_with_keys
from cdcflow.connectors.lakehouse.delta.merge import OP, Before, Clause, Every, Merge
from cdcflow.connectors.lakehouse.delta.tables import (
    RsTable,
    TableHandle,
    conform,
    table_filesystem,
    where,
)

CACHED_ROWS = 1_000_000
"""The most rows of key state the driver keeps between batches (~100 bytes a row)."""
_STATE_FILES = WriterProperties(
    compression="SNAPPY", default_column_properties=ColumnProperties(dictionary_enabled=False)
)
"""delta-rs's compression (given properties, it takes none); without dictionaries: keys and sequences
are distinct per row, a dictionary saves nothing and cost a third of each write."""


@dataclass
class StateCache:
    """The rows of the key state table at ``version`` (None: nothing kept)."""

    rows: pa.Table | None = None
    version: int = -1
    limit: int = CACHED_ROWS

    def wrap(self, state: TableHandle | None) -> TableHandle | None:
        """``state``, answered from memory when it is a delta-rs table of at most ``limit`` rows."""
        if not isinstance(state, RsTable):
            self.rows = None  # a table made again may come back at a version number seen before
            return state
        version = state.version()
        if self.rows is None or self.version != version:
            self.rows = None
            counts = pa.table(state.table.get_add_actions(flatten=True)).column("num_records")
            if counts.null_count or (pc.sum(counts).as_py() or 0) > self.limit:
                return state
            dataset = state.table.to_pyarrow_dataset(filesystem=table_filesystem(state.path, state.storage))
            self.rows, self.version = dataset.to_table(), version
        return CachedState(state, self)


@dataclass
class CachedState:
    """A key state table whose rows are in ``cache`` (see the module)."""

    table: RsTable
    cache: StateCache
    path: str = field(init=False)

    def __post_init__(self) -> None:
        self.path = self.table.path

    @property
    def rows(self) -> pa.Table:
        assert self.cache.rows is not None  # noqa: S101 - wrap keeps a CachedState only with rows
        return self.cache.rows

    def version(self) -> int:
        return self.table.version()

    def applied_version(self, app_id: str) -> int:
        return self.table.applied_version(app_id)

    def before(self, app_id: str, batch_id: int) -> TableHandle | None:
        return self.table.before(app_id, batch_id)

    def schema(self) -> pa.Schema:
        return self.table.schema()

    def properties(self) -> Mapping[str, str]:
        return self.table.properties()

    def set_properties(self, values: Mapping[str, str]) -> None:
        self.table.set_properties(values)
        self.cache.version = self.table.version()

    def rows_of_keys(
        self, key: Sequence[str], keys: pa.Table, columns: Sequence[str] | None = None
    ) -> pa.Table:
        rows = rows_with_keys(self.rows, keys, key)
        return rows if columns is None else rows.select([*key, *(c for c in columns if c not in key)])

    def rows_where(self, equal: Mapping[str, int], null: Sequence[str]) -> pa.Table:
        condition = where(equal, null)
        return self.rows if condition is None else self.rows.filter(condition)

    def merge(self, merge: Merge) -> int:
        identity = list(merge.identity)
        source = merge.source
        rows_ids, source_ids = _identities(self.rows, source, identity)
        if merge.unavailable is not None or _repeats(source_ids):
            self.cache.rows = None  # what delta-rs makes of them: its merge, and the table read again
            return self.table.merge(merge)
        data = conform(self.table.table, source.drop_columns([OP]), identity, self.path)
        rows = _shaped(self.rows, self.table.schema())
        found = pc.index_in(pa.array(rows_ids), value_set=pa.array(source_ids))
        at = np.asarray(found.fill_null(-1), dtype=np.int64)
        written = _merged(rows, data, source, at, merge.delete_unmatched)
        write_deltalake(
            self.table.table,
            written,
            mode="overwrite",
            writer_properties=_STATE_FILES,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(merge.app_id, merge.batch_id)],
                custom_metadata=dict(merge.metadata) if merge.metadata else None,
            ),
        )
        version = self.table.version()  # the handle is at the version this write made
        self.cache.rows, self.cache.version = (
            (written if written.num_rows <= self.cache.limit else None),
            version,
        )
        return version


def _identities(rows: pa.Table, source: pa.Table, identity: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``rows`` and of ``source``, a number standing for its identity (equal for equal ones)."""
    both = pa.concat_tables(
        [rows.select(identity), source.select(identity).cast(rows.select(identity).schema)]
    )
    ids = group_ids(both, identity)
    return ids[: rows.num_rows], ids[rows.num_rows :]


def _repeats(ids: np.ndarray) -> bool:
    """Whether an identity comes twice (``group_ids``' ids, bounded, are counted; a join's -1 is not one)."""
    if not len(ids):
        return False
    if ids.min() < 0:
        return len(np.unique(ids)) < len(ids)
    return bool(np.bincount(ids).max() > 1)


def _shaped(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """The kept rows with the table's columns (``conform`` may have added or widened some)."""
    columns = [
        rows.column(f.name).cast(f.type) if f.name in rows.schema.names else pa.nulls(rows.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _merged(
    rows: pa.Table, data: pa.Table, source: pa.Table, at: np.ndarray, unmatched: Sequence[Clause]
) -> pa.Table:
    """``rows`` after the merge of ``data`` (``source``'s rows shaped like the table; ``source`` has the
    ``_cdcflow_op`` marks and says which columns an update assigns); ``at``: per row, the source row of
    its identity or -1."""
    matched = at >= 0
    writes = np.asarray(pc.equal(source.column(OP), "U").combine_chunks(), dtype=bool)
    updated = np.zeros(rows.num_rows, dtype=bool)
    updated[matched] = writes[at[matched]]
    named = np.zeros(data.num_rows, dtype=bool)
    named[at[matched]] = True
    kept = ~matched & ~_expired(rows, unmatched)
    present = set(source.schema.names)
    take = pa.array(at[updated])
    changed = pa.Table.from_arrays(
        [
            data.column(f.name).take(take) if f.name in present else rows.column(f.name).filter(updated)
            for f in rows.schema
        ],
        schema=rows.schema,
    )
    inserted = data.filter(pa.array(writes & ~named)).cast(rows.schema)
    return pa.concat_tables([rows.filter(pa.array(kept)), changed, inserted]).combine_chunks()


def _expired(rows: pa.Table, clauses: Sequence[Clause]) -> np.ndarray:
    """Per row, whether one of ``clauses`` deletes it (a NULL compares false, as in SQL)."""
    expired = np.zeros(rows.num_rows, dtype=bool)
    for clause in clauses:
        if isinstance(clause, Every):
            return np.ones(rows.num_rows, dtype=bool)
        column = rows.column(clause.column)
        if isinstance(clause, Before):
            test = pc.less(column, pa.scalar(clause.moment, column.type))
        else:
            test = pc.not_equal(column, clause.value)
        expired |= np.asarray(pc.fill_null(test, False), dtype=bool)
    return expired
