"""``cdc-debezium-json-registry``: recorded Debezium PostgreSQL envelopes, framed in Confluent's JSON
Schema wire format and kept in a topic dump, read by Spark with the writer schema fetched from the
HTTP registry stand-in (executors are other processes: they cannot share a ``mock://`` registry)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from registry_server import RegistryHandler, serving
from spark_rows import rendered
from test_debezium_json_registry import BROKEN, SMALL_SCHEMA, framed, recorded

from cdcflow.connectors.replay.dumps import write_dump
from cdcflow.connectors.spark.dead_letters import read_dead_letters
from cdcflow.formats import Message, parse_ddl

pytestmark = pytest.mark.integration


def test_spark_reads_a_recorded_dump_with_the_registry_schema(spark: SparkSession, tmp_path: Path) -> None:
    topic = "cdcflow.inventory.cdc_small"
    bodies = [*recorded("cdc_small"), BROKEN]
    dump = tmp_path / "cdc_small.dump.jsonl"
    write_dump(
        dump,
        [
            Message(framed(17, body), topic=topic, partition=0, offset=offset, timestamp_ms=0)
            for offset, body in enumerate(bodies)
        ],
    )
    handler = RegistryHandler.fresh()
    handler.schemas[17] = (SMALL_SCHEMA, "JSON")
    with serving(handler) as port:
        df = (
            spark.read.format("cdc-debezium-json-registry")
            .option("url", f"http://127.0.0.1:{port}")
            .option("validate", "true")
            .option("ignore-parse-errors", "true")
            .option("deadLetterPath", str(tmp_path / "dead"))
            .load(str(dump))
        )
        table = parse_ddl("id INT NOT NULL, label STRING")
        assert [f.name for f in df.schema.fields] == ["id", "label", "_row_kind"]
        assert rendered(df, table) == ["+I[1, snapshot row]", "+I[2, streamed row]", "+I[99, end]"]
    [letter] = read_dead_letters(str(tmp_path / "dead"))
    assert letter["reason"] == "does not match writer schema 17 at $.after.id: 'x' is not of type 'integer'"
    assert letter["offset"] == 4
    assert "GET /schemas/ids/17?subject=cdcflow.inventory.cdc_small-value" in handler.requests
