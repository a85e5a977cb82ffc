"""What Debezium's JSON and Avro forms share: op codes, modes, TOAST placeholders, metadata columns.

The decoding semantics are FROM_CHANGELOG's: ``c``/``r`` → ``+I``, ``u`` → ``-U`` + ``+U`` (or ``+U``
alone in upsert mode), ``d`` → ``-D``; ``t`` (truncate) and ``m`` (message) are side-output events.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable, Hashable, Mapping, Sequence
from enum import Enum
from typing import Any

import orjson

from cdcflow.core.from_changelog_engine import FromChangelog
from cdcflow.core.model import Change, Row
from cdcflow.core.params import plan_from_changelog
from cdcflow.formats.base import (
    FormatMetrics,
    Headers,
    Message,
    MetadataColumn,
    metadata_column_name,
    metadata_schema,
)
from cdcflow.formats.base import output_schema as base_output_schema
from cdcflow.formats.coerce import exact_cast
from cdcflow.formats.debezium.position import source_lsn, source_sequence
from cdcflow.formats.errors import FieldError, excerpt
from cdcflow.formats.json_decode import (
    MAX_JSON_TEXT_DEPTH,
    UNAVAILABLE,
    Converter,
    RowConverter,
    as_text,
    json_text,
)
from cdcflow.formats.lru import FILL_STATE_KEYS, LruCache
from cdcflow.formats.options import Option, choice, names
from cdcflow.formats.types import (
    BIGINT,
    STRING,
    TIMESTAMP_LTZ_MILLIS,
    DataType,
    Field,
    Schema,
    TypeKind,
)

PLACEHOLDER = "__debezium_unavailable_value"
_PLACEHOLDER_BASE64 = base64.b64encode(PLACEHOLDER.encode()).decode()
_PLACEHOLDER_BYTES = PLACEHOLDER.encode()
_PLACEHOLDER_CODES = [ord(c) for c in PLACEHOLDER]
CONTROL_OPS = {"t": "truncate", "m": "message"}
#: The headers Debezium puts on the events of a primary-key change: the delete (and its tombstone)
#: carries the new key, the create the old one.
KEY_HEADERS = {"old-key": "__debezium.oldkey", "new-key": "__debezium.newkey"}


class DebeziumMode(Enum):
    RETRACT = "RETRACT"
    UPSERT = "UPSERT"


class UnavailableHandling(Enum):
    FILL = "FILL"
    REPORT = "REPORT"
    FAIL = "FAIL"


OP_MAPPINGS = {
    DebeziumMode.RETRACT: {"c, r": "INSERT", "u": "UPDATE_BEFORE, UPDATE_AFTER", "d": "DELETE"},
    DebeziumMode.UPSERT: {"c, r": "INSERT", "u": "UPDATE_AFTER", "d": "DELETE"},
}
#: The encoders' TO_CHANGELOG mappings: an update is one ``u`` event.
ENCODE_OP_MAPPINGS = {
    DebeziumMode.RETRACT: {"INSERT": "c", "UPDATE_BEFORE, UPDATE_AFTER": "u", "DELETE": "d"},
    DebeziumMode.UPSERT: {"INSERT": "c", "UPDATE_AFTER": "u", "DELETE": "d"},
}

MODE_HELP = (
    "RETRACT: u gives -U and +U and needs the before image (PostgreSQL: REPLICA IDENTITY FULL); "
    "UPSERT: u gives +U, d gives -D of the key, no before image needed"
)
UNAVAILABLE_HELP = (
    "an unchanged TOASTed column (__debezium_unavailable_value): FILL takes it from the event's before "
    "image or an earlier event of the same key read by the same decoder (with Spark: the same input "
    "partition of the same micro-batch; the last 10,000 keys), else REPORTs it: NULL, named in the "
    "unavailable-columns metadata (which makes the non-key columns nullable); FAIL fails the record. "
    "An unavailable value of a NOT NULL column fails its record unless unavailable-columns is requested"
)
NOT_NULL_UNAVAILABLE = (
    "Debezium did not send this unchanged TOASTed value (__debezium_unavailable_value) and the column is "
    "declared NOT NULL: declare it nullable, set REPLICA IDENTITY FULL on the table, or request the "
    "metadata column unavailable-columns (the column is then NULL and listed there)"
)


DEBEZIUM_OPTIONS: tuple[Option[Any], ...] = (
    Option("changelog-mode", choice(DebeziumMode), DebeziumMode.RETRACT, MODE_HELP),
    Option("unavailable-values", choice(UnavailableHandling), UnavailableHandling.FILL, UNAVAILABLE_HELP),
    Option("key-columns", names, (), "primary-key columns (default: the fields of the Kafka message key)"),
)


def is_unavailable(value: Any) -> bool:
    """Debezium's placeholder for a value it did not send, in each shape it takes."""
    cls = value.__class__
    if cls is str:
        return value == PLACEHOLDER or value == _PLACEHOLDER_BASE64  # type: ignore[no-any-return]
    if cls is list:
        return value == _PLACEHOLDER_CODES or value == [PLACEHOLDER]  # type: ignore[no-any-return]
    if cls is bytes:
        return value == _PLACEHOLDER_BYTES  # type: ignore[no-any-return]
    return False


