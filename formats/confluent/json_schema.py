"""JSON Schemas as Confluent's ``JsonSchemaConverter`` writes them ↔ Kafka Connect schemas.

The converter (``io.confluent.connect.json.JsonSchemaData``) keeps the Connect type of each field in
annotations: ``connect.type`` (``int8`` … ``int64``, ``float32``, ``float64``, ``bytes``, ``map``),
``title`` (the Connect schema name: ``io.debezium.time.MicroTimestamp``,
``org.apache.kafka.connect.data.Decimal``, ``<topic>.Value``), ``connect.parameters`` (a Decimal's
scale and precision) and ``connect.index`` (the field order). An optional field is
``{"oneOf": [{"type": "null"}, T]}``. :func:`to_connect` turns such a schema back into the Connect
schema it came from, so the columns are typed by :mod:`connect` exactly as for ``debezium-json``
with ``schema-include``; :func:`from_connect` goes the other way for the encoder.

A JSON Schema without the annotations is read too: ``integer`` is BIGINT, ``number`` DOUBLE, an
object with ``properties`` a struct, one with only ``additionalProperties`` a string-keyed map.
``$ref``, and unions of two non-null types, are refused with a :class:`SchemaError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from cdcflow.formats import connect
from cdcflow.formats.errors import SchemaError, excerpt
from cdcflow.formats.types import DataType, TypeKind

_INTEGERS = ("int8", "int16", "int32", "int64")
_FLOATS = ("float32", "float64")


def to_connect(schema: Any, path: str = "", depth: int = 0) -> dict[str, Any]:
    """The Connect schema (with ``optional``) that a JSON Schema written by the converter stands for."""
    if not isinstance(schema, Mapping):
        raise SchemaError(f"field '{path}': a JSON Schema must be an object, got {excerpt(schema)}")
    if depth > connect.MAX_SCHEMA_DEPTH:
        raise SchemaError(
            f"field '{path}': the JSON Schema nests deeper than {connect.MAX_SCHEMA_DEPTH} levels"
        )
    if "$ref" in schema:
        raise SchemaError(f"field '{path}': '$ref' is not supported; declare the columns instead")
    for combinator in ("oneOf", "anyOf"):
        if combinator in schema:
            return _nullable(schema[combinator], combinator, path, depth)
    kind = schema.get("type")
    optional = False
    if isinstance(kind, list):
        others = [k for k in kind if k != "null"]
        if len(others) != 1:
            raise SchemaError(f"field '{path}': a union of types {excerpt(kind)} has no column type")
        kind, optional = others[0], len(others) != len(kind)
    out = _plain(schema, kind, path, depth)
    title = schema.get("title")
    if isinstance(title, str):
        out["name"] = title
    parameters = schema.get("connect.parameters")
    if isinstance(parameters, Mapping):
        out["parameters"] = dict(parameters)
    out["optional"] = optional
    return out


def _nullable(members: Any, combinator: str, path: str, depth: int) -> dict[str, Any]:
    if not isinstance(members, list):
        raise SchemaError(f"field '{path}': '{combinator}' must be a list, got {excerpt(members)}")
    others = [m for m in members if not (isinstance(m, Mapping) and m.get("type") == "null")]
    if len(others) != 1:
        raise SchemaError(
            f"field '{path}': a '{combinator}' of {len(others)} non-null schemas has no column type "
            "(only [null, T] is read: an optional T)"
        )
    out = to_connect(others[0], path, depth + 1)
    out["optional"] = out["optional"] or len(others) != len(members)
    return out


def _plain(schema: Mapping[str, Any], kind: Any, path: str, depth: int) -> dict[str, Any]:
    connect_type = schema.get("connect.type")
    if kind == "integer":
        return {"type": connect_type if connect_type in _INTEGERS else "int64"}
    if kind == "number":
        if connect_type == "bytes":  # a Decimal: the title names it
            return {"type": "bytes"}
        return {"type": connect_type if connect_type in _FLOATS else "float64"}
    if kind == "string":
        return {"type": "bytes" if connect_type == "bytes" else "string"}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        items = schema.get("items", {})
        if connect_type == "map":  # a map whose keys are not strings: [{"key": k, "value": v}, ...]
            entry = _properties(items, path)
            key = to_connect(entry.get("key"), path + ".key", depth + 1)
            value = to_connect(entry.get("value"), path + ".value", depth + 1)
            return {"type": "map", "keys": key, "values": value}
        return {"type": "array", "items": to_connect(items, path + "[]", depth + 1)}
    if kind == "object":
        if "properties" in schema and connect_type != "map":
            children = sorted(
                _properties(schema, path).items(),
                key=lambda item: _index(item[1]),  # stable: properties without an index keep their order
            )
            fields = []
            for name, child in children:
                field = to_connect(child, f"{path}.{name}" if path else name, depth + 1)
                fields.append({**field, "field": name})
            return {"type": "struct", "fields": fields}
        values = schema.get("additionalProperties")
        if isinstance(values, Mapping):
            return {
                "type": "map",
                "keys": {"type": "string", "optional": False},
                "values": to_connect(values, path + ".value", depth + 1),
            }
        raise SchemaError(f"field '{path}': an object schema with neither 'properties' nor a value schema")
    raise SchemaError(f"field '{path}': JSON Schema type {excerpt(kind)} has no column type")


def _properties(schema: Any, path: str) -> Mapping[str, Any]:
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(properties, Mapping):
        raise SchemaError(f"field '{path}': 'properties' must be an object, got {excerpt(properties)}")
    return properties


def _index(child: Any) -> int:
    index = child.get("connect.index") if isinstance(child, Mapping) else None
    return index if isinstance(index, int) else 1 << 31


def from_connect(schema: Mapping[str, Any], index: int | None = None) -> dict[str, Any]:
    """The JSON Schema the converter writes for a Connect schema (``JsonSchemaData.fromConnectSchema``)."""
    kind = schema["type"]
    out: dict[str, Any]
    if kind in _INTEGERS:
        out = {"type": "integer", "connect.type": kind}
    elif kind in _FLOATS:
        out = {"type": "number", "connect.type": kind}
    elif kind == "bytes":
        decimal = schema.get("name") == connect.CONNECT_DECIMAL
        out = {"type": "number" if decimal else "string", "connect.type": "bytes"}
    elif kind in ("boolean", "string"):
        out = {"type": kind}
    elif kind == "array":
        out = {"type": "array", "items": from_connect(schema["items"])}
    elif kind == "map" and schema["keys"]["type"] == "string" and not schema["keys"]["optional"]:
        out = {
            "type": "object",
            "additionalProperties": from_connect(schema["values"]),
            "connect.type": "map",
        }
    elif kind == "map":
        entry = {"key": from_connect(schema["keys"], 0), "value": from_connect(schema["values"], 1)}
        out = {"type": "array", "items": {"type": "object", "properties": entry}, "connect.type": "map"}
    else:
        fields = schema["fields"]
        out = {"type": "object", "properties": {f["field"]: from_connect(f, i) for i, f in enumerate(fields)}}
    if "name" in schema:
        out["title"] = schema["name"]
    if "version" in schema:
        out["connect.version"] = schema["version"]
    if "parameters" in schema:
        out["connect.parameters"] = schema["parameters"]
    if schema.get("optional"):
        out = {"oneOf": [{"type": "null"}, out]}
    if index is not None:
        out["connect.index"] = index
    return out


def relaxed_for_validation(schema: Any) -> Any:
    """The schema a record is validated against: a Connect Decimal (``"type": "number"`` with
    ``connect.type`` bytes) also takes a string, since the converter's default ``decimal.format`` is
    BASE64 (its own deserializer reads both)."""
    if isinstance(schema, list):
        return [relaxed_for_validation(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {key: relaxed_for_validation(value) for key, value in schema.items()}
    if out.get("connect.type") == "bytes" and out.get("type") == "number":
        out["type"] = ["number", "string"]
    return out


def json_value(value: Any, data_type: DataType) -> Any:
    """A Python value as written under :func:`from_connect` of :func:`connect.connect_schema`: as
    :func:`connect.connect_value`, but a fixed-scale decimal stays a number (``decimal.format``
    NUMERIC: it validates against the schema's ``number``) and a map with non-string keys is a list of
    ``{"key", "value"}`` objects."""
    if value is None:
        return None
    kind = data_type.kind
    if kind is TypeKind.DECIMAL and data_type.scale is not None:
        return Decimal(value)
    if kind is TypeKind.ARRAY:
        assert data_type.element is not None  # noqa: S101
        return [json_value(item, data_type.element) for item in value]
    if kind is TypeKind.MAP:
        assert data_type.key is not None and data_type.value is not None  # noqa: S101
        if data_type.key.kind is TypeKind.STRING:
            return {k: json_value(v, data_type.value) for k, v in value.items()}
        return [
            {"key": json_value(k, data_type.key), "value": json_value(v, data_type.value)}
            for k, v in value.items()
        ]
    if kind is TypeKind.STRUCT:
        return {f.name: json_value(value.get(f.name), f.type) for f in data_type.fields}
    return connect.connect_value(value, data_type)
