"""docker/compose.yml is a valid Compose file, and runs the files the native end-to-end tests run.

The schema is the Compose Specification's JSON Schema as published in docker-compose 1.29.2's wheel
(``compose/config/compose_spec.json``), fetched once with ``pip download`` into a cache folder and
checked against the wheel's pinned SHA-256.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

jsonschema = pytest.importorskip("jsonschema")
yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yml"
WHEEL = "docker_compose-1.29.2-py2.py3-none-any.whl"
WHEEL_SHA256 = "8d5589373b35c8d3b1c8c1182c6e4a4ff14bffa3dd0b605fcd08f73c94cef809"
SCHEMA_IN_WHEEL = "compose/config/compose_spec.json"

CONNECTORS = ROOT / "tests" / "connectors"
sys.path[:0] = [str(CONNECTORS), str(CONNECTORS / "stack"), str(CONNECTORS / "lakehouse")]

import connect_worker as connect_worker_module  # noqa: E402
import postgres_server  # noqa: E402
from kafka_fixture import kafka_cluster  # noqa: E402, F401 - a session fixture, shared
from sample_database import SEED_ROWS  # noqa: E402
from stack_fixtures import connect_worker, postgres, stack_bootstrap  # noqa: E402, F401 - the same


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cdcflow-tests" / "compose-spec"


@pytest.fixture(scope="module")
def compose_schema() -> dict[str, Any]:
    folder = cache_dir()
    wheel = folder / WHEEL
    if not wheel.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fetched = subprocess.run(  # noqa: S603 - pip, fixed arguments
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "docker-compose==1.29.2",
                "-d",
                str(folder),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if fetched.returncode != 0 or not wheel.exists():
            pytest.skip(f"cannot fetch docker-compose 1.29.2 from the package index: {fetched.stderr[-500:]}")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert digest == WHEEL_SHA256, f"{wheel}: sha256 {digest}, want {WHEEL_SHA256}; delete it to fetch again"
    with zipfile.ZipFile(wheel) as archive:
        schema: dict[str, Any] = json.loads(archive.read(SCHEMA_IN_WHEEL))
    return schema


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return document


def errors(schema: dict[str, Any], document: dict[str, Any]) -> list[str]:
    # the schema names "http://json-schema.org/draft/2019-09/schema#"; jsonschema knows the https form
    assert "json-schema.org/draft/2019-09/" in schema["$schema"]
    jsonschema.Draft201909Validator.check_schema(schema)
    validator = jsonschema.Draft201909Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_compose_file_follows_the_compose_specification(
    compose_schema: dict[str, Any], compose: dict[str, Any]
) -> None:
    assert errors(compose_schema, compose) == []


def test_the_schema_rejects_what_compose_would_reject(
    compose_schema: dict[str, Any], compose: dict[str, Any]
) -> None:
    misspelt = copy.deepcopy(compose)
    misspelt["services"]["connect"]["depends_on"]["kafka"]["condition"] = "service_ready"
    unknown = copy.deepcopy(compose)
    unknown["services"]["ingest"]["comand"] = ["ingest"]
    assert any("service_ready" in e for e in errors(compose_schema, misspelt))
    assert any("comand" in e for e in errors(compose_schema, unknown))


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> the host path (resolved from docker/) of each bind mount."""
    found: dict[str, Path] = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            found[target] = (DOCKER / source).resolve()
    return found


def test_compose_runs_the_files_the_native_tests_run(compose: dict[str, Any]) -> None:
    import kafka_broker
    import register

    services = compose["services"]
    worker = services["connect"]
    worker_file = connect_worker_module.DOCKER_CONNECT / "worker.properties"
    assert mounts(worker)["/etc/cdcflow/connect/worker.properties"] == worker_file
    assert worker["build"]["context"] == "./connect"
    assert mounts(services["kafka"])["/etc/cdcflow/kafka/broker.properties"] == kafka_broker.SHARED_PROPERTIES
    assert "/etc/cdcflow/kafka/broker.properties" in "".join(services["kafka"]["command"])
    assert mounts(services["postgres"])["/docker-entrypoint-initdb.d"] == postgres_server.DOCKER_POSTGRES
    registered = mounts(services["register"])
    assert registered["/etc/cdcflow/connect/debezium-postgres.json"] == register.TEMPLATE
    assert registered["/etc/cdcflow/connect/register.py"] == Path(register.__file__).resolve()

    # every variable of the shared files is set by the service that reads it
    settings = [
        line for line in worker_file.read_text(encoding="utf-8").splitlines() if not line.startswith("#")
    ]
    wanted = set(re.findall(r"\$\{env:([A-Z_]+)\}", "\n".join(settings)))
    assert wanted and wanted <= set(worker["environment"]), wanted - set(worker["environment"])
    placeholders = set(re.findall(r"\$\{([A-Z_]+)\}", register.TEMPLATE.read_text(encoding="utf-8")))
    given = set(services["register"]["environment"])
    assert placeholders <= given, placeholders - given
    config = register.render(
        {name: str(value) for name, value in services["register"]["environment"].items()}
    )["config"]
    patterns = [
        arg.partition("=")[2] for arg in services["ingest"]["command"] if arg.startswith("--topic-pattern=")
    ]
    assert len(patterns) == 1, services["ingest"]["command"]
    # the topics Debezium names <prefix>.<schema>.<table>, of every table of the captured schema
    for table in SEED_ROWS:
        topic = f"{config['topic.prefix']}.{config['schema.include.list']}.{table}"
        assert re.fullmatch(patterns[0], topic), (patterns[0], topic)
    assert not re.fullmatch(patterns[0], f"other.{config['schema.include.list']}.items")


