"""cdcflow on Spark: the ``cdc-*`` sources and FROM_CHANGELOG / TO_CHANGELOG over DataFrames.

    from cdcflow.spark import from_changelog, to_changelog, order_for_sink, fill_unavailable, register

Importing this module imports pyspark; ``import cdcflow`` alone does not.
"""

from cdcflow.connectors.spark.changelog.frames import from_changelog, to_changelog
from cdcflow.connectors.spark.jobs import local_session
from cdcflow.connectors.spark.kafka_frames import decode_kafka
from cdcflow.connectors.spark.session import (
    cdcflow_spark_config,
    default_shuffle_partitions,
    installed_pyspark_workers,
)
from cdcflow.connectors.spark.sink_order import order_for_sink
from cdcflow.connectors.spark.sources import register
from cdcflow.connectors.spark.unavailable_fill import fill_unavailable

__all__ = [
    "cdcflow_spark_config",
    "decode_kafka",
    "default_shuffle_partitions",
    "fill_unavailable",
    "from_changelog",
    "installed_pyspark_workers",
    "local_session",
    "order_for_sink",
    "register",
    "to_changelog",
]
