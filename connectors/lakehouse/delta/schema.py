"""Arrow columns as Delta columns: type mapping, table creation and additive schema evolution.

Delta has no TIME, unsigned or duration types: TIME lands as its ISO text (``'12:30:00.000001'``),
unsigned integers widen to the next signed type, durations become microseconds (BIGINT), and
timestamps are microseconds (UTC when zoned). A column the table lacks is added when it is nullable;
a type the table's column cannot hold exactly, a new NOT NULL column or a key column that changed type
fails with :class:`DeltaSchemaError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, Field, TableFeatures
from deltalake import Schema as DeltaSchema

from cdcflow.connectors.errors import DeltaSchemaError

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
    NOT NULL's feature, which a job killed between :func:`create_table`'s two commits left unlisted)."""
    _list_not_null(table)

    def add(fields: list[pa.Field]) -> pa.Schema:
        table.alter.add_columns(list[Field](DeltaSchema.from_arrow(pa.schema(fields)).fields))
        _list_not_null(table)
        return table_schema(table)

    return conform_to(table_schema(table), add, data, key, path)


def conform_to(
    existing: pa.Schema,
    add_columns: Callable[[list[pa.Field]], pa.Schema],
    data: pa.Table,
    key: Sequence[str],
    path: str,
) -> pa.Table:
    """``data`` shaped like a table of ``existing`` columns, after ``add_columns`` (which returns the
    table's new schema) added the nullable columns it lacks."""
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
