"""The warm server of :mod:`.warm_planners`: imports a planner's modules once, then forks a child per
launcher that connects, and the child runs the planner as ``python -m`` would have.

A child takes the launcher's standard streams, environment, working directory and ``PYTHONPATH``; it
is refused (the launcher starts the planner itself) when the launcher's environment differs from the
server's in a setting read when Python starts or a module is imported (:func:`start_time_settings`).
Run as ``python -m cdcflow.connectors.spark.planner_server <socket> <parent pid>``; it ends with the
parent process.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import re
import runpy
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

FORKED_MODULES = ("pyspark.sql.streaming.python_streaming_source_runner",)
"""The ``-m`` modules the launcher hands to the server: a process per streaming query."""
PRELOADED = (*FORKED_MODULES, "cdcflow.connectors.spark.sources", "cdcflow.connectors.spark.readers")
"""What the server imports before it forks: the planner's module and cdcflow's sources."""
IMPORT_TIME_SETTINGS = frozenset({"SPARK_TESTING", "PYSPARK_ENABLE_NAMEDTUPLE_PATCH"})
"""Environment variables pyspark reads when its modules are imported."""

_PYTHON_SETTING = re.compile(r"PYTHON[A-Z]+|PYTHON_(GIL|CPU_COUNT|FROZEN_MODULES)")
_HEADER = struct.Struct("!I")
_INT = struct.Struct("!i")
_RECEIVE_S = 1.0


@dataclass(frozen=True)
class Request:
    env: dict[str, str]
    cwd: str
    module: str
    launcher: int

    @classmethod
    def parse(cls, body: bytes) -> Request:
        given = json.loads(body)
        if not isinstance(given, dict) or given.get("module") not in FORKED_MODULES:
            raise ValueError("not a planner's start")
        env, cwd, launcher = given.get("env"), given.get("cwd"), given.get("launcher")
        if not isinstance(env, dict) or not isinstance(cwd, str) or not isinstance(launcher, int):
            raise ValueError("no environment, working directory or launcher")
        return cls({str(k): str(v) for k, v in env.items()}, cwd, str(given["module"]), launcher)


def start_time_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The settings of ``env`` that a process reads only when it starts or imports pyspark: Python's own
    (``PYTHONHASHSEED``, ``PYTHONWARNINGS``, ...; not the path and buffering, which the child applies,
    nor Spark's ``PYTHON_*``) and :data:`IMPORT_TIME_SETTINGS`."""
    return {
        key: value
        for key, value in env.items()
        if (_PYTHON_SETTING.fullmatch(key) and key not in ("PYTHONPATH", "PYTHONUNBUFFERED"))
        or key in IMPORT_TIME_SETTINGS
    }


def serve(path: str, parent: int) -> None:
    """Import :data:`PRELOADED`, then fork a child for each launcher that connects to ``path``, until
    the process ``parent`` ends."""
    own = start_time_settings(os.environ)
    for module in PRELOADED:
        importlib.import_module(module)
    for module in FORKED_MODULES:  # what it imports stays; runpy runs the module itself anew, as -m does
        sys.modules.pop(module, None)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the JVM's children (pyspark starts it so)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    binding = f"{path}.{os.getpid()}"
    listener.bind(binding)
    listener.listen(16)
    os.rename(binding, path)  # the path appears once it is listened on
    listener.settimeout(1.0)
    try:
        while os.getppid() == parent:
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:  # out of descriptors, say: later connections may succeed
                time.sleep(0.1)
                continue
            _fork(listener, connection, own)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))


def _fork(listener: socket.socket, connection: socket.socket, own: dict[str, str]) -> None:
    """Fork a child for the request on ``connection``; a request that cannot be served is dropped (its
    launcher starts the planner itself)."""
    fds: list[int] = []
    try:
        connection.settimeout(_RECEIVE_S)
        data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
        if len(data) < _HEADER.size or len(fds) != 3:
            return
        (size,) = _HEADER.unpack_from(data)
        body = data[_HEADER.size :]
        while len(body) < size:
            more = connection.recv(size - len(body))
            if not more:
                return
            body += more
        request = Request.parse(body)
        if start_time_settings(request.env) != own:
            return
        if os.fork() == 0:
            _child(listener, connection, fds, request)
    except Exception:  # noqa: BLE001, S110 - any bad request: the launcher falls back to a fresh planner
        pass
    finally:
        for fd in fds:
            os.close(fd)
        connection.close()


def _child(listener: socket.socket, connection: socket.socket, fds: list[int], request: Request) -> None:
    """The planner, in the forked child: never returns, whatever happens. Until the child has sent the
    launcher its pid, a failure leaves the launcher to start the planner itself."""
    code, started = 1, False
    try:
        atexit._clear()  # the server's exit functions are the server's
        listener.close()
        for signum in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.environ.clear()
        os.environ.update(request.env)
        os.chdir(request.cwd)
        if os.environ.get("PYTHONUNBUFFERED"):
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(AttributeError, ValueError):
                    stream.reconfigure(write_through=True)  # type: ignore[union-attr]
        given = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.getcwd(), *given, *(p for p in sys.path[1:] if p not in given)]
        launcher = _watch(request.launcher)
        connection.sendall(_INT.pack(os.getpid()))
        started = True
        code = _run(request.module, launcher)
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - reported below; a child must never return into the server
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            if started:
                connection.sendall(_INT.pack(code & 0xFF))
        os._exit(code & 0xFF)


def _run(module: str, launcher: int | None) -> int:
    """Run ``module`` as ``__main__``; its exit code as ``python -m`` would give it."""
    sys.argv = [module]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as ended:
        if ended.code is None or isinstance(ended.code, int):
            return ended.code or 0
        print(ended.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - Python prints an uncaught exception and exits 1
        if _stopped(launcher):
            return 128 + signal.SIGTERM
        import traceback

        traceback.print_exc()
        return 1
    return 0


def _watch(pid: int) -> int | None:
    """A descriptor that becomes readable when the process ``pid`` ends (None where there is none)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _stopped(launcher: int | None, within_s: float = 1.0) -> bool:
    """Whether the launcher ended, or ends within ``within_s``: Spark stops a planner by ending its
    process (the launcher, which passes the ``SIGTERM`` on) and then closing its connection, so a
    child may see the connection close first. A fresh planner would have ended without a word."""
    if launcher is None:
        return False
    readable, _, _ = select.select([launcher], [], [], within_s)
    return bool(readable)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
