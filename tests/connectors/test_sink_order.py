"""The Kafka sink's order checks without Spark: a task's -U/+U pairs, the key hashes each task reports,
and the driver's check that no key was written by two tasks; then ``write_changes`` (one task) against
a Kafka cluster: a split pair fails before any half of it reaches the topic."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import orjson
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka_fixture import KafkaCluster, unique_topic
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from cdcflow.connectors.errors import SinkOrderError
from cdcflow.connectors.spark.sink import plan_write, write_changes
from cdcflow.connectors.spark.sink_order import KeyHashes, UpdatePairs, check_disjoint_keys
from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import Message, parse_ddl, resolve_format

INS, UB, UA, DEL = RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE


def run_pairs(kinds: list[tuple[RowKind, int]], *, pairs_updates: bool = True) -> None:
    pairs = UpdatePairs(["id"], pairs_updates=pairs_updates, task=3)
    for position, (kind, key) in enumerate(kinds):
        pairs.check(Change(kind, {"id": key}), key, position)
    pairs.finish()


def test_pairs_next_to_each_other_per_key_pass() -> None:
    run_pairs([(INS, 1), (UB, 1), (UA, 1), (UB, 2), (INS, 3), (UA, 2), (DEL, 1)])


def test_a_minus_u_whose_plus_u_is_in_another_task_fails_at_the_end_of_the_task() -> None:
    with pytest.raises(SinkOrderError) as failure:
        run_pairs([(INS, 1), (UB, 7)])
    text = str(failure.value)
    assert (
        "the -U of key id=7 (row 1 of task 3 (input partition 3)) is not directly followed by its +U" in text
    )
    assert "the task's input ended first" in text
    assert "cdcflow.spark.order_for_sink(df, ['id'], sequence_by=" in text


def test_a_plus_u_without_its_minus_u_fails() -> None:
    with pytest.raises(SinkOrderError) as failure:
        run_pairs([(INS, 1), (UA, 7)])
    text = str(failure.value)
    assert "the +U of key id=7 (row 1 of task 3 (input partition 3)) has no -U of the same key" in text
    assert "'changelog-mode'='upsert'" in text


def test_a_minus_u_followed_by_another_change_of_its_key_fails() -> None:
    with pytest.raises(SinkOrderError, match=r"the key's next row is a -D \(row 2\)"):
        run_pairs([(UB, 1), (INS, 2), (DEL, 1), (UA, 1)])


def test_formats_that_write_no_update_pairs_take_lone_rows() -> None:
    run_pairs([(UA, 1), (UB, 2)], pairs_updates=False)


def test_key_hashes_are_the_same_in_every_python_process() -> None:
    """Tasks run in different Python workers, whose str hashes are salted differently."""
    keys = [7, "ßpanner", (1, "a"), None]
    here = KeyHashes()
    for key in keys:
        here.add(key)
    script = (
        "from cdcflow.connectors.spark.sink_order import KeyHashes\n"
        "h = KeyHashes()\n"
        f"for k in {keys!r}: h.add(k)\n"
        "print(h.packed().hex())"
    )
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, check=True)  # noqa: S603
        assert sorted(
            bytes.fromhex(out.stdout.decode().strip())[i : i + 8] for i in range(0, 32, 8)
        ) == sorted(here.packed()[i : i + 8] for i in range(0, 32, 8))


def hashes(*keys: object) -> bytes:
    packed = KeyHashes()
    for key in keys:
        packed.add(key)
    return packed.packed()


def test_disjoint_tasks_pass_and_a_shared_key_names_the_tasks() -> None:
    check_disjoint_keys([(0, hashes(1, 2)), (1, hashes(3)), (2, b"")], "micro-batch 4", ["id"])
    with pytest.raises(SinkOrderError) as failure:
        check_disjoint_keys(
            [(0, hashes(1, 2)), (1, hashes(3)), (2, hashes(2, 1, 9))], "micro-batch 4", ["id"]
        )
    text = str(failure.value)
    assert text.startswith("2 key(s) were written by more than one task of micro-batch 4 (tasks 0, 2)")
    assert "order_for_sink(df, ['id']" in text and "keyOrderCheck=false" in text
    assert "above maxRecordsPerPartition (or for minPartitions): bound each micro-batch below it" in text
    assert "(maxOffsetsPerTrigger / maxBytesPerTrigger) or raise it, and leave minPartitions unset" in text


COLUMNS = StructType(
    [
        StructField("id", IntegerType(), False),
        StructField("name", StringType()),
        StructField("_row_kind", StringType(), False),
    ]
)


def batch(rows: list[tuple[int, str, str]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"id": i, "name": n, "_row_kind": k} for i, n, k in rows],
        schema=pa.schema(
            [("id", pa.int32(), False), ("name", pa.string()), ("_row_kind", pa.string(), False)]
        ),
    )


def topic_values(bootstrap: str, topic: str) -> list[bytes]:
    """Every record of the topic's partition 0, in offset order (read up to its high watermark)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("g")})
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    consumer.assign([TopicPartition(topic, 0, low)])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while low + len(values) < high and time.monotonic() < deadline:
        record = consumer.poll(0.5)
        if record is not None and not record.error():
            values.append(record.value())
    consumer.close()
    assert low + len(values) == high
    return values


