"""A changelog read from recorded Debezium events (several input partitions), arranged per key with
``order_for_sink`` and written to a Kafka topic by the ``cdc-maxwell`` sink: :func:`write`, run by the
cluster's driver (sources_job.py) and in the tests' local session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PRODUCTS = "id INT NOT NULL, name STRING, description STRING, weight FLOAT"


def write(spark: SparkSession, events: str, bootstrap: str, topic: str) -> None:
    from cdcflow.spark import order_for_sink

    changelog = (
        spark.read.format("cdc-debezium")
        .option("columns", PRODUCTS)
        .option("maxRecordsPerPartition", "3")
        .option("metadata", "line")
        .load(events)
    )
    (
        order_for_sink(changelog, ["id"], sequence_by=["line"])
        .drop("line")
        .write.format("cdc-maxwell")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .option("keyColumns", "id")
        .mode("append")
        .save()
    )
