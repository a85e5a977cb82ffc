"""The stream job (``python -m cdcflow stream``) on its embedded default: the bundled recording of real
Debezium events from PostgreSQL, replayed through ``spark.readStream.format("cdc-debezium")``."""

from __future__ import annotations

import io
from importlib import resources
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdcflow.connectors.replay.dumps import read_messages
from cdcflow.connectors.spark.jobs import stream_changelog
from cdcflow.formats import render_change, resolve_format

pytestmark = pytest.mark.integration

DUMP = str(resources.files("cdcflow.examples").joinpath("postgres-debezium.dump.jsonl"))


def test_main_job_prints_the_changelog_of_the_bundled_recording(spark: SparkSession, tmp_path: Path) -> None:
    out = io.StringIO()
    options = {"path": DUMP, "schema-include": "true"}
    batches = stream_changelog(spark, "cdc-debezium", options, str(tmp_path / "checkpoint"), out)
    assert batches >= 1

    messages = list(read_messages(DUMP))
    decoder = resolve_format("debezium-json").create_decoder({"schema-include": "true"})
    expected = []
    for message in messages:
        for change in decoder.decode_all([message]).changes:
            where = f"{message.topic}/{message.partition}@{message.offset}"
            expected.append(f"{where} {render_change(change, decoder.schema)}")
    assert out.getvalue() == "".join(f"{line}\n" for line in expected)  # values may hold newlines
    assert len(expected) >= 16

    again = io.StringIO()
    stream_changelog(spark, "cdc-debezium", options, str(tmp_path / "checkpoint"), again)
    assert again.getvalue() == "", "a rerun on the same checkpoint reads nothing twice"
