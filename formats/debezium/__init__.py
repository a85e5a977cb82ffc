"""Debezium envelopes: shared parts, source position, JSON, Avro, JSON Schema, and the Arrow fast path."""
