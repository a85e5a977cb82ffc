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

sys.path[:0] = [str(ROOT / "tests" / "connectors"), str(ROOT / "tests" / "connectors" / "stack")]


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
    import connect_worker
    import kafka_broker
    import postgres_server
    import register

    services = compose["services"]
    worker = services["connect"]
    worker_file = connect_worker.DOCKER_CONNECT / "worker.properties"
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
    )
    topic = f"{config['config']['topic.prefix']}.{config['config']['table.include.list']}"
    assert f"--topic={topic}" in services["ingest"]["command"]
