"""The two apply back ends as test parameters, and a table read back through Delta Lake's Spark reader."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from deltalake import DeltaTable
from java_cache import component

from cdcflow.connectors.lakehouse.table_io import DELTA_RS, TableBackend

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

BACKENDS = ("delta-rs", "spark")


def table_backend(name: str, spark: SparkSession) -> TableBackend:
    if name == "delta-rs":
        return DELTA_RS
    from cdcflow.connectors.lakehouse.spark_delta import SparkDeltaBackend

    return SparkDeltaBackend(spark)


def delta_jars() -> str:
    """The folder of delta-spark's jars (what ``cdcflow ingest --delta-jars`` takes)."""
    folder = component("delta")
    if folder is None:
        pytest.fail("delta-spark's jars are missing: run scripts/java_deps.sh delta")
    return str(folder)


def delta_reader_rows(spark: SparkSession, path: str) -> list[dict[str, Any]]:
    """The table's rows as ``spark.read.format("delta")`` reads them (no rows when no table exists)."""
    if not DeltaTable.is_deltatable(path):
        return []
    rows: list[dict[str, Any]] = spark.read.format("delta").load(path).toArrow().to_pylist()
    return rows
