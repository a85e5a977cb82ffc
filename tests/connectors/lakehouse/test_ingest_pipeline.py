"""``ingest`` applies batch N while Spark decodes N+1, and hands the decoded rows over as Arrow files.

Spark writes batch N to its commit log when ``foreachBatch`` returns, before N reaches the table: the
pending log in the checkpoint keeps N until it does. These tests kill the driver in exactly that
window, fail an apply in the middle of a stream, and compare the handed-over rows with ``toArrow``.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc  # noqa: F401 - pa.ipc
import pytest
from bench_modules import bench_module
from deltalake import DeltaTable
from ingest_process import tail, wait_session_gone
from pyspark.sql import SparkSession

from cdcflow.connectors.lakehouse.delta.pending import PENDING_DIR, PendingBatches
from cdcflow.connectors.lakehouse.delta.storage import LOCAL
from cdcflow.connectors.lakehouse.ingest import HANDOFF_DIRECTORY, IngestConfig, ingest
from cdcflow.connectors.lakehouse.sink import checkpoint_query_id, collect
from cdcflow.core import CdcflowError

history = bench_module("cdc_history")
RECORDED = Path(__file__).parent / "recorded"
KILLED_BATCH = 2

# The driver of the child: batch 2's apply waits until Spark has committed batch 2, says so, and hangs
# there until the test kills the process group.
CHILD = """
import runpy, sys, time
from pathlib import Path
from cdcflow.connectors.lakehouse.delta import apply

checkpoint, marker, batch = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
original = apply.DeltaChangeApplier.apply

def apply_until_killed(self, table, batch_id):
    if batch_id == batch:
        while not (checkpoint / "commits" / str(batch)).exists():
            time.sleep(0.01)
        marker.write_text("Spark committed the batch; its apply has not run")
        time.sleep(3600)
    return original(self, table, batch_id)

apply.DeltaChangeApplier.apply = apply_until_killed
sys.argv = ["cdcflow", "ingest", *sys.argv[4:]]
runpy.run_module("cdcflow", run_name="__main__")
"""


def _transactions(table: Path) -> list[int]:
    """The batch ids of the ``txn`` actions in the table's commits, in commit order."""
    found = []
    for commit in sorted((table / "_delta_log").glob("*.json"), key=lambda p: int(p.stem)):
        for line in commit.read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "txn" in action:
                found.append(int(action["txn"]["version"]))
    return found


