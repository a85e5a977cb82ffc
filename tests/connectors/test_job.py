"""The stream job (``python -m cdcflow stream``) on its embedded default: the bundled recording of real
Debezium events from PostgreSQL, replayed through ``spark.readStream.format("cdc-debezium")``."""

from __future__ import annotations

import io
from importlib import resources
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdcflow.connectors.replay.dumps import read_messages
from cdcflow.connectors.spark.jobs import stop_quietly, stream_changelog
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


def test_a_stop_whose_answer_was_lost_is_made_again(spark: SparkSession) -> None:
    """Ctrl-C can cut Py4J's answer to the stop short: the query is stopped all the same before the
    session is, or its thread's last call to the driver meets a stopped session (a JVM stack trace)."""
    from py4j.protocol import Py4JNetworkError

    query = spark.readStream.format("rate").load().writeStream.format("noop").start()

    class CutOnce:
        calls = 0

        def stop(self) -> None:
            self.calls += 1
            if self.calls == 1:
                raise Py4JNetworkError("Answer from Java side is empty")
            query.stop()

    cut = CutOnce()
    stop_quietly(cut)  # type: ignore[arg-type]
    assert cut.calls == 2
    assert not query.isActive
    assert query.exception() is None
