"""librdkafka's mock Kafka cluster, run as a separate process that other processes reach over TCP.

No broker runs on the build machines; the librdkafka bundled in the confluent-kafka wheel contains a
mock cluster that speaks the Kafka protocol. ``python tests/connectors/kafka_mock.py`` starts one,
prints its bootstrap servers (``127.0.0.1:PORT,...``) on stdout, then answers line commands on stdin
with ``ok`` or ``error <reason>``, and exits when stdin closes:

- ``create-topic NAME PARTITIONS`` (the mock's admin topic creation times out; create topics here,
  before consumers subscribe);
- ``delete-records TOPIC PARTITION BEFORE_OFFSET`` (moves the low watermark, as retention does).

The mock keeps its data in memory and lacks transactions under ``read_committed`` and
``offsets_for_times``. :class:`InProcessMockCluster` runs one inside the test process instead, where a
test can make its brokers answer requests with errors (a leader that moved, ...).
"""

from __future__ import annotations

import argparse
import ctypes
import select
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import IO

from cdcflow.connectors.errors import KafkaConnectorError

_RD_KAFKA_PRODUCER = 0
_START_TIMEOUT_S = 30.0
_REPLY_TIMEOUT_S = 30.0
_USAGE = "create-topic NAME PARTITIONS | delete-records TOPIC PARTITION BEFORE_OFFSET"


def _librdkafka() -> ctypes.CDLL:
    import confluent_kafka

    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka-*.so*"))
    if not found:
        raise KafkaConnectorError(
            f"no bundled librdkafka in {libs}: the mock cluster needs the confluent-kafka wheel from PyPI"
        )
    lib = ctypes.CDLL(str(found[0]))
    ptr, text, size = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    lib.rd_kafka_conf_new.restype = ptr
    lib.rd_kafka_conf_set.argtypes = [ptr, text, text, text, size]
    lib.rd_kafka_new.restype = ptr
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ptr, text, size]
    lib.rd_kafka_destroy.argtypes = [ptr]
    lib.rd_kafka_mock_cluster_new.restype = ptr
    lib.rd_kafka_mock_cluster_new.argtypes = [ptr, ctypes.c_int]
    lib.rd_kafka_mock_cluster_destroy.argtypes = [ptr]
    lib.rd_kafka_mock_cluster_bootstraps.restype = text
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ptr]
    lib.rd_kafka_mock_topic_create.restype = ctypes.c_int
    lib.rd_kafka_mock_topic_create.argtypes = [ptr, text, ctypes.c_int, ctypes.c_int]
    lib.rd_kafka_mock_partition_delete_records.restype = ctypes.c_int
    lib.rd_kafka_mock_partition_delete_records.argtypes = [ptr, text, ctypes.c_int32, ctypes.c_int64]
    lib.rd_kafka_mock_push_request_errors_array.argtypes = [
        ptr,
        ctypes.c_int16,
        size,
        ctypes.POINTER(ctypes.c_int),
    ]
    lib.rd_kafka_err2str.restype = text
    lib.rd_kafka_err2str.argtypes = [ctypes.c_int]
    return lib


class _Server:
    """The mock cluster inside this process, hosted by a librdkafka producer handle."""

    def __init__(self, brokers: int) -> None:
        self.lib = _librdkafka()
        conf = self.lib.rd_kafka_conf_new()
        error = ctypes.create_string_buffer(512)
        # The host handle has no bootstrap servers of its own: keep its configuration warning quiet.
        self.lib.rd_kafka_conf_set(conf, b"log_level", b"4", error, len(error))
        self.handle = self.lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, error, len(error))
        if not self.handle:
            raise KafkaConnectorError(f"librdkafka could not create the mock host: {error.value.decode()}")
        self.cluster = self.lib.rd_kafka_mock_cluster_new(self.handle, brokers)
        if not self.cluster:
            raise KafkaConnectorError("librdkafka could not create the mock cluster")
        self.bootstrap_servers: str = self.lib.rd_kafka_mock_cluster_bootstraps(self.cluster).decode()

    def execute(self, line: str) -> str:
        words = line.split()
        try:
            if words[:1] == ["create-topic"] and len(words) == 3:
                code = self.lib.rd_kafka_mock_topic_create(self.cluster, words[1].encode(), int(words[2]), 1)
            elif words[:1] == ["delete-records"] and len(words) == 4:
                code = self.lib.rd_kafka_mock_partition_delete_records(
                    self.cluster, words[1].encode(), int(words[2]), int(words[3])
                )
            else:
                return f"error unknown command; use: {_USAGE}"
        except ValueError:
            return f"error not a number in: {line}"
        return "ok" if code == 0 else f"error {self.lib.rd_kafka_err2str(code).decode()}"

    def close(self) -> None:
        self.lib.rd_kafka_mock_cluster_destroy(self.cluster)
        self.lib.rd_kafka_destroy(self.handle)


