"""The Kafka cluster of the integration tests, as confluent-kafka's and quix-streams' fixtures find one.

``KAFKA_BOOTSTRAP`` if set (a real cluster; topics made with the AdminClient); else a testcontainers
Kafka if ``testcontainers`` imports and a Docker engine answers; else librdkafka's mock cluster in a
child process, reached over TCP like a broker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from typing import Protocol

import pytest

from cdcflow.connectors.kafka_mock import MockKafkaCluster

_ADMIN_TIMEOUT_S = 60


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
        from confluent_kafka.cimpl import NewTopic

        futures = self._admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30)
        futures[name].result(timeout=_ADMIN_TIMEOUT_S)

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


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[KafkaCluster]:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if bootstrap:
        yield AdminCluster(bootstrap)
        return
    try:
        from testcontainers.kafka import KafkaContainer  # type: ignore[import-not-found]
    except ImportError:
        KafkaContainer = None  # noqa: N806
    if KafkaContainer is not None and _docker_answers():
        container = KafkaContainer().start()
        try:
            yield AdminCluster(container.get_bootstrap_server())
        finally:
            container.stop()
        return
    with MockKafkaCluster() as mock:
        yield mock
