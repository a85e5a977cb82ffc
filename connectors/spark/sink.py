"""The ``cdc-*`` sinks: a changelog DataFrame → the format's envelopes (TO_CHANGELOG) → a Kafka topic.

Key = the primary key columns (``keyColumns``), an idempotent producer, and a batch that fails when a
delivery fails: at-least-once, as Spark's own Kafka sink; ``sink.delivery-guarantee=exactly-once``
writes each task's records in a Kafka transaction (:mod:`cdcflow.connectors.spark.sink_transactions`). An
update is written as ONE update event, and a key's changes in their order, or the write fails
(:mod:`cdcflow.connectors.spark.sink_order`): a ``-U`` and its ``+U`` in different tasks fail the task before
either is written; a key written by two tasks of one batch fails the batch at its commit.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.kafka import admin as kafka_admin
from cdcflow.connectors.kafka import options as kafka_options
from cdcflow.connectors.kafka import producer as kafka_producer
from cdcflow.connectors.spark.arrow_types import schema_of_struct
from cdcflow.connectors.spark.options import DeliveryGuarantee, split_options
from cdcflow.connectors.spark.sink_order import KeyHashes, UpdatePairs, check_disjoint_keys
from cdcflow.connectors.spark.sink_transactions import TaskTransaction, producer_defaults, task_identity
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
    producer_config: kafka_options.ClientConfig
    key_order_check: bool = True
    delivery: DeliveryGuarantee = DeliveryGuarantee.AT_LEAST_ONCE
    transactional_id_prefix: str | None = None
    #: A batch (not streaming) write's id, made on the driver: the marker's write id of its tasks.
    batch_write_id: str | None = None

    def __repr__(self) -> str:
        return redacted_repr(self)

    def encoder(self) -> Encoder:
        factory = resolve_format(self.format_name)
        if factory.encoder_takes_topic:
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
    #: Exactly-once: an earlier attempt of this task had committed the batch; this one wrote nothing.
    replayed: bool = False


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
    producer_config = kafka_admin.producer_config(options.kafka)
    delivery, prefix = options.get("sink.delivery-guarantee"), options.get("sink.transactional-id-prefix")
    _check_delivery(delivery, prefix, producer_config)
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
        delivery=delivery,
        transactional_id_prefix=prefix,
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


def _check_delivery(
    delivery: DeliveryGuarantee, prefix: str | None, producer: kafka_options.ClientConfig
) -> None:
    exactly_once = delivery is DeliveryGuarantee.EXACTLY_ONCE
    if prefix is not None and not exactly_once:
        raise ConnectorOptionError(
            f"option 'sink.transactional-id-prefix' is set but sink.delivery-guarantee is {delivery.value}: "
            "transactional ids are used only with sink.delivery-guarantee=exactly-once; set that, or drop "
            "the prefix"
        )
    if prefix is not None and not prefix.strip():
        raise ConnectorOptionError("option 'sink.transactional-id-prefix' is empty: give a name or drop it")
    if not exactly_once:
        return
    if producer.get("transactional.id") is not None:
        raise ConnectorOptionError(
            "option 'kafka.transactional.id' can't be given to a sink: with sink.delivery-guarantee="
            "exactly-once each task has its own id, <prefix>-<input partition>; set "
            "sink.transactional-id-prefix instead"
        )
    required = {"enable.idempotence": {"true"}, "acks": {"all", "-1"}}
    for setting, allowed in required.items():
        value = producer.get(setting)
        if value is not None and value.strip().lower() not in allowed:
            raise ConnectorOptionError(
                f"option 'kafka.{setting}={value}' contradicts sink.delivery-guarantee=exactly-once, which "
                f"needs {setting}={sorted(allowed)[0]}: drop the option or set "
                "sink.delivery-guarantee=at-least-once"
            )
    timeout = producer.get("transaction.timeout.ms")
    if timeout is not None and (not timeout.strip().isdigit() or int(timeout) <= 0):
        raise ConnectorOptionError(
            f"option 'kafka.transaction.timeout.ms={timeout}' must be a positive number of milliseconds, "
            "at most the brokers' transaction.max.timeout.ms (default 900000)"
        )


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
    task = _task_partition()
    if plan.delivery is not DeliveryGuarantee.EXACTLY_ONCE:
        with kafka_producer.KafkaProducerSink(
            plan.producer_config, plan.topic, producer_defaults(plan.delivery)
        ) as producer:
            return _write(plan, batches, task, producer)
    transaction = TaskTransaction(
        plan.producer_config, plan.topic, task_identity(plan.batch_write_id), plan.transactional_id_prefix
    )
    try:
        with transaction.producer:
            if transaction.start():
                # The checks still run: the driver's check of the replayed batch sees every key.
                return replace(_write(plan, batches, task, None), records=0, replayed=True)
            counts = _write(plan, batches, task, transaction.producer)
            transaction.commit()
            return counts
    finally:
        transaction.close()


def _write(
    plan: WritePlan,
    batches: Iterator[pa.RecordBatch],
    task: int | None,
    producer: kafka_producer.KafkaProducerSink | None,
) -> WriteCounts:
    """Encode and queue a task's changes (only check them without a producer)."""
    encoder = plan.encoder()
    pairs = UpdatePairs(plan.key_columns, pairs_updates=encoder.pairs_updates, task=task)
    keys = KeyHashes()
    changes = records = 0

    def send(encoded: Sequence[Encoded]) -> None:
        nonlocal records
        if producer is not None:
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
            if producer is not None:
                send(encoder.encode(change))
    pairs.finish()
    if producer is not None:
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
        self.plan = replace(plan, batch_write_id=uuid.uuid4().hex)

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
        """Every record was acknowledged by Kafka (exactly-once: committed) before its task ended; what
        is left is the check that no key was written by two tasks (which would leave its changes
        without an order)."""
        check_batch(self.plan, messages, f"micro-batch {batchId}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Records already delivered stay in the topic; a retried batch writes again (at-least-once),
        or, exactly-once, only its tasks that had not committed."""
