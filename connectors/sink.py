"""The ``cdc-*`` sinks: a changelog DataFrame → the format's envelopes (TO_CHANGELOG) → a Kafka topic.

Key = the primary key columns (``keyColumns``), an idempotent producer, and a batch that fails when a
delivery fails: at-least-once, as Spark's own Kafka sink. An update is written as ONE update event, and
a key's changes in their order, or the write fails (:mod:`cdcflow.connectors.sink_order`): a ``-U`` and
its ``+U`` in different tasks fail the task before either is written; a key written by two tasks of one
batch fails the batch at its commit.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from cdcflow.connectors import kafka_client
from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.sink_order import KeyHashes, UpdatePairs, check_disjoint_keys
from cdcflow.connectors.source_options import split_options
from cdcflow.connectors.spark_types import schema_of_struct
from cdcflow.core.keys import key_of
from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats.base import Encoded, Encoder
from cdcflow.formats.redact import redacted_repr
from cdcflow.formats.registry import resolve_format
from cdcflow.formats.types import DataType, Schema, TypeKind


@dataclass(frozen=True)
class WritePlan:
    format_name: str
    format_options: dict[str, str]
    table: Schema
    row_kind_column: str
    key_columns: tuple[str, ...]
    topic: str
    producer_config: kafka_client.ClientConfig
    key_order_check: bool = True

    def __repr__(self) -> str:
        return redacted_repr(self)

    def encoder(self) -> Encoder:
        factory = resolve_format(self.format_name)
        if self.format_name == "debezium-avro-confluent":
            return factory.create_encoder(  # type: ignore[call-arg]
                self.format_options, self.table, self.key_columns, topic=self.topic
            )
        return factory.create_encoder(self.format_options, self.table, self.key_columns)


@dataclass(frozen=True)
class WriteCounts(WriterCommitMessage):
    changes: int
    records: int
    #: The task's input partition, and its keys' hashes (:class:`KeyHashes`; empty without the check).
    task: int | None = None
    key_hashes: bytes = b""


def plan_write(format_name: str, raw: Mapping[str, str], schema: StructType) -> WritePlan:
    factory = resolve_format(format_name)
    options = split_options(raw, factory)
    row_kind = options.get("rowKindColumn")
    topic = options.get("topic")
    if topic is None:
        raise ConnectorOptionError("the sink needs option 'topic': the Kafka topic to write the envelopes to")
    source_only = sorted(key for key in options.kafka if not key.lower().startswith("kafka."))
    if source_only:
        raise ConnectorOptionError(
            f"{', '.join(source_only)}: Kafka source option(s), which a sink does not read; a sink takes "
            "kafka.* settings, 'topic' and 'keyColumns'"
        )
    producer_config = kafka_client.producer_config(options.kafka)
    if row_kind not in schema.fieldNames():
        raise ConnectorOptionError(
            f"the DataFrame has no '{row_kind}' column: a changelog needs the row kind (+I, -U, +U, -D) of "
            f"each row; columns are {schema.fieldNames()} (set rowKindColumn if it is named otherwise)"
        )
    table = schema_of_struct(StructType([f for f in schema.fields if f.name != row_kind]))
    plan = WritePlan(
        format_name=factory.name,
        format_options=options.format,
        table=table,
        row_kind_column=row_kind,
        key_columns=tuple(options.get("keyColumns")),
        topic=topic,
        producer_config=producer_config,
        key_order_check=options.get("keyOrderCheck"),
    )
    if not plan.key_columns:
        raise ConnectorOptionError(
            "the sink needs option 'keyColumns': the primary-key columns, which key the Kafka records and "
            "pair each -U with the +U of the same row"
        )
    for column in plan.key_columns:
        if column not in table:
            raise ConnectorOptionError(f"keyColumns names '{column}', which is not a column ({table.names})")
    plan.encoder()  # validates the format options on the driver
    return plan


def _python_value(data_type: DataType) -> Callable[[Any], Any] | None:
    """Arrow's Python values as the encoders take them (maps arrive as lists of pairs)."""
    kind = data_type.kind
    if kind is TypeKind.MAP:
        value = _python_value(data_type.value) if data_type.value is not None else None
        if value is None:
            return lambda pairs: None if pairs is None else dict(pairs)
        return lambda pairs: None if pairs is None else {k: value(v) for k, v in pairs}
    if kind is TypeKind.TIMESTAMP_LTZ:
        return lambda ts: None if ts is None else ts.astimezone(dt.UTC)
    if kind is TypeKind.ARRAY and data_type.element is not None:
        element = _python_value(data_type.element)
        if element is not None:
            return lambda items: None if items is None else [element(item) for item in items]
    if kind is TypeKind.STRUCT:
        inner = [(f.name, _python_value(f.type)) for f in data_type.fields]
        adapters = [(name, fn) for name, fn in inner if fn is not None]
        if adapters:

            def struct(row: Any) -> Any:
                if row is None:
                    return None
                out = dict(row)
                for name, fn in adapters:
                    out[name] = fn(out[name])
                return out

            return struct
    return None


