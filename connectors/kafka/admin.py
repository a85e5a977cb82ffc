"""Kafka metadata calls: partitions of a subscription, their watermarks, the offsets a batch or a
stream starts from, and a sample of messages for schema inference.

The driver parses :class:`~cdcflow.connectors.kafka.options.KafkaOptions` once and calls these to
plan :class:`~cdcflow.connectors.kafka.options.OffsetRange` s; executors read ranges with
:mod:`cdcflow.connectors.kafka.reader` and write with :mod:`cdcflow.connectors.kafka.producer`.
Offset arithmetic (no client) lives in :mod:`cdcflow.connectors.kafka.offsets`. Clients are created
inside the functions and never pickled.
"""

from __future__ import annotations

import functools
import itertools
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Literal, TypeVar

from cdcflow.connectors.errors import KafkaConnectorError
from cdcflow.connectors.kafka.offsets import resolve_offsets
from cdcflow.connectors.kafka.options import ClientConfig, KafkaOptions, OffsetRange, Offsets, TopicPartition
from cdcflow.connectors.kafka.reader import log, new_consumer, read_range
from cdcflow.formats import Message

if TYPE_CHECKING:
    from confluent_kafka import KafkaError
    from confluent_kafka import TopicPartition as KafkaTopicPartition
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._metadata import ClusterMetadata

