"""The Spark back end (Delta Lake's jars): exactly once by Delta's own transaction ids, the same tables
as delta-rs (either back end continues the other's), and a clear error when Delta is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from backends import delta_reader_rows
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from state_crash import crash_before_next_state_commit

from cdcflow.connectors.errors import ConnectorOptionError, SparkSetupError
from cdcflow.connectors.lakehouse.delta.apply import DeltaChangeApplier
from cdcflow.connectors.lakehouse.delta.merge import Merge
from cdcflow.connectors.lakehouse.delta.options import ApplyOptions
from cdcflow.connectors.lakehouse.delta.tables import DELTA_RS, TableBackend
from cdcflow.connectors.lakehouse.ingest import IngestConfig
from cdcflow.connectors.lakehouse.spark_backend import SparkDeltaBackend, delta_jars

pytestmark = pytest.mark.integration

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int32(), nullable=False),
        ("name", pa.string()),
        ("body", pa.string()),
        ("seq", pa.int64()),
        ("unavailable", pa.list_(pa.string())),
        pa.field("_row_kind", pa.string(), nullable=False),
    ]
)


def change(
    kind: str, id: int, seq: int, name: str | None = None, body: str | None = None, **more: Any
) -> dict[str, Any]:  # noqa: A002, E501
    return {"_row_kind": kind, "id": id, "name": name, "body": body, "seq": seq, "unavailable": None, **more}


def batch(*rows: dict[str, Any]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=SCHEMA)


def applier(tmp_path: Path, backend: TableBackend) -> DeltaChangeApplier:
    options = ApplyOptions(
        key=("id",), sequence_by="seq", upsert_key=("id",), unavailable_column="unavailable"
    )
    return DeltaChangeApplier(
        str(tmp_path / "table"), options, app_id="app", state_path=str(tmp_path / "state"), backend=backend
    )


def rows_by_deltalake(path: Path) -> dict[int, tuple[Any, ...]]:
    return {r["id"]: (r["name"], r["body"]) for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist()}


def rows_by_spark(spark: SparkSession, path: Path) -> dict[int, tuple[Any, ...]]:
    return {r["id"]: (r["name"], r["body"]) for r in delta_reader_rows(spark, str(path))}


def transactions(table: Path) -> list[tuple[str, int]]:
    """The ``txn`` actions of the table's JSON commits, in commit order (written by either back end)."""
    found = []
    for commit in sorted((table / "_delta_log").glob("*.json"), key=lambda p: int(p.stem)):
        for line in commit.read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "txn" in action:
                found.append((action["txn"]["appId"], int(action["txn"]["version"])))
    return found


BATCH_0 = batch(
    change("+I", 1, 1, "a", "long text"), change("+I", 2, 2, "b", "two"), change("+I", 3, 3, "c", "three")
)
BATCH_1 = batch(
    change("-U", 1, 4, "a", None, unavailable=["body"]),
    change("+U", 1, 4, "a2", None, unavailable=["body"]),
    change("-D", 2, 5, "b", "two"),
    change("+I", 2, 1, "late", "late"),  # older than the key's sequence: ignored
    change("+I", 4, 6, "d", None, unavailable=["body"]),  # nothing earlier to keep: lands NULL
)
AFTER_1 = {1: ("a2", "long text"), 3: ("c", "three"), 4: ("d", None)}


