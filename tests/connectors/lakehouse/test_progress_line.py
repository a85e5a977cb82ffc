"""The progress line of ``cdcflow ingest``: printed once Spark's progress covers the applied batch."""

import io
from types import SimpleNamespace

from cdcflow.connectors.lakehouse.delta.result import BatchApplied
from cdcflow.connectors.lakehouse.ingest import _show_progress
from cdcflow.connectors.lakehouse.sink import SinkProgress


def _progress(batch_id: int, latest: int) -> dict[str, object]:
    offsets = {"files": {"/data/orders.jsonl": latest}}
    end = {"files": {"/data/orders.jsonl": 1024 * 1024}}
    return {"batchId": batch_id, "sources": [{"endOffset": end, "latestOffset": offsets}]}


def test_a_batch_applied_before_spark_reports_it_waits_for_its_lag() -> None:
    """The sink reports batch 0 while Spark's ``lastProgress`` is still empty: a line then would have
    no lag (a real run printed one); the line waits and, once Spark reports the batch, has the lag."""
    sink = SimpleNamespace(progress=SinkProgress())
    sink.progress.add(BatchApplied(0, changes=12_799, upserts=12_799, seconds=0.242))
    gate = SimpleNamespace(sink=sink, first_started=None, label="")
    query = SimpleNamespace(lastProgress=None)
    out = io.StringIO()

    assert _show_progress(query, gate, out, None, 0) == 0  # type: ignore[arg-type]
    assert out.getvalue() == ""

    query.lastProgress = _progress(0, latest=3 * 1024 * 1024)
    assert _show_progress(query, gate, out, None, 0) == 1  # type: ignore[arg-type]
    assert out.getvalue() == (
        "cdcflow ingest: batches: 1, changes: 12,799, upserted: 12,799, last batch: 242 ms, lag: 2.0 MiB\n"
    )


def test_the_last_line_of_an_ended_query_is_printed_without_spark_progress() -> None:
    sink = SimpleNamespace(progress=SinkProgress())
    sink.progress.add(BatchApplied(4, changes=3, upserts=2, deletes=1, seconds=0.01))
    gate = SimpleNamespace(sink=sink, first_started=None, label="")
    out = io.StringIO()
    query = SimpleNamespace(lastProgress={"batchId": 3})
    assert _show_progress(query, gate, out, None, 0, final=True) == 1  # type: ignore[arg-type]
    line = "cdcflow ingest: batches: 1, changes: 3, upserted: 2, deleted: 1, last batch: 10 ms\n"
    assert out.getvalue() == line


def test_batches_applied_between_two_polls_get_a_line_each() -> None:
    """Fast batches: three applied within one poll of the query print three lines, the first about
    one batch (a run saw ``batches: 4`` on its first line); a batch Spark has not reported yet waits."""
    sink = SimpleNamespace(progress=SinkProgress())
    for batch_id in range(4):
        sink.progress.add(BatchApplied(batch_id, changes=10, upserts=10, seconds=0.1))
    gate = SimpleNamespace(sink=sink, first_started=None, label="")
    query = SimpleNamespace(lastProgress=_progress(2, latest=2 * 1024 * 1024))
    out = io.StringIO()

    assert _show_progress(query, gate, out, None, 0) == 3  # type: ignore[arg-type]
    lines = out.getvalue().splitlines()
    assert [line.split(", changes")[0] for line in lines] == [
        "cdcflow ingest: batches: 1",
        "cdcflow ingest: batches: 2",
        "cdcflow ingest: batches: 3",
    ]
    assert "changes: 10, upserted: 10," in lines[0] and "changes: 30, upserted: 30," in lines[2]
    assert all(line.endswith("lag: 1.0 MiB") for line in lines)
