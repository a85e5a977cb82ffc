"""Spark's Kafka source options and client settings, parsed once on the driver into picklable values.

Keys are Spark's (Structured Streaming + Kafka Integration Guide), case-insensitive: ``kafka.*``
settings go to librdkafka without the prefix (sources and sinks); exactly one of ``subscribe`` /
``subscribePattern`` / ``assign``; ``startingOffsets`` / ``endingOffsets`` as ``earliest``,
``latest`` or per-partition JSON (-2 earliest, -1 latest); ``failOnDataLoss``; ``includeHeaders``;
``kafkaConsumer.pollTimeoutMs``; ``groupIdPrefix``. Offsets travel as Spark's JSON objects:
``{"topic": {"0": 12}}``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from cdcflow.connectors.errors import ConnectorOptionError, KafkaConnectorError
from cdcflow.formats.options import boolean, integer
from cdcflow.formats.redact import PLACEHOLDER, is_secret, redact, shown_settings

T = TypeVar("T")
Mode = Literal["batch", "streaming"]
EARLIEST, LATEST = -2, -1
_OFFSETS_EXAMPLE = '{"topicA":{"0":23,"1":-1},"topicB":{"0":-2}}'
_ASSIGN_EXAMPLE = '{"topicA":[0,1],"topicB":[2,4]}'

#: Source option keys this module reads (lower-cased, as Spark passes them), besides ``kafka.*``.
SOURCE_OPTIONS = frozenset(
    {
        "subscribe",
        "subscribepattern",
        "assign",
        "startingoffsets",
        "endingoffsets",
        "failondataloss",
        "includeheaders",
        "kafkaconsumer.polltimeoutms",
        "groupidprefix",
    }
)
UNSUPPORTED_SOURCE_OPTIONS = {
    key.lower(): f"'{key}' is not supported by the cdcflow Kafka source; {fix}"
    for key, fix in [
        ("startingOffsetsByTimestamp", "give offsets with startingOffsets"),
        ("endingOffsetsByTimestamp", "give offsets with endingOffsets"),
        ("startingTimestamp", "give offsets with startingOffsets"),
        ("endingTimestamp", "give offsets with endingOffsets"),
        ("startingOffsetsByTimestampStrategy", "give offsets with startingOffsets"),
        ("minOffsetsPerTrigger", "use maxOffsetsPerTrigger"),
        ("maxTriggerDelay", "use maxOffsetsPerTrigger"),
        ("fetchOffset.numRetries", "librdkafka retries by itself"),
        ("fetchOffset.retryIntervalMs", "librdkafka retries by itself"),
    ]
}
_SOURCE_CONTROLLED_SETTINGS = {
    "auto.offset.reset": "set the source option startingOffsets to earliest, latest or JSON offsets instead",
    "enable.auto.commit": "the source tracks offsets in Spark's checkpoint and never commits to Kafka",
}


# --- client settings -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientConfig:
    """librdkafka settings (``kafka.*`` options without the prefix); secret values never printed."""

    settings: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, bootstrap_servers: str, **settings: str) -> ClientConfig:
        """Settings from Python keywords (dots as underscores): ``of("h:9092", client_id="x")``."""
        pairs = {"bootstrap.servers": bootstrap_servers}
        pairs.update({key.replace("_", "."): value for key, value in settings.items()})
        return cls(tuple(sorted(pairs.items())))

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ClientConfig:
        """The ``kafka.*`` entries of Spark-style options; ``kafka.bootstrap.servers`` is required."""
        pairs = {
            key.strip().lower()[len("kafka.") :]: str(value)
            for key, value in options.items()
            if key.strip().lower().startswith("kafka.")
        }
        if not pairs.get("bootstrap.servers", "").strip():
            raise ConnectorOptionError(
                "option 'kafka.bootstrap.servers' must be specified: the Kafka brokers to connect to, "
                "e.g. kafka.bootstrap.servers=host1:9092,host2:9092"
            )
        return cls(tuple(sorted(pairs.items())))

    @property
    def bootstrap_servers(self) -> str:
        return dict(self.settings)["bootstrap.servers"]

    def get(self, key: str) -> str | None:
        return dict(self.settings).get(key)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.settings)

    def redact(self, text: str) -> str:
        """``text`` with every secret setting's value and URL credentials replaced by ``***``."""
        return redact(text, self.settings)

    def redacting(self, logger: logging.Logger) -> _RedactingLogger:
        """``logger`` for librdkafka's log lines (its ``logger`` setting), with secrets redacted."""
        return _RedactingLogger(logger, self)

    def explain(self, error: object) -> str:
        """librdkafka's text of a KafkaError or KafkaException, secrets redacted."""
        if isinstance(error, Exception) and error.args:
            error = error.args[0]
        return self.redact(str(error.str() if hasattr(error, "str") else error))

    def create(self, make: Callable[[], T]) -> T:
        """Build a client with ``make``, turning librdkafka's configuration errors into option errors."""
        require_kafka()
        from confluent_kafka import KafkaException

        try:
            return make()
        except (KafkaException, ValueError, TypeError) as error:
            raise ConnectorOptionError(
                f"invalid Kafka client settings (kafka.* options): {self.explain(error)}; see "
                "https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md"
            ) from None

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{k}={PLACEHOLDER if is_secret(k) else repr(v)}"
            for k, v in shown_settings(self.settings).items()
        )
        return f"ClientConfig({shown})"


