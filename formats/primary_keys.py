"""The primary-key columns a message names, so a user need not type them.

Debezium keys each message by its table's primary key: the Kafka key is a JSON object of the key
columns, or Kafka Connect's ``{"schema", "payload"}`` form of it (``key.converter.schemas.enable``),
whose schema lists the columns in key order. Canal, Maxwell and OGG list the key columns in the
envelope (``pkNames``, ``primary_key_columns``, ``primary_keys``). A message that names none (a
TRUNCATE has no key; Maxwell lists them only when told to) gives None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from cdcflow.formats.confluent.client import (
    HEADER_SIZE,
    MAGIC_BYTE,
    RegistryConfig,
    fetch_schema,
    schema_id_of,
)
from cdcflow.formats.errors import FieldError


def json_key_fields(key: bytes | None) -> tuple[str, ...] | None:
    """The columns of a JSON message key (either JsonConverter form), or None when it is not an object."""
    parsed = json_object(key)
    if parsed is None:
        return None
    schema, payload = parsed.get("schema"), parsed.get("payload")
    if (
        set(parsed) == {"schema", "payload"}
        and isinstance(schema, Mapping)
        and schema.get("type") == "struct"
    ):
        fields = schema.get("fields")
        names = [f.get("field") for f in fields if isinstance(f, Mapping)] if isinstance(fields, list) else []
        if names and all(isinstance(name, str) for name in names):
            return tuple(str(name) for name in names)
        return tuple(payload) if isinstance(payload, Mapping) and payload else None
    return tuple(parsed) if parsed else None


def registry_key_fields(
    key: bytes | None, registry: RegistryConfig, schema_type: str, prefix: str
) -> tuple[str, ...] | None:
    """The fields of a message key in Confluent's wire format, from its schema in the registry: an
    Avro record's fields, or a JSON Schema object's properties (in ``connect.index`` order, as Kafka
    Connect's JsonSchemaConverter numbers them). None when the key is not framed or there is no registry."""
    if not registry or not key or len(key) < HEADER_SIZE or key[0] != MAGIC_BYTE:
        return None
    try:
        schema_id = schema_id_of(key, "key converter", "another key converter")
        parsed = orjson.loads(fetch_schema(registry, schema_id, schema_type, prefix))
    except FieldError:  # not in the registry, or of the other converter's type: no key named here
        return None
    if schema_type == "AVRO":
        fields = parsed.get("fields") if isinstance(parsed, dict) and parsed.get("type") == "record" else None
        names = [f.get("name") for f in fields if isinstance(f, Mapping)] if isinstance(fields, list) else []
    else:
        properties = parsed.get("properties") if isinstance(parsed, dict) else None
        items = list(properties.items()) if isinstance(properties, Mapping) else []
        ranks = [(_index(s, i), n) for i, (n, s) in enumerate(items)]
        names = [name for _, name in sorted(ranks)]
    return tuple(str(n) for n in names) if names and all(isinstance(n, str) for n in names) else None


def _index(schema: Any, position: int) -> int:
    index = schema.get("connect.index") if isinstance(schema, Mapping) else None
    return index if isinstance(index, int) and not isinstance(index, bool) else position


def listed_columns(value: bytes | None, field: str) -> tuple[str, ...] | None:
    """The column names a JSON envelope lists in ``field``, or None when it lists none."""
    parsed = json_object(value)
    names = parsed.get(field) if parsed is not None else None
    if isinstance(names, list) and names and all(isinstance(name, str) for name in names):
        return tuple(names)
    return None


def json_object(data: bytes | None) -> dict[str, Any] | None:
    """``data`` parsed as a JSON object, or None (no bytes, not JSON, not an object)."""
    if not data:
        return None
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None
