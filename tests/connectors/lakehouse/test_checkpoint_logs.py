"""A query started under ``local_logs`` writes its streaming logs through Hadoop's FileSystem API, on a
real Spark session: across micro-batches and a restart from its checkpoint, and only that query."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from cdcflow.connectors.lakehouse.checkpoint_logs import FILE_SYSTEM_MANAGER, MANAGER_KEY, local_logs

FILE_CONTEXT_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
)


def _run(spark: SparkSession, source: Path, checkpoint: Path, *, scoped: bool) -> tuple[str, str, int]:
    """Run a file → noop query to its end; its offset and commit logs' manager classes, rows read."""
    writer = (
        spark.readStream.option("maxFilesPerTrigger", 1)
        .text(str(source))
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    if scoped:
        with local_logs(spark, str(checkpoint)):
            query = writer.start()
    else:
        query = writer.start()
    query.awaitTermination()
    execution = query._jsq.streamingQuery()  # type: ignore[attr-defined]
    managers = (
        execution.offsetLog().fileManager().getClass().getName(),
        execution.commitLog().fileManager().getClass().getName(),
    )
    return managers[0], managers[1], sum(p["numInputRows"] for p in query.recentProgress)


def test_a_local_checkpoint_writes_its_logs_through_the_file_system_api_across_a_restart(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    for name in ("a", "b"):
        (source / f"{name}.txt").write_text(f"{name}1\n{name}2\n")
    checkpoint = tmp_path / "checkpoint"
    assert _run(spark, source, checkpoint, scoped=True) == (FILE_SYSTEM_MANAGER, FILE_SYSTEM_MANAGER, 4)
    assert len(list((checkpoint / "commits").glob("[0-9]*"))) == 2  # two micro-batches committed
    assert spark.conf.get(MANAGER_KEY, None) is None  # set for the start only
    (source / "c.txt").write_text("c1\n")
    # Restarted from the logs it wrote: only the new file is read.
    assert _run(spark, source, checkpoint, scoped=True)[2] == 1
    # A query started without it keeps Spark's default.
    assert _run(spark, source, tmp_path / "other", scoped=False)[:2] == (
        FILE_CONTEXT_MANAGER,
        FILE_CONTEXT_MANAGER,
    )


@pytest.mark.parametrize("where", ["session", "hadoop"])
def test_a_manager_the_user_set_is_kept(spark: SparkSession, tmp_path: Path, where: str) -> None:
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.txt").write_text("a\n")
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
    if where == "session":
        spark.conf.set(MANAGER_KEY, FILE_CONTEXT_MANAGER)
    else:  # as spark.hadoop.<key> or core-site.xml would
        hadoop.set(MANAGER_KEY, FILE_CONTEXT_MANAGER)
    try:
        assert _run(spark, source, tmp_path / "checkpoint", scoped=True) == (
            FILE_CONTEXT_MANAGER,
            FILE_CONTEXT_MANAGER,
            1,
        )
        assert (spark.conf.get(MANAGER_KEY, None) == FILE_CONTEXT_MANAGER) is (where == "session")
    finally:
        spark.conf.unset(MANAGER_KEY)
        hadoop.unset(MANAGER_KEY)


class _Untouchable:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the session was used ({name}) for a checkpoint on an object store")


@pytest.mark.parametrize("checkpoint", ["s3a://bucket/checkpoint", "abfss://c@a.dfs.core.windows.net/x"])
def test_a_checkpoint_on_an_object_store_is_left_to_spark(checkpoint: str) -> None:
    with local_logs(_Untouchable(), checkpoint):  # type: ignore[arg-type]
        pass


class _ConnectSession:
    """A Spark Connect session as the module sees it: no JVM to ask."""

    _jvm = None

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the session was used ({name}) through Spark Connect")


def test_a_spark_connect_session_keeps_its_servers_setting(tmp_path: Path) -> None:
    with local_logs(_ConnectSession(), str(tmp_path / "checkpoint")):  # type: ignore[arg-type]
        pass
