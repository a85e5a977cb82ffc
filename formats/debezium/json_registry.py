"""``debezium-json-registry``: Debezium change events in Confluent's JSON Schema wire format.

What Kafka Connect's ``io.confluent.connect.json.JsonSchemaConverter`` writes: the magic byte 0, the
writer schema's id (4 bytes, big-endian), then the envelope as JSON text (no ``{schema, payload}``
wrapper; the schema is in the registry). Messages are read with confluent-kafka's
``JSONDeserializer`` (``subject.name.strategy.type`` TOPIC); writer schemas come from the Schema
Registry (``url``) or the ``schema`` option, each fetched and parsed once per decoder.

The envelope then goes through ``debezium-json``'s decoder (:mod:`.json`), so op codes,
upsert mode, TOAST placeholders and metadata columns behave identically. Without declared columns,
they are the writer schema's ``after`` object, read through its Connect annotations
(:mod:`cdcflow.formats.confluent.json_schema`). With ``validate``, each record is first checked
against its writer schema with ``jsonschema``; a record that fails is a bad record (dead letter or
error) whose reason is the validator's message and JSON path.

Options: :mod:`.json_registry_config`; writer schemas: :mod:`.json_registry_writer`; the encoder:
:mod:`.json_registry_encoder`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from cdcflow.formats.base import ControlEvent, Decoded, Decoder, FormatMetrics, Message, parse_json
from cdcflow.formats.confluent.client import (
    HEADER_SIZE,
    MAGIC_BYTE,
    fetch_schema,
    registry_client,
    registry_config,
    schema_id_of,
)
from cdcflow.formats.confluent.registry_needs import require_subject, require_writer_schemas
from cdcflow.formats.debezium.envelope import METADATA, ChangeBuilder, metadata_values
from cdcflow.formats.debezium.json import DebeziumJsonConfig, DebeziumJsonDecoder
from cdcflow.formats.debezium.json_registry_config import NAME, OPTIONS, DebeziumJsonRegistryConfig
from cdcflow.formats.debezium.json_registry_encoder import DebeziumJsonRegistryEncoder
from cdcflow.formats.debezium.json_registry_writer import WriterSchema, parse_writer
from cdcflow.formats.errors import FieldError, MissingDependencyError, SchemaError, excerpt
from cdcflow.formats.lru import SCHEMA_CACHE_SIZE, LruCache
from cdcflow.formats.primary_keys import json_key_fields, registry_key_fields
from cdcflow.formats.registry import FormatFactory
from cdcflow.formats.types import Schema

#: The topic of a message without one (a plain file): the TOPIC strategy's subject is "cdcflow-value".
_NO_TOPIC = "cdcflow"
#: The longest validator message a reason quotes (it shows the offending value).
_MAX_VALIDATION_MESSAGE = 300


def _validation_error(writer: WriterSchema, envelope: Any, schema_id: int | str) -> FieldError | None:
    from jsonschema.exceptions import best_match

    try:
        error = best_match(writer.validator.iter_errors(envelope))
    except RecursionError:  # jsonschema recurses into the value (and its repr) once a level
        return FieldError(
            "",
            f"the record is nested too deeply (about 1,000 levels) for jsonschema to validate it against "
            f"writer schema {schema_id}: fix the producer, or set '{NAME}.validate'='false'",
        )
    if error is None:
        return None
    message = error.message
    if len(message) > _MAX_VALIDATION_MESSAGE:
        message = message[:_MAX_VALIDATION_MESSAGE] + "..."
    path = ".".join(str(part) for part in error.absolute_path)
    return FieldError(path, f"does not match writer schema {schema_id} at {error.json_path}: {message}")


class _Envelopes(DebeziumJsonDecoder):
    """debezium-json's envelope path under this format's name; the ``schema`` metadata column is the
    writer's JSON Schema text."""

    format_name = NAME

    def __init__(self, config: DebeziumJsonConfig) -> None:
        super().__init__(config)
        self._builder = ChangeBuilder(
            config.mode, config.unavailable, config.key_columns, NAME, config.metadata
        )
        self.writer_text: str | None = None

    def _metadata(
        self, payload: Mapping[str, Any], missing: list[str], schema_block: Any, message: Message
    ) -> dict[str, Any]:
        if not self.config.metadata:
            return {}
        return metadata_values(self.config.metadata, payload, missing, self.writer_text, message.headers)


