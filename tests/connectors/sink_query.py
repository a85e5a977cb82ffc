"""A streaming query from a cdc-debezium Kafka source to an exactly-once cdc-debezium Kafka sink, run as a
child process by tests/connectors/test_sink_exactly_once.py.

    python sink_query.py BOOTSTRAP SOURCE_TOPIC SINK_TOPIC CHECKPOINT MAX_OFFSETS_PER_TRIGGER

Runs with trigger(availableNow=True): micro-batches of at most MAX_OFFSETS_PER_TRIGGER records until the
source's records at start are written, then exits 0. Tasks are tried twice (``local[2,2]``).

:func:`install_faults` is the test's fault injector, run in every Python process of the child (the test
puts a ``sitecustomize.py`` calling it on the child's PYTHONPATH, which Spark passes on to its Python
workers) when ``CDCFLOW_SINK_FAULTS`` is set. It wraps the producer's ``commit_transaction``, so it acts
after a task's records were flushed to the broker and its marker sent, before the commit.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

FAULTS_ENV = "CDCFLOW_SINK_FAULTS"


def install_faults() -> None:
    """Inject the faults ``CDCFLOW_SINK_FAULTS`` (JSON) names; notes of what happened go to its ``dir``.

    - ``fail_batch``: on attempt 0, the task of partition ``raise_partition`` raises (the task aborts its
      transaction and Spark retries it) and the one of ``exit_partition`` ends its Python worker with
      ``os._exit`` (its transaction stays open: the retry's producer must fence it and abort it).
    - ``crash_batch``: the first ``tasks - 1`` tasks to get there commit; the last one waits for their
      commits, then SIGKILLs every process of the child's session (Python driver, driver JVM, PySpark's
      daemons and workers).
    """
    spec = os.environ.get(FAULTS_ENV)
    if not spec:
        return
    faults: dict[str, Any] = json.loads(spec)
    notes = Path(faults["dir"])

    from cdcflow.connectors.kafka.producer import KafkaProducerSink

    commit = KafkaProducerSink.commit_transaction

    def commit_with_faults(self: KafkaProducerSink) -> None:
        from pyspark import TaskContext

        context = TaskContext.get()
        batch = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
        if context is None or batch is None:
            commit(self)
            return
        batch_id, partition, attempt = int(batch), context.partitionId(), context.attemptNumber()
        if batch_id == faults["fail_batch"] and attempt == 0:
            if partition == faults["raise_partition"]:
                _note(notes / f"raised-{batch_id}-{partition}")
                raise RuntimeError(f"injected failure of batch {batch_id} partition {partition}, attempt 0")
            if partition == faults["exit_partition"]:
                _note(notes / f"exited-{batch_id}-{partition}")
                os._exit(17)
        if batch_id != faults["crash_batch"]:
            commit(self)
            return
        tasks = int(faults["tasks"])
        if _arrival(notes, batch_id, tasks) < tasks - 1:
            commit(self)
            _note(notes / f"committed-{batch_id}-{partition}")
            return
        deadline = time.monotonic() + 300
        while len(list(notes.glob(f"committed-{batch_id}-*"))) < tasks - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        _note(notes / f"killed-{batch_id}-{partition}")
        _kill_session()

    KafkaProducerSink.commit_transaction = commit_with_faults  # type: ignore[method-assign]


def _kill_session() -> None:
    """SIGKILL every process of this session, this one last: the child was started in a session of its
    own, and PySpark's daemons put themselves and their workers in process groups of their own in it."""
    session, me = os.getsid(0), os.getpid()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, process_session = int(stat.parent.name), int(stat.read_text().rsplit(")", 1)[1].split()[3])
            if process_session == session and pid != me:
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    os.kill(me, signal.SIGKILL)


def _note(path: Path) -> None:
    path.touch()


def _arrival(notes: Path, batch: int, tasks: int) -> int:
    """The order (0, 1, ...) in which this task reached the commit of ``batch``, among all processes."""
    for rank in range(tasks):
        try:
            os.close(os.open(notes / f"arrived-{batch}-{rank}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        return rank
    return tasks


def main(bootstrap: str, source: str, sink: str, checkpoint: str, per_trigger: str) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2,2]")
        .appName("cdcflow-sink-query")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    changes = (
        spark.readStream.format("cdc-debezium")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_trigger)
        .option("columns", "id INT NOT NULL, name STRING")
        .load()
    )
    query = (
        changes.writeStream.format("cdc-debezium")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("keyColumns", "id")
        .option("sink.delivery-guarantee", "exactly-once")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    print(f"query {query.id} started", flush=True)
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    print("query finished", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:6])
