"""Changes the applier leaves out, kept with the reason: one JSON-lines file per micro-batch.

``<directory>/batch-<N>.jsonl`` (the Delta sink's directory is ``<checkpoint>/cdcflow-dead-letters``) is
written before the batch's commits and replaced whenever the batch runs again, so a batch's dead letters
are there once however often a crash replays it. One record per change: ``reason``, the ``field`` at
fault, ``origin`` (``topic/partition@offset``, ``file:line`` or its place in the batch), ``batch``,
``row_kind`` and ``row`` (the change's columns; binaries as base64, dates and times as ISO text,
decimals as text).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from cdcflow.connectors.lakehouse.delta.batch import INTERNAL, ChangeBatch
from cdcflow.connectors.lakehouse.delta.storage import LOCAL, Storage, join

DEAD_LETTER_DIR = "cdcflow-dead-letters"
_PREFIX, _SUFFIX = "batch-", ".jsonl"


class DeadLetterFiles:
    """The dead-letter files of one sink, in ``directory`` (local, or on an object store)."""

    def __init__(self, directory: str, storage: Storage = LOCAL) -> None:
        self.directory = directory
        self.storage = storage

    def write(self, batch_id: int, letters: Sequence[Mapping[str, Any]]) -> None:
        text = "".join(json.dumps(letter, default=_as_text, ensure_ascii=False) + "\n" for letter in letters)
        self.storage.write_text(join(self.directory, f"{_PREFIX}{batch_id}{_SUFFIX}"), text)

    def read(self) -> list[dict[str, Any]]:
        """Every record, batch by batch."""
        names = [
            n for n in self.storage.names(self.directory) if n.startswith(_PREFIX) and n.endswith(_SUFFIX)
        ]
        records: list[dict[str, Any]] = []
        for name in sorted(names, key=lambda n: int(n[len(_PREFIX) : -len(_SUFFIX)])):
            text = self.storage.read_text(join(self.directory, name)) or ""
            records.extend(json.loads(line) for line in text.splitlines() if line)
        return records


def letters(batch: ChangeBatch, at: np.ndarray, reason: str, field: str) -> list[dict[str, Any]]:
    """The dead-letter records of ``batch``'s changes at positions ``at``."""
    columns = [c for c in batch.data.schema.names if not c.startswith(INTERNAL)]
    rows = batch.data.select(columns).take(pa.array(at, pa.int64())).to_pylist()
    return [
        {
            "reason": reason,
            "field": field,
            "origin": batch.where(int(position)),
            "batch": batch.batch_id,
            "row_kind": str(batch.kinds[position]),
            "row": row,
        }
        for position, row in zip(at.tolist(), rows, strict=True)
    ]


def _as_text(value: Any) -> str:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    return str(value)
