"""``cdcflow ingest`` in-process (``cdcflow.cli.main``) on the session's Spark: every format of the
``cdc-*`` sources, and the one line that says what a run did."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from registry_server import RegistryHandler, serving
from test_debezium_json_registry import SMALL_SCHEMA, framed, recorded

from cdcflow.cli import main
from cdcflow.connectors.replay.dumps import write_dump
from cdcflow.connectors.spark.dead_letters import read_dead_letters
from cdcflow.formats import Message

pytestmark = pytest.mark.integration


def table_rows(target: Path) -> list[dict[str, object]]:
    return sorted(DeltaTable(str(target)).to_pyarrow_table().to_pylist(), key=lambda row: str(row["id"]))


def test_ingest_reads_the_registry_format_that_stream_offers(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = "cdcflow.inventory.cdc_small"
    dump = tmp_path / "cdc_small.dump.jsonl"
    bodies = recorded("cdc_small")
    write_dump(
        dump,
        [
            Message(framed(17, body), topic=topic, partition=0, offset=offset, timestamp_ms=0)
            for offset, body in enumerate(bodies)
        ],
    )
    handler = RegistryHandler.fresh()
    handler.schemas[17] = (SMALL_SCHEMA, "JSON")
    target = tmp_path / "table"
    with serving(handler) as port:
        code = main(
            ["ingest", "--format", "debezium-json-registry", "--path", str(dump)]
            + ["--option", f"url=http://127.0.0.1:{port}", "--key", "id"]
            + ["--target", str(target), "--checkpoint", str(tmp_path / "checkpoint")]
        )
    err = capsys.readouterr().err
    assert code == 0, err
    # recorded: a snapshot row (id 1), an insert (id 2), TRUNCATE, an insert (id 99)
    assert table_rows(target) == [{"id": 99, "label": "end"}]
    assert "1 truncate(s)" in err.splitlines()[-1] and f"{len(bodies)} messages read" in err.splitlines()[-1]


def test_the_summary_says_where_dead_letters_went_and_that_a_rerun_found_nothing_new(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded_file = tmp_path / "orders.jsonl"
    recorded_file.write_text(
        '{"before": null, "after": {"id": 1}, "op": "c"}\n'
        '{"before": null, "after": {"id": "x"}, "op": "c"}\n'
        '{"before": null, "after": {"id": 2}, "op": "c"}\n'
    )
    dead = tmp_path / "dead"
    command = ["ingest", "--path", str(recorded_file), "--schema", "id INT NOT NULL", "--key", "id"]
    command += ["--sequence-by", "none", "--option", f"deadLetterPath={dead}"]
    command += ["--target", str(tmp_path / "table"), "--checkpoint", str(tmp_path / "checkpoint")]

    assert main(command) == 0
    first = capsys.readouterr().err.splitlines()
    [letter] = read_dead_letters(str(dead))
    assert letter["line"] == 2
    assert first[-1].startswith("cdcflow ingest: done: 1 batch, 2 changes"), first
    assert f"3 messages read: 2 with changes (2 rows), 1 dead letter(s) in {dead}" in first[-1], first

    assert main(command) == 0
    again = capsys.readouterr().err.splitlines()
    version = DeltaTable(str(tmp_path / "table")).version()
    assert again[-1] == (
        f"cdcflow ingest: done: nothing new since the last run (0 changes); table version {version}, 2 rows"
    ), again
    assert table_rows(tmp_path / "table") == [{"id": 1}, {"id": 2}]


def test_relative_paths_are_the_callers_after_it_changed_directory(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process whose JVM is already up changes directory (a notebook's ``os.chdir``; here the test's)
    and runs ingest with relative paths: Spark's offsets and commits land in the checkpoint beside the
    lease, under Python's directory, not under the JVM's, and a rerun finds the batch done."""
    jvm_directory = Path(spark._jvm.java.lang.System.getProperty("user.dir"))  # type: ignore[union-attr]
    work = tmp_path / "work"
    work.mkdir()
    (work / "orders.jsonl").write_text(
        '{"before": null, "after": {"id": 1}, "op": "c"}\n{"before": null, "after": {"id": 2}, "op": "c"}\n'
    )
    checkpoint = f"checkpoint-{tmp_path.name}"
    monkeypatch.chdir(work)
    command = ["ingest", "--path", "orders.jsonl", "--schema", "id INT NOT NULL", "--key", "id"]
    command += ["--sequence-by", "none", "--target", "table", "--checkpoint", checkpoint]
    try:
        assert main(command) == 0
        version = DeltaTable(str(work / "table")).version()
        assert main(command) == 0
    finally:
        stray = jvm_directory / checkpoint
        found = stray.exists()
        if found and stray != work / checkpoint:
            shutil.rmtree(stray)
    assert not found or jvm_directory == work, f"Spark's checkpoint went under the JVM's directory: {stray}"
    assert {p.name for p in (work / checkpoint).iterdir()} >= {"offsets", "commits", "cdcflow-lease"}
    assert table_rows(work / "table") == [{"id": 1}, {"id": 2}]
    assert DeltaTable(str(work / "table")).version() == version, "the rerun applied the batch again"
