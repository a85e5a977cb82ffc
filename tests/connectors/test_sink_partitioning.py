"""The ``cdc-*`` Kafka sinks over DataFrames of several partitions: an update split across two tasks fails
with nothing of it written, a key written by two tasks fails the batch (and a stream's micro-batch),
and a DataFrame arranged by ``order_for_sink`` writes each update as one ``u`` event, in key order."""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from cdc_events import COLUMNS, changelog, decode, spark_schema
from confluent_kafka import Consumer, TopicPartition
from golden_cases import TESTDATA
from kafka_fixture import KafkaCluster, unique_topic
from pyspark.sql import DataFrame, SparkSession

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import Message
from cdcflow.spark import order_for_sink

pytestmark = pytest.mark.integration

SCHEMA_DDL = f"{COLUMNS}, _row_kind STRING NOT NULL"


def in_partitions(spark: SparkSession, parts: list[list[Change]], ddl: str = SCHEMA_DDL) -> DataFrame:
    """A changelog DataFrame whose partition i holds exactly ``parts[i]``, in order."""
    rows = [{**c.row, "_row_kind": c.kind.value} for part in parts for c in part]
    sizes = [len(part) for part in parts]
    bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    rdd = spark.sparkContext.parallelize(range(len(parts)), len(parts)).flatMap(
        lambda i: rows[bounds[i] : bounds[i + 1]]
    )
    df = spark.createDataFrame(rdd, spark_schema(ddl))
    assert df.rdd.glom().map(len).collect() == sizes
    return df


def write(df: DataFrame, bootstrap: str, topic: str, sink: str = "cdc-debezium") -> None:
    (
        df.write.format(sink)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .option("keyColumns", "id")
        .mode("append")
        .save()
    )