@pytest.mark.integration
@pytest.mark.process
def test_a_driver_killed_after_spark_committed_a_batch_lands_it_from_the_pending_log(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = tmp_path / "history.jsonl"
    stats = history.write_history(source, 6_000, 600, seed=11)
    truth = history.fold(source)
    target, checkpoint, marker = tmp_path / "items", tmp_path / "checkpoint", tmp_path / "committed"
    per_batch = stats.bytes // 6
    args = [
        *("--format", "debezium-json", "--path", str(source), "--schema", history.COLUMNS, "--key", "id"),
        *("--target", str(target), "--checkpoint", str(checkpoint), "--trigger", "available-now"),
        *("--option", f"maxBytesPerTrigger={per_batch}"),
    ]
    log = tmp_path / "killed.log"
    with log.open("wb") as out:
        job = subprocess.Popen(  # noqa: S603 - our own interpreter and script
            [sys.executable, "-c", CHILD, str(checkpoint), str(marker), str(KILLED_BATCH), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 180
    while not marker.exists():
        assert job.poll() is None, f"the job ended before the window: {tail(log)}"
        assert time.monotonic() < deadline, f"batch {KILLED_BATCH} was not committed in 180 s: {tail(log)}"
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    wait_session_gone(job.pid)

    # Spark recorded the batch as done; the table has the batches before it only; the log keeps it.
    assert (checkpoint / "commits" / str(KILLED_BATCH)).exists()
    app_id = f"cdcflow-{checkpoint_query_id(str(checkpoint))}"
    assert DeltaTable(str(target)).transaction_version(app_id) == KILLED_BATCH - 1
    pending = PendingBatches(str(checkpoint), LOCAL)
    assert pending.ids() == [KILLED_BATCH]
    assert pending.read(KILLED_BATCH).num_rows > 0

    config = IngestConfig(
        format="debezium-json",
        key=("id",),
        target=str(target),
        checkpoint=str(checkpoint),
        path=str(source),
        schema=history.COLUMNS,
        options={"maxBytesPerTrigger": str(per_batch)},
    )
    summary = ingest(config, spark, out=io.StringIO())
    rows = {row["id"]: row for row in DeltaTable(str(target)).to_pyarrow_table().to_pylist()}
    assert rows == truth
    batches = _transactions(target)
    assert batches == sorted(set(batches)) == list(range(batches[-1] + 1)), "each batch exactly once"
    assert batches[-1] >= KILLED_BATCH + 2, f"the history should span more batches: {summary}"
    assert not list((checkpoint / PENDING_DIR).iterdir()), "the pending log is empty once applied"
    assert not list((checkpoint / HANDOFF_DIRECTORY).iterdir()), "no handoff file outlives its batch"


def test_an_apply_error_mid_stream_stops_the_job_with_its_message_and_again_on_restart(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Lines of one length (ids 10-49), so that byte-sized micro-batches hold 10 lines each.
    line = '{{"before": null, "after": {{"id": {id}, "name": "n{id}"}}, "op": "c"}}\n'
    lines = [line.format(id=i) for i in range(10, 50)]
    lines[24] = '{"before": null, "after": {"id": null, "name": "bad"}, "op": "c"}\n'
    recorded = tmp_path / "orders.jsonl"
    recorded.write_text("".join(lines), encoding="utf-8")
    config = IngestConfig(
        format="debezium-json",
        key=("id",),
        target=str(tmp_path / "table"),
        checkpoint=str(tmp_path / "checkpoint"),
        path=str(recorded),
        schema="id INT, name STRING",
        sequence_by="none",
        options={"maxBytesPerTrigger": str(len(lines[0]) * 10 - 5)},
    )
    expected = f"{recorded}:25: key column 'id' is null"
    with pytest.raises(CdcflowError) as raised:
        ingest(config, spark, out=io.StringIO())
    assert expected in str(raised.value) and "\n" not in str(raised.value), str(raised.value)
    ids = {row["id"] for row in DeltaTable(config.target).to_pyarrow_table().to_pylist()}
    assert ids == set(range(10, 30)), "the batches before the bad one are in the table, no later one"

    # The failed batch stays pending: the next run fails on it before reading further.
    with pytest.raises(CdcflowError) as again:
        ingest(config, spark, out=io.StringIO())
    assert expected in str(again.value)
    assert {row["id"] for row in DeltaTable(config.target).to_pyarrow_table().to_pylist()} == ids


def test_the_handed_over_rows_are_the_rows_toarrow_gives(spark: SparkSession, tmp_path: Path) -> None:
    """On the PostgreSQL recording (TOAST placeholders, numeric, temporal and JSON columns), with the
    metadata ``ingest`` adds and control events emitted: the same schema, rows and order."""
    dump = tmp_path / "items.dump.jsonl"
    dump.write_bytes(gzip.decompress((RECORDED / "items_default.dump.jsonl.gz").read_bytes()))
    options = {
        "path": str(dump),
        "schema-include": "true",
        "changelog-mode": "upsert",
        "metadata": "source.sequence,source.timestamp,unavailable-columns,topic,partition,offset",
        "controlEvents": "emit",
        "unavailable-values": "REPORT",
        "maxRecordsPerPartition": "500",
    }
    expected = spark.read.format("cdc-debezium").options(**options).load().toArrow()
    handoff = tmp_path / "handoff"
    frame = spark.read.format("cdc-debezium").options(**options, handoffPath=str(handoff)).load()
    assert frame.columns == ["handoff_file", "handoff_rows"]
    table, files = collect(frame)
    assert len(files) > 1 and all(Path(f).parent == handoff for f in files)
    assert table.schema == expected.schema
    assert table.num_rows == expected.num_rows > 3000
    assert table.equals(expected), "the same rows in the same order"


def test_the_pending_log_keeps_whole_batches_written_or_moved_in(tmp_path: Path) -> None:
    pending = PendingBatches(str(tmp_path / "checkpoint"), LOCAL)
    assert pending.ids() == []
    first = pa.table({"id": [1, 2], "name": ["a", "b"]})
    pending.write(0, first)
    handed = []
    for index, part in enumerate(
        (pa.table({"id": [3], "name": ["c"]}), pa.table({"id": [4], "name": ["d"]}))
    ):
        handed.append(str(tmp_path / f"part-{index}.arrow"))
        with pa.OSFile(handed[-1], "wb") as sink, pa.ipc.new_file(sink, part.schema) as out:
            out.write_table(part)
    pending.adopt(1, handed)
    assert not any(Path(file).exists() for file in handed), "moved, not copied"
    # What a write or a move cut short leaves is not a batch, and goes at the next recovery.
    (tmp_path / "checkpoint" / PENDING_DIR / "2.arrow.1f2e.tmp").write_bytes(b"cut")
    (tmp_path / "checkpoint" / PENDING_DIR / "3.77ab.tmp").mkdir()
    assert pending.ids() == [0, 1]
    assert pending.read(0).equals(first)
    assert pending.read(1).to_pydict() == {"id": [3, 4], "name": ["c", "d"]}
    pending.discard_partial()
    pending.remove(0)
    pending.remove(1)
    assert list((tmp_path / "checkpoint" / PENDING_DIR).iterdir()) == []
