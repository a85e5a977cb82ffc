"""What every format shares: the message it reads, its outputs, and the decoder / encoder contract.

A format has three layers (as Flink's): a factory that owns the name and the options
(:mod:`cdcflow.formats.registry`), a configuration parsed once on the driver, and a small picklable
per-record :class:`Decoder` / :class:`Encoder` built from it.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import orjson

from cdcflow.core.errors import CdcflowError, ChangelogDataError
from cdcflow.core.model import Change
from cdcflow.core.params import plan_to_changelog
from cdcflow.core.to_changelog_engine import ToChangelog
from cdcflow.formats.decimals import InexactNumber, loads_exact
from cdcflow.formats.errors import (
    MAX_REASON,
    DecodeError,
    FieldError,
    FormatOptionError,
    NewColumnsError,
    SchemaError,
    SkippedRecord,
    exception_text,
)
from cdcflow.formats.options import Option, boolean
from cdcflow.formats.types import DataType, Field, Schema, widens

Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(slots=True, unsafe_hash=True)
class Message:
    """One Kafka record (or one line of a recorded file): the bytes and where they came from.

    Never changed once built, but not ``frozen``: a frozen dataclass's constructor sets each field
    through ``object.__setattr__`` (2.7 µs against 0.5 µs), and a read builds one per record.
    """

    value: bytes | None
    key: bytes | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    timestamp_ms: int | None = None
    headers: Headers = ()
    file: str | None = None
    line: int | None = None

    def origin(self) -> str:
        parts = []
        if self.topic is not None:
            parts.append(f"topic '{self.topic}'")
        if self.partition is not None:
            parts.append(f"partition {self.partition}")
        if self.offset is not None:
            parts.append(f"offset {self.offset}")
        if self.file is not None:
            parts.append(f"{self.file}:{self.line}" if self.line is not None else self.file)
        return " ".join(parts) if parts else "a record"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that could not be decoded, kept with its original bytes, coordinates and reason."""

    message: Message
    format_name: str
    reason: str
    field: str | None


@dataclass(frozen=True, slots=True)
class ControlEvent:
    """A message that is not a row change and goes to a side output, never into the changelog.

    ``kind`` is ``truncate`` (Debezium ``t``, OGG ``T``) or ``message`` (Debezium ``m``), ``schema-change``
    (a Canal or Maxwell DDL), ``init`` (Canal's INIT) or ``bootstrap`` (Maxwell's bootstrap markers);
    ``payload`` is the decoded envelope; ``metadata`` the format's requested metadata columns read from
    it (by output column name; a column not there is null).
    """

    kind: str
    message: Message
    payload: Mapping[str, Any]
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class FormatMetrics:
    """What became of the messages a decoder read.

    Every message lands in exactly one of ``changed_messages``, ``dead_letters``, ``events``,
    ``filtered``, ``tombstones`` and ``empty``: :meth:`accounted` adds them up to ``messages``.
    ``changes`` counts rows (an update is two), ``internal_errors`` the dead letters that are a bug in
    cdcflow (also counted in ``dead_letters``).
    """

    messages: int = 0
    tombstones: int = 0
    changes: int = 0
    changed_messages: int = 0
    events: int = 0
    dead_letters: int = 0
    internal_errors: int = 0
    filtered: int = 0
    empty: int = 0
    unavailable_values: int = 0
    filled_values: int = 0

    def accounted(self) -> int:
        """The messages with an outcome; equals ``messages`` (see :meth:`unaccounted`)."""
        return (
            self.changed_messages
            + self.dead_letters
            + self.events
            + self.filtered
            + self.tombstones
            + self.empty
        )

    def unaccounted(self) -> int:
        """Messages read that no outcome counter holds: 0 unless a message went missing."""
        return self.messages - self.accounted()


@dataclass
class DecodeOutput:
    """Where a decoder writes: the changelog, the side outputs and the counters."""

    changes: list[Change] = field(default_factory=list)
    events: list[ControlEvent] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    metrics: FormatMetrics = field(default_factory=FormatMetrics)


Decoded = list[Change] | ControlEvent | None


