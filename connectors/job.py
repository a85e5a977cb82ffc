"""``cdcflow stream``: a changelog stream read by a ``cdc-*`` source (Kafka or a recorded topic), printed.

    python -m cdcflow stream                                     # the bundled Postgres recording
    python -m cdcflow stream --bootstrap-servers localhost:9092 --topic dbserver1.inventory.products \\
        --option columns='id INT NOT NULL, name STRING'

Each micro-batch is printed as Flink prints changelogs (``+I[...]``), prefixed with the record's
``topic/partition@offset``; a control event (a truncate, a logical message, a DDL) is printed in its
place as ``! truncate`` (``controlEvents=emit``, unless the options set it). The query runs until
the input available at its start is read (``Trigger.AvailableNow``), and resumes from its checkpoint
when run again with the same one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TextIO

import pyarrow.compute as pc

from cdcflow.connectors.session import cdcflow_spark_config
from cdcflow.connectors.source_options import CONTROL_COLUMN
from cdcflow.connectors.spark_types import changes_from_arrow, schema_of_struct
from cdcflow.formats import render_change

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ORIGIN_COLUMNS = ("topic", "partition", "offset")


def local_session(app_name: str = "cdcflow") -> SparkSession:
    """A local[2] session whose Python workers run this interpreter (cdcflow is importable there)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for key, value in {
        **cdcflow_spark_config(),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
    }.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def changelog_printer(row_kind_column: str, out: TextIO) -> Callable[[DataFrame, int], None]:
    def print_batch(batch: DataFrame, batch_id: int) -> None:
        from pyspark.sql.types import StructType

        hidden = {row_kind_column, CONTROL_COLUMN, *ORIGIN_COLUMNS}
        columns = schema_of_struct(StructType([f for f in batch.schema.fields if f.name not in hidden]))
        table = batch.toArrow()
        origins = table.select(list(ORIGIN_COLUMNS)).to_pylist()
        controls: list[str | None] = [None] * table.num_rows
        data = table
        if CONTROL_COLUMN in table.column_names:
            controls = table.column(CONTROL_COLUMN).to_pylist()
            data = table.filter(pc.is_null(table.column(CONTROL_COLUMN)))
        changes = iter(changes_from_arrow(data, columns, row_kind_column))
        for origin, control in zip(origins, controls, strict=True):
            where = f"{origin['topic']}/{origin['partition']}@{origin['offset']}"
            shown = f"! {control}" if control is not None else render_change(next(changes), columns)
            out.write(f"{where} {shown}\n")
        out.flush()

    return print_batch


def stream_changelog(
    spark: SparkSession,
    source: str,
    options: Mapping[str, str],
    checkpoint: str,
    out: TextIO = sys.stdout,
) -> int:
    """Run the query to the end of the input available now; returns the number of micro-batches."""
    given = {key.lower(): value for key, value in options.items()}
    metadata = [m.strip() for m in given.get("metadata", "").split(",") if m.strip()]
    extra = [key for key in ORIGIN_COLUMNS if key not in metadata]
    shown = {"metadata": ",".join([*metadata, *extra])}
    if "controlevents" not in given:
        shown["controlEvents"] = "emit"
    stream = spark.readStream.format(source).options(**{**options, **shown}).load()
    row_kind = given.get("rowkindcolumn", "_row_kind")
    query = (
        stream.writeStream.foreachBatch(changelog_printer(row_kind, out))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    batch_ids = [progress["batchId"] for progress in query.recentProgress]
    return len(set(batch_ids))
