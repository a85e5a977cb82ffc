"""``fill_unavailable``: real Debezium events of a REPLICA IDENTITY DEFAULT table, whose updates leave
TOASTed columns out, read in several micro-batches by one task per record: the key's earlier image is
in another task and batch, so only Spark's state store can fill them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from cdcflow.connectors.replay.dumps import write_dump
from cdcflow.connectors.spark.unavailable_fill import fill_unavailable
from cdcflow.formats import Message, resolve_format

pytestmark = pytest.mark.integration

RECORDED = Path(__file__).parent.parent / "formats" / "recorded" / "postgres" / "schemas.jsonl"
TOPIC = "cdcflow.inventory.cdc_types"
TOASTED = ("big_text", "big_jsonb", "c_int_array")
FORMAT = {"schema-include": "true", "changelog-mode": "upsert"}


def recorded() -> list[Message]:
    out = []
    for line in RECORDED.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record["topic"] == TOPIC:
            value, key = record["value"], record["key"]
            out.append(
                Message(
                    None if value is None else value.encode(),
                    key=key.encode(),
                    topic=TOPIC,
                    partition=0,
                    offset=len(out),
                )
            )
    return out


def fold(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    table: dict[int, dict[str, Any]] = {}
    for row in rows:
        if row["_row_kind"] in ("+I", "+U"):
            table[row["id"]] = {c: row[c] for c in TOASTED}
        elif row["_row_kind"] == "-D":
            table.pop(row["id"], None)
    return table


SPLIT_RECORDS = "10"
"""4 kB splits (400 bytes a record): most of the 16 recorded messages (9 kB on average) in a partition of
their own, without hundreds of empty tasks."""


def test_state_store_fills_what_a_partition_decoder_cannot(spark: SparkSession, tmp_path: Path) -> None:
    messages = recorded()
    dump = tmp_path / "cdc_types.dump.jsonl"
    write_dump(dump, messages)
    # The reference: one decoder over the whole stream (tests/formats checks it equals PostgreSQL's rows).
    whole = resolve_format("debezium-json").create_decoder(FORMAT).decode_all(messages)
    truth = fold([{**c.row, "_row_kind": c.kind.value} for c in whole.changes])
    assert truth[1]["big_jsonb"] is not None and truth[1]["c_int_array"]

    collected: dict[str, list[dict[str, Any]]] = {"report": [], "filled": []}

    def run(name: str, filled: bool) -> int:
        def collect(batch: DataFrame, batch_id: int) -> None:
            rows = batch.toArrow().to_pylist()
            collected[name] += sorted(rows, key=lambda r: r["source_sequence"])

        changes = (
            spark.readStream.format("cdc-debezium")
            .options(**FORMAT)
            .option("unavailable-values", "report")
            .option("metadata", "unavailable-columns,source.sequence")
            .option("maxRecordsPerPartition", SPLIT_RECORDS)
            .option("maxBytesPerTrigger", "40000")
            .load(str(dump))
        )
        if filled:
            changes = fill_unavailable(changes, ["id"], sequence_by=["source_sequence"])
        query = (
            changes.writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / name))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert query.exception() is None
        return len({p["batchId"] for p in query.recentProgress})

    assert run("report", filled=False) >= 3
    reported = fold(collected["report"])
    assert reported[1]["big_jsonb"] is None  # what REPORT alone leaves: the value is in an earlier batch

    assert run("filled", filled=True) >= 3
    assert fold(collected["filled"]) == truth
    assert all(not row["unavailable_columns"] for row in collected["filled"])


def test_batch_dataframes_are_filled_per_key_in_sequence(spark: SparkSession, tmp_path: Path) -> None:
    messages = recorded()
    dump = tmp_path / "cdc_types.dump.jsonl"
    write_dump(dump, messages)
    whole = resolve_format("debezium-json").create_decoder(FORMAT).decode_all(messages)
    changes = (
        spark.read.format("cdc-debezium")
        .options(**FORMAT)
        .option("unavailable-values", "report")
        .option("metadata", "unavailable-columns,source.sequence")
        .option("maxRecordsPerPartition", SPLIT_RECORDS)
        .load(str(dump))
    )
    rows = fill_unavailable(changes, ["id"], sequence_by=["source_sequence"]).toArrow().to_pylist()
    rows.sort(key=lambda r: r["source_sequence"])
    assert fold(rows) == fold([{**c.row, "_row_kind": c.kind.value} for c in whole.changes])