class Decoder(ABC):
    """Turns one message into changes. Subclasses implement :meth:`decode_message`.

    A failing message is all-or-nothing: either all its changes are written or none, and then it
    fails with a :class:`DecodeError` naming its coordinates, or (``ignore_parse_errors``) goes to the
    dead-letter output with its bytes and the reason.
    """

    format_name: str = "format"
    #: The output columns, in order, including requested metadata columns.
    schema: Schema

    def __init__(self, *, ignore_parse_errors: bool) -> None:
        self.ignore_parse_errors = ignore_parse_errors

    #: Whether an empty value (a tombstone) means something to this format (upsert-kafka: a delete).
    reads_tombstones: bool = False

    @abstractmethod
    def decode_message(self, message: Message, metrics: FormatMetrics) -> Decoded:
        """Return the changes of one message, a control event, or None for a filtered one."""

    def decode(self, message: Message, out: DecodeOutput) -> None:
        """Decode one message into ``out``; whatever goes wrong inside the format, the message ends as
        changes, a control event, a filtered or empty message, a tombstone or a dead letter (under
        ``ignore_parse_errors``), else a :class:`DecodeError` with its coordinates.

        Not dead-lettered, because the record is not at fault: :class:`NewColumnsError`, a
        :class:`~cdcflow.core.errors.CdcflowError` such as an unreachable Schema Registry, and
        MemoryError. An exception of another type is a bug in cdcflow: dead-lettered and counted in
        ``internal_errors``, or raised as is when :data:`STRICT_DECODE_ENV` is set (the test suite).
        """
        metrics = out.metrics
        if not self.reads_tombstones and (message.value is None or not message.value.strip()):
            metrics.messages += 1
            metrics.tombstones += 1
            return
        try:
            decoded = self._decode_exactly_if_needed(message, metrics)
        except NewColumnsError as error:
            error.origin = message.origin()
            raise
        except SkippedRecord as error:
            self._dead_letter(message, out, error.reason, error.field or None)
            return
        except _RECORD_ERRORS as error:
            reason, path = _reason(error)
            self._reject(message, out, reason, path, None)
            return
        except (MemoryError, CdcflowError):
            raise
        except Exception as error:
            if strict_decode():
                raise
            out.metrics.internal_errors += 1
            reason = (
                f"internal error in cdcflow ({type(error).__name__}: {exception_text(error, 300)}); "
                "this is a cdcflow bug, please report it with this record"
            )
            self._reject(message, out, reason, None, error)
            return
        metrics.messages += 1
        if decoded is None:
            metrics.filtered += 1
            return
        if isinstance(decoded, ControlEvent):
            out.events.append(decoded)
            metrics.events += 1
            return
        if not decoded:
            metrics.empty += 1
            return
        out.changes.extend(decoded)
        metrics.changed_messages += 1
        metrics.changes += len(decoded)

    def _reject(
        self, message: Message, out: DecodeOutput, reason: str, path: str | None, cause: Exception | None
    ) -> None:
        if not self.ignore_parse_errors:
            raise DecodeError(
                self.format_name,
                message.origin(),
                _bounded(reason),
                field=path,
                value=message.value,
                key=message.key,
                ignore_option=f"{self.format_name}.ignore-parse-errors",
            ) from cause
        self._dead_letter(message, out, reason, path)

    def _dead_letter(self, message: Message, out: DecodeOutput, reason: str, path: str | None) -> None:
        out.dead_letters.append(DeadLetter(message, self.format_name, _bounded(reason), path))
        out.metrics.messages += 1
        out.metrics.dead_letters += 1

    def _decode_exactly_if_needed(self, message: Message, metrics: FormatMetrics) -> Decoded:
        try:
            return self.decode_message(message, metrics)
        except InexactNumber:
            # A JSON number has more digits than the double orjson read: decode again, exactly.
            token = _EXACT_NUMBERS.set(True)
            try:
                return self.decode_message(message, metrics)
            finally:
                _EXACT_NUMBERS.reset(token)

    def decode_all(self, messages: Iterable[Message]) -> DecodeOutput:
        out = DecodeOutput()
        for message in messages:
            self.decode(message, out)
        return out

    def failing_on_new_columns(self) -> Decoder:
        """This decoder, for columns inferred from earlier messages: a message whose own schema has a
        column the declared ones lack raises :class:`NewColumnsError` instead of dropping it. Formats
        whose messages carry no schema have nothing to check and return ``self``."""
        return self


