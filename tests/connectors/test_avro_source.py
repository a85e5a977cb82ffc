"""``cdc-debezium-avro``: the sink writes Confluent-framed Debezium Avro to Kafka, the source reads it
back with the columns inferred from the Avro writer schema."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import pytest
from cdc_events import COLUMNS, SCHEMA, changelog, spark_schema
from pyspark.sql import SparkSession
from spark_rows import collect_changes

from cdcflow.connectors.spark.arrow_types import struct_type
from cdcflow.core.model import Change
from cdcflow.formats import resolve_format

pytestmark = pytest.mark.integration

SCHEMA_ID = "7"


def test_avro_round_trip_with_inferred_columns(spark: SparkSession, kafka_cluster: Any) -> None:
    topic = f"dbz-avro-{time.time_ns()}"
    # One partition: without a registry the Avro encoder writes no Kafka key, so keys would not pin
    # partitions (test_avro_sink_keys_records_by_primary_key has the keyed case).
    kafka_cluster.create_topic(topic, 1)
    changes = changelog(120, seed=5)
    rows = [{**change.row, "_row_kind": change.kind.value} for change in changes]
    changelog_df = spark.createDataFrame(rows, schema=spark_schema(f"{COLUMNS}, _row_kind STRING NOT NULL"))
    (
        changelog_df.coalesce(1)
        .write.format("cdc-debezium-avro")
        .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
        .option("topic", topic)
        .option("keyColumns", "id")
        .option("schema-id", SCHEMA_ID)
        .mode("append")
        .save()
    )
    writer_schema = (
        resolve_format("debezium-avro-confluent")
        .create_encoder({"schema-id": SCHEMA_ID}, SCHEMA, ["id"], topic=topic)  # type: ignore[call-arg]
        .writer_schema
    )
    read = (
        spark.read.format("cdc-debezium-avro")
        .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
        .option("subscribe", topic)
        .option("schema", writer_schema)
        .option("schema-id", SCHEMA_ID)
        .load()
    )
    assert [f.name for f in read.schema.fields] == [*SCHEMA.names, "_row_kind"]
    assert read.schema.fields[:-1] == struct_type(SCHEMA).fields

    def by_key(items: list[Change]) -> dict[int, list[str]]:
        keyed: dict[int, list[str]] = defaultdict(list)
        for change in items:
            keyed[change.row["id"]].append(str(change))
        return dict(keyed)

    assert by_key(collect_changes(read, SCHEMA)) == by_key(changes)


def test_avro_sink_keys_records_by_primary_key(spark: SparkSession, kafka_cluster: Any) -> None:
    """With a registry (over HTTP, which every Spark worker reaches), the sink's Kafka key is an Avro
    record of the primary key registered under <topic>-key, so a key's records share a partition."""
    import io
    import json
    import uuid

    import fastavro
    from confluent_kafka import Consumer
    from registry_server import RegistryHandler, serving

    topic = f"dbz-avro-keys-{time.time_ns()}"
    kafka_cluster.create_topic(topic, 3)
    changes = changelog(60, seed=3)
    rows = [{**change.row, "_row_kind": change.kind.value} for change in changes]
    changelog_df = spark.createDataFrame(rows, schema=spark_schema(f"{COLUMNS}, _row_kind STRING NOT NULL"))
    handler = RegistryHandler.fresh()
    with serving(handler) as port:
        url = f"http://127.0.0.1:{port}"
        (
            changelog_df.coalesce(1)
            .write.format("cdc-debezium-avro")
            .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
            .option("topic", topic)
            .option("keyColumns", "id")
            .option("url", url)
            .mode("append")
            .save()
        )
        read = (
            spark.read.format("cdc-debezium-avro")
            .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
            .option("subscribe", topic)
            .option("url", url)
            .option("key-columns", "id")
            .load()
        )
        by_key_read = defaultdict(list)
        for change in collect_changes(read, SCHEMA):
            by_key_read[change.row["id"]].append(str(change))
    (key_id,) = handler.subjects[f"{topic}-key"]
    key_schema = fastavro.parse_schema(json.loads(handler.schemas[key_id][0]))
    consumer = Consumer(
        {"bootstrap.servers": kafka_cluster.bootstrap_servers, "group.id": str(uuid.uuid4())}
        | {"auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    consumer.subscribe([topic])
    partitions: dict[int, set[int]] = defaultdict(set)
    records, deadline = 0, time.monotonic() + 60
    written = sum(c.kind.value != "-U" for c in changes)  # an update is one event
    try:
        while records < written and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None or message.error():
                continue
            key = message.key()
            assert key is not None and key[:5] == b"\x00" + key_id.to_bytes(4, "big")
            record = fastavro.schemaless_reader(io.BytesIO(key[5:]), key_schema, None)
            assert isinstance(record, dict) and set(record) == {"id"}
            partitions[int(record["id"])].add(message.partition())
            records += 1
    finally:
        consumer.close()
    assert records == written and all(len(p) == 1 for p in partitions.values())
    expected: dict[int, list[str]] = defaultdict(list)
    for change in changes:
        expected[change.row["id"]].append(str(change))
    assert dict(by_key_read) == dict(expected)
