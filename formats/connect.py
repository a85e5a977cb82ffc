"""Kafka Connect schemas (the ``schema`` block of the JSON converter) → column types and decoders.

Flink ignores this block; we read it, so Debezium's logical types come out as proper values:
``Decimal`` (base64 two's complement, the schema's scale), ``VariableScaleDecimal``, the
``io.debezium.time`` and Connect ``Date``/``Time``/``Timestamp`` types, ``ZonedTimestamp`` (an instant,
in UTC), ``Json``/``Uuid``/``Enum`` (text) and bytes.

A malformed schema block (fields that are not a list, a field without a name or type, decimal
parameters that are not integers, nesting deeper than :data:`MAX_SCHEMA_DEPTH`) is a
:class:`SchemaError` naming the field, never a raw exception.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import re
from collections.abc import Hashable, Mapping
from decimal import Decimal
from typing import Any

from cdcflow.formats import decimals, temporal
from cdcflow.formats import json_decode as values
from cdcflow.formats.errors import FieldError, SchemaError, excerpt
from cdcflow.formats.json_decode import Converter
from cdcflow.formats.types import DataType, Field, Schema, TypeKind, atomic

CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
#: The deepest nesting of arrays, maps and structs a Connect schema may have.
MAX_SCHEMA_DEPTH = 64

_PLAIN = {
    "int8": TypeKind.TINYINT,
    "int16": TypeKind.SMALLINT,
    "int32": TypeKind.INT,
    "int64": TypeKind.BIGINT,
    "float32": TypeKind.FLOAT,
    "float64": TypeKind.DOUBLE,
    "double": TypeKind.DOUBLE,  # written by old Debezium releases
    "float": TypeKind.FLOAT,
    "boolean": TypeKind.BOOLEAN,
    "string": TypeKind.STRING,
    "bytes": TypeKind.BINARY,
}
# Logical name → (type kind, precision): the precision also picks the integer unit (ms/µs/ns).
_TEMPORAL = {
    "org.apache.kafka.connect.data.Date": (TypeKind.DATE, None),
    "io.debezium.time.Date": (TypeKind.DATE, None),
    "org.apache.kafka.connect.data.Time": (TypeKind.TIME, 3),
    "io.debezium.time.Time": (TypeKind.TIME, 3),
    "io.debezium.time.MicroTime": (TypeKind.TIME, 6),
    "io.debezium.time.NanoTime": (TypeKind.TIME, 9),
    "org.apache.kafka.connect.data.Timestamp": (TypeKind.TIMESTAMP_NTZ, 3),
    "io.debezium.time.Timestamp": (TypeKind.TIMESTAMP_NTZ, 3),
    "io.debezium.time.MicroTimestamp": (TypeKind.TIMESTAMP_NTZ, 6),
    "io.debezium.time.NanoTimestamp": (TypeKind.TIMESTAMP_NTZ, 9),
    "io.debezium.time.ZonedTimestamp": (TypeKind.TIMESTAMP_LTZ, 6),
}


def column_type(schema: Mapping[str, Any], path: str = "", depth: int = 0) -> tuple[DataType, Converter]:
    """The column type a Connect field schema stands for, and the converter for its JSON values."""
    if not isinstance(schema, Mapping):
        raise SchemaError(f"field '{path}': a Connect schema must be a JSON object, got {excerpt(schema)}")
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaError(f"field '{path}': the Connect schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
    kind = schema.get("type")
    name = schema.get("name")
    if not isinstance(kind, str) or not isinstance(name, str | None):
        raise SchemaError(
            f"field '{path}': a Connect schema's 'type' and 'name' must be strings, got type "
            f"{excerpt(kind)} and name {excerpt(name)}"
        )
    if name in _TEMPORAL:
        temporal_kind, precision = _TEMPORAL[name]
        data_type = atomic(temporal_kind, precision)
        return data_type, values.converter(data_type)
    if name == CONNECT_DECIMAL:
        parameters = schema.get("parameters") or {}
        if not isinstance(parameters, Mapping):
            raise SchemaError(f"field '{path}': the Decimal's 'parameters' must be an object")
        scale = _integer_parameter(parameters, "scale", 0, path)
        precision = _integer_parameter(parameters, "connect.decimal.precision", 38, path)
        if abs(scale) > decimals.MAX_DECIMAL_SCALE or not 1 <= precision <= decimals.MAX_DECIMAL_DIGITS:
            raise SchemaError(
                f"field '{path}': a Decimal takes a scale within ±{decimals.MAX_DECIMAL_SCALE:,} and a "
                f"precision from 1 to {decimals.MAX_DECIMAL_DIGITS:,}, got scale {scale} and precision "
                f"{precision}"
            )
        data_type = atomic(TypeKind.DECIMAL, max(precision, scale, 1), scale)
        return data_type, _connect_decimal(data_type)
    if name == VARIABLE_SCALE_DECIMAL:
        return atomic(TypeKind.DECIMAL), _variable_decimal
    if kind in _PLAIN:
        data_type = atomic(_PLAIN[kind])
        return data_type, values.converter(data_type)
    if kind == "array":
        element_type, element_converter = column_type(_child(schema, "items", path), path + "[]", depth + 1)
        return DataType(TypeKind.ARRAY, element=element_type), _array(element_converter)
    if kind == "map":
        key_type, key_converter = column_type(_child(schema, "keys", path), path + ".key", depth + 1)
        value_type, value_converter = column_type(_child(schema, "values", path), path + ".value", depth + 1)
        return DataType(TypeKind.MAP, key=key_type, value=value_type), _map(key_converter, value_converter)
    if kind == "struct":
        struct_schema, converters = struct_columns(schema, path, depth + 1)
        row = values.RowConverter(struct_schema, converters=converters)
        return DataType(TypeKind.STRUCT, fields=struct_schema.fields), row.convert_value
    raise SchemaError(f"field '{path}': unknown Kafka Connect schema type {excerpt(kind)}")


def struct_columns(
    schema: Mapping[str, Any], path: str = "", depth: int = 0
) -> tuple[Schema, dict[str, Converter]]:
    """The columns of a Connect ``struct`` schema and a converter per column."""
    fields = []
    converters = {}
    for child in _fields(schema, path):
        name = child.get("field")
        if not isinstance(name, str):
            raise SchemaError(f"field '{path}': a struct field has no name")
        child_path = f"{path}.{name}" if path else name
        optional = child.get("optional", True)
        if not isinstance(optional, bool):
            raise SchemaError(
                f"field '{child_path}': 'optional' must be true or false, got {excerpt(optional)}"
            )
        if name in converters:
            raise SchemaError(f"field '{child_path}': the struct has two fields of this name")
        data_type, convert = column_type(child, child_path, depth)
        fields.append(Field(name, data_type, optional))
        converters[name] = convert
    return Schema(tuple(fields)), converters


def envelope_field(envelope_schema: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """The envelope's field schema called ``name`` (``after``, ``before``); a malformed envelope schema
    is a :class:`FieldError` of the message's ``schema``."""
    try:
        children = _fields(envelope_schema, "")
    except SchemaError as error:
        raise FieldError("schema", str(error)) from None
    for child in children:
        if child.get("field") == name:
            return child
    return None


