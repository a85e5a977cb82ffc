"""The ``cdc-*`` sources' options as a Spark user meets them: their errors, the row kind column,
the columns inferred from Debezium's schema block, a dead-letter directory, explicit registration."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from golden_cases import GOLDEN, load
from pyspark.sql import SparkSession
from pyspark.sql import types as st
from source_cases import (
    EXCLUDE,
    GOLDEN_ROWS,
    INCLUDE,
    LINE_OF_ROW,
    PRODUCTS,
    analysis_error,
    debezium,
    render,
    rendered,
)

from cdcflow.connectors.spark.dead_letters import read_dead_letters
from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import parse_ddl, render_change

pytestmark = pytest.mark.integration


# --- options ------------------------------------------------------------------------------------


def test_unknown_option_lists_the_valid_ones(spark: SparkSession) -> None:
    text = analysis_error(
        lambda: spark.read.format("cdc-debezium").option("schemaInclude", "true").load(str(EXCLUDE))
    )
    # Spark hands the options over with lower-cased keys.
    assert "ConnectorOptionError: Unsupported options for format 'debezium-json': schemainclude." in text
    for valid in ("columns", "deadLetterPath", "subscribePattern", "kafka.*", "debezium-json.schema-include"):
        assert valid in text


def test_ignore_parse_errors_needs_a_dead_letter_target(spark: SparkSession) -> None:
    text = analysis_error(
        lambda: debezium(spark).option("ignore-parse-errors", "true").load(str(EXCLUDE)).collect()
    )
    assert "'debezium-json.ignore-parse-errors' is true but rejected records need somewhere to go" in text
    assert "set deadLetterPath (a directory) or deadLetterTopic" in text


def test_unknown_metadata_key_lists_the_available_ones(spark: SparkSession) -> None:
    text = analysis_error(lambda: debezium(spark).option("metadata", "line,table").load(str(EXCLUDE)))
    assert (
        "unknown metadata column 'table'; available: topic, partition, offset, timestamp, key, headers"
        in text
    )
    adds = (
        "line; format 'debezium-json' adds ingestion-timestamp, new-key, old-key, op, schema, source.database"
    )
    assert adds in text


def test_schema_without_the_row_kind_column_says_how_to_fix_it(spark: SparkSession) -> None:
    text = analysis_error(
        lambda: spark.read.format("cdc-debezium").schema(PRODUCTS).load(str(EXCLUDE)).collect()
    )
    assert "has no '_row_kind' column for the row kind: add `_row_kind STRING NOT NULL` to it" in text
    assert ".option('columns', '<DDL>')" in text


def test_schema_with_the_row_kind_and_metadata_columns_reads_like_option_columns(spark: SparkSession) -> None:
    df = (
        spark.read.format("cdc-debezium")
        .schema(f"{PRODUCTS}, line BIGINT, _row_kind STRING NOT NULL")
        .option("metadata", "line")
        .load(str(EXCLUDE))
    )
    rows = df.toArrow().to_pylist()
    assert df.columns == ["id", "name", "description", "weight", "line", "_row_kind"]
    assert [render(row) for row in rows] == GOLDEN_ROWS
    assert [row["line"] for row in rows] == LINE_OF_ROW


def test_row_kind_column_option_renames_it(spark: SparkSession) -> None:
    df = debezium(spark).option("rowKindColumn", "op_kind").load(str(EXCLUDE))
    assert df.columns == ["id", "name", "description", "weight", "op_kind"]
    assert df.schema["op_kind"] == st.StructField("op_kind", st.StringType(), False)
    assert rendered(df, "op_kind") == GOLDEN_ROWS


# --- inferred columns ---------------------------------------------------------------------------


INCLUDE_ROWS = load(GOLDEN / "flink-debezium-data-schema-include-double.golden").rows


@pytest.mark.parametrize(
    "key", ["schema-include", "debezium-json.schema-include", "DEBEZIUM-JSON.Schema-Include"]
)
def test_schema_include_infers_the_columns_with_or_without_the_format_prefix(
    spark: SparkSession, key: str
) -> None:
    df = (
        spark.read.format("cdc-debezium")
        .option(key, "true")
        .option("metadata", "source.table")
        .load(str(INCLUDE))
    )
    # What the Kafka Connect schema block declares: int32, string (optional false), string, double.
    assert df.schema == st.StructType(
        [
            st.StructField("id", st.IntegerType(), False),
            st.StructField("name", st.StringType(), False),
            st.StructField("description", st.StringType(), True),
            st.StructField("weight", st.DoubleType(), True),
            st.StructField("source_table", st.StringType(), True, {"cdcflow.metadata": "source.table"}),
            st.StructField("_row_kind", st.StringType(), False),
        ]
    )
    rows = df.toArrow().to_pylist()
    schema = parse_ddl("id INT NOT NULL, name STRING, description STRING, weight DOUBLE")
    got = [render_change(Change(RowKind.from_short_string(r["_row_kind"]), r), schema) for r in rows]
    assert got == INCLUDE_ROWS
    assert {row["source_table"] for row in rows} == {"products"}


# --- dead letters -------------------------------------------------------------------------------


def test_bad_line_goes_to_the_dead_letter_path_with_its_bytes(spark: SparkSession, tmp_path: Path) -> None:
    lines = EXCLUDE.read_bytes().splitlines()
    bad = b'{"before":null,"after":{"id":"not a number"},"op":"c"}'
    source = tmp_path / "events.txt"
    source.write_bytes(b"\n".join([lines[0], bad, b"{oops", lines[1]]) + b"\n")
    dead = tmp_path / "dead"
    df = debezium(spark).option("deadLetterPath", str(dead)).load(str(source))
    assert rendered(df) == GOLDEN_ROWS[:2]
    letters = sorted(read_dead_letters(str(dead)), key=lambda r: r["line"])
    assert [(r["file"], r["line"], base64.b64decode(r["value"])) for r in letters] == [
        (str(source), 2, bad),
        (str(source), 3, b"{oops"),
    ]
    assert [r["origin"] for r in letters] == [f"{source}:2", f"{source}:3"]
    assert [(r["format"], r["field"], r["reason"]) for r in letters] == [
        ("debezium-json", "after.id", "expected an integer for INT, got 'not a number'"),
        (
            "debezium-json",
            None,
            "not valid JSON (unexpected character, expected a string key at character 1)",
        ),
    ]


def test_register_is_explicit_and_idempotent(spark: SparkSession) -> None:
    import cdcflow

    cdcflow.register(spark)
    cdcflow.register(spark)
    assert rendered(debezium(spark).load(str(EXCLUDE))) == GOLDEN_ROWS
