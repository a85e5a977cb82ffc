"""Consecutive Kafka records of one partition, field by field.

A consume call returns thousands of records; the columnar decoder needs their values as a list and
the metadata columns as arrays, so a chunk keeps each field as a list instead of a
:class:`~cdcflow.formats.base.Message` per record (~3 µs a record to build and read back). Messages
are built only for a block the per-record decoder takes (a placeholder, a bad record, a control event).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.formats.base import Headers, Message


@dataclass(slots=True)
class RecordChunk:
    topic: str
    partition: int
    offsets: list[int]
    values: list[bytes | None]
    keys: list[bytes | None]
    timestamps_ms: list[int | None]
    headers: list[Headers] | None
    """None when the reader did not ask for headers (every record's are then empty)."""

    def __len__(self) -> int:
        return len(self.values)

    @classmethod
    def of(cls, topic: str, partition: int, messages: Sequence[Message], *, headers: bool) -> RecordChunk:
        return cls(
            topic,
            partition,
            [m.offset for m in messages],  # type: ignore[misc]
            [m.value for m in messages],
            [m.key for m in messages],
            [m.timestamp_ms for m in messages],
            [m.headers for m in messages] if headers else None,
        )

    def messages(self) -> list[Message]:
        topic, partition = self.topic, self.partition
        return [
            Message(value, key, topic, partition, offset, timestamp, record_headers)
            for value, key, offset, timestamp, record_headers in zip(
                self.values, self.keys, self.offsets, self.timestamps_ms, self.record_headers(), strict=True
            )
        ]

    def record_headers(self) -> list[Headers]:
        return self.headers if self.headers is not None else [()] * len(self.values)

    def extend(self, other: RecordChunk) -> None:
        if (self.topic, self.partition) != (other.topic, other.partition) or (self.headers is None) != (
            other.headers is None
        ):
            raise ValueError("only chunks of one partition, read with the same headers setting, are joined")
        self.offsets.extend(other.offsets)
        self.values.extend(other.values)
        self.keys.extend(other.keys)
        self.timestamps_ms.extend(other.timestamps_ms)
        if self.headers is not None and other.headers is not None:
            self.headers.extend(other.headers)

    def metadata_array(self, key: str, arrow_type: pa.DataType) -> pa.Array:
        """One metadata column (as :func:`cdcflow.connectors.spark.metadata.metadata_array` gives it)."""
        count = len(self.values)
        if key == "topic":
            return pa.array([self.topic] * count, type=arrow_type)
        if key == "partition":
            return pa.array([self.partition] * count, type=arrow_type)
        if key == "offset":
            return pa.array(self.offsets, type=arrow_type)
        if key == "timestamp":
            return pc.multiply_checked(pa.array(self.timestamps_ms, type=pa.int64()), 1000).cast(arrow_type)
        if key == "key":
            return pa.array(self.keys, type=arrow_type)
        if key == "headers":
            return pa.array(
                [[{"key": n, "value": v} for n, v in h] if h else None for h in self.record_headers()],
                type=arrow_type,
            )
        if key in ("file", "line"):
            return pa.nulls(count, arrow_type)  # a Kafka record is no file's
        raise KeyError(key)


def blocks(chunks: Iterable[RecordChunk], size: int) -> Iterator[RecordChunk]:
    """``chunks`` joined into blocks of about ``size`` records: consecutive chunks of one partition
    are joined while the block stays within ``size``; a chunk is never cut, so one larger than
    ``size`` is a block of its own (a range reader's chunks hold at most 5,000 records)."""
    pending: RecordChunk | None = None
    for chunk in chunks:
        if not chunk.values:
            continue
        if (
            pending is not None
            and len(pending) + len(chunk) <= size
            and (pending.topic, pending.partition) == (chunk.topic, chunk.partition)
            and (pending.headers is None) == (chunk.headers is None)
        ):
            pending.extend(chunk)
            continue
        if pending is not None:
            yield pending
        pending = chunk  # a reader's chunks are its caller's: joined in place
    if pending is not None:
        yield pending
