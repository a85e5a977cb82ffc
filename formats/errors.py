"""Errors raised by the format plugins; all derive from :class:`cdcflow.core.CdcflowError`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdcflow.core.errors import CdcflowError

if TYPE_CHECKING:
    from cdcflow.formats.types import Schema


class FormatError(CdcflowError):
    """Root of the format errors."""


class FormatOptionError(FormatError, ValueError):
    """An option is unknown, malformed or inconsistent; raised before any record is read."""


class SchemaError(FormatError, ValueError):
    """A schema (Spark DDL string, Connect schema, Avro schema) cannot be parsed or used."""


class UnknownFormatError(FormatError, LookupError):
    """No format is registered under the requested name."""


class MissingDependencyError(FormatError, ImportError):
    """An optional package a format needs is not installed."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(f"this needs the '{package}' package: pip install 'cdcflow[{extra}]'")


class FieldError(FormatError, ValueError):
    """A value inside a record cannot be converted; ``field`` is its dotted path in the envelope.

    Raised by the per-field converters without coordinates; :class:`DecodeError` adds them.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"field '{field}': {reason}" if field else reason)
        self.field = field
        self.reason = reason


class DecodeError(FormatError, ValueError):
    """A record cannot be decoded. Names where it came from and carries its bytes for dead-lettering."""

    def __init__(
        self,
        format_name: str,
        origin: str,
        reason: str,
        *,
        field: str | None = None,
        value: bytes | None = None,
        key: bytes | None = None,
        ignore_option: str | None = None,
    ) -> None:
        where = f"{origin}, field '{field}'" if field else origin
        advice = (
            f" Fix the producer or the declared schema, or set '{ignore_option}'='true' to send such "
            "records to the dead-letter output."
            if ignore_option
            else ""
        )
        super().__init__(f"{format_name}: cannot decode {where}: {reason}.{advice}")
        self.format_name = format_name
        self.origin = origin
        self.field = field
        self.reason = reason
        self.value = value
        self.key = key


class EncodeError(FormatError, ValueError):
    """A change cannot be written in the format's envelope."""


class NewColumnsError(FormatError):
    """A message's own schema (Connect schema block, Avro writer schema, Canal ``mysqlType``) has
    columns that the decoder's columns, inferred from earlier messages, lack.

    Not a decode error: the record is fine and is never dead-lettered; the reader's columns are too
    narrow. ``columns`` holds the new columns (a :class:`~cdcflow.formats.types.Schema`), nullable.
    """

    def __init__(self, columns: Schema) -> None:
        super().__init__(f"the message has columns the inferred columns lack: {columns.ddl()}")
        self.columns = columns
        self.origin = "a record"
        """Where the message came from (topic, partition, offset or file:line), set by the decoder."""
