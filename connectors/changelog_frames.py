"""FROM_CHANGELOG and TO_CHANGELOG over Spark DataFrames, batch and streaming (spec 4.1, 4.2).

Parameters carry the spec's names and meaning, and the results are the engine's
(:mod:`cdcflow.core`) for the same rows:

* stateless conversions are column expressions (``select`` / ``explode``), so they run anywhere a
  DataFrame runs, with no Python worker (but ``invalid_op_handling='LOG'``, which runs the engine
  over each partition to log every skipped record);
* stateful ones (``state_ttl``; to_changelog combining ``-U``/``+U`` into one record, or filling
  ``before`` from state) group the rows by ``partition_by`` and run the engine per key: on a stream
  through ``transformWithState`` with the key's state in Spark's state store (checkpointed: it
  survives a restart), on a batch DataFrame through ``mapInArrow`` over partitions holding each
  key's rows together, in order.

Order: the engine handles a key's rows in input order. Spark's grouping does not keep the order of
rows inside a micro-batch, so name the stream position with ``sequence_by`` (e.g. Kafka's
``partition``, ``offset``): each key's rows are sorted by it. Without it, the order within a
micro-batch is Spark's; across micro-batches it is the stream's.

``state_ttl`` is processing time: every row of a micro-batch sees the batch's time, and a key's state
expires ``state_ttl`` after the last batch that wrote it (Spark's TTL frees it shortly after). ``uid``
names the state, so keep it when the query evolves.

A stateful stream needs the RocksDB state store provider and the ``protobuf`` package
(:func:`cdcflow.connectors.session.cdcflow_spark_config`). With ``state_ttl`` the operator runs in
processing time, where ``trigger(availableNow=True)`` only ends with
``spark.sql.streaming.noDataMicroBatches.enabled=false``.
"""

from __future__ import annotations

import re

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdcflow.connectors.changelog_exprs import (
    column,
    from_changelog_exprs,
    image_sources,
    to_changelog_exprs,
)
from cdcflow.connectors.changelog_layout import from_layout, sequence_columns, to_layout
from cdcflow.connectors.changelog_state import (
    ChangelogProcessor,
    Conversion,
    FromRows,
    ToRows,
    partition_function,
)
from cdcflow.connectors.errors import ConnectorNotSupportedError
from cdcflow.connectors.session import require_stateful_setup
from cdcflow.connectors.spark_types import arrow_schema
from cdcflow.core.opmapping import OpMappingInput
from cdcflow.core.params import (
    Columns,
    FromChangelogParams,
    InvalidOpHandling,
    TtlInput,
    plan_from_changelog,
    plan_to_changelog,
)
from cdcflow.core.rowkind import INS, UA

ROW_KIND_COLUMN = "_row_kind"


def from_changelog(
    df: DataFrame,
    *,
    op: str = "op",
    before: str | None = None,
    after: str | None = None,
    op_mapping: OpMappingInput | None = None,
    invalid_op_handling: str | InvalidOpHandling = "FAIL",
    partition_by: Columns | None = None,
    order_by: str | None = None,
    state_ttl: TtlInput | None = None,
    consume_full_deletes: bool = False,
    passthrough: Columns | None = None,
    uid: str | None = None,
    row_kind_column: str = ROW_KIND_COLUMN,
    sequence_by: Columns | None = None,
) -> DataFrame:
    """Envelopes (``op`` + flat columns, or ``op`` + ``before``/``after`` structs) → a changelog.

    The result has the image columns (then ``passthrough``) and ``row_kind_column`` holding
    ``+I``/``-U``/``+U``/``-D``. ``state_ttl`` (a timedelta or seconds; 0 keeps state forever) makes
    the conversion stateful, keyed by ``partition_by``. Parameters and columns are checked here,
    before any row flows.
    """
    params = plan_from_changelog(
        op=op,
        before=before,
        after=after,
        op_mapping=op_mapping,
        invalid_op_handling=invalid_op_handling,
        partition_by=partition_by,
        order_by=order_by,
        state_ttl=state_ttl,
        consume_full_deletes=consume_full_deletes,
        passthrough=passthrough,
        uid=uid,
    )
    _reject_event_time("from_changelog", "order_by", params.order_by)
    layout = from_layout(df.schema, params, row_kind_column, sequence_columns(sequence_by))
    if params.stateful:
        keys = _from_key_columns(params)
        return _grouped(df, FromRows(params, layout), keys, params.state_ttl_seconds, params.uid)
    if params.invalid_op_handling is InvalidOpHandling.LOG:
        # A warning per skipped record needs Python: the engine runs over each partition, in order.
        conversion = FromRows(params, layout)
        function = partition_function(conversion, arrow_schema(layout.output), stateful=False)
        return df.mapInArrow(function, layout.output)
    return from_changelog_exprs(df, params, layout)


