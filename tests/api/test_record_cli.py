"""``cdcflow record``: a topic dump from a Kafka cluster, as users run it (``python -m cdcflow record``, a
child process) and through ``cdcflow.cli.main`` in the test's process (``tests/cli_runner.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cli_runner import run_cli_in_process
from test_cli import run_cli

# The session Kafka cluster fixture lives with the connector tests.
sys.path.insert(0, str(Path(__file__).parent.parent / "connectors"))

from kafka_fixture import KafkaCluster, kafka_cluster, unique_topic  # noqa: E402, F401 - a session fixture

from cdcflow.connectors.kafka import producer as kafka_producer  # noqa: E402
from cdcflow.connectors.replay import dumps as replay  # noqa: E402
from cdcflow.formats import Message  # noqa: E402


@pytest.mark.integration
def test_record_writes_a_dump_and_a_summary(kafka_cluster: KafkaCluster, tmp_path: Path) -> None:  # noqa: F811
    topic = unique_topic("cli")
    kafka_cluster.create_topic(topic, 2)
    messages = [Message(b"v%d" % i, b"k%d" % i, partition=i % 2, headers=(("h", b"x"),)) for i in range(5)]
    kafka_producer.produce_messages(kafka_cluster.bootstrap_servers, messages, topic)
    output = tmp_path / "topic.jsonl"
    result = run_cli(
        "record",
        "--bootstrap-servers",
        kafka_cluster.bootstrap_servers,
        "--topic",
        topic,
        "--option",
        "kafka.client.id=recorder",
        "--output",
        str(output),
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == f"cdcflow: recorded 5 records from 2 partitions of {topic} to {output}\n"
    got = [(m.partition, m.offset, m.key, m.value, m.headers) for m in replay.read_messages(str(output))]
    assert got == [
        (0, 0, b"k0", b"v0", (("h", b"x"),)),
        (0, 1, b"k2", b"v2", (("h", b"x"),)),
        (0, 2, b"k4", b"v4", (("h", b"x"),)),
        (1, 0, b"k1", b"v1", (("h", b"x"),)),
        (1, 1, b"k3", b"v3", (("h", b"x"),)),
    ]


def test_record_rejects_a_malformed_option_without_a_traceback(tmp_path: Path) -> None:
    result = run_cli_in_process(
        "record", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "--option", "oops", "--output", "x"
    )
    assert result.returncode == 2  # a flag to fix (README: exit codes)
    assert result.stderr == (
        "cdcflow: --option 'oops' must look like KEY=VALUE, e.g. kafka.client.id=recorder\n"
    )


def test_record_names_an_unreachable_cluster(tmp_path: Path) -> None:
    output = tmp_path / "never.jsonl"
    result = run_cli_in_process(
        "record",
        "--bootstrap-servers",
        "127.0.0.1:1",
        "--topic",
        "t",
        "--option",
        "kafkaConsumer.pollTimeoutMs=1000",
        "--output",
        str(output),
    )
    assert result.returncode == 1
    assert result.stderr.startswith(
        "cdcflow: could not list the topics of Kafka at bootstrap servers 127.0.0.1:1 within 1s"
    )
    assert "Traceback" not in result.stderr
    assert not output.exists()


@pytest.mark.integration
def test_record_says_what_failOnDataLoss_false_skipped(kafka_cluster: KafkaCluster, tmp_path: Path) -> None:  # noqa: F811, N802
    """The command silences librdkafka's connection noise, not the warning that data was skipped."""
    topic = unique_topic("lost")
    kafka_cluster.create_topic(topic, 1)
    messages = [Message(b"v%d" % i, b"k%d" % i, partition=0) for i in range(5)]
    kafka_producer.produce_messages(kafka_cluster.bootstrap_servers, messages, topic)
    kafka_cluster.delete_records(topic, 0, 3)
    output = tmp_path / "topic.jsonl"
    flags = ["--topic", topic, "--output", str(output), "--option", "failOnDataLoss=false"]
    starting = '{"%s":{"0":0}}' % topic  # noqa: UP031 - JSON braces
    result = run_cli_in_process(
        "record",
        "--bootstrap-servers",
        kafka_cluster.bootstrap_servers,
        *flags,
        "--option",
        f"startingOffsets={starting}",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[-1] == f"cdcflow: recorded 2 records from 1 partitions of {topic} to {output}"
    assert any(
        "some data may have been lost (failOnDataLoss=false: skipped)" in line for line in lines[:-1]
    ), lines
    assert [m.value for m in replay.read_messages(str(output))] == [b"v3", b"v4"]
