"""The ingest job: the command line's embedded demo, its config file, and Kafka → Delta exactly once."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cdc_events import COLUMNS, changelog, debezium_events
from confluent_kafka import Producer
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from cdcflow.cli import _parser
from cdcflow.cli.ingest import config_from, settings
from cdcflow.connectors.errors import CheckpointInUseError
from cdcflow.connectors.lakehouse import checkpoint_logs, ingest_defaults
from cdcflow.connectors.lakehouse import ingest as ingest_module
from cdcflow.connectors.lakehouse.checkpoint_lease import LEASE_DIR, STALE_AFTER_S, CheckpointLease
from cdcflow.connectors.lakehouse.delta.batch import OnTruncate
from cdcflow.connectors.lakehouse.delta.result import BatchApplied
from cdcflow.connectors.lakehouse.delta.storage import Storage
from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest
from cdcflow.connectors.lakehouse.ingest_defaults import (
    DEFAULT_MAX_BYTES_PER_TRIGGER,
    DEFAULT_MAX_OFFSETS_PER_TRIGGER,
    LEGACY_FILE_RECORDS_PER_PARTITION,
)
from cdcflow.connectors.lakehouse.ingest_report import IngestSummary
from cdcflow.connectors.lakehouse.sink import Progress
from cdcflow.connectors.spark import readers
from cdcflow.core import CdcflowError, Change, RowKind


def fold(changes: list[Change], key: str) -> dict[Any, dict[str, Any]]:
    table: dict[Any, dict[str, Any]] = {}
    for change in changes:
        if change.kind in (RowKind.INSERT, RowKind.UPDATE_AFTER):
            table[change.row[key]] = dict(change.row)
        elif change.kind is RowKind.DELETE:
            table.pop(change.row[key], None)
    return table


def parse(argv: list[str]) -> argparse.Namespace:
    return _parser().parse_args(["ingest", *argv])


def test_demo_ingests_the_bundled_recording_and_resumes_without_reapplying(tmp_path: Path) -> None:
    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603 - our own module
            [sys.executable, "-m", "cdcflow", "ingest"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    first = run()
    assert first.returncode == 0, first.stderr
    table = DeltaTable(str(tmp_path / "cdcflow-demo" / "table"))
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [1, 4, 10, 20]
    printed = [line for line in first.stdout.splitlines() if line.startswith("[")]
    assert [line.split(",")[0] for line in printed] == ["[1", "[4", "[10", "[20"]
    assert "4 upserted, 3 deleted" in first.stderr
    assert "batches" in first.stderr and "changes/s" in first.stderr  # the progress line
    version = table.version()

    again = run()
    assert again.returncode == 0, again.stderr
    assert "0 changes" in again.stderr
    assert DeltaTable(str(tmp_path / "cdcflow-demo" / "table")).version() == version


def test_config_file_settings_are_overridden_by_flags(tmp_path: Path) -> None:
    config = tmp_path / "ingest.toml"
    config.write_text(
        'format = "canal-json"\npath = "/data/orders"\nkey = ["id", "region"]\ntarget = "/lake/orders"\n'
        'checkpoint = "/chk/orders"\nsequence-by = "ts"\n[options]\nmaxBytesPerTrigger = 1000\n',
        encoding="utf-8",
    )
    merged = settings(parse(["--config", str(config), "--target", "/lake/other", "--option", "a=b"]))
    ingest_config, demo = config_from(merged)
    assert not demo
    assert ingest_config.format == "canal-json"
    assert ingest_config.key == ("id", "region")
    assert ingest_config.target == "/lake/other"
    assert ingest_config.sequence_by == "ts"
    # The user's limit stays; the job adds controlEvents=emit so that a TRUNCATE (a Canal DDL) is
    # applied, and keeps the source's message counts in its checkpoint (a file's batches are split for
    # every core when the query starts: minPartitions, from the session).
    assert ingest_config.source_options() == {
        "maxBytesPerTrigger": "1000",
        "a": "b",
        "path": "/data/orders",
        "controlEvents": "emit",
        "accountingPath": "/chk/orders/cdcflow-accounting",
    }


def test_config_errors_name_the_setting(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('formt = "debezium-json"\n', encoding="utf-8")
    with pytest.raises(CdcflowError, match="unknown settings formt"):
        settings(parse(["--config", str(config)]))
    with pytest.raises(CdcflowError, match="--format 'mysql' is not one of"):
        config_from(
            settings(
                parse(
                    ["--format", "mysql", "--path", "x", "--key", "id", "--target", "t", "--checkpoint", "c"]
                )
            )
        )
    with pytest.raises(CdcflowError, match="needs --checkpoint"):  # --key may be left out: the messages'
        config_from(settings(parse(["--path", "x", "--target", "t"])))


def produce_events(bootstrap: str, topic: str, events: list[Any]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for event in events:
        producer.produce(topic, value=event.value, key=event.key)
    assert producer.flush(30) == 0


def products_from_kafka(
    tmp_path: Path, bootstrap: str, topic: str, key: tuple[str, ...] = ("id",), **options: str
) -> IngestConfig:
    """The ingest of ``topic``'s Debezium products events into ``tmp_path/products``."""
    return IngestConfig(
        format="debezium-json",
        key=key,
        target=str(tmp_path / "products"),
        checkpoint=str(tmp_path / "checkpoint"),
        bootstrap_servers=bootstrap,
        topics=(topic,),
        schema=COLUMNS,
        options=options,
    )


