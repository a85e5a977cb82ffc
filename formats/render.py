"""Changes as Flink prints them (``+I[101, scooter, 3.14]``), knowing each column's declared type.

The type matters for FLOAT (a 32-bit float held in a Python float: ``3.14``, not ``3.140000104904175``)
and for nested rows (``+I[...]``, where an untyped dict prints as a map). The leaf rules are
``cdcflow.core.render``'s, the ones ``str(change)`` uses.
"""

from __future__ import annotations

from typing import Any

from cdcflow.core.model import Change
from cdcflow.core.render import format_value, java_float
from cdcflow.formats.types import DataType, Schema, TypeKind


def render_value(value: Any, data_type: DataType) -> str:
    if value is None:
        return "null"
    kind = data_type.kind
    if kind is TypeKind.FLOAT and isinstance(value, float):
        return java_float(value)
    if kind is TypeKind.ARRAY and data_type.element is not None:
        return "[" + ", ".join(render_value(v, data_type.element) for v in value) + "]"
    if kind is TypeKind.MAP and data_type.key is not None and data_type.value is not None:
        key_type, value_type = data_type.key, data_type.value
        items = (f"{render_value(k, key_type)}={render_value(v, value_type)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if kind is TypeKind.STRUCT:
        return "+I[" + ", ".join(render_value(value.get(f.name), f.type) for f in data_type.fields) + "]"
    return format_value(value)


def render_change(change: Change, schema: Schema) -> str:
    row = change.row
    values = ", ".join(render_value(row.get(f.name), f.type) for f in schema)
    return f"{change.kind.value}[{values}]"
