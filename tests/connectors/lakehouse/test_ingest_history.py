"""``ingest --mode scd2``: the recorded PostgreSQL workload (test_postgres_workload.py) kept as SCD2
history, checked against PostgreSQL's final SELECT and against the recording's own events.

The recording is a two-partition topic dump. Read as a consumer caught up on both partitions reads it
(records in the order Kafka stamped them), every value is known when its change is applied. Read as it
is stored (all of partition 0, then partition 1), a primary-key change's create can come batches before
its old key's rows: the job claims the old key's value and patches the versions once it arrives; what
it cannot know it leaves NULL and counts, never a wrong value.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from backends import Lake, lake
from deltalake import DeltaTable
from test_postgres_workload import (
    PG_TYPES,
    differences,
    expected,  # noqa: F401 - the module's fixture
    ingest_options,
    postgres_rows,
    recorded_events,
    unpack,
)

from cdcflow.connectors.lakehouse.delta.history_apply import END_AT, START_AT, HistoryApplier
from cdcflow.connectors.lakehouse.delta.options import ApplyOptions
from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TABLE = "items_default"


def as_kafka_reads(dump: Path, into: Path) -> Path:
    """The dump's records in the order Kafka stamped them (partitions interleaved)."""
    head, *lines = dump.read_text(encoding="utf-8").splitlines()
    records = sorted((json.loads(line) for line in lines), key=lambda r: (r["timestamp"], r["partition"]))
    into.write_text("\n".join([head, *(json.dumps(r) for r in records)]) + "\n", encoding="utf-8")
    return into


def history_rows(table: DeltaTable) -> list[dict[str, Any]]:
    rows = table.to_pyarrow_table().to_pylist()
    for row in rows:
        if row["seen_at"] is not None:
            row["seen_at"] = row["seen_at"].astimezone(UTC)
    return rows


