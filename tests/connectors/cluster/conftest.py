"""The cluster tests: a standalone Spark cluster (master + two one-core workers, once per test session)
and a Spark Connect server (for its test module). Jobs run as ``spark-submit`` children: the pytest
process keeps its one local session, the ``spark`` fixture, for the local-mode side of each comparison."""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_TESTS = Path(__file__).parent.parent.parent
for folder in (_TESTS / "connectors", _TESTS / "connectors" / "lakehouse", _TESTS / "core"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from connect_server import ConnectServer  # noqa: E402
from sources_app import on_cluster  # noqa: E402, F401 - the session fixture
from standalone import StandaloneCluster  # noqa: E402


@pytest.fixture(scope="session")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    # Launched, not waited for: its JVMs start while the test's other fixtures do; a job waits for its
    # workers (StandaloneCluster.wait_ready) before it is submitted.
    cluster = StandaloneCluster(tmp_path_factory.mktemp("standalone")).launch()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    server = ConnectServer(tmp_path_factory.mktemp("connect")).start()
    try:
        yield server
    finally:
        server.stop()
