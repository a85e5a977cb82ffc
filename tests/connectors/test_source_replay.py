"""The ``cdc-*`` sources over recorded topics: topic dumps read like the topic, directory streams,
and a replay's choice of input and dead-letter target."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from kafka_fixture import KafkaCluster, unique_topic
from pyspark.sql import SparkSession
from source_cases import (
    EXCLUDE,
    GOLDEN_ROWS,
    KAFKA_METADATA,
    LINE_OF_ROW,
    PRODUCTS,
    ProductsTopic,
    debezium,
    expected_rows,
    observed,
    render,
    rendered,
    topic_records,
)

from cdcflow.connectors.errors import ConnectorOptionError, ReplayFormatError
from cdcflow.connectors.replay import dumps as replay
from cdcflow.connectors.replay.dumps import record_topic
from cdcflow.connectors.spark import readers
from cdcflow.connectors.spark.dead_letters import read_dead_letters
from cdcflow.connectors.spark.read_plan import plan_read
from cdcflow.connectors.spark.readers import CdcBatchReader, CdcInputPartition, CdcStreamReader, FileRange
from cdcflow.formats import Message

pytestmark = pytest.mark.integration


def test_a_replay_can_send_its_dead_letters_to_a_topic(
    spark: SparkSession, kafka_cluster: KafkaCluster, products: ProductsTopic, tmp_path: Path
) -> None:
    dead = unique_topic("dl-replay")
    kafka_cluster.create_topic(dead, 1)
    lines = EXCLUDE.read_bytes().splitlines()
    source = tmp_path / "events.txt"
    source.write_bytes(b"\n".join([lines[0], b"{oops", lines[1]]))
    df = (
        debezium(spark)
        .option("kafka.bootstrap.servers", products.bootstrap)
        .option("deadLetterTopic", dead)
        .load(str(source))
    )
    assert rendered(df) == GOLDEN_ROWS[:2]
    letters = topic_records(products.bootstrap, dead)
    assert [(m.key, m.value, dict(m.headers)["cdcflow.error.origin"]) for m in letters] == [
        (None, b"{oops", f"{source}:2".encode())
    ]


def test_a_replay_with_a_kafka_subscription_is_refused(tmp_path: Path) -> None:
    options = {
        "path": str(EXCLUDE),
        "columns": PRODUCTS,
        "kafka.bootstrap.servers": "b:9092",
        "subscribe": "t",
    }
    with pytest.raises(ConnectorOptionError, match="both 'path' .* and Kafka options are set: use one input"):
        plan_read("debezium-json", options, None)


# --- recorded topics ----------------------------------------------------------------------------


def test_a_recorded_topic_dump_reads_like_the_topic(
    spark: SparkSession, products: ProductsTopic, tmp_path: Path
) -> None:
    dump = tmp_path / "products.jsonl"
    summary = record_topic({"kafka.bootstrap.servers": products.bootstrap, "subscribe": products.name}, dump)
    assert summary.records == len(products.messages)
    metadata = f"source.table,{KAFKA_METADATA}"
    direct = observed(
        products.reader(spark).option("subscribe", products.name).option("metadata", metadata).load()
    )
    replayed = debezium(spark).option("metadata", metadata).load(str(dump))
    assert observed(replayed) == direct == expected_rows(products.messages)
    assert observed(replayed) == direct  # a replay gives the same every time


def test_streaming_replay_of_a_directory_reads_each_file_once(spark: SparkSession, tmp_path: Path) -> None:
    source, out, checkpoint = tmp_path / "in", tmp_path / "out", tmp_path / "checkpoint"
    source.mkdir()
    lines = EXCLUDE.read_bytes().splitlines(keepends=True)
    (source / "a.txt").write_bytes(b"".join(lines[:9]))
    (source / "b.txt").write_bytes(b"".join(lines[9:12]))

    def run() -> None:
        query = (
            spark.readStream.format("cdc-debezium")
            .option("columns", PRODUCTS)
            .option("metadata", "file,line")
            .load(str(source))
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    def written() -> list[tuple[str, int, str]]:
        rows = spark.read.parquet(str(out)).toArrow().to_pylist()
        return sorted((Path(r["file"]).name, r["line"], render(r)) for r in rows)

    def rows_of(name: str, first_line: int, last_line: int) -> list[tuple[str, int, str]]:
        """The golden rows of EXCLUDE's lines [first_line, last_line], numbered in their new file."""
        return [
            (name, line - first_line + 1, row)
            for line, row in zip(LINE_OF_ROW, GOLDEN_ROWS, strict=True)
            if first_line <= line <= last_line
        ]

    run()
    first = rows_of("a.txt", 1, 9) + rows_of("b.txt", 10, 12)
    assert written() == sorted(first)
    (source / "c.txt").write_bytes(b"".join(lines[12:]))
    run()  # the same checkpoint: only the new file is read
    assert written() == sorted(first + rows_of("c.txt", 13, 16))


