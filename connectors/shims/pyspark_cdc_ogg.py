"""Registers ``cdc-ogg`` with Spark, which imports every top-level ``pyspark_*`` module."""

from cdcflow.connectors.spark.sources import OggSource as DefaultSource

__all__ = ["DefaultSource"]
