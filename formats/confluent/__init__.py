"""Confluent Schema Registry wire formats: the client and header, Avro and JSON Schema mappings."""