class _RedactingLogger:
    """What librdkafka's ``logger`` setting calls (``log(level, format, *args)``), secrets redacted."""

    def __init__(self, logger: logging.Logger, client: ClientConfig) -> None:
        self.logger, self.client = logger, client

    def log(self, level: int, message: str, *args: object) -> None:
        if self.logger.isEnabledFor(level):
            self.logger.log(level, "%s", self.client.redact(message % args if args else message))


def require_kafka() -> None:
    if importlib.util.find_spec("confluent_kafka") is None:
        raise KafkaConnectorError("the Kafka connectors need confluent-kafka: pip install 'cdcflow[kafka]'")


# --- partitions, offsets and ranges --------------------------------------------------------------


@dataclass(frozen=True, order=True, slots=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, order=True, slots=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition: one Spark input partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def size(self) -> int:
        return max(self.end - self.start, 0)


Offsets = dict[TopicPartition, int]
JsonOffsets = dict[str, dict[str, int]]


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> JsonOffsets:
    """Spark's offset JSON object: ``{"topic": {"0": 12}}``, topics and partitions sorted."""
    out: JsonOffsets = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = offsets[tp]
    return out


def offsets_from_json(obj: object) -> Offsets:
    """The inverse of :func:`offsets_to_json`; raises ValueError on anything else."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object like {_OFFSETS_EXAMPLE}")
    offsets: Offsets = {}
    for topic, partitions in obj.items():
        if not isinstance(partitions, dict):
            raise ValueError(
                f"topic '{topic}' must map partition numbers to offsets, like {_OFFSETS_EXAMPLE}"
            )
        for partition, offset in partitions.items():
            if not (isinstance(partition, str) and partition.isdigit()):
                raise ValueError(f"topic '{topic}': partition '{partition}' is not a partition number")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise ValueError(
                    f"topic '{topic}' partition {partition}: offset {offset!r} must be an offset >= 0, "
                    "-2 (earliest) or -1 (latest)"
                )
            offsets[TopicPartition(topic, int(partition))] = offset
    return offsets


# --- source options ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Subscription:
    """Which partitions to read: ``subscribe``, ``subscribePattern`` or ``assign``."""

    kind: Literal["subscribe", "subscribePattern", "assign"]
    text: str
    topics: tuple[str, ...] = ()
    partitions: tuple[TopicPartition, ...] = ()

    def __str__(self) -> str:
        return f"{self.kind}={self.text}"


@dataclass(frozen=True)
class OffsetSpec:
    """``earliest``, ``latest``, or specific offsets per partition (-2 earliest, -1 latest)."""

    kind: Literal["earliest", "latest", "specific"]
    specific: tuple[tuple[TopicPartition, int], ...] = ()

    @property
    def offsets(self) -> Offsets:
        return dict(self.specific)


@dataclass(frozen=True)
class KafkaOptions:
    """Spark's Kafka source options, parsed once on the driver; picklable.

    ``starting_offsets`` / ``ending_offsets`` are None when not given: the default depends on the
    query (:meth:`offsets_for`), as in Spark.
    """

    client: ClientConfig
    subscription: Subscription
    starting_offsets: OffsetSpec | None = None
    ending_offsets: OffsetSpec | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_ms: int = 120_000
    group_id_prefix: str = "cdcflow-kafka-source"

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> KafkaOptions:
        """Read the Kafka options of a source; other keys (format options) are left alone."""
        given = {key.strip().lower(): str(value) for key, value in options.items()}
        for key in given:
            if key in UNSUPPORTED_SOURCE_OPTIONS:
                raise ConnectorOptionError(UNSUPPORTED_SOURCE_OPTIONS[key])
            setting = key.removeprefix("kafka.")
            if key.startswith("kafka.") and setting in _SOURCE_CONTROLLED_SETTINGS:
                raise ConnectorOptionError(
                    f"Kafka option '{key}' is not supported: {_SOURCE_CONTROLLED_SETTINGS[setting]}"
                )
        client = ClientConfig.from_options(given)
        starting, ending = given.get("startingoffsets"), given.get("endingoffsets")
        return cls(
            client=client,
            subscription=_subscription(given),
            starting_offsets=None if starting is None else _offset_spec("startingOffsets", starting),
            ending_offsets=None if ending is None else _offset_spec("endingOffsets", ending),
            fail_on_data_loss=_parsed(given, "failOnDataLoss", boolean, True),
            include_headers=_parsed(given, "includeHeaders", boolean, False),
            poll_timeout_ms=_parsed(given, "kafkaConsumer.pollTimeoutMs", _positive, 120_000),
            group_id_prefix=given.get("groupidprefix", "").strip() or "cdcflow-kafka-source",
        )

    @property
    def poll_timeout_s(self) -> float:
        return self.poll_timeout_ms / 1000

    def offsets_for(self, which: Literal["starting", "ending"], mode: Mode) -> OffsetSpec:
        """The starting or ending offsets of a batch or streaming query, default filled in, checked.

        Batch queries start at earliest and end at latest by default, and may not start at latest
        or end at earliest; streams start at latest by default and take no endingOffsets.
        """
        if which == "starting":
            spec = self.starting_offsets or OffsetSpec("earliest" if mode == "batch" else "latest")
            if mode == "batch" and (spec.kind == "latest" or any(o == LATEST for _, o in spec.specific)):
                raise ConnectorOptionError(
                    "option 'startingOffsets' can't be latest (-1) for batch queries on Kafka: the read "
                    "would be empty; use earliest or specific offsets"
                )
            return spec
        if mode == "streaming" and self.ending_offsets is not None:
            raise ConnectorOptionError(
                "option 'endingOffsets' is not valid in streaming queries: a stream reads until it is "
                "stopped; use a batch read (spark.read) to read up to given offsets"
            )
        spec = self.ending_offsets or OffsetSpec("latest")
        if spec.kind == "earliest" or any(o == EARLIEST for _, o in spec.specific):
            raise ConnectorOptionError(
                "option 'endingOffsets' can't be earliest (-2) for batch queries on Kafka; use latest or "
                "specific offsets"
            )
        return spec


def _positive(text: str) -> int:
    value = integer(text)
    if value <= 0:
        raise ValueError(f"'{text}' must be a positive integer")
    return value


def _parsed(given: Mapping[str, str], name: str, parse: Callable[[str], Any], default: Any) -> Any:
    text = given.get(name.lower())
    if text is None:
        return default
    try:
        return parse(text)
    except ValueError as error:
        raise ConnectorOptionError(f"option '{name}': {error}") from None


def _subscription(given: Mapping[str, str]) -> Subscription:
    chosen = [name for name in ("subscribe", "subscribePattern", "assign") if name.lower() in given]
    if len(chosen) != 1:
        problem = "none is" if not chosen else f"{', '.join(chosen)} are"
        raise ConnectorOptionError(
            f"exactly one of the options subscribe, subscribePattern, assign must be given ({problem}): "
            f"subscribe=topicA,topicB | subscribePattern=topic.* | assign={_ASSIGN_EXAMPLE}"
        )
    name = chosen[0]
    text = given[name.lower()].strip()
    if name == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
        if not topics:
            raise ConnectorOptionError("option 'subscribe' names no topic: write subscribe=topicA,topicB")
        return Subscription("subscribe", text, topics=topics)
    if name == "subscribePattern":
        try:
            re.compile(text)
        except re.error as error:
            raise ConnectorOptionError(
                f"option 'subscribePattern': '{text}' is not a regex ({error})"
            ) from None
        if not text:
            raise ConnectorOptionError(
                "option 'subscribePattern' is empty: write e.g. subscribePattern=topic.*"
            )
        return Subscription("subscribePattern", text)
    return Subscription("assign", text, partitions=_assigned_partitions(text))


def _assigned_partitions(text: str) -> tuple[TopicPartition, ...]:
    problem = f"option 'assign': expected JSON like {_ASSIGN_EXAMPLE}, got '{text}'"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        raise ConnectorOptionError(problem) from None
    if not isinstance(obj, dict) or not obj:
        raise ConnectorOptionError(problem)
    partitions: set[TopicPartition] = set()
    for topic, numbers in obj.items():
        if not isinstance(numbers, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers
        ):
            raise ConnectorOptionError(f"{problem}: topic '{topic}' must map to a list of partition numbers")
        partitions.update(TopicPartition(topic, n) for n in numbers)
    return tuple(sorted(partitions))


def _offset_spec(name: str, text: str) -> OffsetSpec:
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return OffsetSpec("earliest" if word == "earliest" else "latest")
    try:
        offsets = offsets_from_json(json.loads(text))
    except (json.JSONDecodeError, ValueError) as error:
        detail = f" ({error})" if not isinstance(error, json.JSONDecodeError) else ""
        raise ConnectorOptionError(
            f"option '{name}': '{text}' is not earliest, latest or JSON offsets{detail}; write e.g. "
            f"{name}={_OFFSETS_EXAMPLE} (-2 is earliest, -1 latest)"
        ) from None
    return OffsetSpec("specific", tuple(sorted(offsets.items())))
