"""Kafka without Spark: options, offsets, reading ranges, producing, listing partitions."""
