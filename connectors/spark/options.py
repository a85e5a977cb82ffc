"""The options of the ``cdc-*`` sources and sinks, parsed once on the driver.

Spark hands a data source its options as case-insensitive strings. Each key belongs to exactly one
owner: the connector (declared here), Kafka (Spark's Kafka-source names and ``kafka.*``), or the
format (its Flink keys, with or without the format prefix). Anything else is an error that lists
what is valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.kafka import options as kafka_options
from cdcflow.formats.options import Option, boolean, choice, integer, names, optional_string, show_default
from cdcflow.formats.redact import redacted_repr
from cdcflow.formats.registry import FormatFactory

CONTROL_COLUMN = "_control"
"""With ``controlEvents=emit``: the column naming a control event's kind (null on change rows)."""


def _count(text: str) -> int:
    value = integer(text)
    if value < 0:
        raise ValueError(f"'{text}' is negative: give 0 or a positive number")
    return value


class DeliveryGuarantee(Enum):
    """What a ``cdc-*`` sink promises about its records in Kafka (Flink's ``sink.delivery-guarantee``)."""

    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"
    NONE = "none"


class ControlEvents(Enum):
    """What a source does with a control event (truncate, message, schema-change, ...)."""

    SKIP = "skip"
    EMIT = "emit"


CONNECTOR_OPTIONS: tuple[Option[Any], ...] = (
    Option("path", optional_string, None, "Replay: a file, directory or glob of recorded messages"),
    Option(
        "columns",
        optional_string,
        None,
        "The table columns as a DDL string (Flink spellings work: TIMESTAMP(3)); "
        "the output adds the row kind and metadata columns. Alternative to .schema(...)",
    ),
    Option(
        "addedColumns",
        optional_string,
        None,
        "Without columns: columns added upstream (DDL), appended to those inferred from the first "
        "messages; the fix a schema-change error names (cdcflow ingest sets it by itself)",
    ),
    Option(
        "inferredColumns",
        optional_string,
        None,
        "Without columns: the columns inferred from the first messages, as cdcflow ingest's own planning "
        "found them (JSON; it sets this by itself, so the query does not sample the input again)",
    ),
    Option("rowKindColumn", str, "_row_kind", "The column holding +I, -U, +U or -D"),
    Option(
        "metadata",
        names,
        (),
        "Metadata columns to add, comma separated: topic, partition, offset, timestamp, key, headers, "
        "file, line, and the format's own (e.g. source.table)",
    ),
    Option(
        "deadLetterPath",
        optional_string,
        None,
        "Directory for rejected records (JSON lines), local or mounted on every executor",
    ),
    Option("deadLetterTopic", optional_string, None, "Kafka topic for rejected records"),
    Option(
        "accountingPath",
        optional_string,
        None,
        "Directory for what became of each input range's messages (one JSON file per range: read, "
        "with changes, dead letters, control events, filtered, tombstones, empty), local or mounted on "
        "every executor; cdcflow ingest sets it in its checkpoint",
    ),
    Option(
        "handoffPath",
        optional_string,
        None,
        "Directory local to the driver and every executor (a local master): each input range's decoded "
        "rows go to one Arrow file there and the DataFrame holds their paths (handoff_file, "
        "handoff_rows) for a driver that reads them without Spark's row conversion; cdcflow ingest "
        "sets it in its checkpoint",
    ),
    Option(
        "controlEvents",
        choice(ControlEvents),
        ControlEvents.SKIP,
        "Control events (truncate, message, schema-change, ...): skip counts and logs them on the "
        "executor; emit makes each one a row with its kind in column _control (null on change rows), "
        "null row kind and data columns, and the metadata columns filled",
    ),
    Option("maxOffsetsPerTrigger", integer, 0, "Streaming: at most this many Kafka records per micro-batch"),
    Option(
        "maxBytesPerTrigger",
        integer,
        0,
        "Streaming over recorded files: about this many bytes of input per micro-batch, in whole lines",
    ),
    Option(
        "maxRecordsPerPartition",
        integer,
        200_000,
        "Split a Kafka partition range (or a replay file, by ~400 bytes a record) into input partitions",
    ),
    Option(
        "minPartitions",
        _count,
        0,
        "Split a micro-batch into about this many input partitions, besides maxRecordsPerPartition "
        "(0: by it alone): Kafka ranges in proportion to their size, as Spark's Kafka source; a recorded "
        "file's batch into equal ranges of at least 1 MiB, their length kept in the batch's offsets",
    ),
    Option("topic", optional_string, None, "Sink: the Kafka topic to write (also the Avro subject's topic)"),
    Option("keyColumns", names, (), "Sink (required): the primary-key columns that form the Kafka key"),
    Option(
        "keyOrderCheck",
        boolean,
        True,
        "Sink: fail a batch in which two tasks wrote the same key (their changes would have no order); "
        "each task reports 8 bytes per distinct key to the driver",
    ),
    Option(
        "sink.delivery-guarantee",
        choice(DeliveryGuarantee),
        DeliveryGuarantee.AT_LEAST_ONCE,
        "Sink: exactly-once (one Kafka transaction per task and micro-batch; a replayed batch commits "
        "nothing twice; needs brokers with transactions), at-least-once (idempotent producer, acks=all) "
        "or none (acks=1, no idempotence)",
    ),
    Option(
        "sink.transactional-id-prefix",
        optional_string,
        None,
        "Sink, exactly-once: each task's transactional.id is <prefix>-<input partition> (default "
        "cdcflow-<streaming query id>); unique per query writing to the cluster",
    ),
)
_BY_KEY = {option.key.lower(): option for option in CONNECTOR_OPTIONS}

