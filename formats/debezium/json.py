"""``debezium-json``: Debezium change events as JSON, with or without Kafka Connect's schema block.

Unlike Flink, the schema block is read: Debezium's logical types come out as decimals, dates, times
and instants. Without it, values are read against the declared schema (see :mod:`values`). An update
is written back as ONE ``u`` event with ``before`` and ``after`` (Flink writes a delete and an insert).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from cdcflow.formats import connect
from cdcflow.formats.base import (
    SCHEMA_INCLUDE,
    ControlEvent,
    Decoded,
    Decoder,
    Encoded,
    EnvelopeEncoder,
    FormatMetrics,
    Message,
    check_key_columns,
    check_new_columns,
    connect_payload,
    parse_json,
)
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
from cdcflow.formats.errors import FieldError, FormatOptionError, NewColumnsError, SchemaError, excerpt
from cdcflow.formats.json_decode import RowConverter, converter, json_text
from cdcflow.formats.json_encode import (
    IGNORE_NULL_FIELDS,
    IGNORE_PARSE_ERRORS,
    MAP_NULL_KEY_OPTIONS,
    TIMESTAMP_STANDARD,
    MapNullKeyMode,
    RowEncoder,
    TimestampStandard,
)
from cdcflow.formats.lru import SCHEMA_CACHE_SIZE, LruCache
from cdcflow.formats.options import OptionSet
from cdcflow.formats.primary_keys import json_key_fields
from cdcflow.formats.registry import FormatFactory
from cdcflow.formats.source_tables import SourceTable, debezium_table
from cdcflow.formats.types import INTEGER_KINDS, Schema, TypeKind

NAME = "debezium-json"

OPTIONS = OptionSet(
    NAME,
    [
        SCHEMA_INCLUDE,
        IGNORE_PARSE_ERRORS,
        TIMESTAMP_STANDARD,
        *DEBEZIUM_OPTIONS,
        *MAP_NULL_KEY_OPTIONS,
        IGNORE_NULL_FIELDS,
    ],
)


@dataclass(frozen=True)
class DebeziumJsonConfig:
    schema: Schema | None
    schema_include: bool = False
    ignore_parse_errors: bool = False
    timestamp_standard: TimestampStandard = TimestampStandard.SQL
    mode: DebeziumMode = DebeziumMode.RETRACT
    unavailable: UnavailableHandling = UnavailableHandling.FILL
    key_columns: tuple[str, ...] = ()
    metadata: tuple[str, ...] = ()
    map_null_key: MapNullKeyMode = MapNullKeyMode.FAIL
    map_null_key_literal: str = "null"
    ignore_null_fields: bool = False
    fail_on_new_columns: bool = False
    """The schema was inferred: a schema block with more columns raises NewColumnsError."""

    @classmethod
    def from_options(
        cls, options: Mapping[str, str], schema: Schema | None, metadata: Sequence[str] = ()
    ) -> DebeziumJsonConfig:
        values = OPTIONS.parse(options)
        config = cls(
            schema=schema,
            schema_include=values["schema-include"],
            ignore_parse_errors=values["ignore-parse-errors"],
            timestamp_standard=values["timestamp-format.standard"],
            mode=values["changelog-mode"],
            unavailable=values["unavailable-values"],
            key_columns=values["key-columns"],
            metadata=check_metadata(metadata, NAME),
            map_null_key=values["map-null-key.mode"],
            map_null_key_literal=values["map-null-key.literal"],
            ignore_null_fields=values["encode.ignore-null-fields"],
        )
        if schema is None and not config.schema_include:
            raise FormatOptionError(
                f"format '{NAME}' needs the table schema when the messages carry none: pass it as a Spark "
                f"DDL string (schema='id INT NOT NULL, name STRING'), or set '{NAME}.schema-include'='true' "
                "if the messages have Kafka Connect's {schema, payload} form"
            )
        if schema is not None:
            check_key_columns(schema, config.key_columns)
            output_schema(
                schema, config.metadata, unavailable=config.unavailable, key_columns=config.key_columns
            )
        if "schema" in config.metadata and not config.schema_include:
            raise FormatOptionError("metadata 'schema' needs 'debezium-json.schema-include'='true'")
        return config


class DebeziumJsonDecoder(Decoder):
    format_name = NAME

    def __init__(self, config: DebeziumJsonConfig) -> None:
        super().__init__(ignore_parse_errors=config.ignore_parse_errors)
        self.config = config
        self._declared = (
            RowConverter(config.schema, unavailable=is_unavailable, enforce_not_null=True)
            if config.schema is not None
            else None
        )
        if config.schema is not None:
            self.schema = output_schema(
                config.schema, config.metadata, unavailable=config.unavailable, key_columns=config.key_columns
            )
        #: Per value schema: its row converter and the output columns (which ``schema`` then is).
        self._by_connect_schema: LruCache[bytes, tuple[RowConverter, Schema]] = LruCache(SCHEMA_CACHE_SIZE)
        #: Schema blocks seen, as the bytes they open their messages with (most recent first).
        self._blocks: list[_Block] = []
        #: The last schema block converted, its converter and columns; then its JSON text: the messages
        #: of a block share its one parsed object.
        self._converted: tuple[Any, RowConverter, Schema] | None = None
        self._schema_text: tuple[Any, str] | None = None
        self._builder = ChangeBuilder(
            config.mode, config.unavailable, config.key_columns, NAME, config.metadata
        )

    def __reduce__(self) -> tuple[Callable[..., DebeziumJsonDecoder], tuple[DebeziumJsonConfig]]:
        return type(self), (self.config,)

    @property
    def fill_state(self) -> LruCache[Hashable, dict[str, Any]] | None:
        """Each Kafka key's last after image (``unavailable-values=fill``), which the columnar path shares."""
        return self._builder.images

    def failing_on_new_columns(self) -> DebeziumJsonDecoder:
        return type(self)(replace(self.config, fail_on_new_columns=True))

    def decode_message(self, message: Message, metrics: FormatMetrics) -> Decoded:
        value = message.value
        assert value is not None  # noqa: S101 - the base class skips tombstones
        if not self.config.schema_include:
            return self._decode(parse_json(value), message, metrics)
        for block in self._blocks:
            if value.startswith(block.head) and value.endswith(b"}"):
                try:  # the payload alone: the schema block is the one this head was read from
                    payload = parse_json(value[len(block.head) : -1])
                except ValueError:  # not JSON: the whole message is parsed for the error
                    break
                if not isinstance(payload, dict):
                    break
                return self._decode_payload(payload, block.schema, message, metrics)
        envelope = parse_json(value)
        decoded = self._decode(envelope, message, metrics)
        self._remember(value, envelope)
        return decoded

    def _remember(self, value: bytes, envelope: Any) -> None:
        """Keep the bytes ``value``'s schema block opens it with (:func:`schema_head`): messages opening
        with them have that block."""
        head = schema_head(value, envelope)
        if head is not None and all(block.head != head for block in self._blocks):
            self._blocks.insert(0, _Block(head, envelope["schema"]))
            del self._blocks[SCHEMA_BLOCKS:]

    def decode_envelope(self, envelope: Any, message: Message, metrics: FormatMetrics) -> Decoded:
        """An envelope another format has parsed (``{schema, payload}`` under ``schema-include``):
        the shared path of the Debezium JSON formats (``debezium-json-registry``)."""
        return self._decode(envelope, message, metrics)

    def _decode(self, envelope: Any, message: Message, metrics: FormatMetrics) -> Decoded:
        if not isinstance(envelope, dict):
            raise FieldError("", f"a Debezium event is a JSON object, got {type(envelope).__name__}")
        payload, schema_block = connect_payload(
            envelope, schema_include=self.config.schema_include, format_name=NAME, marker="op"
        )
        return self._decode_payload(payload, schema_block, message, metrics)

    def _decode_payload(
        self, payload: dict[str, Any], schema_block: Any, message: Message, metrics: FormatMetrics
    ) -> Decoded:
        op = payload.get("op")
        if isinstance(op, str) and op in CONTROL_OPS:  # op may be any JSON value
            return ControlEvent(
                CONTROL_OPS[op], message, payload, self._metadata(payload, [], schema_block, message)
            )
        if not isinstance(op, str):
            raise FieldError(
                "op",
                f"the operation code is missing or not a string (got {excerpt(op)}); is this a Debezium "
                "event?",
            )
        rows = self._row_converter(schema_block)
        raw_before = payload.get("before")
        if raw_before is None and op == "d" and self.config.mode is DebeziumMode.UPSERT:
            raw_before = _key_payload(message.key)
        before = image(rows, raw_before, "before")
        after = image(rows, payload.get("after"), "after")
        key = self._builder.state_key(after if after is not None else before, message, _state_key_fields)
        changes, missing = self._builder.changes(op, before, after, key, metrics, rows.schema)
        if self.config.metadata:
            extra = self._metadata(payload, missing, schema_block, message)
            for change in changes:
                change.row.update(extra)
        return changes

    def _metadata(
        self, payload: Mapping[str, Any], missing: list[str], schema_block: Any, message: Message
    ) -> dict[str, Any]:
        if not self.config.metadata:
            return {}
        schema_text = None
        if schema_block is not None and "schema" in self.config.metadata:
            if self._schema_text is None or self._schema_text[0] is not schema_block:
                self._schema_text = (schema_block, _schema_json(schema_block))
            schema_text = self._schema_text[1]
        return metadata_values(self.config.metadata, payload, missing, schema_text, message.headers)

    def _row_converter(self, schema_block: Any) -> RowConverter:
        if schema_block is None:
            if self._declared is None:
                raise FieldError("schema", "the message has no schema block and no schema was declared")
            return self._declared
        if self._converted is not None and self._converted[0] is schema_block:
            rows, self.schema = self._converted[1], self._converted[2]
            return rows
        value_schema = _value_struct(schema_block)
        try:
            fingerprint = orjson.dumps(value_schema)
        except orjson.JSONEncodeError:  # nested too deep, an integer beyond 64 bits: say which
            fingerprint = _schema_json(value_schema).encode()
        cached = self._by_connect_schema.get(fingerprint)
        if cached is None:
            cached = self._connect_rows(value_schema)
            self._by_connect_schema.put(fingerprint, cached)
        rows, self.schema = cached  # a schema seen before may come back: its columns again
        self._converted = (schema_block, rows, self.schema)
        return rows

    def _connect_rows(self, value_schema: Mapping[str, Any]) -> tuple[RowConverter, Schema]:
        try:
            physical, converters = connect.struct_columns(value_schema)
        except SchemaError as error:
            raise FieldError("schema", str(error)) from None
        declared = self.config.schema
        if declared is None:
            columns = output_schema(
                physical,
                self.config.metadata,
                unavailable=self.config.unavailable,
                key_columns=self.config.key_columns,
            )
            # Debezium fills key-only delete images with NULLs whatever the column's nullability.
            rows = RowConverter(
                physical, converters=converters, unavailable=is_unavailable, enforce_not_null=False
            )
            return rows, columns
        if self.config.fail_on_new_columns:
            check_new_columns(declared, physical)
        raw_types = {f.get("field"): f.get("type") for f in value_schema.get("fields") or []}
        chosen = {}
        for column in declared:
            if column.name not in physical:
                continue
            if column.type.kind in INTEGER_KINDS and raw_types.get(column.name) in ("int32", "int64"):
                # Declared as an integer: the physical value (days, epoch units), as Flink reads it.
                chosen[column.name] = converter(column.type)
                continue
            source = physical.field(column.name).type
            convert = converters[column.name]
            chosen[column.name] = coerce_converter(convert, source, column.type, column.name)
        rows = RowConverter(declared, converters=chosen, unavailable=is_unavailable, enforce_not_null=True)
        return rows, self.schema