@pytest.mark.integration
@pytest.mark.parametrize("sink", ["debezium-json", "canal-json"])
def test_a_task_ending_on_a_minus_u_writes_no_half_update(kafka_cluster: KafkaCluster, sink: str) -> None:
    """The old sink wrote {"op":"u","after":null} (Debezium) or a lone DELETE (Canal) here."""
    topic = unique_topic("split-pair")
    kafka_cluster.create_topic(topic, 1)
    plan = plan_write(
        sink,
        {"kafka.bootstrap.servers": kafka_cluster.bootstrap_servers, "topic": topic, "keyColumns": "id"},
        COLUMNS,
    )
    with pytest.raises(SinkOrderError, match="the -U of key id=2"):
        write_changes(plan, iter([batch([(1, "a", "+I"), (2, "b", "+I"), (2, "b", "-U")])]))
    values = topic_values(kafka_cluster.bootstrap_servers, topic)
    assert all(b'"after":null' not in v and b'"DELETE"' not in v and b'"UPDATE"' not in v for v in values)
    decoder = resolve_format(sink).create_decoder({}, parse_ddl("id INT NOT NULL, name STRING"))
    changes = decoder.decode_all([Message(v) for v in values]).changes
    assert all(c.kind is INS for c in changes)  # the completed inserts, or nothing (purged)


@pytest.mark.integration
def test_one_task_writes_each_update_as_one_event(kafka_cluster: KafkaCluster) -> None:
    topic = unique_topic("paired")
    kafka_cluster.create_topic(topic, 1)
    plan = plan_write(
        "debezium-json",
        {"kafka.bootstrap.servers": kafka_cluster.bootstrap_servers, "topic": topic, "keyColumns": "id"},
        COLUMNS,
    )
    rows = [(1, "a", "+I"), (2, "b", "+I"), (1, "a", "-U"), (1, "a2", "+U"), (2, "b", "-D")]
    counts = write_changes(plan, iter([batch(rows)]))
    assert (counts.changes, counts.records, len(counts.key_hashes)) == (5, 4, 16)
    events = [orjson.loads(v) for v in topic_values(kafka_cluster.bootstrap_servers, topic)]
    assert [(e["op"], e["before"], e["after"]) for e in events] == [
        ("c", None, {"id": 1, "name": "a"}),
        ("c", None, {"id": 2, "name": "b"}),
        ("u", {"id": 1, "name": "a"}, {"id": 1, "name": "a2"}),
        ("d", {"id": 2, "name": "b"}, None),
    ]
