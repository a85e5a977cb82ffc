"""Registers ``cdc-upsert-kafka`` with Spark, which imports every top-level ``pyspark_*`` module."""

from cdcflow.connectors.spark.sources import UpsertKafkaSource as DefaultSource

__all__ = ["DefaultSource"]
