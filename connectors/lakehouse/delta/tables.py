"""Delta tables as every cdcflow writer reads, creates and merges them: by key, marked, exactly once.

The applier plans each batch on the driver in Arrow (ordering, late changes, unavailable values, key
state) and then reads and writes tables only through a :class:`TableBackend`: open or create a table,
read the rows of some keys, read its application transactions and properties, add columns, and merge
a marked source (``_cdcflow_op``: ``U`` inserts or updates the target row with the same identity, ``D``
deletes it) in one commit that records ``(app_id, batch_id)`` as a Delta application transaction, which
is how a replayed batch is recognised. Two back ends implement it: :class:`DeltaRsBackend` (delta-rs,
in the driver; the default) and :class:`~cdcflow.connectors.lakehouse.spark_backend.SparkDeltaBackend`
(Delta Lake's jars, the merge running on Spark's executors). Both write the same tables; either
continues the other's.

Arrow columns become Delta columns here too. Delta has no TIME, unsigned or duration types: TIME lands
as its ISO text (``'12:30:00.000001'``), unsigned integers widen to the next signed type, durations
become microseconds (BIGINT), and timestamps are microseconds (UTC when zoned). A column the table
lacks is added when it is nullable; a type the table's column cannot hold exactly, a new NOT NULL
column or a key column that changed type fails with :class:`DeltaSchemaError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable, Field, TableFeatures, Transaction, write_deltalake
from deltalake import Schema as DeltaSchema

from cdcflow.connectors.errors import DeltaSchemaError
from cdcflow.connectors.lakehouse.delta.merge import DATAFUSION, Merge
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
            commit_properties=CommitProperties(
                app_transactions=[Transaction(merge.app_id, merge.batch_id)],
                custom_metadata=dict(merge.metadata) if merge.metadata else None,
            ),
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


class TableHandle(Protocol):
    """One Delta table at one version, as a back end reads and writes it."""

    path: str

    def version(self) -> int: ...

    def applied_version(self, app_id: str) -> int:
        """The last batch id ``app_id`` committed (-1 when none)."""
        ...

    def before(self, app_id: str, batch_id: int) -> TableHandle | None:
        """The table before the commit that recorded ``batch_id`` (None: before the table existed)."""
        ...

    def schema(self) -> pa.Schema: ...

    def properties(self) -> Mapping[str, str]: ...

    def set_properties(self, values: Mapping[str, str]) -> None: ...

    def rows_of_keys(
        self, key: Sequence[str], keys: pa.Table, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """The rows whose ``key`` equals a row of ``keys`` (the key and ``columns``, or all columns)."""
        ...

    def rows_where(self, equal: Mapping[str, int], null: Sequence[str]) -> pa.Table:
        """The rows whose ``equal`` columns hold the given values and whose ``null`` columns are NULL."""
        ...

    def merge(self, merge: Merge) -> int:
        """Runs ``merge`` in one commit; the new version."""
        ...


class TableBackend(Protocol):
    name: str

    def open(self, path: str) -> TableHandle | None: ...

    def create(self, path: str, schema: pa.Schema, key: Sequence[str]) -> TableHandle:
        """A new empty table with ``schema`` (``key`` columns NOT NULL); an existing one is kept."""
        ...


def applied(table: TableHandle | None, app_id: str) -> int:
    return -1 if table is None else table.applied_version(app_id)


@dataclass
class RsTable:
    """A table read and written with delta-rs."""

    path: str
    table: DeltaTable
    storage: Storage = dataclasses.field(default=LOCAL, repr=False)

    def version(self) -> int:
        return int(self.table.version())

    def applied_version(self, app_id: str) -> int:
        return applied_version(self.table, app_id)

    def before(self, app_id: str, batch_id: int) -> RsTable | None:
        table = table_before(self.path, self.table, app_id, batch_id, self.storage)
        return RsTable(self.path, table, self.storage) if table is not None else None

    def schema(self) -> pa.Schema:
        return table_schema(self.table)

    def properties(self) -> Mapping[str, str]:
        return dict(self.table.metadata().configuration)

    def set_properties(self, values: Mapping[str, str]) -> None:
        self.table.alter.set_table_properties(dict(values), raise_if_not_exists=False)

    def rows_of_keys(
        self, key: Sequence[str], keys: pa.Table, columns: Sequence[str] | None = None
    ) -> pa.Table:
        return rows_of_keys(self.table, self.path, key, keys, columns, self.storage)

    def rows_where(self, equal: Mapping[str, int], null: Sequence[str]) -> pa.Table:
        dataset = self.table.to_pyarrow_dataset(filesystem=table_filesystem(self.path, self.storage))
        return dataset.to_table(filter=where(equal, null))

    def merge(self, merge: Merge) -> int:
        return merge_marked(self.table, self.path, merge)


def where(equal: Mapping[str, int], null: Sequence[str]) -> pc.Expression | None:
    """The rows whose ``equal`` columns hold the given values and whose ``null`` columns are NULL."""
    condition = None
    for column, value in equal.items():
        clause = pc.field(column) == value
        condition = clause if condition is None else condition & clause
    for column in null:
        clause = pc.field(column).is_null()
        condition = clause if condition is None else condition & clause
    return condition


class DeltaRsBackend:
    """delta-rs in the driver: no JVM needed (the default). ``storage`` reaches object stores."""

    name = "delta-rs"

    def __init__(self, storage: Storage = LOCAL) -> None:
        self.storage = storage

    def open(self, path: str) -> RsTable | None:
        table = open_table(path, self.storage)
        return RsTable(path, table, self.storage) if table is not None else None

    def create(self, path: str, schema: pa.Schema, key: Sequence[str]) -> RsTable:
        return RsTable(path, create_table(path, schema, key, self.storage.table_options()), self.storage)


DELTA_RS = DeltaRsBackend()
BACKENDS = ("delta-rs", "spark")


_UNSIGNED = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64()}


def delta_type(kind: pa.DataType) -> pa.DataType:
    """The type a Delta column holds for values of ``kind``."""
    if pa.types.is_time(kind):
        return pa.string()
    if kind in _UNSIGNED:
        return _UNSIGNED[kind]
    if kind == pa.uint64():
        return pa.decimal128(20, 0)
    if pa.types.is_duration(kind):
        return pa.int64()
    if pa.types.is_timestamp(kind):
        return pa.timestamp("us", tz="UTC" if kind.tz is not None else None)
    if pa.types.is_large_string(kind) or pa.types.is_null(kind):
        return pa.string()
    if pa.types.is_large_binary(kind):
        return pa.binary()
    if pa.types.is_dictionary(kind):
        return delta_type(kind.value_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.list_(pa.field("element", delta_type(kind.value_type), kind.value_field.nullable))
    if pa.types.is_map(kind):
        return pa.map_(delta_type(kind.key_type), delta_type(kind.item_type))
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, delta_type(f.type), f.nullable) for f in kind])
    return kind


def to_delta_columns(table: pa.Table) -> pa.Table:
    """``table`` with every column cast to the type Delta stores it as."""
    fields = [pa.field(f.name, delta_type(f.type), f.nullable) for f in table.schema]
    columns = [_convert(table.column(i), field.type) for i, field in enumerate(fields)]
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _convert(column: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    if column.type == target:
        return column
    if pa.types.is_time(column.type):
        return column.cast(pa.time64("us")).cast(pa.string())
    if pa.types.is_duration(column.type):
        return column.cast(pa.duration("us")).cast(pa.int64())
    return column.cast(target)


def table_schema(table: DeltaTable) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())


def create_table(
    path: str, schema: pa.Schema, key: Sequence[str], storage_options: dict[str, str] | None = None
) -> DeltaTable:
    fields = [pa.field(f.name, f.type, f.nullable and f.name not in key) for f in schema]
    table = DeltaTable.create(path, schema=pa.schema(fields), mode="ignore", storage_options=storage_options)
    _list_not_null(table)
    return table


def _list_not_null(table: DeltaTable) -> None:
    """delta-rs leaves NOT NULL's feature out of a table-features protocol (a TIMESTAMP_NTZ column
    makes one, at creation or when added), and Delta Lake on Spark then refuses the table
    (DELTA_FEATURES_PROTOCOL_METADATA_MISMATCH): list it."""
    protocol = table.protocol()
    if protocol.min_writer_version < 7 or "invariants" in (protocol.writer_features or []):
        return
    if not all(f.nullable for f in table_schema(table)):
        table.alter.add_feature(TableFeatures.Invariants, allow_protocol_versions_increase=True)


def conform(table: DeltaTable, data: pa.Table, key: Sequence[str], path: str) -> pa.Table:
    """``data`` shaped like ``table``'s columns, after adding the nullable columns the table lacks (and
    NOT NULL's feature, which a job killed between :func:`create_table`'s two commits left unlisted)
    and widening those ``data`` holds in a wider type."""
    _list_not_null(table)

    def add(fields: list[pa.Field]) -> pa.Schema:
        table.alter.add_columns(list[Field](DeltaSchema.from_arrow(pa.schema(fields)).fields))
        _list_not_null(table)
        return table_schema(table)

    def widen(fields: list[pa.Field]) -> pa.Schema:
        # delta-rs cannot change a column's type (Delta's typeWidening feature): the table is rewritten
        # once, in one commit, with the wider types; its properties and transactions are kept.
        wider = {f.name: f.type for f in fields}
        schema = pa.schema([f.with_type(wider.get(f.name, f.type)) for f in table_schema(table)])
        write_deltalake(
            table, table.to_pyarrow_table().cast(schema), mode="overwrite", schema_mode="overwrite"
        )
        table.update_incremental()
        return table_schema(table)

    return conform_to(table_schema(table), add, data, key, path, widen)


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether a column of ``old`` type widens to ``new`` exactly (the changes of Delta's typeWidening
    that :func:`cdcflow.formats.types.widens` names, in Arrow's types)."""
    integers = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
    if old in integers and new in integers:
        return integers.index(new) > integers.index(old)
    if pa.types.is_float32(old):
        return bool(pa.types.is_float64(new))
    return bool(
        pa.types.is_decimal(old)
        and pa.types.is_decimal(new)
        and old.scale == new.scale
        and new.precision > old.precision
    )


