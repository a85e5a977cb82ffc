"""from_changelog / to_changelog over Spark DataFrames give the engine's output for the same rows.

Every expectation is the core engine's (cdcflow.core) output for the same input: stateless
conversions row for row, stateful ones per key, in order. Streaming tests stop the query between
micro-batches and restart it from its checkpoint; state TTL is checked with a real pause between
micro-batches against the engine run with a clock that moves the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from changelog_streams import JsonStream, rows_of
from pyspark.errors import PythonException, SparkRuntimeException, StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as st

from cdcflow.connectors.errors import SparkSetupError
from cdcflow.connectors.spark.changelog.frames import from_changelog, to_changelog
from cdcflow.connectors.spark.session import PROVIDER_KEY
from cdcflow.core import (
    Change,
    ChangelogDataError,
    ChangelogValidationError,
    FromChangelog,
    OpMappingError,
    RowKind,
    ToChangelog,
)
from cdcflow.core.params import plan_from_changelog, plan_to_changelog

pytestmark = pytest.mark.integration

Record = dict[str, Any]

DEBEZIUM_FROM = {"c, r": "INSERT", "u": "UPDATE_BEFORE, UPDATE_AFTER", "d": "DELETE"}
DEBEZIUM_TO = {"INSERT": "c", "UPDATE_BEFORE, UPDATE_AFTER": "u", "DELETE": "d"}
UPSERT_TO_RETRACT = {"upsert": "INSERT, UPDATE_BEFORE, UPDATE_AFTER", "delete": "DELETE"}

IMAGE = "struct<id:int, name:string>"
ENVELOPE = f"op string, before {IMAGE}, after {IMAGE}, ts_ms long, seq long"
FLAT = "op string, id int, name string, seq long"
CHANGELOG = "_row_kind string, id int, name string, ts_ms long, seq long"
HOUR = timedelta(hours=1)


# --- the engine's side ----------------------------------------------------------------------------


def engine_from(records: Sequence[Record], hidden: Sequence[str] = ("seq",), **params: Any) -> list[Record]:
    """FROM_CHANGELOG in the engine, its changes as output rows (image columns + ``_row_kind``)."""
    engine = FromChangelog(plan_from_changelog(**params))
    return [_change_row(c) for r in records for c in engine.process(_without(r, hidden))]


def engine_to(records: Sequence[Record], hidden: Sequence[str] = ("seq",), **params: Any) -> list[Record]:
    """TO_CHANGELOG in the engine over a finite input (the end writes any ``-U`` still waiting)."""
    engine = ToChangelog(plan_to_changelog(**params))
    changes = [_change(_without(r, hidden)) for r in records]
    return [*(out for change in changes for out in engine.process(change)), *engine.flush()]


def _change(record: Record) -> Change:
    row = dict(record)
    return Change(RowKind.from_short_string(row.pop("_row_kind")), row)


def _change_row(change: Change) -> Record:
    return {**change.row, "_row_kind": change.kind.value}


def _without(record: Record, hidden: Sequence[str]) -> Record:
    return {k: v for k, v in record.items() if k not in hidden}


class SteppedClock:
    """Processing time for the engine: one fixed reading per micro-batch, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


# --- the Spark side -------------------------------------------------------------------------------


def shaped(records: Sequence[Record], schema: st.StructType) -> list[Record]:
    """Engine rows with every column of ``schema``: a column the engine leaves out is NULL in Spark."""
    return [_shape(record, schema) for record in records]


def _shape(value: Mapping[str, Any], schema: st.StructType) -> Record:
    shaped_row: Record = {}
    for field in schema.fields:
        item = value.get(field.name)
        if isinstance(field.dataType, st.StructType) and item is not None:
            item = _shape(item, field.dataType)
        shaped_row[field.name] = item
    return shaped_row


def per_key(records: Sequence[Record], key: Callable[[Record], Any]) -> dict[Any, list[Record]]:
    grouped: dict[Any, list[Record]] = {}
    for record in records:
        grouped.setdefault(key(record), []).append(record)
    return grouped


def row_id(record: Record) -> Any:
    return record["id"]


def envelope_id(record: Record) -> Any:
    image = record.get("after") or record.get("before")
    return image["id"] if image else record.get("id")


