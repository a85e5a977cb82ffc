"""Exactly once through crashes: an ingestion killed with SIGKILL mid-stream, restarted from its checkpoint.

Run with each apply back end: delta-rs (the default) and Spark with Delta Lake's jars (``--backend
spark``: each micro-batch costs Spark jobs, so its history is smaller: 20k changes over 2k keys in ~10
micro-batches, still more than the two kills can reach).

A seeded history of 100k Debezium changes over 10k keys (bench/cdc_history.py) is ingested into Delta
by ``python -m cdcflow ingest`` in a session of its own (Python driver, JVM, Python workers), in ~30
micro-batches. Its process group is killed twice, each once the table moved past the previous kill,
plus a random delay (the second delay short, to land between a batch's target commit and its key-state
commit); then the job runs from its checkpoint to the end. The table must equal the history folded
by id, and the Delta logs of the table and of the key state must hold exactly one commit per batch.
The seed of the history and the kill points changes every day (the date, ``YYYYMMDD``), so the runs
of a week land kills at different points; a failure names its seed, and ``CDCFLOW_CRASH_SEED=N`` runs
that one again. Run with ``-s`` to see where the kills landed.

The delta-rs back end runs it a second time with the table, the key state and Spark's checkpoint
(``s3a://``) on the S3 test server (``s3_server.py``), with a smaller history (30k changes over 3k keys in
~15 micro-batches): the logs are inspected from a copy of the bucket.
"""

from __future__ import annotations

import bisect
import json
import os
import random
import signal
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from backends import Lake, delta_jars, delta_reader_rows, lake
from bench_modules import bench_module
from ingest_process import start_ingest, tail, wait_for, wait_session_gone

from cdcflow.connectors.lakehouse.sink import STATE_DIR

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KILLS = 2
SIZES = {"delta-rs": (100_000, 10_000, 30), "spark": (20_000, 2_000, 10), "s3": (30_000, 3_000, 15)}
"""changes, keys, micro-batches per back end (and on S3: moto's server and S3A's checkpoint are slow)"""
SEED = int(os.environ.get("CDCFLOW_CRASH_SEED") or time.strftime("%Y%m%d"))
RUN_TIMEOUT = {"delta-rs": 150.0, "spark": 300.0}


history = bench_module("cdc_history")


@dataclass
class Kill:
    delay: float
    landed: str = ""


@pytest.mark.integration
@pytest.mark.process
@pytest.mark.parametrize(
    ("backend", "storage"),
    [("delta-rs", "local"), ("spark", "local"), ("delta-rs", "s3")],
    ids=["delta-rs", "spark", "delta-rs, table and checkpoint on S3"],
)
def test_sigkilled_ingestion_restarts_from_its_checkpoint_exactly_once(
    spark: SparkSession, tmp_path: Path, backend: str, storage: str, request: pytest.FixtureRequest
) -> None:
    print(f"CDCFLOW_CRASH_SEED={SEED}")  # shown with a failure's captured output: rerun with it
    changes, keys, batches = SIZES["s3" if storage == "s3" else backend]
    source = tmp_path / "history.jsonl"
    stats = history.write_history(source, changes, keys, seed=SEED)
    truth = history.fold(source)
    assert stats.reinserts > changes // 100 and stats.deletes > changes // 100 and len(truth) == stats.live
    place = lake(storage, tmp_path / "lake", request)
    target = place.path("items")
    args = [
        *("--format", "debezium-json", "--path", str(source), "--schema", history.COLUMNS, "--key", "id"),
        *("--target", target, "--checkpoint", place.path("checkpoint", "s3a"), "--trigger", "available-now"),
        *("--option", f"maxBytesPerTrigger={stats.bytes // batches}"),
        *(("--backend", "spark", "--delta-jars", delta_jars()) if backend == "spark" else ()),
        *place.ingest_args(),
    ]
    version = partial(place.version, "items")
    timeout = RUN_TIMEOUT[backend]

    rng = random.Random(SEED)  # noqa: S311 - kill timings, not secrets
    kills = [Kill(rng.uniform(0.0, 0.02) if i == 1 else rng.uniform(0.1, 1.5)) for i in range(KILLS)]
    seen = -1
    for run, kill in enumerate(kills):
        job = start_ingest(args, tmp_path / f"run{run}.log")
        # Progress past the last kill first, then a delay: kills land at varied points of a batch.
        wait_for(job, timeout, version, seen + rng.randint(1, 4))
        time.sleep(kill.delay)
        assert job.poll() is None, f"run {run} finished before its kill: {tail(tmp_path / f'run{run}.log')}"
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        wait_session_gone(job.pid)
        seen = version()
        kill.landed = _where(*_logs(place, tmp_path / f"logs{run}"))

    job = start_ingest(args, tmp_path / "final.log")
    wait_for(job, timeout)
    assert job.returncode == 0, f"the restarted job failed: {tail(tmp_path / 'final.log')}"
    report = "; ".join(f"kill {i + 1} after {k.delay:.3f}s: {k.landed}" for i, k in enumerate(kills))
    print(f"seed {SEED}: {report}; last run: {tail(tmp_path / 'final.log', 1)}")

    table = place.table("items")
    rows = table.to_pyarrow_table().to_pylist()
    ids = [row["id"] for row in rows]
    assert len(ids) == len(set(ids)), "a key is in the table twice"
    assert {row["id"]: row for row in rows} == truth
    via_spark = spark.read.parquet(*table.file_uris()).collect()
    assert sorted((r.asDict() for r in via_spark), key=lambda r: r["id"]) == [truth[k] for k in sorted(truth)]
    via_delta = delta_reader_rows(spark, target, place.storage_options or None)
    assert sorted(via_delta, key=lambda r: r["id"]) == [truth[k] for k in sorted(truth)]

    local_target, checkpoint = _logs(place, tmp_path / "logs")
    applied = _batches_with_rows(checkpoint, source)
    for log in (local_target, checkpoint / STATE_DIR):
        transactions = _transactions(log)
        _assert_applied_once(transactions)
        assert [v for _, v in transactions] == applied, f"{log}: not one commit per batch with rows"


