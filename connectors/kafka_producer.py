"""Writing Kafka: an idempotent producer that reports every failed delivery (Spark's Kafka sink)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdcflow.connectors.errors import KafkaConnectorError
from cdcflow.connectors.kafka_options import ClientConfig, KafkaOptions, require_kafka
from cdcflow.formats import Message

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Producer
    from confluent_kafka import Message as KafkaMessage

log = logging.getLogger("cdcflow.connectors.kafka")

Headers = Sequence[tuple[str, bytes | None]]


@dataclass
class _Deliveries:
    delivered: int = 0
    failed: int = 0
    first_error: str | None = None
    fatal: str | None = None


class KafkaProducerSink:
    """An idempotent producer (``enable.idempotence=true``, ``acks=all``) writing to ``topic``.

    ``kafka.*`` settings override the defaults. :meth:`flush` waits for every delivery and raises
    :class:`KafkaConnectorError` if any failed; leaving a ``with`` block without an error flushes.
    """

    def __init__(self, client: ClientConfig | KafkaOptions, topic: str | None = None) -> None:
        require_kafka()
        from confluent_kafka import Producer

        self.client = client.client if isinstance(client, KafkaOptions) else client
        self.topic = topic
        self._state = _Deliveries()
        config: dict[str, Any] = {"enable.idempotence": True, "acks": "all", **self.client.as_dict()}
        config.update({"logger": self.client.redacting(log), "error_cb": self._on_client_error})
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
        else:
            self._producer.purge()

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