def check_new_columns(declared: Schema, seen: Schema) -> None:
    """Raise :class:`NewColumnsError` with the columns of ``seen`` that ``declared`` lacks (nullable:
    the rows written before they appeared have no value), and those whose type ``seen`` widens (a
    larger integer, FLOAT to DOUBLE, DECIMAL precision: :func:`widens`), with their wider type."""
    new = tuple(
        Field(f.name, f.type)
        for f in seen
        if f.name not in declared or widens(declared.field(f.name).type, f.type)
    )
    if new:
        raise NewColumnsError(Schema(new))


#: What a record can be at fault for: the dead-letter cases.
_RECORD_ERRORS = (
    FieldError,
    DecodeError,
    SchemaError,
    ChangelogDataError,
    orjson.JSONDecodeError,
    UnicodeDecodeError,
)

#: Set to anything but "" or "0" (the test suite does, in ``tests/conftest.py``), an exception that is
#: not the record's fault is raised as is instead of becoming a dead letter, so tests never hide a bug.
STRICT_DECODE_ENV = "CDCFLOW_STRICT_DECODE"


def strict_decode() -> bool:
    return os.environ.get(STRICT_DECODE_ENV, "") not in ("", "0")


def _reason(error: Exception) -> tuple[str, str | None]:
    if isinstance(error, FieldError):
        return error.reason, error.field or None
    if isinstance(error, (ChangelogDataError, DecodeError)):
        return error.reason, error.field
    if isinstance(error, orjson.JSONDecodeError):
        return f"not valid JSON ({str(error.msg)[:200]} at character {error.pos})", None
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text ({exception_text(error)})", None
    return exception_text(error), None


def _bounded(reason: str) -> str:
    return reason if len(reason) <= MAX_REASON else reason[:MAX_REASON] + "..."


_EXACT_NUMBERS: ContextVar[bool] = ContextVar("cdcflow_exact_numbers", default=False)


def parse_json(data: bytes) -> Any:
    """JSON as orjson reads it; numbers as exact decimals while a decoder retries a message."""
    return loads_exact(data) if _EXACT_NUMBERS.get() else orjson.loads(data)


SCHEMA_INCLUDE = Option(
    "schema-include",
    boolean,
    False,
    "messages have Kafka Connect's {schema, payload} form (the JSON converter with schemas.enable)",
)


def connect_payload(
    envelope: dict[str, Any], *, schema_include: bool, format_name: str, marker: str
) -> tuple[dict[str, Any], Any]:
    """The payload and schema block of Kafka Connect's JSON converter form (``schemas.enable``).

    ``marker`` is a field every payload has: a message holding ``schema`` and ``payload`` but not it
    is the wrapped form read with ``schema-include`` off, which gets an error saying so.
    """
    if schema_include:
        payload = envelope.get("payload")
        if not isinstance(payload, dict):
            raise FieldError(
                "payload",
                "no {schema, payload} form here; if the topic's converter has schemas.enable=false, set "
                f"'{format_name}.schema-include'='false'",
            )
        return payload, envelope.get("schema")
    if "payload" in envelope and "schema" in envelope and marker not in envelope:
        raise FieldError(
            marker,
            "the message has the {schema, payload} form of Kafka Connect's JSON converter: set "
            f"'{format_name}.schema-include'='true'",
        )
    return envelope, None


def parse_json_object(data: bytes, what: str = "the message") -> dict[str, Any]:
    value = parse_json(data)
    if not isinstance(value, dict):
        raise FieldError("", f"{what} must be a JSON object, got {type(value).__name__}")
    return value


@dataclass(frozen=True, slots=True)
class Encoded:
    """One record to produce: key and value bytes (value None is a tombstone)."""

    key: bytes | None
    value: bytes | None


