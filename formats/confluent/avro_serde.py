"""Confluent's Avro wire format through confluent-kafka's serde, with our writer schemas and types.

Reading: confluent-kafka's framing (``dual_schema_id_deserializer``: the magic byte and schema id of
the payload, or a schema-id header) finds the writer schema id; :class:`WriterSchemas` has the schema
from the format's options (``schema`` + ``schema-id``: no registry, as Spark executors cannot share a
``mock://`` registry) or the Schema Registry (:mod:`.client`), parsed once per id, and the
body is read by fastavro's ``schemaless_reader``, as ``AvroDeserializer`` does. Not through
``AvroDeserializer`` itself: it expands the reader schema on every record, which halves the decode
rate (docs/formats.md has the numbers). The schema is read with its ``logicalType`` attributes
removed, so records arrive as raw Avro values (a decimal's unscaled bytes, a timestamp's integer)
and the Connect types of the writer schema are applied afterwards (:mod:`avro_types`).

Writing: confluent-kafka's ``AvroSerializer`` registers the schema under the subject on the first
record (or writes the format's fixed ``schema-id``) and frames the body. It is handed a
:class:`_Registration` in place of the registry client, which answers a registration with the fixed
id, else asks the registry. The serializer writes the raw values with the schema's logical types left
out (the Avro binary is the same; fastavro's logical-type checks halve the rate), and the schema is
registered as given, logical types included.

Serdes and clients are built lazily in each process and never pickled.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import fastavro

from cdcflow.formats.confluent import avro_types
from cdcflow.formats.confluent.client import (
    RegistryConfig,
    fetch_schema,
    registry_client,
    schema_id_of,
    shown_url,
)
from cdcflow.formats.debezium.envelope import coerce_converter
from cdcflow.formats.errors import EncodeError, FieldError, FormatError, MissingDependencyError, SchemaError
from cdcflow.formats.json_decode import RowConverter
from cdcflow.formats.lru import SCHEMA_CACHE_SIZE, LruCache
from cdcflow.formats.redact import redact
from cdcflow.formats.types import Schema

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import RegisteredSchema, SchemaRegistryClient
    from confluent_kafka.schema_registry import Schema as RegistrySchema

T = TypeVar("T")


def _serde() -> Any:
    try:
        from confluent_kafka.schema_registry import avro
    except ImportError:
        raise MissingDependencyError("confluent-kafka", "kafka") from None
    return avro


def expanded_schema(text: str, where: str) -> Any:
    """An Avro schema's JSON with its named types expanded in place (their attributes kept)."""
    try:
        return fastavro.parse_schema(json.loads(text), expand=True)
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as error:
        raise SchemaError(f"{where} is not a valid Avro schema: {error}") from None


def declared_rows(text: str, declared: Schema, where: str) -> RowConverter:
    """A converter of the raw values of record schema ``text`` to the ``declared`` columns, each read
    with its Connect type and then converted exactly to the declared type; every column must be there."""
    physical, converters = avro_types.record_columns(expanded_schema(text, where))
    chosen = {}
    for column in declared:
        if column.name not in physical:
            raise SchemaError(f"{where} has no field '{column.name}' (it has {physical.names})")
        source = physical.field(column.name).type
        chosen[column.name] = coerce_converter(converters[column.name], source, column.type, column.name)
    return RowConverter(declared, converters=chosen)


class WriterSchemas(Generic[T]):
    """Writer schemas by id: the format's ``schema`` option (for ``schema-id`` only, when given), else
    the registry's; each id's schema is fetched, parsed and made into a ``T`` (by ``load``) once.

    ``load(text, where)`` raises :class:`FieldError` for a schema the format cannot use.
    """

    def __init__(
        self,
        registry: RegistryConfig,
        prefix: str,
        load: Callable[[str, str], T],
        explicit: tuple[str, T] | None = None,
        explicit_id: int | None = None,
    ) -> None:
        self.registry = registry
        self.prefix = prefix
        self._load = load
        self._explicit = explicit
        self._explicit_id = explicit_id
        self._entries: LruCache[int, tuple[Any, T]] = LruCache(SCHEMA_CACHE_SIZE)

    def get(self, schema_id: int) -> tuple[Any, T]:
        """(fastavro's parsed schema without logical types, the format's ``T``) of ``schema_id``."""
        entry = self._entries.get(schema_id)
        if entry is None:
            entry = self._entry(schema_id)
            self._entries.put(schema_id, entry)
        return entry

    def _entry(self, schema_id: int) -> tuple[Any, T]:
        explicit = self._explicit
        if explicit is not None and self._explicit_id in (None, schema_id):
            text, loaded = explicit
        elif not self.registry:
            given = f" (the '{self.prefix}.schema' option is for id {self._explicit_id})" if explicit else ""
            raise FieldError(
                "",
                f"unknown schema id {schema_id}{given}: set '{self.prefix}.url' to fetch writer schemas from "
                f"the Schema Registry, or '{self.prefix}.schema' (and '{self.prefix}.schema-id') to this "
                "id's writer schema",
            )
        else:
            text = fetch_schema(self.registry, schema_id, "AVRO", self.prefix)
            loaded = self._load(text, f"writer schema {schema_id}")
        try:
            parsed = fastavro.parse_schema(avro_types.strip_logical_types(json.loads(text)))
        except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as error:
            raise FieldError("", f"writer schema {schema_id} is not a valid Avro schema: {error}") from None
        return parsed, loaded


