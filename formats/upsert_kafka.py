"""``upsert-kafka``: a compacted topic read as a table, as Flink's ``upsert-kafka`` connector does.

The Kafka key holds the primary-key columns (``key.fields``), the value the row. A value is an upsert
of its key: ``+U`` (Flink's upsert-kafka source declares the changelog mode {+U, -D}; the state that
tells an insert from an update lives downstream). A tombstone (null or empty value) is a ``-D`` of
its key: a partial delete, the key columns set and the other columns NULL.

``key.fields-prefix`` lets key columns be named apart from value columns: the table column ``k_id``
is the field ``id`` in the key. ``value.fields-include`` says whether the value repeats the key
columns (``ALL``, Flink's default) or not (``EXCEPT_KEY``, required with a prefix). With ALL, the
value's copy of a key column wins, as in Flink; without a Kafka key, the key columns come from the
value. The value is JSON; the key JSON, or (``key.format`` = ``avro-confluent``) an Avro record in
Confluent's wire format, read and written with confluent-kafka's serde
(:mod:`cdcflow.formats.confluent.avro_serde`): its
writer schema from the Schema Registry (``key.avro-confluent.url``, subject ``<topic>-key``) or the
``key.avro-confluent.schema`` option, its fields converted to the key columns' types.

Written back, ``+I`` and ``+U`` become key + value, ``-D`` key + tombstone; ``-U`` is not written
(an upsert topic has no use for it) and is counted in ``dropped_update_before``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

from cdcflow.core.model import Change
from cdcflow.core.rowkind import DEL, UA, UB
from cdcflow.formats.base import Decoded, Decoder, Encoded, Encoder, FormatMetrics, Message, parse_json_object
from cdcflow.formats.confluent import avro_types
from cdcflow.formats.confluent.avro_serde import (
    AvroReader,
    AvroWriter,
    WriterSchemas,
    declared_rows,
    expanded_schema,
)
from cdcflow.formats.confluent.client import (
    CONNECTION_OPTIONS,
    URL,
    RegistryConfig,
    registry_config,
    schema_id,
)
from cdcflow.formats.errors import EncodeError, FieldError, FormatOptionError, SchemaError
from cdcflow.formats.json_decode import RowConverter
from cdcflow.formats.json_encode import TIMESTAMP_STANDARD, RowEncoder, TimestampStandard
from cdcflow.formats.options import Option, OptionSet, boolean, choice, names, optional_string
from cdcflow.formats.redact import redacted_repr
from cdcflow.formats.registry import FormatFactory
from cdcflow.formats.types import Field, Schema

NAME = "upsert-kafka"
#: The options of an Avro key, Flink's names: ``key.avro-confluent.url`` and so on.
KEY_AVRO = "key.avro-confluent"


class SerialFormat(Enum):
    JSON = "json"


class KeyFormat(Enum):
    JSON = "json"
    AVRO_CONFLUENT = "avro-confluent"


class FieldsInclude(Enum):
    ALL = "ALL"
    EXCEPT_KEY = "EXCEPT_KEY"


OPTIONS = OptionSet(
    NAME,
    [
        Option("key.fields", names, (), "the primary-key columns, in the order of the Kafka key (required)"),
        Option(
            "key.fields-prefix",
            str,
            "",
            "a prefix the key columns carry in the table but not in the Kafka key (needs EXCEPT_KEY)",
        ),
        Option(
            "key.format",
            choice(KeyFormat),
            KeyFormat.JSON,
            "the Kafka key's format: json, or avro-confluent (Confluent's Avro wire format)",
        ),
        Option("value.format", choice(SerialFormat), SerialFormat.JSON, "the Kafka value's format: json"),
        Option(
            "value.fields-include",
            choice(FieldsInclude),
            FieldsInclude.ALL,
            "ALL: the value holds every column; EXCEPT_KEY: the key columns are only in the key",
        ),
        Option("ignore-parse-errors", boolean, False, "dead-letter records whose key or value is unreadable"),
        TIMESTAMP_STANDARD,
        Option(f"{KEY_AVRO}.{URL.key}", URL.parse, URL.default, URL.description),
        Option(
            f"{KEY_AVRO}.subject",
            optional_string,
            None,
            "the subject the encoder registers the key schema under (default: <topic>-key)",
        ),
        Option(
            f"{KEY_AVRO}.schema",
            optional_string,
            None,
            "the key's writer schema as Avro JSON, instead of the registry (encoding: instead of the one "
            "generated from the key columns)",
        ),
        Option(
            f"{KEY_AVRO}.schema-id",
            schema_id,
            None,
            "the id of the key schema: decoding uses the 'schema' option for this id only; encoding writes "
            "this id instead of registering",
        ),
        *(Option(f"{KEY_AVRO}.{o.key}", o.parse, o.default, o.description) for o in CONNECTION_OPTIONS),
    ],
)


@dataclass(frozen=True)
class UpsertKafkaConfig:
    schema: Schema
    key_fields: tuple[str, ...]
    key_prefix: str = ""
    fields_include: FieldsInclude = FieldsInclude.ALL
    ignore_parse_errors: bool = False
    timestamp_standard: TimestampStandard = TimestampStandard.SQL
    key_format: KeyFormat = KeyFormat.JSON
    #: An Avro key: the registry's client settings, the subject, the writer schema and its id.
    key_registry: RegistryConfig = ()
    key_subject: str | None = None
    key_writer_schema: str | None = None
    key_schema_id: int | None = None

    def __repr__(self) -> str:
        return redacted_repr(self)

    @classmethod
    def from_options(
        cls, options: Mapping[str, str], schema: Schema, key_columns: Sequence[str] = ()
    ) -> UpsertKafkaConfig:
        values = OPTIONS.parse(options)
        key_fields: tuple[str, ...] = values["key.fields"]
        if key_columns and key_fields and tuple(key_columns) != key_fields:
            raise FormatOptionError(
                f"the key columns {list(key_columns)} differ from '{NAME}.key.fields' {list(key_fields)}: "
                "give the primary key once"
            )
        key_fields = key_fields or tuple(key_columns)
        prefix: str = values["key.fields-prefix"]
        include: FieldsInclude = values["value.fields-include"]
        if not key_fields:
            raise FormatOptionError(
                f"format '{NAME}' needs the primary key, which makes the Kafka key: set "
                f"'{NAME}.key.fields', e.g. '{NAME}.key.fields'='id'"
            )
        if len(set(key_fields)) != len(key_fields):
            raise FormatOptionError(f"option '{NAME}.key.fields' lists a column twice: {list(key_fields)}")
        for column in key_fields:
            if column not in schema:
                raise FormatOptionError(
                    f"option '{NAME}.key.fields': '{column}' is not a column of the schema ({schema.names})"
                )
            if not column.startswith(prefix) or column == prefix:
                raise FormatOptionError(
                    f"option '{NAME}.key.fields': '{column}' does not start with the key prefix '{prefix}'; "
                    "with 'key.fields-prefix' set, name the key columns with the prefix"
                )
        if prefix and include is FieldsInclude.ALL:
            raise FormatOptionError(
                f"option '{NAME}.key.fields-prefix' needs '{NAME}.value.fields-include'='EXCEPT_KEY': with "
                "ALL the value holds the key columns under their prefixed names"
            )
        key_format: KeyFormat = values["key.format"]
        avro = {k[len(KEY_AVRO) + 1 :]: v for k, v in values.items() if k.startswith(KEY_AVRO + ".")}
        given = sorted(f"{KEY_AVRO}.{k}" for k, v in avro.items() if v is not None)
        if given and key_format is not KeyFormat.AVRO_CONFLUENT:
            raise FormatOptionError(
                f"the options {', '.join(given)} are for an Avro key: set "
                f"'{NAME}.key.format'='avro-confluent'"
            )
        config = cls(
            schema=schema,
            key_fields=key_fields,
            key_prefix=prefix,
            fields_include=include,
            ignore_parse_errors=values["ignore-parse-errors"],
            timestamp_standard=values["timestamp-format.standard"],
            key_format=key_format,
            key_registry=registry_config(avro, f"{NAME}.{KEY_AVRO}"),
            key_subject=avro["subject"],
            key_writer_schema=avro["schema"],
            key_schema_id=avro["schema-id"],
        )
        if config.key_writer_schema is not None:
            try:
                declared_rows(
                    config.key_writer_schema, config.key_schema, f"option '{NAME}.{KEY_AVRO}.schema'"
                )
            except (FieldError, SchemaError) as error:
                raise FormatOptionError(
                    error.reason if isinstance(error, FieldError) else str(error)
                ) from None
        return config

    @property
    def key_schema(self) -> Schema:
        """The Kafka key's fields: the key columns without the prefix."""
        cut = len(self.key_prefix)
        return Schema(
            tuple(Field(f.name[cut:], f.type, f.nullable) for f in self.schema.select(self.key_fields))
        )

    @property
    def value_schema(self) -> Schema:
        if self.fields_include is FieldsInclude.ALL:
            return self.schema
        return Schema(tuple(f for f in self.schema if f.name not in self.key_fields))


