"""The columns ``ingest`` added to the inferred ones, kept in the checkpoint for the processes after it.

A query's columns are inferred from the first messages when it starts; a column added upstream later,
or one whose type widens (INT to BIGINT, FLOAT to DOUBLE, DECIMAL precision), stops it
(:class:`~cdcflow.connectors.errors.SchemaChangedError`) and ``ingest`` starts it again with the
column (the source option ``addedColumns``). The columns are recorded as DDL in
``<checkpoint>/cdcflow-added-columns``, so that the next process starts with them instead of meeting
each again and restarting its query once more.
"""

from __future__ import annotations

import logging

from cdcflow.connectors.lakehouse.delta.storage import Storage, join
from cdcflow.formats.errors import SchemaError
from cdcflow.formats.types import Field, Schema, parse_ddl, widens

FILE = "cdcflow-added-columns"

log = logging.getLogger("cdcflow.connectors.lakehouse")


def recorded(checkpoint: str, storage: Storage) -> str | None:
    """The added columns recorded in ``checkpoint`` (DDL), None when there are none (or the record is
    unreadable: the columns are then met again, as before there was one)."""
    text = (storage.read_text(join(checkpoint, FILE)) or "").strip()
    if not text:
        return None
    try:
        parse_ddl(text)
    except SchemaError as error:
        log.warning("cdcflow ingest: ignoring %s: %s", join(checkpoint, FILE), error)
        return None
    return text


def record(checkpoint: str, storage: Storage, columns_ddl: str) -> None:
    storage.write_text(join(checkpoint, FILE), columns_ddl + "\n")


def merged(*columns_ddl: str | None) -> str:
    """The columns of the DDL texts, each name once where it first appears, of the type a later text
    widens it to (an inferred column whose type widened upstream is listed again, wider)."""
    fields: dict[str, Field] = {}
    for text in filter(None, columns_ddl):
        for field in parse_ddl(text):
            known = fields.get(field.name)
            if known is None or widens(known.type, field.type):
                fields[field.name] = field
    return Schema(tuple(fields.values())).ddl()
