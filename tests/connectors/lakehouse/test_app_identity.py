"""The application id belongs to its checkpoint: a reused id with a new checkpoint, or a checkpoint
continued under another id, is refused with what to do, never skipped silently."""

from __future__ import annotations

import io
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest
from cdcflow.connectors.lakehouse.sink import DeltaSink, apply_changes, apply_options

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("_row_kind", pa.string())])


class _Frame:
    """What ``foreachBatch`` hands the sink, as far as the sink looks at it."""

    def __init__(self, *rows: tuple[int, str]) -> None:
        self.table = pa.Table.from_pylist(
            [{"id": key, "name": name, "_row_kind": "+I"} for key, name in rows], schema=SCHEMA
        )
        self.columns = SCHEMA.names

    def toArrow(self) -> pa.Table:  # noqa: N802 - Spark's name
        return self.table


def frame(*rows: tuple[int, str]) -> Any:
    """A micro-batch of inserts (typed as Any: it stands in for a Spark DataFrame)."""
    return _Frame(*rows)


def names(target: Path) -> dict[int, str]:
    return {r["id"]: r["name"] for r in DeltaTable(str(target)).to_pyarrow_table().to_pylist()}


def test_the_sink_refuses_an_app_id_with_a_checkpoint_it_does_not_belong_to(tmp_path: Path) -> None:
    target, options = tmp_path / "table", apply_options(["id"])
    first = DeltaSink(str(target), options, str(tmp_path / "chk-1"), app_id="orders")
    for batch_id in range(3):
        first(frame((batch_id, f"row {batch_id}")), batch_id)
    assert names(target) == {0: "row 0", 1: "row 1", 2: "row 2"}

    # a new checkpoint numbers its batches from 0 again: under the same id they would all be skipped
    fresh = DeltaSink(str(target), options, str(tmp_path / "chk-2"), app_id="orders")
    with pytest.raises(
        ConnectorOptionError, match=r"choose a new app id .* restore the checkpoint"
    ) as refused:
        fresh(frame((0, "changed"), (7, "new")), 0)
    assert "'orders' already applied batches up to 2" in str(refused.value)
    assert names(target) == {0: "row 0", 1: "row 1", 2: "row 2"}
    assert fresh.progress.batches == 0, "nothing was counted as a skipped replay"

    # a checkpoint continued under another id
    with pytest.raises(ConnectorOptionError, match="as application id 'orders', not 'other'"):
        DeltaSink(str(target), options, str(tmp_path / "chk-1"), app_id="other")(frame((3, "x")), 3)

    # the checkpoint with its own id continues: replays skipped, new batches applied
    again = DeltaSink(str(target), options, str(tmp_path / "chk-1"), app_id="orders")
    again(frame((2, "replayed")), 2)
    again(frame((3, "row 3")), 3)
    assert names(target) == {0: "row 0", 1: "row 1", 2: "row 2", 3: "row 3"}
    assert again.progress.skipped == 1

    # a new id with a new checkpoint applies everything again
    DeltaSink(str(target), options, str(tmp_path / "chk-3"), app_id="orders-2")(frame((0, "again")), 0)
    assert names(target)[0] == "again"


def test_a_checkpoint_written_before_the_id_was_recorded_keeps_working(tmp_path: Path) -> None:
    target, options = tmp_path / "table", apply_options(["id"])
    DeltaSink(str(target), options, str(tmp_path / "chk"), app_id="orders")(frame((0, "a")), 0)
    (tmp_path / "chk" / "cdcflow-app-id").unlink()  # as an older cdcflow left it, with Spark's commit log
    (tmp_path / "chk" / "commits").mkdir()
    (tmp_path / "chk" / "commits" / "0").write_text("v1\n{}\n", encoding="utf-8")

    sink = DeltaSink(str(target), options, str(tmp_path / "chk"), app_id="orders")
    sink(frame((0, "replayed")), 0)
    sink(frame((1, "b")), 1)

    assert names(target) == {0: "a", 1: "b"}
    assert (tmp_path / "chk" / "cdcflow-app-id").read_text(encoding="utf-8").strip() == "orders"


def _config(tmp_path: Path, checkpoint: str, app_id: str | None = None) -> IngestConfig:
    dump = resources.files("cdcflow.examples").joinpath("postgres-debezium.dump.jsonl")
    return IngestConfig(
        format="debezium-json",
        key=("id",),
        target=str(tmp_path / "table"),
        checkpoint=str(tmp_path / checkpoint),
        path=str(dump),
        options={"schema-include": "true", "maxBytesPerTrigger": "60000"},
        app_id=app_id,
    )


def _rows(tmp_path: Path) -> str:
    """The table's rows in key order, as text (the recording holds NaN, which equals nothing)."""
    return repr(
        sorted(DeltaTable(str(tmp_path / "table")).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    )


def test_ingest_and_apply_changes_refuse_a_reused_app_id_with_a_new_checkpoint(
    spark: SparkSession, tmp_path: Path
) -> None:
    first = ingest(_config(tmp_path, "chk-1", "orders"), spark, out=io.StringIO())
    assert first.batches >= 3
    landed = _rows(tmp_path)
    DeltaTable(str(tmp_path / "table")).delete()  # emptied: whatever runs next must refill it, or refuse

    with pytest.raises(ConnectorOptionError, match="choose a new app id"):
        ingest(_config(tmp_path, "chk-2", "orders"), spark, out=io.StringIO())
    config = _config(tmp_path, "chk-3", "orders")
    changelog = spark.readStream.format(config.source).options(**config.source_options()).load()
    with pytest.raises(ConnectorOptionError, match="restore the checkpoint"):
        apply_changes(changelog, config.target, key=["id"], checkpoint=config.checkpoint, app_id="orders")
    assert _rows(tmp_path) == "[]"

    again = ingest(_config(tmp_path, "chk-2", "orders-2"), spark, out=io.StringIO())
    assert again.progress.skipped == 0
    assert _rows(tmp_path) == landed


def test_without_an_app_id_a_new_checkpoint_applies_everything_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    config = _config(tmp_path, "chk")
    first = ingest(config, spark, out=io.StringIO())
    assert first.batches >= 3
    landed = _rows(tmp_path)
    DeltaTable(config.target).delete()
    shutil.rmtree(config.checkpoint)

    again = ingest(config, spark, out=io.StringIO())

    assert again.progress.skipped == 0
    assert _rows(tmp_path) == landed
