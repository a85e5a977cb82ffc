"""The payloads of Kafka Connect's ``{schema, payload}`` messages, for the columnar path.

With ``schemas.enable=true`` (Connect's default) JsonConverter writes every message as
``{"schema":<block>,"payload":<envelope>}``, compact, the block first: a table's messages repeat one
block per schema version, often larger than the envelope. A message that opens with a block's bytes
(:func:`~cdcflow.formats.debezium.json.schema_head`) has that block, and its envelope is the bytes
between them and the closing brace; Arrow's reader then parses the envelopes alone, as for
``schema-include=false``. That holds where the block converts the declared columns as the declared
schema does (:func:`~cdcflow.formats.debezium.json.converts_as_declared`); any other message sends its
block to the per-record decoder, which reads the block.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import orjson

from cdcflow.formats.debezium.json import SCHEMA_BLOCKS, converts_as_declared, schema_head
from cdcflow.formats.types import Schema

_NEWLINE, _RETURN, _OPEN_BRACE, _CLOSE_BRACE = 10, 13, 123, 125


class Payloads:
    """Strips the schema blocks a decoder of ``declared`` columns reads columnar from its messages."""

    def __init__(self, declared: Schema, *, fail_on_new_columns: bool) -> None:
        self.declared = declared
        self.fail_on_new_columns = fail_on_new_columns
        self._heads: list[tuple[bytes, bool]] = []
        """Blocks seen (most recent first): the bytes their messages open with, whether read columnar."""

    def __reduce__(self) -> tuple[Any, tuple[object, ...]]:
        return _rebuild, (self.declared, self.fail_on_new_columns)

    def of(self, values: Sequence[bytes | None]) -> list[bytes | None] | None:
        """Each message's envelope (a None or blank value as it is), or None when a message is not
        JsonConverter's form of a block read columnar."""
        return self._envelopes((value, 0, len(value) if value else 0) for value in values)

    def of_lines(self, block: bytes) -> list[bytes | None] | None:
        """:meth:`of` the lines of ``block`` (a ``\\r`` before a line break is not the message's), each
        compared where it lies in ``block``."""
        if not block:
            return self.of([block])
        view = np.frombuffer(block, dtype=np.uint8)
        breaks = np.flatnonzero(view == _NEWLINE)
        ends = np.append(breaks, len(block)) if not block.endswith(b"\n") else breaks
        starts = np.concatenate(([0], breaks[: len(ends) - 1] + 1))
        ends = ends - ((view[np.maximum(ends - 1, 0)] == _RETURN) & (ends > starts))
        spans = zip(starts.tolist(), ends.tolist(), strict=True)
        return self._envelopes((block, start, end) for start, end in spans)

    def _envelopes(self, messages: Iterable[tuple[bytes | None, int, int]]) -> list[bytes | None] | None:
        """:meth:`of` the messages ``data[start:end]`` (a None ``data``: a tombstone)."""
        envelopes: list[bytes | None] = []
        head: bytes | None = None
        for data, start, end in messages:
            if data is None or start == end or data[start] != _OPEN_BRACE:
                message = data if data is None else data[start:end]
                if message and message.strip():
                    return None
                envelopes.append(message)
                continue
            if head is None or not data.startswith(head, start, end):
                head = self._head(data[start:end])
                if head is None:
                    return None
            envelope = data[start + len(head) : end - 1]
            if data[end - 1] != _CLOSE_BRACE or not envelope.strip():
                return None  # a blank payload is not a tombstone: the per-record decoder refuses it
            envelopes.append(envelope)
        return envelopes

    def _head(self, value: bytes) -> bytes | None:
        for known, columnar in self._heads:
            if value.startswith(known):
                return known if columnar else None
        try:
            envelope = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
        head = schema_head(value, envelope)
        if head is None:
            return None
        columnar = converts_as_declared(
            self.declared, envelope["schema"], fail_on_new_columns=self.fail_on_new_columns
        )
        self._heads.insert(0, (head, columnar))
        del self._heads[SCHEMA_BLOCKS:]
        return head if columnar else None


def _rebuild(declared: Schema, fail_on_new_columns: bool) -> Payloads:
    return Payloads(declared, fail_on_new_columns=fail_on_new_columns)