def test_a_running_replay_stream_sees_files_added_to_its_directory(tmp_path: Path) -> None:
    lines = EXCLUDE.read_bytes().splitlines(keepends=True)
    (tmp_path / "a.txt").write_bytes(b"".join(lines[:2]))
    reader = CdcStreamReader(plan_read("debezium-json", {"path": str(tmp_path), "columns": PRODUCTS}, None))
    limit = reader.getDefaultReadLimit()
    first = reader.latestOffset(reader.initialOffset(), limit)
    (tmp_path / "b.txt").write_bytes(b"".join(lines[2:4]))
    second = reader.latestOffset(first, limit)
    assert sorted(second["files"]) == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    batches = [batch for p in reader.partitions(first, second) for batch in reader.read(p)]
    assert [render(row) for batch in batches for row in batch.to_pylist()] == GOLDEN_ROWS[2:4]


def test_replay_partitions_cover_each_file_once_and_skip_empty_files(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"x" * 1000)
    (tmp_path / "b.txt").write_bytes(b"")
    (tmp_path / "c.txt").write_bytes(b"y\n" * 5)
    # One record per partition: splits of at most 400 bytes (BYTES_PER_RECORD), of equal length.
    options = {"path": str(tmp_path), "columns": PRODUCTS, "maxRecordsPerPartition": "1"}
    partitions = CdcBatchReader(plan_read("debezium-json", options, None)).partitions()
    splits = [p.split for p in partitions if isinstance(p, CdcInputPartition)]
    a, c = str(tmp_path / "a.txt"), str(tmp_path / "c.txt")
    # The planner counts the lines before each split once (a.txt is one line with no newline).
    assert splits == [
        FileRange(a, 0, 333, 0),
        FileRange(a, 333, 666, 0),
        FileRange(a, 666, 1000, 0),
        FileRange(c, 0, 10, 0),
    ]
    values = [m.value for s in splits for m in replay.read_messages(s.path, s.start, s.end)]
    assert values == [b"x" * 1000] + [b"y"] * 5


