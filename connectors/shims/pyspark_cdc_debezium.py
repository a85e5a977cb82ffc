"""Registers ``cdc-debezium`` with Spark, which imports every top-level ``pyspark_*`` module."""

from cdcflow.connectors.spark.sources import DebeziumSource as DefaultSource

__all__ = ["DefaultSource"]
