"""The ``cdc-*`` sources and sinks on a standalone cluster (separate executor JVMs and Python workers)
give what they give in local mode, with tasks run by both workers' executors."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from kafka_fixture import KafkaCluster, unique_topic
from pyspark.sql import SparkSession
from read_job import read
from sink_job import write
from source_cases import EXCLUDE, GOLDEN_ROWS, PRODUCTS, ProductsTopic, render
from standalone import VENV_PYTHON, StandaloneCluster, cluster_conf, spark_submit

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent


def submit(cluster: StandaloneCluster, script: str, args: list[str], log: Path) -> str:
    """Runs the driver script on the cluster; the application's id."""
    before = cluster.applications()
    result = spark_submit([*cluster_conf(cluster), str(HERE / script), *args], log)
    assert result.returncode == 0, log.read_text(errors="replace")[-4000:]
    (app,) = cluster.applications() - before
    return app


def as_json(result: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(json.dumps(result, default=str))
    return loaded


def assert_both_executors_ran_tasks(cluster: StandaloneCluster, app: str) -> dict[str, int]:
    tasks = cluster.tasks_by_executor(app)
    workers = {name.split("/")[0] for name, count in tasks.items() if count > 0}
    assert workers == {"worker1", "worker2"}, tasks
    return tasks


def run_read(
    cluster: StandaloneCluster, spark: SparkSession, tmp_path: Path, kind: str, *where: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    out = tmp_path / "cluster.json"
    app = submit(cluster, "read_job.py", [str(out), kind, *where], tmp_path / "read.log")
    on_cluster = json.loads(out.read_text())
    assert on_cluster["master"] == cluster.master_url
    assert_both_executors_ran_tasks(cluster, app)
    tasks = on_cluster["tasks"]
    assert {task["python"] for task in tasks} == {VENV_PYTHON}
    # Each task ran in its executor's directory, <worker dir>/<app>/<executor id>, by a Python worker there.
    places = {Path(task["cwd"]).relative_to(Path(task["cwd"]).parents[2]).parts[0] for task in tasks}
    assert places == {"worker1", "worker2"}, tasks
    assert len({task["pid"] for task in tasks}) >= 2
    return on_cluster, as_json(read(spark, kind, *where))


def test_recorded_files_read_on_the_cluster_as_in_local_mode(
    standalone: StandaloneCluster, spark: SparkSession, tmp_path: Path
) -> None:
    on_cluster, local = run_read(standalone, spark, tmp_path, "file", str(EXCLUDE))
    assert on_cluster["partitions"] == local["partitions"] >= 4
    assert sum(task["rows"] for task in on_cluster["tasks"]) == len(GOLDEN_ROWS)
    assert on_cluster["rows"] == local["rows"]
    assert [render(row) for row in on_cluster["rows"]] == GOLDEN_ROWS
    assert [row["line"] for row in on_cluster["rows"]][:3] == [1, 2, 3]


def test_a_kafka_topic_read_on_the_cluster_as_in_local_mode(
    standalone: StandaloneCluster, spark: SparkSession, products: ProductsTopic, tmp_path: Path
) -> None:
    on_cluster, local = run_read(standalone, spark, tmp_path, "kafka", products.bootstrap, products.name)
    assert {row["partition"] for row in on_cluster["rows"]} == {0, 1}
    assert on_cluster["partitions"] == local["partitions"] >= 4
    assert on_cluster["rows"] == local["rows"]
    assert sorted(render(row) for row in on_cluster["rows"]) == sorted(GOLDEN_ROWS)


def changes_by_key(spark: SparkSession, bootstrap: str, topic: str) -> dict[int, list[str]]:
    """The changelog read back from ``topic``, each key's changes in the order of its partition."""
    rows = (
        spark.read.format("cdc-maxwell")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("columns", PRODUCTS)
        .option("metadata", "partition,offset")
        .load()
        .toArrow()
        .to_pylist()
    )
    by_key: dict[int, list[str]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: (r["partition"], r["offset"])):
        by_key[row["id"]].append(render(row))
    return dict(by_key)


def test_a_sink_writes_from_the_cluster_what_it_writes_in_local_mode(
    standalone: StandaloneCluster, spark: SparkSession, kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    remote, local = unique_topic("cluster-sink"), unique_topic("local-sink")
    for topic in (remote, local):
        kafka_cluster.create_topic(topic, 2)
    app = submit(standalone, "sink_job.py", [str(EXCLUDE), bootstrap, remote], tmp_path / "sink.log")
    assert_both_executors_ran_tasks(standalone, app)
    write(spark, str(EXCLUDE), bootstrap, local)

    written = changes_by_key(spark, bootstrap, remote)
    expected: dict[int, list[str]] = defaultdict(list)
    for line in GOLDEN_ROWS:
        expected[int(line[3 : line.index(",")])].append(line)
    assert written == dict(expected)  # every key's changes, in the changelog's order
    assert written == changes_by_key(spark, bootstrap, local)
