"""What the ``cdc-*`` source tests share: Debezium's products events from Flink's test data, as a
file and as a Kafka topic with keys, headers, timestamps and a tombstone, and how to read them back."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from golden_cases import GOLDEN, TESTDATA, load
from kafka_fixture import KafkaCluster, unique_topic
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, DataFrameReader, SparkSession

from cdcflow.connectors.kafka import admin as kafka_admin
from cdcflow.connectors.kafka import producer as kafka_producer
from cdcflow.connectors.kafka import reader as kafka_reader
from cdcflow.connectors.kafka.options import KafkaOptions, OffsetRange, TopicPartition
from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import Message, parse_ddl, render_change, resolve_format

PRODUCTS = "id INT NOT NULL, name STRING, description STRING, weight FLOAT"
SCHEMA = parse_ddl(PRODUCTS)
EXCLUDE = TESTDATA / "flink" / "debezium-data-schema-exclude.txt"
INCLUDE = TESTDATA / "flink" / "debezium-data-schema-include.txt"
GOLDEN_ROWS = load(GOLDEN / "flink-debezium-data-schema-exclude.golden").rows
LINE_OF_ROW = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10, 11, 11, 12, 13, 14, 14, 15, 15, 16]
"""The line of EXCLUDE each golden row comes from: an update gives -U and +U from one line."""
KAFKA_METADATA = "topic,partition,offset,timestamp,key,headers"
PARTITIONS = 2
T0_MS = 1_700_000_000_000

Observed = tuple[Any, ...]


def rendered(df: DataFrame, row_kind: str = "_row_kind") -> list[str]:
    return [render(row, row_kind) for row in df.toArrow().to_pylist()]


def render(row: dict[str, Any], row_kind: str = "_row_kind") -> str:
    kind = RowKind.from_short_string(row[row_kind])
    return render_change(Change(kind, {f.name: row[f.name] for f in SCHEMA}), SCHEMA)


def analysis_error(action: Callable[[], object]) -> str:
    """The text of the AnalysisException Spark raises on the driver when a source refuses its options."""
    with pytest.raises(AnalysisException) as failure:
        action()
    return str(failure.value)


def debezium(spark: SparkSession) -> DataFrameReader:
    return spark.read.format("cdc-debezium").option("columns", PRODUCTS)


def topic_records(bootstrap: str, topic: str) -> list[Message]:
    """Every record of partition 0 of ``topic``, with headers."""
    options = KafkaOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    ((low, high),) = kafka_admin.offset_bounds(options, [TopicPartition(topic, 0)]).values()
    return list(kafka_reader.read_range(options, OffsetRange(topic, 0, low, high), include_headers=True))


# --- a Kafka topic of Debezium events, with keys, headers, timestamps and a tombstone -------------


def product_messages() -> list[Message]:
    """The Flink test events keyed by id over two partitions, every other one with headers, and the
    tombstone Debezium writes after a delete."""
    messages = []
    for index, line in enumerate(EXCLUDE.read_bytes().splitlines()):
        envelope = orjson.loads(line)
        row = envelope["after"] or envelope["before"]
        key = orjson.dumps({"id": row["id"]})
        headers = [("trace", f"t{index}".encode()), ("empty", None)] if index % 2 else []
        partition = row["id"] % PARTITIONS
        messages.append(Message(line, key, None, partition, None, T0_MS + index * 1000, tuple(headers)))
        if envelope["op"] == "d":
            messages.append(Message(None, key, None, partition, None, T0_MS + index * 1000 + 1, ()))
    return messages


def with_offsets(messages: list[Message], topic: str) -> list[Message]:
    """The messages as Kafka holds them: offsets counted per partition."""
    counts = dict.fromkeys(range(PARTITIONS), 0)
    placed = []
    for m in messages:
        assert m.partition is not None
        offset = counts[m.partition]
        counts[m.partition] += 1
        placed.append(Message(m.value, m.key, topic, m.partition, offset, m.timestamp_ms, m.headers))
    return placed


def expected_rows(messages: list[Message]) -> list[Observed]:
    """What the per-message decoder makes of each record, with the record's coordinates."""
    decoder = resolve_format("debezium-json").create_decoder({}, SCHEMA, ["source.table"])
    out: list[Observed] = []
    for m in messages:
        for change in decoder.decode_all([m]).changes:
            headers = [{"key": k, "value": v} for k, v in m.headers] or None
            assert m.timestamp_ms is not None
            timestamp = dt.datetime.fromtimestamp(m.timestamp_ms / 1000, dt.UTC)
            table = change.row["source_table"]
            out.append(
                (
                    m.topic,
                    m.partition,
                    m.offset,
                    timestamp,
                    m.key,
                    headers,
                    table,
                    render_change(change, SCHEMA),
                )
            )
    return sorted(out, key=lambda item: item[:3])


def observed(df: DataFrame) -> list[Observed]:
    out = [
        (
            r["topic"],
            r["partition"],
            r["offset"],
            r["timestamp"],
            r["key"],
            r["headers"],
            r["source_table"],
            render(r),
        )
        for r in df.toArrow().to_pylist()
    ]
    return sorted(out, key=lambda item: item[:3])  # stable: -U stays before +U


class ProductsTopic:
    def __init__(self, cluster: KafkaCluster) -> None:
        self.bootstrap = cluster.bootstrap_servers
        self.name = unique_topic("products")
        cluster.create_topic(self.name, PARTITIONS)
        kafka_producer.produce_messages(self.bootstrap, product_messages(), self.name)
        self.messages = with_offsets(product_messages(), self.name)

    def reader(self, spark: SparkSession, fmt: str = "cdc-debezium") -> DataFrameReader:
        return (
            spark.read.format(fmt)
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("columns", PRODUCTS)
        )


@pytest.fixture(scope="module")
def products(kafka_cluster: KafkaCluster) -> ProductsTopic:
    return ProductsTopic(kafka_cluster)
