"""Streaming-source planners forked from a warm server: what the JVM starts through the launcher gets
the launcher's environment, streams and exit code, and a query of the suite's session is planned so."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from source_cases import EXCLUDE, PRODUCTS

from cdcflow.connectors.spark import planner_server, warm_planners
from cdcflow.connectors.spark.session import installed_pyspark_workers

PLANNER = planner_server.FORKED_MODULES[0]


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if parent_of(int(entry.name)) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError):
                continue
    return found


def exceptions(stderr: bytes) -> list[str]:
    """The lines of a traceback that are not frames."""
    return [line for line in stderr.decode().splitlines() if line and not line[0].isspace()]


def gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if state[state.rindex(")") + 2] == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A server of this test's own (the session's stays the session's): its socket and pid."""
    path = str(tmp_path / "planners.sock")
    process = subprocess.Popen(  # noqa: S603 - this interpreter, our module
        [sys.executable, "-m", "cdcflow.connectors.spark.planner_server", path, str(os.getpid())]
    )
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        assert process.poll() is None, "the server ended before it listened"
        assert time.monotonic() < deadline, "the server did not listen within 60 s"
        time.sleep(0.05)
    yield path, process.pid
    process.terminate()
    process.wait(10)


class FakeJvm:
    """The JVM's end of a planner's connection (``PYTHON_WORKER_FACTORY_SOCK_PATH``): the planner
    connects and sends its pid first."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(1)
        self.listener.settimeout(60)

    def planner_pid(self) -> tuple[socket.socket, int]:
        connection, _ = self.listener.accept()
        connection.settimeout(60)
        data = b""
        while len(data) < 4:
            more = connection.recv(4 - len(data))
            if not more:
                raise ConnectionError("the planner left before it sent its pid")
            data += more
        return connection, struct.unpack("!i", data)[0]


@pytest.fixture
def jvm(tmp_path: Path) -> Iterator[FakeJvm]:
    fake = FakeJvm(tmp_path / "jvm.sock")
    yield fake
    fake.listener.close()


@pytest.fixture
def launcher(tmp_path: Path) -> str:
    """The launcher for this interpreter, written to the test's own cache."""
    script = warm_planners.launcher(tmp_path / "cache")
    assert script is not None
    return script


