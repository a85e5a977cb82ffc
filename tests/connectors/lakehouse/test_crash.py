"""Exactly once through crashes: an ingestion of the recorded PostgreSQL workload killed with SIGKILL
twice mid-stream, each time restarted from its checkpoint, lands the table as PostgreSQL has it.

With delta-rs on local files the job is a whole database: the folder of both recorded tables in one
job, with no ``--key`` and no ``--schema`` (the key and the columns come from the messages), each table
routed by ``--target .../{table}`` to its own Delta table, checkpoint and application transaction.

The input is the REPLICA IDENTITY DEFAULT table of ``recorded/`` (test_postgres_workload.py: real
Debezium events with TOAST placeholders whose values come from earlier batches, primary-key changes that
move a row to the other partition, re-inserted ids, deletes, a TRUNCATE), read by ``python -m cdcflow
ingest`` in a session of its own (Python driver, JVM, Python workers) in ~10 micro-batches of several
input partitions each. Its process group is killed twice, each once the table moved past the previous
kill, plus a random delay (the second delay short, to land between a batch's target commit and its
key-state commit); then the job runs from its checkpoint to the end. Every row and column must equal
PostgreSQL's final SELECT (read by deltalake and by Spark's Delta reader), and the Delta logs of the
table and of the key state must hold exactly one commit per batch that changes the table.

The seed of the kill points changes every day (the date, ``YYYYMMDD``), so the runs of a week land kills
at different points; a failure names its seed, and ``CDCFLOW_CRASH_SEED=N`` runs that one again. Run
with ``-s`` to see where the kills landed. It runs with each apply back end (delta-rs, and Spark with
Delta Lake's jars), and with delta-rs once more with the table, the key state and Spark's checkpoint
(``s3a://``) on the S3 test server (``s3_server.py``): the logs are inspected from a copy of the bucket.
"""

from __future__ import annotations

import base64
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
from backends import Lake, delta_jars, lake
from ingest_process import start_ingest, tail, wait_for, wait_session_gone
from test_postgres_workload import (
    assert_batches_and_partitions,
    delta_rows,
    differences,
    expected,  # noqa: F401 - the fixture
    ingest_options,
    postgres_rows,
    unpack,
)

from cdcflow.connectors.lakehouse.database import TABLES_DIRECTORY
from cdcflow.connectors.lakehouse.sink import STATE_DIR

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TABLE = "items_default"
"""the table the kills wait for (the one of a single-table run)"""
DATABASE = ("items_default", "items_full")
KILLS = 2
BATCHES = 10
"""micro-batches of a run from the start: more than the two kills can reach (each at most 3 versions on)"""
SEED = int(os.environ.get("CDCFLOW_CRASH_SEED") or time.strftime("%Y%m%d"))
TIMEOUT = 240.0
"""seconds without progress (a line of output or a table version) before a run counts as hung"""


@dataclass
class Kill:
    delay: float
    landed: str = ""