def _logs(place: Lake, into: Path) -> tuple[Path, Path]:
    """Local folders holding the table's and the checkpoint's logs: the lake's own, or a copy of the
    bucket's (the Delta logs of the table and the key state, Spark's offsets and commits)."""
    if not place.on_s3:
        return place.folder / "items", place.folder / "checkpoint"
    for name in (
        "items/_delta_log",
        "checkpoint/offsets",
        "checkpoint/commits",
        f"checkpoint/{STATE_DIR}/_delta_log",
    ):
        place.local(name, into)
    return into / "items", into / "checkpoint"


def _where(target: Path, checkpoint: Path) -> str:
    """Where a kill landed, from the Delta transactions and Spark's offset and commit logs."""
    applied = _last_txn(target)
    state = _last_txn(checkpoint / STATE_DIR)
    planned = _last_batch(checkpoint / "offsets")
    committed = _last_batch(checkpoint / "commits")
    if applied > state:
        return f"between the target commit and the key-state commit of batch {applied}"
    if committed > applied:
        return f"after Spark committed batch {committed}, before its Delta commits (kept in the pending log)"
    if planned > applied:
        return f"in batch {planned} before its Delta commits"
    if planned > committed:
        return f"after batch {planned}'s Delta commits, before Spark's commit log"
    return f"between batches, after batch {committed}"


def _last_txn(table: Path) -> int:
    return max((version for _, version in _transactions(table)), default=-1)


def _last_batch(log: Path) -> int:
    return max((int(p.name) for p in log.iterdir() if p.name.isdigit()), default=-1) if log.is_dir() else -1


def _transactions(table: Path) -> list[tuple[str, int]]:
    """The (appId, version) of every ``txn`` action in the table's JSON commits, in commit order."""
    found: list[tuple[str, int]] = []
    log = table / "_delta_log"
    commits = sorted((p for p in log.glob("*.json") if p.stem.isdigit()), key=lambda p: int(p.stem))
    for commit in commits:
        for line in commit.read_text().splitlines():
            action: dict[str, Any] = json.loads(line) if line.strip() else {}
            if "txn" in action:
                found.append((action["txn"]["appId"], int(action["txn"]["version"])))
    return found


def _batches_with_rows(checkpoint: Path, source: Path) -> list[int]:
    """The committed batches whose byte range holds the start of a line (a batch may hold only the
    tail of a line the batch before read to its end: such a batch is empty and commits nothing)."""
    starts, at = [], 0
    with source.open("rb") as lines:
        for line in lines:
            starts.append(at)
            at += len(line)
    batches, begin = [], 0
    for batch in range(_last_batch(checkpoint / "commits") + 1):
        offsets = json.loads((checkpoint / "offsets" / str(batch)).read_text().splitlines()[-1])
        end = offsets["files"][str(source)]
        if bisect.bisect_left(starts, end) > bisect.bisect_left(starts, begin):
            batches.append(batch)
        begin = end
    return batches


def _assert_applied_once(transactions: list[tuple[str, int]]) -> None:
    assert transactions, "no application transactions in the Delta log"
    assert len(set(transactions)) == len(transactions), "a batch was committed twice"
    last: dict[str, int] = {}
    for app, version in transactions:
        assert version > last.get(app, -1), f"{app}: batch {version} committed after batch {last[app]}"
        last[app] = version
    assert len(last) == 1, f"one streaming query, one application id; got {sorted(last)}"
