"""Streaming aggregations into Delta: ``apply_changes`` upserts each micro-batch's changed groups.

The input is a folder of JSON files read by Spark's file source, two files per micro-batch. After the
run, every Delta commit is read back at its version (time travel) and compared with the aggregate
computed here in plain Python over the files Spark's checkpoint says that batch and the ones before
it read. Restarts and a replayed batch (Spark's commit log entry of the last batch removed: a crash
after the Delta commit, before Spark's) continue from the checkpoint.
"""

from __future__ import annotations

import json
import os
import random
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from backends import BACKENDS
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.lakehouse.sink import apply_changes

pytestmark = pytest.mark.integration

KEYS = ("ant", "bee", "cat", "dog", "eel")
START = datetime(2024, 5, 1, tzinfo=UTC)
Row = dict[str, Any]
Aggregate = Callable[[list[Row], int], dict[tuple[Any, ...], tuple[Any, ...]]]


def write_files(folder: Path, first: int, rows_per_file: list[list[Row]]) -> None:
    """One JSON-lines file per entry, modified one second apart (the file source reads oldest first)."""
    folder.mkdir(exist_ok=True)
    for number, rows in enumerate(rows_per_file, start=first):
        path = folder / f"part-{number:03d}.json"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        os.utime(path, (1_700_000_000 + number, 1_700_000_000 + number))


def random_rows(rng: random.Random, files: int, *, first: int = 0) -> list[list[Row]]:
    """Rows of a few keys; event times advance 30 minutes a file, a little out of order within it."""
    out = []
    for number in range(first, first + files):
        at = START + timedelta(minutes=30 * number)
        out.append(
            [
                {
                    "k": rng.choice(KEYS),
                    "v": rng.randint(-50, 100),
                    "ts": (at + timedelta(minutes=rng.randint(-5, 5))).isoformat(),
                }
                for _ in range(rng.randint(3, 9))
            ]
        )
    return out


def stream(spark: SparkSession, folder: Path) -> DataFrame:
    return (
        spark.readStream.schema("k STRING, v BIGINT, ts TIMESTAMP")
        .option("maxFilesPerTrigger", 2)
        .json(str(folder))
    )


def batch_of_file(checkpoint: Path) -> dict[str, int]:
    """File name -> the micro-batch that read it, from the file source's log in the checkpoint."""
    read: dict[str, int] = {}
    for entry in (checkpoint / "sources" / "0").iterdir():
        if entry.name.startswith("."):
            continue
        for line in entry.read_text(encoding="utf-8").splitlines()[1:]:
            record = json.loads(line)
            read[Path(record["path"].removeprefix("file://")).name] = int(record["batchId"])
    return read


def input_rows(folder: Path) -> list[tuple[str, Row]]:
    return [
        (path.name, json.loads(line))
        for path in sorted(folder.glob("*.json"))
        for line in path.read_text(encoding="utf-8").splitlines()
    ]


def commits(target: Path) -> list[tuple[int, str, int]]:
    """(table version, app id, batch id) of every commit that recorded a micro-batch."""
    found = []
    for path in sorted((target / "_delta_log").glob("*.json"), key=lambda p: int(p.stem)):
        for line in path.read_text(encoding="utf-8").splitlines():
            action = json.loads(line)
            if "txn" in action:
                found.append((int(path.stem), action["txn"]["appId"], int(action["txn"]["version"])))
    return found


def table_at(target: Path, version: int, key: Iterable[str], values: Iterable[str]) -> dict[Any, Any]:
    rows = DeltaTable(str(target), version=version).to_pyarrow_table().to_pylist()
    return {tuple(r[c] for c in key): tuple(r[c] for c in values) for r in rows}


def run(spark: SparkSession, frame: DataFrame, target: Path, checkpoint: Path, **options: Any) -> None:
    query = apply_changes(
        frame, str(target), checkpoint=str(checkpoint), trigger={"availableNow": True}, **options
    )
    query.awaitTermination()
    assert query.exception() is None


def assert_every_batch(
    folder: Path, target: Path, checkpoint: Path, key: tuple[str, ...], aggregate: Aggregate
) -> int:
    """Each commit's table equals ``aggregate`` over the rows of the batches up to its own; returns the
    number of commits. Each batch is committed once, by one application, in order."""
    read = batch_of_file(checkpoint)
    rows = [(read[name], row) for name, row in input_rows(folder)]
    assert {name for name, _ in input_rows(folder)} <= read.keys(), "a file was never read"
    recorded = commits(target)
    assert len({app for _, app, _ in recorded}) == 1
    batches = [b for _, _, b in recorded]
    assert batches == sorted(set(batches)), f"a batch committed twice or out of order: {batches}"
    for version, _, batch in recorded:
        expected = aggregate([row for b, row in rows if b <= batch], batch)
        values = next(iter(expected.values()), ())
        names = ("total", "n", "low")[: len(values)]
        assert table_at(target, version, key, names) == expected, f"batch {batch} (table version {version})"
    return len(recorded)


