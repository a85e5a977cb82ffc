"""The table schema model (:mod:`cdcflow.formats.types`) as Spark and Arrow types, and changes as Arrow.

Spark checks a Python data source's record batches against its schema exactly (int32 vs int64,
string vs large_string, nullability, the timestamp's time zone), so every batch is built from the
Arrow schema derived here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa
from pyspark.sql import types as st
from pyspark.sql.pandas.types import to_arrow_schema

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats.types import DataType, Schema, TypeKind, parse_ddl

ARROW_TIMEZONE = "UTC"

_ATOMIC: dict[TypeKind, Callable[[], st.DataType]] = {
    TypeKind.BOOLEAN: st.BooleanType,
    TypeKind.TINYINT: st.ByteType,
    TypeKind.SMALLINT: st.ShortType,
    TypeKind.INT: st.IntegerType,
    TypeKind.BIGINT: st.LongType,
    TypeKind.FLOAT: st.FloatType,
    TypeKind.DOUBLE: st.DoubleType,
    TypeKind.STRING: st.StringType,
    TypeKind.BINARY: st.BinaryType,
    TypeKind.DATE: st.DateType,
    TypeKind.TIMESTAMP_NTZ: st.TimestampNTZType,
    TypeKind.TIMESTAMP_LTZ: st.TimestampType,
}


def spark_type(data_type: DataType) -> st.DataType:
    """The Spark type of a column. A DECIMAL without a scale (Debezium's variable-scale decimal) has no
    Spark type that keeps every value exactly: it becomes a STRING holding the exact decimal."""
    kind = data_type.kind
    if kind in _ATOMIC:
        return _ATOMIC[kind]()
    if kind is TypeKind.DECIMAL:
        if data_type.scale is None or data_type.precision is None:
            return st.StringType()
        return st.DecimalType(data_type.precision, data_type.scale)
    if kind is TypeKind.TIME:
        return st.TimeType(data_type.precision if data_type.precision is not None else 6)
    if kind is TypeKind.ARRAY:
        assert data_type.element is not None  # noqa: S101 - an ARRAY has an element type
        return st.ArrayType(spark_type(data_type.element), containsNull=True)
    if kind is TypeKind.MAP:
        assert data_type.key is not None and data_type.value is not None  # noqa: S101
        return st.MapType(spark_type(data_type.key), spark_type(data_type.value), valueContainsNull=True)
    return struct_type(Schema(data_type.fields))


def struct_type(schema: Schema) -> st.StructType:
    return st.StructType([st.StructField(f.name, spark_type(f.type), f.nullable) for f in schema])


def schema_of_struct(struct: st.StructType) -> Schema:
    """A Spark schema (from ``.schema(...)``) in the table schema model."""
    if not struct.fields:
        return Schema(())
    ddl = ", ".join(
        f"`{f.name}` {f.dataType.simpleString()}{'' if f.nullable else ' NOT NULL'}" for f in struct.fields
    )
    return parse_ddl(ddl)


def arrow_schema(struct: st.StructType) -> pa.Schema:
    """The Arrow schema Spark expects for record batches of ``struct``."""
    return to_arrow_schema(struct, timezone=ARROW_TIMEZONE, prefers_large_types=False)


def _exact_decimal_text(value: Any) -> Any:
    return str(value) if isinstance(value, Decimal) else value


def _value_adapter(data_type: DataType) -> Callable[[Any], Any] | None:
    """How a decoded value becomes what Arrow takes for the column's Spark type (None: as it is)."""
    kind = data_type.kind
    if kind is TypeKind.DECIMAL and data_type.scale is None:
        return _exact_decimal_text
    if kind is TypeKind.ARRAY and data_type.element is not None:
        element = _value_adapter(data_type.element)
        if element is not None:
            return lambda items: None if items is None else [element(item) for item in items]
    if kind is TypeKind.MAP and data_type.value is not None:
        value = _value_adapter(data_type.value)
        if value is not None:
            return lambda entries: None if entries is None else {k: value(v) for k, v in entries.items()}
    if kind is TypeKind.STRUCT:
        adapters = [(f.name, _value_adapter(f.type)) for f in data_type.fields]
        adapters = [(name, adapt) for name, adapt in adapters if adapt is not None]
        if adapters:
            return lambda row: None if row is None else _adapt_row(row, adapters)  # type: ignore[arg-type]
    return None


def _adapt_row(row: dict[str, Any], adapters: list[tuple[str, Callable[[Any], Any]]]) -> dict[str, Any]:
    out = dict(row)
    for name, adapt in adapters:
        out[name] = adapt(out.get(name))
    return out


class ChangeBatchBuilder:
    """Builds Arrow record batches of ``columns`` + the row kind column from decoded changes."""

    def __init__(self, columns: Schema, row_kind_column: str, target: pa.Schema) -> None:
        self.columns = columns
        self.row_kind_column = row_kind_column
        self.target = target
        self._adapters = [(f.name, _value_adapter(f.type)) for f in columns]

    def build(self, changes: Sequence[Change]) -> pa.RecordBatch:
        arrays = []
        for (name, adapt), arrow_field in zip(self._adapters, self.target, strict=False):
            values = [change.row.get(name) for change in changes]
            if adapt is not None:
                values = [adapt(value) for value in values]
            arrays.append(pa.array(values, type=arrow_field.type))
        arrays.append(pa.array([change.kind.value for change in changes], type=pa.string()))
        return pa.RecordBatch.from_arrays(arrays, schema=self.target)


def _from_arrow(value: Any, data_type: DataType) -> Any:
    if value is None:
        return None
    kind = data_type.kind
    if kind is TypeKind.DECIMAL and data_type.scale is None:
        return Decimal(value)
    if kind is TypeKind.MAP:
        assert data_type.key is not None and data_type.value is not None  # noqa: S101
        return {_from_arrow(k, data_type.key): _from_arrow(v, data_type.value) for k, v in value}
    if kind is TypeKind.ARRAY:
        assert data_type.element is not None  # noqa: S101
        return [_from_arrow(item, data_type.element) for item in value]
    if kind is TypeKind.STRUCT:
        return {f.name: _from_arrow(value.get(f.name), f.type) for f in data_type.fields}
    return value


def changes_from_arrow(table: pa.Table, columns: Schema, row_kind_column: str) -> list[Change]:
    """Spark's output (``DataFrame.toArrow()``) as changes of ``columns``, in row order."""
    kinds = {kind.value: kind for kind in RowKind}
    return [
        Change(kinds[row[row_kind_column]], {f.name: _from_arrow(row.get(f.name), f.type) for f in columns})
        for row in table.to_pylist()
    ]
