"""FROM_CHANGELOG and TO_CHANGELOG as Spark SQL table functions (spec 4.1, 4.2), over batch queries.

    SELECT * FROM FROM_CHANGELOG(
        input => TABLE(cdc_stream),
        before => 'before', after => 'after',
        op_mapping => map('c, r', 'INSERT', 'd', 'DELETE', 'u', 'UPDATE_AFTER'),
        partition_by => 'id', state_ttl => INTERVAL '10' MINUTE)

Python UDTFs with a static ``analyze``: the arguments are checked, and the result's columns derived,
when Spark analyses the query, with the DataFrame API's rules and messages. The spec's spellings
that Spark SQL has no syntax for: ``DESCRIPTOR(f)`` is the string ``'f'`` (or ``'DESCRIPTOR(f)'``),
several fields ``'f1, f2'`` or ``array('f1', 'f2')``; ``MAP[k, v, ...]`` is ``map(k, v, ...)``;
``INTERVAL`` takes day-time units only.

Spark does not show a TABLE argument's ``PARTITION BY`` / ``ORDER BY`` to the function, so the key,
the event time and the input order are arguments here (``partition_by``, ``order_by`` /
``on_time``, ``sequence_by``). A call that keeps state per key (or sorts) asks Spark for that
partitioning and order itself, and then takes no ``PARTITION BY`` clause; a stateless call accepts
the clauses and ignores them, as its result does not depend on them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from pyspark.errors import PySparkValueError
from pyspark.sql import Row, SparkSession
from pyspark.sql import types as st
from pyspark.sql.functions import udtf
from pyspark.sql.udtf import (
    AnalyzeArgument,
    AnalyzeResult,
    OrderingColumn,
    PartitioningColumn,
    UserDefinedTableFunction,
)

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.spark.changelog.conversion import Conversion, FromRows, ToRows
from cdcflow.connectors.spark.changelog.exprs import image_sources
from cdcflow.connectors.spark.changelog.frames import ROW_KIND_COLUMN
from cdcflow.connectors.spark.changelog.layout import FrameLayout, from_layout, sequence_columns, to_layout
from cdcflow.core.errors import CdcflowError
from cdcflow.core.params import (
    FROM_CHANGELOG_ARGUMENTS,
    TO_CHANGELOG_ARGUMENTS,
    FromChangelogParams,
    plan_from_changelog,
    plan_to_changelog,
)
from cdcflow.core.rowkind import INS, UA
from cdcflow.core.state import InMemoryStateStore

EXTENSIONS = ("sequence_by", "row_kind_column")
"""Arguments beyond the engine's parameters (the DataFrame API has them too)."""

_ARGUMENTS: dict[Callable[..., object], tuple[str, ...]] = {
    plan_from_changelog: FROM_CHANGELOG_ARGUMENTS,
    plan_to_changelog: TO_CHANGELOG_ARGUMENTS,
}
FIELD_ARGUMENTS = frozenset({"op", "before", "after", "order_by", "on_time"})
COLUMN_ARGUMENTS = frozenset({"partition_by", "passthrough", "sequence_by"})
_STREAMING_QUERY_ID = "sql.streaming.queryId"
_PYTHON_ARGUMENT = re.compile(r"\b([a-z_]+)='")
_DESCRIPTOR = re.compile(r"^\s*DESCRIPTOR\s*\((.*)\)\s*$", re.IGNORECASE | re.DOTALL)


@dataclass
class ChangelogAnalysis(AnalyzeResult):
    """``analyze``'s result, which Spark hands to each instance: the planned conversion travels with it."""

    conversion: FromRows | ToRows | None = None
    keyed: bool = False


class _ChangelogFunction:
    """The part both table functions share: rows in, the engine, rows out (one engine per instance).

    A keyed call gets one instance per key (Spark's partitioning), rows in ``sequence_by`` order, and
    ``terminate`` is that key's end of input. Otherwise an instance is one input partition.
    """

    function_name = ""

    def __init__(self, analysis: ChangelogAnalysis) -> None:
        assert analysis.conversion is not None  # noqa: S101 - analyze always plans one
        if analysis.keyed and _in_stream():
            raise ConnectorOptionError(
                f"{self.function_name} with state (state_ttl, -U/+U combined into one record, order_by "
                "or on_time) runs on batch queries only: a SQL table function starts afresh at every "
                "micro-batch, so its state would not carry over. On a stream use the DataFrame API, "
                "cdcflow.spark.from_changelog / to_changelog, which keeps state in Spark's state store"
            )
        self._conversion: Conversion = analysis.conversion
        self._hidden = frozenset(analysis.conversion.layout.hidden)
        self._names = tuple(analysis.schema.names)
        now = time.time()  # one processing time per query: nothing expires within a batch query
        self._engine = self._conversion.engine(lambda: now, InMemoryStateStore())

    def eval(self, input: Row, **_: Any) -> Iterator[tuple[Any, ...]]:  # noqa: A002 - the spec's name
        record = {k: v for k, v in input.asDict(recursive=True).items() if k not in self._hidden}
        yield from self._rows(self._conversion.feed(self._engine, record))

    def terminate(self) -> Iterator[tuple[Any, ...]]:
        yield from self._rows(self._conversion.finish(self._engine))

    def _rows(self, records: list[dict[str, Any]]) -> Iterator[tuple[Any, ...]]:
        names = self._names
        for record in records:
            yield tuple(record.get(name) for name in names)