def current(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for row in rows:
        if row[END_AT] is None:
            assert row["id"] not in found, f"id {row['id']} has two open versions"
            found[row["id"]] = {c: row[c] for c in PG_TYPES}
    return found


def ms(at: datetime) -> int:
    return round(at.timestamp() * 1000)


def scd2(dump: Path, place: Lake, options: dict[str, str]) -> IngestConfig:
    return IngestConfig(
        format="debezium-json",
        key=(),
        target=place.path("history"),
        checkpoint=place.path("checkpoint", "s3a"),
        path=str(dump),
        options=options,
        mode="scd2",
        storage_options=place.storage_options,
    )


def test_history_of_the_recorded_workload_read_as_kafka_reads_it(
    spark: SparkSession,
    tmp_path: Path,
    expected: dict[str, Any],  # noqa: F811 - the fixture
) -> None:
    """Several micro-batches, in two runs (the second from the first's checkpoint, over the rest of
    the topic). The open versions are PostgreSQL's final rows; each key's versions follow one another
    without overlap, start at the commit time of a change of that key and end at the next one's (or
    at the TRUNCATE); every version's values are the key's values after that change."""
    dump = as_kafka_reads(unpack(TABLE, tmp_path), tmp_path / "kafka-order.jsonl")
    full = dump.read_text(encoding="utf-8")
    lines = full.splitlines(keepends=True)
    dump.write_text("".join(lines[: len(lines) // 2]), encoding="utf-8")
    options = ingest_options(dump, batches=3)
    place = Lake(tmp_path)
    first = ingest(scd2(dump, place, options), spark=spark)
    dump.write_text(full, encoding="utf-8")
    second = ingest(scd2(dump, place, options), spark=spark)
    assert first.batches >= 2 and second.batches >= 2, (first, second)
    assert first.progress.totals.unavailable_unfilled == second.progress.totals.unavailable_unfilled == 0

    rows = history_rows(place.table("history"))
    want = postgres_rows(expected, TABLE)
    assert current(rows) == want, differences(TABLE, want, current(rows))

    # The recording's own events, without cdcflow: per key, the commit times of its changes.
    events = [e for e in recorded_events(TABLE) if e["value"] is not None]
    changed: dict[int, set[int]] = {}
    for event in events:
        change = event["value"]
        if change["op"] != "t":
            row = change["after"] or change["before"]
            changed.setdefault(row["id"], set()).add(change["source"]["ts_ms"])
    (truncate,) = [e["value"]["source"]["ts_ms"] for e in events if e["value"]["op"] == "t"]
    by_key: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_key.setdefault(row["id"], []).append(row)
    assert set(by_key) <= set(changed)
    for key, versions in by_key.items():
        versions.sort(key=lambda v: v[START_AT])
        for version, following in zip(versions, [*versions[1:], None], strict=True):
            start, end = ms(version[START_AT]), version[END_AT] and ms(version[END_AT])
            assert start in changed[key], (key, version[START_AT])
            assert end is None or end == truncate or end in changed[key], (key, version[END_AT])
            assert end is None or start < end, (key, start, end)
            if following is not None:
                assert end is not None and end <= ms(following[START_AT]), (key, version, following)
            # the truncate ended every version open at its time
            assert not (start < truncate and (end is None or end > truncate)), (key, start, end)
    assert sum(len(v) for v in by_key.values()) > 2 * len(want)  # a history, not the current rows

    # Each version's values are the key's after the change that opened it, the recording folded here
    # (an unavailable value: the key's previous one, the old key's for a primary-key change).
    assert_versions_follow_the_recording(events, by_key)


def assert_versions_follow_the_recording(
    events: list[dict[str, Any]], by_key: dict[int, list[dict[str, Any]]]
) -> None:
    def position(event: dict[str, Any]) -> tuple[int, int, bool]:
        commit, lsn = json.loads(event["value"]["source"]["sequence"])
        return int(commit or 0), int(lsn), event["value"]["op"] != "d"

    rows: dict[int, dict[str, Any]] = {}
    moved: dict[int, dict[str, Any]] = {}
    after: dict[tuple[int, int], str | None] = {}  # (key, ts_ms) -> body after that time's changes
    for event in sorted(events, key=position):
        change = event["value"]
        if change["op"] in ("t", "d"):
            if change["op"] == "d":
                row = rows.pop(change["before"]["id"])
                if new_key := event["headers"].get("__debezium.newkey"):
                    moved[new_key["id"]] = row
            continue
        key = change["after"]["id"]
        previous = moved.pop(key) if event["headers"].get("__debezium.oldkey") else rows.get(key)
        body = change["after"]["body"]
        if body == "__debezium_unavailable_value":
            assert previous is not None
            body = previous["body"]
        rows[key] = {"body": body}
        after[(key, change["source"]["ts_ms"])] = body
    checked = 0
    for key, versions in by_key.items():
        for version in versions:
            at = (key, ms(version[START_AT]))
            if at in after:
                assert version["body"] == after[at], (key, version[START_AT])
                checked += 1
    assert checked > 1000


def test_history_read_partition_after_partition_on_s3_is_never_wrong(
    spark: SparkSession,
    tmp_path: Path,
    expected: dict[str, Any],  # noqa: F811 - the fixture
    request: pytest.FixtureRequest,
) -> None:
    """The dump as it is stored, the history and the checkpoint on the S3 test server: claims patch
    most primary-key changes' values; those a chain of key changes still waits for stay NULL and are
    counted; no value is another row's."""
    dump = unpack(TABLE, tmp_path)
    place = lake("s3", tmp_path / "lake", request)
    summary = ingest(scd2(dump, place, ingest_options(dump)), spark=spark)
    assert place.bucket is not None and place.bucket.keys("history/_delta_log/")
    got, want = current(history_rows(place.table("history"))), postgres_rows(expected, TABLE)
    assert set(got) == set(want)
    wrong = [k for k in want if got[k] != want[k] and got[k] != {**want[k], "body": None}]
    assert not wrong, differences(TABLE, {k: want[k] for k in wrong}, {k: got[k] for k in wrong})
    nulls = sum(1 for k in want if got[k] != want[k])
    assert nulls <= summary.progress.totals.unavailable_unfilled


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--mode", "scd2", "--backend", "spark"], "--mode scd2 writes with delta-rs"),
        (["--mode", "scd2", "--format", "canal-json"], "--mode scd2 needs each change's time"),
        (["--target", "/lake/{table}", "--table-mode", "items=scd3"], "the mode is scd1 or scd2"),
    ],
)
def test_the_mode_flags_are_checked_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], says: str
) -> None:
    from cdcflow.cli import main

    target = [] if "--target" in flags else ["--target", str(tmp_path / "t")]
    assert (
        main(["ingest", "--path", str(tmp_path), "--checkpoint", str(tmp_path / "c"), *target, *flags]) == 2
    )
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


