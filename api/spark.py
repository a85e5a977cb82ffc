"""cdcflow on Spark: the ``cdc-*`` sources and FROM_CHANGELOG / TO_CHANGELOG over DataFrames.

    from cdcflow.spark import from_changelog, to_changelog, order_for_sink, fill_unavailable, register

Importing this module imports pyspark; ``import cdcflow`` alone does not.
"""

from cdcflow.connectors.changelog_frames import from_changelog, to_changelog
from cdcflow.connectors.kafka_frames import decode_kafka
from cdcflow.connectors.session import cdcflow_spark_config
from cdcflow.connectors.sink_order import order_for_sink
from cdcflow.connectors.sources import register
from cdcflow.connectors.unavailable_fill import fill_unavailable

__all__ = [
    "cdcflow_spark_config",
    "decode_kafka",
    "fill_unavailable",
    "from_changelog",
    "order_for_sink",
    "register",
    "to_changelog",
]
