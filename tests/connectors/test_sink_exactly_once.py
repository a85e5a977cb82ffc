"""sink.delivery-guarantee=exactly-once on a real broker, with real crashes at the worst moment.

A streaming query (a child process, sink_query.py) writes a cdc-debezium sink topic in micro-batches from
a 3-partition source. Its Python workers inject faults after a task's records are flushed to the broker
and before its transaction commits: in batch 0 one task's first attempt raises and another's Python
worker dies (its open transaction is left to the retry to fence and abort); in batch 1 the last task to
commit SIGKILLs the whole child (driver JVM, Python driver and workers) after the other tasks of the
batch committed. The query restarted from its checkpoint replays batch 1 (writing only the killed task's
rows again) and finishes. A read_committed consumer then reads every change exactly once; a
read_uncommitted one also reads each aborted attempt's rows, and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kafka_fixture import KafkaCluster, unique_topic
from kafka_mock import MockKafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.process]

CHILD = Path(__file__).with_name("sink_query.py")
SOURCE_PARTITIONS, SINK_PARTITIONS = 3, 3
EVENTS = 9_000
PER_TRIGGER = 3_000  # 3 micro-batches, a task per source partition each
FAIL_BATCH, RAISE_PARTITION, EXIT_PARTITION = 0, 0, 1
CRASH_BATCH = 1
SITE_CUSTOMIZE = """\
import importlib.util

_spec = importlib.util.spec_from_file_location("sink_query_faults", {child!r})
_faults = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_faults)
_faults.install_faults()
"""


def needs_transactions(cluster: KafkaCluster) -> None:
    if isinstance(cluster, MockKafkaCluster):
        pytest.skip("librdkafka's mock cluster has no transactions; exactly-once needs a real broker")


def source_events() -> list[tuple[bytes, bytes, int]]:
    events = []
    for i in range(EVENTS):
        after = {"id": i, "name": f"name-{i}-{'x' * (i % 17)}"}
        value = json.dumps({"before": None, "after": after, "op": "c"}).encode()
        events.append((json.dumps({"id": i}).encode(), value, i % SOURCE_PARTITIONS))
    return events


def produce(bootstrap: str, topic: str, events: list[tuple[bytes, bytes, int]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value, partition in events:
        while True:
            try:
                producer.produce(topic, value, key, partition=partition)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0


def watermarks(bootstrap: str, topic: str, isolation: str) -> list[int]:
    """Each partition's end as a consumer of ``isolation`` sees it: the last stable offset
    (read_committed) or the high watermark (read_uncommitted)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "isolation.level": isolation})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)[1]
            for p in range(SINK_PARTITIONS)
        ]
    finally:
        consumer.close()


def read_all(bootstrap: str, topic: str, isolation: str) -> list[tuple[Any, Any]]:
    """Every record (key, value as JSON) a consumer of ``isolation`` reads up to the partitions' ends."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    ends = watermarks(bootstrap, topic, isolation)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{isolation}",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(SINK_PARTITIONS)])
    records, done = [], {p for p in range(SINK_PARTITIONS) if ends[p] == 0}
    deadline = time.monotonic() + 120
    while len(done) < SINK_PARTITIONS:
        assert time.monotonic() < deadline, f"reading {topic} ({isolation}) did not reach {ends}"
        for record in consumer.consume(1000, timeout=1):
            error = record.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                if (record.offset() or 0) >= ends[record.partition() or 0]:
                    done.add(record.partition() or 0)
                continue
            records.append((json.loads(record.key() or b"null"), json.loads(record.value() or b"null")))
    consumer.close()
    return records


def start_query(
    bootstrap: str, source: str, sink: str, checkpoint: Path, log: Path, faults: dict[str, Any] | None = None
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("CDCFLOW_SINK_FAULTS", None)
    if faults is not None:
        site = Path(faults["dir"]) / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITE_CUSTOMIZE.format(child=str(CHILD)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
        env["CDCFLOW_SINK_FAULTS"] = json.dumps(faults)
    with log.open("ab") as out:
        return subprocess.Popen(  # noqa: S603 - the project's own script
            [sys.executable, str(CHILD), bootstrap, source, sink, str(checkpoint), str(PER_TRIGGER)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: the JVM and Python workers die with it
        )


def session(sid: int) -> list[int]:
    """The live processes of session ``sid`` (a child started in a new session: its JVM, PySpark's daemon
    and workers, which the daemon puts in a process group of their own)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            state, _, _, process_session = stat.read_text().rsplit(")", 1)[1].split()[:4]
            if int(process_session) == sid and state != "Z":
                found.append(int(stat.parent.name))
    return found


def wait(child: subprocess.Popen[bytes], log: Path) -> int:
    """The child's exit code, once it and every process of its session ended (leftovers are killed)."""
    try:
        code = child.wait(900)
        deadline = time.monotonic() + 30
        while session(child.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not session(child.pid), f"processes of the query left after it ended: {session(child.pid)}"
        return code
    finally:
        for pid in session(child.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if child.poll() is None:
            child.wait(60)


def batch_ranges(checkpoint: Path, source: str) -> dict[int, dict[int, range]]:
    """Each planned micro-batch's source offsets per partition, from Spark's offset log (its last line is
    the source's end offsets, ``{"topic": {"0": 12}}``; the first batch starts at 0)."""
    ranges, start = {}, dict.fromkeys(range(SOURCE_PARTITIONS), 0)
    for batch in sorted(int(f.name) for f in (checkpoint / "offsets").iterdir() if f.name.isdigit()):
        lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
        end = {int(p): offset for p, offset in json.loads(lines[-1])[source].items()}
        ranges[batch] = {p: range(start[p], end[p]) for p in range(SOURCE_PARTITIONS)}
        start = end
    return ranges


def ids_of(partition: int, offsets: range) -> set[int]:
    """The ids of a source partition's records at ``offsets`` (event i is at offset i // 3 of i % 3)."""
    return {offset * SOURCE_PARTITIONS + partition for offset in offsets}


def markers(bootstrap: str, sink: str, query_id: str) -> dict[int, Any]:
    """Each task's committed marker: the offset metadata of the consumer group named for its
    transactional id (default prefix cdcflow-<query id>); read_uncommitted, so a pending transactional
    commit is not waited for."""
    from confluent_kafka import Consumer, TopicPartition

    found = {}
    for partition in range(SOURCE_PARTITIONS):
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"cdcflow-{query_id}-{partition}",
                "isolation.level": "read_uncommitted",
                "enable.auto.commit": False,
            }
        )
        try:
            [offset] = consumer.committed([TopicPartition(sink, 0)], timeout=30)
        finally:
            consumer.close()
        found[partition] = json.loads(offset.metadata) if offset.metadata else None
    return found


