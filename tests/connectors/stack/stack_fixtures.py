"""The real stack's session fixtures: one PostgreSQL 15 server and one Kafka broker per session, and a
Kafka Connect worker.

The broker is ``kafka_cluster`` (tests/connectors/kafka_fixture.py) when that is a real broker, else one
started here with kafka_broker.py; a Connect worker needs a real one (librdkafka's mock has no Java
client protocol for Connect's group membership and internal topics).

Registered by this folder's conftest.py and by tests/test_compose.py (which runs the compose file's
ingest command on this stack): each fixture starts its server once per session, however many
modules register it.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from connect_worker import ConnectWorker
from kafka_broker import KafkaBroker
from kafka_mock import MockKafkaCluster
from postgres_server import PG_BIN, PostgresServer

T = TypeVar("T")
_STARTED: dict[str, Any] = {}


@contextlib.contextmanager
def _once(name: str, start: Callable[[], contextlib.AbstractContextManager[T]]) -> Iterator[T]:
    """What ``start`` starts, or what another registration of the fixture ``name`` started already."""
    if name in _STARTED:
        yield _STARTED[name]
        return
    with start() as started:
        _STARTED[name] = started
        try:
            yield started
        finally:
            del _STARTED[name]


@pytest.fixture(scope="session")
def stack_bootstrap(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    cluster = request.getfixturevalue("kafka_cluster")
    if not isinstance(cluster, MockKafkaCluster):
        yield cluster.bootstrap_servers
        return

    @contextlib.contextmanager
    def broker() -> Iterator[str]:
        started = KafkaBroker(tmp_path_factory.mktemp("stack-kafka")).start()
        try:
            yield started.bootstrap_servers
        finally:
            started.stop()

    with _once("stack_bootstrap", broker) as bootstrap:
        yield bootstrap


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"no PostgreSQL 15 in {PG_BIN} (apt-get install -y postgresql-15)")

    @contextlib.contextmanager
    def server() -> Iterator[PostgresServer]:
        # under /tmp, not pytest's 0700 folders: the server runs as the postgres user when we are root
        root = Path(tempfile.mkdtemp(prefix="cdcflow-pg-"))
        started = PostgresServer(root).start()
        try:
            yield started
        finally:
            started.stop()
            shutil.rmtree(root, ignore_errors=True)

    with _once("postgres", server) as running:
        yield running


@pytest.fixture(scope="session")
def connect_worker(stack_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectWorker]:
    """A distributed worker without exactly-once source support."""

    @contextlib.contextmanager
    def worker() -> Iterator[ConnectWorker]:
        started = ConnectWorker(
            tmp_path_factory.mktemp("connect"),
            stack_bootstrap,
            f"connect-{uuid.uuid4().hex[:8]}",
            exactly_once=False,
        ).start()
        try:
            yield started
        finally:
            started.stop()

    with _once("connect_worker", worker) as running:
        yield running