# --- the applier on hand-made batches: the cases the recording has none of --------------------------

HAND = pa.schema(
    [
        ("id", pa.int32()),
        ("c", pa.string()),
        ("ts", pa.int64()),
        ("_row_kind", pa.string()),
        ("_control", pa.string()),
        ("unavailable_columns", pa.list_(pa.string())),
        ("old_key", pa.string()),
        ("new_key", pa.string()),
    ]
)


def hand_applier(target: Path) -> HistoryApplier:
    options = ApplyOptions(
        key=("id",),
        control_column="_control",
        unavailable_column="unavailable_columns",
        old_key_column="old_key",
        new_key_column="new_key",
    )
    return HistoryApplier(str(target), options, "ts", app_id="hand")


def hand_batch(*rows: tuple[Any, ...]) -> pa.Table:
    """Rows of (kind, id, c, ts), a kind "t" being a TRUNCATE; c "?" is unavailable; a 5th value is
    the old (on a create) or new (on a delete) key."""
    records = []
    for kind, row_id, value, ts, *link in rows:
        control = "truncate" if kind == "t" else None
        linked = json.dumps({"id": link[0]}) if link else None
        records.append(
            {
                "id": None if control else row_id,
                "c": None if value == "?" else value,
                "ts": ts,
                "_row_kind": None if control else kind,
                "_control": control,
                "unavailable_columns": ["c"] if value == "?" else [],
                "old_key": linked if kind != "-D" else None,
                "new_key": linked if kind == "-D" else None,
            }
        )
    return pa.Table.from_pylist(records, schema=HAND)


def versions(target: Path) -> list[tuple[int, str | None, int, int | None]]:
    rows = DeltaTable(str(target)).to_pyarrow_table().to_pylist()
    return sorted((r["id"], r["c"], r[START_AT], r[END_AT]) for r in rows)


def test_every_truncate_of_a_batch_ends_the_rows_open_at_its_time(tmp_path: Path) -> None:
    target = tmp_path / "h"
    applier = hand_applier(target)
    applier.apply(hand_batch(("+I", 1, "a", 10)), 0)
    applier.apply(hand_batch(("t", 0, None, 20), ("+I", 2, "b", 30), ("t", 0, None, 40)), 1)
    assert versions(target) == [(1, "a", 10, 20), (2, "b", 30, 40)]
    # a change from before both truncates, arriving late, ends at the first: no zero-length row
    applier.apply(hand_batch(("+I", 3, "c", 15)), 2)
    assert versions(target) == [(1, "a", 10, 20), (2, "b", 30, 40), (3, "c", 15, 20)]


def test_an_unchanged_value_comes_from_a_same_time_change_an_earlier_batch_wrote(tmp_path: Path) -> None:
    """Two updates of one transaction (one commit time) split across micro-batches."""
    target = tmp_path / "h"
    applier = hand_applier(target)
    applier.apply(hand_batch(("+I", 1, "A", 10), ("+U", 1, "B", 50)), 0)
    result = applier.apply(hand_batch(("+U", 1, "?", 50)), 1)
    assert result.unavailable_unfilled == 0
    assert versions(target) == [(1, "A", 10, 50), (1, "B", 50, None)]


def test_a_key_change_whose_old_key_comes_later_is_patched_and_a_chain_is_counted(tmp_path: Path) -> None:
    target = tmp_path / "h"
    applier = hand_applier(target)
    applier.apply(hand_batch(("+I", 7, "toast", 10)), 0)
    # 7 -> 8 at 20, then 8 -> 9 at 30: the creates arrive first (another partition), 9's delete of 8
    # in the same batch, 7's delete a batch later
    first = applier.apply(hand_batch(("+I", 8, "?", 20, 7), ("+I", 9, "?", 30, 8), ("-D", 8, None, 30, 9)), 1)
    assert first.unavailable_unfilled == 1  # 9 takes 8's value, which 8 itself still waits for
    applier.apply(hand_batch(("-D", 7, None, 20, 8)), 2)
    got = versions(target)
    assert (7, "toast", 10, 20) in got and (8, "toast", 20, 30) in got, got
    assert (9, None, 30, None) in got  # counted above, never another row's value
