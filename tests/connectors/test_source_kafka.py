"""The ``cdc-*`` sources over Kafka: metadata columns, Spark's Kafka-source options (offsets, assign,
subscribePattern, maxOffsetsPerTrigger), dead-letter topics and upsert-kafka tombstones."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as KafkaTopicPartition
from kafka_fixture import KafkaCluster, unique_topic
from kafka_mock import InProcessMockCluster
from pyspark.sql import SparkSession
from pyspark.sql import types as st
from source_cases import (
    EXCLUDE,
    GOLDEN_ROWS,
    KAFKA_METADATA,
    PARTITIONS,
    PRODUCTS,
    SCHEMA,
    T0_MS,
    ProductsTopic,
    debezium,
    expected_rows,
    observed,
    product_messages,
    render,
    rendered,
    topic_records,
    with_offsets,
)

from cdcflow.connectors.kafka import producer as kafka_producer
from cdcflow.formats import Message

pytestmark = pytest.mark.integration


def test_kafka_metadata_columns(spark: SparkSession, products: ProductsTopic) -> None:
    df = (
        products.reader(spark)
        .option("subscribe", products.name)
        .option("metadata", f"source.table,{KAFKA_METADATA}")
        .load()
    )
    assert df.columns == [
        *SCHEMA.names,
        "source_table",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "key",
        "headers",
        "_row_kind",
    ]
    types = {f.name: f.dataType for f in df.schema.fields}
    assert types["partition"] == st.IntegerType() and types["offset"] == st.LongType()
    assert types["timestamp"] == st.TimestampType() and types["key"] == st.BinaryType()
    want = expected_rows(products.messages)
    assert len(want) == len(GOLDEN_ROWS)  # the tombstone is no change
    assert observed(df) == want


def test_include_headers_adds_the_headers_column_as_spark_kafka_does(
    spark: SparkSession, products: ProductsTopic
) -> None:
    df = (
        products.reader(spark)
        .option("subscribe", products.name)
        .option("includeHeaders", "true")
        .option("metadata", "partition,offset")
        .load()
    )
    assert df.columns == [*SCHEMA.names, "partition", "offset", "headers", "_row_kind"]
    assert df.schema["headers"].dataType == st.ArrayType(
        st.StructType([st.StructField("key", st.StringType()), st.StructField("value", st.BinaryType())])
    )
    got = [(r["partition"], r["offset"], r["headers"]) for r in df.toArrow().to_pylist()]
    want = [(p, o, headers) for _, p, o, _, _, headers, _, _ in expected_rows(products.messages)]
    assert sorted(got, key=lambda r: r[:2]) == want
    assert any(headers for _, _, headers in want) and any(headers is None for _, _, headers in want)


def test_starting_and_ending_offsets_per_partition(spark: SparkSession, products: ProductsTopic) -> None:
    t = products.name
    df = (
        products.reader(spark)
        .option("subscribe", t)
        .option("startingOffsets", orjson.dumps({t: {"0": 2, "1": -2}}).decode())
        .option("endingOffsets", orjson.dumps({t: {"0": 4, "1": -1}}).decode())
        .option("metadata", KAFKA_METADATA + ",source.table")
        .load()
    )
    want = [r for r in expected_rows(products.messages) if r[1] == 1 or 2 <= r[2] < 4]
    assert {r[1] for r in want} == {0, 1} and len(want) < len(GOLDEN_ROWS)
    assert observed(df) == want


def test_min_partitions_splits_kafka_ranges_as_spark_does(
    spark: SparkSession, products: ProductsTopic
) -> None:
    df = (
        products.reader(spark)
        .option("subscribe", products.name)
        .option("minPartitions", "6")
        .option("metadata", KAFKA_METADATA + ",source.table")
        .load()
    )
    assert PARTITIONS == 2 and df.rdd.getNumPartitions() == 6  # each Kafka partition in three ranges
    assert observed(df) == expected_rows(products.messages)


def test_assign_reads_only_the_assigned_partitions(spark: SparkSession, products: ProductsTopic) -> None:
    df = (
        products.reader(spark)
        .option("assign", orjson.dumps({products.name: [1]}).decode())
        .option("metadata", KAFKA_METADATA + ",source.table")
        .load()
    )
    assert observed(df) == [r for r in expected_rows(products.messages) if r[1] == 1]


def test_subscribe_pattern_reads_every_matching_topic(
    spark: SparkSession, kafka_cluster: KafkaCluster, products: ProductsTopic
) -> None:
    prefix = unique_topic("pattern")
    lines = EXCLUDE.read_bytes().splitlines()
    for suffix, chunk in (("a", lines[:3]), ("b", lines[3:5])):
        kafka_cluster.create_topic(f"{prefix}.{suffix}", 1)
        kafka_producer.produce_messages(
            products.bootstrap, [Message(v, partition=0) for v in chunk], f"{prefix}.{suffix}"
        )
    kafka_cluster.create_topic(f"{prefix}x.c", 1)  # not matched: the pattern must match the whole name
    kafka_producer.produce_messages(products.bootstrap, [Message(lines[5], partition=0)], f"{prefix}x.c")
    df = (
        products.reader(spark)
        .option("subscribePattern", re.escape(prefix) + r"\..*")
        .option("metadata", "topic,offset")
        .load()
    )
    got = sorted((r["topic"], r["offset"], render(r)) for r in df.toArrow().to_pylist())
    assert got == [(f"{prefix}.a", i, GOLDEN_ROWS[i]) for i in range(3)] + [
        (f"{prefix}.b", i, GOLDEN_ROWS[3 + i]) for i in range(2)
    ]


def test_dead_letter_topic_gets_the_original_record_and_error_headers(
    spark: SparkSession, kafka_cluster: KafkaCluster, products: ProductsTopic
) -> None:
    source, dead = unique_topic("dl-source"), unique_topic("dl-dead")
    kafka_cluster.create_topic(source, 1)
    kafka_cluster.create_topic(dead, 1)
    good = EXCLUDE.read_bytes().splitlines()[:2]
    bad = Message(
        b'{"before":null,"after":{"id":1', b"key-1", partition=0, timestamp_ms=T0_MS, headers=(("h", b"v"),)
    )
    kafka_producer.produce_messages(
        products.bootstrap, [Message(good[0], partition=0), bad, Message(good[1], partition=0)], source
    )
    df = products.reader(spark).option("subscribe", source).option("deadLetterTopic", dead).load()
    assert rendered(df) == GOLDEN_ROWS[:2]
    letters = topic_records(products.bootstrap, dead)
    assert [(m.key, m.value) for m in letters] == [(bad.key, bad.value)]
    headers = dict(letters[0].headers)
    assert headers["h"] == b"v"
    assert headers["cdcflow.error.format"] == b"debezium-json"
    assert headers["cdcflow.error.origin"] == f"topic '{source}' partition 0 offset 1".encode()
    assert headers["cdcflow.error.reason"] == b"not valid JSON (unexpected end of data at character 30)"
    assert headers["cdcflow.error.field"] == b""


# --- upsert-kafka and read limits ---------------------------------------------------------------


def test_upsert_kafka_tombstone_is_a_delete_of_its_key(
    spark: SparkSession, kafka_cluster: KafkaCluster, products: ProductsTopic
) -> None:
    topic = unique_topic("upsert")
    kafka_cluster.create_topic(topic, 1)

    def record(key: int, value: dict[str, Any] | None) -> Message:
        return Message(None if value is None else orjson.dumps(value), orjson.dumps({"id": key}), partition=0)

    records = [
        record(1, {"id": 1, "name": "scooter"}),
        record(2, {"id": 2, "name": "hammer"}),
        record(1, {"id": 1, "name": "scooter v2"}),
        record(2, None),
    ]
    kafka_producer.produce_messages(products.bootstrap, records, topic)
    df = (
        spark.read.format("cdc-upsert-kafka")
        .option("kafka.bootstrap.servers", products.bootstrap)
        .option("subscribe", topic)
        .option("columns", "id INT NOT NULL, name STRING")
        .option("key.fields", "id")
        .option("metadata", "offset")
        .load()
    )
    got = [(r["offset"], r["_row_kind"], r["id"], r["name"]) for r in df.toArrow().to_pylist()]
    assert got == [
        (0, "+U", 1, "scooter"),
        (1, "+U", 2, "hammer"),
        (2, "+U", 1, "scooter v2"),
        (3, "-D", 2, None),
    ]


def test_max_offsets_per_trigger_splits_a_stream_into_small_micro_batches(
    spark: SparkSession, kafka_cluster: KafkaCluster, products: ProductsTopic, tmp_path: Path
) -> None:
    topic, limit = unique_topic("limited"), 8
    kafka_cluster.create_topic(topic, 3)
    inserts = [line for line in EXCLUDE.read_bytes().splitlines() if b'"op":"c"' in line]
    kafka_producer.produce_messages(
        products.bootstrap, [Message(v, partition=i % 3) for i, v in enumerate(inserts * 2)], topic
    )
    query = (
        spark.readStream.format("cdc-debezium")
        .option("kafka.bootstrap.servers", products.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(limit))
        .option("columns", PRODUCTS)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 2 * len(inserts) == 22
    assert len(sizes) >= 3 and max(sizes) <= limit


def test_batch_start_after_end_is_an_error_not_an_empty_read(
    spark: SparkSession, kafka_cluster: KafkaCluster
) -> None:
    topic = unique_topic("start-after-end")
    kafka_cluster.create_topic(topic, PARTITIONS)
    messages = with_offsets(product_messages(), topic)
    kafka_producer.produce_messages(kafka_cluster.bootstrap_servers, messages, topic)
    others = {str(p): 0 for p in range(1, PARTITIONS)}
    reader = (
        debezium(spark)
        .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", orjson.dumps({topic: {"0": 3, **others}}).decode())
        .option("endingOffsets", orjson.dumps({topic: {"0": 1, **others}}).decode())
    )
    with pytest.raises(Exception, match="starting offset 3 is after the ending offset 1"):
        reader.load().collect()


def test_a_batch_read_of_an_empty_topic_is_empty(spark: SparkSession, kafka_cluster: KafkaCluster) -> None:
    topic = unique_topic("empty")
    kafka_cluster.create_topic(topic, 2)
    df = (
        spark.read.format("cdc-debezium")
        .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
        .option("subscribe", topic)
        .option("columns", PRODUCTS)
        .load()
    )
    assert df.collect() == []


def test_a_leader_that_moved_while_the_source_plans_is_asked_again(spark: SparkSession) -> None:
    """A broker restarting moves the leaders of its partitions: the offset queries of a job starting then
    meet "Not leader for partition", which heals. The source asks again (until kafkaConsumer.pollTimeoutMs)
    instead of failing the job."""
    with InProcessMockCluster() as cluster:
        products = ProductsTopic(cluster)  # type: ignore[arg-type]
        # Two watermark queries' worth (each sends two requests): the first two attempts fail.
        cluster.fail_requests(cluster.LIST_OFFSETS, KafkaError.NOT_LEADER_FOR_PARTITION, 4)
        df = (
            products.reader(spark)
            .option("subscribe", products.name)
            .option("metadata", KAFKA_METADATA + ",source.table")
            .load()
        )
        assert observed(df) == expected_rows(products.messages)
        # The faults were met by the read: none is left for the next query.
        probe = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "probe"})
        try:
            assert probe.get_watermark_offsets(KafkaTopicPartition(products.name, 0), timeout=10) == (
                0,
                sum(1 for m in products.messages if m.partition == 0),
            )
        finally:
            probe.close()