METADATA = (
    MetadataColumn(
        "ingestion-timestamp",
        TIMESTAMP_LTZ_MILLIS,
        "when Debezium processed the event (ts_ms)",
        columnar=True,
    ),
    MetadataColumn(
        "source.timestamp",
        TIMESTAMP_LTZ_MILLIS,
        "when the change was made in the database",
        columnar=True,
    ),
    MetadataColumn("source.database", STRING, "the database (source.db)"),
    MetadataColumn("source.schema", STRING, "the schema (source.schema)"),
    MetadataColumn("source.table", STRING, "the table (source.table, or source.collection)"),
    MetadataColumn(
        "source.properties",
        DataType(TypeKind.MAP, key=STRING, value=STRING),
        "the whole source block, values as text",
    ),
    MetadataColumn("transaction.id", STRING, "the transaction id (transaction.id), when provided"),
    MetadataColumn("op", STRING, "Debezium's operation code (c, r, u, d; t, m on control events)"),
    MetadataColumn(
        "unavailable-columns",
        DataType(TypeKind.ARRAY, element=STRING),
        "columns whose value Debezium did not send and state could not fill (unchanged TOAST)",
        columnar=True,
    ),
    MetadataColumn(
        "old-key",
        STRING,
        'on the create of a primary-key change: the old key as JSON text, e.g. {"id":2} (header '
        "__debezium.oldkey); null otherwise",
        reads_headers=True,
        columnar=True,
    ),
    MetadataColumn(
        "new-key",
        STRING,
        "on the delete of a primary-key change: the new key as JSON text (header __debezium.newkey); "
        "null otherwise",
        reads_headers=True,
        columnar=True,
    ),
    MetadataColumn("schema", STRING, "the Kafka Connect schema block as JSON text (schema-include only)"),
    MetadataColumn("source.lsn", BIGINT, "PostgreSQL log sequence number (source.lsn)", columnar=True),
    MetadataColumn(
        "source.sequence",
        DataType(TypeKind.ARRAY, element=BIGINT),
        "the change's log position as sortable integers (PostgreSQL, MySQL, SQL Server, Oracle)",
        columnar=True,
    ),
)


def output_schema(
    physical: Schema,
    metadata: Sequence[str],
    *,
    unavailable: UnavailableHandling = UnavailableHandling.FILL,
    key_columns: Sequence[str] = (),
) -> Schema:
    """The table columns and the requested metadata columns. With ``unavailable-columns`` (and values
    not FAILed) a value Debezium did not send is NULL and listed there, whatever the column's declared
    nullability: every column but the ``key-columns`` is then nullable (see :func:`reports_unavailable`)."""
    if reports_unavailable(metadata, unavailable):
        physical = Schema(
            tuple(f if f.nullable or f.name in key_columns else Field(f.name, f.type) for f in physical)
        )
    return base_output_schema(physical, METADATA, metadata)


