"""The source table a message comes from, as its envelope names it, for routing many tables.

Debezium names it in ``source`` (``db``, ``schema`` where the database has one, ``table``), inside the
payload of Kafka Connect's ``{"schema", "payload"}`` form too; Canal and Maxwell in the envelope's
``database`` and ``table``; OGG in ``table`` as ``SCHEMA.TABLE``. A message that names none (a
tombstone, a heartbeat) gives None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdcflow.formats.primary_keys import json_object


@dataclass(frozen=True)
class SourceTable:
    """A table of the source database: ``db.schema.table`` where there is a schema, else ``db.table``."""

    db: str | None
    schema: str | None
    table: str

    @property
    def qualified(self) -> str:
        return ".".join(part for part in (self.db, self.schema, self.table) if part)


def debezium_table(value: bytes | None) -> SourceTable | None:
    """The table of a Debezium JSON envelope (either JsonConverter form), from its ``source`` block."""
    envelope = json_object(value)
    if envelope is not None and set(envelope) == {"schema", "payload"}:
        envelope = envelope["payload"] if isinstance(envelope["payload"], dict) else None
    source = envelope.get("source") if envelope is not None else None
    if not isinstance(source, Mapping):
        return None
    return _table(source.get("db"), source.get("schema"), source.get("table"))


def envelope_table(value: bytes | None, database: str | None, table: str) -> SourceTable | None:
    """The table a flat envelope names in its fields ``database`` (None: none) and ``table``; a table
    written ``SCHEMA.TABLE`` (OGG's) gives the schema."""
    envelope = json_object(value)
    if envelope is None:
        return None
    name = envelope.get(table)
    if database is None and isinstance(name, str) and "." in name:
        schema, _, name = name.rpartition(".")
        return _table(None, schema, name)
    return _table(envelope.get(database) if database else None, None, name)


def _table(db: Any, schema: Any, table: Any) -> SourceTable | None:
    if not isinstance(table, str) or not table:
        return None
    return SourceTable(_name(db), _name(schema), table)


def _name(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
