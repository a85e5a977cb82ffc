"""``canal-json``: Alibaba Canal's flat JSON messages (several rows per message, values as text).

Decoding, as Flink's, plus:

- the ``-U`` row of ``data[i]`` is ``data[i]`` overlaid by ``old[i]`` alone (a key in ``old[i]`` whose
  value is null is a change from NULL); Flink looks a column up in every image of ``old``, so a column
  another row of the message changed is NULL in this row's ``-U``;
- DDL (``isDdl: true``, or a DDL ``type``) and ``INIT`` messages go to the side output as ``schema-change``
  / ``init`` control events; messages outside ``database.include`` / ``table.include`` are counted as
  filtered;
- without a declared schema the columns and types come from each message's ``mysqlType``
  (see :func:`mysql_type`);
- BOOLEAN reads ``1``/``0`` too (MySQL's TINYINT(1); Flink reads "1" as false); BINARY is read as
  ISO-8859-1 text, as Canal writes it (Flink expects base64); ARRAY / MAP / STRUCT columns are read from
  JSON text (Canal's JSON columns).

Encoding writes one message per change, values as text like Canal; an update is ONE ``UPDATE`` message
with ``old`` holding exactly the columns that changed (Flink writes a DELETE and an INSERT). ``es``,
``ts``, ``id`` and ``sql`` are not written, so the output depends on the changes only.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import orjson

from cdcflow.core.model import Change, Row
from cdcflow.core.render import float32_repr
from cdcflow.core.rowkind import DEL, INS, UA, UB
from cdcflow.formats.base import (
    ControlEvent,
    Decoded,
    Decoder,
    Encoded,
    FormatMetrics,
    Message,
    MetadataColumn,
    check_new_columns,
    output_schema,
    parse_json_object,
)
from cdcflow.formats.errors import FieldError, excerpt
from cdcflow.formats.flat_json.base import (
    DEFAULT_OVERRIDES,
    ConverterFactory,
    FlatJsonConfig,
    FlatJsonEncoder,
    FlatJsonFormat,
    ImageReader,
    MetadataSource,
    add_metadata,
    epoch_millis,
    include_options,
    included,
    json_options,
    key_bytes,
    plain_decimal,
    read_metadata,
    target_options,
)
from cdcflow.formats.json_decode import Converter, converter
from cdcflow.formats.json_encode import (
    TimestampStandard,
    format_time,
    format_timestamp,
    value_encoder,
)
from cdcflow.formats.lru import SCHEMA_CACHE_SIZE, LruCache
from cdcflow.formats.types import (
    INT,
    INTEGER_KINDS,
    STRING,
    TIMESTAMP_LTZ_MILLIS,
    DataType,
    Field,
    Schema,
    TypeKind,
    atomic,
)

NAME = "canal-json"

OPTIONS = json_options(NAME, [*include_options(), *target_options("database", "table")])

ROW_TYPES = ("INSERT", "UPDATE", "DELETE")
DDL_TYPES = frozenset({"CREATE", "ALTER", "ERASE", "RENAME", "TRUNCATE", "CINDEX", "DINDEX", "QUERY"})


def _ddl_kind(kind: Any) -> str:
    """A DDL message's control event: ``truncate`` for TRUNCATE (the table's rows are gone), else
    ``schema-change``."""
    return "truncate" if kind == "TRUNCATE" else "schema-change"


METADATA = (
    MetadataColumn("database", STRING, "the database of the change"),
    MetadataColumn("table", STRING, "the table of the change"),
    MetadataColumn(
        "sql-type", DataType(TypeKind.MAP, key=STRING, value=INT), "JDBC type codes of the columns (sqlType)"
    ),
    MetadataColumn("pk-names", DataType(TypeKind.ARRAY, element=STRING), "primary-key columns (pkNames)"),
    MetadataColumn("ingestion-timestamp", TIMESTAMP_LTZ_MILLIS, "when Canal processed the change (ts)"),
    MetadataColumn("event-timestamp", TIMESTAMP_LTZ_MILLIS, "when the change was made in MySQL (es)"),
    MetadataColumn(
        "mysql-type",
        DataType(TypeKind.MAP, key=STRING, value=STRING),
        "MySQL types of the columns (mysqlType)",
    ),
)
SOURCES = {
    "database": MetadataSource("database", converter(STRING)),
    "table": MetadataSource("table", converter(STRING)),
    "sql-type": MetadataSource("sqlType", converter(METADATA[2].type)),
    "pk-names": MetadataSource("pkNames", converter(METADATA[3].type)),
    "ingestion-timestamp": MetadataSource("ts", epoch_millis),
    "event-timestamp": MetadataSource("es", epoch_millis),
    "mysql-type": MetadataSource("mysqlType", converter(METADATA[6].type)),
}


# --- MySQL types (schema-less decoding and the mysqlType / sqlType the encoder writes) -----------------

_DIGITS = re.compile(r"[0-9]+")
#: A type parameter beyond any MySQL length or precision (longer digit runs are read as it).
_HUGE_PARAMETER = 10**18
_MYSQL_TYPE = re.compile(r"\s*([a-z]+(?:\s+precision)?)\s*(?:\(([^)]*)\))?(.*)", re.IGNORECASE | re.DOTALL)
_SIGNED = {
    "tinyint": TypeKind.TINYINT,
    "smallint": TypeKind.SMALLINT,
    "mediumint": TypeKind.INT,
    "int": TypeKind.INT,
    "integer": TypeKind.INT,
    "bigint": TypeKind.BIGINT,
}
_UNSIGNED = {
    "tinyint": atomic(TypeKind.SMALLINT),
    "smallint": atomic(TypeKind.INT),
    "mediumint": atomic(TypeKind.INT),
    "int": atomic(TypeKind.BIGINT),
    "integer": atomic(TypeKind.BIGINT),
    "bigint": atomic(TypeKind.DECIMAL, 20, 0),
}
_SIMPLE = {
    "bool": atomic(TypeKind.BOOLEAN),
    "boolean": atomic(TypeKind.BOOLEAN),
    "serial": atomic(TypeKind.DECIMAL, 20, 0),
    "float": atomic(TypeKind.FLOAT),
    "real": atomic(TypeKind.DOUBLE),
    "double": atomic(TypeKind.DOUBLE),
    "double precision": atomic(TypeKind.DOUBLE),
    "date": atomic(TypeKind.DATE),
    "year": atomic(TypeKind.INT),
    **dict.fromkeys(
        ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "json"), STRING
    ),
    **dict.fromkeys(
        (
            "binary",
            "varbinary",
            "tinyblob",
            "blob",
            "mediumblob",
            "longblob",
            "geometry",
            "point",
            "linestring",
            "polygon",
            "multipoint",
            "multilinestring",
            "multipolygon",
            "geometrycollection",
            "geomcollection",
        ),
        atomic(TypeKind.BINARY),
    ),
}


def _parameter(digits: str) -> int:
    return int(digits) if len(digits) < 18 else _HUGE_PARAMETER


def mysql_type(text: str) -> DataType:
    """The column type for a MySQL type as Canal reports it (``int(11)``, ``DECIMAL(8, 0) unsigned``).

    As Flink CDC and Paimon map them: TINYINT(1) and BIT(1) are BOOLEAN, unsigned integers widen (BIGINT
    UNSIGNED and SERIAL to DECIMAL(20, 0)), DECIMAL wider than 38 digits is STRING, DATETIME and
    TIMESTAMP are TIMESTAMP_NTZ (Canal writes both as local text without a zone), BIT(n) is BIGINT,
    binary and spatial types are BINARY, and anything else (ENUM, SET, JSON, unknown) is STRING.
    """
    match = _MYSQL_TYPE.fullmatch(text)
    if match is None:
        return STRING
    name, params_text, rest = match.group(1).lower(), match.group(2), match.group(3).lower()
    name = " ".join(name.split())
    listed = name not in ("enum", "set")
    params = [_parameter(p) for p in _DIGITS.findall(params_text or "")] if listed else []
    unsigned = "unsigned" in rest or "zerofill" in rest
    if name == "tinyint" and params == [1] and not unsigned:
        return atomic(TypeKind.BOOLEAN)
    if name in _SIGNED:
        return _UNSIGNED[name] if unsigned else atomic(_SIGNED[name])
    if name in ("decimal", "numeric", "fixed", "dec"):
        precision = params[0] if params else 10
        scale = params[1] if len(params) > 1 else 0
        return STRING if precision > 38 else atomic(TypeKind.DECIMAL, precision, scale)
    if name in ("datetime", "timestamp"):
        return atomic(TypeKind.TIMESTAMP_NTZ, params[0] if params else 0)
    if name == "time":
        return atomic(TypeKind.TIME, params[0] if params else 0)
    if name == "bit":
        return atomic(TypeKind.BOOLEAN) if not params or params == [1] else atomic(TypeKind.BIGINT)
    return _SIMPLE.get(name, STRING)


_MYSQL_NAMES = {
    TypeKind.BOOLEAN: ("tinyint(1)", -6),
    TypeKind.TINYINT: ("tinyint", -6),
    TypeKind.SMALLINT: ("smallint", 5),
    TypeKind.INT: ("int", 4),
    TypeKind.BIGINT: ("bigint", -5),
    TypeKind.FLOAT: ("float", 7),
    TypeKind.DOUBLE: ("double", 8),
    TypeKind.STRING: ("longtext", -1),
    TypeKind.BINARY: ("longblob", 2004),
    TypeKind.DATE: ("date", 91),
}


def mysql_type_of(data_type: DataType) -> tuple[str, int]:
    """The MySQL type name and JDBC code written in ``mysqlType`` / ``sqlType`` for a column type."""
    kind = data_type.kind
    if kind in _MYSQL_NAMES:
        return _MYSQL_NAMES[kind]
    if kind is TypeKind.DECIMAL:
        return f"decimal({data_type.precision or 38},{data_type.scale or 0})", 3
    precision = min(data_type.precision if data_type.precision is not None else 6, 6)
    suffix = f"({precision})" if precision else ""
    if kind is TypeKind.TIME:
        return f"time{suffix}", 92
    if kind is TypeKind.TIMESTAMP_NTZ:
        return f"datetime{suffix}", 93
    if kind is TypeKind.TIMESTAMP_LTZ:
        return f"timestamp{suffix}", 93
    return "json", 1111


# --- reading values ---------------------------------------------------------------------------------


def _latin1(value: Any) -> bytes:
    if isinstance(value, str):
        try:
            return value.encode("latin-1")
        except UnicodeEncodeError:
            pass
    raise FieldError(
        "", f"expected binary data as ISO-8859-1 text (as Canal writes it), got {excerpt(value, 40)}"
    )


def _binary(_: DataType) -> Converter:
    return _latin1


def _json_text(data_type: DataType) -> Converter:
    inner = converter(data_type)

    def convert(value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = orjson.loads(value)
            except orjson.JSONDecodeError:
                raise FieldError(
                    "", f"expected JSON text for {data_type.ddl()}, got {value[:40]!r}"
                ) from None
        return inner(value)

    return convert


CANAL_OVERRIDES: Mapping[TypeKind, ConverterFactory] = {
    **DEFAULT_OVERRIDES,
    TypeKind.BINARY: _binary,
    TypeKind.ARRAY: _json_text,
    TypeKind.MAP: _json_text,
    TypeKind.STRUCT: _json_text,
}


# --- decoding ---------------------------------------------------------------------------------------


class CanalJsonDecoder(Decoder):
    format_name = NAME

    def __init__(self, config: FlatJsonConfig) -> None:
        super().__init__(ignore_parse_errors=config.ignore_parse_errors)
        self.config = config
        self._declared = ImageReader(config.schema, CANAL_OVERRIDES) if config.schema is not None else None
        if config.schema is not None:
            self.schema = output_schema(config.schema, METADATA, config.metadata)
        self._by_mysql_types: LruCache[bytes, tuple[ImageReader, Schema, Schema]] = LruCache(
            SCHEMA_CACHE_SIZE
        )

    def __reduce__(self) -> tuple[Callable[..., CanalJsonDecoder], tuple[FlatJsonConfig]]:
        return type(self), (self.config,)

    def failing_on_new_columns(self) -> CanalJsonDecoder:
        return type(self)(replace(self.config, fail_on_new_columns=True))

    def decode_message(self, message: Message, metrics: FormatMetrics) -> Decoded:
        assert message.value is not None  # noqa: S101 - the base class skips tombstones
        envelope = parse_json_object(message.value, "a Canal message")
        if not included(self.config, envelope):
            return None
        kind = envelope.get("type")
        if kind is not None and not isinstance(kind, str):
            raise FieldError("type", f"the Canal message type must be a string, got {excerpt(kind)}")
        if envelope.get("isDdl") is True or kind in DDL_TYPES:
            return ControlEvent(
                _ddl_kind(kind), message, envelope, read_metadata(self.config.metadata, SOURCES, envelope)
            )
        if kind == "INIT":
            return ControlEvent(
                "init", message, envelope, read_metadata(self.config.metadata, SOURCES, envelope)
            )
        if kind not in ROW_TYPES:
            raise FieldError(
                "type",
                f"unknown Canal message type {excerpt(kind)}: expected one of INSERT, UPDATE, DELETE, INIT "
                f"or a DDL type ({', '.join(sorted(DDL_TYPES))})",
            )
        reader = self._reader(envelope)
        data = envelope.get("data")
        if not isinstance(data, list):
            raise FieldError("data", f"a Canal {kind} message needs a 'data' array of rows")
        rows = [reader.row(image, f"data[{i}]") for i, image in enumerate(data)]
        if kind == "INSERT":
            changes = [Change(INS, row) for row in rows]
        elif kind == "DELETE":
            changes = [Change(DEL, row) for row in rows]
        else:
            changes = self._updates(reader, rows, envelope.get("old"))
        return add_metadata(changes, self.config.metadata, SOURCES, envelope)

    @staticmethod
    def _updates(reader: ImageReader, rows: list[Row], old: Any) -> list[Change]:
        if not isinstance(old, list) or len(old) != len(rows):
            found = f"{len(old)} old images" if isinstance(old, list) else f"old = {excerpt(old)}"
            raise FieldError(
                "old",
                f"an UPDATE needs one old image per data row ({len(rows)}), found {found}",
            )
        changes = []
        for i, after in enumerate(rows):
            changes.append(Change(UB, reader.overlay(after, old[i], f"old[{i}]")))
            changes.append(Change(UA, after))
        return changes

    def _reader(self, envelope: Mapping[str, Any]) -> ImageReader:
        declared = self.config.schema
        if self._declared is not None and not self.config.fail_on_new_columns:
            return self._declared
        types = envelope.get("mysqlType")
        if self._declared is not None and declared is not None:
            if isinstance(types, dict) and types:
                check_new_columns(declared, self._columns(types)[2])
            return self._declared
        if not isinstance(types, dict) or not types:
            raise FieldError(
                "mysqlType",
                "no schema was declared and the message has no mysqlType to read the columns from: "
                "declare the schema (schema='id INT NOT NULL, name STRING')",
            )
        reader, self.schema, _ = self._columns(types)
        return reader

    def _columns(self, types: Mapping[str, Any]) -> tuple[ImageReader, Schema, Schema]:
        """The reader, output schema and columns a ``mysqlType`` object describes."""
        try:
            fingerprint = orjson.dumps(types)
        except orjson.JSONEncodeError:  # nested deeper than orjson writes: no type name is
            raise FieldError("mysqlType", "the MySQL types must be text, got values nested deeply") from None
        cached = self._by_mysql_types.get(fingerprint)
        if cached is None:
            fields = []
            for name, text in types.items():
                if not isinstance(text, str):
                    raise FieldError(
                        f"mysqlType.{name}", f"a MySQL type name must be text, got {excerpt(text)}"
                    )
                fields.append(Field(name, mysql_type(text)))
            physical = Schema(tuple(fields))
            cached = (
                ImageReader(physical, CANAL_OVERRIDES),
                output_schema(physical, METADATA, self.config.metadata),
                physical,
            )
            self._by_mysql_types.put(fingerprint, cached)
        return cached


# --- encoding ---------------------------------------------------------------------------------------

Text = Callable[[Any], str]


def _float_text(text: str) -> str:
    return {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(text, text)


def value_text(data_type: DataType, config: FlatJsonConfig) -> Text:
    """How Canal writes a value of this type: as text."""
    kind = data_type.kind
    standard: TimestampStandard = config.timestamp_standard
    if kind is TypeKind.BOOLEAN:
        return lambda v: "true" if v else "false"
    if kind in INTEGER_KINDS:
        return str
    if kind is TypeKind.FLOAT:
        return lambda v: _float_text(float32_repr(v))
    if kind is TypeKind.DOUBLE:
        return lambda v: _float_text(repr(v))
    if kind is TypeKind.DECIMAL:
        return plain_decimal
    if kind is TypeKind.STRING:
        return lambda v: v
    if kind is TypeKind.BINARY:
        return lambda v: bytes(v).decode("latin-1")
    if kind is TypeKind.DATE:
        return lambda v: v.isoformat()
    if kind is TypeKind.TIME:
        return format_time
    if kind is TypeKind.TIMESTAMP_NTZ:
        return lambda v: format_timestamp(v, standard, zoned=False)
    if kind is TypeKind.TIMESTAMP_LTZ:
        return lambda v: format_timestamp(_utc_local(v), standard, zoned=False)
    nested = value_encoder(
        data_type,
        standard,
        map_null_key=config.map_null_key,
        map_null_key_literal=config.map_null_key_literal,
    )
    return lambda v: orjson.dumps(nested(v)).decode()


def _utc_local(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo is not None else value


class CanalJsonEncoder(FlatJsonEncoder):
    """Writes one Canal message per change, values as text; a ``-U`` waits for its ``+U`` to make one
    UPDATE. The Kafka key is the key columns (as written in ``data``) as a JSON object, or None."""

    format_name = NAME
    op_field = "type"
    op_names = ("INSERT", "UPDATE", "DELETE")
    value_writer = value_text

    def __init__(self, config: FlatJsonConfig, key_columns: Sequence[str]) -> None:
        super().__init__(config, key_columns)
        self._mysql_types = {f.name: mysql_type_of(f.type)[0] for f in self.schema}
        self._sql_types = {f.name: mysql_type_of(f.type)[1] for f in self.schema}

    def _serialise(self, envelope: Mapping[str, Any]) -> Encoded:
        kind: str = envelope["type"]
        before, after = envelope.get("before"), envelope.get("after")
        old = None
        if kind == "UPDATE" and after is not None and before is not None:
            old = [self._writer.changed(before, after)]
        elif kind == "UPDATE":
            # A -U whose +U never came: the row is retracted, which Canal says with a DELETE.
            kind = "DELETE"
        image = after if after is not None else before
        assert image is not None  # noqa: S101 - every envelope carries a row
        message = {
            "data": [self._writer.write(image)],
            "database": self.config.encode_database,
            "isDdl": False,
            "mysqlType": self._mysql_types,
            "old": old,
            "pkNames": list(self.key_columns) or None,
            "sqlType": self._sql_types,
            "table": self.config.encode_table,
            "type": kind,
        }
        return Encoded(key_bytes(image, self.key_columns, self._writer), orjson.dumps(message))


class CanalJsonFormat(FlatJsonFormat):
    name = NAME
    spark_source = "cdc-canal"
    options = OPTIONS
    metadata_columns = METADATA
    decoder_class = CanalJsonDecoder
    encoder_class = CanalJsonEncoder
    key_list = SOURCES["pk-names"].field
    table_fields = (SOURCES["database"].field, SOURCES["table"].field)