class UpsertKafkaDecoder(Decoder):
    format_name = NAME
    reads_tombstones = True

    def __init__(self, config: UpsertKafkaConfig) -> None:
        super().__init__(ignore_parse_errors=config.ignore_parse_errors)
        self.config = config
        self.schema = config.schema
        key_schema = config.key_schema
        self._key_names = list(zip(key_schema.names, config.key_fields, strict=True))
        self._keys = RowConverter(key_schema)
        # A NULL in a NOT NULL column fails its record here, not the query at the sink; a key column
        # may be missing from the value: the key has it (checked by _check_key).
        keys = set(config.key_fields)
        value_schema = Schema(
            tuple(Field(f.name, f.type) if f.name in keys else f for f in config.value_schema)
        )
        self._values = RowConverter(value_schema, enforce_not_null=True)
        self._columns = config.schema.names
        self._except_key = config.fields_include is FieldsInclude.EXCEPT_KEY
        self._avro_keys: AvroReader[RowConverter] | None = None  # built on first use in each process

    def __reduce__(self) -> tuple[Callable[..., UpsertKafkaDecoder], tuple[UpsertKafkaConfig]]:
        return type(self), (self.config,)

    def decode_message(self, message: Message, metrics: FormatMetrics) -> Decoded:
        key = self._key(message.key)
        value = message.value
        if value is None or not value.strip():
            if key is None:
                raise FieldError(
                    "key",
                    "a tombstone (null value) deletes its key, but the message has no key; the producer "
                    "must key every record of an upsert topic",
                )
            return [Change(DEL, {name: key.get(name) for name in self._columns})]
        obj = parse_json_object(value, "the value")
        try:
            value_row = self._values.convert(obj)
        except FieldError as error:
            raise FieldError(f"value.{error.field}", error.reason) from None
        if key is None:
            if self._except_key:
                raise FieldError(
                    "key",
                    f"the message has no key, and with 'value.fields-include'='EXCEPT_KEY' the key columns "
                    f"{list(self.config.key_fields)} are only there; key every record of an upsert topic",
                )
            self._check_key(value_row, "value")
            key = {}
        row = {
            name: key.get(name) if value_row.get(name) is None else value_row[name] for name in self._columns
        }
        return [Change(UA, row)]

    def _key(self, data: bytes | None) -> dict[str, Any] | None:
        if data is None or not data.strip():
            return None
        try:
            if self.config.key_format is KeyFormat.AVRO_CONFLUENT:
                rows, record = self._avro_reader().read(data)
                if not isinstance(record, dict):
                    raise FieldError("", "the key's writer schema is not a record")
                converted = rows.convert(record)
            else:
                converted = self._keys.convert(parse_json_object(data, "the key"))
        except orjson.JSONDecodeError as error:
            raise FieldError("key", f"not valid JSON ({error.msg} at character {error.pos})") from None
        except FieldError as error:
            raise FieldError(f"key.{error.field}" if error.field else "key", error.reason) from None
        key = {column: converted[name] for name, column in self._key_names}
        self._check_key(key, "key")
        return key

    def _avro_reader(self) -> AvroReader[RowConverter]:
        reader = self._avro_keys
        if reader is None:
            config = self.config
            key_schema = config.key_schema

            def load(text: str, where: str) -> RowConverter:
                try:
                    return declared_rows(text, key_schema, where)
                except SchemaError as error:
                    raise FieldError("", str(error)) from None

            explicit = config.key_writer_schema
            schemas = WriterSchemas(
                config.key_registry,
                f"{NAME}.{KEY_AVRO}",
                load,
                (explicit, load(explicit, f"option '{KEY_AVRO}.schema'")) if explicit is not None else None,
                config.key_schema_id,
            )
            reader = self._avro_keys = AvroReader(schemas, f"JSON: '{NAME}.key.format'='json'")
        return reader

    def _check_key(self, row: Mapping[str, Any], where: str) -> None:
        cut = len(self.config.key_prefix) if where == "key" else 0
        for column in self.config.key_fields:
            if row.get(column) is None:
                raise FieldError(
                    f"{where}.{column[cut:]}",
                    "a key column is missing or null: an upsert needs its whole key",
                )