__all__ = [
    "GroupCommits",
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


def discover_partitions(options: KafkaOptions) -> list[TopicPartition]:
    """The partitions the subscription covers now, sorted; ``assign`` as given."""
    if options.subscription.kind == "assign":
        return list(options.subscription.partitions)
    with _PlanningClient(options) as client:
        return _discover(client)


def subscription_bounds(options: KafkaOptions) -> dict[TopicPartition, tuple[int, int]]:
    """:func:`offset_bounds` of the partitions the subscription covers now, asked with one client."""
    with _PlanningClient(options) as client:
        return _bounds(client, _discover(client))


def offset_bounds(
    options: KafkaOptions, partitions: Iterable[TopicPartition]
) -> dict[TopicPartition, tuple[int, int]]:
    """Low and high watermarks (first offset, offset after the last record) of each partition."""
    with _PlanningClient(options) as client:
        return _bounds(client, partitions)


def _discover(client: _PlanningClient) -> list[TopicPartition]:
    options = client.options
    subscription = options.subscription
    if subscription.kind == "assign":
        return list(subscription.partitions)
    servers, timeout = options.client.bootstrap_servers, options.poll_timeout_s
    metadata = client.call(
        lambda wait: _covered_metadata(client, wait),
        lambda reason: (
            f"could not list the topics of Kafka at bootstrap servers {servers} within {timeout:g}s: "
            f"{reason}; check kafka.bootstrap.servers and that the brokers are up "
            "(kafkaConsumer.pollTimeoutMs is the timeout)"
        ),
    )
    found = {
        name: sorted(topic.partitions)
        for name, topic in metadata.topics.items()
        if topic.error is None and name not in _INTERNAL_TOPICS
    }
    if subscription.kind == "subscribe":
        missing = [t for t in subscription.topics if t not in found]
        if missing:
            raise KafkaConnectorError(
                f"topic(s) {', '.join(missing)} do not exist on {servers} "
                f"({subscription}): create them or fix the option subscribe"
            )
        names = list(subscription.topics)
    else:
        pattern = re.compile(subscription.text)
        names = [t for t in found if pattern.fullmatch(t)]
    return sorted(TopicPartition(t, p) for t in names for p in found[t])


def _covered_metadata(client: _PlanningClient, wait: float) -> ClusterMetadata:
    """The cluster's metadata; a topic of the subscription in an error that heals (no leader while a
    broker restarts) fails the attempt, so that it is asked again."""
    from confluent_kafka import KafkaException

    metadata: ClusterMetadata = client.consumer.list_topics(timeout=wait)
    subscription = client.options.subscription
    pattern = re.compile(subscription.text) if subscription.kind == "subscribePattern" else None
    for name, topic in metadata.topics.items():
        covered = name in subscription.topics or (pattern is not None and pattern.fullmatch(name))
        if covered and topic.error is not None and _heals(topic.error):
            raise KafkaException(topic.error)
    return metadata


def _bounds(
    client: _PlanningClient, partitions: Iterable[TopicPartition]
) -> dict[TopicPartition, tuple[int, int]]:
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    return {
        tp: client.call(
            functools.partial(_watermarks, client, KafkaTopicPartition(tp.topic, tp.partition)),
            functools.partial(_offsets_failed, tp, client.options.client.bootstrap_servers),
        )
        for tp in partitions
    }


def _watermarks(client: _PlanningClient, partition: KafkaTopicPartition, wait: float) -> tuple[int, int]:
    low, high = client.consumer.get_watermark_offsets(partition, timeout=wait, cached=False)
    return int(low), int(high)


def _offsets_failed(tp: TopicPartition, servers: str, reason: str) -> str:
    return (
        f"could not get the offsets of topic '{tp.topic}' partition {tp.partition} from {servers}: "
        f"{reason}; check that the partition exists and the brokers are reachable"
    )


T = TypeVar("T")
_HEALING_ERRORS = (
    "_TRANSPORT",
    "_TIMED_OUT",
    "_ALL_BROKERS_DOWN",
    "_WAIT_COORD",
    "LEADER_NOT_AVAILABLE",
    "NOT_LEADER_FOR_PARTITION",
    "REQUEST_TIMED_OUT",
    "NETWORK_EXCEPTION",
    "NOT_ENOUGH_REPLICAS",
    "KAFKA_STORAGE_ERROR",
    "FENCED_LEADER_EPOCH",
    "UNKNOWN_LEADER_EPOCH",
    "OFFSET_NOT_AVAILABLE",
    "PREFERRED_LEADER_NOT_AVAILABLE",
    "COORDINATOR_LOAD_IN_PROGRESS",
    "COORDINATOR_NOT_AVAILABLE",
    "NOT_COORDINATOR",
)
"""What Kafka's own clients retry (a broker restarting, a partition's leader moving), by librdkafka's
names; an unknown topic or partition is not among them: it fails at once."""
_FIRST_WAIT_S = 0.5
"""The first attempt waits this long for an answer, each next one twice as long (up to the timeout):
librdkafka reports an unresolvable host only between calls."""
_FIRST_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 2.0
_UNRESOLVED = re.compile(r"Failed to resolve '([^']+)': (.*?)(?: \(after \d+ms in state \w+.*\))?$")


@functools.cache
def _healing_codes() -> frozenset[int]:
    from confluent_kafka import KafkaError

    return frozenset(int(getattr(KafkaError, name)) for name in _HEALING_ERRORS if hasattr(KafkaError, name))


def _heals(error: KafkaError) -> bool:
    return error.code() in _healing_codes()


def _host(server: str) -> str:
    """The host of a bootstrap server (``SASL_SSL://Host:9092`` → ``host``)."""
    address = server.strip().rpartition("://")[2].lower()
    host, _, port = address.rpartition(":")
    return (host if host and port.isdigit() else address).strip("[]")


class _PlanningClient:
    """A consumer for the driver's metadata calls (never in a group), each retried while Kafka heals.

    A call that fails with an error that heals (:data:`_HEALING_ERRORS`) is made again, with a short
    backoff, until the source's timeout (``kafkaConsumer.pollTimeoutMs``, the commands'
    ``--kafka-timeout``) has passed since it began. Errors that will not heal end it at once, naming
    what to fix: every bootstrap host failing to resolve, or the brokers refusing the credentials.
    """

    def __init__(self, options: KafkaOptions) -> None:
        self.options = options
        self.unresolved: dict[str, str] = {}
        self.refused: str | None = None
        self.last_error: str | None = None
        self.consumer = new_consumer(options, self._on_error)

    def __enter__(self) -> _PlanningClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.consumer.close()

    def call(self, ask: Callable[[float], T], failed: Callable[[str], str]) -> T:
        """``ask(wait)``, retried as the class says; ``failed(reason)`` is the message of a failure."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + self.options.poll_timeout_s
        wait, backoff = _FIRST_WAIT_S, _FIRST_BACKOFF_S
        while True:
            try:
                return ask(max(min(wait, deadline - time.monotonic()), 0.001))
            except KafkaException as exception:
                error = exception.args[0]
                self.consumer.poll(0)  # librdkafka's error callbacks run here
                self._fail_if_lasting()
                remaining = deadline - time.monotonic()
                if not _heals(error) or remaining <= 0:
                    raise KafkaConnectorError(failed(self._reason(error))) from None
                self.consumer.poll(min(backoff, remaining))
                wait, backoff = wait * 2, min(backoff * 2, _MAX_BACKOFF_S)

    def _on_error(self, error: KafkaError) -> None:
        from confluent_kafka import KafkaError

        text = self.options.client.explain(error)
        self.last_error = text
        unresolved = _UNRESOLVED.search(text) if error.code() == KafkaError._RESOLVE else None
        if unresolved is not None:
            self.unresolved[_host(unresolved.group(1))] = unresolved.group(2)
        elif error.code() == KafkaError._AUTHENTICATION:
            self.refused = text

    def _fail_if_lasting(self) -> None:
        servers = self.options.client.bootstrap_servers
        hosts = {_host(server) for server in servers.split(",") if server.strip()}
        if hosts and hosts <= set(self.unresolved):
            raise KafkaConnectorError(
                f"the Kafka bootstrap host(s) {', '.join(sorted(hosts))} do not resolve "
                f"({self.unresolved[min(hosts)]}): check the host names in kafka.bootstrap.servers "
                f"({servers}) and the DNS of this machine"
            )
        if self.refused is not None:
            raise KafkaConnectorError(
                f"the Kafka brokers at {servers} refused the client's credentials ({self.refused}): check "
                "the kafka.sasl.* and kafka.security.protocol settings"
            )

    def _reason(self, error: KafkaError) -> str:
        text = self.options.client.explain(error)
        if self.last_error is None or self.last_error in text:
            return text
        return f"{text} (last client error: {self.last_error})"


def batch_offsets(options: KafkaOptions, which: Literal["starting", "ending"]) -> Offsets:
    """Where a batch read starts or ends in every partition (default earliest / latest)."""
    bounds = subscription_bounds(options)
    return resolve_offsets(options.offsets_for(which, "batch"), bounds, which=which)


def stream_starting_offsets(options: KafkaOptions) -> Offsets:
    """Where a new stream starts in every partition (default latest); endingOffsets is rejected."""
    options.offsets_for("ending", "streaming")
    bounds = subscription_bounds(options)
    return resolve_offsets(options.offsets_for("starting", "streaming"), bounds, which="starting")


def latest_offsets(options: KafkaOptions) -> Offsets:
    """The high watermark of every partition the subscription covers now."""
    return {tp: high for tp, (_, high) in subscription_bounds(options).items()}


def sample_messages(options: KafkaOptions, limit: int) -> Iterator[Message]:
    """Up to ``limit`` records from the start of the partitions, in partition order (for inference)."""
    taken = 0
    for tp, (low, high) in subscription_bounds(options).items():
        if taken >= limit:
            return
        rng = OffsetRange(tp.topic, tp.partition, low, min(high, low + limit - taken))
        for message in itertools.islice(read_range(options, rng, fail_on_data_loss=False), limit - taken):
            taken += 1
            yield message


class GroupCommits:
    """Each committed micro-batch's end offsets, committed to the consumer group ``commitGroup`` so that
    ``kafka-consumer-groups`` and lag monitors (Burrow) show how far a stream is behind. Nothing reads
    them back: the checkpoint says where a query goes on. A commit that fails is logged and the next
    batch's catches up; the group must have no active members (Kafka refuses offsets from outside a
    group that has). The admin client is kept between commits and never pickled."""

    def __init__(self, options: KafkaOptions, group: str) -> None:
        self.options = options
        self.group = group
        self._admin: AdminClient | None = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_admin": None}

    def commit(self, offsets: Offsets) -> None:
        from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        positions = [
            KafkaTopicPartition(tp.topic, tp.partition, offset) for tp, offset in sorted(offsets.items())
        ]
        if not positions:
            return
        timeout = self.options.poll_timeout_s
        try:
            futures = self._client().alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(self.group, positions)], request_timeout=timeout
            )
            result = futures[self.group].result(timeout=timeout)
            failed = [f"{tp.topic}-{tp.partition}: {tp.error}" for tp in result.topic_partitions if tp.error]
        except (KafkaException, TimeoutError) as error:
            failed = [self.options.client.explain(error)]
        if failed:
            log.warning(
                "could not commit the micro-batch's end offsets to consumer group '%s' at %s (%s); the next "
                "batch tries again. Kafka takes offsets from outside a group only while it has no active "
                "member: give commitGroup a group of its own",
                self.group,
                self.options.client.bootstrap_servers,
                "; ".join(failed),
            )

    def _client(self) -> AdminClient:
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            config = {**self.options.client.as_dict(), "logger": self.options.client.redacting(log)}
            self._admin = self.options.client.create(lambda: AdminClient(config))
        return self._admin
