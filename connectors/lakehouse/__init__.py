"""Lakehouse ingestion: changelogs applied to Delta tables (delta-rs) exactly once, and versioned tables."""
