"""Avro schemas as Kafka Connect's AvroConverter writes them → column types, and back.

Debezium's Avro events carry Connect's logical types as schema attributes: ``connect.name``
(``org.apache.kafka.connect.data.Decimal`` on ``bytes`` with ``connect.parameters`` scale,
``io.debezium.time.MicroTimestamp`` on a ``long``, the ``io.debezium.data.VariableScaleDecimal``
record, ...) and ``connect.type`` (``int8``/``int16`` on an ``int``). Each leaf is translated to the
Connect schema it came from and typed by :func:`connect.column_type`, so a column gets the same type
from ``debezium-avro-confluent`` as from ``debezium-json`` with its schema block. Plain Avro logical
types (``decimal``, ``date``, ``timestamp-micros``, ...) are read too, when ``connect.name`` is absent.

Values are decoded from the raw Avro values (logical types are stripped before fastavro sees the schema,
so a decimal arrives as its unscaled bytes and a timestamp as its integer).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from cdcflow.formats import connect, decimals, temporal
from cdcflow.formats import json_decode as values
from cdcflow.formats.decimals import EXACT
from cdcflow.formats.errors import FieldError, SchemaError, excerpt
from cdcflow.formats.json_decode import Converter
from cdcflow.formats.types import DataType, Field, Schema, TypeKind, atomic

AvroSchema = Any  # a JSON value: a type name, a list (union) or an object
Encode = Any  # Callable[[Any], Any]; kept loose because fastavro takes plain JSON-like values

_CONNECT_PRIMITIVES = {
    "int": "int32",
    "long": "int64",
    "float": "float32",
    "double": "float64",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
    "fixed": "bytes",
    "enum": "string",
}
# Plain Avro logical types, as the Connect logical type that means the same.
_LOGICAL_AS_CONNECT = {
    "date": "org.apache.kafka.connect.data.Date",
    "time-millis": "org.apache.kafka.connect.data.Time",
    "time-micros": "io.debezium.time.MicroTime",
    "timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
    "timestamp-micros": "io.debezium.time.MicroTimestamp",
    "timestamp-nanos": "io.debezium.time.NanoTimestamp",
    "local-timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
    "local-timestamp-micros": "io.debezium.time.MicroTimestamp",
    "local-timestamp-nanos": "io.debezium.time.NanoTimestamp",
}
MAP_ENTRY = "io.confluent.connect.avro.MapEntry"
_MAX_PRECISION = 38


def strip_logical_types(schema: AvroSchema) -> AvroSchema:
    """The schema without ``logicalType`` attributes, so that fastavro reads and writes raw values."""
    if isinstance(schema, list):
        return [strip_logical_types(item) for item in schema]
    if isinstance(schema, dict):
        return {k: strip_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    return schema


def unwrap_optional(schema: AvroSchema, path: str) -> tuple[AvroSchema, bool]:
    """``["null", T]`` → ``(T, True)``; any other schema → ``(schema, False)``."""
    if not isinstance(schema, list):
        return schema, False
    members = [m for m in schema if m != "null"]
    if len(members) != 1:
        raise SchemaError(
            f"field '{path}': the union {members} has several non-null types; only [\"null\", T] "
            "(an optional field) is supported"
        )
    return members[0], len(members) < len(schema)


def record_fields(schema: AvroSchema, path: str) -> list[Mapping[str, Any]]:
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise SchemaError(f"field '{path}': expected an Avro record, got {_describe(schema)}")
    return list(schema.get("fields") or [])


def record_columns(schema: AvroSchema, path: str = "") -> tuple[Schema, dict[str, Converter]]:
    """The columns of an (expanded) Avro record schema and a raw-value converter per column."""
    fields = []
    converters = {}
    for child in record_fields(schema, path or "record"):
        name = child["name"]
        child_path = f"{path}.{name}" if path else name
        inner, optional = unwrap_optional(child["type"], child_path)
        data_type, convert = column_type(inner, child_path)
        fields.append(Field(name, data_type, optional))
        converters[name] = convert
    return Schema(tuple(fields)), converters


def column_type(schema: AvroSchema, path: str) -> tuple[DataType, Converter]:
    """The column type of a non-union Avro schema and the converter for its raw fastavro values."""
    attributes: Mapping[str, Any] = schema if isinstance(schema, dict) else {"type": schema}
    kind = attributes.get("type")
    if isinstance(kind, (dict, list)):  # {"type": {"type": "long", ...}}
        return column_type(kind, path)
    name = attributes.get("connect.name")
    if kind == "record":
        if name == connect.VARIABLE_SCALE_DECIMAL:
            return atomic(TypeKind.DECIMAL), _variable_decimal
        struct_schema, converters = record_columns(attributes, path)
        rows = values.RowConverter(struct_schema, converters=converters)
        return DataType(TypeKind.STRUCT, fields=struct_schema.fields), rows.convert_value
    if kind == "array":
        items, _ = unwrap_optional(attributes.get("items"), path + "[]")
        if isinstance(items, dict) and items.get("type") == "record" and _is_map_entry(items):
            return _entry_map(items, path)
        element_type, element = column_type(items, path + "[]")
        return DataType(TypeKind.ARRAY, element=element_type), _array(element)
    if kind == "map":
        value_schema, _ = unwrap_optional(attributes.get("values"), path + ".value")
        value_type, convert_value = column_type(value_schema, path + ".value")
        map_type = DataType(TypeKind.MAP, key=atomic(TypeKind.STRING), value=value_type)
        return map_type, _map(values.converter(atomic(TypeKind.STRING)), convert_value)
    if name == connect.CONNECT_DECIMAL or attributes.get("logicalType") == "decimal":
        return _decimal(attributes, path)
    connect_type = attributes.get("connect.type") or _CONNECT_PRIMITIVES.get(str(kind))
    if connect_type is None:
        raise SchemaError(f"field '{path}': unsupported Avro type {_describe(schema)}")
    logical_name = name or _LOGICAL_AS_CONNECT.get(str(attributes.get("logicalType")))
    return connect.column_type({"type": connect_type, "name": logical_name}, path)


def _describe(schema: AvroSchema) -> str:
    text = str(schema)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_map_entry(record: Mapping[str, Any]) -> bool:
    names = [f.get("name") for f in record.get("fields") or []]
    return names == ["key", "value"] and str(record.get("name", "")).startswith(MAP_ENTRY)


def _decimal(attributes: Mapping[str, Any], path: str) -> tuple[DataType, Converter]:
    parameters = attributes.get("connect.parameters") or {}
    if not isinstance(parameters, Mapping):
        raise SchemaError(f"field '{path}': 'connect.parameters' must be an object")
    scale = _integer(parameters.get("scale", attributes.get("scale", 0)), "scale", path)
    # AvroConverter writes precision 64 when Connect gave none; Spark's limit is 38.
    precision = _integer(
        parameters.get("connect.decimal.precision", attributes.get("precision", _MAX_PRECISION)),
        "precision",
        path,
    )
    if not 0 <= scale <= decimals.MAX_DECIMAL_SCALE or precision < 1:
        raise SchemaError(f"field '{path}': a decimal takes a precision >= 1 and a scale from 0 to 10,000")
    data_type = atomic(TypeKind.DECIMAL, max(min(precision, _MAX_PRECISION), scale, 1), scale)
    fit = values.converter(data_type)
    bound = data_type.precision

    def convert(value: Any) -> Any:
        if isinstance(value, bytes):
            return fit(decimals.decimal_from_bytes(value, scale, bound))
        return fit(value)

    return data_type, convert


_DIGITS = re.compile(r"[0-9]+")  # ASCII digits: str.isdigit() also takes "²", which int() refuses


def _integer(value: Any, what: str, path: str) -> int:
    """A decimal's scale or precision: an integer, or its text (Connect's parameters are strings)."""
    if value.__class__ is int:
        return int(value)
    if isinstance(value, str) and len(value) <= 20 and _DIGITS.fullmatch(value.strip(" ")):
        return int(value.strip(" "))
    raise SchemaError(f"field '{path}': the decimal's {what} must be an integer, got {excerpt(value)}")


def _variable_decimal(value: Any) -> Decimal:
    if (
        not isinstance(value, Mapping)
        or not isinstance(value.get("value"), bytes)
        or value.get("scale").__class__ is not int
    ):
        raise FieldError("", f"expected a VariableScaleDecimal record, got {type(value).__name__}")
    return decimals.decimal_from_bytes(value["value"], value["scale"])


def _array(element: Converter) -> Converter:
    def convert(value: Any) -> list[Any]:
        return [None if item is None else element(item) for item in value]

    return convert


def _map(key: Converter, value_converter: Converter) -> Converter:
    def convert(value: Any) -> dict[Any, Any]:
        return {key(k): None if v is None else value_converter(v) for k, v in value.items()}

    return convert


def _entry_map(entry: Mapping[str, Any], path: str) -> tuple[DataType, Converter]:
    """Connect's map with non-string keys: an array of ``MapEntry`` ``{key, value}`` records."""
    entry_fields = {f["name"]: unwrap_optional(f["type"], f"{path}.{f['name']}")[0] for f in entry["fields"]}
    key_type, convert_key = column_type(entry_fields["key"], path + ".key")
    value_type, convert_value = column_type(entry_fields["value"], path + ".value")

    def convert(value: Any) -> dict[Any, Any]:
        return {
            None if e["key"] is None else convert_key(e["key"]): (
                None if e["value"] is None else convert_value(e["value"])
            )
            for e in value
        }

    return DataType(TypeKind.MAP, key=key_type, value=value_type), convert


