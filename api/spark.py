"""cdcflow on Spark: the ``cdc-*`` sources and FROM_CHANGELOG / TO_CHANGELOG over DataFrames.

    from cdcflow.spark import from_changelog, to_changelog, register

Importing this module imports pyspark; ``import cdcflow`` alone does not.
"""

from cdcflow.connectors.changelog_frames import from_changelog, to_changelog
from cdcflow.connectors.session import cdcflow_spark_config
from cdcflow.connectors.sources import register

__all__ = ["cdcflow_spark_config", "from_changelog", "register", "to_changelog"]