def conform_to(
    existing: pa.Schema,
    add_columns: Callable[[list[pa.Field]], pa.Schema],
    data: pa.Table,
    key: Sequence[str],
    path: str,
    widen_columns: Callable[[list[pa.Field]], pa.Schema] | None = None,
) -> pa.Table:
    """``data`` shaped like a table of ``existing`` columns, after ``add_columns`` (which returns the
    table's new schema) added the nullable columns it lacks and ``widen_columns`` widened the columns
    ``data`` holds in a wider type (:func:`widens`)."""
    given = {f.name: f.type for f in data.schema}
    wider = [
        f.with_type(given[f.name]) for f in existing if f.name in given and widens(f.type, given[f.name])
    ]
    if wider and widen_columns is not None:
        existing = widen_columns(wider)
    names = set(existing.names)
    added = [f for f in data.schema if f.name not in names]
    for field in added:
        if not field.nullable:
            raise DeltaSchemaError(
                f"column {field.name!r} is new and NOT NULL, but the Delta table at {path} already has rows "
                "without it; declare it nullable in the changelog's columns, or write to a new table"
            )
    if added:
        existing = add_columns([f.with_nullable(True) for f in added])
    columns = []
    for field in existing:
        if field.name not in data.schema.names:
            if not field.nullable or field.name in key:
                raise DeltaSchemaError(
                    f"the changelog has no column {field.name!r}, which the Delta table at {path} needs "
                    "(it is NOT NULL or part of the key); add it to the changelog's columns"
                )
            columns.append(pa.nulls(data.num_rows, field.type))
            continue
        columns.append(_cast_exactly(data.column(field.name), field, key, path))
    return pa.Table.from_arrays(columns, schema=existing)


def _cast_exactly(column: pa.ChunkedArray, field: pa.Field, key: Sequence[str], path: str) -> pa.ChunkedArray:
    if column.type == field.type:
        return column
    if _same_family(column.type, field.type):
        try:
            cast = column.cast(field.type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        else:
            if pc.all(pc.equal(cast.cast(column.type), column)).as_py() in (True, None):
                return cast
    raise DeltaSchemaError(
        f"column {field.name!r} is {column.type} in the changelog but {field.type} in the Delta table at "
        f"{path}; this change is not additive: write to a new table, or rewrite the table with the new type"
    )


def _same_family(source: pa.DataType, target: pa.DataType) -> bool:
    checks = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_timestamp)
    return any(check(source) and check(target) for check in checks) or (
        pa.types.is_integer(source) and pa.types.is_decimal(target)
    )