def launch(launcher: str, jvm: FakeJvm, socket_path: str, *args: str, cwd: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHON_WORKER_FACTORY_SOCK_PATH": jvm.path,
        warm_planners.SOCKET_ENV: socket_path,
    }
    env.pop("PYTHON_WORKER_FACTORY_SECRET", None)
    return subprocess.Popen(  # noqa: S603 - the launcher cdcflow wrote
        [launcher, *args], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def test_a_planner_is_forked_by_the_server_with_the_launchers_environment_and_exit_code(
    server: tuple[str, int], jvm: FakeJvm, launcher: str, tmp_path: Path
) -> None:
    socket_path, server_pid = server
    forked = launch(launcher, jvm, socket_path, "-m", PLANNER, cwd=tmp_path)
    connection, pid = jvm.planner_pid()
    assert pid != forked.pid
    assert parent_of(pid) == server_pid  # forked by the warm server, not started by the launcher
    # It connected to the JVM the launcher's environment names, from the launcher's working directory.
    assert Path(f"/proc/{pid}/cwd").resolve() == tmp_path.resolve()
    connection.close()  # the JVM goes away: the planner fails reading its first command
    _, forked_err = forked.communicate(timeout=60)
    assert gone(pid)

    # The same planner started fresh (no server at that path): the same exit code and error.
    fresh = launch(launcher, jvm, str(tmp_path / "no-server.sock"), "-m", PLANNER, cwd=tmp_path)
    connection, pid = jvm.planner_pid()
    assert pid == fresh.pid  # the launcher exec'd this interpreter
    connection.close()
    _, fresh_err = fresh.communicate(timeout=60)
    assert forked.returncode == fresh.returncode != 0
    # The same exceptions (their frames differ only by how the module was run), and nothing else.
    assert exceptions(forked_err) == exceptions(fresh_err)
    assert exceptions(forked_err)[-1] == "BrokenPipeError: [Errno 32] Broken pipe"


def test_stopping_the_launcher_stops_its_planner(
    server: tuple[str, int], jvm: FakeJvm, launcher: str, tmp_path: Path
) -> None:
    socket_path, _ = server
    forked = launch(launcher, jvm, socket_path, "-m", PLANNER, cwd=tmp_path)
    connection, pid = jvm.planner_pid()
    forked.send_signal(signal.SIGTERM)  # what Spark's Process.destroy() sends
    forked.communicate(timeout=30)
    assert forked.returncode == 128 + signal.SIGTERM
    assert gone(pid)
    connection.close()


def test_every_other_command_is_this_interpreters(launcher: str, tmp_path: Path) -> None:
    done = subprocess.run(  # noqa: S603 - the launcher cdcflow wrote
        [launcher, "-c", "import sys; print(sys.executable, sys.argv[1:]); raise SystemExit(3)", "x"],
        capture_output=True,
        env={**os.environ, warm_planners.SOCKET_ENV: str(tmp_path / "unused.sock")},
        timeout=60,
        check=False,
    )
    assert done.returncode == 3
    assert done.stdout.decode().split() == [sys.executable, "['x']"]
    assert warm_planners.launcher(tmp_path / "cache") == launcher  # written once
    assert [p.name for p in (tmp_path / "cache" / "planner-launcher").iterdir()] == [Path(launcher).name]


def test_the_server_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    script = (
        "import os, time\n"
        "from pathlib import Path\n"
        "from cdcflow.connectors.spark import warm_planners\n"
        f"server = warm_planners.start(Path({str(tmp_path)!r}))\n"
        "while not os.path.exists(server.socket):\n"
        "    time.sleep(0.05)\n"
        "print(server.process.pid, server.socket, flush=True)\n"
        "os._exit(0)  # no atexit: the server must notice by itself\n"
    )
    done = subprocess.run(  # noqa: S603 - this interpreter, a fixed script
        [sys.executable, "-c", script], capture_output=True, timeout=120, check=True
    )
    pid, path = done.stdout.decode().split()
    assert gone(int(pid), within_s=15)
    assert not Path(path).parent.exists()  # its socket and folder removed


def test_a_bad_request_leaves_the_server_serving(
    server: tuple[str, int], jvm: FakeJvm, launcher: str, tmp_path: Path
) -> None:
    socket_path, server_pid = server
    for request in (b"", b"\x00\x00\x00\x05{oops", b"\x00\x00\x00\x02{}"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(socket_path)
            if request:
                socket.send_fds(client, [request], [0, 1, 2])
            else:
                client.sendall(request)
            assert client.recv(4) == b""  # dropped, no child
    forked = launch(launcher, jvm, socket_path, "-m", PLANNER, cwd=tmp_path)
    connection, pid = jvm.planner_pid()
    assert parent_of(pid) == server_pid
    connection.close()
    forked.communicate(timeout=60)


def test_a_planner_whose_python_settings_differ_from_the_servers_starts_fresh(
    server: tuple[str, int], jvm: FakeJvm, launcher: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh planner would read them when it starts (a hash seed, warnings): the server's child
    cannot, so the launcher starts the planner itself."""
    socket_path, _ = server
    monkeypatch.setenv("PYTHONHASHSEED", "123" if os.environ.get("PYTHONHASHSEED") != "123" else "7")
    fresh = launch(launcher, jvm, socket_path, "-m", PLANNER, cwd=tmp_path)
    connection, pid = jvm.planner_pid()
    assert pid == fresh.pid
    connection.close()
    fresh.communicate(timeout=60)


def test_the_session_sets_the_launcher_only_while_the_jvm_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark import SparkContext

    monkeypatch.setattr(SparkContext, "_gateway", None)  # as before a session's JVM starts
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
    with installed_pyspark_workers():
        server = warm_planners.current()
        assert server is not None
        assert os.environ["PYSPARK_DRIVER_PYTHON"] == server.launcher
        assert os.environ[warm_planners.SOCKET_ENV] == server.socket
    assert "PYSPARK_DRIVER_PYTHON" not in os.environ
    assert warm_planners.SOCKET_ENV not in os.environ
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", "/usr/bin/python3")  # the user's: left alone
    with installed_pyspark_workers():
        assert os.environ["PYSPARK_DRIVER_PYTHON"] == "/usr/bin/python3"
        assert warm_planners.SOCKET_ENV not in os.environ


QUERY = """
import json, os, sys
from pathlib import Path
from cdcflow.connectors.spark import warm_planners
from cdcflow.connectors.spark.jobs import local_session

def parent_of(pid):
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])

spark = local_session("cdcflow-warm-planner-test")
server = warm_planners.current()
query = (
    spark.readStream.format("cdc-debezium").option("columns", sys.argv[2]).load(sys.argv[1])
    .writeStream.format("memory").queryName("rows").trigger(processingTime="200 milliseconds").start()
)
query.processAllAvailable()
planners = []
for entry in Path("/proc").iterdir():
    try:
        command = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
        if b"python_streaming_source_runner" in command and b"planner-launcher" not in command:
            planners.append(command.decode(errors="replace"))
    except OSError:
        pass
children = []
for entry in Path("/proc").iterdir():
    try:
        if entry.name.isdigit() and server is not None and parent_of(int(entry.name)) == server.process.pid:
            children.append(int(entry.name))
    except (OSError, ValueError):
        pass
rows = spark.sql("SELECT count(*) FROM rows").collect()[0][0]
batch = spark.read.format("cdc-debezium").option("columns", sys.argv[2]).load(sys.argv[1]).count()
jvm = spark._jvm.java.lang.System
print(json.dumps({
    "server": None if server is None else server.process.pid,
    "children": children,
    "fresh planners": planners,
    "rows": rows,
    "batch rows": batch,
    "jvm PYSPARK_DRIVER_PYTHON": jvm.getenv("PYSPARK_DRIVER_PYTHON"),
    "launcher": None if server is None else server.launcher,
}))
query.stop()
spark.stop()
"""


@pytest.mark.integration
def test_a_streaming_query_of_a_local_session_is_planned_by_a_forked_planner(tmp_path: Path) -> None:
    """The user's path: a session cdcflow starts (``local_session``, as ``cdcflow ingest`` does), a
    streaming query of a ``cdc-*`` source: its planner is a child of the warm server (forked, so its
    command line is the server's, not ``python -m ...python_streaming_source_runner``)."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.txt").write_bytes(EXCLUDE.read_bytes())
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_DRIVER_PYTHON", "SPARK_HOME")}
    done = subprocess.run(  # noqa: S603 - this interpreter, a fixed script
        [sys.executable, "-c", QUERY, str(source), PRODUCTS],
        capture_output=True,
        env={**env, "XDG_CACHE_HOME": str(tmp_path / "cache")},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    found = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert found["server"] is not None, found
    assert found["jvm PYSPARK_DRIVER_PYTHON"] == found["launcher"], found
    assert len(found["children"]) == 1 and found["fresh planners"] == [], found
    assert found["rows"] == found["batch rows"] > 0
