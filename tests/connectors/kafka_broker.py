"""A real Apache Kafka broker for the tests: one KRaft node (broker and controller) on 127.0.0.1.

The jars come from the Java cache (``java_cache.component("kafka")``, fetched with Maven on first use),
the shared settings from docker/kafka/broker.properties; this module adds the node-local lines (free
ports, the data folder), formats the storage once (``kafka.tools.StorageTool format``) and runs
``kafka.Kafka`` with its log in ``workdir/broker.log``. ``python tests/connectors/kafka_broker.py``
starts one and prints its bootstrap servers until Ctrl-C.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import TracebackType

import java_cache

SHARED_PROPERTIES = java_cache.ROOT / "docker" / "kafka" / "broker.properties"
HEAP = "-Xmx512m"
_READY_TIMEOUT_S = 120.0
_STOP_TIMEOUT_S = 30.0
_FORMAT_TIMEOUT_S = 120.0
_PORT_ATTEMPTS = 3

_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


class KafkaBrokerError(RuntimeError):
    """The test broker could not be started or did not answer; the message has its log's tail."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _cluster_id() -> str:
    # Kafka's Uuid text form: 16 random bytes, URL-safe base64 without padding (what `random-uuid`
    # prints, without starting a JVM for it). One starting with "-" would read as an option.
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _die_with_parent() -> None:
    # The broker gets SIGTERM when the test process dies without stopping it (a killed pytest).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class KafkaBroker:
    """A single-node KRaft broker whose data, settings and log live in ``workdir``."""

    def __init__(self, workdir: Path, *, java: str | None = None) -> None:
        self.workdir = workdir
        self.java = java or shutil.which("java") or "java"
        self.port = _free_port()
        self.controller_port = _free_port()
        self.log_file = workdir / "broker.log"
        self._properties = workdir / "server.properties"
        self._log4j = workdir / "log4j2.properties"
        self._data = workdir / "data"
        self._process: subprocess.Popen[bytes] | None = None
        self._classpath: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = _READY_TIMEOUT_S) -> KafkaBroker:
        """Format the storage (first start only), launch the broker and wait until it answers."""
        if self.running:
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        if (self._data / "meta.properties").exists():
            return self._launch(timeout_s)
        self._write_settings()
        self._format()
        for _ in range(_PORT_ATTEMPTS - 1):
            logged = self.log_file.stat().st_size if self.log_file.exists() else 0
            try:
                return self._launch(timeout_s)
            except KafkaBrokerError:
                # another process took a port between choosing and binding it: new ports, same data
                with self.log_file.open("rb") as log:
                    log.seek(logged)
                    if b"Address already in use" not in log.read():
                        raise
            self.port, self.controller_port = _free_port(), _free_port()
            self._write_settings()
        return self._launch(timeout_s)

    def _launch(self, timeout_s: float) -> KafkaBroker:
        with (self.workdir / "broker.stderr").open("ab") as stderr:
            self._process = subprocess.Popen(  # noqa: S603 - our java, fixed arguments
                [*self._java("kafka.Kafka"), str(self._properties)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - no threads are started in between
            )
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL if the broker has not exited in time."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def restart(self, timeout_s: float = _READY_TIMEOUT_S) -> KafkaBroker:
        """Stop and start again on the same ports with the same data."""
        self.stop()
        return self.start(timeout_s)

    def log_tail(self, lines: int = 40) -> str:
        parts = []
        for path in (self.log_file, self.workdir / "broker.stderr"):
            if path.exists():
                text = path.read_text("utf-8", "replace").splitlines()[-lines:]
                if text:
                    parts.append(f"--- {path}\n" + "\n".join(text))
        return "\n".join(parts) or f"(no log in {self.workdir})"

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def _java(self, main: str) -> list[str]:
        if self._classpath is None:
            jars = java_cache.component("kafka")
            if jars is None:
                folder = java_cache.cache_dir() / "kafka"
                raise KafkaBrokerError(f"no Kafka jars in {folder}: run `bash scripts/java_deps.sh kafka`")
            self._classpath = str(jars / "*")
        return [
            self.java,
            HEAP,
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self._log4j}",
            "-cp",
            self._classpath,
            main,
        ]

    def _write_settings(self) -> None:
        node_local = [
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
            f"log.dirs={self._data}",
        ]
        shared = SHARED_PROPERTIES.read_text().rstrip("\n")
        self._properties.write_text(
            f"{shared}\n\n# node-local (kafka_broker.py)\n" + "\n".join(node_local) + "\n"
        )
        self._log4j.write_text(_LOG4J2.format(log=self.log_file))

    def _format(self) -> None:
        done = subprocess.run(  # noqa: S603 - our java, fixed arguments
            [
                *self._java("kafka.tools.StorageTool"),
                "format",
                "-t",
                _cluster_id(),
                "-c",
                f"{self._properties}",
            ],
            capture_output=True,
            text=True,
            timeout=_FORMAT_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise KafkaBrokerError(
                f"formatting the broker storage in {self._data} failed (exit {done.returncode}):\n"
                f"{done.stdout}{done.stderr}\n{self.log_tail()}"
            )

    def _wait_ready(self, timeout_s: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            process = self._process
            if process is None or process.poll() is not None:
                code = process.returncode if process is not None else None
                raise KafkaBrokerError(
                    f"the Kafka broker exited with code {code} while starting:\n{self.log_tail()}"
                )
            try:
                metadata = admin.list_topics(timeout=2)
                if metadata.brokers:
                    return
            except Exception as error:  # noqa: BLE001 - any failure means "not ready yet"
                last = str(error)
            time.sleep(0.2)
        raise KafkaBrokerError(
            f"the Kafka broker at {self.bootstrap_servers} did not answer within {timeout_s:.0f}s "
            f"(last: {last}); log tail:\n{self.log_tail()}"
        )


def main() -> int:
    import tempfile

    workdir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="cdcflow-kafka-"))
    started = time.monotonic()
    broker = KafkaBroker(workdir).start()
    print(
        f"Kafka broker ready in {time.monotonic() - started:.1f}s: bootstrap {broker.bootstrap_servers}\n"
        f"workdir {workdir} (log {broker.log_file}); Ctrl-C stops it",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while broker.running:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
