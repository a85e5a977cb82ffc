"""``debezium-avro-confluent``: Debezium change events in Confluent's Avro wire format.

A message is the magic byte 0, the writer schema's id (4 bytes, big-endian) and the Avro binary
body, framed and unframed by confluent-kafka's serde
(:mod:`cdcflow.formats.confluent.avro_serde`). Writer schemas come from a
Schema Registry (``url``, through confluent-kafka's client, created lazily on each executor and never
pickled), or from the ``schema`` option (air-gapped use, tests), optionally tied to one
``schema-id``. Each schema is fetched and parsed once per decoder. With a registry, the encoder keys
each record by an Avro record of the key columns (subject ``<topic>-key``).

The Debezium semantics (op codes, upsert mode, TOAST placeholders, metadata columns) are those of
``debezium-json`` (:mod:`debezium`); the Connect logical types in the Avro schema are typed as in the
JSON form's schema block (:mod:`avro_types`). Without a declared schema the columns are the writer
schema's ``after`` record. An update is written as ONE ``u`` event (Flink writes a delete and an
insert), with a writer schema generated from the table schema, or the ``schema`` option's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import fastavro

from cdcflow.formats.base import (
    ControlEvent,
    Decoded,
    Decoder,
    Encoded,
    EnvelopeEncoder,
    FormatMetrics,
    Message,
    check_key_columns,
    check_new_columns,
)
from cdcflow.formats.confluent import avro_types
from cdcflow.formats.confluent.avro_serde import AvroReader, AvroWriter, WriterSchemas
from cdcflow.formats.confluent.client import (
    CONNECTION_OPTIONS,
    HEADER_SIZE,
    MAGIC_BYTE,
    RegistryConfig,
    registry_config,
    schema_id,
)
from cdcflow.formats.confluent.client import registry_client as registry_client  # re-exported
from cdcflow.formats.confluent.registry_needs import require_subject, require_writer_schemas
from cdcflow.formats.debezium.envelope import (
    CONTROL_OPS,
    DEBEZIUM_OPTIONS,
    ENCODE_OP_MAPPINGS,
    METADATA,
    ChangeBuilder,
    DebeziumMode,
    UnavailableHandling,
    check_metadata,
    coerce_converter,
    image,
    is_unavailable,
    metadata_values,
    output_schema,
)
from cdcflow.formats.errors import (
    FieldError,
    FormatOptionError,
    SchemaError,
    excerpt,
)
from cdcflow.formats.json_decode import RowConverter
from cdcflow.formats.json_encode import IGNORE_PARSE_ERRORS
from cdcflow.formats.options import Option, OptionSet, optional_string
from cdcflow.formats.primary_keys import registry_key_fields
from cdcflow.formats.redact import redact, redacted_repr
from cdcflow.formats.registry import FormatFactory
from cdcflow.formats.types import Schema

NAME = "debezium-avro-confluent"


OPTIONS = OptionSet(
    NAME,
    [
        Option(
            "url", optional_string, None, "the Schema Registry URL(s), comma-separated (mock:// for tests)"
        ),
        Option(
            "subject",
            optional_string,
            None,
            "the subject the encoder registers its writer schema under (default: <topic>-value)",
        ),
        Option("schema", optional_string, None, "the writer schema as Avro JSON, instead of the registry"),
        Option(
            "schema-id",
            schema_id,
            None,
            "the id of the 'schema' option's schema: decoding uses it for this id only (other ids go to the "
            "registry); encoding writes this id instead of registering",
        ),
        *CONNECTION_OPTIONS,
        IGNORE_PARSE_ERRORS,
        *DEBEZIUM_OPTIONS,
    ],
)


@dataclass(frozen=True)
class DebeziumAvroConfig:
    schema: Schema | None
    registry: RegistryConfig = ()
    subject: str | None = None
    writer_schema: str | None = None
    schema_id: int | None = None
    ignore_parse_errors: bool = False
    mode: DebeziumMode = DebeziumMode.RETRACT
    unavailable: UnavailableHandling = UnavailableHandling.FILL
    key_columns: tuple[str, ...] = ()
    metadata: tuple[str, ...] = ()
    fail_on_new_columns: bool = False
    """The schema was inferred: a writer schema with more columns raises NewColumnsError."""

    @property
    def url(self) -> str | None:
        return dict(self.registry).get("url")

    @property
    def shown_url(self) -> str:
        """The registry URL for messages: credentials in it replaced by ``***``."""
        return redact(self.url or "", self.registry)

    def redact(self, error: object) -> str:
        """A registry client's error text, with the registry's credentials replaced by ``***``."""
        return redact(str(error), self.registry)

    def __repr__(self) -> str:
        return redacted_repr(self)

    @classmethod
    def from_options(
        cls, options: Mapping[str, str], schema: Schema | None, metadata: Sequence[str] = ()
    ) -> DebeziumAvroConfig:
        values = OPTIONS.parse(options)
        config = cls(
            schema=schema,
            registry=registry_config(values, NAME),
            subject=values["subject"],
            writer_schema=values["schema"],
            schema_id=values["schema-id"],
            ignore_parse_errors=values["ignore-parse-errors"],
            mode=values["changelog-mode"],
            unavailable=values["unavailable-values"],
            key_columns=values["key-columns"],
            metadata=check_metadata(metadata, NAME),
        )
        if config.writer_schema is not None:
            try:
                expanded, _ = _parse_writer(config.writer_schema, f"option '{NAME}.schema'")
                avro_types.record_columns(_value_record(expanded))
            except SchemaError as error:
                raise FormatOptionError(str(error)) from None
        if schema is not None:
            check_key_columns(schema, config.key_columns)
            output_schema(
                schema, config.metadata, unavailable=config.unavailable, key_columns=config.key_columns
            )
        return config


@dataclass(frozen=True)
class _Writer:
    """One writer schema, read once: its text, the row converter of its Value record and the output
    columns it gives (the decoder's ``schema`` while its messages are read)."""

    text: str
    rows: RowConverter
    columns: Schema


def _parse_writer(text: str, where: str) -> tuple[Any, Any]:
    """(the expanded schema with its attributes, fastavro's parsed schema for raw values)."""
    try:
        raw = json.loads(text)
        expanded = fastavro.parse_schema(raw, expand=True)
        parsed = fastavro.parse_schema(avro_types.strip_logical_types(raw))
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as error:
        raise SchemaError(f"{where} is not a valid Avro schema: {error}") from None
    return expanded, parsed


def _value_record(envelope: Any) -> Any:
    for name in ("after", "before"):
        for child in avro_types.record_fields(envelope, "envelope"):
            if child["name"] == name:
                return avro_types.unwrap_optional(child["type"], name)[0]
    raise SchemaError(
        "the writer schema has neither an 'after' nor a 'before' field: is it a Debezium Envelope?"
    )


class DebeziumAvroDecoder(Decoder):
    format_name = NAME

    def __init__(self, config: DebeziumAvroConfig) -> None:
        super().__init__(ignore_parse_errors=config.ignore_parse_errors)
        self.config = config
        self._explicit: _Writer | None = None
        # confluent-kafka's deserializers, built on first use in each process (never pickled).
        self._values: AvroReader[_Writer] | None = None
        self._keys: AvroReader[None] | None = None
        self._builder = ChangeBuilder(
            config.mode, config.unavailable, config.key_columns, NAME, config.metadata
        )
        if config.schema is not None:
            self.schema = output_schema(
                config.schema, config.metadata, unavailable=config.unavailable, key_columns=config.key_columns
            )
        if config.writer_schema is not None:
            self._explicit = self._writer(config.writer_schema, f"option '{NAME}.schema'")
            self.schema = self._explicit.columns

    def __reduce__(self) -> tuple[Callable[..., DebeziumAvroDecoder], tuple[DebeziumAvroConfig]]:
        return type(self), (self.config,)

    def failing_on_new_columns(self) -> DebeziumAvroDecoder:
        return type(self)(replace(self.config, fail_on_new_columns=True))

    def decode_message(self, message: Message, metrics: FormatMetrics) -> Decoded:
        assert message.value is not None  # noqa: S101 - the base class skips tombstones
        values = self._values
        if values is None:
            explicit = self._explicit
            schemas = WriterSchemas(
                self.config.registry,
                NAME,
                self._writer,
                (explicit.text, explicit) if explicit is not None else None,
                self.config.schema_id,
            )
            values = self._values = AvroReader(schemas)
        writer, payload = values.read(message.value)
        self.schema = writer.columns  # a writer schema seen before may come back: its columns again
        if not isinstance(payload, dict):
            raise FieldError("", "the writer schema is not a record: is this a Debezium Envelope?")
        op = payload.get("op")
        if isinstance(op, str) and op in CONTROL_OPS:  # op may be any JSON value
            extra = metadata_values(self.config.metadata, payload, [], writer.text, message.headers)
            return ControlEvent(CONTROL_OPS[op], message, payload, extra)
        if not isinstance(op, str):
            raise FieldError(
                "op",
                f"the operation code is missing or not a string (got {excerpt(op)}); is this a Debezium "
                "event?",
            )
        before = image(writer.rows, payload.get("before"), "before", "a record")
        after = image(writer.rows, payload.get("after"), "after", "a record")
        key = self._builder.state_key(after if after is not None else before, message, self._key)
        changes, missing = self._builder.changes(op, before, after, key, metrics, writer.rows.schema)
        if self.config.metadata:
            extra = metadata_values(self.config.metadata, payload, missing, writer.text, message.headers)
            for change in changes:
                change.row.update(extra)
        return changes

    def _writer(self, text: str, where: str) -> _Writer:
        try:
            expanded, _ = _parse_writer(text, where)
            physical, converters = avro_types.record_columns(_value_record(expanded))
        except SchemaError as error:
            if where.startswith("option"):
                raise
            raise FieldError("", str(error)) from None
        declared = self.config.schema
        if declared is None:
            columns = output_schema(
                physical,
                self.config.metadata,
                unavailable=self.config.unavailable,
                key_columns=self.config.key_columns,
            )
            rows = RowConverter(physical, converters=converters, unavailable=is_unavailable)
        else:
            if self.config.fail_on_new_columns:
                check_new_columns(declared, physical)
            chosen = {}
            for column in declared:
                if column.name in physical:
                    source = physical.field(column.name).type
                    chosen[column.name] = coerce_converter(
                        converters[column.name], source, column.type, column.name
                    )
            rows = RowConverter(
                declared, converters=chosen, unavailable=is_unavailable, enforce_not_null=True
            )
            columns = self.schema
        return _Writer(text, rows, columns)

    def _key(self, message: Message) -> dict[str, Any] | None:
        """The Kafka key's fields, when it is an Avro record whose schema can be had; else None."""
        data = message.key
        if data is None or not self.config.registry or len(data) < HEADER_SIZE or data[0] != MAGIC_BYTE:
            return None
        keys = self._keys
        if keys is None:
            keys = self._keys = AvroReader(WriterSchemas(self.config.registry, NAME, _no_rows))
        try:
            _, key = keys.read(data)
        except FieldError:
            return None
        return key if isinstance(key, dict) else None


def _no_rows(text: str, where: str) -> None:
    """A key schema: checked by the serde, its raw values used as they are (the state's key)."""


class DebeziumAvroEncoder(EnvelopeEncoder):
    """Writes ``{before, after, op}`` Envelope records in Confluent's wire format.

    The writer schema is the ``schema`` option's, else generated from the table schema (Debezium's
    Connect types: Decimal bytes, MicroTimestamp, Date, ZonedTimestamp, ...). Its id is ``schema-id``,
    else the id the registry gives when it is registered under ``subject`` (default ``<topic>-value``),
    on the first record; confluent-kafka's AvroSerializer frames the body. Updates are combined: a
    ``-U`` waits for its key's ``+U`` and both go out as one ``u`` event.

    With a registry, a topic and key columns, the Kafka key is an Avro record of the key columns, as
    Debezium's AvroConverter writes it (record ``<topic>.Key``, subject ``<topic>-key``); without a
    registry the key schema cannot be registered and the key is left out (None).
    """

    format_name = NAME

    def __init__(
        self,
        config: DebeziumAvroConfig,
        key_columns: Sequence[str],
        topic_name: str = "cdcflow",
        key_subject: str | None = None,
    ) -> None:
        assert config.schema is not None  # noqa: S101 - encoders need the row schema
        super().__init__("op", ENCODE_OP_MAPPINGS[config.mode], key_columns)
        self.config = config
        self.subject = config.subject or f"{topic_name}-value"
        namespace = avro_types.avro_namespace(topic_name)
        if config.writer_schema is not None:
            self.writer_schema = config.writer_schema
        else:
            self.writer_schema = json.dumps(avro_types.envelope_schema(config.schema, namespace))
        expanded, _ = _parse_writer(self.writer_schema, f"option '{NAME}.schema'")
        for child in avro_types.record_fields(expanded, "envelope"):
            if child["name"] not in ("before", "after", "op") and "default" not in child:
                raise FormatOptionError(
                    f"the Envelope of '{NAME}.schema' requires the field '{child['name']}', which the "
                    "encoder does not write (only before, after and op): give it a default, or leave the "
                    "'schema' option out to write a generated schema"
                )
        wire, _ = avro_types.record_columns(_value_record(expanded))
        for column in config.schema:
            if column.name not in wire:
                raise FormatOptionError(
                    f"column '{column.name}' is not in the Value record of '{NAME}.schema' ({wire.names})"
                )
        self._rows = avro_types.RecordEncoder(wire)
        if config.schema_id is None and config.url is None:
            raise FormatOptionError(
                f"the encoder needs a schema id: set '{NAME}.url' to register the writer schema, or "
                f"'{NAME}.schema-id' to write a known id"
            )
        #: The Kafka key's Avro schema (None: no key is written) and its subject.
        self.key_schema: str | None = None
        self.key_subject = key_subject
        if key_subject is not None and self.key_columns:
            key_wire = Schema(tuple(wire.field(c) for c in self.key_columns))
            self.key_schema = json.dumps(avro_types.SchemaWriter(namespace).record(key_wire, "Key"))
            self._key_rows = avro_types.RecordEncoder(key_wire)
        # confluent-kafka's serializers, built on the first record.
        self._values: AvroWriter | None = None
        self._keys: AvroWriter | None = None

    def _serialise(self, envelope: Mapping[str, Any]) -> Encoded:
        before, after = envelope.get("before"), envelope.get("after")
        record = {
            "before": self._rows.encode(before) if before is not None else None,
            "after": self._rows.encode(after) if after is not None else None,
            "op": envelope["op"],
        }
        values = self._values
        if values is None:
            config = self.config
            values = AvroWriter(config.registry, NAME, self.writer_schema, self.subject, config.schema_id)
            self._values = values
        value = values.write(record, f"{record['op']!r} event")
        return Encoded(self._key(after if after is not None else before), value)

    def _key(self, row: Mapping[str, Any] | None) -> bytes | None:
        if self.key_schema is None or self.key_subject is None or row is None:
            return None
        keys = self._keys
        if keys is None:
            keys = self._keys = AvroWriter(
                self.config.registry, NAME, self.key_schema, self.key_subject, None
            )
        return keys.write(self._key_rows.encode(row), "the key")


class DebeziumAvroFormat(FormatFactory):
    name = NAME
    spark_source = "cdc-debezium-avro"
    encoder_takes_topic = True
    options = OPTIONS
    metadata_columns = METADATA

    def primary_key(
        self, key: bytes | None, value: bytes | None, options: Mapping[str, str] | None = None
    ) -> tuple[str, ...] | None:
        registry = registry_config(OPTIONS.parse(options or {}), NAME)
        return registry_key_fields(key, registry, "AVRO", NAME)

    def create_decoder(
        self, options: Mapping[str, str], schema: Schema | None = None, metadata: Sequence[str] = ()
    ) -> DebeziumAvroDecoder:
        config = DebeziumAvroConfig.from_options(options, schema, metadata)
        require_writer_schemas(NAME, config, "Avro JSON")
        return DebeziumAvroDecoder(config)

    def create_encoder(
        self,
        options: Mapping[str, str],
        schema: Schema,
        key_columns: Sequence[str] = (),
        topic: str | None = None,
    ) -> DebeziumAvroEncoder:
        config = DebeziumAvroConfig.from_options(options, self.require_schema(schema))
        require_subject(NAME, config, topic, "Flink's default")
        # The Kafka key is registered under <topic>-key, as Confluent's serializer names it.
        key_subject = f"{topic}-key" if topic is not None and config.url is not None else None
        return DebeziumAvroEncoder(config, key_columns or config.key_columns, topic or "cdcflow", key_subject)
