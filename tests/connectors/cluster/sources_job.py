"""Driver: what test_cluster_sources.py runs on the cluster, as one application (one driver JVM, one
executor per worker, their Python workers) instead of one per check: ``read_job.read`` of recorded
files, ``read_job.read`` of a Kafka topic, and ``sink_job.write`` to a topic, in that order.

    spark-submit --master spark://... sources_job.py OUT.json EVENTS_FILE BOOTSTRAP TOPIC SINK_TOPIC

Each phase runs its Spark jobs in a job group of its name; OUT.json has each read's result, the
application's id and master, and the stages of each phase's jobs (so a test tells which executors ran
each phase's tasks).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any


def main(argv: list[str]) -> None:
    from read_job import read
    from sink_job import write

    from cdcflow.connectors.spark.jobs import local_session

    out, events, bootstrap, topic, sink_topic = argv
    spark = local_session("cdcflow-sources-job")
    context = spark.sparkContext
    phases: dict[str, Callable[[], Any]] = {
        "file": lambda: read(spark, "file", events),
        "kafka": lambda: read(spark, "kafka", bootstrap, topic),
        "sink": lambda: write(spark, events, bootstrap, sink_topic),
    }
    result: dict[str, Any] = {"master": context.master, "app": context.applicationId}
    for name, run in phases.items():
        context.setJobGroup(name, f"test_cluster_sources: {name}")
        result[name] = run()
    tracker = context.statusTracker()
    stages: dict[str, list[int]] = {}
    for name in phases:
        jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(name)]
        stages[name] = sorted({stage for job in jobs if job is not None for stage in job.stageIds})
    result["stages"] = stages
    with open(out, "w") as handle:
        json.dump(result, handle, default=str)


if __name__ == "__main__":
    main(sys.argv[1:])
