"""Exactly-once writes of the ``cdc-*`` sinks: one Kafka transaction per task and micro-batch.

Each task writes with a transactional producer whose ``transactional.id`` is
``<prefix>-<input partition>``: the same id for the same task of every batch and every attempt, so
``init_transactions`` fences a zombie of an earlier attempt and aborts its open transaction. The
task's marker — the query id and batch id it wrote — is committed in the same transaction, as the
offset (and its metadata) of the sink topic's partition 0 in the consumer group named after the
transactional id. A replayed task whose marker already names its batch writes nothing. This relies on
a replayed batch giving each input partition the same rows (see docs/connectors.md).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdcflow.connectors.errors import KafkaConnectorError
from cdcflow.connectors.kafka.options import ClientConfig
from cdcflow.connectors.kafka.producer import IDEMPOTENT, TRANSACTION_CALL_TIMEOUT_S, KafkaProducerSink
from cdcflow.connectors.spark.options import DeliveryGuarantee

if TYPE_CHECKING:
    from confluent_kafka import Consumer

log = logging.getLogger("cdcflow.connectors.kafka")

BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
TRANSACTION_TIMEOUT_MS = 900_000
"""The producer's default transaction.timeout.ms: the brokers' default transaction.max.timeout.ms,
so that a long task is not aborted by its coordinator."""
_MARKER_PARTITION = 0


def producer_defaults(guarantee: DeliveryGuarantee, transactional_id: str | None = None) -> dict[str, Any]:
    """The producer settings a guarantee needs (``kafka.*`` options override them)."""
    if guarantee is DeliveryGuarantee.NONE:
        return {"enable.idempotence": False, "acks": "1"}
    if guarantee is DeliveryGuarantee.AT_LEAST_ONCE:
        return dict(IDEMPOTENT)
    return {
        **IDEMPOTENT,
        "transactional.id": transactional_id,
        "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
    }


@dataclass(frozen=True)
class TaskIdentity:
    """Which write a task belongs to: the streaming query (or batch write) and batch, and its partition."""

    write: str
    batch: int
    partition: int

    def transactional_id(self, prefix: str | None) -> str:
        return f"{prefix or f'cdcflow-{self.write}'}-{self.partition}"


def task_identity(batch_write_id: str | None) -> TaskIdentity:
    """The running task's identity from Spark's task context: the streaming query id and batch id
    (local properties Spark sets on a micro-batch's jobs), else ``batch_write_id`` and batch 0."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise KafkaConnectorError("sink.delivery-guarantee=exactly-once writes only inside a Spark task")
    query, batch = context.getLocalProperty(QUERY_ID_PROPERTY), context.getLocalProperty(BATCH_ID_PROPERTY)
    if query and batch is not None:
        return TaskIdentity(query, int(batch), context.partitionId())
    if batch_write_id is None:
        raise KafkaConnectorError(
            "sink.delivery-guarantee=exactly-once: this task has no streaming query id and batch id "
            f"(Spark's local properties {QUERY_ID_PROPERTY}, {BATCH_ID_PROPERTY})"
        )
    return TaskIdentity(batch_write_id, 0, context.partitionId())


class TaskTransaction:
    """One task's transaction: :meth:`start` says whether an earlier attempt already committed the
    batch; else the records go to :attr:`producer` and :meth:`commit` commits them with the marker."""

    def __init__(self, client: ClientConfig, topic: str, identity: TaskIdentity, prefix: str | None) -> None:
        self.identity = identity
        self.topic = topic
        self.transactional_id = identity.transactional_id(prefix)
        self.client = client
        self.producer = KafkaProducerSink(
            client, topic, producer_defaults(DeliveryGuarantee.EXACTLY_ONCE, self.transactional_id)
        )
        self._markers: Consumer | None = None

    def start(self) -> bool:
        """Fence earlier attempts; True if this batch was committed by one of them (write nothing)."""
        self.producer.init_transactions()
        marker = self._committed_marker()
        if marker is not None and marker.get("write") == self.identity.write:
            written = marker.get("batch")
            if isinstance(written, int) and written >= self.identity.batch:
                log.info(
                    "%s: batch %d of %s was committed by an earlier attempt (marker: batch %d); "
                    "writing nothing",
                    self.transactional_id,
                    self.identity.batch,
                    self.identity.write,
                    written,
                )
                return True
        self.producer.begin_transaction()
        return False

    def commit(self) -> None:
        from confluent_kafka import TopicPartition

        marker = json.dumps({"write": self.identity.write, "batch": self.identity.batch})
        offset = TopicPartition(self.topic, _MARKER_PARTITION, self.identity.batch, metadata=marker)
        self.producer.flush()
        self.producer.send_offsets_to_transaction([offset], self._consumer().consumer_group_metadata())
        self.producer.commit_transaction()

    def close(self) -> None:
        if self._markers is not None:
            self._markers.close()
            self._markers = None

    def _consumer(self) -> Consumer:
        if self._markers is None:
            from confluent_kafka import Consumer

            config = {
                **self.client.as_dict(),
                "group.id": self.transactional_id,
                "isolation.level": "read_committed",  # waits for a pending transactional offset commit
                "enable.auto.commit": False,
                "logger": self.client.redacting(log),
            }
            self._markers = self.client.create(lambda: Consumer(config))
        return self._markers

    def _committed_marker(self) -> dict[str, Any] | None:
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        deadline = time.monotonic() + TRANSACTION_CALL_TIMEOUT_S
        while True:
            try:
                found = self._consumer().committed(
                    [TopicPartition(self.topic, _MARKER_PARTITION)], timeout=30
                )
                break
            except KafkaException as exception:
                error = exception.args[0] if exception.args else None
                if isinstance(error, KafkaError) and error.retriable() and time.monotonic() < deadline:
                    time.sleep(0.2)  # the group coordinator is loading or moving
                    continue
                raise KafkaConnectorError(
                    f"could not read the marker of transactional id '{self.transactional_id}' (consumer "
                    f"group of that name, topic '{self.topic}' partition {_MARKER_PARTITION}) from Kafka at "
                    f"{self.client.bootstrap_servers}: {self.client.explain(exception)}"
                ) from None
        if not found or found[0].offset < 0 or not found[0].metadata:
            return None
        try:
            marker = json.loads(found[0].metadata)
        except json.JSONDecodeError:
            marker = None
        if not isinstance(marker, dict):
            raise KafkaConnectorError(
                f"consumer group '{self.transactional_id}' holds offset metadata {found[0].metadata[:80]!r} "
                f"for topic '{self.topic}', which is not a cdcflow sink marker: the group is used by "
                "something else; choose another sink.transactional-id-prefix"
            )
        return marker
