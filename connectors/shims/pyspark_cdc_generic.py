"""Registers ``cdc-generic`` with Spark, which imports every top-level ``pyspark_*`` module."""

from cdcflow.connectors.spark.sources import GenericSource as DefaultSource

__all__ = ["DefaultSource"]
