"""Dead letters are written exactly once per record, across task retries and restarts, and every
message read is accounted for: changes' messages + dead letters + control events + filtered +
tombstones (+ empty) == messages read (docs/connectors.md, "Bad records")."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cdcflow.connectors.replay.dumps import write_dump
from cdcflow.connectors.spark.accounting import read_counts
from cdcflow.connectors.spark.dead_letters import read_dead_letters
from cdcflow.formats.base import Message

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TOPIC = "inventory.customers"
COLUMNS = "id INT NOT NULL, name STRING"
BAD = (
    b'{"op": "c", "after": {"id": 1',  # cut short
    b'{"op":"c","after":{"id":"abc","name":"x"}}',  # a string in an INT column
    b'{"op":"x","after":{"id":1,"name":"x"}}',  # an unknown op
    b'{"op":"c","after":[1,2]}',  # a list for the image
    b'{"op":"c","after":{"id":5,"name":"\xff"}}',  # invalid UTF-8
    b'{"op":"c","after":{"id":null,"name":"x"}}',  # NULL in a NOT NULL column
)
CONTROL = (
    b'{"op":"t","source":{"table":"customers"}}',
    b'{"op":"m","message":{"prefix":"p","content":"YQ=="}}',
)
ROWS_PER_OP = {"c": 1, "u": 2, "d": 1}


def _good(n: int) -> bytes:
    op = "cud"[n % 3]
    image = {"id": n, "name": f"name {n}"}
    envelope = {"op": op, "before": image if op != "c" else None, "after": image if op != "d" else None}
    return json.dumps(envelope).encode()


def mixed(count: int = 150) -> tuple[list[Message], dict[str, int]]:
    """Good records, bad ones of every kind in BAD, tombstones and control events, and what each is."""
    messages, kinds = [], Counter[str]()
    for offset in range(count):
        kind = ("good", "good", "bad", "good", "tombstone", "control", "good")[offset % 7]
        if kind == "good":
            value: bytes | None = _good(offset)
            kinds["rows"] += ROWS_PER_OP[json.loads(value)["op"]]
        elif kind == "bad":
            value = BAD[(offset // 7) % len(BAD)]
        elif kind == "control":
            value = CONTROL[(offset // 7) % len(CONTROL)]
        else:
            value = None
        kinds[kind] += 1
        headers = (("trace", f"t{offset}".encode()), ("empty", None)) if offset % 2 else ()
        key = json.dumps({"id": offset}).encode()
        messages.append(Message(value, key, TOPIC, offset % 2, offset, 1_700_000_000_000 + offset, headers))
    return messages, dict(kinds)


def _write(path: Path) -> tuple[list[Message], dict[str, int]]:
    messages, kinds = mixed()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_dump(path, messages)
    return messages, kinds


def _check_letters(dead: Path, messages: list[Message]) -> None:
    """Every bad record has exactly one dead letter, with its exact bytes and its coordinates."""
    bad = {(m.partition, m.offset): m for m in messages if m.value in BAD}
    letters = read_dead_letters(str(dead))
    coordinates = Counter((letter["partition"], letter["offset"]) for letter in letters)
    assert coordinates == Counter(bad.keys()), "a bad record has no dead letter, or more than one"
    for letter in letters:
        message = bad[(letter["partition"], letter["offset"])]
        assert letter["topic"] == TOPIC
        assert base64.b64decode(letter["value"]) == message.value
        assert base64.b64decode(letter["key"]) == message.key
        assert letter["timestamp"] == message.timestamp_ms
        sent = [[name, None if v is None else base64.b64encode(v).decode()] for name, v in message.headers]
        assert letter["headers"] == sent


def _check_counts(
    counts_dir: Path, kinds: dict[str, int], messages: list[Message], rows: int | None = None
) -> None:
    """``rows``: the changelog rows expected, when not the source's (``kinds["rows"]``)."""
    counts = read_counts(str(counts_dir))
    assert counts.read == len(messages)
    assert counts.dead_letters == kinds["bad"]
    assert counts.control_events == kinds["control"]
    assert counts.tombstones == kinds["tombstone"]
    assert counts.changed == kinds["good"]
    assert counts.changes == (kinds["rows"] if rows is None else rows)
    assert (counts.filtered, counts.empty) == (0, 0)
    assert counts.read == (
        counts.changed + counts.dead_letters + counts.control_events + counts.filtered + counts.tombstones
    )


