"""The ``cdc-*`` sources and sinks on a standalone cluster (separate executor JVMs and Python workers)
give what they give in local mode, with tasks run by both workers' executors.

The cluster side of all three tests is one application (sources_job.py, the ``on_cluster`` fixture): a
file read, a Kafka read and a sink write, each phase's tasks told apart by the stages of its jobs. The
local-mode side runs in this process's session while the application runs."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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
    cluster.wait_ready()
    before = cluster.applications()
    result = spark_submit([*cluster_conf(cluster), str(HERE / script), *args], log)
    assert result.returncode == 0, log.read_text(errors="replace")[-4000:]
    (app,) = cluster.applications() - before
    return app


def as_json(result: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(json.dumps(result, default=str))
    return loaded


def assert_both_executors_ran_tasks(
    cluster: StandaloneCluster, app: str, stages: Collection[int] | None = None
) -> dict[str, int]:
    """Executors of both workers ran tasks of ``app`` (of its ``stages``, when given)."""
    tasks = cluster.tasks_by_executor(app, stages)
    workers = {name.split("/")[0] for name, count in tasks.items() if count > 0}
    assert workers == {"worker1", "worker2"}, tasks
    return tasks


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


@dataclass(frozen=True)
class OnCluster:
    """The module's one application on the cluster (sources_job.py), what its driver wrote, and the
    same work done in local mode."""

    cluster: StandaloneCluster
    app: str
    result: dict[str, Any]
    sink_topic: str
    local: dict[str, Any]
    """``file`` and ``kafka``: :func:`read` in the local session; ``sink``: what :func:`write` from the
    local session wrote, by key (:func:`changes_by_key`)."""

    def assert_both_executors_ran(self, phase: str) -> None:
        """Both workers' executors ran tasks of the Spark jobs of ``phase``."""
        stages = self.result["stages"][phase]
        assert stages, self.result["stages"]
        assert_both_executors_ran_tasks(self.cluster, self.app, stages)


@pytest.fixture(scope="session")
def on_cluster(
    standalone: StandaloneCluster,
    kafka_cluster: KafkaCluster,
    spark: SparkSession,
    tmp_path_factory: pytest.TempPathFactory,
) -> OnCluster:
    """The file read, the Kafka read and the sink write of this module's tests, run on the cluster as
    one application (one driver and one set of executors for the three, not one per test); the same in
    the local session while it runs. Once per session: xdist may run another cluster test between this
    module's tests, and a module fixture would then run the application again."""
    products = ProductsTopic(kafka_cluster)
    workdir = tmp_path_factory.mktemp("cluster_sources")
    bootstrap = kafka_cluster.bootstrap_servers
    sink_topic, local_topic = unique_topic("cluster-sink"), unique_topic("local-sink")
    for topic in (sink_topic, local_topic):
        kafka_cluster.create_topic(topic, 2)
    out = workdir / "cluster.json"
    args = [str(out), str(EXCLUDE), products.bootstrap, products.name, sink_topic]
    with ThreadPoolExecutor(1) as background:
        submitted = background.submit(submit, standalone, "sources_job.py", args, workdir / "sources.log")
        local = {
            "file": as_json(read(spark, "file", str(EXCLUDE))),
            "kafka": as_json(read(spark, "kafka", products.bootstrap, products.name)),
        }
        write(spark, str(EXCLUDE), bootstrap, local_topic)
        local["sink"] = changes_by_key(spark, bootstrap, local_topic)
        app = submitted.result()
    result = json.loads(out.read_text())
    assert result["app"] == app
    assert result["master"] == standalone.master_url
    return OnCluster(standalone, app, result, sink_topic, local)


def check_read(on_cluster: OnCluster, kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The cluster's read of ``kind`` (its phase of the application), checked for where its tasks ran;
    and the same read in local mode."""
    on_cluster.assert_both_executors_ran(kind)
    read_on_cluster: dict[str, Any] = on_cluster.result[kind]
    tasks = read_on_cluster["tasks"]
    assert {task["python"] for task in tasks} == {VENV_PYTHON}
    # Each task ran in its executor's directory, <worker dir>/<app>/<executor id>, by a Python worker there.
    places = {Path(task["cwd"]).relative_to(Path(task["cwd"]).parents[2]).parts[0] for task in tasks}
    assert places == {"worker1", "worker2"}, tasks
    assert {Path(task["cwd"]).parent.name for task in tasks} == {on_cluster.app}, tasks
    assert len({task["pid"] for task in tasks}) >= 2
    return read_on_cluster, on_cluster.local[kind]


def test_recorded_files_read_on_the_cluster_as_in_local_mode(on_cluster: OnCluster) -> None:
    read_on_cluster, local = check_read(on_cluster, "file")
    assert read_on_cluster["partitions"] == local["partitions"] >= 4
    assert sum(task["rows"] for task in read_on_cluster["tasks"]) == len(GOLDEN_ROWS)
    assert read_on_cluster["rows"] == local["rows"]
    assert [render(row) for row in read_on_cluster["rows"]] == GOLDEN_ROWS
    assert [row["line"] for row in read_on_cluster["rows"]][:3] == [1, 2, 3]


def test_a_kafka_topic_read_on_the_cluster_as_in_local_mode(on_cluster: OnCluster) -> None:
    read_on_cluster, local = check_read(on_cluster, "kafka")
    assert {row["partition"] for row in read_on_cluster["rows"]} == {0, 1}
    assert read_on_cluster["partitions"] == local["partitions"] >= 4
    assert read_on_cluster["rows"] == local["rows"]
    assert sorted(render(row) for row in read_on_cluster["rows"]) == sorted(GOLDEN_ROWS)


def test_a_sink_writes_from_the_cluster_what_it_writes_in_local_mode(
    on_cluster: OnCluster, spark: SparkSession, kafka_cluster: KafkaCluster
) -> None:
    on_cluster.assert_both_executors_ran("sink")
    written = changes_by_key(spark, kafka_cluster.bootstrap_servers, on_cluster.sink_topic)
    expected: dict[int, list[str]] = defaultdict(list)
    for line in GOLDEN_ROWS:
        expected[int(line[3 : line.index(",")])].append(line)
    assert written == dict(expected)  # every key's changes, in the changelog's order
    assert written == on_cluster.local["sink"]
