"""How a DataFrame's columns feed FROM_CHANGELOG / TO_CHANGELOG, checked against its schema on the driver.

The core validates the parameters; here they meet the DataFrame: the named columns must exist with
usable types, and the result's schema is derived (spec 4.1.2.4, 4.2.1.5 for its shape).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import types as st

from cdcflow.core.errors import ChangelogValidationError
from cdcflow.core.params import FromChangelogParams, ToChangelogParams

KEY_COLUMN_PREFIX = "__cdcflow_key_"
"""Grouping columns added to the input for the stateful operators, dropped before the engine."""

TIME_VALUES_COLUMN = "__cdcflow_event_time_us"
"""On a stream, the event time (``order_by`` / ``on_time``) as epoch microseconds, for timers."""

_OP_TYPES = (st.StringType, st.BooleanType, st.ByteType, st.ShortType, st.IntegerType, st.LongType)


@dataclass(frozen=True)
class FrameLayout:
    """What the Spark side needs to hand rows to the engine and build the result; picklable.

    ``hidden`` are input columns the engine does not see (grouping helpers, ``sequence_by`` columns
    not named in ``passthrough``); ``image_fields`` the columns of the images the engine keeps in state.
    ``time_column`` is the event-time column (``order_by`` / ``on_time``), and ``time_values`` the
    hidden column holding it in microseconds on a stream.
    """

    output: st.StructType
    row_kind_column: str
    sequence_by: tuple[str, ...]
    hidden: tuple[str, ...]
    key_columns: tuple[str, ...]
    image_fields: tuple[str, ...]
    time_column: str | None = None
    time_values: str | None = None


def sequence_columns(sequence_by: str | Sequence[str] | None) -> tuple[str, ...]:
    if sequence_by is None:
        return ()
    names = (sequence_by,) if isinstance(sequence_by, str) else tuple(sequence_by)
    if any(not isinstance(name, str) or not name for name in names):
        raise ChangelogValidationError(f"sequence_by must name columns, got {sequence_by!r}")
    return names


def from_layout(
    schema: st.StructType,
    params: FromChangelogParams,
    row_kind_column: str,
    sequence_by: tuple[str, ...],
    time_values: str | None = None,
) -> FrameLayout:
    """Check an envelope DataFrame against from_changelog's parameters; the result is images + row kind.

    The ``order_by`` column is not part of the result unless ``passthrough`` names it (the engine's).
    """
    columns = {f.name: f for f in schema.fields}
    _require(columns, "op", [params.op], "the operation code column")
    if not isinstance(columns[params.op].dataType, _OP_TYPES):
        raise ChangelogValidationError(
            f"op column '{params.op}' is {columns[params.op].dataType.simpleString()}: operation codes must "
            f"be STRING, BOOLEAN or an integer type; cast it first, e.g. df.withColumn('{params.op}', "
            f"col('{params.op}').cast('string'))"
        )
    _require(columns, "sequence_by", sequence_by, "an ordering column")
    time = params.order_by
    if time is not None:
        _require(columns, "order_by", [time], "the event-time column to sort the rows by")
    dropped = [name for name in sequence_by if name not in params.passthrough]
    if params.nested:
        image = _image_struct(columns, params)
        _require(columns, "passthrough", params.passthrough, "a top-level envelope column")
        clash = [name for name in params.passthrough if name in image.names]
        if clash:
            raise ChangelogValidationError(
                f"passthrough field(s) {clash} are also columns of the image: passthrough fields and image "
                "columns must be disjoint (rename one of them)"
            )
        fields = [*image.fields, *(columns[name] for name in params.passthrough)]
        keyable = set(image.names) | set(params.passthrough)
    else:
        consumed = {params.op, *dropped} | ({time} - set(params.passthrough) if time else set())
        fields = [f for f in schema.fields if f.name not in consumed]
        keyable = {f.name for f in fields}
    missing_keys = [name for name in params.partition_by if name not in keyable]
    if missing_keys:
        where = "the image or passthrough" if params.nested else "the input"
        raise ChangelogValidationError(
            f"partition_by names {missing_keys}, which {where} does not have (columns: {sorted(keyable)}): "
            "partition_by names the upsert key column(s) of the rows"
        )
    image_fields = tuple(f.name for f in fields)
    keys = _key_columns(columns, max(len(params.partition_by), 1) if time else len(params.partition_by))
    _reserved(columns, time_values)
    return FrameLayout(
        output=_with_row_kind(fields, row_kind_column),
        row_kind_column=row_kind_column,
        sequence_by=sequence_by,
        hidden=(*dropped, *keys, *((time_values,) if time_values else ())),
        key_columns=keys,
        image_fields=image_fields,
        time_column=time,
        time_values=time_values,
    )


def to_layout(
    schema: st.StructType,
    params: ToChangelogParams,
    row_kind_column: str,
    sequence_by: tuple[str, ...],
    group_columns: int,
    time_values: str | None = None,
) -> FrameLayout:
    """Check a changelog DataFrame against to_changelog's parameters; the result is the envelope.

    The ``on_time`` column is not part of the envelope unless ``passthrough`` names it (the engine's).
    """
    columns = {f.name: f for f in schema.fields}
    _require(columns, "row_kind_column", [row_kind_column], "the row kind column (+I, -U, +U, -D)")
    if not isinstance(columns[row_kind_column].dataType, st.StringType):
        raise ChangelogValidationError(
            f"row_kind_column '{row_kind_column}' must be a STRING column holding +I, -U, +U or -D"
        )
    _require(columns, "sequence_by", sequence_by, "an ordering column")
    dropped = {name for name in sequence_by if name not in params.passthrough}
    rows = [f for f in schema.fields if f.name != row_kind_column and f.name not in dropped]
    row_names = {f.name for f in rows}
    _require({f.name: f for f in rows}, "partition_by", params.partition_by, "an upsert key column")
    time = params.on_time
    if time is not None:
        _require({f.name: f for f in rows}, "on_time", [time], "the event-time column of the rows")
    written = [f for f in rows if f.name != time or time in params.passthrough]
    if params.nested:
        _require({f.name: f for f in rows}, "passthrough", params.passthrough, "a column of the rows")
        image = st.StructType([_nullable(f) for f in written if f.name not in params.passthrough])
        envelope = [st.StructField(params.op, st.StringType(), False)]
        envelope += [_nullable(columns[name]) for name in params.passthrough]
        for name in dict.fromkeys(n for n in (params.before, params.after) if n is not None):
            envelope.append(st.StructField(name, image, True))
        output = st.StructType(envelope)
    else:
        if params.op in row_names:
            raise ChangelogValidationError(
                f"the input already has a column '{params.op}', which the op field would overwrite: name "
                "another op field with op='...'"
            )
        output = st.StructType(
            [st.StructField(params.op, st.StringType(), False), *(_nullable(f) for f in written)]
        )
    keys = _key_columns(columns, group_columns)
    _reserved(columns, time_values)
    return FrameLayout(
        output=output,
        row_kind_column=row_kind_column,
        sequence_by=sequence_by,
        hidden=(*sorted(dropped), *keys, *((time_values,) if time_values else ())),
        key_columns=keys,
        image_fields=tuple(f.name for f in rows),
        time_column=time,
        time_values=time_values,
    )


def _image_struct(columns: dict[str, st.StructField], params: FromChangelogParams) -> st.StructType:
    names = [n for n in dict.fromkeys((params.before, params.after)) if n is not None]
    _require(columns, "before/after", names, "a STRUCT column holding a row image")
    structs = []
    for name in names:
        data_type = columns[name].dataType
        if not isinstance(data_type, st.StructType):
            raise ChangelogValidationError(
                f"image column '{name}' is {data_type.simpleString()}, not a STRUCT: before/after name "
                "STRUCT columns; parse JSON images first, e.g. from_json(col, schema)"
            )
        structs.append(data_type)
    if len(structs) == 2 and _shape(structs[0]) != _shape(structs[1]):
        raise ChangelogValidationError(
            f"the before and after images have different columns ({structs[0].simpleString()} vs "
            f"{structs[1].simpleString()}): both images must describe the same row"
        )
    return st.StructType([_nullable(f) for f in structs[-1].fields])


def _shape(struct: st.StructType) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in struct.fields]


def _require(columns: dict[str, st.StructField], param: str, names: Sequence[str], what: str) -> None:
    missing = [name for name in names if name not in columns]
    if missing:
        raise ChangelogValidationError(
            f"{param} names {missing}, but the DataFrame has no such column (columns: {sorted(columns)}); "
            f"{param} must name {what}"
        )


def _key_columns(columns: dict[str, st.StructField], count: int) -> tuple[str, ...]:
    keys = tuple(f"{KEY_COLUMN_PREFIX}{i}" for i in range(count))
    taken = [name for name in keys if name in columns]
    if taken:
        raise ChangelogValidationError(f"the input has columns {taken}, names cdcflow reserves: rename them")
    return keys


def _reserved(columns: dict[str, st.StructField], name: str | None) -> None:
    if name is not None and name in columns:
        raise ChangelogValidationError(f"the input has a column '{name}', a name cdcflow reserves: rename it")


def _with_row_kind(fields: Sequence[st.StructField], row_kind_column: str) -> st.StructType:
    if any(f.name == row_kind_column for f in fields):
        raise ChangelogValidationError(
            f"row_kind_column '{row_kind_column}' is also a column of the output: pass "
            "row_kind_column='...' with another name"
        )
    return st.StructType(
        [*(_nullable(f) for f in fields), st.StructField(row_kind_column, st.StringType(), False)]
    )


def _nullable(field: st.StructField) -> st.StructField:
    return st.StructField(field.name, field.dataType, True, field.metadata)
