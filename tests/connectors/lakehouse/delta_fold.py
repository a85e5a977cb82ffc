"""The table a changelog leaves behind, computed without the Delta applier, and a Delta table read back
in the same terms.

Both sides meet as Flink-rendered rows (``[101, scooter, 3.14]``, what the golden files hold):

- :func:`fold` runs over the EXPECTED changelog (golden lines, or changes rendered by the pure-Python
  decoder): ``+I``/``+U`` put the row of their key, ``-D`` removes the key, ``-U`` is ignored;
- :func:`rendered_rows` turns the rows read back from Delta (by ``deltalake`` or by Spark over the
  table's files) into the values the decoder produces for the case's schema (:func:`normalize`), then
  renders them with the case's schema.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import DeltaTable

from cdcflow.formats import Schema
from cdcflow.formats.render import render_value
from cdcflow.formats.types import DataType, TypeKind

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Key = tuple[str, ...]


@dataclass(frozen=True)
class Line:
    """One change of an expected changelog: kind, rendered key values, rendered row (``[...]``)."""

    kind: str
    key: Key
    row: str


# --- the expected changelog, as text ----------------------------------------------------------------


def split_fields(body: str) -> list[str]:
    """The top-level values of a rendered row's body (``101, scooter, [1, 2]``).

    Rendered strings are unquoted, so a value holding ``", "`` would split in two: callers check the
    count against the schema (no golden row has such a value before its key column).
    """
    fields, depth, start, i = [], 0, 0, 0
    while i < len(body):
        char = body[i]
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif depth == 0 and body.startswith(", ", i):
            fields.append(body[start:i])
            start = i = i + 2
            continue
        i += 1
    fields.append(body[start:])
    return fields


def parse_line(text: str, schema: Schema, key: Sequence[str]) -> Line:
    kind, body = text[:2], text[3:-1]
    assert kind in ("+I", "-U", "+U", "-D") and text[2] == "[" and text[-1] == "]", text
    values = split_fields(body)
    assert len(values) == len(schema), f"cannot split {text!r} into the {len(schema)} columns"
    names = schema.names
    return Line(kind, tuple(values[names.index(column)] for column in key), f"[{body}]")


def keyed_problem(lines: Sequence[Line]) -> str | None:
    """Why ``lines`` are not an upsert stream keyed by their key, or None when they are.

    Keyed: no key value is null, a ``+I`` never hits a live key (one row per key), and every ``-U`` is
    directly followed by the ``+U`` of the same key. A retraction of a key not seen before is allowed:
    a recording may start after the row was written, and the table starts empty.
    """
    live: set[Key] = set()
    for index, line in enumerate(lines):
        if "null" in line.key:
            return f"null key at change {index + 1} ({line.kind}{line.row})"
        if line.kind == "+I":
            if line.key in live:
                return f"second +I for key {', '.join(line.key)} without a delete between"
            live.add(line.key)
        elif line.kind == "-U":
            after = lines[index + 1] if index + 1 < len(lines) else None
            if after is None or after.kind != "+U" or after.key != line.key:
                return f"the -U at change {index + 1} is not followed by the +U of key {', '.join(line.key)}"
        elif line.kind == "+U":
            live.add(line.key)
        else:
            live.discard(line.key)
    return None


def fold(lines: Iterable[Line]) -> list[str]:
    """The table the changes leave, sorted: +I/+U put the row of their key, -D removes it, -U ignored."""
    table: dict[Key, str] = {}
    for line in lines:
        if line.kind in ("+I", "+U"):
            table[line.key] = line.row
        elif line.kind == "-D":
            table.pop(line.key, None)
    return sorted(table.values())


def update_pair_cuts(kinds: Sequence[str], parts: int) -> list[int]:
    """Row positions cutting ``kinds`` into about ``parts`` batches, never between a -U and its +U."""
    n = len(kinds)
    cuts = []
    for part in range(1, parts):
        cut = n * part // parts
        while 0 < cut < n and kinds[cut - 1] == "-U":
            cut += 1
        if 0 < cut < n and (not cuts or cut > cuts[-1]):
            cuts.append(cut)
    return cuts


def batches(table: pa.Table, parts: int, row_kind_column: str = "_row_kind") -> list[pa.Table]:
    kinds = table.column(row_kind_column).to_pylist()
    bounds = [0, *update_pair_cuts(kinds, parts), table.num_rows]
    return [table.slice(start, end - start) for start, end in zip(bounds, bounds[1:], strict=False)]


# --- the Delta table, read back ---------------------------------------------------------------------


def normalize(value: Any, data_type: DataType) -> Any:
    """A value read back from Delta as the decoder produces it for ``data_type``.

    - TIME: Delta has no TIME type, the column holds ISO text (``'12:30:00.000001'``); parsed back to a
      ``datetime.time`` (a fraction longer than microseconds must be zeros past them).
    - DECIMAL without a scale (Debezium's variable scale): Spark, hence Delta, holds the exact decimal
      as text; back to a ``Decimal``. A DECIMAL(p, s) comes back as a ``Decimal`` of scale s already.
    - TIMESTAMP (an instant): Delta stores UTC microseconds; the value must come back zoned, and is
      moved to UTC (the decoder's zone, rendered ``...Z``). TIMESTAMP_NTZ must come back without a zone.
    - FLOAT: Delta's FLOAT is 32 bits, as the column's type; the renderer prints the float32 as Flink
      does, NaN as ``NaN``, so NaN rows compare equal as text where NaN != NaN as values.
    - MAP: Arrow gives a list of (key, value) pairs; back to a dict in the same order.
    - ARRAY and STRUCT: element by element, field by field.
    """
    if value is None:
        return None
    kind = data_type.kind
    if kind is TypeKind.TIME:
        return _iso_time(value) if isinstance(value, str) else value
    if kind is TypeKind.DECIMAL and data_type.scale is None:
        return Decimal(value) if isinstance(value, str) else value
    if kind is TypeKind.TIMESTAMP_LTZ:
        assert isinstance(value, dt.datetime) and value.tzinfo is not None, f"instant without zone: {value!r}"
        return value.astimezone(dt.UTC)
    if kind is TypeKind.TIMESTAMP_NTZ:
        assert isinstance(value, dt.datetime) and value.tzinfo is None, f"local time with a zone: {value!r}"
        return value
    if kind is TypeKind.MAP:
        assert data_type.key is not None and data_type.value is not None
        pairs = value.items() if isinstance(value, Mapping) else value
        return {normalize(k, data_type.key): normalize(v, data_type.value) for k, v in pairs}
    if kind is TypeKind.ARRAY:
        assert data_type.element is not None
        return [normalize(item, data_type.element) for item in value]
    if kind is TypeKind.STRUCT:
        return {f.name: normalize(value.get(f.name), f.type) for f in data_type.fields}
    return value


_TIME = re.compile(r"(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?")


def _iso_time(text: str) -> dt.time:
    match = _TIME.fullmatch(text)
    assert match, f"TIME column holds {text!r}, not ISO text"
    hours, minutes, seconds, fraction = match.groups()
    digits = (fraction or "").ljust(9, "0")
    assert digits[6:] == "000", f"{text!r} has nanoseconds a TIME value cannot hold"
    return dt.time(int(hours), int(minutes), int(seconds), int(digits[:6]))


def rendered_rows(rows: Iterable[Mapping[str, Any]], schema: Schema) -> list[str]:
    """Rows read back from Delta, normalized and rendered like the fold's rows, sorted."""
    out = []
    for row in rows:
        assert set(row) == set(schema.names), f"table columns {sorted(row)} are not {schema.names}"
        out.append(
            "[" + ", ".join(render_value(normalize(row[f.name], f.type), f.type) for f in schema) + "]"
        )
    return sorted(out)


def deltalake_rows(path: str, storage_options: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The table's rows as ``deltalake`` reads them; no rows when no table was ever created."""
    if not DeltaTable.is_deltatable(path, storage_options=storage_options):
        return []
    rows: list[dict[str, Any]] = (
        DeltaTable(path, storage_options=storage_options).to_pyarrow_table().to_pylist()
    )
    return rows


def spark_rows(
    spark: SparkSession, path: str, storage_options: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The table's rows as Spark reads the table's current files (Spark has no Delta reader here)."""
    if not DeltaTable.is_deltatable(path, storage_options=storage_options):
        return []
    files = DeltaTable(path, storage_options=storage_options).file_uris()
    if not files:
        return []
    rows: list[dict[str, Any]] = spark.read.parquet(*files).toArrow().to_pylist()
    return rows
