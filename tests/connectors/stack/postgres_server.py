"""A throwaway PostgreSQL 15 server (Debian's package) with logical decoding, for the stack tests.

Run as root, the cluster belongs to the ``postgres`` user (initdb refuses root); statements go through
``psql`` over TCP with trust authentication.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

PG_BIN = Path(os.environ.get("CDCFLOW_PG_BIN", "/usr/lib/postgresql/15/bin"))
DOCKER_POSTGRES = Path(__file__).resolve().parents[3] / "docker" / "postgres"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.as_root = os.geteuid() == 0

    def _cmd(self, args: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *args] if self.as_root else args

    def _ctl(self, *args: str) -> None:
        opts = f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.root}"
        subprocess.run(  # noqa: S603 - the local server's own tools
            self._cmd([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", opts + " -c fsync=off", *args]),
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def start(self) -> PostgresServer:
        """initdb, start, run docker/postgres/00-logical-decoding.sql (ALTER SYSTEM), restart."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
        subprocess.run(  # noqa: S603
            self._cmd(
                [str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
                + ["--locale=C.UTF-8"]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        self._ctl("-l", str(self.root / "server.log"), "-w", "start")
        self.psql((DOCKER_POSTGRES / "00-logical-decoding.sql").read_text(encoding="utf-8"), db="postgres")
        self._ctl("-l", str(self.root / "server.log"), "-w", "restart")
        return self

    def create_database(self, name: str, *sql_files: Path) -> None:
        self.psql(f'CREATE DATABASE "{name}";', db="postgres")
        for path in sql_files:
            self.psql(path.read_text(encoding="utf-8"), db=name)

    def psql(self, sql: str, db: str = "postgres") -> str:
        """Run ``sql`` (stops at the first error); the unaligned, tuples-only output."""
        out = subprocess.run(  # noqa: S603
            [str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", db]
            + ["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"],
            input=sql,
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"psql on {db} failed: {out.stderr}\n--- SQL ---\n{sql[:2000]}")
        return out.stdout

    def version(self) -> str:
        return self.psql("SHOW server_version;").strip()

    def stop(self) -> None:
        subprocess.run(  # noqa: S603
            self._cmd([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop"]),
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
