"""Stateful from_changelog / to_changelog streams under ``trigger(availableNow=True)``.

The queries run with Spark's settings as they come (idle micro-batches on): they must end, give the
engine's output for the same rows, and free expired state from Spark's state store, read back with
Spark's state data source. Shuffle partitions default to two per core unless set.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from changelog_streams import JsonStream, per_key
from pyspark.sql import DataFrame, SparkSession

from cdcflow.connectors.spark.changelog.frames import from_changelog, to_changelog
from cdcflow.connectors.spark.session import SHUFFLE_PARTITIONS_KEY
from cdcflow.core import Change, FromChangelog, RowKind, ToChangelog
from cdcflow.core.params import plan_from_changelog, plan_to_changelog

pytestmark = pytest.mark.integration

Record = dict[str, Any]

FLAT = "op string, id int, name string, seq long"
CHANGELOG = "_row_kind string, id int, name string, seq long"
UPSERT_TO_RETRACT = {"upsert": "INSERT, UPDATE_BEFORE, UPDATE_AFTER", "delete": "DELETE"}
DEBEZIUM_TO = {"INSERT": "c", "UPDATE_BEFORE, UPDATE_AFTER": "u", "DELETE": "d"}
NO_DATA_BATCHES_KEY = "spark.sql.streaming.noDataMicroBatches.enabled"
HOUR = timedelta(hours=1)


class SteppedClock:
    """Processing time for the engine: one reading per micro-batch, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def without_seq(record: Record) -> Record:
    return {k: v for k, v in record.items() if k != "seq"}


def with_all_columns(envelope: Record) -> Record:
    """An engine envelope as Spark writes it: a partial delete's image has the other columns NULL."""
    return {
        k: {"id": v.get("id"), "name": v.get("name")} if isinstance(v, dict) else v
        for k, v in envelope.items()
    }


def data_batches(stream: JsonStream) -> list[int]:
    return [report["numInputRows"] for report in stream.progress if report["numInputRows"]]


def keys_in_state(spark: SparkSession, stream: JsonStream, state_name: str = "changelog") -> set[int]:
    """The grouping keys that have a value in the operator's state store, as of the last batch."""
    state = spark.read.format("statestore").option("stateVarName", state_name).load(str(stream.checkpoint))
    return {row["key"][0] for row in state.collect()}


UPSERT_FILES: list[list[Record]] = [
    [{"op": "upsert", "id": 1, "name": "a", "seq": 2}, {"op": "upsert", "id": 1, "name": "a0", "seq": 1}],
    [{"op": "upsert", "id": 2, "name": "x", "seq": 3}, {"op": "upsert", "id": 3, "name": "p", "seq": 4}],
    [{"op": "upsert", "id": 1, "name": "b", "seq": 5}, {"op": "delete", "id": 3, "name": "p", "seq": 6}],
    [{"op": "upsert", "id": 2, "name": "y", "seq": 8}, {"op": "upsert", "id": 2, "name": "x2", "seq": 7}],
    [{"op": "upsert", "id": 3, "name": "q", "seq": 9}, {"op": "upsert", "id": 4, "name": "n", "seq": 10}],
    [{"op": "upsert", "id": 1, "name": "c", "seq": 11}, {"op": "delete", "id": 4, "name": "n", "seq": 12}],
]


def test_from_changelog_with_state_ttl_ends_under_available_now(spark: SparkSession, tmp_path: Path) -> None:
    assert spark.conf.get(NO_DATA_BATCHES_KEY) == "true"  # Spark's default, not changed for the query
    params: dict[str, Any] = {"partition_by": "id", "state_ttl": HOUR, "op_mapping": UPSERT_TO_RETRACT}
    stream = JsonStream(spark, tmp_path, FLAT, maxFilesPerTrigger="2")
    for records in UPSERT_FILES:
        stream.append(records)

    def convert(df: DataFrame) -> DataFrame:
        # Three input partitions: a key's rows of one micro-batch arrive out of order.
        return from_changelog(df.repartition(3), sequence_by="seq", **params)

    written = stream.run(convert)

    assert data_batches(stream) == [4, 4, 4]
    engine = FromChangelog(plan_from_changelog(**params))
    in_order = sorted((r for f in UPSERT_FILES for r in f), key=lambda r: r["seq"])
    expected = [
        {**c.row, "_row_kind": c.kind.value} for r in in_order for c in engine.process(without_seq(r))
    ]
    assert per_key(written) == per_key(expected)
    assert [(r["_row_kind"], r["name"]) for r in written if r["id"] == 1] == [
        ("+I", "a0"),
        ("-U", "a0"),
        ("+U", "a"),
        ("-U", "a"),
        ("+U", "b"),
        ("-U", "b"),
        ("+U", "c"),
    ]
    # The session's explicit setting (2) is kept, not replaced by the default of two per core.
    assert {op["numShufflePartitions"] for op in stream.state_operators()} == {2}


