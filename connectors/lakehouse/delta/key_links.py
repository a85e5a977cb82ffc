"""Key links: the JSON of the other key a primary-key change names, read as key tuples and written back."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

log = logging.getLogger(__name__)

Key = tuple[Any, ...]


def canonical(values: Key) -> str:
    """A key's values as one comparable text (how the key state names an old key)."""
    return json.dumps(list(values), default=str, separators=(",", ":"))


def link_text(key: Sequence[str], values: Key) -> str:
    """``values`` of ``key`` as a key link's JSON (what :func:`parse` reads)."""
    return json.dumps(dict(zip(key, values, strict=True)), default=str, separators=(",", ":"))


def parse(
    texts: list[Any],
    key: Sequence[str],
    key_types: Sequence[pa.DataType],
    batch_id: int,
    *,
    warn: bool = True,
) -> list[Key | None]:
    """Key JSON texts (``{"id": 2}``) as key tuples of the batch's key types (``warn``: log the texts
    that name no key, once per batch: the walk's parse does, a look-ahead's does not)."""
    parsed: list[list[Any] | None] = []
    for text in texts:
        if text is None:
            parsed.append(None)
            continue
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("payload"), dict) and "schema" in obj:
            obj = obj["payload"]
        if not isinstance(obj, dict) or any(c not in obj for c in key):
            if warn:
                log.warning(
                    "batch %d: key link %r does not name the key columns %s; ignored",
                    batch_id,
                    str(text)[:80],
                    ", ".join(key),
                )
            parsed.append(None)
            continue
        parsed.append([obj[c] for c in key])
    columns = []
    for i, kind in enumerate(key_types):
        values = [p[i] if p is not None else None for p in parsed]
        try:
            columns.append(pa.array(values).cast(kind).to_pylist())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            try:
                columns.append(pa.array(values, kind).to_pylist())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                if warn:
                    log.warning(
                        "batch %d: key links give %s values Arrow cannot read as %s; the key changes "
                        "of this batch carry no values",
                        batch_id,
                        key[i],
                        kind,
                    )
                return [None] * len(parsed)
    return [tuple(col[j] for col in columns) if parsed[j] is not None else None for j in range(len(parsed))]
