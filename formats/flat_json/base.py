"""What ``canal-json``, ``maxwell-json`` and ``ogg-json`` share: options, configuration, metadata
columns, reading row images (including "old" images that hold only the changed columns) and writing them,
and the decoder / encoder skeletons.

A key present in an "old" image is a changed column, even when its value is null (a change from NULL);
a key absent from it is unchanged.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar

import orjson

from cdcflow.core.model import Change, Row
from cdcflow.formats.base import (
    Decoder,
    EnvelopeEncoder,
    MetadataColumn,
    check_key_columns,
    metadata_column_name,
    metadata_schema,
    output_schema,
    require_schema,
)
from cdcflow.formats.errors import FieldError, excerpt
from cdcflow.formats.json_decode import Converter, RowConverter, converter, join_path
from cdcflow.formats.json_encode import (
    IGNORE_NULL_FIELDS,
    IGNORE_PARSE_ERRORS,
    MAP_NULL_KEY_OPTIONS,
    TIMESTAMP_STANDARD,
    Encode,
    MapNullKeyMode,
    TimestampStandard,
    value_encoder,
)
from cdcflow.formats.options import Option, OptionSet, boolean, optional_string, regex
from cdcflow.formats.primary_keys import listed_columns
from cdcflow.formats.registry import FormatFactory
from cdcflow.formats.source_tables import SourceTable, envelope_table
from cdcflow.formats.temporal import EPOCH_UTC
from cdcflow.formats.types import DataType, Schema, TypeKind

#: Builds the converter of one column type; formats override a few kinds (Canal's binary text).
ConverterFactory = Callable[[DataType], Converter]


def json_options(prefix: str, extra: Sequence[Option[Any]] = ()) -> OptionSet:
    """Flink's JSON options that the three formats accept, plus the format's own."""
    return OptionSet(
        prefix,
        [
            IGNORE_PARSE_ERRORS,
            TIMESTAMP_STANDARD,
            *extra,
            *MAP_NULL_KEY_OPTIONS,
            Option(
                "encode.decimal-as-plain-number",
                boolean,
                False,
                "accepted for Flink compatibility: decimals are always written without an exponent",
            ),
            IGNORE_NULL_FIELDS,
        ],
    )


def include_options() -> list[Option[Any]]:
    return [
        Option(
            "database.include",
            regex,
            None,
            "only read messages whose database matches this regular expression (whole name)",
        ),
        Option(
            "table.include", regex, None, "only read messages whose table matches this regular expression"
        ),
    ]


def target_options(*names: str) -> list[Option[Any]]:
    """Options naming what the encoder writes in the envelope's ``database`` / ``table`` fields."""
    return [
        Option(f"encode.{name}", optional_string, None, f"the {name} name written in each message")
        for name in names
    ]


def included(config: FlatJsonConfig, envelope: Mapping[str, Any]) -> bool:
    """Whether the envelope's ``database`` and ``table`` match the ``*.include`` options (if given)."""
    for pattern, field in ((config.database_include, "database"), (config.table_include, "table")):
        if pattern is not None:
            name = envelope.get(field)
            if not isinstance(name, str) or pattern.fullmatch(name) is None:
                return False
    return True


@dataclass(frozen=True)
class FlatJsonConfig:
    """The parsed options of one of the three formats (parsed once, on the driver)."""

    format_name: str
    schema: Schema | None
    metadata: tuple[str, ...] = ()
    ignore_parse_errors: bool = False
    timestamp_standard: TimestampStandard = TimestampStandard.SQL
    map_null_key: MapNullKeyMode = MapNullKeyMode.FAIL
    map_null_key_literal: str = "null"
    ignore_null_fields: bool = False
    database_include: re.Pattern[str] | None = None
    table_include: re.Pattern[str] | None = None
    encode_database: str | None = None
    encode_table: str | None = None
    fail_on_new_columns: bool = False
    """The schema was inferred (Canal): a message whose ``mysqlType`` has more columns raises
    NewColumnsError."""

    @classmethod
    def from_options(
        cls,
        options: OptionSet,
        available: Sequence[MetadataColumn],
        raw: Mapping[str, str],
        schema: Schema | None,
        metadata: Sequence[str] = (),
    ) -> FlatJsonConfig:
        values = options.parse(raw)
        chosen = metadata_schema(available, metadata, options.prefix)
        config = cls(
            format_name=options.prefix,
            schema=schema,
            metadata=chosen,
            ignore_parse_errors=values["ignore-parse-errors"],
            timestamp_standard=values["timestamp-format.standard"],
            map_null_key=values["map-null-key.mode"],
            map_null_key_literal=values["map-null-key.literal"],
            ignore_null_fields=values["encode.ignore-null-fields"],
            database_include=values.get("database.include"),
            table_include=values.get("table.include"),
            encode_database=values.get("encode.database"),
            encode_table=values.get("encode.table"),
        )
        if schema is not None:
            output_schema(schema, available, config.metadata)
        return config


