"""Versioned tables as Spark DataFrames: a history read as of a time, event-time temporal joins, dedup views.

A history is a DataFrame of SCD2 rows (the data columns plus ``valid_from``/``valid_to``), such as the
Delta table :class:`~cdcflow.connectors.lakehouse.delta.history.DeltaHistoryWriter` keeps; a version is valid
over ``[valid_from, valid_to)``, ``valid_to`` NULL while it still holds. Rows with ``valid_from =
valid_to`` (the writer's tombstones) are valid at no time, so no read here returns them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention
from pyspark.sql.pandas.types import from_arrow_schema

from cdcflow.connectors.errors import ConnectorNotSupportedError, ConnectorOptionError

_FACT, _HISTORY, _ROWNUM = "_cdcflow_fact", "_cdcflow_history", "_cdcflow_rownum"


def read_delta(spark: SparkSession, path: str) -> DataFrame:
    """The current rows of the Delta table at ``path`` (its snapshot now: later commits are not seen).

    Spark reads the table's live Parquet files, so no Delta jars are needed; the table must not use
    deletion vectors or column mapping (delta-rs does not write them by default).
    """
    table = DeltaTable(path)
    files = table.file_uris()
    if files:
        return spark.read.parquet(*files)
    schema = from_arrow_schema(pa.schema(table.schema().to_arrow()))
    return spark.createDataFrame([], schema=schema)


def as_of(
    history: DataFrame, t: Any, valid_from: str = "valid_from", valid_to: str = "valid_to"
) -> DataFrame:
    """The versions valid at ``t`` (a value or a Column): ``valid_from <= t < valid_to`` (NULL: open)."""
    _require(history, "history", [valid_from, valid_to])
    return history.where(
        _valid_at(F.col(valid_from), F.col(valid_to), t if isinstance(t, Column) else F.lit(t))
    )


def temporal_join(
    facts: DataFrame,
    history: DataFrame,
    key: Sequence[str] | Mapping[str, str],
    fact_time: str,
    *,
    how: str = "inner",
    valid_from: str = "valid_from",
    valid_to: str = "valid_to",
    history_columns: Sequence[str] | None = None,
) -> DataFrame:
    """Each fact with the version of its key valid at the fact's time (Flink's ``FOR SYSTEM_TIME AS OF``).

    ``key`` names the join columns (the same on both sides) or maps fact columns to history columns.
    ``how="inner"`` drops facts without a valid version, ``"left"`` keeps them with NULLs. The result has
    the facts' columns then ``history_columns`` (default: every history column but the join columns that
    share the facts' names). A streaming ``facts`` gives a stream-static join: each micro-batch is joined
    with ``history`` as that DataFrame reads (for :func:`read_delta`, the files of the snapshot taken
    when it was called).
    """
    if how not in ("inner", "left"):
        raise ConnectorOptionError(f"how must be 'inner' or 'left', not {how!r}")
    pairs = dict(key) if isinstance(key, Mapping) else {column: column for column in key}
    if not pairs:
        raise ConnectorOptionError("key: name the join columns, e.g. key=['currency']")
    _require(facts, "facts", [*pairs, fact_time])
    _require(history, "history", [*pairs.values(), valid_from, valid_to])
    if history_columns is None:
        history_columns = [c for c in history.columns if not (c in pairs and pairs[c] == c)]
    _require(history, "history", history_columns)
    clash = sorted(set(history_columns) & set(facts.columns))
    if clash:
        raise ConnectorOptionError(
            f"history columns {clash} are also fact columns: rename them (withColumnRenamed) or pick the "
            "history columns to keep with history_columns=[...]"
        )
    fact, version = facts.alias(_FACT), history.alias(_HISTORY)

    def h(name: str) -> Column:
        return F.col(f"{_HISTORY}.`{name}`")

    def f(name: str) -> Column:
        return F.col(f"{_FACT}.`{name}`")

    condition = _valid_at(h(valid_from), h(valid_to), f(fact_time))
    for fact_column, history_column in pairs.items():
        condition = (f(fact_column) == h(history_column)) & condition
    joined = fact.join(version, condition, "left_outer" if how == "left" else "inner")
    return joined.select(*(f(c) for c in facts.columns), *(h(c) for c in history_columns))


def latest_by_key(df: DataFrame, key: Sequence[str], time: str) -> DataFrame:
    """The latest row per key (``ROW_NUMBER() OVER (PARTITION BY key ORDER BY time DESC) = 1``), in batch.

    Of rows with the same time the later one in the DataFrame's order wins, as Flink keeps the last
    arrived. For a stream, keep the history instead: DeltaHistoryWriter in ``foreachBatch``.
    """
    if df.isStreaming:
        raise ConnectorNotSupportedError(
            "latest_by_key runs on a batch DataFrame: for a stream, write its changes with "
            "DeltaHistoryWriter (foreachBatch) and read the versions valid now with as_of"
        )
    _require(df, "df", [*key, time])
    order = "_cdcflow_order"
    window = Window.partitionBy(*(F.col(c) for c in key)).orderBy(F.col(time).desc(), F.col(order).desc())
    ranked = df.withColumn(order, F.monotonically_increasing_id()).withColumn(
        _ROWNUM, F.row_number().over(window)
    )
    return ranked.where(F.col(_ROWNUM) == 1).drop(_ROWNUM, order)


def _valid_at(valid_from: Column, valid_to: Column, t: Column) -> Column:
    return (valid_from <= t) & (valid_to.isNull() | (t < valid_to))


def _require(df: DataFrame, name: str, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ConnectorOptionError(f"{name} has no column {missing} (columns: {', '.join(df.columns)})")
