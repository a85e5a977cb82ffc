"""Applying changelog batches to Delta tables with delta-rs; no Spark."""
