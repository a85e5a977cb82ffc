"""A streaming DataFrame whose rows are each the latest value of their key, as a changelog of upserts.

A streaming aggregation (``groupBy(...).agg(...)``) written in ``update`` output mode hands each
micro-batch the groups whose aggregate changed; every row replaces its group's row. Such a DataFrame
has no row-kind column: :func:`as_upserts` adds one holding ``+U`` (a projection after the aggregate,
so the sink and the applier see an ordinary changelog keyed by the grouping columns).

Key columns that are structs (the ``window`` of a windowed aggregation) are flattened into one column
per field, ``window`` becoming ``window_start`` and ``window_end``: a Delta merge and an Arrow
group-by take scalar keys only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdcflow.connectors.errors import ConnectorOptionError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

UPSERT_KIND_COLUMN = "_cdcflow_upsert_kind"
ROW_KIND_COLUMN = "_row_kind"
OUTPUT_MODES = ("append", "update", "complete")


@dataclass(frozen=True)
class ToApply:
    """The DataFrame to write, its key (struct keys flattened), and the applier's options."""

    frame: DataFrame
    key: tuple[str, ...]
    options: dict[str, object]
    upserts: bool


def to_apply(frame: DataFrame, key: Sequence[str], options: Mapping[str, object]) -> ToApply:
    """A changelog as it is, or, when ``row_kind_column`` is None or the default ``_row_kind`` is not a
    column, ``frame``'s rows as upserts of their key (:func:`as_upserts`)."""
    options = dict(options)
    named = "row_kind_column" in options
    kind = options.pop("row_kind_column", ROW_KIND_COLUMN)
    if kind is not None and kind in frame.columns:
        return ToApply(frame, tuple(key), {**options, "row_kind_column": kind}, upserts=False)
    if named and kind is not None:
        raise ConnectorOptionError(
            f"row_kind_column {kind!r} is not a column of the DataFrame ({', '.join(frame.columns)}); "
            "name the changelog's row kind column, or pass row_kind_column=None when every row is the "
            "latest value of its key (a streaming aggregation)"
        )
    refused = sorted({"upsert_key", "materialize"} & options.keys())
    if refused:
        raise ConnectorOptionError(
            f"{', '.join(refused)}: the DataFrame has no row kind column, so each row replaces its key's "
            "row (an upsert stream has no retractions to materialize); leave these options out"
        )
    upserts, flat_key = as_upserts(frame, key)
    options.update(row_kind_column=UPSERT_KIND_COLUMN, upsert_key=flat_key)
    return ToApply(upserts, flat_key, options, upserts=True)


def output_mode(mode: str | None, upserts: bool) -> str:
    """Spark's output mode: ``update`` for upserts (an aggregation needs update or complete with
    foreachBatch), ``append`` for a changelog, unless given."""
    if mode is None:
        return "update" if upserts else "append"
    chosen = mode.strip().lower()
    if chosen not in OUTPUT_MODES:
        raise ConnectorOptionError(f"output_mode must be one of {', '.join(OUTPUT_MODES)}, not {mode!r}")
    return chosen


def as_upserts(frame: DataFrame, key: Sequence[str]) -> tuple[DataFrame, tuple[str, ...]]:
    """``frame`` with its struct key columns flattened and a ``+U`` row-kind column, and its key."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

    missing = [c for c in key if c not in frame.columns]
    if missing:
        raise ConnectorOptionError(
            f"key column(s) {missing} are not columns of the DataFrame ({', '.join(frame.columns)}); "
            "the key of an aggregation is its grouping columns"
        )
    types = {f.name: f.dataType for f in frame.schema.fields}
    flat = {name: list(_flatten(_column(name), name, types[name])) for name in key}
    columns: list[Column] = []
    for name in frame.columns:
        parts = flat.get(name, [(name, _column(name))])
        columns.extend(column.alias(alias) if name in flat else column for alias, column in parts)
    flat_key = [alias for name in key for alias, _ in flat[name]]
    names = [*(c for c in frame.columns if c not in flat), *flat_key]
    clash = sorted({n for n in names if names.count(n) > 1} | ({UPSERT_KIND_COLUMN} & set(names)))
    if clash:
        raise ConnectorOptionError(
            f"column name(s) {clash} would occur twice once the struct key columns are flattened "
            "(<column>_<field>) and the row kind added; rename those columns"
        )
    framed = frame.select(*columns, F.lit("+U").alias(UPSERT_KIND_COLUMN))
    return framed, tuple(flat_key)


def _column(name: str) -> Column:
    from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

    return F.col("`" + name.replace("`", "``") + "`")


def _flatten(column: Column, name: str, kind: DataType) -> Iterator[tuple[str, Column]]:
    from pyspark.sql.types import StructType

    if not isinstance(kind, StructType):
        yield name, column
        return
    for field in kind.fields:
        yield from _flatten(column.getField(field.name), f"{name}_{field.name}", field.dataType)
