"""Spark's streaming-source planners forked from a process that has imported them already.

Spark starts a new Python process for every streaming query of a Python data source (the query's
offset planner, ``python_streaming_source_runner``), and the query plans no micro-batch before that
process has imported pyspark.sql, pyarrow and the source's modules: ~0.45 s of a query's start, where
a JVM source (``rate``, Spark's Kafka source) starts at once. Spark forks its Python *workers* from a
warm daemon, not its planners.

In the local sessions cdcflow starts (:func:`~cdcflow.connectors.spark.session.installed_pyspark_workers`),
the Python the JVM starts for the data sources it finds (``PYSPARK_DRIVER_PYTHON``) is a launcher
(:mod:`.planner_launcher`): a planner's start goes to a server of this process
(:mod:`.planner_server`) that has imported its modules and forks; everything else is this
interpreter, ``exec``'d as it was given.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import inspect
import os
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from cdcflow.connectors.spark import planner_launcher, planner_server

SOCKET_ENV = "CDCFLOW_PLANNER_SOCKET"
"""The launcher finds the server's Unix socket here (set in the JVM's environment, passed on to it)."""
SHEBANG_LIMIT = 127
"""The longest ``#!`` line every Linux kernel runs (5.1 and later take 255)."""


@dataclass
class Server:
    """A running server and the launcher that reaches it."""

    launcher: str
    socket: str
    process: subprocess.Popen[bytes]
    owner: int = field(default_factory=os.getpid)

    def running(self) -> bool:
        return os.getpid() == self.owner and self.process.poll() is None

    def close(self) -> None:
        if os.getpid() != self.owner:
            return  # a fork of the driver: the server is its parent's
        if self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(5)
        with contextlib.suppress(OSError):
            os.unlink(self.socket)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(self.socket))


_servers: list[Server] = []
_lock = threading.Lock()


def current() -> Server | None:
    """This process's running server, if any."""
    return _servers[0] if _servers and _servers[0].running() else None


def launcher(cache: Path | None = None) -> str | None:
    """The launcher script for this interpreter in ``cache`` (default ``~/.cache/cdcflow``), written
    once and tried; None where it cannot be written or would not run (a ``#!`` line the kernel cannot
    take, a cache on a ``noexec`` mount)."""
    shebang = f"#!{sys.executable} -IS"
    if any(c.isspace() for c in sys.executable) or len(shebang) > SHEBANG_LIMIT:
        return None
    call = f"main({sys.executable!r}, {planner_server.FORKED_MODULES!r}, {SOCKET_ENV!r}, sys.argv[1:])"
    text = f"{shebang}\n{inspect.getsource(planner_launcher)}\nimport sys  # noqa: E402\n\n{call}\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    root = cache or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cdcflow"
    path = root / "planner-launcher" / f"python-{digest}"
    if not path.is_file():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, partial = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
            with os.fdopen(handle, "w") as out:
                out.write(text)
            os.chmod(partial, 0o755)  # noqa: S103 - the JVM executes it
            os.replace(partial, path)
        except OSError:
            return None
    return str(path) if _runs(path) else None


def _runs(script: Path) -> bool:
    try:
        done = subprocess.run(  # noqa: S603 - the launcher written above
            [str(script), "-c", "pass"], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def start(cache: Path | None = None) -> Server | None:
    """This process's server, started when there is none running (on the socket path of the one
    before, which the JVM may hold); None where there can be none (no Unix sockets, no launcher)."""
    with _lock:
        running = current()
        if running is not None:
            return running
        if not hasattr(socket, "AF_UNIX") or not hasattr(socket, "send_fds"):
            return None
        script = launcher(cache)
        if script is None:
            return None
        # A JVM keeps the socket path it was started with: a server that ended is started on it again.
        path = (
            _servers[0].socket
            if _servers
            else os.path.join(tempfile.mkdtemp(prefix="cdcflow-planners-"), "socket")
        )
        os.makedirs(os.path.dirname(path), exist_ok=True)
        process = subprocess.Popen(  # noqa: S603 - this interpreter, our module
            [sys.executable, "-m", planner_server.__name__, path, str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # pyspark gives its Python processes this hash seed (SparkContext.environment)
            env={**os.environ, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")},
            start_new_session=True,  # a Ctrl-C in the terminal is the driver's to handle
        )
        server = Server(script, path, process)
        if _servers:
            _servers[0] = server
        else:
            _servers.append(server)
            atexit.register(_close)
        return server


def _close() -> None:
    for server in _servers:
        server.close()
