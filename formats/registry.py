"""Find a format by name: the built-in ones, then third-party ones from the ``cdcflow.formats``
entry-point group. Nothing registers itself on import.

Each factory class declares everything the rest of cdcflow knows of its format (name, aliases, Spark
source name, options, metadata columns, columnar decoder, where a message names its primary key and
its table); connectors read these declarations and never test a format's name. Adding a built-in format
is one line in ``_BUILTIN`` (docs/formats.md).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from functools import cache
from importlib.metadata import entry_points
from typing import Any, ClassVar

from cdcflow.formats.base import Decoder, Encoder, MetadataColumn, require_schema
from cdcflow.formats.errors import UnknownFormatError
from cdcflow.formats.options import OptionSet
from cdcflow.formats.source_tables import SourceTable
from cdcflow.formats.types import Schema

ENTRY_POINT_GROUP = "cdcflow.formats"

_BUILTIN = {
    "debezium-json": "cdcflow.formats.debezium.json:DebeziumJsonFormat",
    "debezium-avro-confluent": "cdcflow.formats.debezium.avro:DebeziumAvroFormat",
    "canal-json": "cdcflow.formats.flat_json.canal:CanalJsonFormat",
    "maxwell-json": "cdcflow.formats.flat_json.maxwell:MaxwellJsonFormat",
    "ogg-json": "cdcflow.formats.flat_json.ogg:OggJsonFormat",
    "generic": "cdcflow.formats.op_rows:GenericFormat",
    "upsert-kafka": "cdcflow.formats.upsert_kafka:UpsertKafkaFormat",
    "debezium-json-registry": "cdcflow.formats.debezium.json_registry:DebeziumJsonRegistryFormat",
}


class FormatFactory(ABC):
    """Owns a format's name and options and builds its decoders and encoders (on the driver)."""

    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    """Other names :func:`resolve_format` finds this format under."""
    spark_source: ClassVar[str]
    """The ``cdc-*`` Spark data source of a built-in format; its shim is ``pyspark_<name, - as _>``."""
    options: ClassVar[OptionSet]
    metadata_columns: ClassVar[tuple[MetadataColumn, ...]] = ()
    columnar_decoder: ClassVar[str | None] = None
    """``module:class`` of its decoder's columnar twin (``for_decoder``), loaded only where pyarrow is."""
    encoder_takes_topic: ClassVar[bool] = False
    """Whether :meth:`create_encoder` takes ``topic=``, the topic its registry subjects are named after."""

    @abstractmethod
    def create_decoder(
        self, options: Mapping[str, str], schema: Schema | None = None, metadata: Sequence[str] = ()
    ) -> Decoder:
        """Validate the options and build a picklable decoder."""

    @abstractmethod
    def create_encoder(
        self, options: Mapping[str, str], schema: Schema, key_columns: Sequence[str] = ()
    ) -> Encoder:
        """Validate the options and build an encoder for rows of ``schema``."""

    def primary_key(
        self, key: bytes | None, value: bytes | None, options: Mapping[str, str] | None = None
    ) -> tuple[str, ...] | None:
        """The primary-key columns one message names (its Kafka key's fields, or the list its envelope
        carries: :mod:`cdcflow.formats.primary_keys`), or None when it names none: then the user names
        them (``--key``). ``options``: the format's (a registry format's key schema is in its registry)."""
        return None

    def source_table(self, value: bytes | None) -> SourceTable | None:
        """The source table one message names (:mod:`cdcflow.formats.source_tables`), or None: then a
        whole-database job routes it by its topic's name."""
        return None

    def table_filter(self, table: SourceTable) -> dict[str, str] | None:
        """The format options that read only ``table``'s messages of a topic many tables share (Canal's
        and Maxwell's ``*.include``); None when the format reads one table per topic (Debezium's)."""
        return None

    def require_schema(self, schema: Schema | None) -> Schema:
        return require_schema(schema, self.name)

    @classmethod
    def has_metadata(cls, *keys: str) -> bool:
        """Whether the format exposes every one of the metadata columns ``keys``."""
        return set(keys) <= {column.key for column in cls.metadata_columns}


def resolve_format(name: str) -> FormatFactory:
    """The factory registered under ``name`` (built-in first, then the entry-point group)."""
    factory_class = _builtin(name)
    if factory_class is not None:
        return factory_class()
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.name == name:
            loaded = entry_point.load()
            factory = loaded() if isinstance(loaded, type) else loaded
            if not isinstance(factory, FormatFactory):
                raise UnknownFormatError(
                    f"entry point '{name}' in group '{ENTRY_POINT_GROUP}' is not a FormatFactory "
                    f"({entry_point.value})"
                )
            return factory
    raise UnknownFormatError(f"unknown format '{name}'; available: {', '.join(available_formats())}")


def available_formats() -> list[str]:
    third_party = [ep.name for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in _BUILTIN]
    return [*_BUILTIN, *sorted(third_party)]


@cache
def builtin_factories() -> tuple[type[FormatFactory], ...]:
    """The built-in factory classes, in registration order (this imports every built-in format)."""
    return tuple(load(target) for target in _BUILTIN.values())


def load(target: str) -> Any:
    """The object a ``module:attribute`` target names."""
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def _builtin(name: str) -> type[FormatFactory] | None:
    target = _BUILTIN.get(name)
    if target is not None:
        return load(target)  # type: ignore[no-any-return]
    return next((factory for factory in builtin_factories() if name in factory.aliases), None)