def test_spark_back_end_applies_each_batch_once_and_skips_a_replay(
    spark: SparkSession, tmp_path: Path
) -> None:
    backend = SparkDeltaBackend(spark)
    sink = applier(tmp_path, backend)
    sink.apply(BATCH_0, 0)
    first = sink.apply(BATCH_1, 1)
    assert (first.upserts, first.deletes, first.late, first.unavailable_unfilled) == (2, 1, 1, 1)
    version = DeltaTable(str(tmp_path / "table")).version()

    replay = sink.apply(BATCH_1, 1)

    assert replay.skipped
    assert DeltaTable(str(tmp_path / "table")).version() == version
    # The back end's merges run in a session of its own; the caller's stays the active one.
    active = SparkSession.getActiveSession()
    assert active is not None and active._jsparkSession.equals(spark._jsparkSession)
    assert rows_by_deltalake(tmp_path / "table") == AFTER_1 == rows_by_spark(spark, tmp_path / "table")
    for table in (tmp_path / "table", tmp_path / "state"):
        assert transactions(table) == [("app", 0), ("app", 1)]
        opened = backend.open(str(table))
        assert opened is not None
        # Delta's Spark snapshot and deltalake read the same application transaction.
        assert opened.applied_version("app") == DeltaTable(str(table)).transaction_version("app") == 1