@dataclass(frozen=True)
class MetadataSource:
    """Where a metadata column comes from in the envelope, and how its JSON value is read."""

    field: str
    read: Converter


def read_metadata(
    keys: Sequence[str], sources: Mapping[str, MetadataSource], envelope: Mapping[str, Any]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in keys:
        source = sources[key]
        value = envelope.get(source.field)
        try:
            out[metadata_column_name(key)] = None if value is None else source.read(value)
        except FieldError as error:
            raise FieldError(join_path(source.field, error.field), error.reason) from None
    return out


def add_metadata(
    changes: list[Change],
    keys: Sequence[str],
    sources: Mapping[str, MetadataSource],
    envelope: Mapping[str, Any],
) -> list[Change]:
    """``changes`` with the requested metadata columns (read once from the envelope) added to each row."""
    if keys:
        extra = read_metadata(keys, sources, envelope)
        for change in changes:
            change.row.update(extra)
    return changes


def epoch_millis(value: Any) -> dt.datetime:
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return EPOCH_UTC + dt.timedelta(milliseconds=value)
        except OverflowError:
            reason = f"{excerpt(value)} ms since the epoch is out of the TIMESTAMP range"
            raise FieldError("", reason) from None
    raise FieldError("", f"expected epoch milliseconds (an integer), got {excerpt(value)}")


def lenient_boolean(value: Any) -> bool:
    """MySQL has no boolean: BOOLEAN is TINYINT(1), sent as 1/0 (Maxwell) or "1"/"0" (Canal)."""
    if value is True or value is False:
        return value
    if isinstance(value, int) and value in (0, 1):
        return value == 1
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "1"):
            return True
        if lowered in ("false", "0"):
            return False
    raise FieldError("", f"expected a boolean (true/false or 1/0), got {excerpt(value)}")


def _boolean(_: DataType) -> Converter:
    return lenient_boolean


DEFAULT_OVERRIDES: Mapping[TypeKind, ConverterFactory] = {TypeKind.BOOLEAN: _boolean}


class ImageReader:
    """Reads row images (JSON objects) into typed rows, naming the failing field by its envelope path."""

    def __init__(self, schema: Schema, overrides: Mapping[TypeKind, ConverterFactory] = DEFAULT_OVERRIDES):
        self.converters = {
            f.name: overrides[f.type.kind](f.type) if f.type.kind in overrides else converter(f.type)
            for f in schema
        }
        self._rows = RowConverter(schema, converters=self.converters, enforce_not_null=True)

    def row(self, image: Any, path: str) -> Row:
        if not isinstance(image, dict):
            raise FieldError(path, f"a row image must be a JSON object, got {_json_type(image)}")
        try:
            return self._rows.convert(image)
        except FieldError as error:
            raise FieldError(join_path(path, error.field), error.reason) from None

    def overlay(self, after: Row, old: Any, path: str) -> Row:
        """The row before an update: ``after`` with the columns ``old`` names set to their old values."""
        if not isinstance(old, dict):
            raise FieldError(path, f"the old image must be a JSON object, got {_json_type(old)}")
        before = dict(after)
        for name, value in old.items():
            convert = self.converters.get(name)
            if convert is None:
                continue
            try:
                before[name] = None if value is None else convert(value)
            except FieldError as error:
                raise FieldError(join_path(join_path(path, name), error.field), error.reason) from None
        return before


def _json_type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def plain_decimal(value: Decimal) -> str:
    """A decimal without an exponent (``0.0000001``, not ``1E-7``), as Flink's plain-number option."""
    return format(value, "f")


#: How a value of a column type is written in a row image (built once per column).
ValueWriter = Callable[[DataType, "FlatJsonConfig"], Encode]


def json_value(data_type: DataType, config: FlatJsonConfig) -> Encode:
    """A typed JSON value (Maxwell, OGG), decimals written plain."""
    if data_type.kind is TypeKind.DECIMAL:
        return lambda v: orjson.Fragment(plain_decimal(v))
    return value_encoder(
        data_type,
        config.timestamp_standard,
        map_null_key=config.map_null_key,
        map_null_key_literal=config.map_null_key_literal,
    )


