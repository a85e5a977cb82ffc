"""Through Spark, an unchanged-TOAST placeholder in a NOT NULL column is a dead letter with its
coordinates (the query goes on and the other rows land), and through ``ingest`` (which lists such
columns in ``unavailable-columns`` and keeps the table's value) it is no error at all.

The events are the recorded PostgreSQL ones of ``tests/formats/recorded/postgres/no-schemas.jsonl``
(table ``cdc_types``, REPLICA IDENTITY DEFAULT): the update of id 1 at index 13 leaves ``big_text``
unchanged, so Debezium sends its placeholder.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import orjson
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest
from cdcflow.connectors.spark.dead_letters import read_dead_letters

pytestmark = pytest.mark.integration

RECORDED = Path(__file__).parents[1] / "formats" / "recorded" / "postgres" / "no-schemas.jsonl"
COLUMNS = "id INT NOT NULL, c_text STRING, big_text STRING NOT NULL, big_jsonb STRING"
PLACEHOLDER = b"__debezium_unavailable_value"


def cdc_types_values() -> list[bytes]:
    """The events of cdc_types whose big_text is never a NULL Debezium sent (a NULL it did send is a
    NOT NULL violation of its own): the snapshot and changes of ids 1, 4, 10 and 20, no deletes."""
    values = []
    for line in RECORDED.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record["topic"] != "cdcflow.inventory.cdc_types" or record["value"] is None:
            continue
        event = json.loads(record["value"])
        if event["op"] != "d" and event["after"]["big_text"] is not None:
            values.append(record["value"].encode())
    return values


def write_plain(path: Path, values: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(values) + b"\n")
    return path


def test_a_placeholder_in_a_not_null_column_is_a_dead_letter_and_the_query_goes_on(
    spark: SparkSession, tmp_path: Path
) -> None:
    values = cdc_types_values()
    toasted = [i + 1 for i, value in enumerate(values) if PLACEHOLDER in value and b'"big_text":"__' in value]
    assert len(toasted) == 1
    source = write_plain(tmp_path / "cdc_types.jsonl", values)
    rows = (
        spark.read.format("cdc-debezium")
        .option("columns", COLUMNS)
        .option("changelog-mode", "upsert")
        .option("unavailable-values", "report")
        .option("deadLetterPath", str(tmp_path / "dead"))
        .option("metadata", "line")
        .load(str(source))
        .collect()
    )
    [letter] = read_dead_letters(str(tmp_path / "dead"))
    assert letter["line"] == toasted[0] and letter["field"] == "after.big_text"
    assert letter["origin"] == f"{source}:{toasted[0]}"
    assert "declared NOT NULL" in letter["reason"] and "REPLICA IDENTITY FULL" in letter["reason"]
    assert base64.b64decode(letter["value"]) == values[toasted[0] - 1]
    assert sorted(r["line"] for r in rows) == [n for n in range(1, len(values) + 1) if n != toasted[0]]
    assert all(r["big_text"] is not None for r in rows)


def test_the_columnar_path_leaves_the_block_to_the_per_record_decoder(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Retract mode and no metadata: the plain file goes through the columnar decoder, which hands a
    block holding a placeholder to the per-record one."""
    insert = b'{"op":"c","before":null,"after":{"id":1,"name":"a"}}'
    unsent = {"id": 1, "name": PLACEHOLDER.decode()}
    toasted = orjson.dumps({"op": "u", "before": unsent, "after": unsent})
    other = b'{"op":"c","before":null,"after":{"id":2,"name":"b"}}'
    source = write_plain(tmp_path / "events.jsonl", [insert, toasted, other])
    rows = (
        spark.read.format("cdc-debezium")
        .option("columns", "id INT NOT NULL, name STRING NOT NULL")
        .option("unavailable-values", "report")
        .option("deadLetterPath", str(tmp_path / "dead"))
        .load(str(source))
        .collect()
    )
    assert sorted((r["id"], r["name"], r["_row_kind"]) for r in rows) == [(1, "a", "+I"), (2, "b", "+I")]
    [letter] = read_dead_letters(str(tmp_path / "dead"))
    assert (letter["line"], letter["field"]) == (2, "before.name")


def test_ingest_keeps_the_tables_value_of_a_not_null_column_debezium_did_not_send(
    spark: SparkSession, tmp_path: Path
) -> None:
    values = cdc_types_values()
    first_update = next(i for i, value in enumerate(values) if b'"big_text":"__' in value)
    snapshot = json.loads(values[0])["after"]
    assert snapshot["id"] == 1
    source = write_plain(tmp_path / "cdc_types.jsonl", values[: first_update + 1])
    config = IngestConfig(
        format="debezium-json",
        key=("id",),
        target=str(tmp_path / "table"),
        checkpoint=str(tmp_path / "checkpoint"),
        path=str(source),
        schema=COLUMNS,
        options={"changelog-mode": "upsert"},
        sequence_by="none",
    )
    ingest(config, spark)
    table = {row["id"]: row for row in DeltaTable(str(tmp_path / "table")).to_pyarrow_table().to_pylist()}
    assert table[1]["c_text"] == json.loads(values[first_update])["after"]["c_text"] == "updated"
    assert table[1]["big_text"] == snapshot["big_text"]
    assert all(row["big_text"] is not None for row in table.values())