def schema_head(value: bytes, envelope: Any) -> bytes | None:
    """``{"schema":<block>,"payload":`` as ``value`` opens with it, when Kafka Connect's JsonConverter
    wrote ``value`` (compact, ``schema`` first; ``envelope`` is ``value`` parsed); None otherwise."""
    schema = envelope.get("schema") if isinstance(envelope, dict) else None
    if not isinstance(schema, dict):
        return None
    try:
        head = b'{"schema":' + orjson.dumps(schema) + b',"payload":'
    except orjson.JSONEncodeError:
        return None
    return head if value.startswith(head) else None


def converts_as_declared(declared: Schema, schema_block: Any, *, fail_on_new_columns: bool) -> bool:
    """Whether messages with ``schema_block`` decode as their payloads alone do against ``declared``:
    every declared column the block has is of its declared type there (the same converter), or an integer
    the block writes as int32/int64 (read as the number either way), and the block is one
    :meth:`DebeziumJsonDecoder._row_converter` accepts."""
    try:
        value_schema = _value_struct(schema_block)
        physical, _ = connect.struct_columns(value_schema)
        if fail_on_new_columns:
            check_new_columns(declared, physical)
    except (FieldError, SchemaError, NewColumnsError):
        return False
    raw_types = {f.get("field"): f.get("type") for f in value_schema.get("fields") or []}
    for column in declared:
        if column.name not in physical:
            continue
        if column.type.kind in INTEGER_KINDS and raw_types.get(column.name) in ("int32", "int64"):
            continue
        if physical.field(column.name).type != column.type or column.type.kind is TypeKind.DECIMAL:
            return False
    return True


