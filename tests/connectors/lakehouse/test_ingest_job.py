"""The ingest job: the command line's embedded demo, its config file, and Kafka → Delta exactly once."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cdc_events import COLUMNS, changelog, debezium_events
from confluent_kafka import Producer
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from cdcflow.cli import _parser
from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest
from cdcflow.core import CdcflowError, Change, RowKind
from cdcflow.ingest_cli import config_from, settings


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
    assert ingest_config.source_options() == {"maxBytesPerTrigger": "1000", "a": "b", "path": "/data/orders"}


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
    with pytest.raises(CdcflowError, match="needs --key"):
        config_from(settings(parse(["--path", "x", "--target", "t", "--checkpoint", "c"])))


def test_kafka_topic_lands_in_delta_exactly_once_across_restarts(
    spark: SparkSession, kafka_cluster: Any, tmp_path: Path
) -> None:
    topic = "ingest-products"
    kafka_cluster.create_topic(topic, partitions=3)
    changes = changelog(300, seed=11)
    events = debezium_events(changes)
    half = len(events) // 2

    def produce(batch: list[Any]) -> None:
        producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers})
        for event in batch:
            producer.produce(topic, value=event.value, key=event.key)
        assert producer.flush(30) == 0

    config = IngestConfig(
        format="debezium-json",
        key=("id",),
        target=str(tmp_path / "products"),
        checkpoint=str(tmp_path / "checkpoint"),
        bootstrap_servers=kafka_cluster.bootstrap_servers,
        topics=(topic,),
        schema=COLUMNS,
        options={"maxOffsetsPerTrigger": "50"},
    )
    produce(events[:half])
    first = ingest(config, spark)
    produce(events[half:])
    second = ingest(config, spark)
    assert first.batches > 1 and second.batches >= 1
    rows = DeltaTable(config.target).to_pyarrow_table().to_pylist()
    assert len(rows) == len({row["id"] for row in rows})
    assert {row["id"]: row for row in rows} == fold(changes, "id")
    assert second.progress.changes + first.progress.changes == sum(
        2 if c.kind is RowKind.UPDATE_BEFORE else 0 for c in changes
    ) + sum(1 for c in changes if c.kind in (RowKind.INSERT, RowKind.DELETE))