class FromChangelogFunction(_ChangelogFunction):
    """``FROM_CHANGELOG(input => TABLE(t), op => 'op', ...)``: envelopes → changelog rows + ``_row_kind``."""

    function_name = "FROM_CHANGELOG"

    @staticmethod
    def analyze(*args: AnalyzeArgument, **kwargs: AnalyzeArgument) -> ChangelogAnalysis:
        return _analyze("FROM_CHANGELOG", plan_from_changelog, _plan_from, args, kwargs)


class ToChangelogFunction(_ChangelogFunction):
    """``TO_CHANGELOG(input => TABLE(t), ...)``: changelog rows with ``_row_kind`` → envelopes."""

    function_name = "TO_CHANGELOG"

    @staticmethod
    def analyze(*args: AnalyzeArgument, **kwargs: AnalyzeArgument) -> ChangelogAnalysis:
        return _analyze("TO_CHANGELOG", plan_to_changelog, _plan_to, args, kwargs)


Planner = Callable[[st.StructType, dict[str, Any]], ChangelogAnalysis]


def _analyze(
    name: str,
    engine_plan: Callable[..., object],
    plan: Planner,
    args: tuple[AnalyzeArgument, ...],
    kwargs: Mapping[str, AnalyzeArgument],
) -> ChangelogAnalysis:
    """Check the call and plan it; an error is Spark's analysis error carrying our message."""
    try:
        known = (*_ARGUMENTS[engine_plan], *EXTENSIONS)
        if len(args) > 1:
            raise CdcflowError(
                f"{name} takes one positional argument, the input table; name the others, e.g. "
                f"{name}(input => TABLE(t), op => 'type')"
            )
        table = args[0] if args else kwargs.get("input")
        if table is None or not table.isTable:
            raise CdcflowError(
                f"{name} needs its input as a table argument: {name}(input => TABLE(t), ...) or "
                f"{name}(TABLE(SELECT ...), ...)"
            )
        assert isinstance(table.dataType, st.StructType)  # noqa: S101 - a table argument's type
        unknown = sorted(set(kwargs) - {"input", *known})
        if unknown:
            raise CdcflowError(f"no argument(s) named {unknown}; the arguments are input, {', '.join(known)}")
        values = {key: _constant(name, key, arg) for key, arg in kwargs.items() if key != "input"}
        return plan(table.dataType, {k: v for k, v in values.items() if v is not None})
    except CdcflowError as error:
        raise PySparkValueError(f"{name}: {_sql_spelling(str(error))}") from None


def _sql_spelling(message: str) -> str:
    """The engine's messages say how to fix a Python call; say it in SQL."""
    message = message.replace("timedelta(0)", "INTERVAL '0' MINUTE").replace("a timedelta", "an INTERVAL")
    return _PYTHON_ARGUMENT.sub(r"\1 => '", message)


def _in_stream() -> bool:
    """Whether this task belongs to a streaming query's micro-batch."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context is not None and context.getLocalProperty(_STREAMING_QUERY_ID) is not None


def _constant(function: str, name: str, arg: AnalyzeArgument) -> Any:
    """An argument's value as the engine takes it; arguments must be constants."""
    if arg.isTable or not arg.isConstantExpression:
        raise CdcflowError(
            f"argument {name} must be a constant (a literal, array(...), map(...) or INTERVAL), not a "
            f"column or a table; e.g. {function}(input => TABLE(t), op => 'type')"
        )
    value = arg.value
    if value is None:
        return None
    if name in FIELD_ARGUMENTS:
        return _descriptor(name, value, single=True)
    if name in COLUMN_ARGUMENTS:
        return _descriptor(name, value, single=False)
    if name == "state_ttl":
        if isinstance(value, timedelta) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            return value
        raise CdcflowError(
            f"state_ttl must be a day-time INTERVAL (e.g. INTERVAL '10' MINUTE; INTERVAL '0' MINUTE keeps "
            f"state forever) or seconds, got {value!r}"
        )
    return value