def test_kafka_topics_land_in_delta_exactly_once_across_restarts(
    spark: SparkSession, kafka_cluster: Any, tmp_path: Path
) -> None:
    """A whole database from Kafka: ``--topic-pattern`` and ``--target .../{topic}``, each topic's table
    in its own Delta table; a topic created between two runs is picked up by the second."""
    topics = ["ingest-db.products", "ingest-db.orders", "ingest-db.late"]
    changes = {topic: changelog(300, seed=11 + i) for i, topic in enumerate(topics)}
    events = {topic: debezium_events(changes[topic]) for topic in topics}
    for topic in topics:
        kafka_cluster.create_topic(topic, partitions=3 if topic != topics[2] else 1)
    kafka_cluster.create_topic("ingest-dbx.other", partitions=1)  # no match: never read
    produce_events(kafka_cluster.bootstrap_servers, "ingest-dbx.other", events[topics[0]][:5])

    def produce(topic: str, part: slice) -> None:
        produce_events(kafka_cluster.bootstrap_servers, topic, events[topic][part])

    # No key given: the job applies by the one the messages' Kafka keys name ({"id": ...}).
    config = dataclasses.replace(
        products_from_kafka(
            tmp_path, kafka_cluster.bootstrap_servers, topics[0], key=(), maxOffsetsPerTrigger="50"
        ),
        topics=(),
        topic_pattern=r"ingest-db\..*",
        target=str(tmp_path / "lake" / "{topic}"),
    )
    for topic in topics[:2]:
        produce(topic, slice(len(events[topic]) // 2))
    first = ingest(config, spark)
    for topic in topics[:2]:
        produce(topic, slice(len(events[topic]) // 2, None))
    produce(topics[2], slice(None))
    second = ingest(config, spark)
    # The messages name no table (no source block): each is named after its topic's last part.
    assert sorted(first.tables) == ["orders", "products"]
    assert sorted(second.tables) == ["late", "orders", "products"]
    assert {s.key for s in [*first.tables.values(), *second.tables.values()]} == {("id",)}
    assert all(s.batches > 1 for s in first.tables.values())
    assert sorted(p.name for p in (tmp_path / "lake").iterdir()) == sorted(topics)
    for topic in topics:
        rows = DeltaTable(str(tmp_path / "lake" / topic)).to_pyarrow_table().to_pylist()
        assert len(rows) == len({row["id"] for row in rows})
        assert {row["id"]: row for row in rows} == fold(changes[topic], "id"), topic
        # One change per event: an update's -U/+U pair is one u event, applied as its +U row.
        name = topic.rpartition(".")[2]
        applied = [s.tables[name].progress.totals.changes for s in (first, second) if name in s.tables]
        assert sum(applied) == sum(1 for c in changes[topic] if c.kind is not RowKind.UPDATE_AFTER)
    assert second.progress.totals.changes == sum(s.progress.totals.changes for s in second.tables.values())


def test_ingest_reads_bounded_micro_batches_by_default() -> None:
    def options(**settings: Any) -> dict[str, str]:
        base: dict[str, Any] = {"format": "canal-json", "key": ("id",), "target": "t", "checkpoint": "c"}
        return IngestConfig(**{**base, **settings}).source_options()

    kafka = options(bootstrap_servers="k:9092", topics=("t",))
    assert kafka["maxOffsetsPerTrigger"] == str(DEFAULT_MAX_OFFSETS_PER_TRIGGER) == "100000"
    assert "maxBytesPerTrigger" not in kafka
    files = options(path="/data")
    assert files["maxBytesPerTrigger"] == str(DEFAULT_MAX_BYTES_PER_TRIGGER) == str(64 << 20)
    assert options(path="/data", max_bytes_per_trigger=0)["maxBytesPerTrigger"] == "0"  # 0: no limit
    assert options(path="/data", options={"MaxBytesPerTrigger": "5"})["MaxBytesPerTrigger"] == "5"
    with pytest.raises(CdcflowError, match="maxOffsetsPerTrigger is given twice"):
        options(
            bootstrap_servers="k",
            topics=("t",),
            max_offsets_per_trigger=5,
            options={"maxOffsetsPerTrigger": "9"},
        )


def test_the_summary_shows_truncates_control_events_and_unfilled_values() -> None:
    """What the driver counted is printed, not left to a log line the user may never see."""
    counted = BatchApplied(2, truncates=1, control_events=2, unavailable_unfilled=4, restarts=5)
    progress = Progress(batches=3, totals=counted, last=counted)
    text = str(IngestSummary(3, progress, 1.0, 7, 10))
    assert "5 restarted positions" in text
    assert "1 truncate(s), 2 other control event(s) skipped, 4 unavailable value(s) left NULL" in text


def test_ingest_flags_and_config_set_the_limits_and_on_truncate(tmp_path: Path) -> None:
    config = tmp_path / "ingest.toml"
    config.write_text('max-bytes-per-trigger = 1000\non-truncate = "ignore"\n', encoding="utf-8")
    common = ["--path", "x", "--key", "id", "--target", "t", "--checkpoint", "c"]
    from_file, _ = config_from(settings(parse(["--config", str(config), *common])))
    assert (from_file.max_bytes_per_trigger, from_file.on_truncate) == (1000, OnTruncate.IGNORE)
    assert from_file.source_options()["maxBytesPerTrigger"] == "1000"
    flags, _ = config_from(
        settings(parse([*common, "--on-truncate", "fail", "--max-offsets-per-trigger", "7"]))
    )
    assert (flags.max_offsets_per_trigger, flags.on_truncate) == (7, OnTruncate.FAIL)
    assert config_from(settings(parse(common)))[0].on_truncate is OnTruncate.APPLY
    with pytest.raises(SystemExit):
        parse([*common, "--on-truncate", "drop"])


def test_debezium_ingest_asks_for_what_the_applier_needs() -> None:
    config = IngestConfig(
        format="debezium-json",
        key=("id",),
        target="t",
        checkpoint="c",
        path="/data",
        options={"metadata": "source.table,old-key"},
    )
    options = config.source_options()
    assert options["unavailable-values"] == "REPORT" and options["controlEvents"] == "emit"
    assert options["metadata"].split(",") == [
        "source.table",
        "old-key",
        "source.sequence",
        "source.timestamp",
        "unavailable-columns",
        "new-key",
    ]
    links = config.links()
    assert links.apply == {
        "control_column": "_control",
        "unavailable_column": "unavailable_columns",
        "old_key_column": "old_key",
        "new_key_column": "new_key",
    }
    # Asked for by the user: kept in the table; added by the job: kept out.
    assert set(links.exclude) == {"_control", "unavailable_columns", "new_key"}
    fill = dataclasses.replace(config, options={"debezium-json.unavailable-values": "fill"})
    assert "unavailable-values" not in fill.source_options()


ITEMS = "id INT NOT NULL, name STRING"


class PostgresEvents:
    """Debezium PostgreSQL events of a table ``items`` with rising LSNs and commit times, and the table
    they leave (the reference the Delta table is compared with)."""

    def __init__(self) -> None:
        self.lsn = 1000
        self.lines: list[bytes] = []
        self.table: dict[int, dict[str, Any]] = {}

    def _event(self, op: str, before: Any, after: Any) -> None:
        self.lsn += 8
        source = {
            "connector": "postgresql",
            "ts_ms": 1_700_000_000_000 + self.lsn,
            "table": "items",
            "lsn": self.lsn,
            "sequence": json.dumps([str(self.lsn), str(self.lsn)]),
        }
        line = {"op": op, "before": before, "after": after, "source": source, "ts_ms": source["ts_ms"]}
        self.lines.append(json.dumps(line).encode())

    def upsert(self, key: int, name: str) -> None:
        before = self.table.get(key)
        row = {"id": key, "name": name}
        self._event("u" if before else "c", before, row)
        self.table[key] = row

    def delete(self, key: int) -> None:
        self._event("d", self.table.pop(key), None)

    def truncate(self) -> None:
        self._event("t", None, None)
        self.table.clear()


def test_a_truncate_in_the_middle_of_a_recorded_stream_lands_exactly_once(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The truncate sits inside a micro-batch read by several tasks: the rows before it are gone, the
    ones after it stay, and a rerun from the checkpoint over the grown file does not truncate again.
    No limit is set: the job's default bound (made small here) splits the file into micro-batches."""
    monkeypatch.setattr(ingest_defaults, "DEFAULT_MAX_BYTES_PER_TRIGGER", 12_000)
    events = PostgresEvents()
    for key in range(120):
        events.upsert(key, f"first {key}")
    for key in range(0, 120, 3):
        events.upsert(key, f"second {key}")
    events.truncate()
    for key in range(100, 160):
        events.upsert(key, f"after {key}")
    for key in range(100, 160, 4):
        events.delete(key)
    path = tmp_path / "items.jsonl"
    path.write_bytes(b"\n".join(events.lines) + b"\n")
    assert path.stat().st_size > 3 * 12_000
    config = IngestConfig(
        format="debezium-json",
        key=("id",),
        target=str(tmp_path / "items"),
        checkpoint=str(tmp_path / "checkpoint"),
        path=str(path),
        schema=ITEMS,
        options={"maxRecordsPerPartition": "20"},  # several input partitions per micro-batch
    )

    def table() -> dict[int, dict[str, Any]]:
        rows = DeltaTable(config.target).to_pyarrow_table().to_pylist()
        assert all(set(row) == {"id", "name"} for row in rows)  # no helper column landed
        return {row["id"]: row for row in rows}

    first = ingest(config, spark)
    assert first.batches >= 3
    assert table() == events.table
    kept = dict(events.table)

    for key in range(150, 200):
        events.upsert(key, f"later {key}")
    with path.open("ab") as handle:
        handle.write(b"\n".join(events.lines[-50:]) + b"\n")
    second = ingest(config, spark)
    assert second.batches >= 1
    assert table() == events.table
    assert all(table()[key] == row for key, row in kept.items() if key < 150)  # not truncated again


def test_a_recorded_files_micro_batches_are_read_in_one_range_per_core(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each range has a fixed cost, so the job splits a file's batch into as many as the session has
    cores (none below MIN_SPLIT_BYTES), and records the ranges' length in the batch's offsets, where a
    restart reads it."""
    monkeypatch.setattr(ingest_defaults, "DEFAULT_MAX_BYTES_PER_TRIGGER", 5 * readers.MIN_SPLIT_BYTES // 2)
    events = PostgresEvents()
    for key in range(6000):
        events.upsert(key, f"name {key} " + "x" * 800)
    path = tmp_path / "items.jsonl"
    path.write_bytes(b"\n".join(events.lines) + b"\n")
    config = IngestConfig(
        format="debezium-json",
        key=("id",),
        target=str(tmp_path / "items"),
        checkpoint=str(tmp_path / "checkpoint"),
        path=str(path),
        schema=ITEMS,
    )
    summary = ingest(config, spark)
    assert summary.batches >= 3
    cores = spark.sparkContext.defaultParallelism
    begin = 0
    for batch in range(summary.batches):
        offsets = json.loads((tmp_path / "checkpoint" / "offsets" / str(batch)).read_text().splitlines()[-1])
        end = offsets["files"][str(path)]
        assert offsets["split"] == {"bytes": max(readers.MIN_SPLIT_BYTES, -(-(end - begin) // cores))}
        begin = end
    assert begin == path.stat().st_size
    rows = DeltaTable(config.target).to_pyarrow_table().to_pylist()
    assert {row["id"]: row for row in rows} == events.table


def test_a_batch_logged_before_min_partitions_is_replayed_in_its_old_ranges(tmp_path: Path) -> None:
    """An uncommitted batch whose offsets have no ranges' length came from a job that split files by
    LEGACY_FILE_RECORDS_PER_PARTITION: the restart plans it so again (its dead letters are named by
    its ranges)."""
    checkpoint = tmp_path / "checkpoint"
    config = IngestConfig(
        format="debezium-json", key=("id",), target="t", checkpoint=str(checkpoint), path="/data"
    )
    storage = Storage({})

    def log(batch: int, offset: dict[str, Any], *, committed: bool) -> None:
        (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
        (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
        (checkpoint / "offsets" / str(batch)).write_text(
            f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(offset)}'
        )
        if committed:
            (checkpoint / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')

    assert not ingest_module._legacy_batch_pending(storage, config)  # a new checkpoint
    log(0, {"files": {"/data/a": 10}}, committed=True)
    assert not ingest_module._legacy_batch_pending(storage, config)  # committed: not replayed
    log(1, {"files": {"/data/a": 20}, "split": {"bytes": 5}}, committed=False)
    assert not ingest_module._legacy_batch_pending(storage, config)  # its length is in its offsets
    log(2, {"files": {"/data/a": 30}}, committed=False)
    assert ingest_module._legacy_batch_pending(storage, config)
    log(2, {"t": {"0": 30}}, committed=False)
    assert not ingest_module._legacy_batch_pending(storage, config)  # Kafka ranges are not lengths
    assert LEGACY_FILE_RECORDS_PER_PARTITION == 50_000  # what the job set for files then


def test_a_topic_larger_than_the_default_bound_is_read_in_several_micro_batches(
    spark: SparkSession, kafka_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ingest_defaults, "DEFAULT_MAX_OFFSETS_PER_TRIGGER", 40)
    topic = "ingest-bounded"
    kafka_cluster.create_topic(topic, partitions=2)
    changes = changelog(120, seed=5)
    events = debezium_events(changes)
    produce_events(kafka_cluster.bootstrap_servers, topic, events)
    config = products_from_kafka(tmp_path, kafka_cluster.bootstrap_servers, topic)
    summary = ingest(config, spark)
    assert summary.batches >= -(-len(events) // 40)
    rows = DeltaTable(config.target).to_pyarrow_table().to_pylist()
    assert {row["id"]: row for row in rows} == fold(changes, "id")


def _items_job(tmp_path: Path, events: PostgresEvents) -> IngestConfig:
    path = tmp_path / "items.jsonl"
    path.write_bytes(b"\n".join(events.lines) + b"\n")
    return IngestConfig(
        format="debezium-json",
        key=("id",),
        target=str(tmp_path / "items"),
        checkpoint=str(tmp_path / "checkpoint"),
        path=str(path),
        schema=ITEMS,
    )


def test_a_second_job_on_a_checkpoint_is_refused_at_once_and_writes_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Two queries on one checkpoint spoil it (Spark failed the second ~20 s in, and the counts its
    tasks wrote stayed in the checkpoint's totals): the second is refused before it starts."""
    events = PostgresEvents()
    events.upsert(1, "a")
    config = _items_job(tmp_path, events)
    running = CheckpointLease(config.checkpoint, Storage())  # the job already running on it
    running.take()
    try:
        started = time.monotonic()
        with pytest.raises(CheckpointInUseError) as refused:
            ingest(config, spark)
        assert time.monotonic() - started < 10
    finally:
        running.release()
    message = str(refused.value)
    assert message.startswith(f"the checkpoint {config.checkpoint} is in use by another job: ")
    assert f"process {os.getpid()} on host {socket.gethostname()}" in message
    assert [p.name for p in (tmp_path / "checkpoint").iterdir()] == [LEASE_DIR]  # no offsets, no counts
    assert not Path(config.target).exists()


def test_a_job_killed_with_sigkill_does_not_block_its_restart(spark: SparkSession, tmp_path: Path) -> None:
    events = PostgresEvents()
    for key in range(5):
        events.upsert(key, f"name {key}")
    config = _items_job(tmp_path, events)
    code = (
        "import sys\n"
        "from cdcflow.connectors.lakehouse.checkpoint_lease import CheckpointLease\n"
        "from cdcflow.connectors.lakehouse.delta.storage import Storage\n"
        "CheckpointLease(sys.argv[1], Storage()).take()\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen(  # noqa: S603 - this interpreter, fixed code
        [sys.executable, "-c", code, config.checkpoint],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            with pytest.raises(CheckpointInUseError, match=f"process {holder.pid} on host"):
                ingest(config, spark)
        finally:
            holder.kill()  # SIGKILL: the lease is left behind, never released
    summary = ingest(config, spark)  # its process is gone: the lease is stale at once
    assert summary.batches >= 1
    rows = DeltaTable(config.target).to_pyarrow_table().to_pylist()
    assert {row["id"]: row for row in rows} == events.table
    # The dead job's lease file is gone; this job's is released, so the next one goes on at once.
    (kept,) = (tmp_path / "checkpoint" / LEASE_DIR).iterdir()
    assert kept.name == "0000000002.json" and json.loads(kept.read_text())["released"] is True


def test_a_lease_from_another_host_is_taken_over_once_its_heartbeat_is_stale(tmp_path: Path) -> None:
    """On another host the process cannot be looked up: its heartbeat says whether it lives."""
    leases = tmp_path / "checkpoint" / LEASE_DIR
    leases.mkdir(parents=True)

    def other_host_job(heartbeat_age_s: float) -> None:
        now = time.time()
        record = {"pid": 4242, "host": "other-host", "taken": now - 3600, "heartbeat": now - heartbeat_age_s}
        (leases / "0000000007.json").write_text(json.dumps(record))

    other_host_job(STALE_AFTER_S / 2)
    with pytest.raises(CheckpointInUseError, match="process 4242 on host other-host .*, last heartbeat 30s"):
        CheckpointLease(str(tmp_path / "checkpoint"), Storage()).take()
    other_host_job(STALE_AFTER_S + 5)
    lease = CheckpointLease(str(tmp_path / "checkpoint"), Storage())
    lease.take()
    try:
        assert [p.name for p in leases.iterdir()] == ["0000000008.json"]
        with pytest.raises(CheckpointInUseError, match=f"process {os.getpid()} on host"):
            CheckpointLease(str(tmp_path / "checkpoint"), Storage()).take()
    finally:
        lease.release()


def test_commit_group_shows_the_lag_where_kafka_tools_look(
    spark: SparkSession, kafka_cluster: Any, tmp_path: Path
) -> None:
    """--commit-group NAME: each applied micro-batch's end offsets go to that consumer group (what
    kafka-consumer-groups and Burrow read), the last one's too; the checkpoint still decides where the job
    goes on."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    topic = "ingest-commit-group"
    kafka_cluster.create_topic(topic, partitions=2)
    events = debezium_events(changelog(40, seed=3))
    produce_events(kafka_cluster.bootstrap_servers, topic, events)
    common = [
        *("--bootstrap-servers", kafka_cluster.bootstrap_servers, "--topic", topic, "--key", "id"),
        *("--schema", COLUMNS, "--target", str(tmp_path / "products")),
        *("--checkpoint", str(tmp_path / "checkpoint"), "--max-offsets-per-trigger", "15"),
    ]
    config, _ = config_from(settings(parse([*common, "--commit-group", "products-lag"])))
    summary = ingest(config, spark)
    assert summary.batches >= 3

    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    asked = ConsumerGroupTopicPartitions("products-lag", [TopicPartition(topic, p) for p in range(2)])
    committed = admin.list_consumer_group_offsets([asked])["products-lag"].result(timeout=30)
    ends = json.loads(
        (tmp_path / "checkpoint" / "offsets" / str(summary.batches - 1)).read_text().splitlines()[-1]
    )
    assert {tp.partition: tp.offset for tp in committed.topic_partitions} == {
        int(p): offset for p, offset in ends[topic].items()
    }
    assert sum(ends[topic].values()) == len(events)  # the last batch ended at the end of the topic

    toml = tmp_path / "ingest.toml"
    toml.write_text('commit-group = "from-file"\n', encoding="utf-8")
    from_file, _ = config_from(settings(parse(["--config", str(toml), *common])))
    assert from_file.commit_group == "from-file"
    with pytest.raises(
        CdcflowError, match="--commit-group commits Kafka offsets: it needs --bootstrap-servers"
    ):
        IngestConfig(
            format="debezium-json", key=("id",), target="t", checkpoint="c", path="x", commit_group="g"
        )


def test_a_kafka_topic_shared_by_several_canal_tables_lands_each_in_its_own_table(
    spark: SparkSession, kafka_cluster: Any, tmp_path: Path
) -> None:
    """Paimon's Canal recording of four tables in one topic, read from the broker: the job finds the
    tables by reading the topic, and lands each in its table, keyed by ``pkNames``."""
    recorded = Path(__file__).parents[2] / "formats" / "testdata" / "apache_paimon" / "kafka" / "canal"
    lines = (recorded / "database" / "include" / "topic0" / "canal-data-1.stripped.txt").read_bytes()
    messages = [line for line in lines.splitlines() if line.startswith(b"{")]
    topic = "ingest-canal-shared"
    kafka_cluster.create_topic(topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    for message in messages:
        producer.produce(topic, value=message, key=json.loads(message)["table"].encode())
    assert producer.flush(30) == 0
    config = IngestConfig(
        format="canal-json",
        key=(),
        target=str(tmp_path / "lake" / "{table}"),
        checkpoint=str(tmp_path / "checkpoint"),
        bootstrap_servers=kafka_cluster.bootstrap_servers,
        topics=(topic,),
    )
    summary = ingest(config, spark)
    want = {json.loads(m)["table"]: json.loads(m)["data"] for m in messages}
    assert sorted(summary.tables) == sorted(f"paimon_sync_database_affix.{t}" for t in want)
    for table, data in want.items():
        rows = DeltaTable(str(tmp_path / "lake" / table)).to_pyarrow_table().to_pylist()
        assert [(str(r["k1"]), r["v0"]) for r in rows] == [(d["k1"], d["v0"]) for d in data], table
    assert {s.key for s in summary.tables.values()} == {("k1",)}
    # Each table's query, started from its own thread, set Spark's checkpoint manager for its start only.
    assert spark.conf.get(checkpoint_logs.MANAGER_KEY, None) is None