class UpsertKafkaEncoder(Encoder):
    """``+I``/``+U`` → key and value, ``-D`` → key and a tombstone; ``-U`` is counted and not written."""

    format_name = NAME

    def __init__(self, config: UpsertKafkaConfig, topic: str | None = None) -> None:
        self.config = config
        key_schema = config.key_schema
        self._key_names = list(zip(key_schema.names, config.key_fields, strict=True))
        self._keys = RowEncoder(key_schema, config.timestamp_standard)
        self._values = RowEncoder(config.value_schema, config.timestamp_standard)
        #: ``-U`` rows left out: an upsert topic keeps only each key's latest value.
        self.dropped_update_before = 0
        #: An Avro key: its writer schema (given, or generated from the key columns as Debezium's
        #: AvroConverter writes a key: record ``<topic>.Key``) and subject; the serializer is built on
        #: the first record.
        self.key_writer_schema: str | None = None
        self.key_subject = config.key_subject or f"{topic or 'cdcflow'}-key"
        self._avro_keys: AvroWriter | None = None
        if config.key_format is KeyFormat.AVRO_CONFLUENT:
            if config.key_schema_id is None and not config.key_registry:
                raise FormatOptionError(
                    f"an Avro key needs a schema id: set '{NAME}.{KEY_AVRO}.url' to register the key schema, "
                    f"or '{NAME}.{KEY_AVRO}.schema-id' to write a known id"
                )
            if config.key_schema_id is None and config.key_subject is None and topic is None:
                raise FormatOptionError(
                    f"set '{NAME}.{KEY_AVRO}.subject' to register the key schema under (the default is "
                    "'<topic>-key', and no topic was given)"
                )
            text = config.key_writer_schema
            if text is None:
                namespace = avro_types.avro_namespace(topic or "cdcflow")
                text = json.dumps(avro_types.SchemaWriter(namespace).record(key_schema, "Key"))
            self.key_writer_schema = text
            wire, _ = avro_types.record_columns(expanded_schema(text, f"the key schema of '{NAME}'"))
            self._avro_rows = avro_types.RecordEncoder(wire.select([n for n, _ in self._key_names]))

    def encode(self, change: Change) -> list[Encoded]:
        if change.kind is UB:
            self.dropped_update_before += 1
            return []
        row = change.row
        key_row = {}
        for name, column in self._key_names:
            value = row.get(column)
            if value is None:
                raise EncodeError(
                    f"{NAME}: the key column '{column}' is NULL in {change.kind.value}; an upsert topic "
                    "needs the whole key on every record"
                )
            key_row[name] = value
        key = self._avro_key(key_row) if self.key_writer_schema else orjson.dumps(self._keys.encode(key_row))
        if change.kind is DEL:
            return [Encoded(key, None)]
        return [Encoded(key, orjson.dumps(self._values.encode(row)))]

    def _avro_key(self, key_row: Mapping[str, Any]) -> bytes:
        writer = self._avro_keys
        if writer is None:
            config = self.config
            assert self.key_writer_schema is not None  # noqa: S101 - only for an Avro key
            writer = self._avro_keys = AvroWriter(
                config.key_registry,
                f"{NAME}.{KEY_AVRO}",
                self.key_writer_schema,
                self.key_subject,
                config.key_schema_id,
            )
        return writer.write(self._avro_rows.encode(key_row), "the key")


