"""``debezium-json-registry``'s encoder: ONE ``u`` event per update, in Confluent's JSON Schema wire
format. The writer schema is registered with ``JSONSerializer``, or a known ``schema-id`` framed here;
decimals are JSON numbers (the converter's ``decimal.format=NUMERIC``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import orjson

from cdcflow.formats import connect
from cdcflow.formats.base import Encoded, EnvelopeEncoder
from cdcflow.formats.confluent import json_schema as json_schema_types
from cdcflow.formats.confluent.client import header_bytes, registry_client, shown_url
from cdcflow.formats.debezium.envelope import ENCODE_OP_MAPPINGS
from cdcflow.formats.debezium.json_registry_config import NAME, DebeziumJsonRegistryConfig
from cdcflow.formats.errors import (
    EncodeError,
    FormatError,
    FormatOptionError,
    MissingDependencyError,
    excerpt,
)
from cdcflow.formats.redact import redact
from cdcflow.formats.types import Schema


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal) and value.is_finite():
        return orjson.Fragment(str(value))  # every digit, as a JSON number
    raise TypeError(f"{type(value).__name__} is not JSON")


def _dumps(record: Any) -> bytes:
    return orjson.dumps(record, default=_json_default)


class DebeziumJsonRegistryEncoder(EnvelopeEncoder):
    """Writes ``{before, after, op}`` events in Confluent's JSON Schema wire format.

    The writer schema is the ``schema`` option's, else generated from the table schema as the
    JsonSchemaConverter writes Debezium's Connect schema. Its id is ``schema-id`` (framed here, no
    registry), else the id ``JSONSerializer`` registers it under ``subject`` (default
    ``<topic>-value``) on the first record. The Kafka key is the key columns as a plain JSON object
    (as debezium-json writes it without schemas), so each key keeps to one partition.
    """

    format_name = NAME

    def __init__(
        self, config: DebeziumJsonRegistryConfig, key_columns: Sequence[str], topic_name: str = "cdcflow"
    ) -> None:
        schema = config.envelope.schema
        assert schema is not None  # noqa: S101 - encoders need the row schema
        super().__init__("op", ENCODE_OP_MAPPINGS[config.envelope.mode], key_columns)
        self.config = config
        self.schema = schema
        self.topic = topic_name
        self.subject = config.subject or f"{topic_name}-value"
        if config.writer_schema is not None:
            self.writer_schema = config.writer_schema
        else:
            self.writer_schema = json.dumps(
                json_schema_types.from_connect(envelope_connect_schema(schema, topic_name))
            )
        self._header: bytes | None = None
        self._serializer: Any = None
        if config.schema_id is not None:
            self._header = header_bytes(config.schema_id)
        elif config.url is None:
            raise FormatOptionError(
                f"the encoder needs a schema id: set '{NAME}.url' to register the writer schema, or "
                f"'{NAME}.schema-id' to write a known id"
            )

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_serializer": None}  # the serializer holds a registry client

    def _serialise(self, envelope: Mapping[str, Any]) -> Encoded:
        before, after = envelope.get("before"), envelope.get("after")
        record = {
            "before": self._row(before) if before is not None else None,
            "after": self._row(after) if after is not None else None,
            "op": envelope["op"],
        }
        key = self._key(after if after is not None else before)
        if self._header is not None:
            try:
                return Encoded(key, self._header + _dumps(record))
            except TypeError as error:
                raise EncodeError(f"{NAME}: cannot write {record['op']!r} event as JSON ({error})") from None
        return Encoded(key, self._serialize(record))

    def _key(self, row: Mapping[str, Any] | None) -> bytes | None:
        if not self.key_columns or row is None:
            return None
        types = {f.name: f.type for f in self.schema}
        return _dumps({c: json_schema_types.json_value(row.get(c), types[c]) for c in self.key_columns})

    def _row(self, row: Mapping[str, Any]) -> dict[str, Any]:
        return {f.name: json_schema_types.json_value(row.get(f.name), f.type) for f in self.schema}

    def _serialize(self, record: dict[str, Any]) -> bytes:
        from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

        serializer = self._serializer or self._new_serializer()
        try:
            value = serializer(record, SerializationContext(self.topic, MessageField.VALUE))
        except SerializationError as error:
            raise EncodeError(
                f"{NAME}: JSONSerializer refused the {record['op']!r} event: {excerpt(str(error), 300)}"
            ) from None
        except (TypeError, ValueError, orjson.JSONEncodeError) as error:
            raise EncodeError(f"{NAME}: cannot write {record['op']!r} event as JSON ({error})") from None
        except Exception as error:  # registry refusals and transport errors alike
            raise FormatError(
                f"{NAME}: cannot register the writer schema under subject '{self.subject}' at the Schema "
                f"Registry {shown_url(self.config.registry)} ({type(error).__name__}: "
                f"{redact(str(error), self.config.registry)}). Check '{NAME}.url', the credentials and the "
                f"subject's compatibility, or set '{NAME}.schema-id'"
            ) from None
        assert value is not None  # noqa: S101 - only None serialises to None
        return bytes(value)

    def _new_serializer(self) -> Any:
        try:
            from confluent_kafka.schema_registry.json_schema import JSONSerializer
        except ImportError:
            raise MissingDependencyError("confluent-kafka[json]", "kafka") from None
        subject = self.subject
        conf = {
            "auto.register.schemas": True,
            "subject.name.strategy": lambda _context, _name: subject,
            "validate": self.config.validate,
        }
        client = registry_client(self.config.registry)
        self._serializer = JSONSerializer(self.writer_schema, client, conf=conf, json_encode=_dumps)
        return self._serializer


def envelope_connect_schema(schema: Schema, topic: str) -> dict[str, Any]:
    """The Connect schema of Debezium's Envelope for a table (``before``, ``after``, ``op``)."""
    value = {
        "type": "struct",
        "fields": connect.struct_schema_fields(schema),
        "optional": True,
        "name": f"{topic}.Value",
    }
    return {
        "type": "struct",
        "fields": [
            {**value, "field": "before"},
            {**value, "field": "after"},
            {"type": "string", "optional": False, "field": "op"},
        ],
        "optional": False,
        "name": f"{topic}.Envelope",
    }
