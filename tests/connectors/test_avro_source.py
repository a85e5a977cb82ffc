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

from cdcflow.connectors.spark_types import struct_type
from cdcflow.core.model import Change
from cdcflow.formats import resolve_format

pytestmark = pytest.mark.integration

SCHEMA_ID = "7"


def test_avro_round_trip_with_inferred_columns(spark: SparkSession, kafka_cluster: Any) -> None:
    topic = f"dbz-avro-{time.time_ns()}"
    # One partition: the Avro encoder writes no Kafka key yet, so keys would not pin partitions.
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
