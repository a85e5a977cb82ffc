"""``spark.readStream.format("cdc-debezium")`` over Kafka: checkpointed offsets, a stop mid-stream and a
restart, every change exactly once; and the round trip through the Kafka sink."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from cdc_events import COLUMNS, SCHEMA, changelog, debezium_events, decode
from confluent_kafka import Consumer, Producer
from pyspark.sql import SparkSession
from spark_rows import collect_changes

from cdcflow.core.model import Change
from cdcflow.formats import Encoded, Message

pytestmark = pytest.mark.integration

PARTITIONS = 3


def produce(bootstrap: str, topic: str, events: Sequence[Encoded]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for event in events:
        producer.produce(topic, key=event.key, value=event.value)
    assert producer.flush(30) == 0


def consume_all(bootstrap: str, topic: str, count: int) -> list[Message]:
    """The topic's records as the broker holds them, for the reference decoding."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    messages: list[Message] = []
    deadline = time.monotonic() + 60
    while len(messages) < count and time.monotonic() < deadline:
        record = consumer.poll(0.5)
        if record is None or record.error():
            continue
        messages.append(
            Message(record.value(), record.key(), record.topic(), record.partition(), record.offset())
        )
    consumer.close()
    assert len(messages) == count
    return messages


def per_partition(changes_with_origin: list[tuple[int, int, Change]]) -> dict[int, list[tuple[int, str]]]:
    out: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for partition, offset, change in sorted(changes_with_origin, key=lambda item: item[:2]):
        out[partition].append((offset, str(change)))
    return dict(out)


def stream_reader(spark: SparkSession, bootstrap: str, topic: str) -> Any:
    return (
        spark.readStream.format("cdc-debezium")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "40")
        .option("columns", COLUMNS)
        .option("metadata", "partition,offset")
        .load()
    )


def test_stream_stopped_and_restarted_delivers_every_change_once(
    spark: SparkSession, kafka_cluster: Any, tmp_path: Path
) -> None:
    topic = f"dbz-stream-{time.time_ns()}"
    kafka_cluster.create_topic(topic, PARTITIONS)
    events = debezium_events(changelog(400))
    half = len(events) // 2
    produce(kafka_cluster.bootstrap_servers, topic, events[:half])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start() -> Any:
        return (
            stream_reader(spark, kafka_cluster.bootstrap_servers, topic)
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="1 second")
            .start()
        )

    first = start()
    deadline = time.monotonic() + 120
    while not any(p["numInputRows"] for p in first.recentProgress) and time.monotonic() < deadline:
        time.sleep(0.2)
    first.stop()  # mid-stream: maxOffsetsPerTrigger leaves most of the topic unread
    read_before_restart = spark.read.parquet(str(out)).count() if out.exists() else 0
    assert 0 < read_before_restart < len(decode(consume_all(kafka_cluster.bootstrap_servers, topic, half)))

    produce(kafka_cluster.bootstrap_servers, topic, events[half:])
    second = (
        stream_reader(spark, kafka_cluster.bootstrap_servers, topic)
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    second.awaitTermination(300)
    assert second.exception() is None

    written = spark.read.parquet(str(out))
    got = [
        (row["partition"], row["offset"], change)
        for row, change in zip(written.toArrow().to_pylist(), collect_changes(written, SCHEMA), strict=True)
    ]
    coordinates = [(partition, offset, str(change)) for partition, offset, change in got]
    assert len(coordinates) == len(set(coordinates)), "a change was delivered twice"

    messages = consume_all(kafka_cluster.bootstrap_servers, topic, len(events))
    reference: list[tuple[int, int, Change]] = []
    for message in messages:
        reference += [(message.partition or 0, message.offset or 0, c) for c in decode([message])]
    assert per_partition(got) == per_partition(reference)


def test_round_trip_through_the_kafka_sink(spark: SparkSession, kafka_cluster: Any) -> None:
    source, target = f"rt-in-{time.time_ns()}", f"rt-out-{time.time_ns()}"
    kafka_cluster.create_topic(source, PARTITIONS)
    kafka_cluster.create_topic(target, PARTITIONS)
    changes = changelog(300, seed=11)
    produce(kafka_cluster.bootstrap_servers, source, debezium_events(changes))

    def read(topic: str) -> Any:
        return (
            spark.read.format("cdc-debezium")
            .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
            .option("subscribe", topic)
            .option("columns", COLUMNS)
            .load()
        )

    first = read(source)
    (
        first.write.format("cdc-debezium")
        .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
        .option("topic", target)
        .option("keyColumns", "id")
        .mode("append")
        .save()
    )
    again = collect_changes(read(target), SCHEMA)
    original = collect_changes(first, SCHEMA)

    def by_key(items: list[Change]) -> dict[int, list[str]]:
        keyed: dict[int, list[str]] = defaultdict(list)
        for change in items:
            keyed[change.row["id"]].append(str(change))
        return dict(keyed)

    assert by_key(again) == by_key(original) == by_key(changes)
    events = consume_all(kafka_cluster.bootstrap_servers, target, len(debezium_events(changes)))
    assert sum(b'"op":"u"' in (e.value or b"") for e in events) == sum(
        c.kind.value == "+U" for c in changes
    ), "an update must be written as ONE Debezium 'u' event"
