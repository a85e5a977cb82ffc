"""Errors raised by the format plugins; all derive from :class:`cdcflow.core.CdcflowError`."""

from __future__ import annotations

import reprlib
from typing import TYPE_CHECKING, Any

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


class SkippedRecord(FieldError):  # noqa: N818 - an outcome, named for what happens to the record
    """A record an option chose to skip (generic ``invalid-op-handling`` LOG or SKIP): it goes to the
    dead letters whatever ``ignore-parse-errors`` says."""


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
            f" Fix the producer or the declared schema, or send such records to a dead-letter output: "
            f"set '{ignore_option}'='true' together with the source option deadLetterPath=DIR or "
            "deadLetterTopic=TOPIC (cdcflow inspect prints them without one)."
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
    columns that the decoder's columns, inferred from earlier messages, lack, or widens one's type.

    Not a decode error: the record is fine and is never dead-lettered; the reader's columns are too
    narrow. ``columns`` holds the new columns (a :class:`~cdcflow.formats.types.Schema`), nullable, and the
    widened ones with their wider type.
    """

    def __init__(self, columns: Schema) -> None:
        super().__init__(f"the message has columns the inferred columns lack or widen: {columns.ddl()}")
        self.columns = columns
        self.origin = "a record"
        """Where the message came from (topic, partition, offset or file:line), set by the decoder."""


#: The longest reason a dead letter or a :class:`DecodeError` carries; a longer one is cut with "...".
MAX_REASON = 1000


class _Excerpt(reprlib.Repr):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxstring = self.maxother = self.maxlong = limit

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 4000:  # str() of an int over 4,300 digits raises, and is quadratic
            return f"<an integer of about {int(x.bit_length() * 0.30103)} digits>"
        return super().repr_int(x, level)


def excerpt(value: Any, limit: int = 60) -> str:
    """A value as an error message shows it: its repr, at most about ``limit`` characters, nested
    containers cut after a few levels. Never raises, whatever the value (deep nesting, huge integers,
    a ``__repr__`` that fails)."""
    try:
        text = _Excerpt(limit).repr(value)
    except Exception:  # an error message must always be built
        return f"<a {type(value).__name__}>"
    return text if len(text) <= limit + 3 else text[:limit] + "..."


def expected(value: Any, what: str) -> FieldError:
    """The error of a value that is not ``what`` its column takes, showing an excerpt of it."""
    return FieldError("", f"expected {what}, got {excerpt(value)}")


def exception_text(error: BaseException, limit: int = MAX_REASON) -> str:
    """``str(error)``, at most ``limit`` characters; never raises (an exception whose text cannot be
    built is shown by its type)."""
    try:
        text = str(error)
    except Exception:  # an error message must always be built
        text = ""
    text = text or type(error).__name__
    return text if len(text) <= limit else text[:limit] + "..."