def _fields(schema: Mapping[str, Any], path: str) -> list[Mapping[str, Any]]:
    """A struct schema's ``fields``: a list of objects."""
    fields = schema.get("fields") or []
    if not isinstance(fields, list) or not all(isinstance(child, Mapping) for child in fields):
        raise SchemaError(
            f"field '{path}': a struct schema's 'fields' must be a list of objects, got {excerpt(fields)}"
        )
    return fields


_INTEGER = re.compile(r"-?[0-9]+")  # ASCII digits: str.isdigit() also takes "²", which int() refuses


def _integer_parameter(parameters: Mapping[str, Any], key: str, default: int, path: str) -> int:
    """A Decimal parameter: Connect writes them as text ("2"); an integer is taken too."""
    value = parameters.get(key, default)
    if value.__class__ is int:
        return int(value)
    if isinstance(value, str) and len(value) <= 20 and _INTEGER.fullmatch(value.strip(" ")):
        return int(value.strip(" "))
    raise SchemaError(
        f"field '{path}': the Decimal parameter '{key}' must be an integer, got {excerpt(value)}"
    )


def _child(schema: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    child = schema.get(key)
    if not isinstance(child, Mapping):
        raise SchemaError(f"field '{path}': the Connect schema has no '{key}'")
    return child


def _connect_decimal(data_type: DataType) -> Converter:
    """A Connect Decimal: base64 unscaled bytes at the schema's scale, which must fit its declared
    precision (refused by length before converting)."""
    scale = data_type.scale or 0
    precision = data_type.precision
    from_number = values.converter(data_type)

    def convert(value: Any) -> Any:
        if isinstance(value, str):
            number = decimals.decimal_from_base64(value, scale, precision)
            return decimals.fits_decimal(number, precision, scale)
        if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
            return from_number(value)
        raise FieldError("", f"expected a base64 Connect Decimal, got {type(value).__name__}")

    return convert


def _variable_decimal(value: Any) -> Any:
    if not isinstance(value, Mapping):
        raise FieldError("", f"expected a VariableScaleDecimal struct, got {type(value).__name__}")
    return decimals.variable_scale_decimal(value)


def _array(element: Converter) -> Converter:
    def convert(value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise FieldError("", f"expected an array, got {type(value).__name__}")
        out = []
        for index, item in enumerate(value):
            try:
                out.append(None if item is None else element(item))
            except FieldError as error:
                raise FieldError(values.join_path(f"[{index}]", error.field), error.reason) from None
        return out

    return convert


_ENTRY = {"key", "value"}


def _map(key: Converter, value_converter: Converter) -> Converter:
    def convert(value: Any) -> dict[Any, Any]:
        # The JSON converter writes string-keyed maps as objects, other maps as [[k, v], ...]; the JSON
        # Schema converter as [{"key": k, "value": v}, ...].
        if isinstance(value, Mapping):
            pairs = list(value.items())
        elif isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value):
            pairs = value
        elif isinstance(value, list) and all(isinstance(p, Mapping) and p.keys() == _ENTRY for p in value):
            pairs = [(p["key"], p["value"]) for p in value]
        else:
            raise FieldError("", f"expected a map (an object, or [key, value] pairs), got {excerpt(value)}")
        out = {}
        for index, (k, v) in enumerate(pairs):
            try:
                converted = key(k)
                item = None if v is None else value_converter(v)
            except FieldError as error:
                raise FieldError(values.join_path(f"[{index}]", error.field), error.reason) from None
            if not isinstance(converted, Hashable):  # a struct or an array as a key
                raise FieldError(f"[{index}]", f"a map key cannot be {excerpt(converted)}")
            out[converted] = item
        return out

    return convert


# The encoder side: our column types → Connect schemas, and Python values → their JSON encoding.


def connect_schema(data_type: DataType, *, optional: bool, field_name: str | None = None) -> dict[str, Any]:
    """The Connect schema Debezium would write for a column of this type."""
    kind = data_type.kind
    out: dict[str, Any]
    if kind is TypeKind.DECIMAL and data_type.scale is None:
        out = {
            "type": "struct",
            "fields": [
                {"type": "int32", "optional": False, "field": "scale"},
                {"type": "bytes", "optional": False, "field": "value"},
            ],
            "name": VARIABLE_SCALE_DECIMAL,
            "version": 1,
            "doc": "Variable scaled decimal",
        }
    elif kind is TypeKind.DECIMAL:
        out = {
            "type": "bytes",
            "name": CONNECT_DECIMAL,
            "version": 1,
            "parameters": {
                "scale": str(data_type.scale),
                "connect.decimal.precision": str(data_type.precision),
            },
        }
    elif kind is TypeKind.DATE:
        out = {"type": "int32", "name": "io.debezium.time.Date", "version": 1}
    elif kind is TypeKind.TIME:
        out = {"type": "int64", "name": "io.debezium.time.MicroTime", "version": 1}
    elif kind is TypeKind.TIMESTAMP_NTZ:
        out = {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1}
    elif kind is TypeKind.TIMESTAMP_LTZ:
        out = {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1}
    elif kind is TypeKind.ARRAY:
        assert data_type.element is not None  # noqa: S101
        out = {"type": "array", "items": connect_schema(data_type.element, optional=True)}
    elif kind is TypeKind.MAP:
        assert data_type.key is not None and data_type.value is not None  # noqa: S101
        out = {
            "type": "map",
            "keys": connect_schema(data_type.key, optional=False),
            "values": connect_schema(data_type.value, optional=True),
        }
    elif kind is TypeKind.STRUCT:
        out = {"type": "struct", "fields": struct_schema_fields(Schema(data_type.fields))}
    else:
        plain = {v: k for k, v in reversed(_PLAIN.items())}
        out = {"type": plain[kind]}
    out["optional"] = optional
    if field_name is not None:
        out["field"] = field_name
    return out


def struct_schema_fields(schema: Schema) -> list[dict[str, Any]]:
    return [connect_schema(f.type, optional=f.nullable, field_name=f.name) for f in schema]


def connect_value(value: Any, data_type: DataType) -> Any:
    """A Python value as the JSON converter writes it under :func:`connect_schema`."""
    if value is None:
        return None
    kind = data_type.kind
    if kind is TypeKind.DECIMAL:
        scale = data_type.scale
        exponent = value.as_tuple().exponent
        use_scale = scale if scale is not None else max(0, -int(exponent))
        unscaled = int(value.scaleb(use_scale, decimals.EXACT))
        encoded = _twos_complement_base64(unscaled)
        return {"scale": use_scale, "value": encoded} if scale is None else encoded
    if kind in (TypeKind.FLOAT, TypeKind.DOUBLE) and (value != value or value in (math.inf, -math.inf)):
        return "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"
    if kind is TypeKind.DATE:
        return (value - temporal.EPOCH_DATE).days
    if kind is TypeKind.TIME:
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    if kind is TypeKind.TIMESTAMP_NTZ:
        delta = value - temporal.EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if kind is TypeKind.TIMESTAMP_LTZ:
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if kind is TypeKind.BINARY:
        return base64.b64encode(value).decode("ascii")
    if kind is TypeKind.ARRAY:
        assert data_type.element is not None  # noqa: S101
        return [connect_value(item, data_type.element) for item in value]
    if kind is TypeKind.MAP:
        assert data_type.key is not None and data_type.value is not None  # noqa: S101
        if data_type.key.kind is TypeKind.STRING:
            return {k: connect_value(v, data_type.value) for k, v in value.items()}
        return [
            [connect_value(k, data_type.key), connect_value(v, data_type.value)] for k, v in value.items()
        ]
    if kind is TypeKind.STRUCT:
        return {f.name: connect_value(value.get(f.name), f.type) for f in data_type.fields}
    return value


def _twos_complement_base64(number: int) -> str:
    length = max(1, (number + (number < 0)).bit_length() // 8 + 1)
    return base64.b64encode(number.to_bytes(length, "big", signed=True)).decode("ascii")
