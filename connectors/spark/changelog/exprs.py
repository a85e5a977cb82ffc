"""Stateless FROM_CHANGELOG / TO_CHANGELOG as Spark column expressions: no Python worker, no state.

They follow the engine (:mod:`cdcflow.core`) record by record, including the order of its checks: a
record the engine rejects fails the query here with the same reason, raised by ``raise_error``.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdcflow.connectors.spark.changelog.layout import FrameLayout
from cdcflow.core.params import FromChangelogParams, InvalidOpHandling, ToChangelogParams
from cdcflow.core.rowkind import DEL, INS, UA, UB, RowKind

_CHANGE = "__cdcflow_change"
_OP = "__cdcflow_op"


def column(name: str) -> Column:
    """The top-level column ``name``, taken literally: a dot in it is part of the name."""
    return F.col("`" + name.replace("`", "``") + "`")


def from_changelog_exprs(df: DataFrame, params: FromChangelogParams, layout: FrameLayout) -> DataFrame:
    """Envelopes → changes with ``select`` and ``explode``: one output row per emitted change."""
    images = _Images(params, layout)
    fail = _Failure("from_changelog", layout.sequence_by)
    op = column(params.op)
    changes = F.when(
        op.isNull(),
        fail(
            params.op,
            "the operation code is NULL: the record is corrupt or not a change envelope; fix "
            "the producer, or filter such records out before from_changelog",
        ),
    )
    code = op.cast("string")
    for op_code, kinds in params.op_mapping.groups.items():
        changes = changes.when(code == F.lit(op_code), images.changes(kinds, fail))
    if params.invalid_op_handling is InvalidOpHandling.FAIL:
        known = sorted(params.op_mapping.groups)
        unknown = fail(
            params.op,
            F.concat(
                F.lit("unknown operation code '"),
                code,
                F.lit(
                    f"'; op_mapping knows {known}. Add it to op_mapping, or set invalid_op_handling='LOG' "
                    "or 'SKIP' to skip such records"
                ),
            ),
        )
        changes = changes.otherwise(unknown)
    change = column(_CHANGE)
    image_columns = [change["image"][f.name].alias(f.name) for f in layout.output.fields[:-1]]
    return df.select(F.explode(changes).alias(_CHANGE)).select(
        *image_columns, change["kind"].alias(layout.row_kind_column)
    )


class _Images:
    """The before/after images of an envelope as struct columns of the output's image columns."""

    def __init__(self, params: FromChangelogParams, layout: FrameLayout) -> None:
        self.params = params
        fields = [f.name for f in layout.output.fields[:-1]]
        if params.nested:
            passthrough = [column(name).alias(name) for name in params.passthrough]
            image_names = fields[: len(fields) - len(params.passthrough)]

            def image(field: str) -> Column:
                source = column(field)
                return F.when(
                    source.isNotNull(), F.struct(*(source[n].alias(n) for n in image_names), *passthrough)
                )

            before_field, after_field = image_sources(params)
            self.before = image(before_field)
            # Only ``before`` named: no record has an after image (a NULL of the image's type).
            self.after = image(after_field) if after_field is not None else F.when(F.lit(False), self.before)
        else:
            self.before = self.after = F.struct(*(column(n).alias(n) for n in fields))
        self.new_image = F.coalesce(self.after, self.before)
        self.old_image = F.coalesce(self.before, self.after)

    def changes(self, kinds: frozenset[RowKind], fail: _Failure) -> Column:
        """The changes one operation code stands for, or the engine's error for this record."""
        params = self.params
        source = self.new_image if (INS in kinds or UA in kinds) else self.old_image
        image_field = params.after or params.before
        checks: list[tuple[Column, Column]] = [
            (source.isNull(), fail(image_field, "the record has neither a before nor an after image"))
        ]
        for name in params.partition_by:
            checks.append((source[name].isNull(), fail(name, _NULL_KEY.format(list(params.partition_by)))))
        if len(kinds) == 1:
            (kind,) = kinds
            if kind in (INS, UA):
                checks.append(
                    (self.after.isNull(), fail(params.after, "the image this operation needs is NULL"))
                )
                emitted = [(kind, self.after)]
            else:
                emitted = [(kind, self.old_image)]
        else:
            # Without state only UPDATE_BEFORE, UPDATE_AFTER from a separate before image is possible.
            checks.append((self.after.isNull(), fail(params.after, "the image this operation needs is NULL")))
            checks.append((self.before.isNull(), fail(params.before, _NO_BEFORE.format(params.before))))
            emitted = [(UB, self.before), (UA, self.after)]
        result = F.array(*(F.struct(F.lit(k.value).alias("kind"), img.alias("image")) for k, img in emitted))
        for condition, error in reversed(checks):
            result = F.when(condition, error).otherwise(result)
        return result