class DebeziumJsonRegistryDecoder(Decoder):
    format_name = NAME

    def __init__(self, config: DebeziumJsonRegistryConfig) -> None:
        super().__init__(ignore_parse_errors=config.envelope.ignore_parse_errors)
        self.config = config
        self._envelopes = _Envelopes(config.envelope)
        self._writers: LruCache[int, WriterSchema] = LruCache(SCHEMA_CACHE_SIZE)
        self._explicit: WriterSchema | None = None
        if config.writer_schema is not None:
            self._explicit = self._writer(config.writer_schema, f"option '{NAME}.schema'")
        self._deserializers: dict[bool, Any] = {}  # built on first use, never pickled

    def __reduce__(
        self,
    ) -> tuple[Callable[..., DebeziumJsonRegistryDecoder], tuple[DebeziumJsonRegistryConfig]]:
        return type(self), (self.config,)

    @property
    def schema(self) -> Schema:
        """The output columns: declared, or those of the latest writer schema (AttributeError before)."""
        return self._envelopes.schema

    @schema.setter
    def schema(self, value: Schema) -> None:
        self._envelopes.schema = value

    def failing_on_new_columns(self) -> DebeziumJsonRegistryDecoder:
        envelope = replace(self.config.envelope, fail_on_new_columns=True)
        return type(self)(replace(self.config, envelope=envelope))

    def decode_message(self, message: Message, metrics: FormatMetrics) -> Decoded:
        assert message.value is not None  # noqa: S101 - the base class skips tombstones
        schema_id = schema_id_of(
            message.value, "JSON Schema serializer", "JSON without a registry: debezium-json"
        )
        writer = self._writer_for(schema_id, f"{message.topic or _NO_TOPIC}-value")
        envelope = self._deserialize(message, writer)
        if not isinstance(envelope, dict):
            raise FieldError("", f"a Debezium event is a JSON object, got {type(envelope).__name__}")
        if writer.validator is not None:
            error = _validation_error(writer, envelope, schema_id)
            if error is not None:
                raise error
        self._envelopes.writer_text = writer.text
        inner = message
        key = message.key
        if key is not None and len(key) >= HEADER_SIZE and key[0] == MAGIC_BYTE:
            inner = replace(message, key=key[HEADER_SIZE:])  # a JSON Schema key: its JSON
        wrapped = {"schema": writer.connect, "payload": envelope}
        decoded = self._envelopes.decode_envelope(wrapped, inner, metrics)
        if isinstance(decoded, ControlEvent) and inner is not message:
            return ControlEvent(decoded.kind, message, decoded.payload, decoded.metadata)
        return decoded

    def _deserialize(self, message: Message, writer: WriterSchema) -> Any:
        from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

        explicit = writer is self._explicit
        deserializer = self._deserializers.get(explicit)
        if deserializer is None:
            deserializer = self._deserializers[explicit] = self._new_deserializer(explicit)
        context = SerializationContext(message.topic or _NO_TOPIC, MessageField.VALUE)
        try:
            return deserializer(message.value, context)
        except SerializationError as error:
            raise FieldError("", f"JSONDeserializer refused the record: {excerpt(str(error), 200)}") from None

    def _new_deserializer(self, explicit: bool) -> Any:
        try:
            from confluent_kafka.schema_registry.json_schema import JSONDeserializer
        except ImportError:
            raise MissingDependencyError("confluent-kafka[json]", "kafka") from None
        # Validation is ours (it reports the JSON path); TOPIC avoids the default strategy's lookups.
        conf = {"subject.name.strategy.type": "TOPIC", "validate": False}
        if explicit:
            assert self._explicit is not None  # noqa: S101
            return JSONDeserializer(self._explicit.text, conf=conf, json_decode=parse_json)
        client = registry_client(self.config.registry)
        return JSONDeserializer(None, schema_registry_client=client, conf=conf, json_decode=parse_json)

    def _writer_for(self, schema_id: int, subject: str) -> WriterSchema:
        writer = self._writers.get(schema_id)
        if writer is not None:
            return writer
        explicit = self._explicit
        if explicit is not None and self.config.schema_id in (None, schema_id):
            writer = explicit
        elif self.config.url is None:
            given = f" (the '{NAME}.schema' option is for id {self.config.schema_id})" if explicit else ""
            raise FieldError(
                "",
                f"unknown schema id {schema_id}{given}: set '{NAME}.url' to fetch writer schemas from the "
                f"Schema Registry, or '{NAME}.schema' (and '{NAME}.schema-id') to this id's writer schema",
            )
        else:
            text = fetch_schema(self.config.registry, schema_id, "JSON", NAME, subject)
            writer = self._writer(text, f"writer schema {schema_id}")
        self._writers.put(schema_id, writer)
        return writer

    def _writer(self, text: str, where: str) -> WriterSchema:
        need_columns = self.config.envelope.schema is None
        try:
            return parse_writer(text, where, need_columns, self.config.validate)
        except SchemaError as error:
            if where.startswith("option"):
                raise
            raise FieldError("", str(error)) from None


class DebeziumJsonRegistryFormat(FormatFactory):
    name = NAME
    spark_source = "cdc-debezium-json-registry"
    encoder_takes_topic = True
    options = OPTIONS
    metadata_columns = METADATA

    def primary_key(
        self, key: bytes | None, value: bytes | None, options: Mapping[str, str] | None = None
    ) -> tuple[str, ...] | None:
        registry = registry_config(OPTIONS.parse(options or {}), NAME)
        return registry_key_fields(key, registry, "JSON", NAME) or json_key_fields(key)

    def create_decoder(
        self, options: Mapping[str, str], schema: Schema | None = None, metadata: Sequence[str] = ()
    ) -> DebeziumJsonRegistryDecoder:
        config = DebeziumJsonRegistryConfig.from_options(options, schema, metadata)
        require_writer_schemas(NAME, config, "JSON Schema")
        return DebeziumJsonRegistryDecoder(config)

    def create_encoder(
        self,
        options: Mapping[str, str],
        schema: Schema,
        key_columns: Sequence[str] = (),
        topic: str | None = None,
    ) -> DebeziumJsonRegistryEncoder:
        config = DebeziumJsonRegistryConfig.from_options(options, self.require_schema(schema))
        require_subject(NAME, config, topic, "the default")
        return DebeziumJsonRegistryEncoder(
            config, key_columns or config.envelope.key_columns, topic or "cdcflow"
        )
