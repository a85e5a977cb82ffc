"""The cdc-* Kafka sources read committed records only by default, on a real broker: ranges end at the
last stable offset, and aborted records and transaction markers leave gaps the reader steps over."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kafka_fixture import KafkaCluster, unique_topic
from kafka_mock import MockKafkaCluster
from pyspark.sql import SparkSession

from cdcflow.connectors.kafka import admin as kafka_admin
from cdcflow.connectors.kafka import reader as kafka_reader
from cdcflow.connectors.kafka.options import KafkaOptions, OffsetRange, TopicPartition

pytestmark = pytest.mark.integration


@dataclass
class Transactions:
    topic: str
    committed: list[int]  # ids, in the order written
    aborted: list[int]
    pending: list[int]  # of the transaction left open
    producer: Any

    def close_open_transaction(self) -> None:
        self.producer.abort_transaction(30)


def event(i: int) -> bytes:
    return json.dumps({"before": None, "after": {"id": i, "name": f"n{i}"}, "op": "c"}).encode()


@pytest.fixture
def transactions(kafka_cluster: KafkaCluster) -> Iterator[Transactions]:
    """One partition: committed and aborted transactions interleaved, then one left open."""
    if isinstance(kafka_cluster, MockKafkaCluster):
        pytest.skip("librdkafka's mock cluster has no transactions")
    from confluent_kafka import Producer

    topic = unique_topic("txn-read")
    kafka_cluster.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "transactional.id": topic})
    producer.init_transactions(60)
    ids = itertools.count()
    written = Transactions(topic, [], [], [], producer)
    for size, commit in [(3, True), (4, False), (1, True), (2, False), (2, False), (5, True), (1, False)]:
        producer.begin_transaction()
        batch = [next(ids) for _ in range(size)]
        for i in batch:
            producer.produce(topic, event(i), json.dumps({"id": i}).encode())
        producer.flush(30)  # on the broker before the abort: aborted records take offsets
        if commit:
            producer.commit_transaction(30)
            written.committed += batch
        else:
            producer.abort_transaction(30)
            written.aborted += batch
    producer.begin_transaction()
    written.pending = [next(ids) for _ in range(2)]
    for i in written.pending:
        producer.produce(topic, event(i), json.dumps({"id": i}).encode())
    producer.flush(30)
    yield written
    if written.pending:
        written.close_open_transaction()


def options(bootstrap: str, topic: str, **extra: str) -> KafkaOptions:
    return KafkaOptions.parse(
        {
            "kafka.bootstrap.servers": bootstrap,
            "subscribe": topic,
            "kafkaConsumer.pollTimeoutMs": "20000",
            **extra,
        }
    )


def ids_read(opts: KafkaOptions, start: int, end: int, topic: str) -> list[int]:
    return [
        json.loads(m.value or b"")["after"]["id"]
        for m in kafka_reader.read_range(opts, OffsetRange(topic, 0, start, end))
    ]


def test_ranges_end_at_the_last_stable_offset_and_skip_aborted_records(
    kafka_cluster: KafkaCluster, transactions: Transactions
) -> None:
    topic, bootstrap = transactions.topic, kafka_cluster.bootstrap_servers
    committed_reader = options(bootstrap, topic)
    uncommitted_reader = options(bootstrap, topic, **{"kafka.isolation.level": "read_uncommitted"})
    tp = TopicPartition(topic, 0)
    _, stable = kafka_admin.offset_bounds(committed_reader, [tp])[tp]
    _, high = kafka_admin.offset_bounds(uncommitted_reader, [tp])[tp]
    # 18 records and 7 markers before the open transaction's 2 records
    assert (stable, high) == (25, 27)
    assert kafka_admin.latest_offsets(committed_reader) == {tp: 25}

    assert ids_read(committed_reader, 0, stable, topic) == transactions.committed
    # Every split of [0, stable) into two ranges reads each committed record once, without hanging.
    for cut in range(stable + 1):
        first, second = (
            ids_read(committed_reader, 0, cut, topic),
            ids_read(committed_reader, cut, stable, topic),
        )
        assert first + second == transactions.committed, f"split at {cut}"

    everything = ids_read(uncommitted_reader, 0, high, topic)
    assert everything == sorted(transactions.committed + transactions.aborted + transactions.pending)

    transactions.close_open_transaction()
    transactions.pending = []
    _, stable_after = kafka_admin.offset_bounds(committed_reader, [tp])[tp]
    assert stable_after == 28  # the open transaction's abort marker
    assert ids_read(committed_reader, stable, stable_after, topic) == []


def test_spark_batch_read_applies_no_aborted_change(
    spark: SparkSession, kafka_cluster: KafkaCluster, transactions: Transactions
) -> None:
    df = (
        spark.read.format("cdc-debezium")
        .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
        .option("subscribe", transactions.topic)
        .option("columns", "id INT NOT NULL, name STRING")
        .load()
    )
    assert sorted(row["id"] for row in df.collect()) == transactions.committed
