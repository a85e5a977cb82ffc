"""FROM_CHANGELOG and TO_CHANGELOG over Spark DataFrames, batch and streaming (spec 4.1, 4.2).

Parameters carry the spec's names and meaning, and the results are the engine's
(:mod:`cdcflow.core`) for the same rows:

* stateless conversions are column expressions (``select`` / ``explode``), so they run anywhere a
  DataFrame runs, with no Python worker (but ``invalid_op_handling='LOG'``, which runs the engine
  over each partition to log every skipped record);
* stateful ones (``state_ttl``; to_changelog combining ``-U``/``+U`` into one record, or filling
  ``before`` from state; an event-time column, ``order_by`` / ``on_time``) group the rows by
  ``partition_by`` and run the engine per key: on a stream through ``transformWithState`` with the
  key's state in Spark's state store (checkpointed: it survives a restart), on a batch DataFrame
  through ``mapInArrow`` over partitions holding each key's rows together, in order.

Order: the engine handles a key's rows in input order. Spark's grouping does not keep the order of
rows inside a micro-batch, so name the stream position with ``sequence_by`` (e.g. Kafka's
``partition``, ``offset``): each key's rows are sorted by it. Without it, the order within a
micro-batch is Spark's; across micro-batches it is the stream's.

Event time on a stream: the column needs a watermark (``withWatermark``). Rows wait in the state
store until the watermark passes them, then go to the engine in event-time order and each key's
changes are compacted, as the engine does at a watermark. from_changelog's late rows (at or below the
previous micro-batch's watermark) are dropped by Spark before the operator and counted in the query
progress (``stateOperators[].numRowsDroppedByWatermark``); to_changelog writes a change at or below
the current watermark at once, as the engine does.

``state_ttl`` is processing time: every row of a micro-batch sees the batch's time, and a key's state
expires ``state_ttl`` after the last batch that wrote it; the engine ignores expired state, and an
event-time timer frees it. The operator never runs in Spark's processing-time mode, whose idle
micro-batches keep ``trigger(availableNow=True)`` from ending (SPARK-50180): without an event-time
column, a watermark on the batch's processing time drives those timers. ``uid`` names the state, so
keep it when the query evolves.

A stateful stream needs the RocksDB state store provider and the ``protobuf`` package
(:func:`cdcflow.connectors.spark.session.cdcflow_spark_config`); its shuffle partitions default to two per
core (:func:`cdcflow.connectors.spark.session.default_shuffle_partitions`).
"""

from __future__ import annotations

import re
from typing import Unpack

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as st

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.spark.arrow_types import arrow_schema
from cdcflow.connectors.spark.changelog.conversion import Conversion, FromRows, ToRows
from cdcflow.connectors.spark.changelog.exprs import (
    column,
    from_changelog_exprs,
    image_sources,
    to_changelog_exprs,
)
from cdcflow.connectors.spark.changelog.layout import (
    TIME_VALUES_COLUMN,
    from_layout,
    sequence_columns,
    to_layout,
)
from cdcflow.connectors.spark.changelog.partitions import partition_function
from cdcflow.connectors.spark.changelog.processor import ChangelogProcessor, StreamPlan
from cdcflow.connectors.spark.session import default_shuffle_partitions, require_stateful_setup
from cdcflow.core.params import (
    Columns,
    FromChangelogArgs,
    FromChangelogParams,
    InvalidOpHandling,
    ToChangelogArgs,
    plan_from_changelog,
    plan_to_changelog,
)
from cdcflow.core.rowkind import INS, UA

ROW_KIND_COLUMN = "_row_kind"

WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"
"""The metadata Spark's ``withWatermark`` puts on its event-time column."""

WATERMARK_POLICY_KEY = "spark.sql.streaming.multipleWatermarkPolicy"
BATCH_TIME_COLUMN = "__cdcflow_batch_time"