def test_spark_back_end_takes_relative_table_paths(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--target lake/t`` as delta-rs takes it: Spark SQL reads ``delta.`lake/t``` as a table name."""
    monkeypatch.chdir(tmp_path)
    sink = applier(Path("lake"), SparkDeltaBackend(spark))
    sink.apply(BATCH_0, 0)
    sink.apply(BATCH_1, 1)
    assert rows_by_deltalake(tmp_path / "lake" / "table") == AFTER_1


def test_delta_itself_skips_a_merge_whose_batch_the_table_has(spark: SparkSession, tmp_path: Path) -> None:
    """The merge of a batch id the table already recorded commits nothing: Delta's txnAppId/txnVersion
    check, not the applier's, so a driver that re-runs a merge it lost track of cannot apply it twice."""
    backend = SparkDeltaBackend(spark)
    applier(tmp_path, backend).apply(BATCH_0, 0)
    table = backend.open(str(tmp_path / "table"))
    assert table is not None
    version = table.version()
    source = pa.table({"id": pa.array([9], pa.int32()), "name": ["x"], "_cdcflow_op": ["U"]})

    assert table.merge(Merge(source, ["id"], "app", 0)) == version
    assert 9 not in rows_by_spark(spark, tmp_path / "table")
    assert table.merge(Merge(source, ["id"], "app", 1)) == version + 1
    assert rows_by_deltalake(tmp_path / "table")[9] == ("x", None)
    for session in (spark, backend.spark):
        assert session.conf.get("spark.databricks.delta.write.txnAppId", None) is None, "the setting leaked"


def test_spark_back_end_catches_up_a_crash_between_the_table_and_the_key_state_commits(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = applier(tmp_path, SparkDeltaBackend(spark))
    sink.apply(BATCH_0, 0)
    crash_before_next_state_commit(monkeypatch)
    with pytest.raises(RuntimeError, match="state commit"):
        sink.apply(BATCH_1, 1)
    version = DeltaTable(str(tmp_path / "table")).version()
    assert not sink.done(1)

    replay = sink.apply(BATCH_1, 1)

    assert not replay.skipped and replay.table_version is None
    assert DeltaTable(str(tmp_path / "table")).version() == version, "the table is not merged twice"
    assert transactions(tmp_path / "state") == [("app", 0), ("app", 1)]
    assert rows_by_spark(spark, tmp_path / "table") == AFTER_1


@pytest.mark.parametrize(("first", "second"), [("delta-rs", "spark"), ("spark", "delta-rs")])
def test_one_back_end_continues_the_tables_of_the_other(
    spark: SparkSession, tmp_path: Path, first: str, second: str
) -> None:
    """Same table, same key state, same application id: batch 1 (which needs batch 0's row for an
    unavailable value and its sequence for a late change) by the other back end, and its replay
    skipped by the first."""
    backends: dict[str, TableBackend] = {"delta-rs": DELTA_RS, "spark": SparkDeltaBackend(spark)}
    applier(tmp_path, backends[first]).apply(BATCH_0, 0)

    applied = applier(tmp_path, backends[second]).apply(BATCH_1, 1)

    assert (applied.late, applied.unavailable_unfilled) == (1, 1)
    assert applier(tmp_path, backends[first]).apply(BATCH_1, 1).skipped
    assert rows_by_deltalake(tmp_path / "table") == AFTER_1 == rows_by_spark(spark, tmp_path / "table")
    assert transactions(tmp_path / "table") == [("app", 0), ("app", 1)]


def test_spark_back_end_adds_a_new_column(spark: SparkSession, tmp_path: Path) -> None:
    sink = applier(tmp_path, SparkDeltaBackend(spark))
    sink.apply(BATCH_0, 0)
    wider = SCHEMA.insert(3, pa.field("color", pa.string()))
    rows = [change("+U", 3, 7, "c", "three", color="red"), change("+I", 5, 8, "e", "five", color="blue")]

    sink.apply(pa.Table.from_pylist(rows, schema=wider), 1)

    got = {r["id"]: r["color"] for r in delta_reader_rows(spark, str(tmp_path / "table"))}
    assert got == {1: None, 2: None, 3: "red", 5: "blue"}
    assert {
        r["id"]: r["color"] for r in DeltaTable(str(tmp_path / "table")).to_pyarrow_table().to_pylist()
    } == got


def test_delta_jars_must_name_delta_spark(tmp_path: Path) -> None:
    with pytest.raises(SparkSetupError, match="neither a jar file nor a folder"):
        delta_jars(str(tmp_path / "missing"))
    with pytest.raises(SparkSetupError, match="no delta-spark jar"):
        delta_jars(str(tmp_path))


def test_ingest_with_the_spark_back_end_and_no_delta_jars_says_how_to_supply_them(tmp_path: Path) -> None:
    environment = {
        k: v for k, v in os.environ.items() if k not in ("CDCFLOW_DELTA_JARS", "PYSPARK_GATEWAY_PORT")
    }
    done = subprocess.run(  # noqa: S603 - our own command
        [
            sys.executable,
            "-m",
            "cdcflow",
            "ingest",
            "--backend",
            "spark",
            "--target",
            str(tmp_path / "t"),
            "--checkpoint",
            str(tmp_path / "c"),
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
        check=False,
    )
    assert done.returncode != 0
    assert "Delta Lake's classes are not in this Spark session" in done.stderr, done.stderr[-2000:]
    assert "--delta-jars" in done.stderr and "--packages io.delta:delta-spark_2.13:4.4.0" in done.stderr
    assert not (tmp_path / "t").exists()


def test_the_back_end_is_chosen_by_flag_or_config_file_and_defaults_to_delta_rs(tmp_path: Path) -> None:
    from cdcflow.cli import _parser
    from cdcflow.cli.ingest import config_from, settings

    def config(*argv: str) -> IngestConfig:
        parsed = _parser().parse_args(
            ["ingest", "--path", "x", "--key", "id", "--target", "t", "--checkpoint", "c", *argv]
        )
        return config_from(settings(parsed))[0]  # type: ignore[no-any-return]

    assert config().backend == "delta-rs"
    chosen = config("--backend", "spark", "--delta-jars", "/opt/delta")
    assert (chosen.backend, chosen.delta_jars) == ("spark", "/opt/delta")
    toml = tmp_path / "ingest.toml"
    toml.write_text('backend = "spark"\ndelta-jars = "/opt/delta"\n')
    from_file = config("--config", str(toml))
    assert (from_file.backend, from_file.delta_jars) == ("spark", "/opt/delta")
    with pytest.raises(SystemExit):
        config("--backend", "duckdb")
    with pytest.raises(ConnectorOptionError, match="--backend must be one of delta-rs, spark"):
        IngestConfig(
            format="debezium-json", key=("id",), target="t", checkpoint="c", path="x", backend="duckdb"
        )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "when", ["at creation", "added later", "by a run killed before it listed the feature"]
)
def test_delta_rs_tables_with_timestamp_ntz_and_not_null_keys_read_on_spark(
    spark: SparkSession, tmp_path: Path, when: str
) -> None:
    """A TIMESTAMP_NTZ column gives delta-rs's table a table-features protocol without NOT NULL's
    ``invariants`` feature, which Delta Lake on Spark refuses (DELTA_FEATURES_PROTOCOL_METADATA_MISMATCH).
    Creating lists it in a second commit: a job killed between the two leaves the table without it, and
    the next run's merge lists it (the crash test's seed 20261129 on S3 killed there)."""
    from datetime import datetime

    from cdcflow.connectors.lakehouse.delta.tables import conform, create_table

    path = str(tmp_path / "table")
    ntz = pa.field("at", pa.timestamp("us"))
    first = [pa.field("id", pa.int64()), pa.field("name", pa.string())]
    if when.startswith("by a run killed"):
        not_null = [pa.field("id", pa.int64(), nullable=False), first[1], ntz]
        table = DeltaTable.create(path, schema=pa.schema(not_null))  # the first of create_table's commits
    else:
        table = create_table(path, pa.schema(first + [ntz] if when == "at creation" else first), ["id"])
    at = datetime(2024, 5, 6, 7, 8, 9)
    rows = pa.table({"id": [1], "name": ["a"], "at": [at]}, pa.schema([*first, ntz]))
    data = conform(table, rows, ["id"], path)
    DeltaTable(path).merge(data, "t.id = s.id", "s", "t").when_not_matched_insert_all().execute()

    assert "timestampNtz" in (DeltaTable(path).protocol().writer_features or [])
    assert delta_reader_rows(spark, path) == [{"id": 1, "name": "a", "at": at}]


@pytest.mark.parametrize("back_end", ["delta-rs", "spark", "spark, typeWidening enabled"])
def test_a_column_whose_type_widens_is_widened_in_the_table(
    spark: SparkSession, tmp_path: Path, back_end: str
) -> None:
    """A batch whose ``qty`` is BIGINT (the source's ``ALTER COLUMN qty TYPE bigint``) after batches of
    INT, with a value no INT holds: the Delta column becomes BIGINT and keeps every value. The table is
    rewritten once (delta-rs cannot read a table with Delta's typeWidening feature), unless its owner
    enabled typeWidening: then the Spark back end changes the type in the metadata alone."""
    backend = DELTA_RS if back_end == "delta-rs" else SparkDeltaBackend(spark)
    sink = applier(tmp_path, backend)
    table = tmp_path / "table"
    narrow = SCHEMA.insert(3, pa.field("qty", pa.int32()))
    first = [change("+I", 1, 1, "a", qty=5), change("+I", 2, 2, "b", qty=6)]
    sink.apply(pa.Table.from_pylist(first, narrow), 0)
    feature = back_end.endswith("enabled")
    if feature:
        spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
    wide = SCHEMA.insert(3, pa.field("qty", pa.int64()))
    second = [change("+U", 2, 3, "b", qty=2**40), change("+I", 3, 4, "c", qty=-7)]
    sink.apply(pa.Table.from_pylist(second, wide), 1)
    want = {1: 5, 2: 2**40, 3: -7}
    assert {r["id"]: r["qty"] for r in delta_reader_rows(spark, str(table))} == want
    assert [version for _, version in transactions(table)] == [0, 1]
    operations = [
        json.loads(line)["commitInfo"]["operation"]
        for commit in sorted((table / "_delta_log").glob("*.json"), key=lambda p: int(p.stem))
        for line in commit.read_text().splitlines()
        if '"commitInfo"' in line
    ]
    rewrites = [op for op in operations if op in ("WRITE", "CREATE OR REPLACE TABLE")]
    if feature:
        assert "CHANGE COLUMN" in operations and not rewrites, operations
        with pytest.raises(Exception, match="typeWidening"):
            DeltaTable(str(table)).to_pyarrow_table()
        return
    assert len(rewrites) == 1, operations  # the one rewrite with the wider type
    assert pa.schema(DeltaTable(str(table)).schema().to_arrow()).field("qty").type == pa.int64()
    assert {r["id"]: r["qty"] for r in DeltaTable(str(table)).to_pyarrow_table().to_pylist()} == want
