"""Spark output back in the engine's terms, to compare with the format golden files."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from pyspark.sql import DataFrame

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import DataType, Schema, TypeKind, render_change


def _value(value: Any, data_type: DataType) -> Any:
    if value is None:
        return None
    kind = data_type.kind
    if kind is TypeKind.DECIMAL and data_type.scale is None:
        return Decimal(value)
    if kind is TypeKind.MAP:
        assert data_type.key is not None and data_type.value is not None
        return {_value(k, data_type.key): _value(v, data_type.value) for k, v in value}
    if kind is TypeKind.ARRAY:
        assert data_type.element is not None
        return [_value(item, data_type.element) for item in value]
    if kind is TypeKind.STRUCT:
        return {f.name: _value(value.get(f.name), f.type) for f in data_type.fields}
    return value


def collect_changes(df: DataFrame, schema: Schema, row_kind_column: str = "_row_kind") -> list[Change]:
    """The DataFrame's rows as changes, in Spark's order (through Arrow: time zones stay explicit)."""
    changes = []
    for row in df.toArrow().to_pylist():
        kind = RowKind.from_short_string(row.pop(row_kind_column))
        changes.append(Change(kind, {f.name: _value(row.get(f.name), f.type) for f in schema}))
    return changes


def rendered(df: DataFrame, schema: Schema) -> list[str]:
    return [render_change(change, schema) for change in collect_changes(df, schema)]
