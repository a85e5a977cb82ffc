"""The Kafka cluster of the integration tests (docs/testing.md, "Which Kafka the tests use").

In this order:

1. ``KAFKA_BOOTSTRAP`` if set: a running cluster (e.g. the docker compose stack);
2. a testcontainers ``apache/kafka`` container with docker/kafka/broker.properties, if a Docker engine
   answers;
3. the real KRaft broker of kafka_broker.py, started for the session on 127.0.0.1 (the default where
   there is no Docker engine; its jars are fetched with Maven into the Java cache on first use);
4. librdkafka's mock cluster, only if ``CDCFLOW_TEST_KAFKA=mock`` or there is no ``java``: it lacks
   transactions under ``read_committed``, ``offsets_for_times`` and compaction, so it is a last resort
   for machines without a JVM and never what CI runs.

``CDCFLOW_TEST_KAFKA`` = ``broker`` / ``container`` / ``mock`` picks one of 2-4 (default: the order above).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from kafka_broker import SHARED_PROPERTIES, KafkaBroker
from kafka_mock import MockKafkaCluster

_ADMIN_TIMEOUT_S = 60
_METADATA_TIMEOUT_S = 30
KAFKA_IMAGE = "apache/kafka:4.3.1"


class KafkaCluster(Protocol):
    @property
    def bootstrap_servers(self) -> str: ...

    def create_topic(self, name: str, partitions: int = 1) -> None: ...

    def delete_records(self, topic: str, partition: int, before_offset: int) -> None: ...


class AdminCluster:
    """A running cluster reached through confluent-kafka's AdminClient."""

    def __init__(self, bootstrap_servers: str) -> None:
        from confluent_kafka.admin import AdminClient

        self.bootstrap_servers = bootstrap_servers
        self._admin = AdminClient({"bootstrap.servers": bootstrap_servers})

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create the topic and return once every partition has a leader (clients can use it at once)."""
        from confluent_kafka.cimpl import NewTopic

        futures = self._admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30)
        futures[name].result(timeout=_ADMIN_TIMEOUT_S)
        deadline = time.monotonic() + _METADATA_TIMEOUT_S
        while True:
            topic = self._admin.list_topics(name, timeout=10).topics.get(name)
            ready = topic is not None and topic.error is None and len(topic.partitions) == partitions
            if ready and topic is not None and all(p.leader >= 0 for p in topic.partitions.values()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name}: not all {partitions} partitions have a leader after 30s")
            time.sleep(0.05)

    def delete_records(self, topic: str, partition: int, before_offset: int) -> None:
        from confluent_kafka import TopicPartition

        futures = self._admin.delete_records([TopicPartition(topic, partition, before_offset)])
        for future in futures.values():
            future.result(timeout=_ADMIN_TIMEOUT_S)


def unique_topic(prefix: str) -> str:
    """A topic name no other test uses (the cluster lives for the whole session)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _docker_answers() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        return subprocess.run([docker, "info"], capture_output=True, timeout=20, check=False).returncode == 0  # noqa: S603
    except subprocess.TimeoutExpired:
        return False


def _container() -> tuple[Any, str]:
    """A testcontainers container of Kafka with the shared broker settings (not started), its bootstrap."""
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.docker_client import DockerClient

    host = DockerClient().host()
    with socket.socket() as probe:  # the same port inside and outside, so the advertised one is right
        probe.bind(("", 0))
        port = int(probe.getsockname()[1])
    container = DockerContainer(KAFKA_IMAGE).with_bind_ports(port, port)
    for line in SHARED_PROPERTIES.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            container.with_env("KAFKA_" + key.strip().upper().replace(".", "_"), value.strip())
    node_local = {
        "KAFKA_LISTENERS": f"PLAINTEXT://0.0.0.0:{port},CONTROLLER://127.0.0.1:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{host}:{port}",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@127.0.0.1:9093",
        "KAFKA_LOG_DIRS": "/tmp/kraft-combined-logs",  # noqa: S108 - the image's own data folder
    }
    for key, value in node_local.items():
        container.with_env(key, value)
    return container, f"{host}:{port}"


def _choice() -> str:
    forced = os.environ.get("CDCFLOW_TEST_KAFKA", "").strip().lower()
    if forced:
        if forced not in ("broker", "container", "mock"):
            raise pytest.UsageError(f"CDCFLOW_TEST_KAFKA={forced!r}: use broker, container or mock")
        return forced
    try:
        import testcontainers  # noqa: F401
    except ImportError:
        pass
    else:
        if _docker_answers():
            return "container"
    if shutil.which("java") is None:
        warnings.warn(
            "no `java` on PATH: the Kafka tests run on librdkafka's mock cluster, which lacks transactions, "
            "offsets_for_times and compaction (install a JDK 17 for the real broker)",
            stacklevel=2,
        )
        return "mock"
    return "broker"


_SESSION: list[KafkaCluster] = []


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    if _SESSION:  # the fixture registered again (a test module importing it): the same cluster
        yield _SESSION[0]
        return
    with _session_cluster(tmp_path_factory) as cluster:
        _SESSION.append(cluster)
        try:
            yield cluster
        finally:
            _SESSION.clear()


@contextlib.contextmanager
def _session_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if bootstrap:
        yield AdminCluster(bootstrap)
        return
    choice = _choice()
    if choice == "container":
        from testcontainers.core.waiting_utils import wait_for_logs

        container, bootstrap = _container()
        container.start()
        try:
            wait_for_logs(container, "Kafka Server started", timeout=120, raise_on_exit=True)
            yield AdminCluster(bootstrap)
        finally:
            container.stop()
    elif choice == "broker":
        broker = KafkaBroker(Path(tmp_path_factory.mktemp("kafka-broker"))).start()
        try:
            yield AdminCluster(broker.bootstrap_servers)
        finally:
            broker.stop()
    else:
        with MockKafkaCluster() as mock:
            yield mock
