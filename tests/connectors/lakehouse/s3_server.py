"""An S3-compatible server for the object storage tests: moto's server (``moto[server]``, the dev
extra), started on 127.0.0.1 once per test session, with one bucket per test.

``python tests/connectors/lakehouse/s3_server.py`` starts one by hand and prints its endpoint.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ACCESS_KEY = "cdcflow-test-key"
SECRET_KEY = "cdcflow-test-s3cr3t-value"  # noqa: S105 - moto accepts any credentials
REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class S3Server:
    """moto's S3 server as a child process, its output in ``log``."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> S3Server:
        with self.log.open("wb") as out:
            self._process = subprocess.Popen(  # noqa: S603 - our own command, fixed arguments
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1):  # noqa: S310 - local
                    return self
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"moto's S3 server did not start: {self.log.read_text()[-2000:]}"
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def options(self) -> dict[str, str]:
        """The storage options that reach it, as delta-rs takes them."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def hadoop_settings(self) -> dict[str, str]:
        """S3A's settings for it (Spark's ``spark.hadoop.`` settings without the prefix)."""
        return {
            "fs.s3a.endpoint": self.endpoint,
            "fs.s3a.endpoint.region": REGION,
            "fs.s3a.access.key": ACCESS_KEY,
            "fs.s3a.secret.key": SECRET_KEY,
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": "false",
            "fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
        }


@dataclass
class Bucket:
    """One test's bucket on the server."""

    name: str
    server: S3Server

    def uri(self, path: str, scheme: str = "s3") -> str:
        return f"{scheme}://{self.name}/{path.strip('/')}"

    def keys(self, prefix: str = "") -> list[str]:
        client, keys, token = self.server.client(), [], None
        while True:
            page = client.list_objects_v2(
                Bucket=self.name, Prefix=prefix, **({"ContinuationToken": token} if token else {})
            )
            keys.extend(item["Key"] for item in page.get("Contents", []))
            token = page.get("NextContinuationToken")
            if not token:
                return keys

    def read(self, key: str) -> bytes:
        body: bytes = self.server.client().get_object(Bucket=self.name, Key=key)["Body"].read()
        return body

    def download(self, prefix: str, into: Path) -> Path:
        """A local copy of the objects under ``prefix`` (to inspect with the local tests' helpers)."""
        for key in self.keys(prefix.strip("/") + "/"):
            if key.endswith("/"):
                continue
            local = into / key[len(prefix.strip("/")) + 1 :]
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(self.read(key))
        return into

    def table_version(self, prefix: str) -> int:
        """The newest commit in the Delta log of the table at ``prefix`` (-1: none)."""
        stems = (key.rsplit("/", 1)[1].removesuffix(".json") for key in self.keys(f"{prefix}/_delta_log/"))
        return max((int(stem) for stem in stems if stem.isdigit()), default=-1)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (the dev extra)")
    server = S3Server(tmp_path_factory.mktemp("moto") / "moto.log").start()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server, request: pytest.FixtureRequest) -> Bucket:
    digest = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:20]
    bucket = Bucket(f"cdcflow-{digest}-{os.getpid()}", s3_server)
    s3_server.client().create_bucket(Bucket=bucket.name)
    return bucket


def s3a_jars_loaded(spark: SparkSession) -> bool:
    jvm = spark._jvm
    assert jvm is not None
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName("org.apache.hadoop.fs.s3a.S3AFileSystem", False, loader)
    except Exception:
        return False
    return True


@pytest.fixture
def s3_spark(spark: SparkSession, s3_server: S3Server) -> SparkSession:
    """The session's Spark, reaching the server through S3A (skips without hadoop-aws's jars)."""
    if not s3a_jars_loaded(spark):
        pytest.skip(
            "Spark's checkpoint on S3 needs hadoop-aws and the AWS SDK modules in the test session: run "
            "scripts/java_deps.sh hadoop-aws (scripts/test.sh does)"
        )
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    for key, value in s3_server.hadoop_settings().items():
        hadoop.set(key, value)
    return spark


if __name__ == "__main__":
    import tempfile

    running = S3Server(Path(tempfile.mkdtemp()) / "moto.log").start()
    print(f"moto S3 at {running.endpoint} (any credentials); Ctrl-C stops it")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        running.stop()
