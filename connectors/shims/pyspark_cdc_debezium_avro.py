"""Registers ``cdc-debezium-avro`` with Spark, which imports every top-level ``pyspark_*`` module."""

from cdcflow.connectors.spark.sources import DebeziumAvroSource as DefaultSource

__all__ = ["DefaultSource"]
