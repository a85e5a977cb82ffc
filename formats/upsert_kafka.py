"""``upsert-kafka``: a compacted topic read as a table, as Flink's ``upsert-kafka`` connector does.

The Kafka key holds the primary-key columns (``key.fields``), the value the row. A value is an upsert
of its key: ``+U`` (Flink's upsert-kafka source declares the changelog mode {+U, -D}; the state that
tells an insert from an update lives downstream). A tombstone (null or empty value) is a ``-D`` of
its key: a partial delete, the key columns set and the other columns NULL.

``key.fields-prefix`` lets key columns be named apart from value columns: the table column ``k_id``
is the field ``id`` in the key. ``value.fields-include`` says whether the value repeats the key
columns (``ALL``, Flink's default) or not (``EXCEPT_KEY``, required with a prefix). With ALL, the
value's copy of a key column wins, as in Flink; without a Kafka key, the key columns come from the
value. Key and value are JSON.

Written back, ``+I`` and ``+U`` become key + value, ``-D`` key + tombstone; ``-U`` is not written
(an upsert topic has no use for it) and is counted in ``dropped_update_before``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

from cdcflow.core.model import Change
from cdcflow.core.rowkind import DEL, UA, UB
from cdcflow.formats.base import Decoded, Decoder, Encoded, Encoder, FormatMetrics, Message, parse_json_object
from cdcflow.formats.errors import EncodeError, FieldError, FormatOptionError
from cdcflow.formats.jsonenc import TIMESTAMP_STANDARD, RowEncoder, TimestampStandard
from cdcflow.formats.options import Option, OptionSet, boolean, choice, names
from cdcflow.formats.registry import FormatFactory
from cdcflow.formats.types import Field, Schema
from cdcflow.formats.values import RowConverter

NAME = "upsert-kafka"


class SerialFormat(Enum):
    JSON = "json"


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
        Option("key.format", choice(SerialFormat), SerialFormat.JSON, "the Kafka key's format: json"),
        Option("value.format", choice(SerialFormat), SerialFormat.JSON, "the Kafka value's format: json"),
        Option(
            "value.fields-include",
            choice(FieldsInclude),
            FieldsInclude.ALL,
            "ALL: the value holds every column; EXCEPT_KEY: the key columns are only in the key",
        ),
        Option("ignore-parse-errors", boolean, False, "dead-letter records whose key or value is unreadable"),
        TIMESTAMP_STANDARD,
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
        return cls(
            schema=schema,
            key_fields=key_fields,
            key_prefix=prefix,
            fields_include=include,
            ignore_parse_errors=values["ignore-parse-errors"],
            timestamp_standard=values["timestamp-format.standard"],
        )

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
        self._values = RowConverter(config.value_schema)
        self._columns = config.schema.names
        self._except_key = config.fields_include is FieldsInclude.EXCEPT_KEY

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
        row = {name: value_row[name] if name in value_row else key.get(name) for name in self._columns}
        return [Change(UA, row)]

    def _key(self, data: bytes | None) -> dict[str, Any] | None:
        if data is None or not data.strip():
            return None
        try:
            obj = parse_json_object(data, "the key")
            converted = self._keys.convert(obj)
        except orjson.JSONDecodeError as error:
            raise FieldError("key", f"not valid JSON ({error.msg} at character {error.pos})") from None
        except FieldError as error:
            raise FieldError(f"key.{error.field}" if error.field else "key", error.reason) from None
        key = {column: converted[name] for name, column in self._key_names}
        self._check_key(key, "key")
        return key

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

    def __init__(self, config: UpsertKafkaConfig) -> None:
        self.config = config
        key_schema = config.key_schema
        self._key_names = list(zip(key_schema.names, config.key_fields, strict=True))
        self._keys = RowEncoder(key_schema, config.timestamp_standard)
        self._values = RowEncoder(config.value_schema, config.timestamp_standard)
        #: ``-U`` rows left out: an upsert topic keeps only each key's latest value.
        self.dropped_update_before = 0

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
        key = orjson.dumps(self._keys.encode(key_row))
        if change.kind is DEL:
            return [Encoded(key, None)]
        return [Encoded(key, orjson.dumps(self._values.encode(row)))]


class UpsertKafkaFormat(FormatFactory):
    name = NAME
    options = OPTIONS

    def create_decoder(
        self, options: Mapping[str, str], schema: Schema | None = None, metadata: Sequence[str] = ()
    ) -> UpsertKafkaDecoder:
        if metadata:
            raise FormatOptionError(f"format '{NAME}' has no metadata columns ({', '.join(metadata)})")
        return UpsertKafkaDecoder(UpsertKafkaConfig.from_options(options, self.require_schema(schema)))

    def create_encoder(
        self, options: Mapping[str, str], schema: Schema, key_columns: Sequence[str] = ()
    ) -> UpsertKafkaEncoder:
        return UpsertKafkaEncoder(UpsertKafkaConfig.from_options(options, schema, key_columns))