ENTRYPOINT = re.compile(r'^ENTRYPOINT \["cdcflow"\]$', re.MULTILINE)


def adapt(command: list[str], adaptations: dict[str, str]) -> list[str]:
    """``command`` with each host name or path of the compose network replaced by the stack's; every
    adaptation must be used."""
    adapted = []
    for arg in command:
        for compose_value, ours in adaptations.items():
            arg = arg.replace(compose_value, ours)
        adapted.append(arg)
    unused = [value for value in adaptations if not any(value in arg for arg in command)]
    assert not unused, f"adaptations the compose command no longer needs: {unused}"
    return adapted


@pytest.mark.integration
def test_the_compose_ingest_command_lands_the_table_on_the_test_stack(
    compose: dict[str, Any],
    postgres: postgres_server.PostgresServer,  # noqa: F811 - the fixture
    connect_worker: connect_worker_module.ConnectWorker,  # noqa: F811 - the fixture
    stack_bootstrap: str,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    """PostgreSQL → Debezium on Connect → Kafka as the compose file registers it, then the compose
    file's ingest command, run as the image runs it (``cdcflow`` is its entrypoint), with only these
    changes: the broker's host name, the volume's path, and the register service's database host and
    exactly-once setting (the session's worker runs without exactly-once source support). Each table of
    the sample database then lands in a Delta table equal to PostgreSQL's rows and follows a change;
    Ctrl-C ends the run with 130."""
    from ingest_process import tail, wait_session_gone
    from test_connect_database import wait_all_equal
    from test_connect_ingest import wait_records

    services = compose["services"]
    assert ENTRYPOINT.search((DOCKER / "Dockerfile").read_text(encoding="utf-8"))
    assert "lake:/lake" in services["ingest"]["volumes"]
    register_values = {name: str(value) for name, value in services["register"]["environment"].items()}
    register_values |= {
        "POSTGRES_HOST": "127.0.0.1",  # the service name postgres
        "POSTGRES_PORT": str(postgres.port),  # 5432
        "EXACTLY_ONCE_SUPPORT": "requested",  # required: the session's worker has no exactly-once support
    }
    database = register_values["POSTGRES_DB"]
    postgres.create_database(database, postgres_server.DOCKER_POSTGRES / "10-inventory.sql")
    connect_worker.register(register_values)
    for table, rows in SEED_ROWS.items():
        wait_records(stack_bootstrap, f"{register_values['TOPIC_PREFIX']}.inventory.{table}", rows)

    lake = tmp_path / "lake"
    command = adapt(
        services["ingest"]["command"],
        {
            "kafka:9092": stack_bootstrap,  # the broker's host name in the compose network
            "/lake/": f"{lake}/",  # the volume "lake", mounted at /lake
        },
    )
    log = tmp_path / "ingest.log"
    with log.open("wb") as out:
        job = subprocess.Popen(  # noqa: S603 - the compose file's command
            [sys.executable, "-m", "cdcflow", *command],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        tables = lake / "inventory"
        wait_all_equal(postgres, database, tables, list(SEED_ROWS), job, log)
        postgres.psql(
            "UPDATE inventory.items SET qty = 0 WHERE id = 4; DELETE FROM inventory.items WHERE id = 5;\n"
            "UPDATE inventory.order_lines SET amount = 0.01 WHERE order_id = 1000 AND line_no = 1;",
            db=database,
        )
        wait_all_equal(postgres, database, tables, list(SEED_ROWS), job, log)
        os.killpg(job.pid, signal.SIGINT)
        assert job.wait(timeout=120) == 130, tail(log, 40)
        assert "cdcflow ingest: interrupted (Ctrl-C): committed " in tail(log, 1), tail(log, 40)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        wait_session_gone(job.pid)
