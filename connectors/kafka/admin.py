"""Kafka for the ``cdc-*`` sources and sinks, with the semantics of Spark's Kafka source and sink.

The driver parses :class:`KafkaOptions` once, lists partitions and watermarks and plans
:class:`OffsetRange` s; each executor reads one range with :func:`read_range` or writes with
:class:`KafkaProducerSink`. Everything passed around is a small frozen dataclass or Spark's offset
JSON (``{"topic": {"0": 12}}``); Kafka clients are created inside the functions and never pickled.

This module is the entry point; the parts live in ``kafka_options`` (options, offsets),
``kafka_ranges`` (offset arithmetic), ``kafka_reader`` and ``kafka_producer``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Literal

from cdcflow.connectors.errors import KafkaConnectorError
from cdcflow.connectors.kafka_options import (
    EARLIEST,
    LATEST,
    SOURCE_OPTIONS,
    ClientConfig,
    JsonOffsets,
    KafkaOptions,
    OffsetRange,
    Offsets,
    OffsetSpec,
    Subscription,
    TopicPartition,
    offsets_from_json,
    offsets_to_json,
)
from cdcflow.connectors.kafka_producer import KafkaProducerSink, produce_messages
from cdcflow.connectors.kafka_ranges import (
    batch_ranges,
    limit_offsets,
    rate_limit,
    report_data_loss,
    resolve_offsets,
    split_ranges,
    stream_ranges,
)
from cdcflow.connectors.kafka_reader import new_consumer, read_range, read_range_chunks
from cdcflow.formats import Message

if TYPE_CHECKING:
    from confluent_kafka import Consumer

__all__ = [
    "EARLIEST",
    "LATEST",
    "SOURCE_OPTIONS",
    "ClientConfig",
    "JsonOffsets",
    "KafkaOptions",
    "KafkaProducerSink",
    "OffsetRange",
    "OffsetSpec",
    "Offsets",
    "Subscription",
    "TopicPartition",
    "batch_offsets",
    "batch_ranges",
    "discover_partitions",
    "latest_offsets",
    "limit_offsets",
    "offset_bounds",
    "offsets_from_json",
    "offsets_to_json",
    "produce_messages",
    "producer_config",
    "rate_limit",
    "read_range",
    "read_range_chunks",
    "report_data_loss",
    "resolve_offsets",
    "sample_messages",
    "split_ranges",
    "stream_ranges",
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