def test_to_changelog_with_state_ttl_ends_under_available_now(spark: SparkSession, tmp_path: Path) -> None:
    files: list[list[Record]] = [
        [
            {"_row_kind": "+I", "id": 1, "name": "a", "seq": 1},
            {"_row_kind": "-U", "id": 1, "name": "a", "seq": 2},
        ],
        [
            {"_row_kind": "+U", "id": 1, "name": "b", "seq": 3},
            {"_row_kind": "+I", "id": 2, "name": "x", "seq": 4},
        ],
        [{"_row_kind": "-U", "id": 2, "name": "x", "seq": 5}],
        [
            {"_row_kind": "+U", "id": 2, "name": "y", "seq": 6},
            {"_row_kind": "-D", "id": 1, "name": "b", "seq": 7},
        ],
    ]
    params: dict[str, Any] = {
        "before": "before",
        "after": "after",
        "partition_by": "id",
        "state_ttl": HOUR,
        "op_mapping": DEBEZIUM_TO,
    }
    stream = JsonStream(spark, tmp_path, CHANGELOG, maxFilesPerTrigger="1")
    for records in files:
        stream.append(records)
    written = stream.run(lambda df: to_changelog(df, sequence_by="seq", **params))

    assert data_batches(stream) == [2, 2, 1, 2]
    engine = ToChangelog(plan_to_changelog(**params))
    changes = [Change(RowKind.from_short_string(r["_row_kind"]), without_seq(r)) for f in files for r in f]
    for change in changes:
        change.row.pop("_row_kind")
    expected = [with_all_columns(out) for change in changes for out in engine.process(change)]
    assert per_key(written) == per_key(expected)
    # Each -U waited in state for its +U, one micro-batch later: one 'u' record each.
    assert {key: [r["op"] for r in records] for key, records in per_key(written).items()} == {
        1: ["c", "u", "d"],
        2: ["c", "u"],
    }


TTL_SECONDS = 1.0
PAUSE_SECONDS = 2.0


def test_expired_state_is_freed_and_a_returning_key_is_new(spark: SparkSession, tmp_path: Path) -> None:
    params: dict[str, Any] = {"partition_by": "id", "state_ttl": TTL_SECONDS, "op_mapping": UPSERT_TO_RETRACT}
    stream = JsonStream(spark, tmp_path, FLAT)

    def convert(df: DataFrame) -> DataFrame:
        return from_changelog(df, sequence_by="seq", **params)

    runs: list[list[Record]] = [
        [{"op": "upsert", "id": 1, "name": "a", "seq": 1}, {"op": "upsert", "id": 2, "name": "x", "seq": 2}],
        [{"op": "upsert", "id": 3, "name": "p", "seq": 3}, {"op": "upsert", "id": 3, "name": "q", "seq": 4}],
        [{"op": "upsert", "id": 1, "name": "b", "seq": 5}],
    ]
    stream.append(runs[0])
    written = stream.run(convert)
    assert keys_in_state(spark, stream) == {1, 2}
    time.sleep(PAUSE_SECONDS)
    stream.append(runs[1])
    written += stream.run(convert)
    # Keys 1 and 2 expired and did not come back: their timers freed them from the state store.
    assert keys_in_state(spark, stream) == {3}
    time.sleep(PAUSE_SECONDS)
    stream.append(runs[2])
    written += stream.run(convert)

    clock = SteppedClock()
    engine = FromChangelog(plan_from_changelog(**params), clock=clock)
    expected: list[Record] = []
    for run in runs:
        clock.now += PAUSE_SECONDS
        expected += [
            {**c.row, "_row_kind": c.kind.value} for r in run for c in engine.process(without_seq(r))
        ]
    assert per_key(written) == per_key(expected)
    assert [(r["_row_kind"], r["name"]) for r in written if r["id"] == 1] == [("+I", "a"), ("+I", "b")]
    assert [r["_row_kind"] for r in written if r["id"] == 3] == ["+I", "-U", "+U"]  # one micro-batch
    # Key 3 expired too; the micro-batch after run 3's data freed it.
    assert keys_in_state(spark, stream) == {1}


def test_shuffle_partitions_default_to_two_per_core_until_set(spark: SparkSession, tmp_path: Path) -> None:
    previous = spark.conf.get(SHUFFLE_PARTITIONS_KEY)
    assert previous is not None
    spark.conf.unset(SHUFFLE_PARTITIONS_KEY)
    params: dict[str, Any] = {"partition_by": "id", "state_ttl": HOUR, "op_mapping": UPSERT_TO_RETRACT}
    stream = JsonStream(spark, tmp_path, FLAT)
    default = 2 * spark.sparkContext.defaultParallelism
    try:
        stream.append(UPSERT_FILES[0])
        stream.run(lambda df: from_changelog(df, sequence_by="seq", **params))
        assert spark.conf.get(SHUFFLE_PARTITIONS_KEY) == str(default)
        assert {op["numShufflePartitions"] for op in stream.state_operators()} == {default}
        # A stateful query keeps the partitions of its first start: a later setting does not move it.
        spark.conf.set(SHUFFLE_PARTITIONS_KEY, "3")
        stream.append(UPSERT_FILES[1])
        stream.run(lambda df: from_changelog(df, sequence_by="seq", **params))
        assert spark.conf.get(SHUFFLE_PARTITIONS_KEY) == "3"
        assert {op["numShufflePartitions"] for op in stream.state_operators()} == {default}
    finally:
        spark.conf.set(SHUFFLE_PARTITIONS_KEY, previous)
