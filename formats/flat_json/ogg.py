"""``ogg-json``: Oracle GoldenGate's JSON messages (``op_type`` with ``before`` / ``after`` images).

``I`` gives ``+I`` (after), ``U`` ``-U`` + ``+U`` (before, after), ``D`` ``-D`` (before); unlike Flink,
``T`` (truncate) goes to the side output as a ``truncate`` event. An update or delete without a before
image fails naming the fix (GoldenGate must write before images). BOOLEAN also reads 1/0.

Encoding writes an update as ONE ``U`` message with ``before`` and ``after`` (Flink writes a delete and
an insert); ``op_ts``, ``current_ts`` and ``pos`` are not written.
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
    json_options,
    key_bytes,
    read_metadata,
    target_options,
)
from cdcflow.formats.json_decode import converter
from cdcflow.formats.types import STRING, DataType, TypeKind, atomic

NAME = "ogg-json"

OPTIONS = json_options(NAME, target_options("table"))

_LTZ_MICROS = atomic(TypeKind.TIMESTAMP_LTZ, 6)
METADATA = (
    MetadataColumn("table", STRING, "the fully qualified table name (SCHEMA.TABLE)"),
    MetadataColumn("primary-keys", DataType(TypeKind.ARRAY, element=STRING), "primary-key columns"),
    MetadataColumn("ingestion-timestamp", _LTZ_MICROS, "when GoldenGate processed the change (current_ts)"),
    MetadataColumn("event-timestamp", _LTZ_MICROS, "when the change was committed in the database (op_ts)"),
)
SOURCES = {
    "table": MetadataSource("table", converter(STRING)),
    "primary-keys": MetadataSource("primary_keys", converter(METADATA[1].type)),
    "ingestion-timestamp": MetadataSource("current_ts", converter(_LTZ_MICROS)),
    "event-timestamp": MetadataSource("op_ts", converter(_LTZ_MICROS)),
}

_BEFORE_HELP = (
    "GoldenGate wrote no before image: configure the extract to log full before images "
    "(GETUPDATEBEFORES, full supplemental logging) so that the {what} can be built"
)


class OggJsonDecoder(FlatJsonDecoder):
    format_name = NAME
    metadata_columns = METADATA

    def decode_message(self, message: Message, metrics: FormatMetrics) -> Decoded:
        assert message.value is not None  # noqa: S101 - the base class skips tombstones
        envelope = parse_json_object(message.value, "a GoldenGate message")
        op = envelope.get("op_type")
        if op == "T":
            return ControlEvent(
                "truncate", message, envelope, read_metadata(self.config.metadata, SOURCES, envelope)
            )
        if op not in ("I", "U", "D"):
            raise FieldError("op_type", f"unknown GoldenGate op_type {excerpt(op)}: expected I, U, D or T")
        before, after = envelope.get("before"), envelope.get("after")
        if op == "I":
            if after is None:
                raise FieldError("after", "an insert (op_type I) needs the after image")
            changes = [Change(INS, self._reader.row(after, "after"))]
        elif before is None:
            raise FieldError("before", _BEFORE_HELP.format(what="-U row" if op == "U" else "deleted row"))
        elif op == "D":
            changes = [Change(DEL, self._reader.row(before, "before"))]
        else:
            if after is None:
                raise FieldError("after", "an update (op_type U) needs the after image")
            changes = [
                Change(UB, self._reader.row(before, "before")),
                Change(UA, self._reader.row(after, "after")),
            ]
        return add_metadata(changes, self.config.metadata, SOURCES, envelope)


class OggJsonEncoder(FlatJsonEncoder):
    """Writes ``{"table", "op_type", "primary_keys"?, "before"?, "after"?}`` messages."""

    format_name = NAME
    op_field = "op_type"
    op_names = ("I", "U", "D")

    def _serialise(self, envelope: Mapping[str, Any]) -> Encoded:
        op: str = envelope["op_type"]
        before, after = envelope.get("before"), envelope.get("after")
        if op == "U" and after is None:
            op = "D"  # a -U whose +U never came: the row is retracted
        message: dict[str, Any] = {"table": self.config.encode_table, "op_type": op}
        if self.key_columns:
            message["primary_keys"] = list(self.key_columns)
        if before is not None and op != "I":
            message["before"] = self._writer.write(before)
        if after is not None:
            message["after"] = self._writer.write(after)
        image = after if after is not None else before
        return Encoded(key_bytes(image, self.key_columns, self._writer), orjson.dumps(message))


class OggJsonFormat(FlatJsonFormat):
    name = NAME
    spark_source = "cdc-ogg"
    options = OPTIONS
    metadata_columns = METADATA
    decoder_class = OggJsonDecoder
    encoder_class = OggJsonEncoder
    key_list = SOURCES["primary-keys"].field
    table_fields = (None, SOURCES["table"].field)
