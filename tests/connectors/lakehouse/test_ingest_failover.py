"""A MySQL binlog position that restarts (RESET MASTER, failover) through the whole ingest job.

The changes after the restart have lower positions than the ones before it; the commit time tells
them from genuinely late changes. Several micro-batches, then a run restarted from the checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest

pytestmark = pytest.mark.integration


def event(
    op: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    binlog: int,
    pos: int,
    ts_ms: int,
    server_id: int,
) -> str:
    source = {
        "connector": "mysql",
        "name": "shop",
        "db": "shop",
        "table": "items",
        "server_id": server_id,
        "file": f"mysql-bin.{binlog:06d}",
        "pos": pos,
        "row": 0,
        "ts_ms": ts_ms,
    }
    return json.dumps({"before": before, "after": after, "source": source, "op": op, "ts_ms": ts_ms + 5})


def rows(target: Path) -> dict[int, str]:
    table = DeltaTable(str(target)).to_pyarrow_table()
    return dict(zip(table.column("id").to_pylist(), table.column("name").to_pylist(), strict=True))


def run(path: Path, tmp_path: Path, spark: SparkSession) -> Any:
    return ingest(
        IngestConfig(
            format="debezium-json",
            key=("id",),
            target=str(tmp_path / "table"),
            checkpoint=str(tmp_path / "checkpoint"),
            path=str(path),
            schema="id INT NOT NULL, name STRING",
            max_bytes_per_trigger=350,
        ),
        spark,
    )


def test_changes_after_a_binlog_restart_land_and_late_ones_do_not(
    tmp_path: Path, spark: SparkSession
) -> None:
    before_failover = [
        event("c", None, {"id": 1, "name": "a1"}, 42, 9000, 1_000, 1),
        event("c", None, {"id": 2, "name": "b1"}, 42, 9100, 1_000, 1),
        event("u", {"id": 1, "name": "a1"}, {"id": 1, "name": "a2"}, 42, 9500, 2_000, 1),
        # A duplicate from further back in the old log (older position, older commit time): late.
        event("u", {"id": 2, "name": "b0"}, {"id": 2, "name": "b-stale"}, 41, 100, 500, 1),
    ]
    after_failover = [
        # The new server's binlog starts at file 1: lower positions, later commit times.
        event("u", {"id": 1, "name": "a2"}, {"id": 1, "name": "a3"}, 1, 4000, 60_000, 2),
        event("d", {"id": 2, "name": "b1"}, None, 1, 4100, 60_000, 2),
        event("c", None, {"id": 3, "name": "c1"}, 1, 4200, 61_000, 2),
    ]
    changes = tmp_path / "changes.jsonl"
    changes.write_text("\n".join(before_failover) + "\n")
    first = run(changes, tmp_path, spark)
    assert rows(tmp_path / "table") == {1: "a2", 2: "b1"}
    assert first.progress.totals.late == 1  # the stale update (its +U row: ingest reads updates as upserts)

    with changes.open("a") as out:
        out.write("\n".join(after_failover) + "\n")
    second = run(changes, tmp_path, spark)
    assert second.batches >= 2, "the new changes should span several micro-batches"
    assert rows(tmp_path / "table") == {1: "a3", 3: "c1"}
    assert second.progress.totals.restarts == 2  # id 1's update and id 2's delete; id 3 is new
    assert second.progress.totals.late == 0
    assert "2 restarted positions" in str(second)


def test_ingest_without_a_session_leaves_the_callers_session_running(
    tmp_path: Path, spark: SparkSession
) -> None:
    """ingest() given no session uses the active one and must not stop it (a notebook's, a job's)."""
    changes = tmp_path / "changes.jsonl"
    changes.write_text(event("c", None, {"id": 1, "name": "a1"}, 1, 10, 1_000, 1) + "\n")
    config = IngestConfig(
        format="debezium-json",
        key=("id",),
        target=str(tmp_path / "table"),
        checkpoint=str(tmp_path / "checkpoint"),
        path=str(changes),
        schema="id INT NOT NULL, name STRING",
    )
    ingest(config)
    assert rows(tmp_path / "table") == {1: "a1"}
    assert not spark.sparkContext._jsc.sc().isStopped()
    read = spark.read.format("cdc-debezium").options(
        path=str(changes), columns="id INT NOT NULL, name STRING"
    )
    assert read.load().count() == 1
