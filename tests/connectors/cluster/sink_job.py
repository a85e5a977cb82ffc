"""Driver: a changelog read from recorded Debezium events (several input partitions), arranged per key
with ``order_for_sink`` and written to a Kafka topic by the ``cdc-maxwell`` sink.

    spark-submit --master spark://... sink_job.py EVENTS_FILE BOOTSTRAP TOPIC
"""

from __future__ import annotations

import sys
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


if __name__ == "__main__":
    from cdcflow.connectors.spark.jobs import local_session

    write(local_session("cdcflow-sink-job"), *sys.argv[1:])
