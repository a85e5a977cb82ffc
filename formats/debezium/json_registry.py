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
against its writer
schema with ``jsonschema``; a record that fails is a bad record (dead letter or error) whose reason
is the validator's message and JSON path.

The encoder writes ONE ``u`` event per update, registering a writer schema generated from the table
schema (or the ``schema`` option's) with ``JSONSerializer``, or framing a known ``schema-id``
itself. Decimals are written as JSON numbers (the converter's ``decimal.format=NUMERIC``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import orjson

from cdcflow.formats import connect
from cdcflow.formats.base import (
    ControlEvent,
    Decoded,
    Decoder,
    Encoded,
    EnvelopeEncoder,
    FormatMetrics,
    Message,
    check_key_columns,
    parse_json,
)
from cdcflow.formats.confluent import json_schema as json_schema_types
from cdcflow.formats.confluent.client import (
    CONNECTION_OPTIONS,
    HEADER_SIZE,
    MAGIC_BYTE,
    URL,
    RegistryConfig,
    fetch_schema,
    header_bytes,
    registry_client,
    registry_config,
    schema_id,
    schema_id_of,
    shown_url,
)
from cdcflow.formats.debezium.envelope import (
    DEBEZIUM_OPTIONS,
    ENCODE_OP_MAPPINGS,
    METADATA,
    ChangeBuilder,
    check_metadata,
    metadata_values,
    output_schema,
)
from cdcflow.formats.debezium.json import DebeziumJsonConfig, DebeziumJsonDecoder
from cdcflow.formats.errors import (
    EncodeError,
    FieldError,
    FormatError,
    FormatOptionError,
    MissingDependencyError,
    SchemaError,
    excerpt,
)
from cdcflow.formats.json_encode import IGNORE_PARSE_ERRORS
from cdcflow.formats.lru import SCHEMA_CACHE_SIZE, LruCache
from cdcflow.formats.options import Option, OptionSet, boolean, optional_string
from cdcflow.formats.redact import redact, redacted_repr
from cdcflow.formats.registry import FormatFactory
from cdcflow.formats.types import Schema

NAME = "debezium-json-registry"
#: The topic of a message without one (a plain file): the TOPIC strategy's subject is "cdcflow-value".
_NO_TOPIC = "cdcflow"
#: The longest validator message a reason quotes (it shows the offending value).
_MAX_VALIDATION_MESSAGE = 300


OPTIONS = OptionSet(
    NAME,
    [
        URL,
        Option(
            "subject",
            optional_string,
            None,
            "the subject the encoder registers its writer schema under (default: <topic>-value)",
        ),
        Option("schema", optional_string, None, "the writer JSON Schema, instead of the registry"),
        Option(
            "schema-id",
            schema_id,
            None,
            "the id of the 'schema' option's schema: decoding uses it for this id only (other ids go to the "
            "registry); encoding writes this id instead of registering",
        ),
        Option(
            "validate",
            boolean,
            False,
            "check each record against its writer schema (jsonschema); one that fails is a bad record",
        ),
        *CONNECTION_OPTIONS,
        IGNORE_PARSE_ERRORS,
        *DEBEZIUM_OPTIONS,
    ],
)


@dataclass(frozen=True)
class DebeziumJsonRegistryConfig:
    envelope: DebeziumJsonConfig
    """debezium-json's settings (``schema-include`` on: the writer schema is the schema block)."""
    registry: RegistryConfig = ()
    subject: str | None = None
    writer_schema: str | None = None
    schema_id: int | None = None
    validate: bool = False

    @property
    def url(self) -> str | None:
        return dict(self.registry).get("url")

    def __repr__(self) -> str:
        return redacted_repr(self)

    @classmethod
    def from_options(
        cls, options: Mapping[str, str], schema: Schema | None, metadata: Sequence[str] = ()
    ) -> DebeziumJsonRegistryConfig:
        values = OPTIONS.parse(options)
        envelope = DebeziumJsonConfig(
            schema=schema,
            schema_include=True,
            ignore_parse_errors=values["ignore-parse-errors"],
            mode=values["changelog-mode"],
            unavailable=values["unavailable-values"],
            key_columns=values["key-columns"],
            metadata=check_metadata(metadata, NAME),
        )
        config = cls(
            envelope=envelope,
            registry=registry_config(values, NAME),
            subject=values["subject"],
            writer_schema=values["schema"],
            schema_id=values["schema-id"],
            validate=values["validate"],
        )
        if schema is not None:
            check_key_columns(schema, envelope.key_columns)
            output_schema(
                schema, envelope.metadata, unavailable=envelope.unavailable, key_columns=envelope.key_columns
            )
        if config.writer_schema is not None:
            try:
                _parse_writer(config.writer_schema, f"option '{NAME}.schema'", schema is None, False)
            except SchemaError as error:
                raise FormatOptionError(str(error)) from None
        return config


@dataclass(frozen=True)
class _Writer:
    """One writer schema, parsed once: its text, its Connect form and its validator."""

    text: str
    connect: dict[str, Any] | None
    """The envelope's ``before``/``after`` as a Connect schema block; None: read the declared columns."""
    validator: Any = field(default=None, compare=False)


def _parse_writer(text: str, where: str, need_columns: bool, validate: bool) -> _Writer:
    try:
        parsed = json.loads(text)
    except ValueError as error:
        raise SchemaError(f"{where} is not JSON: {error}") from None
    if not isinstance(parsed, Mapping):
        raise SchemaError(f"{where} is not a JSON Schema object")
    try:
        block: dict[str, Any] | None = _envelope_block(parsed)
    except SchemaError as error:
        if need_columns:
            raise SchemaError(f"{where}: {error}") from None
        block = None  # the declared columns are read, as debezium-json without a schema block
    return _Writer(text, block, _validator(parsed, where) if validate else None)


def _envelope_block(envelope: Mapping[str, Any]) -> dict[str, Any]:
    """The Connect struct of the envelope's ``before`` and ``after`` (the rest is not typed)."""
    properties = envelope.get("properties")
    if not isinstance(properties, Mapping) or not ({"before", "after"} & properties.keys()):
        raise SchemaError(
            "the writer schema has neither an 'after' nor a 'before' property: is it a Debezium Envelope?"
        )
    fields = [
        {**json_schema_types.to_connect(properties[name], name), "field": name}
        for name in ("after", "before")
        if name in properties
    ]
    return {"type": "struct", "fields": fields}


def _validator(schema: Any, where: str) -> Any:
    try:
        from jsonschema import exceptions, validators
    except ImportError:
        raise MissingDependencyError("jsonschema", "kafka") from None
    relaxed = json_schema_types.relaxed_for_validation(schema)
    cls = validators.validator_for(relaxed)
    try:
        cls.check_schema(relaxed)
    except exceptions.SchemaError as error:
        raise SchemaError(f"{where} is not a valid JSON Schema: {error.message}") from None
    return cls(relaxed)


def _validation_error(writer: _Writer, envelope: Any, schema_id: int | str) -> FieldError | None:
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
        self._writers: LruCache[int, _Writer] = LruCache(SCHEMA_CACHE_SIZE)
        self._explicit: _Writer | None = None
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

    def _deserialize(self, message: Message, writer: _Writer) -> Any:
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

    def _writer_for(self, schema_id: int, subject: str) -> _Writer:
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

    def _writer(self, text: str, where: str) -> _Writer:
        need_columns = self.config.envelope.schema is None
        try:
            return _parse_writer(text, where, need_columns, self.config.validate)
        except SchemaError as error:
            if where.startswith("option"):
                raise
            raise FieldError("", str(error)) from None


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


class DebeziumJsonRegistryFormat(FormatFactory):
    name = NAME
    options = OPTIONS
    metadata_columns = METADATA

    def create_decoder(
        self, options: Mapping[str, str], schema: Schema | None = None, metadata: Sequence[str] = ()
    ) -> DebeziumJsonRegistryDecoder:
        config = DebeziumJsonRegistryConfig.from_options(options, schema, metadata)
        if config.url is None and config.writer_schema is None:
            raise FormatOptionError(
                f"format '{NAME}' needs the writer schemas: set '{NAME}.url' to the Schema Registry, or "
                f"'{NAME}.schema' to the writer JSON Schema"
            )
        return DebeziumJsonRegistryDecoder(config)

    def create_encoder(
        self,
        options: Mapping[str, str],
        schema: Schema,
        key_columns: Sequence[str] = (),
        topic: str | None = None,
    ) -> DebeziumJsonRegistryEncoder:
        config = DebeziumJsonRegistryConfig.from_options(options, self.require_schema(schema))
        if config.url is not None and config.schema_id is None and config.subject is None and topic is None:
            raise FormatOptionError(
                f"set '{NAME}.subject' to register the writer schema under (the default is "
                "'<topic>-value', and no topic was given)"
            )
        return DebeziumJsonRegistryEncoder(
            config, key_columns or config.envelope.key_columns, topic or "cdcflow"
        )
