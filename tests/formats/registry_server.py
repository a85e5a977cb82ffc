"""A Schema Registry stand-in on 127.0.0.1: an ``http.server`` handler answering JSON, run in a thread."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    """Answers every GET with :meth:`answer`'s status and JSON body, quietly."""

    def answer(self) -> tuple[int, dict[str, Any]]:
        raise NotImplementedError

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        status, payload = self.answer()
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """Quiet."""


@contextmanager
def serving(handler: type[JsonHandler]) -> Iterator[int]:
    """The port of a server running ``handler`` until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
