"""Recorded topics: topic dumps and line files read as Kafka topics, and recording one."""
