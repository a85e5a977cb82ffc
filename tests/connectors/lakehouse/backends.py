"""The two apply back ends as test parameters, where the tables live (a local folder or the S3 test
server's bucket), and a table read back through Delta Lake's Spark reader."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from deltalake import DeltaTable
from java_cache import component

from cdcflow.connectors.lakehouse.delta.storage import Storage
from cdcflow.connectors.lakehouse.delta.tables import DELTA_RS, DeltaRsBackend, TableBackend

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from s3_server import Bucket

BACKENDS = ("delta-rs", "spark")


def table_backend(
    name: str, spark: SparkSession, storage_options: dict[str, str] | None = None
) -> TableBackend:
    if name == "delta-rs":
        return DeltaRsBackend(Storage(storage_options)) if storage_options else DELTA_RS
    from cdcflow.connectors.lakehouse.spark_backend import SparkDeltaBackend

    return SparkDeltaBackend(spark)


def delta_jars() -> str:
    """The folder of delta-spark's jars (what ``cdcflow ingest --delta-jars`` takes)."""
    folder = component("delta")
    if folder is None:
        pytest.fail("delta-spark's jars are missing: run scripts/java_deps.sh delta")
    return str(folder)


def hadoop_aws_jars() -> str:
    """The folder of hadoop-aws's jars (what ``cdcflow ingest --jars`` takes for an S3 checkpoint)."""
    folder = component("hadoop-aws", fetch=False)
    if folder is None:
        pytest.skip("Spark's checkpoint on S3 needs hadoop-aws's jars: run scripts/java_deps.sh hadoop-aws")
    return str(folder)


def delta_reader_rows(
    spark: SparkSession, path: str, storage_options: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The table's rows as ``spark.read.format("delta")`` reads them (no rows when no table exists)."""
    if not DeltaTable.is_deltatable(path, storage_options=storage_options):
        return []
    rows: list[dict[str, Any]] = spark.read.format("delta").load(path).toArrow().to_pylist()
    return rows


@dataclass
class Lake:
    """Where a test's tables and checkpoint go: ``local`` (a folder) or ``s3`` (its bucket on the S3
    test server; the checkpoint as ``s3a://``, as Spark users write it)."""

    folder: Path
    bucket: Bucket | None = None
    storage_options: dict[str, str] = field(default_factory=dict)

    @property
    def on_s3(self) -> bool:
        return self.bucket is not None

    def path(self, name: str, scheme: str = "s3") -> str:
        return str(self.folder / name) if self.bucket is None else self.bucket.uri(name, scheme)

    def table(self, name: str) -> DeltaTable:
        return DeltaTable(self.path(name), storage_options=self.storage_options or None)

    def version(self, name: str) -> int:
        if self.bucket is None:
            log = self.folder / name / "_delta_log"
            return max((int(p.stem) for p in log.glob("*.json") if p.stem.isdigit()), default=-1)
        return self.bucket.table_version(name)

    def local(self, name: str, into: Path) -> Path:
        """A local folder with what ``name`` holds (the folder itself, or a copy of the bucket's)."""
        return self.folder / name if self.bucket is None else self.bucket.download(name, into / name)

    def ingest_args(self) -> list[str]:
        """The ``cdcflow ingest`` flags that reach the store."""
        if self.bucket is None:
            return []
        options = [
            arg
            for key, value in self.storage_options.items()
            for arg in ("--storage-option", f"{key}={value}")
        ]
        return [*options, "--jars", hadoop_aws_jars()]


def lake(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Lake:
    """The ``Lake`` of a test parametrized over ``local``/``s3`` (the S3 server, bucket and Spark
    fixtures)."""
    if kind == "local":
        return Lake(tmp_path)
    request.getfixturevalue("s3_spark")  # Spark reaches the server too (skips without hadoop-aws's jars)
    bucket = request.getfixturevalue("s3_bucket")
    return Lake(tmp_path, bucket, bucket.server.options())