class AvroReader(Generic[T]):
    """Confluent-framed Avro → (the writer schema's ``T``, the record's raw Avro values)."""

    def __init__(self, schemas: WriterSchemas[T], other_format: str = "JSON: debezium-json") -> None:
        self.schemas = schemas
        self._other_format = other_format  # named in the error of a message that is not Avro
        try:
            from confluent_kafka.schema_registry import dual_schema_id_deserializer
            from confluent_kafka.schema_registry.serde import SchemaId
        except ImportError:
            raise MissingDependencyError("confluent-kafka", "kafka") from None
        self._framing = dual_schema_id_deserializer
        self._schema_id = SchemaId

    def read(self, data: bytes) -> tuple[T, Any]:
        schema_id_of(data, "Avro serializer", self._other_format)  # a clear error first
        schema_id = self._schema_id("AVRO")
        body = self._framing(data, None, schema_id)
        if schema_id.id is None:  # a schema GUID (magic byte 1), which schema_id_of turns away
            raise FieldError("", "the message names its writer schema by GUID, not by id")
        parsed, loaded = self.schemas.get(schema_id.id)
        try:
            return loaded, fastavro.schemaless_reader(body, parsed, None)
        except (EOFError, ValueError, IndexError, UnicodeDecodeError) as error:
            raise FieldError(
                "",
                f"the Avro body does not match writer schema {schema_id.id} ({type(error).__name__}: "
                f"{error})",
            ) from None


class _Registration:
    """What ``AvroSerializer`` asks of a registry client: a fixed id answers every registration."""

    def __init__(self, registry: RegistryConfig, prefix: str, fixed_id: int | None, schema_text: str) -> None:
        self.registry = registry
        self.prefix = prefix
        self.fixed_id = fixed_id
        self.schema_text = schema_text  # registered as given, logical types included

    def register_schema_full_response(
        self, subject_name: str, schema: RegistrySchema, normalize_schemas: bool = False
    ) -> RegisteredSchema:
        from confluent_kafka.schema_registry import RegisteredSchema
        from confluent_kafka.schema_registry import Schema as RegistrySchema

        given = RegistrySchema(self.schema_text, "AVRO")
        if self.fixed_id is not None:
            return RegisteredSchema(subject_name, None, self.fixed_id, None, given)
        try:
            return registry_client(self.registry).register_schema_full_response(
                subject_name, given, normalize_schemas
            )
        except Exception as error:  # registry refusals and transport errors alike
            raise FormatError(
                f"{self.prefix}: cannot register the writer schema under subject '{subject_name}' at the "
                f"Schema Registry {shown_url(self.registry)} ({type(error).__name__}: "
                f"{redact(str(error), self.registry)}). Check '{self.prefix}.url', the credentials and the "
                f"subject's compatibility, or set '{self.prefix}.schema-id'"
            ) from None

    def config(self) -> dict[str, Any]:
        return {}


class AvroWriter:
    """Records → Confluent-framed Avro through ``AvroSerializer``: the schema registered under
    ``subject`` on the first record, or written with ``fixed_id``."""

    def __init__(
        self, registry: RegistryConfig, prefix: str, schema_text: str, subject: str, fixed_id: int | None
    ) -> None:
        self.prefix = prefix
        self.subject = subject
        # The serializer writes raw values with the schema's logical types left out (fastavro's writer
        # would check each value against them: half the speed) and registers the schema as given.
        raw = json.dumps(avro_types.strip_logical_types(json.loads(schema_text)))
        self._serializer = _serde().AvroSerializer(
            cast("SchemaRegistryClient", _Registration(registry, prefix, fixed_id, schema_text)),
            raw,
            conf={"auto.register.schemas": True, "subject.name.strategy": self._subject},
        )

    def _subject(self, ctx: object, record_name: object) -> str:
        return self.subject

    def write(self, datum: dict[str, Any], what: str) -> bytes:
        from confluent_kafka.serialization import SerializationError

        try:
            out = self._serializer(datum, None)
        except (ValueError, TypeError, AttributeError, OverflowError, SerializationError) as error:
            raise EncodeError(
                f"{self.prefix}: cannot write {what} as Avro ({type(error).__name__}: {error})"
            ) from None
        assert out is not None  # noqa: S101 - a record is never None
        return bytes(out)
