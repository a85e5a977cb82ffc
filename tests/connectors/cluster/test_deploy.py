"""docs/deploy.md's ``spark-submit`` command, as written there (only the master URL and the paths
replaced), ingests on the standalone cluster, resumes from its checkpoint, and leaves the table the
same ingestion leaves in local mode."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from delta_fold import deltalake_rows, fold, parse_line, rendered_rows
from pyspark.sql import SparkSession
from source_cases import EXCLUDE, GOLDEN_ROWS, LINE_OF_ROW, PRODUCTS, SCHEMA
from sources_app import assert_both_executors_ran_tasks
from standalone import StandaloneCluster, spark_env

from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest

pytestmark = pytest.mark.integration
DOC = Path(__file__).resolve().parents[3] / "docs" / "deploy.md"
BASH = shutil.which("bash") or "/bin/bash"
FIRST_RUN_LINES = 10
"""The recorded events the first run sees, in two files; the rest arrive before the second run."""


def documented_command() -> str:
    found = re.search(r"<!-- deploy-command:[^\n]*-->\n```bash\n(.*?)```", DOC.read_text(), re.S)
    assert found is not None, "docs/deploy.md lost its tested spark-submit block"
    return found.group(1)


def arrive(incoming: Path, run: int) -> None:
    lines = EXCLUDE.read_bytes().splitlines(keepends=True)
    incoming.mkdir(parents=True, exist_ok=True)
    if run == 1:
        (incoming / "part-1.json").write_bytes(b"".join(lines[:5]))
        (incoming / "part-2.json").write_bytes(b"".join(lines[5:FIRST_RUN_LINES]))
    else:
        (incoming / "part-3.json").write_bytes(b"".join(lines[FIRST_RUN_LINES:]))


def expected_table(last_line: int) -> list[str]:
    """Flink's changelog of the events up to ``last_line``, folded by key."""
    lines = [row for row, line in zip(GOLDEN_ROWS, LINE_OF_ROW, strict=True) if line <= last_line]
    return fold(parse_line(text, SCHEMA, ["id"]) for text in lines)


def test_the_documented_spark_submit_ingests_on_the_cluster_and_resumes(
    standalone: StandaloneCluster, spark: SparkSession, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    command = (
        documented_command()
        .replace("spark://spark-master:7077", standalone.master_url)
        .replace("/opt/cdcflow/venv", sys.prefix)
        .replace("/shared", str(shared))
    )
    # Cluster-wide defaults of the test cluster, outside the documented command: both executors
    # registered before the first task, so that each gets tasks; loopback only; no application UI.
    conf = tmp_path / "spark-conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        "spark.scheduler.minRegisteredResourcesRatio 1.0\n"
        "spark.scheduler.maxRegisteredResourcesWaitingTime 60s\n"
        "spark.driver.host 127.0.0.1\n"
        "spark.driver.bindAddress 127.0.0.1\n"
        "spark.executorEnv.CDCFLOW_STRICT_DECODE 1\n"
        "spark.ui.enabled false\n"
    )
    env = spark_env(SPARK_CONF_DIR=str(conf))
    del env["PYSPARK_PYTHON"], env["PYSPARK_DRIVER_PYTHON"]  # the command sets what it needs
    env["PATH"] = "/usr/bin:/bin"
    target = shared / "lake" / "products"
    local_input, local_target = tmp_path / "local" / "incoming", tmp_path / "local" / "table"
    local = IngestConfig(
        format="debezium-json",
        key=("id",),
        target=str(local_target),
        checkpoint=str(tmp_path / "local" / "checkpoint"),
        path=str(local_input),
        schema=PRODUCTS,
    )

    versions = []
    standalone.wait_ready()
    for run, last_line in ((1, FIRST_RUN_LINES), (2, len(EXCLUDE.read_bytes().splitlines()))):
        arrive(shared / "incoming" / "inventory.products", run)
        before = standalone.applications()
        log = tmp_path / f"run{run}.log"
        with log.open("wb") as out:
            documented = subprocess.Popen(  # noqa: S603 - the documented command, in bash
                [BASH, "-euo", "pipefail", "-c", command], stdout=out, stderr=subprocess.STDOUT, env=env
            )
            try:
                # The same ingestion in local mode, in this process's session while the cluster's runs.
                arrive(local_input, run)
                ingest(local, spark)
                documented.wait(timeout=300)
            finally:
                if documented.poll() is None:
                    documented.kill()
                    documented.wait()
        text = log.read_text(errors="replace")
        assert documented.returncode == 0, text[-4000:]
        (app,) = standalone.applications() - before
        if run == 1:
            assert_both_executors_ran_tasks(standalone, app)
        assert rendered_rows(deltalake_rows(str(target)), SCHEMA) == expected_table(last_line)
        assert deltalake_rows(str(target)) and sorted(
            deltalake_rows(str(target)), key=lambda row: row["id"]
        ) == sorted(deltalake_rows(str(local_target)), key=lambda row: row["id"])
        versions.append(re.findall(r"table version (\d+)", text)[-1])
    # The second run applied only what arrived after the first: one more commit, the first's not again.
    assert int(versions[1]) == int(versions[0]) + 1, versions
