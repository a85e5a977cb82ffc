"""The launcher the JVM starts as its Python for data sources (:mod:`.warm_planners` writes it).

It runs as ``python -IS`` (no site, no environment settings) and imports the standard library only.
A streaming planner's start (``-m <a forked module>``) is handed to the warm server whose Unix socket
the environment names: the launcher's standard streams go with it, the child's pid comes back within
:data:`CONNECT_S`, and the launcher then waits for the child's exit code and exits with it, passing
a ``SIGTERM``/``SIGHUP``/``SIGINT`` it gets on to the child. Every other command, and a planner's
whenever the server cannot take it, becomes ``python`` itself (``exec``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
from types import FrameType

CONNECT_S = 2.0
"""How long the launcher waits for the server to answer with the child's pid before starting the
planner itself (Spark waits 10 s for a planner to connect back)."""
_INT = struct.Struct("!i")
_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def main(python: str, forked: tuple[str, ...], socket_env: str, args: list[str]) -> None:
    """Hand ``python -m <forked module>`` to the server the environment's ``socket_env`` names, or run
    ``python *args``."""
    path = os.environ.get(socket_env)
    if path and len(args) == 2 and args[0] == "-m" and args[1] in forked:
        _forked(path, args[1])
    os.execv(python, [python, *args])  # noqa: S606 - the interpreter, as the JVM asked for it


def _forked(path: str, module: str) -> None:
    """Run ``module`` in a child of the server at ``path``, exit with its code; return only when the
    server cannot take it."""
    pending: list[int] = []
    child: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if not child:
            pending.append(signum)
            return
        try:
            if len(child) > 1:
                signal.pidfd_send_signal(child[1], signum)
            else:
                os.kill(child[0], signum)
        except OSError:
            pass
        if signum != signal.SIGINT:
            os._exit(128 + signum)

    for signum in _FORWARDED:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, forward)
    given = {"env": dict(os.environ), "cwd": os.getcwd(), "module": module, "launcher": os.getpid()}
    request = json.dumps(given).encode()
    try:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.settimeout(CONNECT_S)
        server.connect(path)
        socket.send_fds(server, [struct.pack("!I", len(request)) + request], [0, 1, 2])
        pid = _INT.unpack(_receive(server, _INT.size))[0]
    except (OSError, struct.error):
        for waiting in pending:
            os._exit(128 + waiting)
        return
    child.append(pid)
    try:
        child.append(os.pidfd_open(pid))
    except (AttributeError, OSError):
        pass
    for waiting in pending:
        forward(waiting, None)
    server.settimeout(None)
    try:
        code = _INT.unpack(_receive(server, _INT.size))[0]
    except (OSError, struct.error):
        code = 1
    os._exit(code & 0xFF)


def _receive(server: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = server.recv(size - len(data))
        if not more:
            break
        data += more
    return data
