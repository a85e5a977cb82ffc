"""The real stack: one PostgreSQL 15 server and one Kafka broker per session, Kafka Connect workers.

The broker is ``kafka_cluster`` (tests/connectors/kafka_fixture.py) when that is a real broker, else one
started here with kafka_broker.py; a Connect worker needs a real one (librdkafka's mock has no Java
client protocol for Connect's group membership and internal topics).
"""

import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

_HERE = Path(__file__).parent
for folder in (_HERE, _HERE.parent, _HERE.parent / "lakehouse"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from connect_worker import ConnectWorker  # noqa: E402
from kafka_broker import KafkaBroker  # noqa: E402
from kafka_mock import MockKafkaCluster  # noqa: E402
from postgres_server import PG_BIN, PostgresServer  # noqa: E402


@pytest.fixture(scope="session")
def stack_bootstrap(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    cluster = request.getfixturevalue("kafka_cluster")
    if not isinstance(cluster, MockKafkaCluster):
        yield cluster.bootstrap_servers
        return
    broker = KafkaBroker(tmp_path_factory.mktemp("stack-kafka")).start()
    try:
        yield broker.bootstrap_servers
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"no PostgreSQL 15 in {PG_BIN} (apt-get install -y postgresql-15)")
    # under /tmp, not pytest's 0700 folders: the server runs as the postgres user when we are root
    root = Path(tempfile.mkdtemp(prefix="cdcflow-pg-"))
    server = PostgresServer(root).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def connect_worker(stack_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectWorker]:
    """A distributed worker without exactly-once source support."""
    worker = ConnectWorker(
        tmp_path_factory.mktemp("connect"),
        stack_bootstrap,
        f"connect-{uuid.uuid4().hex[:8]}",
        exactly_once=False,
    ).start()
    try:
        yield worker
    finally:
        worker.stop()