def reports_unavailable(metadata: Sequence[str], unavailable: UnavailableHandling) -> bool:
    """Whether a value Debezium did not send may be NULL in a NOT NULL column (it is then listed in
    the ``unavailable-columns`` metadata, which a consumer such as the Delta merge reads)."""
    return "unavailable-columns" in metadata and unavailable is not UnavailableHandling.FAIL


def check_metadata(metadata: Sequence[str], format_name: str) -> tuple[str, ...]:
    return metadata_schema(METADATA, metadata, format_name)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _millis(value: Any, field: str) -> dt.datetime | None:
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return _EPOCH + dt.timedelta(milliseconds=value)
        except OverflowError:
            raise FieldError(
                field, f"{excerpt(value)} ms since the epoch is out of the TIMESTAMP range (years 1 to 9999)"
            ) from None
    return None


def _text(value: Any, field: str) -> str | None:
    """A source value as text: numbers and booleans as JSON writes them, objects and arrays as JSON."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    try:
        return as_text(value)
    except FieldError as error:
        raise FieldError(field, error.reason) from None


def header_key(headers: Headers, name: str) -> str | None:
    """The key in Debezium's ``__debezium.oldkey`` / ``newkey`` header as compact JSON text of its
    fields (the payload of Kafka Connect's ``{schema, payload}`` form), or None without the header."""
    if not headers:
        return None
    raw = next((value for key, value in reversed(headers) if key == name), None)
    if raw is None:
        return None
    try:
        key = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise FieldError(
            f"headers.{name}",
            "the header is not JSON text; set the Kafka Connect worker's header.converter to "
            "org.apache.kafka.connect.json.JsonConverter or SimpleHeaderConverter (the default)",
        ) from None
    if isinstance(key, dict) and set(key) == {"schema", "payload"}:
        key = key["payload"]
    if not isinstance(key, dict):
        raise FieldError(
            f"headers.{name}", f"the header must hold the key's fields, got {type(key).__name__}"
        )
    try:
        return json_text(key)
    except FieldError as error:
        raise FieldError(f"headers.{name}", error.reason) from None


def metadata_values(
    keys: Sequence[str],
    payload: Mapping[str, Any],
    missing: list[str],
    schema_text: str | None,
    headers: Headers = (),
) -> dict[str, Any]:
    source = payload.get("source")
    source = source if isinstance(source, Mapping) else {}
    transaction = payload.get("transaction")
    out: dict[str, Any] = {}
    for key in keys:
        if key == "ingestion-timestamp":
            value: Any = _millis(payload.get("ts_ms"), "ts_ms")
        elif key == "source.timestamp":
            value = _millis(source.get("ts_ms"), "source.ts_ms")
        elif key == "source.database":
            value = _text(source.get("db"), "source.db")
        elif key == "source.schema":
            value = _text(source.get("schema"), "source.schema")
        elif key == "source.table":
            value = _text(source.get("table", source.get("collection")), "source.table")
        elif key == "source.properties":
            value = {k: _text(v, f"source.{k}") for k, v in source.items()}
        elif key == "transaction.id":
            in_transaction = transaction.get("id") if isinstance(transaction, Mapping) else None
            value = _text(in_transaction, "transaction.id")
        elif key == "op":
            value = _text(payload.get("op"), "op")
        elif key == "unavailable-columns":
            value = list(missing)
        elif key in KEY_HEADERS:
            value = header_key(headers, KEY_HEADERS[key])
        elif key == "schema":
            value = schema_text
        elif key == "source.sequence":
            value = source_sequence(source)
        else:
            value = source_lsn(source)
        out[metadata_column_name(key)] = value
    return out


class ChangeBuilder:
    """The FROM_CHANGELOG step of both Debezium forms, plus the unchanged-TOAST filling state.

    Rows arrive already converted (values typed, placeholders marked :data:`UNAVAILABLE`).
    """

    def __init__(
        self,
        mode: DebeziumMode,
        unavailable: UnavailableHandling,
        key_columns: Sequence[str],
        format_name: str,
        metadata: Sequence[str] = (),
    ) -> None:
        self.mode = mode
        self.unavailable = unavailable
        self.key_columns = tuple(key_columns)
        self.format_name = format_name
        self.reports = reports_unavailable(metadata, unavailable)
        self._engine = FromChangelog(
            plan_from_changelog(op="op", before="before", after="after", op_mapping=OP_MAPPINGS[mode])
        )
        #: Each key's last image for FILL, at most FILL_STATE_KEYS (the least recently changed go first).
        self._images: LruCache[Hashable, Row] | None = (
            LruCache(FILL_STATE_KEYS) if unavailable is UnavailableHandling.FILL else None
        )

    @property
    def images(self) -> LruCache[Hashable, Row] | None:
        """Each key's last after image, to fill unchanged TOAST values from (``unavailable-values=fill``)."""
        return self._images

    def changes(
        self,
        op: str,
        before: Row | None,
        after: Row | None,
        key: Hashable | None,
        metrics: FormatMetrics,
        columns: Schema,
    ) -> tuple[list[Change], list[str]]:
        """The changes of one event and the columns left unavailable (``columns``: the images' columns,
        whose nullability says where an unavailable value may become NULL)."""
        if op == "u" and before is None and self.mode is DebeziumMode.RETRACT:
            raise FieldError(
                "before",
                "the UPDATE has no before image (before is null), so its -U row cannot be built; on "
                "PostgreSQL give the table REPLICA IDENTITY FULL, or read updates as upserts with "
                f"'{self.format_name}.changelog-mode'='upsert'",
            )
        if op == "d" and before is None:
            raise FieldError(
                "before",
                "the DELETE has no before image (before is null); on PostgreSQL set REPLICA IDENTITY "
                "FULL (or DEFAULT, which sends the key), or read it with upsert-kafka",
            )
        missing: list[str] = []
        unsent = (
            [name for name, value in before.items() if value is UNAVAILABLE]
            if before is not None and UNAVAILABLE in before.values()
            else []
        )
        for name in unsent:
            self._check_may_be_null(columns, name, "before")
        if after is not None and UNAVAILABLE in after.values():
            missing = self._fill(after, before, key, metrics, columns)
        if before is not None:
            for name in unsent:
                before[name] = None
        if self._images is not None and key is not None:
            if op == "d":
                self._images.pop(key)
            elif after is not None:
                stored = dict(after)
                for name in missing:
                    stored[name] = UNAVAILABLE
                self._images.put(key, stored)
        return self._engine.process_images(op, before, after), missing

    def _check_may_be_null(self, columns: Schema, name: str, image: str) -> None:
        """An unavailable value becomes NULL: refused in a NOT NULL column (Spark would fail the whole
        query on it), unless the output lists it in ``unavailable-columns`` and is nullable there."""
        if self.reports and name not in self.key_columns:
            return
        if name in columns and not columns.field(name).nullable:
            raise FieldError(f"{image}.{name}", NOT_NULL_UNAVAILABLE)

    def _fill(
        self, after: Row, before: Row | None, key: Hashable | None, metrics: FormatMetrics, columns: Schema
    ) -> list[str]:
        previous = self._images.get(key) if self._images is not None and key is not None else None
        found: dict[str, Any] = {}
        missing = []
        for name, value in after.items():
            if value is not UNAVAILABLE:
                continue
            if self.unavailable is UnavailableHandling.FAIL:
                raise FieldError(
                    f"after.{name}",
                    "Debezium did not send this unchanged TOASTed value (__debezium_unavailable_value); "
                    "set REPLICA IDENTITY FULL on the table, or unavailable-values=fill/report",
                )
            source = before if before is not None and before.get(name) is not UNAVAILABLE else None
            if source is None and self.unavailable is UnavailableHandling.FILL and previous is not None:
                source = previous if previous.get(name, UNAVAILABLE) is not UNAVAILABLE else None
            if source is not None and name in source:
                found[name] = source[name]
            else:
                self._check_may_be_null(columns, name, "after")
                missing.append(name)
        after.update(found)
        after.update(dict.fromkeys(missing))
        metrics.filled_values += len(found)
        metrics.unavailable_values += len(missing)
        return missing

    def state_key(
        self, row: Row | None, message: Message, key_fields: Callable[[Message], Mapping[str, Any] | None]
    ) -> Hashable | None:
        """The key the filling state is kept under: the key columns, else the fields of the Kafka key
        (read by ``key_fields`` only then; None when they cannot be had)."""
        if self._images is None:
            return None
        if self.key_columns:
            return tuple(_hashable(row.get(c)) for c in self.key_columns) if row is not None else None
        return fields_key(key_fields(message))


def fields_key(fields: Mapping[str, Any] | None) -> Hashable | None:
    """The filling state's key of a Kafka key's fields (None: there are none): ``(name, value)`` for one
    field, else a tuple of those pairs (never equal: a pair starts with a name, a tuple with a pair)."""
    if not fields:
        return None
    if len(fields) == 1:
        ((name, value),) = fields.items()
        return (name, _hashable(value))
    return tuple((k, _hashable(v)) for k, v in fields.items())


def image(rows: RowConverter, value: Any, field: str, shape: str = "a JSON object") -> Row | None:
    """The ``before`` / ``after`` image as a typed row (None stays None); errors name ``field.column``."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise FieldError(field, f"the image must be {shape}, got {type(value).__name__}")
    try:
        return rows.convert(value)
    except FieldError as error:
        raise FieldError(f"{field}.{error.field}", error.reason) from None


def _hashable(value: Any, depth: int = 0) -> Hashable:
    if isinstance(value, list | dict) and depth >= MAX_JSON_TEXT_DEPTH:
        raise FieldError("key", f"the key is nested deeper than {MAX_JSON_TEXT_DEPTH} levels")
    if isinstance(value, list):
        return tuple(_hashable(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return tuple((k, _hashable(v, depth + 1)) for k, v in value.items())
    return value  # type: ignore[no-any-return]


def coerce_converter(convert: Converter, source: DataType, target: DataType, column: str) -> Converter:
    """Decode with the message's own type (its decimal scale, its epoch unit), then convert the value
    exactly to the declared type (:mod:`coerce`): a value that cannot be converted without change fails
    its record; a pair of types with no exact conversion fails when the message schema is first read."""
    if source == target or (source.kind is target.kind and target.kind not in _CHECKED_KINDS):
        return convert
    cast = exact_cast(source, target, _as_text)
    if cast is None:
        raise FieldError(
            f"schema.{column}",
            f"the column is declared {target.ddl()} but the message schema says {source.ddl()}, and no "
            f"conversion keeps every value exactly; declare it {_declare(source)}",
        )

    def coerced(value: Any) -> Any:
        decoded = convert(value)
        try:
            return cast(decoded)
        except FieldError as error:
            raise FieldError(
                error.field,
                f"{error.reason}: the message schema says {source.ddl()} and the column is declared "
                f"{target.ddl()}; declare it {_declare(source)}",
            ) from None

    return coerced


_CHECKED_KINDS = (TypeKind.DECIMAL, TypeKind.ARRAY, TypeKind.MAP, TypeKind.STRUCT)


def _declare(source: DataType) -> str:
    """The declared type that holds every value of the message's type (a variable-scale decimal has no
    fixed scale: its exact digits fit STRING)."""
    if source.kind is TypeKind.DECIMAL and source.scale is None:
        return "STRING (its exact digits) or a DECIMAL(p, s) wide enough for every value"
    return f"{source.ddl()} (or STRING)"


def _as_text(value: Any) -> str:
    """A decoded value cast to STRING: temporal values as ISO text, bytes as base64 (nested too)."""
    if hasattr(value, "isoformat"):
        return value.isoformat()  # type: ignore[no-any-return]
    return as_text(value)
