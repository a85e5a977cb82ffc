"""Changes as Flink prints them (``+I[101, scooter, 3.14]``), knowing each column's declared type.

The type matters for FLOAT: the value is a 32-bit float held in a Python float, printed as Java's
``Float.toString`` does (``3.14``, not ``3.140000104904175``).
"""

from __future__ import annotations

from typing import Any

from cdcflow.core.flinkstr import format_value
from cdcflow.core.model import Change
from cdcflow.formats.jsonenc import float32_repr
from cdcflow.formats.types import DataType, Schema, TypeKind


def render_value(value: Any, data_type: DataType) -> str:
    if value is None:
        return "null"
    kind = data_type.kind
    if kind is TypeKind.FLOAT and isinstance(value, float):
        text = float32_repr(value)
        return {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(text, text)
    if isinstance(value, bytes):
        # Flink prints BYTES as Java's signed byte array.
        return "[" + ", ".join(str(b - 256 if b > 127 else b) for b in value) + "]"
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
