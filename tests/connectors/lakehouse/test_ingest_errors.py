"""What ``ingest`` says when a change cannot be applied: where the change came from, in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest
from cdcflow.core import CdcflowError


def test_a_null_key_names_the_file_and_line_and_the_table_keeps_no_origin_column(
    spark: SparkSession, tmp_path: Path
) -> None:
    recorded = tmp_path / "orders.jsonl"
    recorded.write_text(
        '{"before": null, "after": {"id": 1, "name": "a"}, "op": "c"}\n'
        "\n"
        '{"before": null, "after": {"id": 2, "name": "b"}, "op": "c"}\n'
        '{"before": null, "after": {"id": null, "name": "c"}, "op": "c"}\n',
        encoding="utf-8",
    )
    config = IngestConfig(
        format="debezium-json",
        key=("id",),
        target=str(tmp_path / "table"),
        checkpoint=str(tmp_path / "checkpoint"),
        path=str(recorded),
        schema="id INT, name STRING",
        sequence_by="none",
    )
    with pytest.raises(CdcflowError) as raised:
        ingest(config, spark)
    message = str(raised.value)
    assert f"{recorded}:4: key column 'id' is null" in message, message
    assert "row " not in message and "Traceback" not in message
    assert "\n" not in message

    # Without the bad change the table is written without the columns the job added to say where.
    recorded.write_text(recorded.read_text(encoding="utf-8").rsplit("\n", 2)[0] + "\n", encoding="utf-8")
    fresh = dataclasses.replace(config, checkpoint=str(tmp_path / "checkpoint2"))
    ingest(fresh, spark)
    assert [f.name for f in DeltaTable(fresh.target).schema().fields] == ["id", "name"]


def test_origin_columns_are_left_out_when_the_table_has_a_column_of_that_name() -> None:
    from cdcflow.connectors.lakehouse.ingest import origin_columns

    common = {"format": "debezium-json", "key": ("id",), "target": "t", "checkpoint": "c"}
    kafka = {"bootstrap_servers": "127.0.0.1:1", "topics": ("orders",)}
    assert origin_columns(IngestConfig(**common, **kafka, schema="id INT")) == (
        "topic",
        "partition",
        "offset",
    )
    assert origin_columns(IngestConfig(**common, **kafka, schema="id INT, offset BIGINT")) == ()
    asked = IngestConfig(**common, path="x", schema="id INT", options={"metadata": "line"})
    assert origin_columns(asked) == ("file",)
