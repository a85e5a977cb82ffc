"""Connector-level metadata columns: where each message came from (Kafka or a replayed file)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import pyarrow as pa
from pyspark.sql import types as st

from cdcflow.formats.base import METADATA_MARK, Message, metadata_column_name

HEADER = st.StructType([st.StructField("key", st.StringType()), st.StructField("value", st.BinaryType())])

CONNECTOR_METADATA: dict[str, st.DataType] = {
    "topic": st.StringType(),
    "partition": st.IntegerType(),
    "offset": st.LongType(),
    "timestamp": st.TimestampType(),
    "key": st.BinaryType(),
    "headers": st.ArrayType(HEADER),
    "file": st.StringType(),
    "line": st.LongType(),
}


def _timestamp_us(message: Message) -> int | None:
    return None if message.timestamp_ms is None else message.timestamp_ms * 1000


def _headers(message: Message) -> list[dict[str, object]] | None:
    if not message.headers:
        return None
    return [{"key": name, "value": value} for name, value in message.headers]


_VALUES: dict[str, Callable[[Message], object]] = {
    "topic": lambda m: m.topic,
    "partition": lambda m: m.partition,
    "offset": lambda m: m.offset,
    "timestamp": _timestamp_us,
    "key": lambda m: m.key,
    "headers": _headers,
    "file": lambda m: m.file,
    "line": lambda m: m.line,
}


def metadata_array(key: str, messages: Sequence[Message], arrow_type: pa.DataType) -> pa.Array:
    """One metadata column for ``messages`` (one value per message)."""
    value_of = _VALUES[key]
    values = [value_of(message) for message in messages]
    if key == "timestamp":
        return pa.array(values, type=pa.int64()).cast(arrow_type)
    return pa.array(values, type=arrow_type)


def marked(output: st.StructType, keys: Iterable[str]) -> st.StructType:
    """``output`` with the column of each metadata key (the connector's or the format's) marked in its
    field metadata (:data:`~cdcflow.formats.base.METADATA_MARK`); Spark carries the mark through
    projections and into ``toArrow``."""
    names = {metadata_column_name(key): key for key in keys}
    return st.StructType(
        [
            st.StructField(f.name, f.dataType, f.nullable, {**f.metadata, METADATA_MARK: names[f.name]})
            if f.name in names
            else f
            for f in output.fields
        ]
    )