def topic_messages(bootstrap: str, topic: str, partitions: int) -> list[Message]:
    """Every record of the topic, partition by partition in offset order (up to the high watermarks)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("check")})
    out: list[Message] = []
    for partition in range(partitions):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
        consumer.assign([TopicPartition(topic, partition, low)])
        got: list[Message] = []
        deadline = time.monotonic() + 60
        while low + len(got) < high and time.monotonic() < deadline:
            record = consumer.poll(0.5)
            if record is not None and not record.error():
                got.append(Message(record.value(), record.key(), topic, partition, record.offset()))
        assert low + len(got) == high
        out += got
    consumer.close()
    return out


def failure_of(action: Callable[[], object]) -> str:
    with pytest.raises(Exception) as failure:  # noqa: PT011 - Spark wraps the worker's error
        action()
    return str(failure.value)


def change(kind: str, key: int, name: str) -> Change:
    return Change(
        RowKind.from_short_string(kind), {"id": key, "name": name, "price": None, "qty": 1, "updated": None}
    )


@pytest.mark.parametrize("sink", ["cdc-debezium", "cdc-canal"])
def test_an_update_split_across_two_tasks_fails_and_writes_no_half_of_it(
    spark: SparkSession, kafka_cluster: KafkaCluster, sink: str
) -> None:
    """Before: Debezium wrote {"op":"u","after":null} and an insert; Canal a DELETE and an INSERT from two
    producers with no order between them."""
    bootstrap, topic = kafka_cluster.bootstrap_servers, unique_topic("split")
    kafka_cluster.create_topic(topic, 1)
    df = in_partitions(
        spark,
        [
            [change("+I", 1, "a"), change("+I", 2, "b"), change("-U", 1, "a")],
            [change("+U", 1, "a2"), change("+I", 3, "c")],
        ],
    )
    text = failure_of(lambda: write(df, bootstrap, topic, sink))
    assert "SinkOrderError" in text
    assert (
        "the -U of key id=1 (row 2 of task 0 (input partition 0)) is not directly followed by its +U" in text
        or "the +U of key id=1 (row 0 of task 1 (input partition 1)) has no -U of the same key" in text
    )
    assert "cdcflow.spark.order_for_sink(df, ['id'], sequence_by=" in text
    values = [m.value or b"" for m in topic_messages(bootstrap, topic, 1)]
    assert not any(b'"after":null' in v or b'"DELETE"' in v or b'"UPDATE"' in v for v in values)
    assert not any(b'"a2"' in v for v in values), "no half of the split update reached the topic"


def test_a_key_written_by_two_tasks_fails_the_batch(spark: SparkSession, kafka_cluster: KafkaCluster) -> None:
    bootstrap, topic = kafka_cluster.bootstrap_servers, unique_topic("two-tasks")
    kafka_cluster.create_topic(topic, 1)
    df = in_partitions(
        spark,
        [
            [change("+I", 1, "a"), change("+I", 2, "b")],
            [change("-U", 1, "a"), change("+U", 1, "a2"), change("+I", 3, "c")],
        ],
    )
    text = failure_of(lambda: write(df, bootstrap, topic))
    assert "SinkOrderError: 1 key(s) were written by more than one task of this write (tasks 0, 1)" in text
    assert "order_for_sink(df, ['id']" in text


def test_a_stream_whose_micro_batch_splits_a_key_across_tasks_stops(
    spark: SparkSession, kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    """A recorded file read in input partitions of 8 records: key 106 is inserted in the first and
    updated in the second."""
    bootstrap, topic = kafka_cluster.bootstrap_servers, unique_topic("stream-two-tasks")
    kafka_cluster.create_topic(topic, 1)
    query = (
        spark.readStream.format("cdc-debezium")
        .option("columns", "id INT NOT NULL, name STRING, description STRING, weight FLOAT")
        .option("maxRecordsPerPartition", "8")
        .load(str(TESTDATA / "flink" / "debezium-data-schema-exclude.txt"))
        .writeStream.format("cdc-debezium")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .option("keyColumns", "id")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception) as failure:  # noqa: PT011 - a StreamingQueryException
        query.awaitTermination(120)
    assert "key(s) were written by more than one task of micro-batch 0" in str(failure.value)
    assert not (tmp_path / "checkpoint" / "commits" / "0").exists(), "the batch must not count as written"


def test_order_for_sink_makes_any_partitioning_write_one_event_per_update_in_order(
    spark: SparkSession, kafka_cluster: KafkaCluster
) -> None:
    bootstrap, topic = kafka_cluster.bootstrap_servers, unique_topic("ordered")
    kafka_cluster.create_topic(topic, 3)
    changes = changelog(400, seed=23)
    # Scattered: each row in a random one of 4 partitions, so pairs and keys are split everywhere.
    rng = random.Random(5)  # noqa: S311 - test data
    parts: list[list[Change]] = [[], [], [], []]
    sequence: list[list[int]] = [[], [], [], []]
    for position, item in enumerate(changes):
        target = rng.randrange(4)
        parts[target].append(item)
        sequence[target].append(position)
    rows = [
        {**c.row, "_row_kind": c.kind.value, "seq": s}
        for part, seqs in zip(parts, sequence, strict=True)
        for c, s in zip(part, seqs, strict=True)
    ]
    scattered = spark.createDataFrame(rows, spark_schema(f"{SCHEMA_DDL}, seq BIGINT NOT NULL")).repartition(4)
    text = failure_of(lambda: write(scattered.drop("seq"), bootstrap, unique_topic("unordered")))
    assert "SinkOrderError" in text, "the scattered input is refused as is"

    write(order_for_sink(scattered, ["id"], sequence_by=["seq"]).drop("seq"), bootstrap, topic)

    messages = topic_messages(bootstrap, topic, 3)
    updates = sum(c.kind.value == "+U" for c in changes)
    events: list[dict[str, Any]] = [orjson.loads(m.value or b"") for m in messages]
    assert sum(e["op"] == "u" for e in events) == updates
    assert all(e["before"] is not None and e["after"] is not None for e in events if e["op"] == "u")
    assert len(messages) == len(changes) - updates  # one event per change, an update's two rows as one

    def by_key(items: list[Change]) -> dict[int, list[str]]:
        keyed: dict[int, list[str]] = defaultdict(list)
        for item in items:
            keyed[item.row["id"]].append(str(item))
        return dict(keyed)

    # The topic's partitions in offset order, decoded by our own decoder: each key's changes in order.
    assert by_key(decode(messages)) == by_key(changes)