# The encoder side: our column types → the Avro schema Debezium's AvroConverter would write, and
# Python values → the raw Avro values of a column's wire type (the type read back from the schema).

_VERSION = {"connect.version": 1}
_PRIMITIVE_AVRO: dict[TypeKind, AvroSchema] = {
    TypeKind.BOOLEAN: "boolean",
    TypeKind.TINYINT: {"type": "int", "connect.type": "int8"},
    TypeKind.SMALLINT: {"type": "int", "connect.type": "int16"},
    TypeKind.INT: "int",
    TypeKind.BIGINT: "long",
    TypeKind.FLOAT: "float",
    TypeKind.DOUBLE: "double",
    TypeKind.STRING: "string",
    TypeKind.BINARY: "bytes",
    TypeKind.DATE: {"type": "int", **_VERSION, "connect.name": "io.debezium.time.Date"},
    TypeKind.TIME: {"type": "long", **_VERSION, "connect.name": "io.debezium.time.MicroTime"},
    TypeKind.TIMESTAMP_NTZ: {"type": "long", **_VERSION, "connect.name": "io.debezium.time.MicroTimestamp"},
    TypeKind.TIMESTAMP_LTZ: {"type": "string", **_VERSION, "connect.name": "io.debezium.time.ZonedTimestamp"},
}
_NAME_PART = re.compile(r"[^A-Za-z0-9_]")


