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
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """The port of a server running ``handler`` until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


class RegistryHandler(BaseHTTPRequestHandler):
    """A minimal Schema Registry: ``POST /subjects/{s}/versions`` registers (the same text gets the
    same id), ``GET /schemas/ids/{id}`` and ``GET /subjects/{s}/versions/latest`` read back; anything
    else (``/associations`` included) is a 404. Subclass it per test: ``schemas`` is per class."""

    schemas: dict[int, tuple[str, str]]  # id -> (schema text, schema type)
    subjects: dict[str, list[int]]
    requests: list[str]

    @classmethod
    def fresh(cls) -> type[RegistryHandler]:
        return type("Registry", (cls,), {"schemas": {}, "subjects": {}, "requests": []})

    def _reply(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _not_found(self) -> None:
        self._reply(404, {"error_code": 40403, "message": f"{self.path} not found"})

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.requests.append(f"POST {self.path}")
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) != 3 or parts[0] != "subjects" or parts[2] != "versions":
            self._not_found()
            return
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        entry = (request["schema"], request.get("schemaType", "AVRO"))
        schema_id = next((i for i, known in self.schemas.items() if known == entry), len(self.schemas) + 1)
        self.schemas[schema_id] = entry
        versions = self.subjects.setdefault(parts[1], [])
        if schema_id not in versions:
            versions.append(schema_id)
        self._reply(200, {"id": schema_id})

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.requests.append(f"GET {self.path}")
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) == 3 and parts[:2] == ["schemas", "ids"] and int(parts[2]) in self.schemas:
            text, kind = self.schemas[int(parts[2])]
            self._reply(200, {"schema": text, "schemaType": kind})
        elif len(parts) == 4 and parts[0] == "subjects" and parts[2:] == ["versions", "latest"]:
            versions = self.subjects.get(parts[1])
            if not versions:
                self._not_found()
                return
            text, kind = self.schemas[versions[-1]]
            payload = {"subject": parts[1], "version": len(versions), "id": versions[-1], "schema": text}
            self._reply(200, {**payload, "schemaType": kind})
        else:
            self._not_found()

    def log_message(self, *args: object) -> None:
        """Quiet."""
