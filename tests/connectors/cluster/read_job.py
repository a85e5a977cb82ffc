"""``cdc-debezium`` over recorded files or a Kafka topic, split into several input partitions: the
changelog (each row with its coordinates) and what each task saw.

The cluster's driver (sources_job.py) and the tests' local session run the same :func:`read`, for the
comparison.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

PRODUCTS = "id INT NOT NULL, name STRING, description STRING, weight FLOAT"
RECORDS_PER_PARTITION = "3"


def source(spark: SparkSession, kind: str, *where: str) -> DataFrame:
    reader = (
        spark.read.format("cdc-debezium")
        .option("columns", PRODUCTS)
        .option("maxRecordsPerPartition", RECORDS_PER_PARTITION)
    )
    if kind == "file":
        return reader.option("metadata", "file,line").load(where[0])
    bootstrap, topic = where
    return (
        reader.option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("metadata", "topic,partition,offset")
        .load()
    )


def read(spark: SparkSession, kind: str, *where: str) -> dict[str, Any]:
    def where_each_task_ran(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Nested: pickled by value, so the Python workers need not import this script.
        import json
        import os
        import sys

        import pyarrow as pa
        from pyspark import TaskContext

        rows = sum(batch.num_rows for batch in batches)
        context = TaskContext.get()
        task = {
            "partition": context.partitionId() if context is not None else -1,
            "rows": rows,
            "pid": os.getpid(),
            "cwd": os.getcwd(),
            "python": sys.executable,
        }
        yield pa.RecordBatch.from_pylist([{"task": json.dumps(task)}])

    changelog = source(spark, kind, *where)
    rows = [
        {key: value for key, value in row.asDict().items() if key != "timestamp"}
        for row in changelog.collect()
    ]
    tasks = [
        json.loads(row.task) for row in changelog.mapInArrow(where_each_task_ran, "task STRING").collect()
    ]
    return {"partitions": changelog.rdd.getNumPartitions(), "rows": rows, "tasks": tasks}