# --- stateless conversions: column expressions ----------------------------------------------------

DEBEZIUM_ENVELOPES: list[Record] = [
    {"op": "r", "before": None, "after": {"id": 1, "name": "Alice"}, "ts_ms": 100, "seq": 1},
    {"op": "c", "before": None, "after": {"id": 2, "name": "Bob"}, "ts_ms": 101, "seq": 2},
    {
        "op": "u",
        "before": {"id": 1, "name": "Alice"},
        "after": {"id": 1, "name": "Alicia"},
        "ts_ms": 102,
        "seq": 3,
    },
    {"op": "d", "before": {"id": 2, "name": "Bob"}, "after": None, "ts_ms": 103, "seq": 4},
]


def test_debezium_envelopes_to_retract_stream_with_passthrough(spark: SparkSession) -> None:
    params: dict[str, Any] = {
        "before": "before",
        "after": "after",
        "op_mapping": DEBEZIUM_FROM,
        "passthrough": "ts_ms",
    }
    out = from_changelog(spark.createDataFrame(DEBEZIUM_ENVELOPES, ENVELOPE), sequence_by="seq", **params)
    assert out.columns == ["id", "name", "ts_ms", "_row_kind"]
    assert rows_of(out) == engine_from(DEBEZIUM_ENVELOPES, **params)
    assert [r["_row_kind"] for r in rows_of(out)] == ["+I", "+I", "-U", "+U", "-D"]


def test_flat_records_with_a_deletion_flag(spark: SparkSession) -> None:
    records: list[Record] = [
        {"deleted": False, "id": 1, "name": "a"},
        {"deleted": False, "id": 1, "name": "b"},
        {"deleted": True, "id": 1, "name": "b"},
    ]
    params: dict[str, Any] = {"op": "deleted", "op_mapping": {"false": "UPDATE_AFTER", "true": "DELETE"}}
    df = spark.createDataFrame(records, "deleted boolean, id int, name string")
    out = from_changelog(df, **params)
    assert rows_of(out) == engine_from(records, **params)
    assert [r["_row_kind"] for r in rows_of(out)] == ["+U", "+U", "-D"]


def test_single_payload_field_and_partial_deletes(spark: SparkSession) -> None:
    records: list[Record] = [
        {"op": "c", "payload": {"id": 5, "name": "x"}},
        {"op": "d", "payload": {"id": 5, "name": None}},
    ]
    params: dict[str, Any] = {
        "before": "payload",
        "after": "payload",
        "op_mapping": {"c": "INSERT", "d": "DELETE"},
    }
    df = spark.createDataFrame(records, f"op string, payload {IMAGE}")
    assert rows_of(from_changelog(df, partition_by="id", **params)) == engine_from(
        records, partition_by="id", **params
    )


@pytest.mark.parametrize("handling", ["SKIP", "LOG"])
def test_unknown_operation_codes_are_skipped(spark: SparkSession, handling: str) -> None:
    records: list[Record] = [
        {"op": "INSERT", "id": 1, "name": "a", "seq": 1},
        {"op": "TRUNCATE", "id": None, "name": None, "seq": 2},
        {"op": "DELETE", "id": 1, "name": "a", "seq": 3},
    ]
    df = spark.createDataFrame(records, FLAT)
    out = from_changelog(df, invalid_op_handling=handling, sequence_by="seq")
    assert rows_of(out) == engine_from(records, invalid_op_handling=handling)
    assert len(rows_of(out)) == 2


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"op": None, "id": 1, "name": "a", "seq": 7}, "the operation code is NULL"),
        ({"op": "MERGE", "id": 1, "name": "a", "seq": 7}, "unknown operation code 'MERGE'"),
        ({"op": "DELETE", "id": None, "name": "a", "seq": 7}, "field 'id': the upsert key column is NULL"),
    ],
    ids=["null-op", "unknown-op", "null-key"],
)
def test_a_record_the_engine_rejects_fails_the_query(
    spark: SparkSession, record: Record, reason: str
) -> None:
    with pytest.raises(ChangelogDataError):  # the engine rejects it too
        engine_from([record], partition_by="id")
    df = spark.createDataFrame([record], FLAT)
    with pytest.raises(SparkRuntimeException, match=f'sequence_by {{"seq":7}}, .*{reason}'):
        from_changelog(df, partition_by="id", sequence_by="seq").collect()