class InProcessMockCluster(_Server):
    """A mock cluster inside the test process, where a test can make the brokers answer with errors.

    librdkafka's requests of one kind (``api_key``: 2 is ListOffsets, the watermark queries) from any
    client fail in turn with the errors pushed; a watermark query sends two (low and high) at once.
    """

    LIST_OFFSETS = 2

    def __init__(self, brokers: int = 1) -> None:
        super().__init__(brokers)

    def create_topic(self, name: str, partitions: int = 1) -> None:
        reply = self.execute(f"create-topic {name} {partitions}")
        if reply != "ok":
            raise KafkaConnectorError(f"mock Kafka cluster: creating topic {name} failed: {reply}")

    def fail_requests(self, api_key: int, error: int, count: int) -> None:
        """The next ``count`` requests of ``api_key`` fail with the broker error code ``error``."""
        errors = (ctypes.c_int * count)(*([error] * count))
        self.lib.rd_kafka_mock_push_request_errors_array(self.cluster, api_key, count, errors)

    def __enter__(self) -> InProcessMockCluster:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def serve(brokers: int, commands: IO[str], replies: IO[str]) -> None:
    server = _Server(brokers)
    try:
        print(server.bootstrap_servers, file=replies, flush=True)
        for line in commands:
            if line.strip():
                print(server.execute(line), file=replies, flush=True)
    finally:
        server.close()


class MockKafkaCluster:
    """A mock cluster in a child process; use as a context manager or call start/stop."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None
        self._stderr: IO[bytes] | None = None
        self._lock = threading.Lock()
        self._bootstrap: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        if self._bootstrap is None:
            raise KafkaConnectorError("the mock Kafka cluster is not started: call start() first")
        return self._bootstrap

    def start(self, brokers: int = 1) -> MockKafkaCluster:
        if self._process is not None:
            raise KafkaConnectorError("the mock Kafka cluster is already started")
        self._stderr = tempfile.TemporaryFile()
        self._process = subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
            [sys.executable, __file__, "--brokers", str(brokers)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._bootstrap = self._reply(_START_TIMEOUT_S, "start")
        return self

    def create_topic(self, name: str, partitions: int = 1) -> None:
        self._command(f"create-topic {name} {partitions}")

    def delete_records(self, topic: str, partition: int, before_offset: int) -> None:
        """Delete a partition's records below ``before_offset``, as retention would."""
        self._command(f"delete-records {topic} {partition} {before_offset}")

    def stop(self) -> None:
        process, self._process, self._bootstrap = self._process, None, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
        if self._stderr is not None:
            self._stderr.close()

    def __enter__(self) -> MockKafkaCluster:
        return self if self._process is not None else self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def _command(self, line: str) -> None:
        with self._lock:
            process = self._process
            if process is None or process.stdin is None:
                raise KafkaConnectorError("the mock Kafka cluster is not started: call start() first")
            process.stdin.write(line + "\n")
            process.stdin.flush()
            reply = self._reply(_REPLY_TIMEOUT_S, line)
        if reply != "ok":
            raise KafkaConnectorError(f"mock Kafka cluster: '{line}' failed: {reply.removeprefix('error ')}")

    def _reply(self, timeout_s: float, doing: str) -> str:
        process = self._process
        line = ""
        if process is not None and process.stdout is not None:
            ready, _, _ = select.select([process.stdout], [], [], timeout_s)
            line = process.stdout.readline() if ready else ""
        if not line:
            raise KafkaConnectorError(
                f"the mock Kafka cluster process did not answer '{doing}' within {timeout_s:.0f}s "
                f"(exit code {process.poll() if process else None}): {self._stderr_tail()}"
            )
        return line.strip()

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()[-2000:].decode("utf-8", "replace").strip() or "no output on stderr"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/connectors/kafka_mock.py", description=__doc__)
    parser.add_argument("--brokers", type=int, default=1, help="number of mock brokers (default 1)")
    args = parser.parse_args(argv)
    serve(args.brokers, sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
