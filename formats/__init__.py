"""Format plugins: decode change envelopes (Debezium, Canal, Maxwell, OGG, op-code rows, upsert-kafka)
into the changelog model, and encode changelogs back into envelopes.

    from cdcflow.formats import resolve_format, parse_ddl, Message

    decoder = resolve_format("debezium-json").create_decoder({}, parse_ddl("id INT NOT NULL, name STRING"))
    out = decoder.decode_all([Message(value=b'{"op": "c", "after": {"id": 1, "name": "a"}}')])
"""

from cdcflow.formats.base import (
    ControlEvent,
    DeadLetter,
    DecodeOutput,
    Decoder,
    Encoded,
    Encoder,
    FormatMetrics,
    Message,
)
from cdcflow.formats.errors import (
    DecodeError,
    EncodeError,
    FieldError,
    FormatError,
    FormatOptionError,
    MissingDependencyError,
    SchemaError,
    UnknownFormatError,
)
from cdcflow.formats.registry import ENTRY_POINT_GROUP, FormatFactory, available_formats, resolve_format
from cdcflow.formats.render import render_change
from cdcflow.formats.types import DataType, Field, Schema, TypeKind, parse_ddl

__all__ = [
    "ENTRY_POINT_GROUP",
    "ControlEvent",
    "DataType",
    "DeadLetter",
    "DecodeError",
    "DecodeOutput",
    "Decoder",
    "EncodeError",
    "Encoded",
    "Encoder",
    "Field",
    "FieldError",
    "FormatError",
    "FormatFactory",
    "FormatMetrics",
    "FormatOptionError",
    "Message",
    "MissingDependencyError",
    "Schema",
    "SchemaError",
    "TypeKind",
    "UnknownFormatError",
    "available_formats",
    "parse_ddl",
    "render_change",
    "resolve_format",
]