def per_key(rows: list[Row], _batch: int) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    totals: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0, 1 << 30])
    for row in rows:
        total = totals[(row["k"],)]
        total[0] += row["v"]
        total[1] += 1
        total[2] = min(total[2], row["v"])
    return {k: tuple(v) for k, v in totals.items()}


def sum_per_key(spark: SparkSession, folder: Path) -> DataFrame:
    return (
        stream(spark, folder)
        .groupBy("k")
        .agg(F.sum("v").alias("total"), F.count("*").alias("n"), F.min("v").alias("low"))
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_streaming_aggregation_lands_its_latest_value_per_group_after_every_batch(
    spark: SparkSession, tmp_path: Path, backend: str
) -> None:
    folder, target, checkpoint = tmp_path / "in", tmp_path / "table", tmp_path / "chk"
    rng = random.Random(14)  # noqa: S311 - test data
    write_files(folder, 0, random_rows(rng, 6))
    # two files per micro-batch: two input partitions
    assert spark.read.json([str(p) for p in sorted(folder.glob("*"))[:2]]).rdd.getNumPartitions() == 2

    run(spark, sum_per_key(spark, folder), target, checkpoint, key=["k"], backend=backend)
    assert assert_every_batch(folder, target, checkpoint, ("k",), per_key) == 3

    # a restart from the checkpoint: the aggregation's state and the table continue
    write_files(folder, 6, random_rows(rng, 4, first=6))
    run(spark, sum_per_key(spark, folder), target, checkpoint, key=["k"], backend=backend)
    assert assert_every_batch(folder, target, checkpoint, ("k",), per_key) == 5
    final = table_at(target, DeltaTable(str(target)).version(), ("k",), ("total", "n", "low"))
    assert final == per_key([row for _, row in input_rows(folder)], -1)
    assert set(DeltaTable(str(target)).schema().to_arrow().names) == {"k", "total", "n", "low"}


def test_a_batch_replayed_after_its_delta_commit_is_not_applied_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    folder, target, checkpoint = tmp_path / "in", tmp_path / "table", tmp_path / "chk"
    rng = random.Random(7)  # noqa: S311 - test data
    write_files(folder, 0, random_rows(rng, 4))
    run(spark, sum_per_key(spark, folder), target, checkpoint, key=["k"])
    assert assert_every_batch(folder, target, checkpoint, ("k",), per_key) == 2
    version = DeltaTable(str(target)).version()

    # a crash after batch 1's Delta commit, before Spark's commit log recorded it: Spark runs it again
    for name in ("1", ".1.crc"):
        (checkpoint / "commits" / name).unlink()
    run(spark, sum_per_key(spark, folder), target, checkpoint, key=["k"])
    assert (checkpoint / "commits" / "1").exists(), "Spark did not run batch 1 again"
    assert DeltaTable(str(target)).version() == version, "the replayed batch was committed again"

    # the next batches aggregate on from the state the first run committed
    write_files(folder, 4, random_rows(rng, 2, first=4))
    run(spark, sum_per_key(spark, folder), target, checkpoint, key=["k"])
    assert assert_every_batch(folder, target, checkpoint, ("k",), per_key) == 3
    assert table_at(target, DeltaTable(str(target)).version(), ("k",), ("total", "n", "low")) == per_key(
        [row for _, row in input_rows(folder)], -1
    )


def test_complete_output_mode_upserts_every_group_each_batch(spark: SparkSession, tmp_path: Path) -> None:
    folder, target, checkpoint = tmp_path / "in", tmp_path / "table", tmp_path / "chk"
    files = random_rows(random.Random(3), 4)  # noqa: S311 - test data
    files[2:] = [[row for row in rows if row["k"] != "dog"] for rows in files[2:]]  # batch 1 leaves dog be
    write_files(folder, 0, files)
    run(spark, sum_per_key(spark, folder), target, checkpoint, key=["k"], output_mode="complete")
    assert assert_every_batch(folder, target, checkpoint, ("k",), per_key) == 2
    # the last batch's merge named every group, the unchanged dog too
    groups = per_key([row for _, row in input_rows(folder)], 1)
    assert ("dog",) in groups
    assert DeltaTable(str(target)).history(1)[0]["operationMetrics"]["num_source_rows"] == len(groups)


def test_a_windowed_aggregation_with_a_watermark_is_keyed_by_window_start_and_end(
    spark: SparkSession, tmp_path: Path
) -> None:
    folder, target, checkpoint = tmp_path / "in", tmp_path / "table", tmp_path / "chk"
    rng = random.Random(21)  # noqa: S311 - test data
    delay = timedelta(minutes=10)

    def windows(rows: list[Row], batch: int) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        """Sum and count per hour window and key. Spark drops a row whose window ended at or before the
        watermark for late events: the previous batch's, the latest event time of the batches before
        that one minus the delay (a window's state is evicted by that same watermark)."""
        read = batch_of_file(checkpoint)
        batch_rows = [(read[name], row) for name, row in input_rows(folder)]
        totals: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0])
        for b, row in batch_rows:
            if b > batch:
                continue
            at = datetime.fromisoformat(row["ts"])
            start = at.replace(minute=0, second=0, microsecond=0)
            seen = [datetime.fromisoformat(r["ts"]) for earlier, r in batch_rows if earlier < b - 1]
            if seen and start + timedelta(hours=1) <= max(seen) - delay:
                continue
            total = totals[(start, start + timedelta(hours=1), row["k"])]
            total[0] += row["v"]
            total[1] += 1
        return {k: tuple(v) for k, v in totals.items()}

    def frame() -> DataFrame:
        return (
            stream(spark, folder)
            .withWatermark("ts", "10 minutes")
            .groupBy(F.window("ts", "1 hour"), "k")
            .agg(F.sum("v").alias("total"), F.count("*").alias("n"))
        )

    files = random_rows(rng, 6)
    # in batch 2, behind the event times seen but not the watermark for late events: aggregated
    files[5].append({"k": "ant", "v": 1000, "ts": (START + timedelta(minutes=5)).isoformat()})
    write_files(folder, 0, files)
    run(spark, frame(), target, checkpoint, key=["window", "k"])
    key = ("window_start", "window_end", "k")
    assert assert_every_batch(folder, target, checkpoint, key, windows) == 3
    assert DeltaTable(str(target)).schema().to_arrow().names[:3] == list(key)
    first = START, START + timedelta(hours=1), "ant"
    assert table_at(target, DeltaTable(str(target)).version(), key, ("total", "n"))[first][0] > 1000

    # after a restart, a row of a window the watermark closed (its state evicted) is dropped: the
    # window's complete aggregate stays in the table, not overwritten by the late row alone
    files = random_rows(rng, 2, first=6)
    files[0].append({"k": "ant", "v": 5000, "ts": (START + timedelta(minutes=7)).isoformat()})
    write_files(folder, 6, files)
    before = table_at(target, DeltaTable(str(target)).version(), key, ("total", "n"))[first]
    run(spark, frame(), target, checkpoint, key=["window", "k"])
    assert assert_every_batch(folder, target, checkpoint, key, windows) == 4
    final = table_at(target, DeltaTable(str(target)).version(), key, ("total", "n"))
    assert final[first] == before
    assert final == windows([], max(batch_of_file(checkpoint).values()))


def test_options_that_do_not_fit_an_upsert_stream_are_refused_before_the_query_starts(
    spark: SparkSession, tmp_path: Path
) -> None:
    folder = tmp_path / "in"
    write_files(folder, 0, [[{"k": "ant", "v": 1, "ts": START.isoformat()}]])
    frame, chk, target = sum_per_key(spark, folder), str(tmp_path / "chk"), str(tmp_path / "t")
    with pytest.raises(ConnectorOptionError, match="row_kind_column=None"):
        apply_changes(frame, target, key=["k"], checkpoint=chk, row_kind_column="kind")
    with pytest.raises(ConnectorOptionError, match="upsert_key: the DataFrame has no row kind column"):
        apply_changes(frame, target, key=["k"], checkpoint=chk, upsert_key=["k"])
    with pytest.raises(ConnectorOptionError, match="output_mode must be one of append, update, complete"):
        apply_changes(frame, target, key=["k"], checkpoint=chk, output_mode="upsert")
    with pytest.raises(ConnectorOptionError, match=r"key column\(s\) \['total2'\] are not columns"):
        apply_changes(frame, target, key=["total2"], checkpoint=chk)
    assert not (tmp_path / "chk").exists() and not (tmp_path / "t").exists()
