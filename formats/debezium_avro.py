"""``debezium-avro-confluent``: Debezium change events in Confluent's Avro wire format.

A message is the magic byte 0, the writer schema's id (4 bytes, big-endian) and the Avro binary
body. Writer schemas come from a Schema Registry (``url``, through confluent-kafka's client, created
lazily on each executor and never pickled), or from the ``schema`` option (air-gapped use, tests),
optionally tied to one ``schema-id``. Each schema is fetched and parsed once per decoder.

The Debezium semantics (op codes, upsert mode, TOAST placeholders, metadata columns) are those of
``debezium-json`` (:mod:`debezium`); the Connect logical types in the Avro schema are typed as in the
JSON form's schema block (:mod:`avro_types`). Without a declared schema the columns are the writer
schema's ``after`` record. An update is written as ONE ``u`` event (Flink writes a delete and an
insert), with a writer schema generated from the table schema, or the ``schema`` option's.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import fastavro

from cdcflow.formats import avro_types
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
from cdcflow.formats.debezium import (
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
    EncodeError,
    FieldError,
    FormatError,
    FormatOptionError,
    MissingDependencyError,
    SchemaError,
    excerpt,
)
from cdcflow.formats.jsonenc import IGNORE_PARSE_ERRORS
from cdcflow.formats.lru import SCHEMA_CACHE_SIZE, LruCache
from cdcflow.formats.options import Option, OptionSet, optional_string
from cdcflow.formats.redact import redact, redacted_repr
from cdcflow.formats.registry import FormatFactory
from cdcflow.formats.types import Schema
from cdcflow.formats.values import RowConverter

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

NAME = "debezium-avro-confluent"
MAGIC_BYTE = 0
HEADER_SIZE = 5


def _schema_id(text: str) -> int | None:
    if not text.strip():
        return None
    number = int(text.strip()) if text.strip().isdigit() else -1
    if not 0 <= number < 2**31:
        raise ValueError(f"'{text}' is not a schema id (an integer from 0 to 2147483647)")
    return number


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
            _schema_id,
            None,
            "the id of the 'schema' option's schema: decoding uses it for this id only (other ids go to the "
            "registry); encoding writes this id instead of registering",
        ),
        Option("basic-auth.user-info", optional_string, None, "<user>:<password> for the Schema Registry"),
        Option("bearer-auth.token", optional_string, None, "a static bearer token for the Schema Registry"),
        Option(
            "bearer-auth.logical-cluster",
            optional_string,
            None,
            "the registry's logical cluster id, which a bearer token needs (Confluent Cloud: lsrc-...)",
        ),
        Option("bearer-auth.identity-pool-id", optional_string, None, "the identity pool of a bearer token"),
        Option(
            "ssl.ca.location", optional_string, None, "a CA certificate file (PEM) for the registry's TLS"
        ),
        Option("ssl.certificate.location", optional_string, None, "a client certificate file (PEM)"),
        Option("ssl.key.location", optional_string, None, "the client certificate's private key file"),
        IGNORE_PARSE_ERRORS,
        *DEBEZIUM_OPTIONS,
    ],
)
_CLIENT_KEYS = {
    "url": "url",
    "basic-auth.user-info": "basic.auth.user.info",
    "bearer-auth.token": "bearer.auth.token",
    "bearer-auth.logical-cluster": "bearer.auth.logical.cluster",
    "bearer-auth.identity-pool-id": "bearer.auth.identity.pool.id",
    "ssl.ca.location": "ssl.ca.location",
    "ssl.certificate.location": "ssl.certificate.location",
    "ssl.key.location": "ssl.key.location",
}

RegistryConfig = tuple[tuple[str, str], ...]


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
        registry = {_CLIENT_KEYS[k]: v for k, v in values.items() if k in _CLIENT_KEYS and v is not None}
        if "bearer.auth.token" in registry:
            registry["bearer.auth.credentials.source"] = "STATIC_TOKEN"
        if registry and "url" not in registry:
            raise FormatOptionError(
                f"the Schema Registry options ({', '.join(sorted(registry))}) need '{NAME}.url'"
            )
        config = cls(
            schema=schema,
            registry=tuple(sorted(registry.items())),
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
        if config.url is not None:
            _check_client(config.registry)
        return config


# Registry clients are per process and per configuration, never pickled: executors build their own.
# Sharing them also gives a mock:// URL one registry per process, as Confluent's Java mock does.
_CLIENTS: dict[RegistryConfig, SchemaRegistryClient] = {}
_CLIENTS_LOCK = threading.Lock()


def registry_client(registry: RegistryConfig) -> SchemaRegistryClient:
    """The process's Schema Registry client for this configuration (``mock://`` URLs: a mock)."""
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(registry)
        if client is None:
            try:
                from confluent_kafka.schema_registry import SchemaRegistryClient
            except ImportError:
                raise MissingDependencyError("confluent-kafka", "kafka") from None
            client = SchemaRegistryClient.new_client(dict(registry))
            _CLIENTS[registry] = client
        return client