def image_sources(params: FromChangelogParams) -> tuple[str, str | None]:
    """The fields the before and the after image come from, as the engine reads them: the same one
    without a separate before image, and no after image when only ``before`` is named."""
    if params.has_before_image:
        assert params.before is not None  # noqa: S101 - a before image has its field
        return params.before, params.after
    single = params.after if params.after is not None else params.before
    assert single is not None  # noqa: S101 - nested means one of them is set
    return single, single


def to_changelog_exprs(df: DataFrame, params: ToChangelogParams, layout: FrameLayout) -> DataFrame:
    """Changes → envelopes with one ``select``: one record per change whose row kind has a code."""
    fail = _Failure("to_changelog", layout.sequence_by)
    kind = column(layout.row_kind_column)
    mapping = params.op_mapping
    drop_update_before = mapping.is_default and not params.nested
    codes = {k: mapping.code_for(k) for k in RowKind}
    if drop_update_before:
        codes[UB] = None
    op = F.when(
        kind.isNull(),
        fail(layout.row_kind_column, "the row kind is NULL: each change needs +I, -U, +U or -D"),
    )
    op = op.when(
        ~kind.isin(*(k.value for k in RowKind)),
        fail(
            layout.row_kind_column,
            F.concat(F.lit("'"), kind, F.lit("' is not a row kind: use one of +I, -U, +U, -D")),
        ),
    )
    for name in params.partition_by:
        op = op.when(column(name).isNull(), fail(name, _NULL_KEY.format(list(params.partition_by))))
    for row_kind, code in codes.items():
        op = op.when(kind == F.lit(row_kind.value), F.lit(code).cast("string"))
    rows = list(layout.image_fields)
    is_delete = kind == F.lit(DEL.value)
    partial = not params.produces_full_deletes and bool(params.partition_by)

    def deleted(name: str) -> Column:
        """A column of a delete record: the key columns only for partial deletes (spec 4.2.1.4)."""
        if partial and name not in params.partition_by:
            return F.when(~is_delete, column(name))
        return column(name)

    if not params.nested:
        record = [column(_OP).alias(params.op), *(deleted(n).alias(n) for n in rows)]
    else:
        images = [n for n in rows if n not in params.passthrough]
        row = F.struct(*(column(n).alias(n) for n in images))
        delete_row = F.struct(*(deleted(n).alias(n) for n in images))
        retracted = F.when(kind == F.lit(UB.value), row).when(is_delete, delete_row)
        added = F.when(kind.isin(INS.value, UA.value), row)
        record = [column(_OP).alias(params.op), *(column(n) for n in params.passthrough)]
        if params.before is None or params.after is None or params.before == params.after:
            single = params.after or params.before
            assert single is not None  # noqa: S101 - nested means one of them is set
            record.append(F.coalesce(added, retracted).alias(single))
        else:
            record += [retracted.alias(params.before), added.alias(params.after)]
    return df.withColumn(_OP, op).where(column(_OP).isNotNull()).select(*record)


_NULL_KEY = (
    "the upsert key column is NULL (or missing): updates and deletes need a key to find their row; check "
    "partition_by={} against the input's columns"
)
_NO_BEFORE = (
    "the update has no before image ('{}' is NULL) to build its -U row. For Debezium on PostgreSQL run "
    "ALTER TABLE ... REPLICA IDENTITY FULL; or derive -U from state with state_ttl and partition_by"
)


class _Failure:
    """``raise_error`` with the engine's reason, the field at fault and the record's ``sequence_by``."""

    def __init__(self, function: str, sequence_by: tuple[str, ...]) -> None:
        self.function = function
        self.where = F.to_json(F.struct(*(column(n) for n in sequence_by))) if sequence_by else None

    def __call__(self, field: str | None, reason: str | Column) -> Column:
        parts = [F.lit(f"{self.function}: ")]
        if self.where is not None:
            parts += [F.lit("record at sequence_by "), self.where, F.lit(", ")]
        if field is not None:
            parts.append(F.lit(f"field '{field}': "))
        parts.append(F.lit(reason) if isinstance(reason, str) else reason)
        return F.raise_error(F.concat(*parts))