def test_update_without_before_image_fails_with_the_fix(spark: SparkSession) -> None:
    record = {"op": "u", "before": None, "after": {"id": 1, "name": "b"}, "ts_ms": 1, "seq": 1}
    df = spark.createDataFrame([record], ENVELOPE)
    with pytest.raises(SparkRuntimeException, match="no before image .*REPLICA IDENTITY FULL"):
        from_changelog(df, before="before", after="after", op_mapping=DEBEZIUM_FROM).collect()


def test_only_a_before_image_as_the_engine_reads_it(spark: SparkSession) -> None:
    params: dict[str, Any] = {"before": "old", "op_mapping": {"c": "INSERT", "d": "DELETE"}}
    deletes: list[Record] = [{"op": "d", "old": {"id": 1, "name": "a"}}]
    df = spark.createDataFrame(deletes, f"op string, old {IMAGE}")
    assert rows_of(from_changelog(df, **params)) == engine_from(deletes, **params)
    insert: list[Record] = [{"op": "c", "old": {"id": 2, "name": "b"}}]
    with pytest.raises(ChangelogDataError, match="the image this operation needs is NULL"):
        engine_from(insert, **params)
    df = spark.createDataFrame(insert, f"op string, old {IMAGE}")
    with pytest.raises(SparkRuntimeException, match="the image this operation needs is NULL"):
        from_changelog(df, **params).collect()


RETRACT_CHANGELOG: list[Record] = [
    {"_row_kind": "+I", "id": 1, "name": "Alice", "ts_ms": 1, "seq": 1},
    {"_row_kind": "-U", "id": 1, "name": "Alice", "ts_ms": 2, "seq": 2},
    {"_row_kind": "+U", "id": 1, "name": "Alicia", "ts_ms": 2, "seq": 3},
    {"_row_kind": "-D", "id": 1, "name": "Alicia", "ts_ms": 3, "seq": 4},
]


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"before": "before", "after": "after"},
        {"partition_by": "id", "op_mapping": {"INSERT": "c", "UPDATE_AFTER": "u", "DELETE": "d"}},
        {
            "partition_by": "id",
            "produces_full_deletes": True,
            "op": "deleted",
            "op_mapping": {"INSERT, UPDATE_AFTER": "false", "DELETE": "true"},
        },
        {
            "partition_by": "id",
            "before": "before",
            "after": "after",
            "passthrough": "ts_ms",
            "op_mapping": {"INSERT": "c", "UPDATE_AFTER": "u", "DELETE": "d"},
        },
        {"before": "payload", "after": "payload", "partition_by": "id"},
    ],
    ids=["flat-default", "nested-default", "partial-deletes", "deletion-flag", "passthrough", "payload"],
)
def test_stateless_to_changelog_matches_the_engine(spark: SparkSession, params: dict[str, Any]) -> None:
    out = to_changelog(spark.createDataFrame(RETRACT_CHANGELOG, CHANGELOG), sequence_by="seq", **params)
    assert rows_of(out) == shaped(engine_to(RETRACT_CHANGELOG, **params), out.schema)


def test_column_names_with_dots_are_taken_literally(spark: SparkSession) -> None:
    records: list[Record] = [
        {"op.code": "INSERT", "id": 1, "source.table": "users"},
        {"op.code": "DELETE", "id": 1, "source.table": "users"},
    ]
    df = spark.createDataFrame(records, "`op.code` string, id int, `source.table` string")
    changes = from_changelog(df, op="op.code", partition_by="id")
    assert rows_of(changes) == engine_from(records, op="op.code", partition_by="id")
    envelopes = to_changelog(changes, op="op.code", partition_by="id", produces_full_deletes=True)
    assert rows_of(envelopes) == records


def test_to_changelog_rejects_an_unknown_row_kind(spark: SparkSession) -> None:
    df = spark.createDataFrame([{"_row_kind": "+X", "id": 1, "name": "a", "ts_ms": 1, "seq": 1}], CHANGELOG)
    with pytest.raises(SparkRuntimeException, match="'\\+X' is not a row kind"):
        to_changelog(df).collect()


