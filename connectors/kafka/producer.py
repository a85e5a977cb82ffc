"""Writing Kafka: an idempotent producer that reports every failed delivery (Spark's Kafka sink)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdcflow.connectors.errors import KafkaConnectorError
from cdcflow.connectors.kafka.options import ClientConfig, KafkaOptions, require_kafka
from cdcflow.formats import Message

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Producer
    from confluent_kafka import Message as KafkaMessage
    from confluent_kafka import TopicPartition as KafkaTopicPartition

log = logging.getLogger("cdcflow.connectors.kafka")

Headers = Sequence[tuple[str, bytes | None]]

IDEMPOTENT: Mapping[str, Any] = {"enable.idempotence": True, "acks": "all"}
TRANSACTION_CALL_TIMEOUT_S = 120.0


@dataclass
class _Deliveries:
    delivered: int = 0
    failed: int = 0
    first_error: str | None = None
    fatal: str | None = None


class KafkaProducerSink:
    """An idempotent producer (``enable.idempotence=true``, ``acks=all``) writing to ``topic``.

    ``kafka.*`` settings override the defaults (``defaults``: other producer settings, e.g. a
    ``transactional.id``). :meth:`flush` waits for every delivery and raises
    :class:`KafkaConnectorError` if any failed; leaving a ``with`` block without an error flushes,
    with an error purges what is queued and aborts an open transaction.
    """

    def __init__(
        self,
        client: ClientConfig | KafkaOptions,
        topic: str | None = None,
        defaults: Mapping[str, Any] = IDEMPOTENT,
    ) -> None:
        require_kafka()
        from confluent_kafka import Producer

        self.client = client.client if isinstance(client, KafkaOptions) else client
        self.topic = topic
        self._state = _Deliveries()
        self.in_transaction = False
        config: dict[str, Any] = {**defaults, **self.client.as_dict()}
        config.update({"logger": self.client.redacting(log), "error_cb": self._on_client_error})
        self._defaults_id = str(defaults.get("transactional.id", ""))
        self._producer: Producer = self.client.create(lambda: Producer(config))
        self._queued = 0

    def produce(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
        *,
        topic: str | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """Queue one record (to ``topic`` if given, else the sink's topic)."""
        from confluent_kafka import KafkaException

        target = topic or self.topic
        if target is None:
            raise KafkaConnectorError("no topic to write to: set the sink option 'topic'")
        self._raise_if_fatal()
        extra: dict[str, Any] = {}
        if partition is not None:
            extra["partition"] = partition
        if timestamp_ms is not None:
            extra["timestamp"] = timestamp_ms
        while True:
            try:
                self._producer.produce(
                    target,
                    value,
                    key,
                    headers=list(headers) if headers else None,
                    on_delivery=self._on_delivery,
                    **extra,
                )
                break
            except BufferError:
                self._producer.poll(0.1)  # the local queue is full: serve deliveries, then retry
            except KafkaException as error:
                raise KafkaConnectorError(
                    f"could not write to topic '{target}': {self.client.explain(error)}"
                ) from None
        self._queued += 1
        if self._queued % 1000 == 0:
            self._producer.poll(0)

    def flush(self, timeout_s: float | None = None) -> int:
        """Wait for every queued record (for ever by default: librdkafka fails them after
        ``message.timeout.ms``); returns the number delivered so far, raises if any failed."""
        remaining = self._producer.flush(-1 if timeout_s is None else timeout_s)
        self._raise_if_fatal()
        state = self._state
        if state.failed:
            raise KafkaConnectorError(
                f"{state.failed} record(s) could not be written to Kafka at {self.client.bootstrap_servers}: "
                f"{state.first_error}"
            )
        if remaining:
            raise KafkaConnectorError(
                f"{remaining} record(s) were not delivered to Kafka at {self.client.bootstrap_servers} "
                f"within {timeout_s:g}s; check that the brokers are reachable"
            )
        return state.delivered

    def __enter__(self) -> KafkaProducerSink:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is None:
            self.flush()
            return
        self._producer.purge()
        if self.in_transaction:
            try:
                self.abort_transaction()
            except KafkaConnectorError as error:  # the coordinator aborts it after transaction.timeout.ms
                log.warning("could not abort the transaction: %s", error)

    # --- transactions (a producer made with a transactional.id) ------------------------------------

    def init_transactions(self) -> None:
        """Register the transactional id: fences earlier producers with the same id and completes or
        aborts their open transaction."""
        self._transaction_call("start the transactional producer", self._producer.init_transactions)

    def begin_transaction(self) -> None:
        self._transaction_call("begin a transaction", lambda _: self._producer.begin_transaction())
        self.in_transaction = True

    def send_offsets_to_transaction(self, offsets: list[KafkaTopicPartition], group: object) -> None:
        self._transaction_call(
            "commit the task's marker in the transaction",
            lambda timeout: self._producer.send_offsets_to_transaction(offsets, group, timeout),
        )

    def commit_transaction(self) -> None:
        """Deliver what is queued (raising if a record failed), then commit."""
        self.flush()
        self._transaction_call("commit the transaction", self._producer.commit_transaction)
        self.in_transaction = False

    def abort_transaction(self) -> None:
        self.in_transaction = False
        self._transaction_call("abort the transaction", self._producer.abort_transaction)

    def _transaction_call(self, what: str, call: Callable[[float], object]) -> None:
        """Run a transactional API call, retrying what librdkafka calls retriable until the timeout."""
        from confluent_kafka import KafkaError, KafkaException

        deadline = time.monotonic() + TRANSACTION_CALL_TIMEOUT_S
        while True:
            try:
                call(max(deadline - time.monotonic(), 1.0))
                return
            except KafkaException as exception:
                error = exception.args[0] if exception.args else None
                retriable = isinstance(error, KafkaError) and error.retriable()
                if retriable and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise KafkaConnectorError(self._transaction_problem(what, error)) from None

    def _transaction_problem(self, what: str, error: object) -> str:
        from confluent_kafka import KafkaError

        text = self.client.explain(error)
        transactional_id = self.client.get("transactional.id") or self._defaults_id
        where = f"Kafka at {self.client.bootstrap_servers}, transactional.id '{transactional_id}'"
        code = error.code() if isinstance(error, KafkaError) else None
        if code in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
            return (
                f"could not {what} ({where}): {text}; another attempt of this task took over the "
                "transactional id (a retried or speculative task), which writes the batch instead"
            )
        if code == KafkaError.INVALID_TRANSACTION_TIMEOUT:
            return (
                f"could not {what} ({where}): {text}; the producer's transaction.timeout.ms exceeds the "
                "broker's transaction.max.timeout.ms: lower kafka.transaction.timeout.ms or raise the "
                "broker setting"
            )
        return (
            f"could not {what} ({where}): {text}; exactly-once needs brokers with transactions "
            "(transaction.state.log.replication.factor and .min.isr no larger than the live brokers), "
            "or set sink.delivery-guarantee=at-least-once"
        )

    def _on_delivery(self, error: KafkaError | None, record: KafkaMessage) -> None:
        if error is None:
            self._state.delivered += 1
            return
        self._state.failed += 1
        if self._state.first_error is None:
            partition = record.partition()
            where = f"topic '{record.topic()}'" + (f" partition {partition}" if partition is not None else "")
            self._state.first_error = f"{where}: {self.client.explain(error)}"

    def _on_client_error(self, error: KafkaError) -> None:
        if error.fatal():
            self._state.fatal = self.client.explain(error)

    def _raise_if_fatal(self) -> None:
        if self._state.fatal is not None:
            raise KafkaConnectorError(f"the Kafka producer failed for good: {self._state.fatal}")


def produce_messages(
    client: ClientConfig | str, messages: Iterable[Message], topic: str | None = None
) -> int:
    """Write messages to ``topic`` (else each one's own), to their partition if set; the number delivered."""
    with KafkaProducerSink(ClientConfig.of(client) if isinstance(client, str) else client, topic) as sink:
        for m in messages:
            sink.produce(
                m.key,
                m.value,
                m.headers,
                topic=topic or m.topic,
                partition=m.partition,
                timestamp_ms=m.timestamp_ms,
            )
        return sink.flush()