def to_changelog(
    df: DataFrame,
    *,
    op: str = "op",
    before: str | None = None,
    after: str | None = None,
    op_mapping: OpMappingInput | None = None,
    partition_by: Columns | None = None,
    on_time: str | None = None,
    state_ttl: TtlInput | None = None,
    produces_full_deletes: bool = False,
    passthrough: Columns | None = None,
    uid: str | None = None,
    row_kind_column: str = ROW_KIND_COLUMN,
    sequence_by: Columns | None = None,
) -> DataFrame:
    """A changelog (rows with ``row_kind_column``) → envelopes: ``op`` + flat columns, or ``op`` +
    ``passthrough`` + ``before``/``after`` structs.

    Combining ``-U``/``+U`` into one record (``op_mapping`` maps both to one code) buffers the ``-U``
    in state until its ``+U`` arrives, in this micro-batch or a later one; with ``state_ttl`` and
    ``partition_by`` the last image per key also fills ``before`` and full deletes. On a batch
    DataFrame a ``-U`` still waiting at the end is written on its own, as the engine does.
    """
    params = plan_to_changelog(
        op=op,
        before=before,
        after=after,
        op_mapping=op_mapping,
        partition_by=partition_by,
        on_time=on_time,
        state_ttl=state_ttl,
        produces_full_deletes=produces_full_deletes,
        passthrough=passthrough,
        uid=uid,
    )
    _reject_event_time("to_changelog", "on_time", params.on_time)
    stateful = params.op_mapping.combines_updates or params.keeps_images
    group_columns = max(len(params.partition_by), 1) if stateful else 0
    layout = to_layout(df.schema, params, row_kind_column, sequence_columns(sequence_by), group_columns)
    if not stateful:
        return to_changelog_exprs(df, params, layout)
    # Without partition_by every change shares one key, as in the engine (the spec's parallelism 1).
    keys = [column(name) for name in params.partition_by] or [F.lit(0)]
    return _grouped(df, ToRows(params, layout), keys, params.state_ttl_seconds, params.uid)


def _grouped(
    df: DataFrame, conversion: Conversion, keys: list[Column], ttl_seconds: float | None, uid: str | None
) -> DataFrame:
    layout = conversion.layout
    keyed = df.withColumns(dict(zip(layout.key_columns, keys, strict=True)))
    if not df.isStreaming:
        # Each key's rows together and in order in one partition: one Python call per partition.
        order = [column(name) for name in (*layout.key_columns, *layout.sequence_by)]
        arranged = keyed.repartition(*layout.key_columns).sortWithinPartitions(*order)
        function = partition_function(conversion, arrow_schema(layout.output), stateful=True)
        return arranged.mapInArrow(function, layout.output)
    require_stateful_setup(df.sparkSession)
    processor = ChangelogProcessor(conversion, _state_name(uid), ttl_seconds)
    time_mode = "ProcessingTime" if ttl_seconds else "None"
    grouped = keyed.groupBy(*layout.key_columns)
    return grouped.transformWithState(processor, layout.output, "Append", time_mode)


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


def _reject_event_time(function: str, param: str, value: str | None) -> None:
    if value is not None:
        raise ConnectorNotSupportedError(
            f"{function}({param}=...) is not supported on DataFrames yet: event-time sorting and "
            "watermark compaction run only in the engine (cdcflow.core). Supported here: op, before, "
            "after, op_mapping, partition_by, state_ttl, passthrough, uid, delete handling, and "
            "sequence_by to order each key's rows; drop the parameter, or sort upstream"
        )
