"""``debezium-json-registry``'s options, parsed once on the driver into a
:class:`DebeziumJsonRegistryConfig`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cdcflow.formats.base import check_key_columns
from cdcflow.formats.confluent.client import (
    CONNECTION_OPTIONS,
    URL,
    RegistryConfig,
    registry_config,
    schema_id,
)
from cdcflow.formats.debezium.envelope import DEBEZIUM_OPTIONS, check_metadata, output_schema
from cdcflow.formats.debezium.json import DebeziumJsonConfig
from cdcflow.formats.debezium.json_registry_writer import parse_writer
from cdcflow.formats.errors import FormatOptionError, SchemaError
from cdcflow.formats.json_encode import IGNORE_PARSE_ERRORS
from cdcflow.formats.options import Option, OptionSet, boolean, optional_string
from cdcflow.formats.redact import redacted_repr
from cdcflow.formats.types import Schema

NAME = "debezium-json-registry"


OPTIONS = OptionSet(
    NAME,
    [
        URL,
        Option(
            "subject",
            optional_string,
            None,
            "the subject the encoder registers its writer schema under (default: <topic>-value)",
        ),
        Option("schema", optional_string, None, "the writer JSON Schema, instead of the registry"),
        Option(
            "schema-id",
            schema_id,
            None,
            "the id of the 'schema' option's schema: decoding uses it for this id only (other ids go to the "
            "registry); encoding writes this id instead of registering",
        ),
        Option(
            "validate",
            boolean,
            False,
            "check each record against its writer schema (jsonschema); one that fails is a bad record",
        ),
        *CONNECTION_OPTIONS,
        IGNORE_PARSE_ERRORS,
        *DEBEZIUM_OPTIONS,
    ],
)


@dataclass(frozen=True)
class DebeziumJsonRegistryConfig:
    envelope: DebeziumJsonConfig
    """debezium-json's settings (``schema-include`` on: the writer schema is the schema block)."""
    registry: RegistryConfig = ()
    subject: str | None = None
    writer_schema: str | None = None
    schema_id: int | None = None
    validate: bool = False

    @property
    def url(self) -> str | None:
        return dict(self.registry).get("url")

    def __repr__(self) -> str:
        return redacted_repr(self)

    @classmethod
    def from_options(
        cls, options: Mapping[str, str], schema: Schema | None, metadata: Sequence[str] = ()
    ) -> DebeziumJsonRegistryConfig:
        values = OPTIONS.parse(options)
        envelope = DebeziumJsonConfig(
            schema=schema,
            schema_include=True,
            ignore_parse_errors=values["ignore-parse-errors"],
            mode=values["changelog-mode"],
            unavailable=values["unavailable-values"],
            key_columns=values["key-columns"],
            metadata=check_metadata(metadata, NAME),
        )
        config = cls(
            envelope=envelope,
            registry=registry_config(values, NAME),
            subject=values["subject"],
            writer_schema=values["schema"],
            schema_id=values["schema-id"],
            validate=values["validate"],
        )
        if schema is not None:
            check_key_columns(schema, envelope.key_columns)
            output_schema(
                schema, envelope.metadata, unavailable=envelope.unavailable, key_columns=envelope.key_columns
            )
        if config.writer_schema is not None:
            try:
                parse_writer(config.writer_schema, f"option '{NAME}.schema'", schema is None, False)
            except SchemaError as error:
                raise FormatOptionError(str(error)) from None
        return config
