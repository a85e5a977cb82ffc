"""Register the Debezium connector (debezium-postgres.json) with a Kafka Connect worker and wait until
it runs. Standard library only: the compose stack runs it in the ingest image, the end-to-end tests
import it.

    python register.py [CONNECT_URL]      # placeholders ${NAME} from the environment

``CONNECT_URL`` defaults to $CONNECT_URL, else http://connect:8083.
"""

from __future__ import annotations

import json
import os
import string
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TEMPLATE = Path(__file__).with_name("debezium-postgres.json")
DEFAULTS = {"SCHEMAS_ENABLE": "true", "EXACTLY_ONCE_SUPPORT": "requested"}


def render(values: Mapping[str, str], template: Path = TEMPLATE) -> dict[str, Any]:
    """The connector's name and config with every ``${NAME}`` replaced (a missing one is an error)."""
    text = string.Template(template.read_text(encoding="utf-8")).substitute({**DEFAULTS, **values})
    document: dict[str, Any] = json.loads(text)
    return document


def request(url: str, method: str = "GET", body: Any = None, timeout: float = 30) -> Any:
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})  # noqa: S310
    with urllib.request.urlopen(req, timeout=timeout) as response:  # noqa: S310 - the worker's REST API
        text = response.read().decode("utf-8")
    return json.loads(text) if text else None


def wait_for_worker(url: str, timeout: float = 180) -> dict[str, Any]:
    """The worker's ``GET /`` (version, Kafka cluster id) once its REST API answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            info: dict[str, Any] = request(url + "/", timeout=5)
            return info
        except (OSError, urllib.error.URLError) as error:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Kafka Connect at {url} did not answer in {timeout:.0f} s: {error}"
                ) from None
            time.sleep(0.5)


def register(url: str, values: Mapping[str, str], timeout: float = 180) -> str:
    """PUT the rendered config (creates or updates the connector) and wait until it and its task run."""
    connector = render(values)
    name = connector["name"]
    deadline = time.monotonic() + timeout
    while True:
        try:
            request(f"{url}/connectors/{name}/config", "PUT", connector["config"])
            break
        except urllib.error.HTTPError as error:
            # 409: the worker is still joining its group or rebalancing
            if error.code != 409 or time.monotonic() > deadline:
                detail = error.read().decode("utf-8", "replace")
                raise RuntimeError(f"PUT {url}/connectors/{name}/config: {error.code} {detail}") from None
            time.sleep(0.5)
    wait_running(url, name, deadline - time.monotonic())
    return str(name)


def wait_running(url: str, name: str, timeout: float = 180) -> None:
    """Until ``name`` and all its tasks (at least one) are RUNNING; a FAILED one raises with its trace."""
    deadline = time.monotonic() + timeout
    status: Any = None
    while time.monotonic() < deadline:
        try:
            status = request(f"{url}/connectors/{name}/status", timeout=5)
        except (OSError, urllib.error.URLError):
            time.sleep(0.5)
            continue
        states = [status["connector"]] + status.get("tasks", [])
        failed = [s for s in states if s["state"] == "FAILED"]
        if failed:
            raise RuntimeError(f"connector {name} failed: {failed[0].get('trace', failed[0])}")
        if status.get("tasks") and all(s["state"] == "RUNNING" for s in states):
            return
        time.sleep(0.5)
    raise TimeoutError(f"connector {name} not RUNNING after {timeout:.0f} s: {status}")


def main(argv: list[str]) -> int:
    url = (argv[1] if len(argv) > 1 else os.environ.get("CONNECT_URL", "http://connect:8083")).rstrip("/")
    info = wait_for_worker(url)
    print(f"Kafka Connect {info.get('version')} at {url}", flush=True)
    name = register(url, os.environ)
    print(f"connector {name} is RUNNING", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