def _key_payload(key: bytes | None) -> dict[str, Any] | None:
    """The Kafka key's fields: the partial image of an upsert delete that has no before image."""
    if not key:
        return None
    try:
        parsed = orjson.loads(key)
    except orjson.JSONDecodeError:
        raise FieldError("key", "the message key is not JSON") from None
    if isinstance(parsed, dict) and "payload" in parsed and "schema" in parsed:
        parsed = parsed["payload"]
    return parsed if isinstance(parsed, dict) else None


def _state_key_fields(message: Message) -> dict[str, Any] | None:
    return state_key_fields(message.key)


def state_key_fields(key: bytes | None) -> dict[str, Any] | None:
    """The Kafka key's fields, which index the filling state (None: no key, or not a JSON object)."""
    try:
        return _key_payload(key)
    except FieldError:
        return None  # a key that is not JSON cannot index the filling state


def _value_struct(schema_block: Any) -> Mapping[str, Any]:
    if not isinstance(schema_block, Mapping):
        raise FieldError("schema", "the schema block must be a JSON object")
    for name in ("after", "before"):
        field_schema = connect.envelope_field(schema_block, name)
        if field_schema is not None:
            return field_schema
    raise FieldError("schema", "the Connect schema has neither an 'after' nor a 'before' field")