def _check_client(registry: RegistryConfig) -> None:
    try:
        registry_client(registry)
    except (ValueError, TypeError) as error:
        raise FormatOptionError(
            f"the Schema Registry options are not valid: {redact(str(error), registry)}"
        ) from None


@dataclass(frozen=True)
class _Writer:
    """One writer schema, parsed once: the reader's form, the row converter and the output columns."""

    text: str
    parsed: Any
    rows: RowConverter


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
        self._writers: LruCache[int, _Writer] = LruCache(SCHEMA_CACHE_SIZE)
        self._explicit: _Writer | None = None
        self._keys: LruCache[int, Any] = LruCache(SCHEMA_CACHE_SIZE)
        self._builder = ChangeBuilder(
            config.mode, config.unavailable, config.key_columns, NAME, config.metadata
        )
        if config.schema is not None:
            self.schema = output_schema(
                config.schema, config.metadata, unavailable=config.unavailable, key_columns=config.key_columns
            )
        if config.writer_schema is not None:
            self._explicit = self._writer(config.writer_schema, f"option '{NAME}.schema'")

    def __reduce__(self) -> tuple[Callable[..., DebeziumAvroDecoder], tuple[DebeziumAvroConfig]]:
        return type(self), (self.config,)

    def failing_on_new_columns(self) -> DebeziumAvroDecoder:
        return type(self)(replace(self.config, fail_on_new_columns=True))

    def decode_message(self, message: Message, metrics: FormatMetrics) -> Decoded:
        assert message.value is not None  # noqa: S101 - the base class skips tombstones
        schema_id = _header(message.value)
        writer = self._writer_for(schema_id)
        body = io.BytesIO(message.value)
        body.seek(HEADER_SIZE)
        try:
            payload = fastavro.schemaless_reader(body, writer.parsed, None)
        except (EOFError, ValueError, IndexError, UnicodeDecodeError) as error:
            raise FieldError(
                "",
                f"the Avro body does not match writer schema {schema_id} ({type(error).__name__}: {error})",
            ) from None
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

    def _writer_for(self, schema_id: int) -> _Writer:
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
            writer = self._writer(self._fetch(schema_id), f"writer schema {schema_id}")
        self._writers.put(schema_id, writer)
        return writer

    def _fetch(self, schema_id: int) -> str:
        client = registry_client(self.config.registry)
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            registered = client.get_schema(schema_id)
        except SchemaRegistryError as error:
            if error.http_status_code == 404:
                raise FieldError(
                    "", f"schema id {schema_id} is not in the Schema Registry at {self.config.shown_url}"
                ) from None
            raise FormatError(
                f"{NAME}: the Schema Registry at {self.config.shown_url} refused schema id {schema_id}: "
                f"{self.config.redact(error)}. "
                f"Check '{NAME}.url' and the credentials (basic-auth.user-info, bearer-auth.token)"
            ) from None
        except Exception as error:  # httpx's transport errors, by any name
            raise FormatError(
                f"{NAME}: cannot reach the Schema Registry at {self.config.shown_url} to fetch schema id "
                f"{schema_id} ({type(error).__name__}: {self.config.redact(error)}). Check '{NAME}.url' and "
                f"the network, or set '{NAME}.schema' to decode without the registry"
            ) from None
        if (registered.schema_type or "AVRO") != "AVRO":
            raise FieldError("", f"schema id {schema_id} is a {registered.schema_type} schema, not Avro")
        return str(registered.schema_str)

    def _writer(self, text: str, where: str) -> _Writer:
        try:
            expanded, parsed = _parse_writer(text, where)
            physical, converters = avro_types.record_columns(_value_record(expanded))
        except SchemaError as error:
            if where.startswith("option"):
                raise
            raise FieldError("", str(error)) from None
        declared = self.config.schema
        if declared is None:
            self.schema = output_schema(
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
            rows = RowConverter(declared, converters=chosen, unavailable=is_unavailable)
        return _Writer(text, parsed, rows)

    def _key(self, message: Message) -> dict[str, Any] | None:
        """The Kafka key's fields, when it is an Avro record whose schema can be had; else None."""
        data = message.key
        if data is None or len(data) < HEADER_SIZE or data[0] != MAGIC_BYTE:
            return None
        schema_id = int.from_bytes(data[1:HEADER_SIZE], "big")
        parsed = self._keys.get(schema_id)
        if parsed is None:
            if self.config.url is None:
                return None
            try:
                parsed = _parse_writer(self._fetch(schema_id), f"key schema {schema_id}")[1]
            except (FieldError, SchemaError):
                return None
            self._keys.put(schema_id, parsed)
        body = io.BytesIO(data)
        body.seek(HEADER_SIZE)
        try:
            key = fastavro.schemaless_reader(body, parsed, None)
        except (EOFError, ValueError, IndexError, UnicodeDecodeError):
            return None
        return key if isinstance(key, dict) else None


def _header(value: bytes) -> int:
    if value[0] != MAGIC_BYTE:
        raise FieldError(
            "",
            f"not Confluent wire format: first byte is 0x{value[0]:02x}, expected 0x00 (the magic byte of "
            "Confluent's Avro serializer); is the topic written with another converter (JSON: "
            "debezium-json)?",
        )
    if len(value) < HEADER_SIZE:
        raise FieldError("", f"the message has {len(value)} bytes, fewer than the 5-byte Confluent header")
    return int.from_bytes(value[1:HEADER_SIZE], "big")


class DebeziumAvroEncoder(EnvelopeEncoder):
    """Writes ``{before, after, op}`` Envelope records in Confluent's wire format.

    The writer schema is the ``schema`` option's, else generated from the table schema (Debezium's
    Connect types: Decimal bytes, MicroTimestamp, Date, ZonedTimestamp, ...). Its id is ``schema-id``,
    else the id the registry gives when it is registered under ``subject`` (default ``<topic>-value``),
    on the first record. Updates are combined: a ``-U`` waits for its key's ``+U`` and both go out as
    one ``u`` event. The Kafka key is left to the connector's key format (as in Flink).
    """

    format_name = NAME

    def __init__(
        self, config: DebeziumAvroConfig, key_columns: Sequence[str], topic_name: str = "cdcflow"
    ) -> None:
        assert config.schema is not None  # noqa: S101 - encoders need the row schema
        super().__init__("op", ENCODE_OP_MAPPINGS[config.mode], key_columns)
        self.config = config
        self.subject = config.subject or f"{topic_name}-value"
        if config.writer_schema is not None:
            self.writer_schema = config.writer_schema
        else:
            namespace = avro_types.avro_namespace(topic_name)
            self.writer_schema = json.dumps(avro_types.envelope_schema(config.schema, namespace))
        expanded, self._parsed = _parse_writer(self.writer_schema, f"option '{NAME}.schema'")
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
        self._header: bytes | None = None
        if config.schema_id is not None:
            self._header = _header_bytes(config.schema_id)
        elif config.url is None:
            raise FormatOptionError(
                f"the encoder needs a schema id: set '{NAME}.url' to register the writer schema, or "
                f"'{NAME}.schema-id' to write a known id"
            )

    def _serialise(self, envelope: Mapping[str, Any]) -> Encoded:
        before, after = envelope.get("before"), envelope.get("after")
        record = {
            "before": self._rows.encode(before) if before is not None else None,
            "after": self._rows.encode(after) if after is not None else None,
            "op": envelope["op"],
        }
        out = io.BytesIO()
        out.write(self._header or self._register())
        try:
            fastavro.schemaless_writer(out, self._parsed, record)
        except (ValueError, TypeError, AttributeError, OverflowError) as error:
            raise EncodeError(
                f"{NAME}: cannot write {record['op']!r} event as Avro ({type(error).__name__}: {error})"
            ) from None
        return Encoded(None, out.getvalue())

    def _register(self) -> bytes:
        from confluent_kafka.schema_registry import Schema as RegistrySchema

        client = registry_client(self.config.registry)
        try:
            schema_id = client.register_schema(self.subject, RegistrySchema(self.writer_schema, "AVRO"))
        except Exception as error:  # registry refusals and transport errors alike
            raise FormatError(
                f"{NAME}: cannot register the writer schema under subject '{self.subject}' at the Schema "
                f"Registry {self.config.shown_url} ({type(error).__name__}: {self.config.redact(error)}). "
                f"Check '{NAME}.url', the "
                f"credentials and the subject's compatibility, or set '{NAME}.schema-id'"
            ) from None
        self._header = _header_bytes(schema_id)
        return self._header


def _header_bytes(schema_id: int) -> bytes:
    return bytes([MAGIC_BYTE]) + schema_id.to_bytes(4, "big")


class DebeziumAvroFormat(FormatFactory):
    name = NAME
    options = OPTIONS
    metadata_columns = METADATA

    def create_decoder(
        self, options: Mapping[str, str], schema: Schema | None = None, metadata: Sequence[str] = ()
    ) -> DebeziumAvroDecoder:
        config = DebeziumAvroConfig.from_options(options, schema, metadata)
        if config.url is None and config.writer_schema is None:
            raise FormatOptionError(
                f"format '{NAME}' needs the writer schemas: set '{NAME}.url' to the Schema Registry, or "
                f"'{NAME}.schema' to the writer schema (Avro JSON)"
            )
        return DebeziumAvroDecoder(config)

    def create_encoder(
        self,
        options: Mapping[str, str],
        schema: Schema,
        key_columns: Sequence[str] = (),
        topic: str | None = None,
    ) -> DebeziumAvroEncoder:
        config = DebeziumAvroConfig.from_options(options, self.require_schema(schema))
        if config.url is not None and config.schema_id is None and config.subject is None and topic is None:
            raise FormatOptionError(
                f"set '{NAME}.subject' to register the writer schema under (Flink's default is "
                "'<topic>-value', and no topic was given)"
            )
        return DebeziumAvroEncoder(config, key_columns or config.key_columns, topic or "cdcflow")
