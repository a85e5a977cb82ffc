"""Spark settings the connectors need, and checks that fail with the fix when they are missing."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from cdcflow.connectors.errors import SparkSetupError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
TIME_TYPE_KEY = "spark.sql.timeType.enabled"


def cdcflow_spark_config() -> dict[str, str]:
    """Settings to put on the session builder: stateful operators need the RocksDB state store, and
    Debezium's TIME columns Spark's TIME type (off by default in Spark 4.x)."""
    return {PROVIDER_KEY: ROCKSDB_PROVIDER, TIME_TYPE_KEY: "true"}


def require_stateful_setup(spark: SparkSession) -> None:
    """Fail before a stateful query starts if Spark cannot run ``transformWithState`` here."""
    provider = spark.conf.get(PROVIDER_KEY, None)
    if provider != ROCKSDB_PROVIDER:
        raise SparkSetupError(
            f"stateful changelog operators run on transformWithState, which needs the RocksDB state store; "
            f"{PROVIDER_KEY} is {provider!r}. Set it before the first streaming query: "
            f"spark.conf.set('{PROVIDER_KEY}', '{ROCKSDB_PROVIDER}') "
            "(or build the session with cdcflow.connectors.session.cdcflow_spark_config())"
        )
    if importlib.util.find_spec("google.protobuf") is None:
        raise SparkSetupError(
            "stateful changelog operators need the 'protobuf' package in the Python that runs Spark's "
            "workers (PYSPARK_PYTHON): pip install protobuf  (or pip install 'cdcflow[spark]')"
        )
