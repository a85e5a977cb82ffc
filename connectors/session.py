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
SHUFFLE_PARTITIONS_KEY = "spark.sql.shuffle.partitions"
SHUFFLE_PARTITIONS_PER_CORE = 2


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


def default_shuffle_partitions(spark: SparkSession) -> int | None:
    """Set ``spark.sql.shuffle.partitions`` to 2 per core when nobody set it; returns what it set.

    Spark's default, 200, is fixed into a stateful streaming query's checkpoint when it first starts:
    a small stream would then run 200 state-store tasks per micro-batch, most of them empty. A value
    set on the builder, with ``--conf`` or ``spark.conf.set`` is kept. Spark Connect sessions are
    left alone (whether a value was set is not visible there).
    """
    session = getattr(spark, "_jsparkSession", None)
    if session is None:
        return None
    if session.sessionState().conf().contains(SHUFFLE_PARTITIONS_KEY):
        return None
    partitions = SHUFFLE_PARTITIONS_PER_CORE * max(1, spark.sparkContext.defaultParallelism)
    spark.conf.set(SHUFFLE_PARTITIONS_KEY, str(partitions))
    return partitions