def from_changelog(
    df: DataFrame,
    *,
    row_kind_column: str = ROW_KIND_COLUMN,
    sequence_by: Columns | None = None,
    **args: Unpack[FromChangelogArgs],
) -> DataFrame:
    """Envelopes (``op`` + flat columns, or ``op`` + ``before``/``after`` structs) → a changelog.

    The result has the image columns (then ``passthrough``) and ``row_kind_column`` holding
    ``+I``/``-U``/``+U``/``-D``. ``state_ttl`` (a timedelta or seconds; 0 keeps state forever) makes
    the conversion stateful, keyed by ``partition_by``. ``order_by`` names an event-time column: the
    rows are sorted by it and each key's changes compacted at each watermark (on a stream, the
    column needs ``withWatermark``; a batch DataFrame is one window). Parameters and columns are
    checked here, before any row flows.

    ``args`` are FROM_CHANGELOG's parameters (:class:`~cdcflow.core.params.FromChangelogArgs`): ``op``
    ("op"), ``before``, ``after``, ``op_mapping``, ``invalid_op_handling`` ("FAIL"), ``partition_by``,
    ``order_by``, ``state_ttl``, ``consume_full_deletes`` (False), ``passthrough``, ``uid``.
    """
    params = plan_from_changelog(**args)
    time_values = _event_time(df, "from_changelog", "order_by", params.order_by)
    layout = from_layout(df.schema, params, row_kind_column, sequence_columns(sequence_by), time_values)
    if params.stateful or params.order_by is not None:
        # Without partition_by every record shares one key (the spec's parallelism 1).
        keys = _from_key_columns(params) or [F.lit(0)]
        plan = StreamPlan(_state_name(params.uid), params.state_ttl_seconds)
        return _grouped(df, FromRows(params, layout), keys, plan)
    if params.invalid_op_handling is InvalidOpHandling.LOG:
        # A warning per skipped record needs Python: the engine runs over each partition, in order.
        conversion = FromRows(params, layout)
        function = partition_function(conversion, arrow_schema(layout.output), stateful=False)
        return df.mapInArrow(function, layout.output)
    return from_changelog_exprs(df, params, layout)


def to_changelog(
    df: DataFrame,
    *,
    row_kind_column: str = ROW_KIND_COLUMN,
    sequence_by: Columns | None = None,
    **args: Unpack[ToChangelogArgs],
) -> DataFrame:
    """A changelog (rows with ``row_kind_column``) → envelopes: ``op`` + flat columns, or ``op`` +
    ``passthrough`` + ``before``/``after`` structs.

    Combining ``-U``/``+U`` into one record (``op_mapping`` maps both to one code) buffers the ``-U``
    in state until its ``+U`` arrives, in this micro-batch or a later one; with ``state_ttl`` and
    ``partition_by`` the last image per key also fills ``before`` and full deletes. On a batch
    DataFrame a ``-U`` still waiting at the end is written on its own, as the engine does. ``on_time``
    names an event-time column: changes wait for the watermark to pass them and each key's changes
    are compacted then (on a stream, the column needs ``withWatermark``).

    ``args`` are TO_CHANGELOG's parameters (:class:`~cdcflow.core.params.ToChangelogArgs`): ``op``
    ("op"), ``before``, ``after``, ``op_mapping``, ``partition_by``, ``on_time``, ``state_ttl``,
    ``produces_full_deletes`` (False), ``passthrough``, ``uid``.
    """
    params = plan_to_changelog(**args)
    time_values = _event_time(df, "to_changelog", "on_time", params.on_time)
    stateful = params.op_mapping.combines_updates or params.keeps_images or params.on_time is not None
    group_columns = max(len(params.partition_by), 1) if stateful else 0
    layout = to_layout(
        df.schema, params, row_kind_column, sequence_columns(sequence_by), group_columns, time_values
    )
    if not stateful:
        return to_changelog_exprs(df, params, layout)
    # Without partition_by every change shares one key, as in the engine (the spec's parallelism 1).
    keys = [column(name) for name in params.partition_by] or [F.lit(0)]
    plan = StreamPlan(_state_name(params.uid), params.state_ttl_seconds, watermark_first=True)
    return _grouped(df, ToRows(params, layout), keys, plan)


def _grouped(df: DataFrame, conversion: Conversion, keys: list[Column], plan: StreamPlan) -> DataFrame:
    layout = conversion.layout
    keyed = df.withColumns(dict(zip(layout.key_columns, keys, strict=True)))
    if not df.isStreaming:
        # Each key's rows together and in order in one partition: one Python call per partition.
        order = [column(name) for name in (*layout.key_columns, *layout.sequence_by)]
        arranged = keyed.repartition(*layout.key_columns).sortWithinPartitions(*order)
        function = partition_function(conversion, arrow_schema(layout.output), stateful=True)
        return arranged.mapInArrow(function, layout.output)
    require_stateful_setup(df.sparkSession)
    default_shuffle_partitions(df.sparkSession)
    time = layout.time_column
    # Only from_changelog's event-time column keeps its watermark into the operator: Spark then drops
    # and counts the late rows. Any other watermark there would drop rows the engine keeps.
    keyed = _without_watermarks(keyed, None if plan.watermark_first else time)
    if time is not None and layout.time_values is not None:
        keyed = keyed.withColumn(layout.time_values, F.unix_micros(column(time)))
        time_mode = "EventTime"
    elif plan.ttl_seconds:
        keyed = _processing_time_watermark(keyed)
        time_mode = "EventTime"
    else:
        time_mode = "None"
    grouped = keyed.groupBy(*layout.key_columns)
    return grouped.transformWithState(
        ChangelogProcessor(conversion, plan), layout.output, "Append", time_mode
    )