@pytest.mark.integration
@pytest.mark.process
@pytest.mark.parametrize(
    ("backend", "storage", "tables"),
    [("delta-rs", "local", DATABASE), ("spark", "local", (TABLE,)), ("delta-rs", "s3", (TABLE,))],
    ids=["delta-rs, a whole database", "spark", "delta-rs, table and checkpoint on S3"],
)
def test_sigkilled_ingestion_restarts_from_its_checkpoint_exactly_once(
    spark: SparkSession,
    tmp_path: Path,
    expected: dict[str, Any],  # noqa: F811 - the fixture imported above
    backend: str,
    storage: str,
    tables: tuple[str, ...],
    request: pytest.FixtureRequest,
) -> None:
    print(f"CDCFLOW_CRASH_SEED={SEED}")  # shown with a failure's captured output: rerun with it
    (tmp_path / "topics").mkdir()
    dumps = {table: unpack(table, tmp_path / "topics") for table in tables}
    dump = dumps[TABLE]
    options = ingest_options(dump, BATCHES)
    place = lake(storage, tmp_path / "lake", request)
    database = len(tables) > 1
    args = [
        *("--format", "debezium-json"),
        *(("--path", str(tmp_path / "topics")) if database else ("--path", str(dump), "--key", "id")),
        *("--target", place.path("{table}" if database else TABLE)),
        *("--checkpoint", place.path("checkpoint", "s3a")),
        *("--trigger", "available-now"),
        *(arg for key, value in options.items() for arg in ("--option", f"{key}={value}")),
        *(("--backend", "spark", "--delta-jars", delta_jars()) if backend == "spark" else ()),
        *place.ingest_args(),
    ]
    version = partial(place.version, TABLE)

    rng = random.Random(SEED)  # noqa: S311 - kill timings, not secrets
    kills = [Kill(rng.uniform(0.0, 0.02) if i == 1 else rng.uniform(0.1, 1.5)) for i in range(KILLS)]
    seen = -1
    for run, kill in enumerate(kills):
        job = start_ingest(args, tmp_path / f"run{run}.log")
        # Progress past the last kill first, then a delay: kills land at varied points of a batch.
        wait_for(job, TIMEOUT, version, seen + rng.randint(1, 3))
        time.sleep(kill.delay)
        assert job.poll() is None, f"run {run} finished before its kill: {tail(tmp_path / f'run{run}.log')}"
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        wait_session_gone(job.pid)
        seen = version()
        kill.landed = _where(*_logs(place, tmp_path / f"logs{run}", TABLE, database))

    job = start_ingest(args, tmp_path / "final.log")
    wait_for(job, TIMEOUT)
    assert job.returncode == 0, f"the restarted job failed: {tail(tmp_path / 'final.log')}"
    report = "; ".join(f"kill {i + 1} after {k.delay:.3f}s: {k.landed}" for i, k in enumerate(kills))
    print(f"seed {SEED}: {report}; last run: {tail(tmp_path / 'final.log', 1)}")
    assert version() > seen, "the restarted job applied nothing"

    apps = set()
    for table, table_dump in dumps.items():
        want = postgres_rows(expected, table)
        problems = differences(table, want, delta_rows(place, table))
        assert not problems, f"seed {SEED}, {report}: {table}: {problems}"
        problems = differences(table, want, delta_rows(place, table, spark))
        assert not problems, f"seed {SEED}, {report}, read by spark.read.format('delta'): {table}: {problems}"

        local_target, checkpoint = _logs(place, tmp_path / "logs", table, database)
        assert_batches_and_partitions(checkpoint, table_dump, options)
        applied = _batches_that_commit(checkpoint, table_dump)
        for log in (local_target, checkpoint / STATE_DIR):
            transactions = _transactions(log)
            _assert_applied_once(transactions)
            assert [v for _, v in transactions] == applied, f"{log}: not one commit per batch that changes it"
        apps |= {app for app, _ in _transactions(local_target)}
    assert len(apps) == len(tables), f"each table's commits carry an application id of its own: {apps}"


def _logs(place: Lake, into: Path, table: str, database: bool) -> tuple[Path, Path]:
    """Local folders holding the table's and the checkpoint's logs: the lake's own, or a copy of the
    bucket's (the Delta logs of the table and the key state, Spark's offsets and commits); a whole
    database keeps each table's checkpoint under the job's ``tables/<topic>``."""
    if not place.on_s3:
        checkpoint = place.folder / "checkpoint"
        return place.folder / table, checkpoint / TABLES_DIRECTORY / table if database else checkpoint
    for name in (
        f"{TABLE}/_delta_log",
        "checkpoint/offsets",
        "checkpoint/commits",
        f"checkpoint/{STATE_DIR}/_delta_log",
    ):
        place.local(name, into)
    return into / TABLE, into / "checkpoint"


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


def _batches_that_commit(checkpoint: Path, dump: Path) -> list[int]:
    """The committed batches that change the table: those with a record that is no tombstone and is not
    late. A change logged before a TRUNCATE that an earlier batch applied is late (ignored): the dump
    holds all of partition 0 (with the TRUNCATE) before partition 1, so a batch of only such changes
    commits nothing."""
    starts, late = [], []
    truncate: tuple[int, int] | None = None
    at = 0
    with dump.open("rb") as lines:
        next(lines)  # the dump's header line
        at = lines.tell()
        for line in lines:
            record = json.loads(line)
            value = record["value"] and json.loads(base64.b64decode(record["value"]))["payload"]
            if value is not None:
                commit, lsn = json.loads(value["source"]["sequence"])
                position = (int(commit or 0), int(lsn))
                if value["op"] == "t":
                    truncate = position
                starts.append(at)
                late.append(position)
            at += len(line)
    assert truncate is not None, "the recording has a TRUNCATE"
    truncated_in: int | None = None
    batches, begin = [], 0
    for batch in range(_last_batch(checkpoint / "commits") + 1):
        offsets = json.loads((checkpoint / "offsets" / str(batch)).read_text().splitlines()[-1])
        end = offsets["files"][str(dump)]
        first, last = bisect.bisect_left(starts, begin), bisect.bisect_left(starts, end)
        positions = late[first:last]
        after_truncate = truncated_in is not None and truncated_in < batch
        if any(not (after_truncate and p < truncate) for p in positions):
            batches.append(batch)
        if truncate in positions:
            truncated_in = batch
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
