"""Registers ``cdc-maxwell`` with Spark, which imports every top-level ``pyspark_*`` module."""

from cdcflow.connectors.spark.sources import MaxwellSource as DefaultSource

__all__ = ["DefaultSource"]
