"""Registers ``cdc-debezium-json-registry`` with Spark, which imports every top-level ``pyspark_*`` module."""

from cdcflow.connectors.spark.sources import DebeziumJsonRegistrySource as DefaultSource

__all__ = ["DefaultSource"]
