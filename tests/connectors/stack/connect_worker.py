"""A Kafka Connect distributed worker (a cluster of one) with Debezium's PostgreSQL plugin.

It runs docker/connect/worker.properties as is: what differs from the compose stack comes in through
environment variables (the file's ``${env:NAME}``). Its connectors, offsets and status live in Kafka
topics named after the group id, so a restarted worker (same group id) resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

from postgres_server import free_port

_TESTS = Path(__file__).resolve().parents[2]
ROOT = _TESTS.parent
DOCKER_CONNECT = ROOT / "docker" / "connect"
sys.path.insert(0, str(_TESTS / "connectors"))
sys.path.insert(0, str(DOCKER_CONNECT))

import java_cache  # noqa: E402
import register  # noqa: E402

LOG4J = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.reflections.name = org.reflections
logger.reflections.level = error
"""


def _die_with_parent() -> None:
    # the worker gets SIGTERM when the test process dies without stopping it
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ConnectWorker:
    def __init__(self, workdir: Path, bootstrap_servers: str, group_id: str, *, exactly_once: bool) -> None:
        self.workdir = workdir
        self.bootstrap_servers = bootstrap_servers
        self.group_id = group_id
        self.exactly_once = exactly_once
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "connect.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "CONNECT_BOOTSTRAP_SERVERS": self.bootstrap_servers,
            "CONNECT_LISTENERS": self.url,
            "CONNECT_ADVERTISED_HOST": "127.0.0.1",
            "CONNECT_GROUP_ID": self.group_id,
            "CONNECT_EXACTLY_ONCE_SOURCE_SUPPORT": "enabled" if self.exactly_once else "disabled",
        }

    def start(self) -> ConnectWorker:
        """Launch the worker and wait until its REST API answers."""
        java_cache.component("debezium")
        classpath = java_cache.component("connect")
        assert classpath is not None, "scripts/java_deps.sh connect did not fetch Kafka Connect"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        log4j = self.workdir / "log4j2.properties"
        log4j.write_text(LOG4J.format(log=self.log), encoding="utf-8")
        with (self.workdir / f"stdout-{self.starts}.log").open("wb") as out:
            self.process = subprocess.Popen(  # noqa: S603 - java with fixed arguments
                ["java", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
                + [f"-Dlog4j2.configurationFile={log4j}", "-cp", f"{classpath}/*"]
                + [
                    "org.apache.kafka.connect.cli.ConnectDistributed",
                    str(DOCKER_CONNECT / "worker.properties"),
                ],
                env=self.env(),
                cwd=java_cache.cache_dir(),  # plugin.path=connect-plugins
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - no threads are started in between
            )
        register.wait_for_worker(self.url, timeout=180)
        return self

    def register(self, values: dict[str, str]) -> str:
        """Register docker/connect/debezium-postgres.json rendered with ``values``; wait for RUNNING."""
        return register.register(self.url, values, timeout=180)

    def wait_running(self, name: str) -> None:
        register.wait_running(self.url, name, timeout=180)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def restart(self, sig: signal.Signals = signal.SIGTERM) -> None:
        self.stop(sig)
        self.start()
