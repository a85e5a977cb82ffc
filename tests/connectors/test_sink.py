"""The ``cdc-*`` sinks: a changelog DataFrame written to Kafka as the format's envelopes reads back the
same; a sink with no topic, or a DataFrame with no row kind, is refused before anything is written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from golden_cases import GOLDEN, TESTDATA, load
from kafka_fixture import KafkaCluster, unique_topic
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from cdcflow.connectors.kafka import admin as kafka_admin
from cdcflow.connectors.kafka.options import KafkaOptions, TopicPartition
from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import parse_ddl, render_change

pytestmark = pytest.mark.integration

PRODUCTS = "id INT NOT NULL, name STRING, description STRING, weight FLOAT"
SCHEMA = parse_ddl(PRODUCTS)
EXCLUDE = TESTDATA / "flink" / "debezium-data-schema-exclude.txt"
GOLDEN_ROWS = load(GOLDEN / "flink-debezium-data-schema-exclude.golden").rows
EVENTS = 16
"""The golden changelog's events: an update's -U and +U make one."""


def rendered(df: DataFrame) -> list[str]:
    return [
        render_change(Change(RowKind.from_short_string(row.pop("_row_kind")), row), SCHEMA)
        for row in df.toArrow().to_pylist()
    ]


def changelog(spark: SparkSession) -> DataFrame:
    return spark.read.format("cdc-debezium").option("columns", PRODUCTS).load(str(EXCLUDE))


def records_in(bootstrap: str, topic: str) -> int:
    options = KafkaOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    return sum(
        high - low for low, high in kafka_admin.offset_bounds(options, [TopicPartition(topic, 0)]).values()
    )


def read_topic(spark: SparkSession, source: str, bootstrap: str, topic: str) -> DataFrame:
    return (
        spark.read.format(source)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("columns", PRODUCTS)
        .load()
    )


@pytest.mark.parametrize("source", ["cdc-canal", "cdc-maxwell"])
def test_batch_write_reads_back_the_same_changelog(
    spark: SparkSession, kafka_cluster: KafkaCluster, source: str
) -> None:
    bootstrap, topic = kafka_cluster.bootstrap_servers, unique_topic(source)
    kafka_cluster.create_topic(topic, 1)
    (
        changelog(spark)
        .write.format(source)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .option("keyColumns", "id")
        .mode("append")
        .save()
    )
    assert records_in(bootstrap, topic) == EVENTS
    assert rendered(read_topic(spark, source, bootstrap, topic)) == GOLDEN_ROWS


def test_stream_write_reads_back_the_same_changelog(
    spark: SparkSession, kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    bootstrap, topic = kafka_cluster.bootstrap_servers, unique_topic("stream-sink")
    kafka_cluster.create_topic(topic, 1)
    query = (
        spark.readStream.format("cdc-debezium")
        .option("columns", PRODUCTS)
        .load(str(EXCLUDE))
        .writeStream.format("cdc-canal")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .option("keyColumns", "id")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert records_in(bootstrap, topic) == EVENTS
    assert rendered(read_topic(spark, "cdc-canal", bootstrap, topic)) == GOLDEN_ROWS


def analysis_error(action: Callable[[], object]) -> str:
    with pytest.raises(AnalysisException) as failure:
        action()
    return str(failure.value)


def test_sink_without_a_topic_is_refused(spark: SparkSession, kafka_cluster: KafkaCluster) -> None:
    text = analysis_error(
        lambda: (
            changelog(spark)
            .write.format("cdc-canal")
            .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
            .mode("append")
            .save()
        )
    )
    assert (
        "ConnectorOptionError: the sink needs option 'topic': the Kafka topic to write the envelopes to"
        in text
    )


def test_sink_of_a_dataframe_without_row_kind_is_refused(
    spark: SparkSession, kafka_cluster: KafkaCluster
) -> None:
    topic = unique_topic("no-row-kind")
    kafka_cluster.create_topic(topic, 1)
    text = analysis_error(
        lambda: (
            changelog(spark)
            .drop("_row_kind")
            .write.format("cdc-canal")
            .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
            .option("topic", topic)
            .mode("append")
            .save()
        )
    )
    assert "ConnectorOptionError: the DataFrame has no '_row_kind' column" in text
    assert "columns are ['id', 'name', 'description', 'weight']" in text
    assert records_in(kafka_cluster.bootstrap_servers, topic) == 0


def test_sink_refuses_kafka_source_options(spark: SparkSession, kafka_cluster: KafkaCluster) -> None:
    text = analysis_error(
        lambda: (
            changelog(spark)
            .write.format("cdc-canal")
            .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
            .option("topic", unique_topic("source-options"))
            .option("startingOffsets", "earliest")
            .mode("append")
            .save()
        )
    )
    assert "startingoffsets: Kafka source option(s), which a sink does not read" in text


def test_sink_needs_key_columns(spark: SparkSession, kafka_cluster: KafkaCluster) -> None:
    """Without a key, -U/+U of different rows would pair up: the sink refuses to guess."""
    text = analysis_error(
        lambda: (
            changelog(spark)
            .write.format("cdc-canal")
            .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
            .option("topic", unique_topic("no-key"))
            .mode("append")
            .save()
        )
    )
    assert "the sink needs option 'keyColumns'" in text