class UpsertKafkaFormat(FormatFactory):
    name = NAME
    spark_source = "cdc-upsert-kafka"
    encoder_takes_topic = True
    options = OPTIONS

    def create_decoder(
        self, options: Mapping[str, str], schema: Schema | None = None, metadata: Sequence[str] = ()
    ) -> UpsertKafkaDecoder:
        if metadata:
            raise FormatOptionError(f"format '{NAME}' has no metadata columns ({', '.join(metadata)})")
        config = UpsertKafkaConfig.from_options(options, self.require_schema(schema))
        avro_key = config.key_format is KeyFormat.AVRO_CONFLUENT
        if avro_key and not config.key_registry and config.key_writer_schema is None:
            raise FormatOptionError(
                f"an Avro key needs its writer schemas: set '{NAME}.{KEY_AVRO}.url' to the Schema "
                f"Registry, or '{NAME}.{KEY_AVRO}.schema' to the key's writer schema (Avro JSON)"
            )
        return UpsertKafkaDecoder(config)

    def create_encoder(
        self,
        options: Mapping[str, str],
        schema: Schema,
        key_columns: Sequence[str] = (),
        topic: str | None = None,
    ) -> UpsertKafkaEncoder:
        """``topic`` names an Avro key's subject (``<topic>-key``) and record namespace."""
        return UpsertKafkaEncoder(UpsertKafkaConfig.from_options(options, schema, key_columns), topic)
