"""A column added upstream reaches the Delta table: ``ingest`` with inferred columns (schema-include)
over a recorded topic whose Debezium schema block gains ``note`` midway, in several micro-batches,
then again after a restart from the checkpoint."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from cdcflow.connectors.errors import ConnectorOptionError, SchemaChangedError, schema_change
from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest
from cdcflow.connectors.replay.dumps import write_dump
from cdcflow.connectors.spark import inferred_columns
from cdcflow.connectors.spark.read_plan import plan_read
from cdcflow.formats import Message
from cdcflow.formats.types import DataType, Field, Schema, TypeKind, atomic, parse_ddl

TOPIC = "shop.inventory.items"
_ID = {"field": "id", "type": "int32", "optional": False}
_NAME = {"field": "name", "type": "string", "optional": True}
_NOTE = {"field": "note", "type": "string", "optional": True}


def _event(offset: int, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> Message:
    row = after if after is not None else before
    assert row is not None
    fields = [_ID, _NAME, _NOTE] if "note" in row else [_ID, _NAME]
    image = {"type": "struct", "optional": True, "name": f"{TOPIC}.Value", "fields": fields}
    schema = {
        "type": "struct",
        "name": f"{TOPIC}.Envelope",
        "fields": [
            {**image, "field": "before"},
            {**image, "field": "after"},
            {"type": "string", "field": "op"},
        ],
    }
    source = {"connector": "mysql", "file": "binlog.000001", "pos": 1000 + offset, "row": 0, "ts_ms": offset}
    payload = {"before": before, "after": after, "op": op, "source": source, "ts_ms": offset}
    key = orjson.dumps({"id": row["id"]})
    value = orjson.dumps({"schema": schema, "payload": payload})
    return Message(value, key=key, topic=TOPIC, partition=0, offset=offset)


# (op, row): the first four rows' schema block has no note; from the fifth on it has.
FIRST = [
    ("c", {"id": 1, "name": "a"}),
    ("c", {"id": 2, "name": "b"}),
    ("u", {"id": 1, "name": "a2"}),
    ("c", {"id": 6, "name": "f"}),
    ("c", {"id": 3, "name": "c", "note": "n3"}),
    ("u", {"id": 2, "name": "b", "note": "n2"}),
    ("c", {"id": 4, "name": "d", "note": None}),
    ("d", {"id": 3, "name": "c", "note": "n3"}),
    ("u", {"id": 1, "name": "a3", "note": "n1"}),
]
LATER = [
    ("u", {"id": 4, "name": "d", "note": "n4"}),
    ("c", {"id": 5, "name": "e", "note": "n5"}),
]


def _dump(
    path: Path, events: list[tuple[str, dict[str, Any]]], rows: dict[int, dict[str, Any]], first: int
) -> None:
    """Debezium events of ``events`` (op, row) at offsets from ``first``; ``rows`` (the current row of
    each id, updated here) gives updates and deletes their before image."""
    messages = []
    for offset, (op, row) in enumerate(events, start=first):
        before = rows.get(row["id"]) if op in ("u", "d") else None
        after = None if op == "d" else row
        messages.append(_event(offset, op, before, after))
        if after is None:
            del rows[row["id"]]
        else:
            rows[row["id"]] = row
    write_dump(path, messages)


def _table(target: str) -> dict[int, dict[str, Any]]:
    rows = DeltaTable(target).to_pyarrow_table().to_pylist()
    return {row["id"]: {k: row[k] for k in ("name", "note") if k in row} for row in rows}


def test_a_column_added_upstream_reaches_the_table_and_survives_a_restart(
    spark: SparkSession, tmp_path: Path
) -> None:
    topic_dir = tmp_path / "topic"
    topic_dir.mkdir()
    rows: dict[int, dict[str, Any]] = {}
    _dump(topic_dir / "a.dump", FIRST, rows, 0)
    config = IngestConfig(
        format="debezium-json",
        key=("id",),
        target=str(tmp_path / "table"),
        checkpoint=str(tmp_path / "checkpoint"),
        path=str(topic_dir),
        # About two events a micro-batch: the change to the schema lands in the middle of the run.
        options={"schema-include": "true", "maxBytesPerTrigger": "900"},
    )
    out = io.StringIO()
    summary = ingest(config, spark=spark, out=out)

    assert summary.batches >= 4
    assert _table(config.target) == {
        1: {"name": "a3", "note": "n1"},
        2: {"name": "b", "note": "n2"},
        4: {"name": "d", "note": None},
        6: {"name": "f", "note": None},
    }
    assert re.search(
        rf"topic '{TOPIC}' partition 0 offset 4 \S+ adds or widens column\(s\) note STRING", out.getvalue()
    )
    assert DeltaTable(config.target).schema().to_arrow().field("note").nullable

    # A new run infers the columns from the first messages again (no note), plus those the checkpoint
    # records as added: it reads note at once instead of meeting it again and restarting its query.
    assert (tmp_path / "checkpoint" / "cdcflow-added-columns").read_text() == "note STRING\n"
    _dump(topic_dir / "b.dump", LATER, rows, len(FIRST))
    again = io.StringIO()
    ingest(config, spark=spark, out=again)
    assert _table(config.target) == {
        1: {"name": "a3", "note": "n1"},
        2: {"name": "b", "note": "n2"},
        4: {"name": "d", "note": "n4"},
        5: {"name": "e", "note": "n5"},
        6: {"name": "f", "note": None},
    }
    assert "adds or widens column(s)" not in again.getvalue()


def _widening(offset: int, row: dict[str, Any], qty: str) -> Message:
    """A Debezium create of ``row`` whose schema block types ``qty`` as ``qty`` (int32, int64)."""
    message = _event(offset, "c", None, {"id": row["id"], "name": row["name"]})
    envelope = orjson.loads(message.value or b"")
    for image in envelope["schema"]["fields"][:2]:
        image["fields"] = [*image["fields"], {"field": "qty", "type": qty, "optional": True}]
    envelope["payload"]["after"] = row
    return Message(orjson.dumps(envelope), key=message.key, topic=TOPIC, partition=0, offset=offset)


def test_a_column_whose_type_widens_upstream_is_widened_in_the_table(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``ALTER TABLE ... ALTER COLUMN qty TYPE bigint`` upstream: the schema block's qty turns int64 and
    a value no INT holds arrives; the table's column becomes BIGINT, every value exact, and a restart
    applies nothing again."""
    topic_dir = tmp_path / "topic"
    topic_dir.mkdir()
    big = 2**40 + 7
    messages = [_widening(i, {"id": i, "name": f"n{i}", "qty": i * 10}, "int32") for i in range(4)]
    messages += [_widening(4, {"id": 4, "name": "n4", "qty": big}, "int64")]
    messages += [_widening(5, {"id": 1, "name": "again", "qty": -big}, "int64")]
    write_dump(topic_dir / "a.dump", messages)
    config = IngestConfig(
        format="debezium-json",
        key=("id",),
        target=str(tmp_path / "table"),
        checkpoint=str(tmp_path / "checkpoint"),
        path=str(topic_dir),
        options={"schema-include": "true", "maxBytesPerTrigger": "1500"},
    )
    out = io.StringIO()
    summary = ingest(config, spark=spark, out=out)
    assert summary.batches >= 3
    assert "adds or widens column(s) qty BIGINT" in out.getvalue()
    table = DeltaTable(config.target)
    assert pa.schema(table.schema().to_arrow()).field("qty").type == pa.int64()
    assert {r["id"]: r["qty"] for r in table.to_pyarrow_table().to_pylist()} == {
        0: 0,
        1: -big,
        2: 20,
        3: 30,
        4: big,
    }
    version = table.version()
    assert ingest(config, spark=spark, out=io.StringIO()).batches == 0
    assert DeltaTable(config.target).version() == version