# --- parameters and columns are checked on the driver ---------------------------------------------


def test_parameters_and_columns_fail_before_any_row_flows(spark: SparkSession) -> None:
    envelopes = spark.createDataFrame(DEBEZIUM_ENVELOPES, ENVELOPE)
    with pytest.raises(OpMappingError, match="INSERT, DELETE"):
        from_changelog(envelopes, op_mapping={"x": "INSERT, DELETE"})
    with pytest.raises(
        ChangelogValidationError, match="op names \\['kind'\\], but the DataFrame has no such column"
    ):
        from_changelog(envelopes, op="kind")
    with pytest.raises(ChangelogValidationError, match="'ts_ms' is bigint, not a STRUCT"):
        from_changelog(envelopes, after="ts_ms")
    with pytest.raises(ChangelogValidationError, match="passthrough field\\(s\\) \\['id'\\]"):
        from_changelog(envelopes.withColumn("id", envelopes.seq), after="after", passthrough="id")
    with pytest.raises(ChangelogValidationError, match="partition_by names \\['key'\\]"):
        from_changelog(envelopes, after="after", partition_by="key", state_ttl=HOUR)
    with pytest.raises(ChangelogValidationError, match="row_kind_column 'name'"):
        from_changelog(envelopes, after="after", row_kind_column="name")
    with pytest.raises(ChangelogValidationError, match="order_by names \\['event_time'\\]"):
        from_changelog(envelopes, after="after", order_by="event_time")
    changelog = spark.createDataFrame(RETRACT_CHANGELOG, CHANGELOG)
    with pytest.raises(ChangelogValidationError, match="already has a column 'name'.*op='...'"):
        to_changelog(changelog, op="name")
    with pytest.raises(ChangelogValidationError, match="row_kind_column names \\['kind'\\]"):
        to_changelog(changelog, row_kind_column="kind")


def test_a_stateful_stream_without_the_rocksdb_provider_fails_with_the_setting(
    spark: SparkSession, tmp_path: Path
) -> None:
    stream = spark.readStream.schema(FLAT).json(str(tmp_path))
    default = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
    previous = spark.conf.get(PROVIDER_KEY)
    assert previous is not None
    spark.conf.set(PROVIDER_KEY, default)
    try:
        with pytest.raises(SparkSetupError, match=f"spark.conf.set\\('{PROVIDER_KEY}', '.*RocksDB"):
            from_changelog(stream, partition_by="id", state_ttl=HOUR, op_mapping=UPSERT_TO_RETRACT)
    finally:
        spark.conf.set(PROVIDER_KEY, previous)


# --- stateful conversions on batch DataFrames -----------------------------------------------------

UPSERTS: list[Record] = [
    {"op": "upsert", "id": 1, "name": "a", "seq": 4},
    {"op": "upsert", "id": 2, "name": "x", "seq": 2},
    {"op": "upsert", "id": 1, "name": "b", "seq": 5},
    {"op": "delete", "id": 2, "name": "x", "seq": 6},
    {"op": "upsert", "id": 2, "name": "y", "seq": 9},
    {"op": "upsert", "id": 1, "name": "c", "seq": 3},
]


def test_batch_upserts_to_retract_per_key_in_sequence_order(spark: SparkSession) -> None:
    params: dict[str, Any] = {"partition_by": "id", "state_ttl": HOUR, "op_mapping": UPSERT_TO_RETRACT}
    out = from_changelog(spark.createDataFrame(UPSERTS, FLAT), sequence_by="seq", **params)
    in_order = sorted(UPSERTS, key=lambda r: r["seq"])
    assert per_key(rows_of(out), row_id) == per_key(engine_from(in_order, **params), row_id)
    # Key 1's rows arrive as a, b, c but their sequence is c, a, b.
    assert [(r["_row_kind"], r["name"]) for r in rows_of(out) if r["id"] == 1] == [
        ("+I", "c"),
        ("-U", "c"),
        ("+U", "a"),
        ("-U", "a"),
        ("+U", "b"),
    ]