def test_min_partitions_splits_a_batch_and_its_offsets_keep_the_split_for_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = EXCLUDE.read_bytes().splitlines(keepends=True)
    source = tmp_path / "a.txt"
    source.write_bytes(b"".join(lines))
    size = source.stat().st_size

    def reader(**options: str) -> CdcStreamReader:
        settings = {"path": str(tmp_path), "columns": PRODUCTS, **options}
        return CdcStreamReader(plan_read("debezium-json", settings, None))

    def ranges(of: CdcStreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[FileRange]:
        return [p.split for p in of.partitions(start, end) if isinstance(p, CdcInputPartition)]

    # Ranges have a fixed cost: a small batch is not cut below MIN_SPLIT_BYTES (1 MiB).
    small = reader(minPartitions="3")
    start = small.initialOffset()
    assert small.latestOffset(start, small.getDefaultReadLimit())["split"] == {
        "bytes": readers.MIN_SPLIT_BYTES
    }
    monkeypatch.setattr(readers, "MIN_SPLIT_BYTES", 1)
    three = reader(minPartitions="3")
    end = three.latestOffset(start, three.getDefaultReadLimit())
    assert end == {"files": {str(source): size}, "split": {"bytes": -(-size // 3)}}
    planned = ranges(three, start, end)
    assert len(planned) == 3 and planned[0].start == 0 and planned[-1].end == size
    # A restart on another machine (other options) replays the logged batch in the same ranges.
    again = reader(minPartitions="5", maxRecordsPerPartition="1")
    assert ranges(again, start, end) == planned
    # No new bytes: the same offset, split and all, so Spark plans no batch.
    assert again.latestOffset(end, again.getDefaultReadLimit()) == end
    # An offset logged without a split (before minPartitions, or without it) is planned as it was:
    # by maxRecordsPerPartition alone (400 bytes a record).
    old = {"files": end["files"]}
    assert len(ranges(again, start, old)) == -(-size // 400)
    assert len(ranges(reader(minPartitions="5"), start, old)) == 1
    rows = [row for p in three.partitions(start, end) for b in three.read(p) for row in b.to_pylist()]
    assert [render(row) for row in rows] == GOLDEN_ROWS
    # A batch read splits the same way, with nothing to record.
    batch = CdcBatchReader(
        plan_read("debezium-json", {"path": str(tmp_path), "columns": PRODUCTS, "minPartitions": "3"}, None)
    )
    assert [p.split for p in batch.partitions() if isinstance(p, CdcInputPartition)] == planned
    # Without minPartitions nothing is recorded: the offsets are as before.
    plain = reader()
    assert plain.latestOffset(start, plain.getDefaultReadLimit()) == {"files": {str(source): size}}
    with pytest.raises(ConnectorOptionError, match="minPartitions"):
        reader(minPartitions="-1")


def test_the_reported_latest_offset_is_what_the_batch_was_planned_against(tmp_path: Path) -> None:
    """Spark asks for it right after latestOffset, every batch: the answer is not looked up again."""
    lines = EXCLUDE.read_bytes().splitlines(keepends=True)
    source = tmp_path / "a.txt"
    source.write_bytes(b"".join(lines[:4]))
    reader = _stream_reader(tmp_path, 0)
    assert reader.reportLatestOffset() == {"files": {str(source): source.stat().st_size}}  # none planned yet
    planned = reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())
    source.write_bytes(b"".join(lines))
    assert reader.reportLatestOffset() == {"files": planned["files"]}
    later = reader.latestOffset(planned, reader.getDefaultReadLimit())
    assert reader.reportLatestOffset() == {"files": later["files"]} != {"files": planned["files"]}


def _stream_reader(path: Path, max_bytes: int) -> CdcStreamReader:
    options = {"path": str(path), "columns": PRODUCTS, "maxBytesPerTrigger": str(max_bytes)}
    return CdcStreamReader(plan_read("debezium-json", options, None))


@pytest.mark.parametrize("max_bytes", [1, 700, 2500])
def test_max_bytes_per_trigger_ends_micro_batches_where_lines_start(tmp_path: Path, max_bytes: int) -> None:
    lines = EXCLUDE.read_bytes().splitlines(keepends=True)
    files = {tmp_path / "a.txt": lines[:9], tmp_path / "b.txt": lines[9:]}
    line_starts = {}
    for path, content in files.items():
        path.write_bytes(b"".join(content))
        line_starts[str(path)] = set(itertools.accumulate(map(len, content), initial=0))
    reader = _stream_reader(tmp_path, max_bytes)
    limit = reader.getDefaultReadLimit()
    start, batches = reader.initialOffset(), []
    while (end := reader.latestOffset(start, limit)) != start:
        assert all(offset in line_starts[path] for path, offset in end["files"].items()), end
        rows = [row for p in reader.partitions(start, end) for b in reader.read(p) for row in b.to_pylist()]
        batches.append([render(row) for row in rows])
        start = end
    assert all(batches), "a micro-batch read no line"
    assert [row for batch in batches for row in batch] == GOLDEN_ROWS
    if max_bytes == 1:
        assert len(batches) == len(lines)  # a line per micro-batch


def test_a_replayed_file_that_shrinks_fails_under_max_bytes_per_trigger(tmp_path: Path) -> None:
    lines = EXCLUDE.read_bytes().splitlines(keepends=True)
    source = tmp_path / "a.txt"
    source.write_bytes(b"".join(lines[:4]))
    reader = _stream_reader(tmp_path, 100_000)
    limit = reader.getDefaultReadLimit()
    first = reader.latestOffset(reader.initialOffset(), limit)
    source.write_bytes(b"".join(lines[:2]))
    second = reader.latestOffset(first, limit)
    with pytest.raises(ReplayFormatError, match="shrank from .* bytes since the last micro-batch"):
        reader.partitions(first, second)


# --- line numbers: exact across splits and micro-batches, counted in linear time ----------------


class CountingFile:
    """A file opened by the replay module, counting the bytes read through it."""

    def __init__(self, stream: Any, counter: list[int]) -> None:
        self._stream, self._counter = stream, counter

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._stream.read(size)
        self._counter[0] += len(data)
        return data

    def readline(self, size: int = -1) -> bytes:
        data: bytes = self._stream.readline(size)
        self._counter[0] += len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __enter__(self) -> CountingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.close()


@pytest.fixture
def bytes_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes every file the replay module opens gives: planning and reading the splits alike."""
    counter = [0]
    monkeypatch.setattr(
        replay, "open", lambda *args, **kw: CountingFile(open(*args, **kw), counter), raising=False
    )
    return counter


LINE_COLUMNS = "id INT NOT NULL, name STRING"


def envelope_lines(count: int, *, every_bad: int = 0) -> tuple[bytes, dict[int, int], list[int]]:
    """``count`` Debezium envelopes ending in CRLF, with a blank line every 7th and, every
    ``every_bad``-th, a line that is not JSON: (the bytes, id -> line number, the bad lines)."""
    lines, ids, bad = [], {}, []
    for number in range(1, count + 1):
        if number % 7 == 0:
            lines.append(b"\r\n")
        elif every_bad and number % every_bad == 0:
            lines.append(b"{not json\r\n")
            bad.append(number)
        else:
            ids[number] = number
            envelope = {"op": "c", "after": {"id": number, "name": "x" * (number % 50)}}
            lines.append(json.dumps(envelope).encode() + b"\r\n")
    return b"".join(lines), ids, bad


def test_line_numbers_are_exact_across_splits_and_planned_in_linear_time(
    tmp_path: Path, bytes_read: list[int]
) -> None:
    text, ids, _ = envelope_lines(3000)
    source = tmp_path / "changes.txt"
    source.write_bytes(text)
    options = {
        "path": str(source),
        "columns": LINE_COLUMNS,
        "metadata": "line",
        "maxRecordsPerPartition": "2",
    }
    reader = CdcBatchReader(plan_read("debezium-json", options, None))
    bytes_read[0] = 0
    partitions = reader.partitions()
    rows = [row for p in partitions for batch in reader.read(p) for row in batch.to_pylist()]
    assert len(partitions) > 100
    assert {row["id"]: row["line"] for row in rows} == ids
    assert len(rows) == len(ids)
    # Counting from byte 0 for each of the N splits reads ~N/2 times the file; once per file is ~2x
    # (the planner's count, then the splits' own reads).
    assert bytes_read[0] <= 3 * len(text), (bytes_read[0], len(text))


def test_line_numbers_of_a_dump_are_exact_across_splits_in_linear_time(
    tmp_path: Path, bytes_read: list[int]
) -> None:
    dump = tmp_path / "topic.dump.jsonl"
    values = [
        json.dumps({"op": "c", "after": {"id": i, "name": "y" * (i % 40)}}).encode() for i in range(2000)
    ]
    replay.write_dump(dump, [Message(v, topic="t", partition=0, offset=i) for i, v in enumerate(values)])
    options = {
        "path": str(dump),
        "columns": LINE_COLUMNS,
        "metadata": "line,offset",
        "maxRecordsPerPartition": "2",
    }
    reader = CdcBatchReader(plan_read("debezium-json", options, None))
    bytes_read[0] = 0
    rows = [row for p in reader.partitions() for batch in reader.read(p) for row in batch.to_pylist()]
    assert sorted((row["offset"], row["line"]) for row in rows) == [(i, i + 2) for i in range(2000)]
    assert bytes_read[0] <= 3 * dump.stat().st_size, (bytes_read[0], dump.stat().st_size)


def test_line_numbers_and_dead_letters_are_exact_across_micro_batches(
    tmp_path: Path, bytes_read: list[int]
) -> None:
    text, ids, bad = envelope_lines(1500, every_bad=97)
    source = tmp_path / "in" / "changes.txt"
    source.parent.mkdir()
    source.write_bytes(text)
    dead = tmp_path / "dead"
    options = {
        "path": str(source.parent),
        "columns": LINE_COLUMNS,
        "metadata": "file,line",
        "maxBytesPerTrigger": str(len(text) // 6),
        "maxRecordsPerPartition": "3",
        "ignore-parse-errors": "true",
        "deadLetterPath": str(dead),
    }
    reader = CdcStreamReader(plan_read("debezium-json", options, None))
    limit = reader.getDefaultReadLimit()
    start, rows, batches = reader.initialOffset(), [], 0
    bytes_read[0] = 0
    while (end := reader.latestOffset(start, limit)) != start:
        rows += [row for p in reader.partitions(start, end) for b in reader.read(p) for row in b.to_pylist()]
        start, batches = end, batches + 1
    assert batches >= 6
    assert {row["id"]: row["line"] for row in rows} == ids
    assert len(rows) == len(ids)
    letters = read_dead_letters(str(dead))
    assert sorted((letter["file"], letter["line"]) for letter in letters) == [(str(source), n) for n in bad]
    assert bytes_read[0] <= 4 * len(text), (bytes_read[0], len(text))
