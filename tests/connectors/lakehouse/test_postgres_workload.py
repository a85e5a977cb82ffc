"""A recorded PostgreSQL workload, ingested into Delta, equals PostgreSQL's own final SELECT.

``recorded/`` holds real Debezium 3.6 events of a seeded random workload on a real PostgreSQL 15
(``scripts/record_postgres_debezium.py --workload``; what it contains: ``recorded/README.md``): two
tables, ``items_default`` (REPLICA IDENTITY DEFAULT: unchanged TOASTed ``body`` values arrive as
placeholders, deletes carry only the key) and ``items_full`` (FULL), with re-inserted ids,
primary-key changes that move a row to the other Kafka partition, NULLs, rolled-back transactions
and one TRUNCATE per table. Each topic is a two-partition topic dump.

Each table is ingested through the public path (``ingest`` / ``python -m cdcflow ingest`` with
``--format debezium-json --option schema-include=true``; the DEFAULT table needs no
``changelog-mode``: ingest reads Debezium updates as upserts) in several micro-batches of several input
partitions each, then every row and column of the Delta table is compared with PostgreSQL's
``col::text`` of that row, read from ``expected.json.gz`` (never from cdcflow's decoding). The dump
is read as it is ordered, all of partition 0 before partition 1 (as a consumer far behind on one
partition reads a topic): Kafka orders nothing across partitions, and the table must still come out
as PostgreSQL has it. The DEFAULT table runs again with the table, the key state and Spark's
checkpoint on the S3 test server (``s3_server.py``). test_crash.py ingests the DEFAULT table as a child
process killed twice with SIGKILL, on each back end.
"""

from __future__ import annotations

import base64
import gzip
import json
import shutil
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from backends import BACKENDS, Lake, delta_reader_rows, lake
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)

from cdcflow.connectors.lakehouse.delta.result import BatchApplied
from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

RECORDED = Path(__file__).parent / "recorded"
TABLES = ("items_default", "items_full")
BATCHES = 5
"""micro-batches per table: maxBytesPerTrigger is the dump's size / BATCHES (a batch ends at a line)."""
SPLITS = 3
"""input partitions per micro-batch: maxRecordsPerPartition makes splits of a third of a batch."""
BYTES_PER_RECORD = 400  # how maxRecordsPerPartition turns into split bytes (docs/connectors.md)
RUN_TIMEOUT = 240.0


@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    with gzip.open(RECORDED / "expected.json.gz", "rt", encoding="utf-8") as fh:
        doc: dict[str, Any] = json.load(fh)
    return doc


def unpack(table: str, into: Path) -> Path:
    dump = into / f"{table}.dump.jsonl"
    with gzip.open(RECORDED / f"{table}.dump.jsonl.gz", "rb") as src, dump.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return dump