def test_batch_combined_updates_write_a_waiting_update_before_at_the_end(spark: SparkSession) -> None:
    changes: list[Record] = [
        *RETRACT_CHANGELOG[:3],
        {"_row_kind": "-U", "id": 2, "name": "z", "ts_ms": 9, "seq": 9},
    ]
    params: dict[str, Any] = {
        "before": "before",
        "after": "after",
        "partition_by": "id",
        "op_mapping": DEBEZIUM_TO,
    }
    out = to_changelog(spark.createDataFrame(changes, CHANGELOG), sequence_by="seq", **params)
    expected = shaped(engine_to(changes, **params), out.schema)
    assert per_key(rows_of(out), envelope_id) == per_key(expected, envelope_id)
    assert {"op": "u", "before": {"id": 2, "name": "z", "ts_ms": 9}, "after": None} in rows_of(out)


def test_batch_combined_updates_without_partition_by_share_one_key(spark: SparkSession) -> None:
    changes: list[Record] = [
        {"_row_kind": "-U", "id": 1, "name": "a", "ts_ms": 1, "seq": 1},
        {"_row_kind": "-U", "id": 2, "name": "x", "ts_ms": 2, "seq": 2},
        {"_row_kind": "+U", "id": 2, "name": "y", "ts_ms": 3, "seq": 3},
    ]
    params: dict[str, Any] = {"before": "before", "after": "after", "op_mapping": DEBEZIUM_TO}
    out = to_changelog(spark.createDataFrame(changes, CHANGELOG), sequence_by="seq", **params)
    # One key: the -U of 1 is written on its own when the -U of 2 arrives, which then pairs with its +U.
    assert rows_of(out) == shaped(engine_to(changes, **params), out.schema)
    assert [r["op"] for r in rows_of(out)] == ["u", "u"]


# --- stateful conversions on streams, across restarts ---------------------------------------------

STREAM_UPSERTS_1: list[Record] = [
    {"op": "upsert", "id": 99, "name": "Orphan Updated", "seq": 3},
    {"op": "upsert", "id": 7, "name": "a", "seq": 2},
    {"op": "upsert", "id": 99, "name": "Orphan", "seq": 1},
    {"op": "upsert", "id": 8, "name": "p", "seq": 4},
    {"op": "delete", "id": 8, "name": "p", "seq": 5},
]
STREAM_UPSERTS_2: list[Record] = [
    {"op": "upsert", "id": 7, "name": "b", "seq": 7},
    {"op": "delete", "id": 99, "name": "Orphan Updated", "seq": 6},
    {"op": "upsert", "id": 8, "name": "Resurrected", "seq": 8},
    {"op": "upsert", "id": 7, "name": "c", "seq": 9},
]


def test_stream_upserts_to_retract_with_ttl_survive_a_restart(spark: SparkSession, tmp_path: Path) -> None:
    params: dict[str, Any] = {"partition_by": "id", "state_ttl": HOUR, "op_mapping": UPSERT_TO_RETRACT}
    stream = JsonStream(spark, tmp_path, FLAT)

    def convert(df: DataFrame) -> DataFrame:
        return from_changelog(df, sequence_by="seq", uid="upserts", **params)

    stream.append(STREAM_UPSERTS_1)
    written = stream.run(convert)
    stream.append(STREAM_UPSERTS_2)
    written += stream.run(convert)

    in_order = sorted([*STREAM_UPSERTS_1, *STREAM_UPSERTS_2], key=lambda r: r["seq"])
    assert per_key(written, row_id) == per_key(engine_from(in_order, **params), row_id)
    # Spec 4.1.2.2.2's walk-through for key 99, in sequence order although the file has it reversed.
    assert [(r["_row_kind"], r["name"]) for r in written if r["id"] == 99] == [
        ("+I", "Orphan"),
        ("-U", "Orphan"),
        ("+U", "Orphan Updated"),
        ("-D", "Orphan Updated"),
    ]
    # Key 7's -U in the second run came from the state the first run checkpointed.
    assert [(r["_row_kind"], r["name"]) for r in written if r["id"] == 7] == [
        ("+I", "a"),
        ("-U", "a"),
        ("+U", "b"),
        ("-U", "b"),
        ("+U", "c"),
    ]


