"""Registers ``cdc-ogg`` with Spark, which imports every top-level ``pyspark_*`` module."""

from cdcflow.connectors.spark.sources import shim_source

DefaultSource = shim_source(__name__)

__all__ = ["DefaultSource"]