def ingest_options(dump: Path, batches: int = BATCHES) -> dict[str, str]:
    """The source options that read ``dump`` in ``batches`` micro-batches of ``SPLITS`` partitions."""
    batch_bytes = dump.stat().st_size // batches + 1
    # No changelog-mode for the DEFAULT table (no before image on u, key only on d): ingest reads
    # Debezium updates as upserts by default.
    return {
        "schema-include": "true",
        "maxBytesPerTrigger": str(batch_bytes),
        "maxRecordsPerPartition": str(batch_bytes // SPLITS // BYTES_PER_RECORD),
    }


# --- PostgreSQL's text form → the values Delta must hold ------------------------------------------
# expected.json.gz has each row as {column: col::text} from PostgreSQL with TimeZone=UTC and
# DateStyle=ISO. Each column's text is read back into the Python value of the Delta column's type:
#   integer          '47674'                        -> int
#   numeric(12,2)    '773127.55', '-0.10'           -> Decimal of the same digits (scale 2 kept)
#   boolean          'true' / 'false'               -> bool
#   timestamp        '1995-08-19 08:39:17.950035'   -> naive datetime (PG drops trailing zero digits)
#   timestamptz      '2024-06-01 06:00:00.000001+00' -> aware datetime in UTC (Delta TIMESTAMP is UTC)
#   varchar / text   verbatim                       -> str
#   SQL NULL         null                           -> None
PG_TYPES: dict[str, Callable[[str], Any]] = {
    "id": int,
    "name": str,
    "qty": int,
    "price": Decimal,
    "active": lambda text: {"true": True, "false": False}[text],
    "updated_at": datetime.fromisoformat,
    "seen_at": lambda text: datetime.fromisoformat(text).astimezone(UTC),
    "note": str,
    "body": str,
}


def postgres_rows(expected: dict[str, Any], table: str) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    for text_row in expected["final"][table]["text"]:
        assert set(text_row) == set(PG_TYPES), "expected.json.gz has other columns than this test knows"
        row: dict[str, Any] = {c: None if t is None else PG_TYPES[c](t) for c, t in text_row.items()}
        rows[row["id"]] = row
    assert len(rows) == expected["final"][table]["rows"]
    return rows


def delta_rows(place: Lake, table: str, spark: SparkSession | None = None) -> dict[int, dict[str, Any]]:
    """The table's rows as ``deltalake`` reads them, or given ``spark``, as ``spark.read.format("delta")``."""
    if spark is None:
        arrow = place.table(table).to_pyarrow_table()
        assert set(arrow.column_names) == set(PG_TYPES), f"the table's columns: {arrow.column_names}"
        read = arrow.to_pylist()
    else:
        read = delta_reader_rows(spark, place.path(table), place.storage_options or None)
        assert read and set(read[0]) == set(PG_TYPES), f"the table's columns: {read and list(read[0])}"
    rows: dict[int, dict[str, Any]] = {}
    for row in read:
        assert row["id"] not in rows, f"id {row['id']} is in the table twice"
        seen_at = row["seen_at"]
        if isinstance(seen_at, datetime) and seen_at.tzinfo is not None:
            row["seen_at"] = seen_at.astimezone(UTC)
        rows[row["id"]] = row
    return rows


def differences(table: str, want: dict[int, dict[str, Any]], got: dict[int, dict[str, Any]]) -> str:
    """What differs, summarized per kind so a failure says what went wrong at a glance."""
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    lines = []
    if missing:
        lines.append(f"{len(missing)} rows PostgreSQL has are missing from Delta: ids {missing[:20]}")
    if extra:
        lines.append(f"{len(extra)} rows Delta has that PostgreSQL does not: ids {extra[:20]}")
    by_column: dict[str, list[int]] = {}
    nulls: dict[str, list[int]] = {}
    for row_id in sorted(set(want) & set(got)):
        for column, value in want[row_id].items():
            if got[row_id][column] != value:
                by_column.setdefault(column, []).append(row_id)
                if got[row_id][column] is None:
                    nulls.setdefault(column, []).append(row_id)
    for column, ids in by_column.items():
        first = ids[0]
        lines.append(
            f"{len(ids)} rows differ in {column} ({len(nulls.get(column, []))} of them NULL in Delta), "
            f"ids {ids[:30]}; id {first}: Delta {_short(got[first][column])} vs PostgreSQL "
            f"{_short(want[first][column])}"
        )
    return f"{table}: " + "; ".join(lines) if lines else ""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 70 else text[:67] + "..."


def batch_ranges(checkpoint: Path, dump: Path) -> list[int]:
    """Bytes of the dump each committed micro-batch read, from Spark's offset log."""
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    sizes, begin = [], 0
    for batch in commits:
        offsets = json.loads((checkpoint / "offsets" / str(batch)).read_text().splitlines()[-1])
        end = offsets["files"][str(dump)]
        sizes.append(end - begin)
        begin = end
    assert begin == dump.stat().st_size, "the query did not read the whole dump"
    return sizes


def assert_batches_and_partitions(checkpoint: Path, dump: Path, options: dict[str, str]) -> None:
    split_bytes = int(options["maxRecordsPerPartition"]) * BYTES_PER_RECORD
    read = [size for size in batch_ranges(checkpoint, dump) if size > 0]
    assert len(read) >= 5, f"{len(read)} micro-batches read the dump; the test needs at least 5"
    # a micro-batch of more than one split's bytes is read by several input partitions (tasks)
    assert sum(1 for size in read if size > split_bytes) >= 4, (read, split_bytes)


# --- the recording itself, without cdcflow ----------------------------------------------------------

UNAVAILABLE = "__debezium_unavailable_value"
EPOCH = datetime(1970, 1, 1)


def recorded_events(table: str) -> list[dict[str, Any]]:
    """The dump's records in file order: partition, offset, key payload, value payload, headers."""
    events = []
    with gzip.open(RECORDED / f"{table}.dump.jsonl.gz", "rt", encoding="utf-8") as fh:
        assert json.loads(next(fh)) == {"cdcflow-topic-dump": 1}
        for line in fh:
            record = json.loads(line)
            value = record["value"] and json.loads(base64.b64decode(record["value"]))
            key = record["key"] and json.loads(base64.b64decode(record["key"]))
            headers = {n: v and json.loads(base64.b64decode(v))["payload"] for n, v in record["headers"]}
            events.append(
                {
                    "partition": record["partition"],
                    "offset": record["offset"],
                    "key": key and key["payload"],
                    "value": value and value["payload"],
                    "headers": headers,
                }
            )
    return events


def reference_value(column: str, value: Any) -> Any:
    """A Debezium JSON value (schemas of recorded/README.md) as the Python value PG_TYPES gives."""
    if value is None or column in ("id", "name", "qty", "active", "note", "body"):
        return value
    if column == "price":  # Connect Decimal, scale 2: base64 of the big-endian two's complement
        return Decimal(int.from_bytes(base64.b64decode(value), "big", signed=True)).scaleb(-2)
    if column == "updated_at":  # io.debezium.time.MicroTimestamp
        return EPOCH + timedelta(microseconds=value)
    if column == "seen_at":  # io.debezium.time.ZonedTimestamp, ISO-8601 in UTC
        return datetime.fromisoformat(value).astimezone(UTC)
    raise AssertionError(column)


def reference_fold(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The events applied in log order (``source.sequence``): an unavailable value keeps the key's
    previous value, a primary-key change's create takes the old key's, a truncate empties the table."""

    def position(event: dict[str, Any]) -> tuple[int, int, bool]:
        # a primary-key change's delete and create share one LSN: the delete comes first
        commit, lsn = json.loads(event["value"]["source"]["sequence"])
        return int(commit or 0), int(lsn), event["value"]["op"] != "d"

    rows: dict[int, dict[str, Any]] = {}
    moved: dict[int, dict[str, Any]] = {}  # new key -> the old key's row, deleted just before its create
    for event in sorted((e for e in events if e["value"] is not None), key=position):
        change = event["value"]
        if change["op"] == "t":
            rows.clear()
        elif change["op"] == "d":
            row = rows.pop(change["before"]["id"])
            if new_key := event["headers"].get("__debezium.newkey"):
                moved[new_key["id"]] = row
        else:
            old_key = event["headers"].get("__debezium.oldkey")
            key = change["after"]["id"]
            previous = moved.pop(key) if old_key else rows.get(key)
            row = {}
            for column, value in change["after"].items():
                if value == UNAVAILABLE:
                    assert previous is not None, f"no previous value for {event}"
                    row[column] = previous[column]
                else:
                    row[column] = reference_value(column, value)
            rows[row["id"]] = row
    return rows


@pytest.mark.parametrize("table", TABLES)
def test_the_recording_is_what_its_readme_says(expected: dict[str, Any], table: str) -> None:
    """The dump holds every change: folded in log order by the reference above, it gives PostgreSQL's
    final SELECT. So a difference in the ingestion tests below is cdcflow's, not the recording's."""
    events = recorded_events(table)
    assert {e["partition"] for e in events} == {0, 1}
    ops = Counter(e["value"]["op"] if e["value"] else "tombstone" for e in events)
    assert ops["t"] == 1 and ops["r"] == 120 and ops["u"] > 1000 and ops["d"] > 200
    partition = {json.dumps(e["key"]): e["partition"] for e in events if e["key"] is not None}
    moved = [
        e
        for e in events
        if "__debezium.oldkey" in e["headers"]
        and partition[json.dumps(e["headers"]["__debezium.oldkey"])] != e["partition"]
    ]
    assert len(moved) > 80, "primary-key changes that move a row to the other partition"
    placeholders = sum(1 for e in events if e["value"] and UNAVAILABLE in json.dumps(e["value"]["after"]))
    assert placeholders > 1000 if table == "items_default" else placeholders == 0
    statements = sum(expected["workload"]["statements_committed_by_kind"].values())
    assert statements >= 5000
    assert reference_fold(events) == postgres_rows(expected, table)


class RunIds(StreamingQueryListener):
    """The run ids of the streaming queries started while it listens."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def onQueryStarted(self, event: QueryStartedEvent) -> None:  # noqa: N802 - Spark's name
        self.ids.append(str(event.runId))

    def onQueryProgress(self, event: QueryProgressEvent) -> None:  # noqa: N802
        pass

    def onQueryIdle(self, event: QueryIdleEvent) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:  # noqa: N802
        pass


@pytest.mark.integration
@pytest.mark.parametrize(
    ("table", "storage", "backend"),
    [
        pytest.param(table, storage, backend, id=f"{table}{' on S3' if storage == 's3' else ''}-{backend}")
        for table, storage in (("items_default", "local"), ("items_full", "local"), ("items_default", "s3"))
        for backend in BACKENDS
        # the Spark back end lands the local DEFAULT table in test_crash.py, killed twice on the way
        if (table, storage, backend) != ("items_default", "local", "spark")
    ],
)
def test_recorded_workload_lands_as_postgres_has_it(
    spark: SparkSession,
    tmp_path: Path,
    expected: dict[str, Any],
    table: str,
    backend: str,
    storage: str,
    request: pytest.FixtureRequest,
) -> None:
    dump = unpack(table, tmp_path)
    options = ingest_options(dump)
    place = lake(storage, tmp_path / "lake", request)
    applied: list[BatchApplied] = []
    runs = RunIds()
    spark.streams.addListener(runs)
    try:
        summary = ingest(
            IngestConfig(
                format="debezium-json",
                key=("id",),
                target=place.path(table),
                checkpoint=place.path("checkpoint", "s3a"),
                path=str(dump),
                options=options,
                backend=backend,  # type: ignore[arg-type]
                storage_options=place.storage_options,
            ),
            spark=spark,
            on_batch=applied.append,
        )
    finally:
        spark.streams.removeListener(runs)
    assert summary.batches >= 5 and len(applied) >= 5, summary
    if place.bucket is not None:  # Spark's checkpoint and the app id went to the bucket, not to a folder
        assert place.bucket.keys("checkpoint/commits/") and place.bucket.keys("checkpoint/cdcflow-app-id")
        assert sorted(p.name for p in tmp_path.iterdir()) == [dump.name]
    assert_batches_and_partitions(place.local("checkpoint", tmp_path / "copy"), dump, options)
    # Spark runs a streaming query's jobs in a job group named by its run id: their stages' task
    # counts are the input partitions each micro-batch was read with.
    tracker = spark.sparkContext.statusTracker()
    tasks = [
        stage.numTasks
        for run in runs.ids
        for job in tracker.getJobIdsForGroup(run)
        if (info := tracker.getJobInfo(job)) is not None
        for stage_id in info.stageIds
        if (stage := tracker.getStageInfo(stage_id)) is not None
    ]
    assert sum(1 for n in tasks if n >= 2) >= 5, f"tasks per stage: {tasks}"

    want, got = postgres_rows(expected, table), delta_rows(place, table)
    problems = differences(table, want, got)
    assert not problems, f"{problems} (ingest: {summary})"
    problems = differences(table, want, delta_rows(place, table, spark))
    assert not problems, f"read by spark.read.format('delta'): {problems}"
