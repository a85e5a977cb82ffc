"""The ``cdc-*`` sources and sinks on a standalone cluster (separate executor JVMs and Python workers)
give what they give in local mode, with tasks run by both workers' executors.

The cluster side of all three tests is one application (sources_job.py, the ``on_cluster`` fixture): a
file read, a Kafka read and a sink write, each phase's tasks told apart by the stages of its jobs. The
local-mode side runs in this process's session while the application runs."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from kafka_fixture import KafkaCluster
from pyspark.sql import SparkSession
from source_cases import GOLDEN_ROWS, render
from sources_app import OnCluster, changes_by_key
from standalone import VENV_PYTHON

pytestmark = pytest.mark.integration


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
