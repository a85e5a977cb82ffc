"""The columns a driver inferred from a source's first messages, handed to the query's own planning
(the source option ``inferredColumns``), so the query samples no messages again and decodes with exactly
those columns. JSON, lossless (DDL is not: a variable-scale DECIMAL, TIMESTAMP_LTZ(p))."""

from __future__ import annotations

import json
from typing import Any

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.formats.types import DataType, Field, Schema, TypeKind

OPTION = "inferredColumns"


def encode(columns: Schema) -> str:
    return json.dumps([_field(f) for f in columns], separators=(",", ":"))


def decode(text: str) -> Schema:
    try:
        return Schema(tuple(_read_field(f) for f in json.loads(text)))
    except (ValueError, KeyError, TypeError) as error:
        raise ConnectorOptionError(
            f"option '{OPTION}' is not the columns cdcflow ingest writes there ({error}): leave it unset "
            "(the source infers the columns), or declare them with option 'columns'"
        ) from None


def _field(field: Field) -> dict[str, Any]:
    return {"name": field.name, "type": _type(field.type), "nullable": field.nullable}


def _type(data_type: DataType) -> dict[str, Any]:
    found: dict[str, Any] = {"kind": data_type.kind.name}
    if data_type.precision is not None:
        found["precision"] = data_type.precision
    if data_type.scale is not None:
        found["scale"] = data_type.scale
    for part in ("element", "key", "value"):
        inner = getattr(data_type, part)
        if inner is not None:
            found[part] = _type(inner)
    if data_type.fields:
        found["fields"] = [_field(f) for f in data_type.fields]
    return found


def _read_field(found: dict[str, Any]) -> Field:
    return Field(str(found["name"]), _read_type(found["type"]), bool(found["nullable"]))


def _read_type(found: dict[str, Any]) -> DataType:
    parts = {p: _read_type(found[p]) for p in ("element", "key", "value") if p in found}
    return DataType(
        TypeKind[found["kind"]],
        precision=found.get("precision"),
        scale=found.get("scale"),
        fields=tuple(_read_field(f) for f in found.get("fields", ())),
        **parts,
    )
