"""One SparkSession for the whole test session (local[2]), set up the way the connectors need."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from java_cache import component, jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def spark_stack_config() -> dict[str, str]:
    """Spark's Kafka source and Delta Lake's jars from the Maven cache, and loopback networking."""
    config = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    stack = jars("spark-kafka", "delta")
    if stack:
        # S3A for a checkpoint on the S3 tests' server, when scripts/java_deps.sh hadoop-aws ran
        hadoop_aws = component("hadoop-aws", fetch=False)
        s3a = sorted(str(jar) for jar in hadoop_aws.glob("*.jar")) if hadoop_aws is not None else []
        config["spark.jars"] = ",".join([*stack, *s3a])
        config["spark.sql.extensions"] = "io.delta.sql.DeltaSparkSessionExtension"
        config["spark.sql.catalog.spark_catalog"] = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        config["spark.databricks.delta.snapshotPartitions"] = "2"
    return config


_SESSION: list[SparkSession] = []


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    if _SESSION:  # the fixture registered again (a test module or conftest importing it): the same session
        yield _SESSION[0]
        return
    # The JVM starts the Python that PYSPARK_PYTHON names for its workers: this venv's.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from cdcflow.connectors.spark.session import cdcflow_spark_config, installed_pyspark_workers

    builder = SparkSession.builder.master("local[2]").appName("cdcflow-tests")
    for key, value in {**cdcflow_spark_config(), **spark_stack_config()}.items():
        builder = builder.config(key, value)
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
    )
    with installed_pyspark_workers():
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    _SESSION.append(session)
    try:
        yield session
    finally:
        _SESSION.clear()
        session.stop()
