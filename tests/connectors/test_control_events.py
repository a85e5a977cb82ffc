"""``controlEvents=emit``: each control event of real Debezium PostgreSQL events (TRUNCATE, a logical
decoding message) is one row, exactly once, whatever the input partitions and micro-batches, with
its coordinates and metadata; the primary-key change carries ``old-key`` / ``new-key``."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from cdcflow.connectors.replay.dumps import write_dump
from cdcflow.connectors.spark.jobs import stream_changelog
from cdcflow.formats import Message

pytestmark = pytest.mark.integration

RECORDED = Path(__file__).parent.parent / "formats" / "recorded" / "postgres" / "schemas.jsonl"
TOPICS = ("cdcflow.inventory.cdc_types_full", "cdcflow.inventory.cdc_small", "cdcflow.message")
COLUMNS = "id INT NOT NULL, label STRING"


def recorded_dump(path: Path) -> list[Message]:
    """The recording's messages of TOPICS as a topic dump (two Kafka partitions, offsets per partition)."""
    messages: list[Message] = []
    offsets = [0, 0]
    for line in RECORDED.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record["topic"] not in TOPICS:
            continue
        partition = TOPICS.index(record["topic"]) % 2
        messages.append(
            Message(
                None if record["value"] is None else record["value"].encode(),
                key=None if record["key"] is None else record["key"].encode(),
                topic=record["topic"],
                partition=partition,
                offset=offsets[partition],
                headers=tuple((name, value.encode()) for name, value in record.get("headers", [])),
            )
        )
        offsets[partition] += 1
    write_dump(path, messages)
    return messages


OPTIONS = {
    "columns": COLUMNS,
    "schema-include": "true",
    "controlEvents": "emit",
    "metadata": "topic,partition,offset,source.table,old-key,new-key",
    # a split per 16 kB (40 records of 400 bytes), about one recorded message with its schema block: ~20
    # input partitions for 21 messages (a split of 400 bytes made ~875 tasks, nearly all empty)
    "maxRecordsPerPartition": "40",
}


def summary(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(
        (
            r["topic"],
            r["partition"],
            r["offset"],
            r["_control"],
            r["_row_kind"],
            r["id"],
            r["old_key"],
            r["new_key"],
        )
        for r in rows
    )


def expected(messages: list[Message]) -> list[tuple[Any, ...]]:
    rows = []
    for m in messages:
        if m.value is None:
            continue
        payload = json.loads(m.value)["payload"]
        where = (m.topic, m.partition, m.offset)
        op = payload["op"]
        headers = {name: json.loads(value)["payload"] for name, value in m.headers if "key" in name}
        old = (
            json.dumps(headers["__debezium.oldkey"], separators=(",", ":"))
            if "__debezium.oldkey" in headers
            else None
        )
        new = (
            json.dumps(headers["__debezium.newkey"], separators=(",", ":"))
            if "__debezium.newkey" in headers
            else None
        )
        if op in ("t", "m"):
            rows.append((*where, {"t": "truncate", "m": "message"}[op], None, None, None, None))
        elif op == "u":
            rows.append((*where, None, "-U", payload["before"]["id"], old, new))
            rows.append((*where, None, "+U", payload["after"]["id"], old, new))
        elif op == "d":
            rows.append((*where, None, "-D", payload["before"]["id"], old, new))
        else:
            rows.append((*where, None, "+I", payload["after"]["id"], old, new))
    return sorted(rows)


def test_batch_read_emits_each_control_event_once_across_input_partitions(
    spark: SparkSession, tmp_path: Path
) -> None:
    dump = tmp_path / "topic.dump.jsonl"
    messages = recorded_dump(dump)
    df = spark.read.format("cdc-debezium").options(**OPTIONS).load(str(dump))
    assert df.rdd.getNumPartitions() >= 10
    rows = df.toArrow().to_pylist()
    assert summary(rows) == expected(messages)
    truncate = next(r for r in rows if r["_control"] == "truncate")
    assert (truncate["topic"], truncate["source_table"], truncate["label"]) == (
        "cdcflow.inventory.cdc_small",
        "cdc_small",
        None,
    )
    assert [(r["id"], r["old_key"], r["new_key"]) for r in rows if r["old_key"] or r["new_key"]] == [
        (2, None, '{"id":20}'),
        (20, '{"id":2}', None),
    ]


def test_streaming_emits_each_control_event_once_across_micro_batches(
    spark: SparkSession, tmp_path: Path
) -> None:
    dump = tmp_path / "topic.dump.jsonl"
    messages = recorded_dump(dump)
    batches: list[list[dict[str, Any]]] = []

    def collect(batch: DataFrame, batch_id: int) -> None:
        batches.append(batch.toArrow().to_pylist())

    query = (
        spark.readStream.format("cdc-debezium")
        .options(**OPTIONS, maxBytesPerTrigger="60000")
        .load(str(dump))
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None
    assert len(batches) >= 3
    assert summary([row for batch in batches for row in batch]) == expected(messages)


def test_the_stream_command_prints_control_events_in_place(spark: SparkSession, tmp_path: Path) -> None:
    dump = tmp_path / "topic.dump.jsonl"
    recorded_dump(dump)
    out = io.StringIO()
    options = {"path": str(dump), "columns": COLUMNS, "schema-include": "true"}
    stream_changelog(spark, "cdc-debezium", options, str(tmp_path / "checkpoint"), out)
    small = [line for line in out.getvalue().splitlines() if line.startswith("cdcflow.inventory.cdc_small/")]
    assert small == [
        "cdcflow.inventory.cdc_small/1@0 +I[1, snapshot row]",
        "cdcflow.inventory.cdc_small/1@1 +I[2, streamed row]",
        "cdcflow.inventory.cdc_small/1@2 ! truncate",
        "cdcflow.inventory.cdc_small/1@3 +I[99, end]",
    ]
    assert "cdcflow.message/0@" in out.getvalue() and " ! message" in out.getvalue()