RowWriter = Callable[[Mapping[str, Any]], dict[str, Any]]


def _connect_row(schema: Schema) -> RowWriter:
    """A row as Kafka Connect's JSON converter writes it under :func:`connect.struct_schema_fields`."""
    return lambda row: {f.name: connect.connect_value(row.get(f.name), f.type) for f in schema}


def _dumps(payload: dict[str, Any], schema: dict[str, Any] | None) -> bytes:
    """The payload, inside ``{schema, payload}`` when there is a schema block."""
    return orjson.dumps(payload if schema is None else {"schema": schema, "payload": payload})


SCHEMA_BLOCKS = 8
"""Schema blocks whose opening bytes a decoder compares each message with (a topic has one per schema
version; a table's history a few)."""


@dataclass(frozen=True)
class _Block:
    head: bytes
    """``{"schema":<the block>,"payload":``, as the messages start."""
    schema: dict[str, Any]


class DebeziumJsonEncoder(EnvelopeEncoder):
    """Writes ``{"before", "after", "op"}`` events (optionally inside ``{schema, payload}``).

    Updates are combined: a ``-U`` waits for its key's ``+U`` and both go out as one ``u`` event.
    The Kafka key is the key columns as a JSON object, or None without key columns.
    """

    format_name = NAME

    def __init__(
        self, config: DebeziumJsonConfig, key_columns: Sequence[str], topic_name: str = "cdcflow"
    ) -> None:
        assert config.schema is not None  # noqa: S101 - encoders need the row schema
        super().__init__("op", ENCODE_OP_MAPPINGS[config.mode], key_columns)
        self.config = config
        schema = config.schema
        key_schema = schema.select(self.key_columns) if self.key_columns else None
        self._keys: RowWriter | None = None
        # The schema blocks of the {schema, payload} form (schema-include), the same for every record.
        self._envelope_schema: dict[str, Any] | None = None
        self._key_schema: dict[str, Any] | None = None
        if config.schema_include:
            self._rows: RowWriter = _connect_row(schema)
            value_schema = {
                "type": "struct",
                "fields": connect.struct_schema_fields(schema),
                "optional": True,
                "name": f"{topic_name}.Value",
            }
            self._envelope_schema = {
                "type": "struct",
                "fields": [
                    {**value_schema, "field": "before"},
                    {**value_schema, "field": "after"},
                    {"type": "string", "optional": False, "field": "op"},
                ],
                "optional": False,
                "name": f"{topic_name}.Envelope",
            }
            if key_schema is not None:
                self._keys = _connect_row(key_schema)
                self._key_schema = {
                    "type": "struct",
                    "fields": connect.struct_schema_fields(key_schema),
                    "optional": False,
                    "name": f"{topic_name}.Key",
                }
        else:
            self._rows = RowEncoder(
                schema,
                config.timestamp_standard,
                ignore_nulls=config.ignore_null_fields,
                map_null_key=config.map_null_key,
                map_null_key_literal=config.map_null_key_literal,
            ).encode
            if key_schema is not None:
                self._keys = RowEncoder(key_schema, config.timestamp_standard).encode

    def _serialise(self, envelope: Mapping[str, Any]) -> Encoded:
        before, after = envelope.get("before"), envelope.get("after")
        payload = {
            "before": self._rows(before) if before is not None else None,
            "after": self._rows(after) if after is not None else None,
            "op": envelope["op"],
        }
        return Encoded(
            self._key(after if after is not None else before), _dumps(payload, self._envelope_schema)
        )

    def _key(self, row: Mapping[str, Any] | None) -> bytes | None:
        if self._keys is None or row is None:
            return None
        return _dumps(self._keys(row), self._key_schema)


