"""Reading and merging Delta tables the way every cdcflow writer does: by key, marked, exactly once.

A writer's merge source carries ``_cdcflow_op``: ``U`` inserts or updates the target row with the same
identity, ``D`` deletes it. The commit records ``(app_id, batch_id)`` as a Delta application
transaction, which is how a replayed batch is recognised.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable, Transaction

from cdcflow.connectors.lakehouse.delta.merge import DATAFUSION, Merge
from cdcflow.connectors.lakehouse.delta.schema import conform
from cdcflow.connectors.lakehouse.delta.storage import LOCAL, S3, Storage, is_remote, scheme

PRUNING_LIST = 1000
"""Keys up to which a read by key prunes files by the list of keys, beyond it by their range."""


def open_table(path: str, storage: Storage = LOCAL) -> DeltaTable | None:
    options = storage.table_options()
    if not DeltaTable.is_deltatable(path, storage_options=options):
        return None
    return DeltaTable(path, storage_options=options)


def applied_version(table: DeltaTable | None, app_id: str) -> int:
    """The last batch id ``app_id`` committed to ``table`` (-1 when none)."""
    version = table.transaction_version(app_id) if table is not None else None
    return -1 if version is None else int(version)


def merge_marked(table: DeltaTable, path: str, merge: Merge) -> int:
    """``merge`` into ``table`` with delta-rs; the new version."""
    statement = merge.statement(lambda data: conform(table, data, merge.identity, path), DATAFUSION)
    merger = (
        table.merge(
            statement.source,
            predicate=statement.on,
            source_alias="s",
            target_alias="t",
            commit_properties=CommitProperties(app_transactions=[Transaction(merge.app_id, merge.batch_id)]),
        )
        .when_matched_delete(predicate=statement.delete)
        .when_matched_update(updates=dict(statement.update), predicate=statement.write)
        .when_not_matched_insert(updates=dict(statement.insert), predicate=statement.write)
    )
    if statement.delete_unmatched is not None:
        merger = merger.when_not_matched_by_source_delete(predicate=statement.delete_unmatched)
    merger.execute()
    return int(table.version())


def table_before(
    path: str, table: DeltaTable, app_id: str, batch_id: int, storage: Storage = LOCAL
) -> DeltaTable | None:
    """``table`` as it was before the commit that recorded ``batch_id`` (None: before it existed).

    Reads of a replayed batch whose target commit already landed must see what the first run saw.
    """
    options = storage.table_options()
    low, high = 0, int(table.version())
    while low < high:  # the first version whose application transaction has reached batch_id
        middle = (low + high) // 2
        if applied_version(DeltaTable(path, version=middle, storage_options=options), app_id) >= batch_id:
            high = middle
        else:
            low = middle + 1
    return DeltaTable(path, version=low - 1, storage_options=options) if low > 0 else None


def table_filesystem(path: str, storage: Storage = LOCAL) -> pafs.FileSystem | None:
    """pyarrow's own filesystem rooted at a table, for ``DeltaTable.to_pyarrow_dataset``: local, or S3.

    Reading through delta-rs's Python filesystem leaves Arrow threads that abort the interpreter at
    exit ("terminate called without an active exception", delta-rs#2184). None (delta-rs's) for the
    other object stores.
    """
    if is_remote(path) and scheme(path) not in S3:
        return None
    filesystem, root = storage.filesystem(path)
    return pafs.SubTreeFileSystem(root, filesystem)


def read_table(path: str, storage: Storage = LOCAL) -> pa.Table:
    """The current rows of the Delta table at ``path``, read through :func:`table_filesystem`."""
    table = DeltaTable(path, storage_options=storage.table_options())
    return table.to_pyarrow_dataset(filesystem=table_filesystem(path, storage)).to_table()


def rows_of_keys(
    table: DeltaTable,
    path: str,
    key: Sequence[str],
    keys: pa.Table,
    columns: Sequence[str] | None = None,
    storage: Storage = LOCAL,
) -> pa.Table:
    """The rows of ``table`` whose ``key`` columns equal one of the rows of ``keys`` (``columns`` of them).

    Files are pruned by the Delta log's statistics; delta-rs merges write strings as string_view, so
    each filter casts the column to the table's type before comparing.
    """
    schema = pa.schema(table.schema().to_arrow())
    pruning: list[tuple[str, str, object]] = []
    condition = None
    for column in key:
        kind = schema.field(column).type
        values = pc.unique(keys.column(column)).cast(kind)
        if (pa.types.is_integer(kind) or pa.types.is_string(kind)) and len(values):
            if len(values) <= PRUNING_LIST:
                pruning.append((column, "in", values.to_pylist()))
            else:  # delta-rs checks a long list against each file slowly: its range prunes as well
                low, high = pc.min_max(values).values()
                pruning += [(column, ">=", low.as_py()), (column, "<=", high.as_py())]
        clause = pc.field(column).cast(kind).isin(values)
        condition = clause if condition is None else condition & clause
    dataset = table.to_pyarrow_dataset(
        file_pruning_predicate=pruning or None, filesystem=table_filesystem(path, storage)
    )
    projection = None if columns is None else [*key, *(c for c in columns if c not in key)]
    rows = dataset.to_table(filter=condition, columns=projection)
    if len(key) == 1:
        return rows
    # Per-column filters admit cross combinations: keep the exact key tuples (joining on the keys
    # alone, since Arrow joins refuse nested payload columns).
    probe = rows.select(list(key)).append_column("_cdcflow_pos", pa.array(range(rows.num_rows), pa.int64()))
    wanted = keys.select(list(key)).group_by(list(key)).aggregate([])
    hits = probe.join(wanted, list(key), join_type="inner", use_threads=False)
    return rows.take(hits.column("_cdcflow_pos"))