def _check_rows(rows: list[Any], kinds: dict[str, int]) -> None:
    assert sum(1 for r in rows if r["_control"] is None) == kinds["rows"]
    assert sorted(r["_control"] for r in rows if r["_control"] is not None) == sorted(
        ["truncate", "message"] * (kinds["control"] // 2) + ["truncate"] * (kinds["control"] % 2)
    )


RETRY_SCRIPT = r"""
import json, os, sys
from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSourceReader
from cdcflow.connectors.spark.session import cdcflow_spark_config
from cdcflow.connectors.spark.sources import DebeziumSource

dump, dead, counts, markers, output = sys.argv[1:6]


class FlakyReader(DataSourceReader):
    def __init__(self, inner, markers):
        self.inner, self.markers = inner, markers

    def partitions(self):
        return self.inner.partitions()

    def read(self, partition):
        batches = iter(self.inner.read(partition))
        first = next(batches, None)  # the range's dead letters are written by now
        context = TaskContext.get()
        if context.attemptNumber() == 0:
            open(os.path.join(self.markers, f"task-{context.partitionId()}"), "w").close()
            batches.close()  # as a task that fails after reading part of its range
            raise RuntimeError("injected failure of a first task attempt")
        if first is not None:
            yield first
        yield from batches


class FlakySource(DebeziumSource):
    short_name = "flaky-cdc-debezium"
    markers = markers

    def reader(self, schema):
        return FlakyReader(super().reader(schema), self.markers)


builder = SparkSession.builder.master("local[2,3]").appName("cdcflow-retry-test")
for key, value in cdcflow_spark_config().items():
    builder = builder.config(key, value)
spark = (
    builder.config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "2")
    .config("spark.sql.session.timeZone", "UTC")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
spark.dataSource.register(FlakySource)
rows = (
    spark.read.format("flaky-cdc-debezium")
    .option("path", dump)
    .option("columns", "id INT NOT NULL, name STRING")
    .option("deadLetterPath", dead)
    .option("accountingPath", counts)
    .option("controlEvents", "emit")
    .option("maxRecordsPerPartition", "10")
    .load()
    .collect()
)
with open(output, "w") as handle:
    json.dump([row.asDict() for row in rows], handle)
spark.stop()
"""


def test_a_retried_task_writes_each_dead_letter_once(tmp_path: Path) -> None:
    """local[2,3]: the first attempt of every task fails after writing its range's dead letters; the
    retry's replace them, and the counts of the committed attempts add up to the messages read."""
    messages, kinds = _write(tmp_path / "in" / "mixed.dump")
    markers = tmp_path / "markers"
    markers.mkdir()
    script = tmp_path / "retry.py"
    script.write_text(RETRY_SCRIPT)
    output = tmp_path / "rows.json"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    args = [str(tmp_path / "in" / "mixed.dump"), str(tmp_path / "dead"), str(tmp_path / "counts")]
    done = subprocess.run(  # noqa: S603 - this venv's Python on a script the test wrote
        [sys.executable, str(script), *args, str(markers), str(output)],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    tasks = len(list(markers.iterdir()))
    assert tasks >= 3, "the input should be several ranges, each with a failed first attempt"
    _check_letters(tmp_path / "dead", messages)
    _check_counts(tmp_path / "counts", kinds, messages)
    _check_rows(json.loads(output.read_text()), kinds)
    assert len(list((tmp_path / "dead").glob("dead-letters-*.jsonl"))) <= tasks


def _stream(spark: SparkSession, source: Path, dead: Path, counts: Path) -> DataFrame:
    return (
        spark.readStream.format("cdc-debezium")
        .option("path", str(source))
        .option("columns", COLUMNS)
        .option("deadLetterPath", str(dead))
        .option("accountingPath", str(counts))
        .option("controlEvents", "emit")
        .option("maxRecordsPerPartition", "10")
        .option("maxBytesPerTrigger", "6000")
        .load()
    )


def test_a_restart_rereading_an_uncommitted_batch_writes_no_duplicate(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The first run reads micro-batch 0 (its dead letters are written) and fails before committing
    it; the restart from the checkpoint reads that batch again: still one dead letter per record."""
    from pyspark.errors import StreamingQueryException

    source = tmp_path / "in" / "mixed.dump"
    messages, kinds = _write(source)
    dead, counts, checkpoint = tmp_path / "dead", tmp_path / "counts", tmp_path / "checkpoint"
    seen: dict[int, list[Any]] = {}

    def fail_after_reading(frame: DataFrame, batch_id: int) -> None:
        frame.collect()
        raise RuntimeError(f"injected failure before committing micro-batch {batch_id}")

    def collect(frame: DataFrame, batch_id: int) -> None:
        seen[batch_id] = [row.asDict() for row in frame.collect()]

    first = _stream(spark, source, dead, counts).writeStream.foreachBatch(fail_after_reading)
    query = first.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    with pytest.raises(StreamingQueryException):
        query.awaitTermination(300)
    assert read_dead_letters(str(dead)), "the failed run should have read micro-batch 0"
    second = _stream(spark, source, dead, counts).writeStream.foreachBatch(collect)
    query = second.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination(300)
    assert query.exception() is None
    assert 0 in seen and len(seen) >= 2, "the restart should read batch 0 again, then the rest"
    _check_letters(dead, messages)
    _check_counts(counts, kinds, messages)
    _check_rows([row for batch in seen.values() for row in batch], kinds)


def test_ingest_accounts_for_every_message_in_its_progress_and_summary(
    spark: SparkSession, tmp_path: Path
) -> None:
    from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest

    source = tmp_path / "in" / "mixed.dump"
    messages, kinds = _write(source)
    config = IngestConfig(
        format="debezium-json",
        key=("id",),
        target=str(tmp_path / "table"),
        checkpoint=str(tmp_path / "checkpoint"),
        path=str(source),
        schema=COLUMNS,
        sequence_by="none",
        options={"deadLetterPath": str(tmp_path / "dead"), "maxBytesPerTrigger": "12000"},
    )
    out = io.StringIO()
    summary = ingest(config, spark, out=out)
    assert summary.batches >= 2
    counts = summary.messages
    assert counts is not None
    # ingest reads Debezium updates as upserts: every message with a change gives one row (its +U).
    assert (counts.read, counts.changed, counts.changes) == (len(messages), kinds["good"], kinds["good"])
    assert (counts.dead_letters, counts.control_events) == (kinds["bad"], kinds["control"])
    assert counts.tombstones == kinds["tombstone"]
    assert (counts.filtered, counts.empty) == (0, 0)
    _check_letters(tmp_path / "dead", messages)
    last = out.getvalue().strip().splitlines()[-1]
    assert f"{len(messages)} messages read" in last and f"{kinds['bad']} dead letter(s)" in last, last
    assert f"{len(messages)} messages read" in str(summary)
    assert "UNACCOUNTED" not in out.getvalue() + str(summary)
    again = ingest(config, spark, out=io.StringIO())
    assert again.messages is not None and again.messages.read == 0  # nothing new: nothing read
    # the committed batches' counts files are rolled up into totals.json: same counts, few files
    accounting = tmp_path / "checkpoint" / "cdcflow-accounting"
    assert (accounting / "totals.json").exists()
    assert len(list(accounting.glob("counts-*.json"))) < summary.batches
    _check_counts(accounting, kinds, messages, rows=kinds["good"])


@pytest.mark.integration
def test_a_dead_letter_topic_gets_nothing_from_a_failed_attempt(tmp_path: Path, kafka_cluster: Any) -> None:
    """A topic is sent a range's dead letters when the range is read: an attempt that fails sends none,
    and every record carries its coordinates in ``cdcflow.error.origin`` to deduplicate on."""
    from kafka_fixture import unique_topic
    from source_cases import topic_records

    from cdcflow.connectors.kafka import options as kafka_options
    from cdcflow.connectors.spark.dead_letters import DeadLetterWriter
    from cdcflow.connectors.spark.read_plan import DeadLetterTarget
    from cdcflow.formats.base import DeadLetter

    topic = unique_topic("dl-once")
    kafka_cluster.create_topic(topic, 1)
    kafka = kafka_options.KafkaOptions.parse(
        {"kafka.bootstrap.servers": kafka_cluster.bootstrap_servers, "subscribe": topic}
    )
    messages = [m for m in mixed()[0] if m.value in BAD]
    letters = [DeadLetter(m, "debezium-json", "bad", None) for m in messages]
    target = DeadLetterTarget(str(tmp_path / "dead"), topic, kafka)
    failed = DeadLetterWriter(target, "inventory.customers-0-0-150")
    failed.write(letters)
    failed.abort()
    assert read_dead_letters(str(tmp_path / "dead")) == []
    retried = DeadLetterWriter(target, "inventory.customers-0-0-150")
    retried.write(letters)
    retried.commit()
    sent = topic_records(kafka_cluster.bootstrap_servers, topic)
    assert [(r.key, r.value) for r in sent] == [(m.key, m.value) for m in messages]
    origins = [dict(r.headers)["cdcflow.error.origin"] for r in sent]
    assert origins == [m.origin().encode() for m in messages]
    assert [dict(r.headers).get("trace") for r in sent] == [dict(m.headers).get("trace") for m in messages]
    _check_letters(tmp_path / "dead", messages)
    assert os.listdir(tmp_path / "dead") == ["dead-letters-inventory.customers-0-0-150.jsonl"]