def test_a_spark_query_fails_with_the_new_columns_and_the_fix(spark: SparkSession, tmp_path: Path) -> None:
    _dump(tmp_path / "a.dump", FIRST, {}, 0)
    options = {"path": str(tmp_path / "a.dump"), "schema-include": "true"}
    with pytest.raises(
        Exception, match=r"offset 4 \S*a.dump:\d+: the message has columns .* lack: note STRING"
    ) as error:
        spark.read.format("cdc-debezium").options(**options).load().collect()
    assert ".option('addedColumns', 'note STRING')" in str(error.value)
    widened = spark.read.format("cdc-debezium").options(**options, addedColumns="note STRING").load()
    assert [r["note"] for r in widened.orderBy("id", "_row_kind").collect() if r["_row_kind"] == "+I"] == [
        None,
        None,
        "n3",
        None,
        None,
    ]


def test_the_error_carries_its_columns_through_spark_text_and_added_columns_widen_the_plan(
    tmp_path: Path,
) -> None:
    columns = "note STRING, `unit price` DECIMAL(10, 2)"
    error = SchemaChangedError("topic 't' partition 3 offset 9", columns)
    wrapped = f"StreamingQueryException: ... Traceback ...\n{error}\n\tat org.apache.spark..."
    assert schema_change(wrapped) == ("topic 't' partition 3 offset 9", columns)
    assert schema_change("some other failure") is None

    _dump(tmp_path / "a.dump", FIRST, {}, 0)
    options = {"path": str(tmp_path / "a.dump"), "schema-include": "true"}
    plan = plan_read("debezium-json", {**options, "addedColumns": columns}, None)
    assert list(plan.decoded_columns.names)[:4] == ["id", "name", "note", "unit price"]
    with pytest.raises(ConnectorOptionError, match="addedColumns"):
        plan_read("debezium-json", {**options, "columns": "id INT", "addedColumns": columns}, None)