class Encoder(ABC):
    """Turns a changelog into the format's envelopes (TO_CHANGELOG plus serialisation).

    Encoders may buffer (a ``-U`` waits for its ``+U`` to be written as one update event):
    call :meth:`flush` at the end of a batch.
    """

    format_name: str = "format"

    @abstractmethod
    def encode(self, change: Change) -> list[Encoded]:
        """Encode one change; returns what can be written now."""

    def flush(self) -> list[Encoded]:
        return []

    @property
    def pairs_updates(self) -> bool:
        """A ``-U`` waits for its key's ``+U`` to make one event: both must reach the same encoder."""
        return False

    def encode_all(self, changes: Iterable[Change]) -> list[Encoded]:
        out: list[Encoded] = []
        for change in changes:
            out.extend(self.encode(change))
        out.extend(self.flush())
        return out


class EnvelopeEncoder(Encoder):
    """TO_CHANGELOG into ``{op, "before", "after"}`` envelopes, a ``-U`` waiting for its key's ``+U`` to
    make one update; subclasses write each envelope as the format's message in :meth:`_serialise`."""

    def __init__(self, op_field: str, op_mapping: Mapping[str, str], key_columns: Sequence[str]) -> None:
        self.key_columns = tuple(key_columns)
        self._engine = ToChangelog(
            plan_to_changelog(
                op=op_field,
                before="before",
                after="after",
                op_mapping=op_mapping,
                partition_by=self.key_columns or None,
                produces_full_deletes=True,
            )
        )

    def encode(self, change: Change) -> list[Encoded]:
        return [self._serialise(envelope) for envelope in self._engine.process(change)]

    def flush(self) -> list[Encoded]:
        return [self._serialise(envelope) for envelope in self._engine.flush()]

    @property
    def pairs_updates(self) -> bool:
        return self._engine.params.op_mapping.combines_updates

    @abstractmethod
    def _serialise(self, envelope: Mapping[str, Any]) -> Encoded:
        """One envelope of the engine as the format's message."""


def require_schema(schema: Schema | None, format_name: str) -> Schema:
    if schema is None:
        raise FormatOptionError(
            f"format '{format_name}' needs the table schema: pass it as a Spark DDL string, e.g. "
            "schema='id INT NOT NULL, name STRING'"
        )
    return schema


def check_key_columns(schema: Schema, key_columns: Sequence[str]) -> tuple[str, ...]:
    for column in key_columns:
        if column not in schema:
            raise FormatOptionError(f"key column '{column}' is not in the schema ({schema.names})")
    return tuple(key_columns)


@dataclass(frozen=True)
class MetadataColumn:
    """A metadata column a format can expose: its key (Flink's), type and where it sits.

    ``reads_headers``: its value comes from the Kafka record's headers, which a reader must then fetch.
    ``columnar``: the format's columnar decoder computes it too (a read asking for another one is
    decoded message by message).
    """

    key: str
    type: DataType
    description: str
    reads_headers: bool = False
    columnar: bool = False


def metadata_schema(
    available: Sequence[MetadataColumn], requested: Sequence[str], format_name: str
) -> tuple[str, ...]:
    """Check the requested metadata keys against the format's; returns them, in order."""
    known = [column.key for column in available]
    for key in requested:
        if key not in known:
            raise FormatOptionError(
                f"format '{format_name}' has no metadata column '{key}'; available: {', '.join(known)}"
            )
    return tuple(requested)


def metadata_column_name(key: str) -> str:
    """The output column of a metadata key: ``source.table`` → ``source_table``."""
    return key.replace(".", "_").replace("-", "_")


METADATA_MARK = "cdcflow.metadata"
"""The key under which a source marks a metadata column's field (its value: the metadata key), so that
a sink tells what describes the change (where, when, which envelope) from the row's own columns."""


def output_schema(physical: Schema, available: Sequence[MetadataColumn], metadata: Sequence[str]) -> Schema:
    """The table columns followed by the requested metadata columns."""
    by_key = {column.key: column for column in available}
    fields = list(physical.fields)
    for key in metadata:
        name = metadata_column_name(key)
        if name in physical:
            raise FormatOptionError(
                f"metadata column '{name}' ({key}) clashes with a table column of the same name"
            )
        fields.append(Field(name, by_key[key].type))
    return Schema(tuple(fields))
