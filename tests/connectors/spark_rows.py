"""Spark output back in the engine's terms, to compare with the format golden files."""

from __future__ import annotations

from pyspark.sql import DataFrame

from cdcflow.connectors.spark.arrow_types import changes_from_arrow
from cdcflow.core.model import Change
from cdcflow.formats import Schema, render_change


def collect_changes(df: DataFrame, schema: Schema, row_kind_column: str = "_row_kind") -> list[Change]:
    """The DataFrame's rows as changes, in Spark's order (through Arrow: time zones stay explicit)."""
    return changes_from_arrow(df.toArrow(), schema, row_kind_column)


def rendered(df: DataFrame, schema: Schema) -> list[str]:
    return [render_change(change, schema) for change in collect_changes(df, schema)]