class DebeziumJsonFormat(FormatFactory):
    name = NAME
    spark_source = "cdc-debezium"
    options = OPTIONS
    metadata_columns = METADATA
    columnar_decoder = "cdcflow.formats.debezium.arrow:ColumnarDecoder"

    def create_decoder(
        self, options: Mapping[str, str], schema: Schema | None = None, metadata: Sequence[str] = ()
    ) -> DebeziumJsonDecoder:
        return DebeziumJsonDecoder(DebeziumJsonConfig.from_options(options, schema, metadata))

    def primary_key(
        self, key: bytes | None, value: bytes | None, options: Mapping[str, str] | None = None
    ) -> tuple[str, ...] | None:
        return json_key_fields(key)

    def source_table(self, value: bytes | None) -> SourceTable | None:
        return debezium_table(value)

    def create_encoder(
        self, options: Mapping[str, str], schema: Schema, key_columns: Sequence[str] = ()
    ) -> DebeziumJsonEncoder:
        config = DebeziumJsonConfig.from_options(options, schema)
        return DebeziumJsonEncoder(config, key_columns or config.key_columns)


def _schema_json(schema_block: Any) -> str:
    """A schema block as JSON text (its cache key, the ``schema`` metadata column)."""
    try:
        return json_text(schema_block)
    except FieldError as error:  # nested too deep, an integer beyond 64 bits
        raise FieldError("schema", error.reason) from None
