"""Registers ``cdc-canal`` with Spark, which imports every top-level ``pyspark_*`` module."""

from cdcflow.connectors.spark.sources import CanalSource as DefaultSource

__all__ = ["DefaultSource"]
