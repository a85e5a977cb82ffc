"""The one application of the cluster's source tests (sources_job.py on the standalone cluster) and the
same work in local mode: the session fixture ``on_cluster``, registered in conftest.py so that it runs
once per session (a session fixture defined in a test module is torn down when its module is left)."""

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
from source_cases import EXCLUDE, PRODUCTS, ProductsTopic, render
from standalone import StandaloneCluster, cluster_conf, spark_submit

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
    the local session while it runs."""
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
