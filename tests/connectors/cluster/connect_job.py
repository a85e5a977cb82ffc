"""A Spark Connect client: the ``cdc-*`` sources read through ``SparkSession.builder.remote``, in batch
and as a stream; and the ingest job's ``foreachBatch`` sink. Writes what each attempt gave to a JSON file.

    python connect_job.py sc://127.0.0.1:PORT OUT.json DEBEZIUM_EVENTS CANAL_EVENTS BOOTSTRAP TOPIC WORKDIR
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

PRODUCTS = "id INT NOT NULL, name STRING, description STRING, weight FLOAT"


def rows(frame: Any) -> list[dict[str, Any]]:
    return [row.asDict() for row in frame.collect()]


def attempt(results: dict[str, Any], name: str, action: Callable[[], Any]) -> None:
    try:
        results[name] = {"ok": action()}
    except Exception as error:  # noqa: BLE001 - each failure is a finding, reported by name
        results[name] = {"error": type(error).__name__, "message": str(error)[:2000]}
        traceback.print_exc()


def main(url: str, out: str, events: str, canal: str, bootstrap: str, topic: str, workdir: str) -> None:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    results: dict[str, Any] = {"remote": type(spark).__module__}

    def file_batch() -> list[dict[str, Any]]:
        frame = spark.read.format("cdc-debezium").option("columns", PRODUCTS).option("metadata", "line")
        return rows(frame.option("maxRecordsPerPartition", "3").load(events))

    def kafka_batch() -> list[dict[str, Any]]:
        frame = (
            spark.read.format("cdc-debezium")
            .option("columns", PRODUCTS)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("metadata", "partition,offset")
            .load()
        )
        return rows(frame)

    def registered_by_the_client() -> list[dict[str, Any]]:
        from cdcflow.spark import register

        register(spark)
        return rows(spark.read.format("cdc-canal").option("columns", PRODUCTS).load(canal))

    def sql_function() -> list[dict[str, Any]]:
        """FROM_CHANGELOG as SQL text, registered by the client (after registered_by_the_client)."""
        envelopes = "VALUES ('c', 1, 'a', 1), ('u', 1, 'b', 2), ('d', 1, 'b', 3) AS t(op, id, name, seq)"
        return rows(
            spark.sql(
                f"SELECT * FROM FROM_CHANGELOG(input => TABLE(SELECT * FROM {envelopes}), "
                "op_mapping => map('c', 'INSERT', 'u', 'UPDATE_BEFORE, UPDATE_AFTER', 'd', 'DELETE'), "
                "state_ttl => INTERVAL '0' MINUTE, partition_by => 'id', sequence_by => 'seq')"
            )
        )

    def stream() -> list[dict[str, Any]]:
        query = (
            spark.readStream.format("cdc-debezium")
            .option("columns", PRODUCTS)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "7")
            .option("metadata", "partition,offset")
            .load()
            .writeStream.format("memory")
            .queryName("cdc_stream")
            .option("checkpointLocation", f"{workdir}/stream-checkpoint")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        return rows(spark.sql("SELECT * FROM cdc_stream"))

    def ingest() -> str:
        from cdcflow.connectors.lakehouse.ingest import IngestConfig
        from cdcflow.connectors.lakehouse.ingest import ingest as run

        config = IngestConfig(
            format="debezium-json",
            key=("id",),
            target=f"{workdir}/ingest-table",
            checkpoint=f"{workdir}/ingest-checkpoint",
            path=events,
            schema=PRODUCTS,
        )
        return str(run(config, spark))

    attempt(results, "file_batch", file_batch)
    attempt(results, "kafka_batch", kafka_batch)
    attempt(results, "registered_by_the_client", registered_by_the_client)
    attempt(results, "sql_function", sql_function)
    attempt(results, "stream", stream)
    attempt(results, "ingest", ingest)
    with open(out, "w") as handle:
        json.dump(results, handle, default=str)


if __name__ == "__main__":
    main(*sys.argv[1:])