def _state_name(uid: str | None) -> str:
    """The state variable's name: ``uid`` names it, so a query keeps its state across changes."""
    return "changelog" if uid is None else "changelog_" + re.sub(r"[^0-9A-Za-z_]", "_", uid)


def _from_key_columns(params: FromChangelogParams) -> list[Column]:
    """The engine's key of each envelope as columns: from the image a record's operation writes."""
    if not params.nested:
        return [column(name) for name in params.partition_by]
    before_field, after_field = image_sources(params)
    old = column(before_field)
    new = old if after_field is None else column(after_field)
    writes = [c for c, kinds in params.op_mapping.groups.items() if INS in kinds or UA in kinds]
    source = F.when(column(params.op).cast("string").isin(*writes), F.coalesce(new, old)).otherwise(
        F.coalesce(old, new)
    )
    return [column(name) if name in params.passthrough else source[name] for name in params.partition_by]


def _event_time(df: DataFrame, function: str, param: str, name: str | None) -> str | None:
    """On a stream, check the event-time column has Spark's watermark; the hidden column for its
    microseconds. A batch DataFrame needs none: its end releases everything, as the engine's does."""
    if name is None or not df.isStreaming:
        return None
    fields = {f.name: f for f in df.schema.fields}
    field = fields.get(name)
    if field is None:
        return None  # the layout names the missing column
    call = f"{function}({param}='{name}')"
    if not isinstance(field.dataType, st.TimestampType):
        raise ConnectorOptionError(
            f"{call} on a stream: '{name}' is {field.dataType.simpleString()}; the event time must be a "
            f"TIMESTAMP column with a watermark, e.g. df.withColumn('{name}', col('{name}')"
            f".cast('timestamp')).withWatermark('{name}', '5 minutes')"
        )
    if WATERMARK_DELAY_KEY not in field.metadata:
        raise ConnectorOptionError(
            f"{call} on a stream needs a watermark on '{name}': the watermark tells when no earlier row "
            f"can still arrive, which is when waiting rows are released in event-time order. Add "
            f"df.withWatermark('{name}', '<how late a row may arrive, e.g. 5 minutes>') before {function}"
        )
    return TIME_VALUES_COLUMN


def _without_watermarks(df: DataFrame, keep: str | None) -> DataFrame:
    """The columns carrying a watermark (but ``keep``), with metadata that no longer marks them.

    ``transformWithState`` in event-time mode drops input rows at or below the watermark of its
    watermark column. The global watermark is unchanged.
    """
    marked = [f.name for f in df.schema.fields if WATERMARK_DELAY_KEY in f.metadata and f.name != keep]
    for name in marked:
        df = df.withMetadata(name, {"cdcflow.watermark": "not applied to this operator"})
    return df


def _processing_time_watermark(df: DataFrame) -> DataFrame:
    """A watermark on the micro-batch's processing time, for the timers that free expired state.

    Spark's processing-time mode would run a micro-batch at every trigger for its timers, which keeps
    ``availableNow`` from ending; event time advances only with data. The column itself is dropped:
    only its watermark stays in the query (the lowest watermark wins, so an event-time one of the
    query keeps ruling the query's other operators).
    """
    policy = df.sparkSession.conf.get(WATERMARK_POLICY_KEY, "min") or "min"
    if policy.lower() != "min":
        raise ConnectorOptionError(
            f"a stream with state_ttl frees expired state on a watermark of the micro-batch's processing "
            f"time, which cdcflow adds to the query; with {WATERMARK_POLICY_KEY}={policy!r} it would become "
            f"the watermark of the query's event-time operators too. Set {WATERMARK_POLICY_KEY}=min (the "
            "default) before the query first starts, or drop state_ttl"
        )
    if BATCH_TIME_COLUMN in df.columns:
        raise ConnectorOptionError(f"the input has a column '{BATCH_TIME_COLUMN}', a name cdcflow reserves")
    timed = df.withColumn(BATCH_TIME_COLUMN, F.current_timestamp())
    return timed.withWatermark(BATCH_TIME_COLUMN, "0 seconds").drop(BATCH_TIME_COLUMN)