def avro_name(text: str) -> str:
    """``text`` as a valid Avro name (letters, digits, ``_``; not starting with a digit)."""
    cleaned = _NAME_PART.sub("_", text) or "_"
    return "_" + cleaned if cleaned[0].isdigit() else cleaned


def avro_namespace(text: str) -> str:
    return ".".join(avro_name(part) for part in text.split(".") if part) or "cdcflow"


class SchemaWriter:
    """Builds Avro schemas for our column types; each named type is defined once, then referenced."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._defined: set[str] = set()

    def record(self, schema: Schema, name: str) -> dict[str, Any]:
        full_name = f"{self.namespace}.{name}"
        self._defined.add(full_name)
        return {
            "type": "record",
            "name": name,
            "namespace": self.namespace,
            "fields": [self.field(f, f"{name}_{avro_name(f.name)}") for f in schema],
            "connect.name": full_name,
        }

    def field(self, column: Field, nested_name: str) -> dict[str, Any]:
        schema = self.type(column.type, nested_name)
        if column.nullable:
            return {"name": column.name, "type": ["null", schema], "default": None}
        return {"name": column.name, "type": schema}

    def type(self, data_type: DataType, nested_name: str) -> AvroSchema:
        kind = data_type.kind
        if kind is TypeKind.DECIMAL and data_type.scale is None:
            if connect.VARIABLE_SCALE_DECIMAL in self._defined:
                return connect.VARIABLE_SCALE_DECIMAL
            self._defined.add(connect.VARIABLE_SCALE_DECIMAL)
            return {
                "type": "record",
                "name": "VariableScaleDecimal",
                "namespace": "io.debezium.data",
                "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
                "connect.doc": "Variable scaled decimal",
                **_VERSION,
                "connect.name": connect.VARIABLE_SCALE_DECIMAL,
            }
        if kind is TypeKind.DECIMAL:
            return {
                "type": "bytes",
                "scale": data_type.scale,
                "precision": data_type.precision,
                **_VERSION,
                "connect.parameters": {
                    "scale": str(data_type.scale),
                    "connect.decimal.precision": str(data_type.precision),
                },
                "connect.name": connect.CONNECT_DECIMAL,
                "logicalType": "decimal",
            }
        if kind is TypeKind.ARRAY:
            assert data_type.element is not None  # noqa: S101
            return {"type": "array", "items": ["null", self.type(data_type.element, nested_name + "_item")]}
        if kind is TypeKind.MAP:
            assert data_type.key is not None and data_type.value is not None  # noqa: S101
            value_schema = ["null", self.type(data_type.value, nested_name + "_value")]
            if data_type.key.kind is TypeKind.STRING:
                return {"type": "map", "values": value_schema}
            entry_name = "MapEntry" if MAP_ENTRY not in self._defined else f"MapEntry_{nested_name}"
            self._defined.add(f"io.confluent.connect.avro.{entry_name}")
            return {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": entry_name,
                    "namespace": "io.confluent.connect.avro",
                    "fields": [
                        {"name": "key", "type": self.type(data_type.key, nested_name + "_key")},
                        {"name": "value", "type": value_schema, "default": None},
                    ],
                },
            }
        if kind is TypeKind.STRUCT:
            return self.record(Schema(data_type.fields), nested_name)
        return _PRIMITIVE_AVRO[kind]


def envelope_schema(schema: Schema, namespace: str) -> dict[str, Any]:
    """A Debezium-like ``Envelope`` record: optional ``before``/``after`` ``Value`` records and ``op``."""
    writer = SchemaWriter(namespace)
    value = writer.record(schema, "Value")
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": namespace,
        "fields": [
            {"name": "before", "type": ["null", value], "default": None},
            {"name": "after", "type": ["null", f"{namespace}.Value"], "default": None},
            {"name": "op", "type": "string"},
        ],
        "connect.name": f"{namespace}.Envelope",
    }


def value_encoder(data_type: DataType) -> Encode:
    """Python values of a column → raw Avro values of its wire type (``data_type`` from the schema)."""
    kind = data_type.kind
    if kind is TypeKind.DECIMAL:
        return _encode_decimal(data_type.scale)
    if kind is TypeKind.DATE:
        return lambda v: (v - temporal.EPOCH_DATE).days
    if kind is TypeKind.TIME:
        per_second = temporal.units_per_second(data_type.precision)
        return lambda v: _micros_of_day(v) * per_second // 1_000_000
    if kind is TypeKind.TIMESTAMP_NTZ:
        per_second = temporal.units_per_second(data_type.precision)
        return lambda v: _epoch_micros(v) * per_second // 1_000_000
    if kind is TypeKind.TIMESTAMP_LTZ:
        return lambda v: connect.connect_value(v, data_type)
    if kind is TypeKind.ARRAY:
        assert data_type.element is not None  # noqa: S101
        element = value_encoder(data_type.element)
        return lambda v: [None if item is None else element(item) for item in v]
    if kind is TypeKind.MAP:
        assert data_type.key is not None and data_type.value is not None  # noqa: S101
        key, item = value_encoder(data_type.key), value_encoder(data_type.value)
        if data_type.key.kind is TypeKind.STRING:
            return lambda v: {k: None if x is None else item(x) for k, x in v.items()}
        return lambda v: [{"key": key(k), "value": None if x is None else item(x)} for k, x in v.items()]
    if kind is TypeKind.STRUCT:
        return RecordEncoder(Schema(data_type.fields)).encode
    if kind in (TypeKind.FLOAT, TypeKind.DOUBLE):
        return float
    return _identity


def _identity(value: Any) -> Any:
    return value


def _micros_of_day(value: dt.time) -> int:
    return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond


def _epoch_micros(value: dt.datetime) -> int:
    delta = value.replace(tzinfo=None) - temporal.EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _unscaled_bytes(number: int) -> bytes:
    return number.to_bytes(max(1, (number + (number < 0)).bit_length() // 8 + 1), "big", signed=True)


def _encode_decimal(scale: int | None) -> Encode:
    if scale is None:

        def variable(value: Decimal) -> dict[str, Any]:
            use_scale = max(0, -int(value.as_tuple().exponent))
            return {"scale": use_scale, "value": _unscaled_bytes(int(value.scaleb(use_scale, EXACT)))}

        return variable
    quantum = Decimal(1).scaleb(-scale)
    return lambda v: _unscaled_bytes(int(v.quantize(quantum, context=EXACT).scaleb(scale, EXACT)))


class RecordEncoder:
    """A row dict → the Avro record value of a schema whose types are the wire types."""

    def __init__(self, schema: Schema) -> None:
        self._columns = [(f.name, value_encoder(f.type)) for f in schema]

    def encode(self, row: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, encode in self._columns:
            value = row.get(name)
            out[name] = None if value is None else encode(value)
        return out
