"""Spark's streaming-source planners forked from a process that has imported them already.

Spark starts a new Python process for every streaming query of a Python data source (the query's
offset planner, ``python_streaming_source_runner``), and the query plans no micro-batch before that
process has imported pyspark.sql, pyarrow and the source's modules: ~0.45 s of a query's start, where
a JVM source (``rate``, Spark's Kafka source) starts at once. Spark forks its Python *workers* from a
warm daemon, not its planners.

In the local sessions cdcflow starts (:func:`~cdcflow.connectors.spark.session.installed_pyspark_workers`),
the Python the JVM starts for data sources (``PYSPARK_DRIVER_PYTHON``) is a launcher that hands a
planner's start to a server which has imported those modules (:func:`serve`): the server forks, the
child takes the launcher's standard streams, environment and working directory and runs the planner's
module as ``python -m`` would, and the launcher exits with the child's exit code (a ``SIGTERM`` to the
launcher, Spark stopping the planner, is passed on). Every other command the launcher is given, and a
planner's whenever the server cannot take it, is this interpreter's, ``exec``'d as it was given. The
server ends with the process that started it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib
import os
import runpy
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOCKET_ENV = "CDCFLOW_PLANNER_SOCKET"
"""The launcher finds the server's Unix socket here (set in the JVM's environment, passed on to it)."""
FORKED_MODULES = ("pyspark.sql.streaming.python_streaming_source_runner",)
"""The ``-m`` modules the launcher hands to the server: one process per streaming query."""
PRELOADED = (*FORKED_MODULES, "cdcflow.connectors.spark.sources", "cdcflow.connectors.spark.readers")
"""What the server imports before it forks: the planner's module and cdcflow's sources."""

_HEADER = struct.Struct("!I")
_CODE = struct.Struct("!i")

LAUNCHER = '''\
#!{python} -IS
# cdcflow: Spark's streaming-source planners, forked (cdcflow.connectors.spark.warm_planners)
import os, signal, socket, struct, sys

PYTHON = {python!r}
FORKED = {forked!r}


def forked(path, module):
    """Run ``module`` in a child of the server at ``path``; return only when the server cannot take it."""
    request = repr({{"env": dict(os.environ), "cwd": os.getcwd(), "module": module}}).encode()
    try:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.connect(path)
        socket.send_fds(server, [struct.pack("!I", len(request)) + request], [0, 1, 2])
        child = struct.unpack("!i", receive(server, 4))[0]
    except (OSError, struct.error):
        return

    def stop(signum, frame):
        try:
            os.kill(child, signal.SIGTERM)
        finally:
            os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        code = struct.unpack("!i", receive(server, 4))[0]
    except (OSError, struct.error):
        code = 1
    os._exit(code)


def receive(server, size):
    data = b""
    while len(data) < size:
        more = server.recv(size - len(data))
        if not more:
            break
        data += more
    return data


args = sys.argv[1:]
path = os.environ.get("{socket_env}")
if path and len(args) == 2 and args[0] == "-m" and args[1] in FORKED:
    forked(path, args[1])
os.execv(PYTHON, [PYTHON, *args])
'''


@dataclass
class Server:
    """A running server and the launcher that reaches it."""

    launcher: str
    socket: str
    process: subprocess.Popen[bytes]

    def running(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.running():
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(5)
        with contextlib.suppress(OSError):
            os.unlink(self.socket)
            os.rmdir(os.path.dirname(self.socket))


_servers: list[Server] = []


def current() -> Server | None:
    """This process's running server, if any."""
    return _servers[0] if _servers and _servers[0].running() else None


def launcher(cache: Path | None = None, forked: tuple[str, ...] = FORKED_MODULES) -> str | None:
    """The launcher script for this interpreter in ``cache`` (default ``~/.cache/cdcflow``), written
    once; None where it cannot be written."""
    text = LAUNCHER.format(python=sys.executable, forked=forked, socket_env=SOCKET_ENV)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    root = cache or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cdcflow"
    path = root / "planner-launcher" / f"python-{digest}"
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.chmod(partial, 0o755)  # noqa: S103 - the JVM executes it
        os.replace(partial, path)
    except OSError:
        return None
    return str(path)


def start(cache: Path | None = None) -> Server | None:
    """This process's server (started once, and again if it ended); None where there can be none (no
    Unix sockets, the launcher cannot be written)."""
    running = current()
    if running is not None:
        return running
    script = launcher(cache)
    if script is None or not hasattr(socket, "AF_UNIX") or not hasattr(socket, "send_fds"):
        return None
    path = os.path.join(tempfile.mkdtemp(prefix="cdcflow-planners-"), "socket")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1")}
    process = subprocess.Popen(  # noqa: S603 - this interpreter, this module
        [sys.executable, "-m", __name__, path, str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # a Ctrl-C in the terminal is the driver's to handle, not the server's
    )
    server = Server(script, path, process)
    if _servers:
        _servers[0].close()
        _servers[0] = server
    else:
        _servers.append(server)
        atexit.register(_close)
    return server


def _close() -> None:
    for server in _servers:
        server.close()


def serve(path: str, parent: int, preloaded: tuple[str, ...] = PRELOADED) -> None:
    """Import ``preloaded``, then fork a child for each launcher that connects to ``path``, until the
    process ``parent`` ends."""
    for module in preloaded:
        importlib.import_module(module)
    for module in FORKED_MODULES:  # what it imports stays; runpy runs the module itself anew, as -m does
        sys.modules.pop(module, None)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    listener.settimeout(1.0)
    try:
        while os.getppid() == parent:
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            _fork(listener, connection)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _fork(listener: socket.socket, connection: socket.socket) -> None:
    fds: list[int] = []
    try:
        connection.settimeout(10.0)
        data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
        (size,) = _HEADER.unpack_from(data)
        body = data[_HEADER.size :]
        while len(body) < size:
            more = connection.recv(size - len(body))
            if not more:
                raise ConnectionError("the launcher left")
            body += more
        request = _request(body)
        if len(fds) != 3:
            raise ConnectionError("the launcher's standard streams are missing")
        if os.fork() == 0:
            _child(listener, connection, fds, request)
    except (OSError, ValueError):
        pass
    finally:
        for fd in fds:
            os.close(fd)
        connection.close()


def _request(body: bytes) -> dict[str, object]:
    import ast

    request = ast.literal_eval(body.decode())
    if not isinstance(request, dict) or request.get("module") not in FORKED_MODULES:
        raise ValueError("not a planner's start")
    return request


def _child(
    listener: socket.socket, connection: socket.socket, fds: list[int], request: dict[str, object]
) -> None:
    """The planner, in the forked child: never returns. Until the child has told the launcher its pid,
    a failure leaves the launcher to start the planner itself."""
    code, started = 1, False
    try:
        listener.close()
        for signum in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        env = request["env"]
        if not isinstance(env, dict):
            raise ValueError("no environment")
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in env.items()})
        os.chdir(str(request["cwd"]))
        if os.environ.get("PYTHONUNBUFFERED"):
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(AttributeError, ValueError):
                    stream.reconfigure(write_through=True)  # type: ignore[union-attr]
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        sys.path[1:1] = paths
        connection.sendall(_CODE.pack(os.getpid()))
        started = True
        code = _run(str(request["module"]))
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if started:
            with contextlib.suppress(OSError):
                connection.sendall(_CODE.pack(code))
        os._exit(code)


def _run(module: str) -> int:
    sys.argv = [module]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as ended:
        return ended.code if isinstance(ended.code, int) else int(ended.code is not None)
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