class JsonImageWriter:
    """Rows → JSON-ready dicts, each value written by the format's :data:`ValueWriter`."""

    def __init__(self, schema: Schema, config: FlatJsonConfig, value_writer: ValueWriter) -> None:
        self._columns: list[tuple[str, Encode]] = [(f.name, value_writer(f.type, config)) for f in schema]
        self._ignore_nulls = config.ignore_null_fields

    def write(self, row: Mapping[str, Any], *, keep_nulls: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, encode in self._columns:
            value = row.get(name)
            if value is None:
                if keep_nulls or not self._ignore_nulls:
                    out[name] = None
            else:
                out[name] = encode(value)
        return out

    def changed(self, before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
        """The columns of ``before`` whose written value differs from ``after``'s (an "old" image).

        NULLs are kept here even with ``encode.ignore-null-fields``: an absent key means "unchanged".
        """
        old_image = self.write(before, keep_nulls=True)
        new_image = self.write(after, keep_nulls=True)
        return {
            name: value
            for name, value in old_image.items()
            if orjson.dumps(value) != orjson.dumps(new_image[name])
        }


def key_bytes(
    row: Mapping[str, Any] | None, key_columns: Sequence[str], writer: JsonImageWriter
) -> bytes | None:
    """The Kafka key: the key columns as a JSON object (None without key columns)."""
    if row is None or not key_columns:
        return None
    image = writer.write(row, keep_nulls=True)
    return orjson.dumps({name: image.get(name) for name in key_columns})


class FlatJsonDecoder(Decoder):
    """A decoder that needs the declared schema (Maxwell, OGG): it reads images with :class:`ImageReader`."""

    metadata_columns: ClassVar[Sequence[MetadataColumn]]

    def __init__(self, config: FlatJsonConfig) -> None:
        super().__init__(ignore_parse_errors=config.ignore_parse_errors)
        self.config = config
        schema = require_schema(config.schema, config.format_name)
        self._reader = ImageReader(schema)
        self.schema = output_schema(schema, self.metadata_columns, config.metadata)

    def __reduce__(self) -> tuple[Callable[..., FlatJsonDecoder], tuple[FlatJsonConfig]]:
        return type(self), (self.config,)


class FlatJsonEncoder(EnvelopeEncoder):
    """Writes each envelope as the format's message in :meth:`_serialise`, rows through a
    :class:`JsonImageWriter`. The Kafka key is the key columns as a JSON object, or None without them.
    """

    #: The envelope field naming the operation, and the format's names for insert, update and delete.
    op_field: ClassVar[str]
    op_names: ClassVar[tuple[str, str, str]]
    #: How the format writes a column value: typed JSON (Maxwell, OGG) or text (Canal).
    value_writer: ClassVar[ValueWriter] = json_value

    def __init__(self, config: FlatJsonConfig, key_columns: Sequence[str]) -> None:
        self.schema = require_schema(config.schema, config.format_name)
        self.config = config
        insert, update, delete = self.op_names
        super().__init__(
            self.op_field,
            {"INSERT": insert, "UPDATE_BEFORE, UPDATE_AFTER": update, "DELETE": delete},
            check_key_columns(self.schema, key_columns),
        )
        self._writer = JsonImageWriter(self.schema, config, type(self).value_writer)


class FlatJsonFormat(FormatFactory):
    """The factory of a flat JSON format whose decoder and encoder take a :class:`FlatJsonConfig`."""

    #: Canal's decoder is no FlatJsonDecoder: it can read the columns from the messages instead.
    decoder_class: Callable[[FlatJsonConfig], Decoder]
    encoder_class: ClassVar[type[FlatJsonEncoder]]
    key_list: ClassVar[str]
    """The envelope field that lists the primary-key columns (a metadata column's source)."""
    table_fields: ClassVar[tuple[str | None, str]]
    """The envelope fields naming the database (None: none) and the table of the change."""

    def primary_key(
        self, key: bytes | None, value: bytes | None, options: Mapping[str, str] | None = None
    ) -> tuple[str, ...] | None:
        return listed_columns(value, self.key_list)

    def source_table(self, value: bytes | None) -> SourceTable | None:
        return envelope_table(value, *self.table_fields)

    def table_filter(self, table: SourceTable) -> dict[str, str] | None:
        if not self.options.owns(f"{self.name}.table.include"):
            return None
        only = {f"{self.name}.table.include": re.escape(table.table)}
        if table.db is not None:
            only[f"{self.name}.database.include"] = re.escape(table.db)
        return only

    def create_decoder(
        self, options: Mapping[str, str], schema: Schema | None = None, metadata: Sequence[str] = ()
    ) -> Decoder:
        config = FlatJsonConfig.from_options(self.options, self.metadata_columns, options, schema, metadata)
        return type(self).decoder_class(config)

    def create_encoder(
        self, options: Mapping[str, str], schema: Schema, key_columns: Sequence[str] = ()
    ) -> FlatJsonEncoder:
        config = FlatJsonConfig.from_options(self.options, self.metadata_columns, options, schema)
        return type(self).encoder_class(config, key_columns)