KAFKA_SOURCE_KEYS = kafka_options.SOURCE_OPTIONS
SPARK_KEYS = frozenset({"checkpointlocation"})
"""Options Spark itself reads and also hands to the source or sink: accepted and left alone."""


@dataclass(frozen=True)
class SplitOptions:
    """Every option given to a source or sink, by owner."""

    connector: dict[str, Any]
    kafka: dict[str, str]
    format: dict[str, str]

    def get(self, key: str) -> Any:
        return self.connector[key]

    def __repr__(self) -> str:
        return redacted_repr(self)


def split_options(raw: Mapping[str, str], factory: FormatFactory) -> SplitOptions:
    connector = {option.key: option.default for option in CONNECTOR_OPTIONS}
    kafka: dict[str, str] = {}
    format_options: dict[str, str] = {}
    unknown = []
    for given_key, text in raw.items():
        key = given_key.strip()
        lowered = key.lower()
        if lowered in _BY_KEY:
            option = _BY_KEY[lowered]
            try:
                connector[option.key] = option.parse(str(text))
            except ValueError as error:
                raise ConnectorOptionError(f"option '{option.key}': {error}. {option.description}") from None
        elif lowered in SPARK_KEYS:
            continue
        elif lowered.startswith("kafka.") or lowered in KAFKA_SOURCE_KEYS:
            kafka[key] = str(text)
        elif factory.options.owns(key):
            format_options[key] = str(text)
        else:
            unknown.append(key)
    if unknown:
        raise ConnectorOptionError(
            f"Unsupported options for format '{factory.name}': {', '.join(sorted(unknown))}. "
            f"Connector options: {', '.join(o.key for o in CONNECTOR_OPTIONS)}; Kafka options: kafka.*, "
            f"subscribe, subscribePattern, assign, startingOffsets, endingOffsets, failOnDataLoss, "
            "includeHeaders, kafkaConsumer.pollTimeoutMs, groupIdPrefix; "
            f"format options: {', '.join(factory.options.keys())}"
        )
    return SplitOptions(connector, kafka, format_options)


def options_markdown() -> str:
    """The connector options as a Markdown table (docs/connectors.md is checked against it)."""
    rows = [f"| `{o.key}` | `{show_default(o.default)}` | {o.description} |" for o in CONNECTOR_OPTIONS]
    return "\n".join(["| option | default | meaning |", "|---|---|---|", *rows])


def include_headers(kafka: Mapping[str, str]) -> bool:
    for key, value in kafka.items():
        if key.lower() == "includeheaders":
            try:
                return boolean(value)
            except ValueError as error:
                raise ConnectorOptionError(f"option 'includeHeaders': {error}") from None
    return False
