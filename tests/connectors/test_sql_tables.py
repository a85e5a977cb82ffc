"""The ``cdc-*`` sources from SQL: ``CREATE TEMPORARY VIEW`` and ``CREATE TABLE ... USING`` read the
recorded files of the format golden tests, in batch and as a stream, and give the golden changelog."""

from __future__ import annotations

from pathlib import Path

import pytest
from golden_cases import TESTDATA, GoldenCase, all_cases
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from spark_rows import rendered
from test_read_recorded import SOURCE_NAMES, expected

from cdcflow.connectors.spark.sources import SOURCES

pytestmark = pytest.mark.integration

DELTA_CATALOG = "spark.sql.catalog.spark_catalog"


@pytest.fixture(scope="module")
def catalog(spark: SparkSession) -> SparkSession:
    """A session whose ``spark_catalog`` is Spark's own: Delta's catalog resolves every table of
    another provider through Spark's V1 sources, which have no Python data sources (docs/sql.md)."""
    session = spark.newSession()
    session.conf.unset(DELTA_CATALOG)
    return session


CASE_IDS = ("flink-debezium-data-schema-exclude", "flink-canal-data", "flink-maxwell-data", "flink-ogg-data")
CASES = [case for case in all_cases() if case.case_id in CASE_IDS]


def options_sql(case: GoldenCase, input_dir: Path) -> str:
    options = {"path": str(input_dir), "columns": case.schema_ddl, **case.options}
    return ", ".join(f"`{key}` '{value}'" for key, value in options.items())


def input_dir(case: GoldenCase, tmp_path: Path) -> Path:
    """The recorded file alone in a directory (a stream reads directories)."""
    directory = tmp_path / "in"
    directory.mkdir()
    (directory / Path(case.input).name).write_bytes((TESTDATA / case.input).read_bytes())
    return directory


def stream_rows(spark: SparkSession, df: DataFrame, case: GoldenCase, tmp_path: Path) -> list[str]:
    got: list[str] = []
    query = (
        df.writeStream.trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .foreachBatch(lambda batch, _: got.extend(rendered(batch, case.schema)))
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    return got


@pytest.mark.parametrize("case", CASES, ids=[c.format for c in CASES])
def test_a_temporary_view_reads_the_golden_changelog(
    spark: SparkSession, case: GoldenCase, tmp_path: Path
) -> None:
    source = SOURCE_NAMES[case.format]
    options = options_sql(case, input_dir(case, tmp_path))
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW recorded USING `{source}` OPTIONS ({options})")
    assert rendered(spark.sql("SELECT * FROM recorded"), case.schema) == expected(case)


@pytest.mark.parametrize("case", CASES, ids=[c.format for c in CASES])
def test_a_table_reads_the_golden_changelog_in_batch_and_as_a_stream(
    catalog: SparkSession, case: GoldenCase, tmp_path: Path
) -> None:
    spark = catalog
    source = SOURCE_NAMES[case.format]
    directory = input_dir(case, tmp_path)
    table = f"recorded_{case.format.replace('-', '_')}"
    spark.sql(f"CREATE TABLE {table} USING `{source}` OPTIONS ({options_sql(case, directory)})")
    try:
        assert rendered(spark.sql(f"SELECT * FROM {table}"), case.schema) == expected(case)
        assert spark.sql(f"SELECT * FROM STREAM {table}").isStreaming
        assert stream_rows(spark, spark.readStream.table(table), case, tmp_path) == expected(case)
    finally:
        spark.sql(f"DROP TABLE {table}")
    assert [p.name for p in directory.iterdir()] == [Path(case.input).name]  # the input is not the table's


def test_a_querys_options_win_over_the_tables(catalog: SparkSession, tmp_path: Path) -> None:
    spark = catalog
    case = next(c for c in CASES if c.format == "debezium-json")
    options = options_sql(case, input_dir(case, tmp_path))
    head = tmp_path / "head"
    head.mkdir()
    (head / "head.json").write_bytes(b"\n".join((TESTDATA / case.input).read_bytes().splitlines()[:3]))
    spark.sql(f"CREATE TABLE recorded_override USING `cdc-debezium` OPTIONS ({options})")
    try:
        df = spark.sql(f"SELECT * FROM recorded_override WITH ('path' = '{head}')")
        loaded = spark.read.format("cdc-debezium").option("columns", case.schema_ddl).load(str(head))
        assert rendered(df, case.schema) == rendered(loaded, case.schema) == expected(case)[:3]
    finally:
        spark.sql("DROP TABLE recorded_override")


def test_a_table_with_a_column_list_says_how_to_give_its_options(catalog: SparkSession) -> None:
    spark = catalog
    spark.sql("CREATE TABLE listed (id INT, name STRING) USING `cdc-debezium` OPTIONS (path '/nowhere')")
    try:
        with pytest.raises(AnalysisException) as failure:
            spark.sql("SELECT * FROM listed").collect()
    finally:
        spark.sql("DROP TABLE listed")
    assert "does not hand its OPTIONS to a Python data source" in str(failure.value)
    assert "OPTIONS (columns 'id INT, ...', ...)" in str(failure.value)


@pytest.mark.parametrize("source", [s.short_name for s in SOURCES])
def test_every_source_takes_create_table_options_without_the_catalogs_keys(
    catalog: SparkSession, source: str
) -> None:
    """Spark adds owner, provider, location and an ``option.`` copy of each option: none is refused as
    unknown; what is refused is what the source itself lacks (here: an input)."""
    spark = catalog
    with pytest.raises(AnalysisException) as failure:
        spark.sql(f"CREATE TABLE nowhere USING `{source}` OPTIONS (columns 'id INT NOT NULL, name STRING')")
    message = str(failure.value)
    assert "Unsupported options" not in message
    assert "owner" not in message and "option.columns" not in message


def test_a_table_refuses_credentials_in_its_options(catalog: SparkSession, tmp_path: Path) -> None:
    """Its options live in its schema, which every DataFrame read from the table carries."""
    case = next(c for c in CASES if c.format == "debezium-json")
    options = options_sql(case, input_dir(case, tmp_path))
    with pytest.raises(AnalysisException) as failure:
        catalog.sql(
            f"CREATE TABLE with_secret USING `cdc-debezium` OPTIONS ({options}, "
            "`kafka.sasl.jaas.config` 'org.apache.kafka.common.security.plain.PlainLoginModule required "
            'username="u" password="hunter22";\')'
        )
    assert "['kafka.sasl.jaas.config'] hold credentials" in str(failure.value)
    assert "hunter22" not in str(failure.value)


def test_a_reads_catalog_like_option_is_refused_not_dropped(spark: SparkSession) -> None:
    """Only Spark's catalog makes a table: a read's own 'owner' option is an unknown option."""
    reader = spark.read.format("cdc-debezium").option("columns", "id INT").option("owner", "me")
    with pytest.raises(AnalysisException, match="Unsupported options for format 'debezium-json': owner"):
        reader.load("/nowhere").collect()