STREAM_CHANGES_1: list[Record] = [
    {"_row_kind": "+I", "id": 1, "name": "Alice", "ts_ms": 1, "seq": 1},
    {"_row_kind": "+I", "id": 2, "name": "Bob", "ts_ms": 2, "seq": 2},
    {"_row_kind": "-U", "id": 2, "name": "Bob", "ts_ms": 3, "seq": 3},
    {"_row_kind": "+U", "id": 2, "name": "Bobby", "ts_ms": 3, "seq": 4},
    {"_row_kind": "-U", "id": 1, "name": "Alice", "ts_ms": 4, "seq": 5},
    {"_row_kind": "+I", "id": 3, "name": "Carol", "ts_ms": 5, "seq": 6},
    {"_row_kind": "-U", "id": 3, "name": "Carol", "ts_ms": 6, "seq": 7},
]
STREAM_CHANGES_2: list[Record] = [
    {"_row_kind": "+U", "id": 1, "name": "Alicia", "ts_ms": 4, "seq": 8},
    {"_row_kind": "-D", "id": 3, "name": "Carol", "ts_ms": 7, "seq": 9},
    {"_row_kind": "-D", "id": 2, "name": "Bobby", "ts_ms": 8, "seq": 10},
]


def test_stream_combines_update_before_and_after_across_a_restart(
    spark: SparkSession, tmp_path: Path
) -> None:
    params: dict[str, Any] = {
        "before": "before",
        "after": "after",
        "passthrough": "ts_ms",
        "partition_by": "id",
        "state_ttl": HOUR,
        "op_mapping": DEBEZIUM_TO,
    }
    stream = JsonStream(spark, tmp_path, CHANGELOG)

    def convert(df: DataFrame) -> DataFrame:
        return to_changelog(df, sequence_by="seq", **params)

    stream.append(STREAM_CHANGES_1)
    written = stream.run(convert)
    stream.append(STREAM_CHANGES_2)
    written += stream.run(convert)

    # A stream does not end: the engine's output without the end-of-input flush.
    engine = ToChangelog(plan_to_changelog(**params))
    expected = [
        out
        for r in [*STREAM_CHANGES_1, *STREAM_CHANGES_2]
        for out in engine.process(_change(_without(r, ["seq"])))
    ]
    schema = convert(spark.createDataFrame([], CHANGELOG)).schema
    assert per_key(written, envelope_id) == per_key(shaped(expected, schema), envelope_id)
    # Alice's -U waited in state over the restart for its +U: one combined record.
    assert {
        "op": "u",
        "ts_ms": 4,
        "before": {"id": 1, "name": "Alice"},
        "after": {"id": 1, "name": "Alicia"},
    } in written
    # Carol's -U never got its +U: written on its own when her delete came.
    assert [r["op"] for r in written if envelope_id(r) == 3] == ["c", "u", "d"]


TTL_SECONDS = 1.0
PAUSE_SECONDS = 2.0


def test_from_changelog_state_expires_between_micro_batches(spark: SparkSession, tmp_path: Path) -> None:
    first: list[Record] = [
        {"op": "upsert", "id": 1, "name": "a", "seq": 1},
        {"op": "upsert", "id": 2, "name": "x", "seq": 2},
    ]
    second: list[Record] = [
        {"op": "upsert", "id": 1, "name": "b", "seq": 3},  # 1's state has expired: +I, no -U
        {"op": "upsert", "id": 3, "name": "p", "seq": 4},
        {"op": "upsert", "id": 3, "name": "q", "seq": 5},  # same micro-batch: within the TTL
    ]
    params: dict[str, Any] = {"partition_by": "id", "state_ttl": TTL_SECONDS, "op_mapping": UPSERT_TO_RETRACT}
    stream = JsonStream(spark, tmp_path, FLAT)

    def convert(df: DataFrame) -> DataFrame:
        return from_changelog(df, sequence_by="seq", **params)

    stream.append(first)
    written = stream.run(convert)
    time.sleep(PAUSE_SECONDS)
    stream.append(second)
    written += stream.run(convert)

    clock = SteppedClock()
    engine = FromChangelog(plan_from_changelog(**params), clock=clock)
    expected = [_change_row(c) for r in first for c in engine.process(_without(r, ["seq"]))]
    clock.now += PAUSE_SECONDS
    expected += [_change_row(c) for r in second for c in engine.process(_without(r, ["seq"]))]
    assert per_key(written, row_id) == per_key(expected, row_id)
    assert [r["_row_kind"] for r in written if r["id"] == 1] == ["+I", "+I"]
    assert [r["_row_kind"] for r in written if r["id"] == 3] == ["+I", "-U", "+U"]


