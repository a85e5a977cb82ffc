"""``maxwell-json``: Maxwell's daemon messages, one row per message with typed JSON values.

``type`` ``insert`` / ``update`` / ``delete`` give ``+I`` / ``-U`` ``+U`` / ``-D``; the ``-U`` row is
``data`` overlaid by ``old`` (only the changed columns; a key with null is a change from NULL). Unlike
Flink, ``bootstrap-insert`` is read as ``+I``, ``bootstrap-start`` / ``bootstrap-complete`` go to the
side output as ``bootstrap`` events and DDL messages (``table-create``, ``database-alter``, ...) as
``schema-change`` events; an update without ``old`` changed nothing (before = after). BOOLEAN reads
Maxwell's 1/0 for TINYINT(1).

Encoding writes an update as ONE ``update`` message with ``old`` holding exactly the changed columns
(Flink writes a delete and an insert). ``ts`` and ``xid`` are not written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from cdcflow.core.model import Change
from cdcflow.core.rowkind import DEL, INS, UA, UB
from cdcflow.formats.base import (
    ControlEvent,
    Decoded,
    Encoded,
    FormatMetrics,
    Message,
    MetadataColumn,
    parse_json_object,
)
from cdcflow.formats.errors import FieldError, excerpt
from cdcflow.formats.flat_json.base import (
    FlatJsonDecoder,
    FlatJsonEncoder,
    FlatJsonFormat,
    MetadataSource,
    add_metadata,
    epoch_millis,
    include_options,
    included,
    json_options,
    key_bytes,
    read_metadata,
    target_options,
)
from cdcflow.formats.json_decode import converter
from cdcflow.formats.types import STRING, TIMESTAMP_LTZ_MILLIS, DataType, TypeKind

NAME = "maxwell-json"

OPTIONS = json_options(NAME, [*include_options(), *target_options("database", "table")])

METADATA = (
    MetadataColumn("database", STRING, "the database of the change"),
    MetadataColumn("table", STRING, "the table of the change"),
    MetadataColumn(
        "primary-key-columns",
        DataType(TypeKind.ARRAY, element=STRING),
        "primary-key columns (primary_key_columns)",
    ),
    MetadataColumn("ingestion-timestamp", TIMESTAMP_LTZ_MILLIS, "when Maxwell processed the change (ts)"),
)


def _epoch_seconds(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return epoch_millis(value * 1000)
    raise FieldError("", f"expected epoch seconds (an integer), got {excerpt(value)}")


SOURCES = {
    "database": MetadataSource("database", converter(STRING)),
    "table": MetadataSource("table", converter(STRING)),
    "primary-key-columns": MetadataSource("primary_key_columns", converter(METADATA[2].type)),
    "ingestion-timestamp": MetadataSource("ts", _epoch_seconds),
}

ROW_TYPES = {"insert": INS, "bootstrap-insert": INS, "update": UA, "delete": DEL}
BOOTSTRAP_MARKERS = frozenset({"bootstrap-start", "bootstrap-complete"})
DDL_PREFIXES = ("table-", "database-")


class MaxwellJsonDecoder(FlatJsonDecoder):
    format_name = NAME
    metadata_columns = METADATA

    def decode_message(self, message: Message, metrics: FormatMetrics) -> Decoded:
        assert message.value is not None  # noqa: S101 - the base class skips tombstones
        envelope = parse_json_object(message.value, "a Maxwell message")
        if not included(self.config, envelope):
            return None
        kind = envelope.get("type")
        if isinstance(kind, str) and kind.startswith(DDL_PREFIXES):
            return ControlEvent(
                "schema-change", message, envelope, read_metadata(self.config.metadata, SOURCES, envelope)
            )
        if isinstance(kind, str) and kind in BOOTSTRAP_MARKERS:  # kind may be any JSON value
            return ControlEvent(
                "bootstrap", message, envelope, read_metadata(self.config.metadata, SOURCES, envelope)
            )
        row_kind = ROW_TYPES.get(kind) if isinstance(kind, str) else None
        if row_kind is None:
            raise FieldError(
                "type",
                f"unknown Maxwell message type {excerpt(kind)}: expected insert, update, delete, "
                "bootstrap-*, or a DDL type (table-*, database-*)",
            )
        after = self._reader.row(envelope.get("data"), "data")
        if row_kind is UA:
            old = envelope.get("old")
            before = self._reader.overlay(after, {} if old is None else old, "old")
            changes = [Change(UB, before), Change(UA, after)]
        else:
            changes = [Change(row_kind, after)]
        return add_metadata(changes, self.config.metadata, SOURCES, envelope)


class MaxwellJsonEncoder(FlatJsonEncoder):
    """Writes ``{"database", "table", "type", "data", "old"?, "primary_key_columns"?}`` messages."""

    format_name = NAME
    op_field = "type"
    op_names = ("insert", "update", "delete")

    def _serialise(self, envelope: Mapping[str, Any]) -> Encoded:
        kind: str = envelope["type"]
        before, after = envelope.get("before"), envelope.get("after")
        image = after if after is not None else before
        assert image is not None  # noqa: S101 - every envelope carries a row
        message: dict[str, Any] = {
            "database": self.config.encode_database,
            "table": self.config.encode_table,
            "type": kind,
            "data": self._writer.write(image),
        }
        if kind == "update" and before is not None and after is not None:
            message["old"] = self._writer.changed(before, after)
        elif kind == "update":
            # A -U whose +U never came: the row is retracted.
            message["type"] = "delete"
        if self.key_columns:
            message["primary_key_columns"] = list(self.key_columns)
        return Encoded(key_bytes(image, self.key_columns, self._writer), orjson.dumps(message))


class MaxwellJsonFormat(FlatJsonFormat):
    name = NAME
    spark_source = "cdc-maxwell"
    options = OPTIONS
    metadata_columns = METADATA
    decoder_class = MaxwellJsonDecoder
    encoder_class = MaxwellJsonEncoder
    key_list = SOURCES["primary-key-columns"].field
    table_fields = (SOURCES["database"].field, SOURCES["table"].field)