def test_the_query_takes_the_columns_ingest_inferred_and_samples_nothing(tmp_path: Path) -> None:
    """ingest plans its read once on the driver and hands the inferred columns to the query's planning
    (option inferredColumns): an input with no message to infer from plans the same read with them,
    and addedColumns still widens them. Lossless, also for types DDL cannot say."""
    _dump(tmp_path / "a.dump", FIRST, {}, 0)
    options = {"path": str(tmp_path / "a.dump"), "schema-include": "true"}
    plan = plan_read("debezium-json", options, None)
    assert plan.inferred_columns is not None and list(plan.inferred_columns.names) == ["id", "name"]
    assert (
        plan_read("debezium-json", {**options, "columns": "id INT, name STRING"}, None).inferred_columns
        is None
    )

    write_dump(tmp_path / "empty.dump", [])
    empty = {"path": str(tmp_path / "empty.dump"), "schema-include": "true"}
    with pytest.raises(ConnectorOptionError, match="found no message to infer the columns from"):
        plan_read("debezium-json", empty, None)  # sampling would be needed: there is nothing to sample
    handed = {**empty, inferred_columns.OPTION: inferred_columns.encode(plan.inferred_columns)}
    again = plan_read("debezium-json", handed, None)
    assert again.output == plan.output and again.decoded_columns == plan.decoded_columns
    assert again.inferred_columns == plan.inferred_columns
    widened = plan_read("debezium-json", {**handed, "addedColumns": "note STRING"}, None)
    assert list(widened.decoded_columns.names)[:3] == ["id", "name", "note"]

    tricky = parse_ddl("a DECIMAL(12, 2) NOT NULL, b ARRAY<STRUCT<x: INT, y: TIMESTAMP(3)>>")
    tricky = Schema((*tricky, Field("v", DataType(TypeKind.DECIMAL, precision=38, scale=None))))
    tricky = Schema((*tricky, Field("t", atomic(TypeKind.TIMESTAMP_LTZ, 3), nullable=False)))
    assert inferred_columns.decode(inferred_columns.encode(tricky)) == tricky
    with pytest.raises(ConnectorOptionError, match="inferredColumns"):
        plan_read("debezium-json", {**empty, inferred_columns.OPTION: "id INT"}, None)
