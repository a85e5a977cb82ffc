"""The Spark side: cdc-* data sources and sinks, read planning, executor decoding, sessions."""
