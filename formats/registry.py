"""Find a format by name: the built-in ones, then third-party ones from the ``cdcflow.formats``
entry-point group. Nothing registers itself on import."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import ClassVar

from cdcflow.formats.base import Decoder, Encoder, MetadataColumn, require_schema
from cdcflow.formats.errors import UnknownFormatError
from cdcflow.formats.options import OptionSet
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
    options: ClassVar[OptionSet]
    metadata_columns: ClassVar[tuple[MetadataColumn, ...]] = ()

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

    def require_schema(self, schema: Schema | None) -> Schema:
        return require_schema(schema, self.name)


def resolve_format(name: str) -> FormatFactory:
    """The factory registered under ``name`` (built-in first, then the entry-point group)."""
    target = _BUILTIN.get(name)
    if target is not None:
        module_name, _, class_name = target.partition(":")
        factory_class = getattr(importlib.import_module(module_name), class_name)
        return factory_class()  # type: ignore[no-any-return]
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