def changes_of(batch: pa.RecordBatch, table: Schema, row_kind_column: str) -> Iterator[Change]:
    adapters = [(f.name, fn) for f in table if (fn := _python_value(f.type)) is not None]
    kinds = {kind.value: kind for kind in RowKind}
    for row in batch.to_pylist():
        short = row.pop(row_kind_column)
        kind = kinds.get(short) if isinstance(short, str) else None
        if kind is None:
            raise ConnectorOptionError(
                f"row kind {short!r} in column '{row_kind_column}' is not one of +I, -U, +U, -D"
            )
        for name, adapt in adapters:
            row[name] = adapt(row[name])
        yield Change(kind, row)


def _task_partition() -> int | None:
    from pyspark import TaskContext

    context = TaskContext.get()
    return None if context is None else context.partitionId()


def write_changes(plan: WritePlan, batches: Iterator[pa.RecordBatch]) -> WriteCounts:
    encoder = plan.encoder()
    task = _task_partition()
    pairs = UpdatePairs(plan.key_columns, pairs_updates=encoder.pairs_updates, task=task)
    keys = KeyHashes()
    changes = records = 0
    # Leaving the block with an error purges what is still queued; a half update is never queued.
    with kafka_client.KafkaProducerSink(plan.producer_config, plan.topic) as producer:

        def send(encoded: Sequence[Encoded]) -> None:
            nonlocal records
            for item in encoded:
                producer.produce(item.key, item.value)
            records += len(encoded)

        for batch in batches:
            for change in changes_of(batch, plan.table, plan.row_kind_column):
                key = key_of(change.row, plan.key_columns, changes)
                pairs.check(change, key, changes)
                if plan.key_order_check:
                    keys.add(key)
                changes += 1
                send(encoder.encode(change))
        pairs.finish()
        send(encoder.flush())
    return WriteCounts(changes, records, task, keys.packed())


def check_batch(plan: WritePlan, messages: Sequence[WriterCommitMessage | None], batch: str) -> None:
    """On the driver, before the batch counts as written: no key was written by two of its tasks."""
    if not plan.key_order_check:
        return
    reports = [
        (m.task if m.task is not None else index, m.key_hashes)
        for index, m in enumerate(messages)
        if isinstance(m, WriteCounts)
    ]
    check_disjoint_keys(reports, batch, plan.key_columns)


class KafkaChangelogWriter(DataSourceArrowWriter):
    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCounts:
        return write_changes(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        check_batch(self.plan, messages, "this write")


class KafkaChangelogStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCounts:
        return write_changes(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Every record was acknowledged by Kafka before its task ended; what is left is the check
        that no key was written by two tasks (which would leave its changes without an order)."""
        check_batch(self.plan, messages, f"micro-batch {batchId}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Records already delivered stay in the topic (at-least-once); a retried batch writes again."""