def test_to_changelog_waiting_update_before_expires_between_micro_batches(
    spark: SparkSession, tmp_path: Path
) -> None:
    first: list[Record] = [
        {"_row_kind": "+I", "id": 1, "name": "a", "ts_ms": 1, "seq": 1},
        {"_row_kind": "-U", "id": 1, "name": "a", "ts_ms": 2, "seq": 2},
    ]
    second: list[Record] = [{"_row_kind": "+U", "id": 1, "name": "b", "ts_ms": 2, "seq": 3}]
    params: dict[str, Any] = {
        "before": "before",
        "after": "after",
        "partition_by": "id",
        "state_ttl": TTL_SECONDS,
        "op_mapping": DEBEZIUM_TO,
    }
    stream = JsonStream(spark, tmp_path, CHANGELOG)

    def convert(df: DataFrame) -> DataFrame:
        return to_changelog(df, sequence_by="seq", **params)

    stream.append(first)
    written = stream.run(convert)
    time.sleep(PAUSE_SECONDS)
    stream.append(second)
    written += stream.run(convert)

    clock = SteppedClock()
    engine = ToChangelog(plan_to_changelog(**params), clock=clock)
    expected = [out for r in first for out in engine.process(_change(_without(r, ["seq"])))]
    clock.now += PAUSE_SECONDS
    expected += [out for r in second for out in engine.process(_change(_without(r, ["seq"])))]
    schema = convert(spark.createDataFrame([], CHANGELOG)).schema
    assert written == shaped(expected, schema)
    # The -U expired with the key's state: its +U is written as an insert (spec 4.3.3).
    assert [r["op"] for r in written] == ["c", "c"]


def test_stateless_conversion_on_a_stream(spark: SparkSession, tmp_path: Path) -> None:
    stream = JsonStream(spark, tmp_path, ENVELOPE)
    stream.append(DEBEZIUM_ENVELOPES)
    params: dict[str, Any] = {
        "before": "before",
        "after": "after",
        "op_mapping": DEBEZIUM_FROM,
        "passthrough": "ts_ms",
    }
    written = stream.run(lambda df: from_changelog(df, sequence_by="seq", **params))
    assert written == engine_from(DEBEZIUM_ENVELOPES, **params)


REJECTED_IN_STATE: list[Record] = [
    {"op": "upsert", "id": 4, "name": "a", "seq": 1},
    {"op": "merge", "id": 4, "name": "b", "seq": 2},
]
REJECTED_REASON = "partition_by key \\[4\\], sequence_by \\[2\\]: unknown operation code 'merge'"


def test_a_rejected_record_in_a_stateful_stream_names_its_key_and_position(
    spark: SparkSession, tmp_path: Path
) -> None:
    stream = JsonStream(spark, tmp_path, FLAT)
    stream.append(REJECTED_IN_STATE)
    params: dict[str, Any] = {"partition_by": "id", "state_ttl": HOUR, "op_mapping": UPSERT_TO_RETRACT}
    with pytest.raises(StreamingQueryException, match=REJECTED_REASON):
        stream.run(lambda df: from_changelog(df, sequence_by="seq", **params))


def test_a_rejected_record_in_a_stateful_batch_names_its_key_and_position(spark: SparkSession) -> None:
    df = spark.createDataFrame(REJECTED_IN_STATE, FLAT)
    params: dict[str, Any] = {"partition_by": "id", "state_ttl": HOUR, "op_mapping": UPSERT_TO_RETRACT}
    with pytest.raises(PythonException, match=REJECTED_REASON):
        from_changelog(df, sequence_by="seq", **params).collect()
