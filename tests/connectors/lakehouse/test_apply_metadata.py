"""Per-change metadata columns in a changelog never decide whether a retraction matches its row.

Flink's Debezium products events (an insert, an update and a delete of id 111 among them), read by the
``cdc-debezium`` source from a topic dump of the file with every metadata column it offers: where the
record was (file/line, topic/partition/offset/timestamp/key/headers) and what the envelope says
(``source.*``, ``op``, ...). Each of these differs, or may differ, between a row's insert and its
delete; the applier's default upsert materialization (no upsert key given) must still delete id 111.
The file is read by Spark once per test module; the applier then runs on the batch's Arrow table
once per column (what ``apply_changes`` does per micro-batch), and one ``apply_changes`` query carries
every column at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from source_cases import EXCLUDE, PRODUCTS, T0_MS

from cdcflow.connectors.lakehouse.delta.apply import DeltaChangeApplier
from cdcflow.connectors.lakehouse.sink import apply_changes, apply_options
from cdcflow.connectors.replay.dumps import write_dump
from cdcflow.formats import Message

pytestmark = pytest.mark.integration

CONNECTOR = ("file", "line", "topic", "partition", "offset", "timestamp", "key", "headers")
FORMAT = (
    "ingestion-timestamp",
    "source.timestamp",
    "source.database",
    "source.schema",
    "source.table",
    "source.properties",
    "transaction.id",
    "op",
    "source.lsn",
    "source.sequence",
    "old-key",
    "new-key",
)
COLUMNS = [*CONNECTOR, *(key.replace(".", "_").replace("-", "_") for key in FORMAT)]
POSITIONS = ("line", "offset", "timestamp", "ingestion_timestamp", "source_timestamp", "source_sequence")
"""The metadata columns that rise through the file: each one can order the changes (sequence_by)."""
PRODUCT_COLUMNS = ["id", "name", "description", "weight"]


def folded() -> dict[int, tuple[str, str]]:
    """The products table the file leaves, folded from its envelopes here: id -> (name, description)."""
    table: dict[int, tuple[str, str]] = {}
    for line in EXCLUDE.read_bytes().splitlines():
        envelope = orjson.loads(line)
        if envelope["op"] == "d":
            del table[envelope["before"]["id"]]
        else:
            after = envelope["after"]
            table[after["id"]] = (after["name"], after["description"])
    return table


def landed(target: Path) -> dict[int, tuple[str, str]]:
    rows = DeltaTable(str(target)).to_pyarrow_table().to_pylist()
    return {row["id"]: (row["name"], row["description"]) for row in rows}


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """EXCLUDE as a topic dump: each line a record with topic, partition, offset, timestamp, key, headers."""
    path = tmp_path_factory.mktemp("metadata") / "products.dump.jsonl"
    messages = []
    for offset, line in enumerate(EXCLUDE.read_bytes().splitlines()):
        envelope = orjson.loads(line)
        row = envelope["after"] or envelope["before"]
        messages.append(
            Message(
                line,
                key=orjson.dumps({"id": row["id"]}),
                topic="dbserver1.inventory.products",
                partition=0,
                offset=offset,
                timestamp_ms=T0_MS + offset,
                headers=(("trace", f"t-{offset}".encode()),),
            )
        )
    write_dump(path, messages)
    return path


def source(spark: SparkSession, dump: Path, reader: Any) -> DataFrame:
    frame: DataFrame = (
        reader.format("cdc-debezium")
        .option("columns", PRODUCTS)
        .option("metadata", ",".join((*CONNECTOR, *FORMAT)))
        .load(str(dump))
    )
    return frame


@pytest.fixture(scope="module")
def changelog(spark: SparkSession, dump: Path) -> pa.Table:
    """The source's changelog of the dump, every metadata column included, as ``foreachBatch`` gets it."""
    table = source(spark, dump, spark.read).toArrow()
    assert set(COLUMNS) <= set(table.column_names)
    return table


def test_the_changelog_holds_an_insert_an_update_and_a_delete_of_id_111(changelog: pa.Table) -> None:
    kinds = [
        row["_row_kind"] for row in changelog.select(["id", "_row_kind"]).to_pylist() if row["id"] == 111
    ]
    assert kinds == ["+I", "-U", "+U", "-D"]
    assert 111 not in folded()


@pytest.mark.parametrize(
    ("column", "sequence_by"),
    [
        *((column, None) for column in COLUMNS),
        *((column, column) for column in POSITIONS),
    ],
    ids=[*COLUMNS, *(f"{column}, sequence_by" for column in POSITIONS)],
)
def test_a_metadata_column_does_not_keep_a_deleted_row(
    changelog: pa.Table, tmp_path: Path, column: str, sequence_by: str | None
) -> None:
    applier = DeltaChangeApplier(
        str(tmp_path / "table"),
        apply_options(["id"], sequence_by=sequence_by),
        app_id="metadata",
        state_path=str(tmp_path / "state"),
    )

    applied = applier.apply(changelog.select([*PRODUCT_COLUMNS, column, "_row_kind"]), 0)

    assert landed(tmp_path / "table") == folded()
    assert applied.unmatched_retractions == 0
    assert applied.deletes == 1


def test_apply_changes_sequenced_by_line_deletes_what_the_input_deletes(
    spark: SparkSession, dump: Path, tmp_path: Path
) -> None:
    """The reported case: every metadata column kept in the table, ordered by the file's line."""
    query = apply_changes(
        source(spark, dump, spark.readStream),
        str(tmp_path / "table"),
        key=["id"],
        checkpoint=str(tmp_path / "checkpoint"),
        sequence_by="line",
        trigger={"availableNow": True},
    )
    query.awaitTermination(120)

    assert query.exception() is None
    assert landed(tmp_path / "table") == folded()