def ids(records: list[tuple[Any, Any]]) -> Counter[int]:
    return Counter(key["id"] for key, _ in records)


def test_query_crashed_before_a_commit_and_restarted_writes_every_change_once(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    needs_transactions(kafka_cluster)
    bootstrap = kafka_cluster.bootstrap_servers
    source, sink = unique_topic("eos-in"), unique_topic("eos-out")
    kafka_cluster.create_topic(source, SOURCE_PARTITIONS)
    kafka_cluster.create_topic(sink, SINK_PARTITIONS)
    events = source_events()
    produce(bootstrap, source, events)
    checkpoint, log, notes = tmp_path / "checkpoint", tmp_path / "query.log", tmp_path / "faults"
    notes.mkdir()
    faults = {
        "dir": str(notes),
        "tasks": SOURCE_PARTITIONS,
        "fail_batch": FAIL_BATCH,
        "raise_partition": RAISE_PARTITION,
        "exit_partition": EXIT_PARTITION,
        "crash_batch": CRASH_BATCH,
    }

    code = wait(start_query(bootstrap, source, sink, checkpoint, log, faults), log)
    noted = {f.name for f in notes.iterdir()}
    assert code == -signal.SIGKILL, f"exit code {code}, faults {sorted(noted)}:\n{log.read_text()[-4000:]}"
    assert {f"raised-{FAIL_BATCH}-{RAISE_PARTITION}", f"exited-{FAIL_BATCH}-{EXIT_PARTITION}"} <= noted
    [killed] = [int(n.rsplit("-", 1)[1]) for n in noted if n.startswith(f"killed-{CRASH_BATCH}-")]
    survivors = set(range(SOURCE_PARTITIONS)) - {killed}
    assert {n for n in noted if n.startswith(f"committed-{CRASH_BATCH}-")} == {
        f"committed-{CRASH_BATCH}-{p}" for p in survivors
    }
    commits = sorted(int(f.name) for f in (checkpoint / "commits").iterdir() if f.name.isdigit())
    assert commits == list(range(CRASH_BATCH)), "Spark committed other batches than those before the crash"
    ranges = batch_ranges(checkpoint, source)
    assert max(ranges) == CRASH_BATCH

    # On the broker: the tasks that committed before the kill have batch 1's marker, the killed one
    # batch 0's; its records are there, in a transaction still open.
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    write = {"write": query_id}
    assert markers(bootstrap, sink, query_id) == {
        p: {**write, "batch": CRASH_BATCH - (p == killed)} for p in range(SOURCE_PARTITIONS)
    }
    killed_ids = ids_of(killed, ranges[CRASH_BATCH][killed])
    before_crash = set().union(*(ids_of(p, r) for b in range(CRASH_BATCH) for p, r in ranges[b].items()))
    visible = ids(read_all(bootstrap, sink, "read_committed"))
    pending = ids(read_all(bootstrap, sink, "read_uncommitted"))
    assert set(visible.values()) == {1} and before_crash <= set(visible), "batches before the crash, once"
    assert not killed_ids & set(visible), "records of the killed task's open transaction are visible"
    assert killed_ids <= set(pending), "the killed task's flushed records are not on the broker"
    retried = ids_of(RAISE_PARTITION, ranges[FAIL_BATCH][RAISE_PARTITION]) | ids_of(
        EXIT_PARTITION, ranges[FAIL_BATCH][EXIT_PARTITION]
    )
    assert {pending[i] for i in retried} == {2}, (
        "a retried task's first attempt is not on the broker, aborted"
    )

    assert wait(start_query(bootstrap, source, sink, checkpoint, log), log) == 0, log.read_text()[-4000:]

    expected = {json.loads(key)["id"]: json.loads(value)["after"] for key, value, _ in events}
    committed = read_all(bootstrap, sink, "read_committed")
    times = ids(committed)
    assert len(committed) == EVENTS, (
        f"{len(committed)} records, {sum(n > 1 for n in times.values())} repeated"
    )
    assert set(times) == set(expected) and set(times.values()) == {1}
    for key, value in committed:
        assert value["op"] == "c" and value["before"] is None
        assert value["after"] == expected[key["id"]]
    # Aborted: the first attempts of batch 0's retried tasks and batch 1's killed task; nothing else (a
    # task of the replayed batch whose marker said committed wrote nothing).
    aborted = ids(read_all(bootstrap, sink, "read_uncommitted")) - times
    assert aborted == Counter(retried | killed_ids)
    last = max(batch_ranges(checkpoint, source))
    assert last > CRASH_BATCH, "the crash came in the last batch"
    assert markers(bootstrap, sink, query_id) == dict.fromkeys(
        range(SOURCE_PARTITIONS), {**write, "batch": last}
    )