def _descriptor(name: str, value: Any, *, single: bool) -> str | tuple[str, ...]:
    """``'f'``, ``'f1, f2'``, ``'DESCRIPTOR(f1, f2)'`` or ``array('f1', 'f2')`` → field name(s)."""
    if isinstance(value, str):
        match = _DESCRIPTOR.match(value)
        names = [n.strip() for n in (match.group(1) if match else value).split(",")]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        names = [n.strip() for n in value]
    else:
        raise CdcflowError(f"{name} names fields: write '{name}_field' or array('f1', 'f2'), got {value!r}")
    if single:
        if len(names) != 1:
            raise CdcflowError(f"{name} names one field, got {names}")
        return names[0]
    return tuple(names)


def _split_extensions(values: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...], str]:
    sequence_by = sequence_columns(values.pop("sequence_by", None))
    row_kind_column = values.pop("row_kind_column", ROW_KIND_COLUMN)
    if not isinstance(row_kind_column, str) or not row_kind_column:
        raise CdcflowError(f"row_kind_column must name a column, got {row_kind_column!r}")
    return values, sequence_by, row_kind_column


def _plan_from(schema: st.StructType, values: dict[str, Any]) -> ChangelogAnalysis:
    engine_args, sequence_by, row_kind_column = _split_extensions(values)
    params = plan_from_changelog(**engine_args)
    layout = from_layout(schema, params, row_kind_column, sequence_by)
    keyed = params.stateful or params.order_by is not None
    keys = _from_key_sql(params) if keyed else []
    return _analysis(FromRows(params, layout), layout, keyed, keys)


def _plan_to(schema: st.StructType, values: dict[str, Any]) -> ChangelogAnalysis:
    engine_args, sequence_by, row_kind_column = _split_extensions(values)
    params = plan_to_changelog(**engine_args)
    keyed = params.op_mapping.combines_updates or params.keeps_images or params.on_time is not None
    layout = to_layout(schema, params, row_kind_column, sequence_by, 0)
    keys = [_quoted(name) for name in params.partition_by] if keyed else []
    return _analysis(ToRows(params, layout), layout, keyed, keys)


def _analysis(
    conversion: FromRows | ToRows, layout: FrameLayout, keyed: bool, keys: list[str]
) -> ChangelogAnalysis:
    """A keyed call asks Spark for each key's rows together (all rows when there is no key), in
    ``sequence_by`` order; a stateless one leaves the input as it is."""
    if keyed and not layout.sequence_by and layout.time_column is None:
        raise CdcflowError(
            "this call keeps state per key, so each key's rows must reach it in their order, and Spark "
            "hands rows over in shuffle order: name the order with sequence_by => 'seq' (e.g. "
            "array('kafka_partition', 'kafka_offset')), or sort by event time with "
            "order_by / on_time => 'ts'"
        )
    order = [OrderingColumn(_quoted(name)) for name in layout.sequence_by] if keyed else []
    return ChangelogAnalysis(
        schema=layout.output,
        withSinglePartition=keyed and not keys,
        partitionBy=[PartitioningColumn(key) for key in keys],
        orderBy=order,
        conversion=conversion,
        keyed=keyed,
    )


def _from_key_sql(params: FromChangelogParams) -> list[str]:
    """The engine's key of each envelope as SQL: from the image a record's operation writes (as the
    DataFrame API's grouping)."""
    if not params.nested:
        return [_quoted(name) for name in params.partition_by]
    before_field, after_field = image_sources(params)
    old = _quoted(before_field)
    new = old if after_field is None else _quoted(after_field)
    writes = [code for code, kinds in params.op_mapping.groups.items() if INS in kinds or UA in kinds]
    codes = ", ".join(_literal(code) for code in writes) or "NULL"
    image = (
        f"(CASE WHEN CAST({_quoted(params.op)} AS STRING) IN ({codes}) "
        f"THEN coalesce({new}, {old}) ELSE coalesce({old}, {new}) END)"
    )
    return [_quoted(n) if n in params.passthrough else f"{image}.{_quoted(n)}" for n in params.partition_by]


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


FUNCTIONS: tuple[type[_ChangelogFunction], ...] = (FromChangelogFunction, ToChangelogFunction)


def register_functions(spark: SparkSession) -> None:
    """Register FROM_CHANGELOG and TO_CHANGELOG as SQL table functions of ``spark``."""
    for function in FUNCTIONS:
        # udtf(cls) builds the function (classic or Spark Connect's); its annotation also allows a decorator
        table_function = cast("UserDefinedTableFunction", udtf(function, useArrow=False))
        spark.udtf.register(function.function_name, table_function)


__all__ = [
    "ChangelogAnalysis",
    "FromChangelogFunction",
    "ToChangelogFunction",
    "register_functions",
]
