"""Kafka metadata calls: partitions of a subscription, their watermarks, the offsets a batch or a
stream starts from, and a sample of messages for schema inference.

The driver parses :class:`~cdcflow.connectors.kafka.options.KafkaOptions` once and calls these to
plan :class:`~cdcflow.connectors.kafka.options.OffsetRange` s; executors read ranges with
:mod:`cdcflow.connectors.kafka.reader` and write with :mod:`cdcflow.connectors.kafka.producer`.
Offset arithmetic (no client) lives in :mod:`cdcflow.connectors.kafka.offsets`. Clients are created
inside the functions and never pickled.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Literal

from cdcflow.connectors.errors import KafkaConnectorError
from cdcflow.connectors.kafka.offsets import resolve_offsets
from cdcflow.connectors.kafka.options import ClientConfig, KafkaOptions, OffsetRange, Offsets, TopicPartition
from cdcflow.connectors.kafka.reader import new_consumer, read_range
from cdcflow.formats import Message

if TYPE_CHECKING:
    from confluent_kafka import Consumer

__all__ = [
    "batch_offsets",
    "discover_partitions",
    "latest_offsets",
    "offset_bounds",
    "producer_config",
    "sample_messages",
    "stream_starting_offsets",
]

_INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


def producer_config(options: Mapping[str, str]) -> ClientConfig:
    """The client settings of a sink from its ``kafka.*`` options (bootstrap servers required)."""
    return ClientConfig.from_options(options)


def discover_partitions(options: KafkaOptions, consumer: Consumer | None = None) -> list[TopicPartition]:
    """The partitions the subscription covers now, sorted; ``assign`` as given. ``consumer``: the
    client to ask (left open), else one created and closed here."""
    subscription = options.subscription
    if subscription.kind == "assign":
        return list(subscription.partitions)
    client = consumer if consumer is not None else new_consumer(options)
    from confluent_kafka import KafkaException

    try:
        metadata = client.list_topics(timeout=options.poll_timeout_s)
    except KafkaException as error:
        raise KafkaConnectorError(
            f"could not list the topics of Kafka at bootstrap servers {options.client.bootstrap_servers} "
            f"within {options.poll_timeout_s:g}s: {options.client.explain(error)}; check "
            "kafka.bootstrap.servers and that the brokers are up (kafkaConsumer.pollTimeoutMs is the timeout)"
        ) from None
    finally:
        if consumer is None:
            client.close()
    found = {
        name: sorted(topic.partitions)
        for name, topic in metadata.topics.items()
        if topic.error is None and name not in _INTERNAL_TOPICS
    }
    if subscription.kind == "subscribe":
        missing = [t for t in subscription.topics if t not in found]
        if missing:
            raise KafkaConnectorError(
                f"topic(s) {', '.join(missing)} do not exist on {options.client.bootstrap_servers} "
                f"({subscription}): create them or fix the option subscribe"
            )
        names = list(subscription.topics)
    else:
        pattern = re.compile(subscription.text)
        names = [t for t in found if pattern.fullmatch(t)]
    return sorted(TopicPartition(t, p) for t in names for p in found[t])


def offset_bounds(
    options: KafkaOptions, partitions: Iterable[TopicPartition], consumer: Consumer | None = None
) -> dict[TopicPartition, tuple[int, int]]:
    """Low and high watermarks (first offset, offset after the last record) of each partition.
    ``consumer``: the client to ask (left open), else one created and closed here."""
    client = consumer if consumer is not None else new_consumer(options)
    from confluent_kafka import KafkaException
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    bounds = {}
    try:
        for tp in partitions:
            try:
                bounds[tp] = client.get_watermark_offsets(
                    KafkaTopicPartition(tp.topic, tp.partition), timeout=options.poll_timeout_s, cached=False
                )
            except KafkaException as error:
                raise KafkaConnectorError(
                    f"could not get the offsets of topic '{tp.topic}' partition {tp.partition} from "
                    f"{options.client.bootstrap_servers}: {options.client.explain(error)}; check that the "
                    "partition exists and the brokers are reachable"
                ) from None
    finally:
        if consumer is None:
            client.close()
    return bounds


def batch_offsets(options: KafkaOptions, which: Literal["starting", "ending"]) -> Offsets:
    """Where a batch read starts or ends in every partition (default earliest / latest)."""
    bounds = offset_bounds(options, discover_partitions(options))
    return resolve_offsets(options.offsets_for(which, "batch"), bounds, which=which)


def stream_starting_offsets(options: KafkaOptions) -> Offsets:
    """Where a new stream starts in every partition (default latest); endingOffsets is rejected."""
    options.offsets_for("ending", "streaming")
    bounds = offset_bounds(options, discover_partitions(options))
    return resolve_offsets(options.offsets_for("starting", "streaming"), bounds, which="starting")


def latest_offsets(options: KafkaOptions) -> Offsets:
    """The high watermark of every partition the subscription covers now."""
    consumer = new_consumer(options)  # one client, one connection, for both questions
    try:
        bounds = offset_bounds(options, discover_partitions(options, consumer), consumer)
    finally:
        consumer.close()
    return {tp: high for tp, (_, high) in bounds.items()}


def sample_messages(options: KafkaOptions, limit: int) -> Iterator[Message]:
    """Up to ``limit`` records from the start of the partitions, in partition order (for inference)."""
    taken = 0
    for tp, (low, high) in offset_bounds(options, discover_partitions(options)).items():
        if taken >= limit:
            return
        rng = OffsetRange(tp.topic, tp.partition, low, min(high, low + limit - taken))
        for message in itertools.islice(read_range(options, rng, fail_on_data_loss=False), limit - taken):
            taken += 1
            yield message
