"""``debezium-json-registry``'s writer schemas: each JSON Schema parsed once into the Connect block of
the envelope's ``before``/``after`` and, with ``validate``, a ``jsonschema`` validator."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cdcflow.formats.confluent import json_schema as json_schema_types
from cdcflow.formats.errors import MissingDependencyError, SchemaError


@dataclass(frozen=True)
class WriterSchema:
    """One writer schema, parsed once: its text, its Connect form and its validator."""

    text: str
    connect: dict[str, Any] | None
    """The envelope's ``before``/``after`` as a Connect schema block; None: read the declared columns."""
    validator: Any = field(default=None, compare=False)


def parse_writer(text: str, where: str, need_columns: bool, validate: bool) -> WriterSchema:
    try:
        parsed = json.loads(text)
    except ValueError as error:
        raise SchemaError(f"{where} is not JSON: {error}") from None
    if not isinstance(parsed, Mapping):
        raise SchemaError(f"{where} is not a JSON Schema object")
    try:
        block: dict[str, Any] | None = _envelope_block(parsed)
    except SchemaError as error:
        if need_columns:
            raise SchemaError(f"{where}: {error}") from None
        block = None  # the declared columns are read, as debezium-json without a schema block
    return WriterSchema(text, block, _validator(parsed, where) if validate else None)


def _envelope_block(envelope: Mapping[str, Any]) -> dict[str, Any]:
    """The Connect struct of the envelope's ``before`` and ``after`` (the rest is not typed)."""
    properties = envelope.get("properties")
    if not isinstance(properties, Mapping) or not ({"before", "after"} & properties.keys()):
        raise SchemaError(
            "the writer schema has neither an 'after' nor a 'before' property: is it a Debezium Envelope?"
        )
    fields = [
        {**json_schema_types.to_connect(properties[name], name), "field": name}
        for name in ("after", "before")
        if name in properties
    ]
    return {"type": "struct", "fields": fields}


def _validator(schema: Any, where: str) -> Any:
    try:
        from jsonschema import exceptions, validators
    except ImportError:
        raise MissingDependencyError("jsonschema", "kafka") from None
    relaxed = json_schema_types.relaxed_for_validation(schema)
    cls = validators.validator_for(relaxed)
    try:
        cls.check_schema(relaxed)
    except exceptions.SchemaError as error:
        raise SchemaError(f"{where} is not a valid JSON Schema: {error.message}") from None
    return cls(relaxed)
