"""The ``cdc-*`` sources through Spark Connect, from a client in another process: what docs/deploy.md
says works (batch and streaming reads, by name or registered by the client) and what does not (the
ingest job's ``foreachBatch``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from connect_server import ConnectServer
from golden_cases import GOLDEN, TESTDATA, load
from source_cases import EXCLUDE, GOLDEN_ROWS, LINE_OF_ROW, ProductsTopic, render
from standalone import spark_env

from cdcflow import from_changelog

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent
CANAL = TESTDATA / "flink" / "canal-data.txt"
CANAL_ROWS = load(GOLDEN / "flink-canal-data.golden").rows


def test_cdc_sources_through_spark_connect(
    connect_server: ConnectServer, products: ProductsTopic, tmp_path: Path
) -> None:
    out = tmp_path / "connect.json"
    client = subprocess.run(  # noqa: S603 - our own client script
        [
            sys.executable,
            str(HERE / "connect_job.py"),
            *(connect_server.url, str(out), str(EXCLUDE), str(CANAL)),
            *(products.bootstrap, products.name, str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        env=spark_env(),
        timeout=400,
        check=False,
    )
    assert client.returncode == 0, client.stderr[-4000:]
    results = json.loads(out.read_text())
    assert results["remote"].startswith("pyspark.sql.connect")

    file_rows = results["file_batch"]["ok"]
    assert [render(row) for row in file_rows] == GOLDEN_ROWS
    assert [row["line"] for row in file_rows] == LINE_OF_ROW

    for name in ("kafka_batch", "stream"):
        rows = results[name]["ok"]
        assert sorted(render(row) for row in rows) == sorted(GOLDEN_ROWS), name
        assert {row["partition"] for row in rows} == {0, 1}, name
    assert len(results["stream"]["ok"]) == len(results["kafka_batch"]["ok"])

    assert [render(row) for row in results["registered_by_the_client"]["ok"]] == CANAL_ROWS
    engine = from_changelog(
        [
            {"op": "c", "id": 1, "name": "a"},
            {"op": "u", "id": 1, "name": "b"},
            {"op": "d", "id": 1, "name": "b"},
        ],
        op_mapping={"c": "INSERT", "u": "UPDATE_BEFORE, UPDATE_AFTER", "d": "DELETE"},
        state_ttl=0,
        partition_by="id",
    )
    expected = [{**change.row, "_row_kind": change.kind.value} for change in engine]
    assert results["sql_function"]["ok"] == expected

    refused = results["ingest"]
    assert refused.get("error") == "PySparkPicklingError", refused
    assert "STREAMING_CONNECT_SERIALIZATION_ERROR" in refused["message"]
