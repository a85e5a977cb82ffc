"""Every recorded file of the format golden tests, read with ``spark.read.format("cdc-*")``, gives the
golden changelog: Flink's where we agree with it, ours (``golden/*.cdcflow``) where we differ."""

from __future__ import annotations

from pathlib import Path

import pytest
from golden_cases import TESTDATA, GoldenCase, all_cases
from pyspark.errors import PythonException
from pyspark.sql import DataFrameReader, SparkSession
from spark_rows import rendered
from test_golden_flink import KNOWN_DIFFERENCES, expected_ours

from cdcflow.connectors.spark.dead_letters import read_dead_letters

pytestmark = pytest.mark.integration

SOURCE_NAMES = {
    "debezium-json": "cdc-debezium",
    "canal-json": "cdc-canal",
    "maxwell-json": "cdc-maxwell",
    "ogg-json": "cdc-ogg",
}
CASES = all_cases()


def expected(case: GoldenCase) -> list[str]:
    lines = expected_ours(case) if case.case_id in KNOWN_DIFFERENCES else case.rows
    return [line for line in lines if not line.startswith("# side-output")]


def reader(spark: SparkSession, case: GoldenCase, dead_letters: Path) -> DataFrameReader:
    read = spark.read.format(SOURCE_NAMES[case.format]).option("columns", case.schema_ddl)
    for key, value in case.options.items():
        read = read.option(key, value)
    if case.options.get(f"{case.format}.ignore-parse-errors") == "true":
        read = read.option("deadLetterPath", str(dead_letters))
    return read


def relative(text: str) -> str:
    """Origins as the golden files write them: relative to the testdata folder."""
    return text.replace(f"{TESTDATA}/", "")


def dead_letter_lines(path: Path) -> list[str]:
    return [
        relative(f"# dead-letter: {r['origin']} ({r['field'] or 'message'}): {r['reason']}")
        for r in sorted(read_dead_letters(str(path)), key=lambda r: r["line"])
    ]


@pytest.mark.parametrize("case", CASES, ids=[c.case_id for c in CASES])
def test_spark_read_gives_the_golden_changelog(spark: SparkSession, case: GoldenCase, tmp_path: Path) -> None:
    want = expected(case)
    df = reader(spark, case, tmp_path / "dead").load(str(TESTDATA / case.input))
    if want and want[0].startswith("# error: "):
        with pytest.raises(PythonException) as failure:
            df.collect()
        assert want[0].removeprefix("# error: ") in relative(str(failure.value))
        return
    got = rendered(df, case.schema) + dead_letter_lines(tmp_path / "dead")
    assert got == want
