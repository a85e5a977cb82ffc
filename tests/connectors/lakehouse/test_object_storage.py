"""Object storage: the Delta target, the key state and the checkpoint on an S3-compatible server (moto's,
``s3_server.py``), reached with delta-rs's storage options or the environment; and what is refused on
the driver before anything starts, with the fix and without showing a secret.

The golden, crash and PostgreSQL workload tests run on S3 too (their ``S3`` variants).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from backends import hadoop_aws_jars
from deltalake import DeltaTable, write_deltalake
from s3_server import SECRET_KEY, Bucket, S3Server

from cdcflow.connectors.errors import CheckpointInUseError, ConnectorOptionError, SparkSetupError
from cdcflow.connectors.lakehouse.checkpoint_lease import LEASE_DIR, CheckpointLease
from cdcflow.connectors.lakehouse.delta import app_identity
from cdcflow.connectors.lakehouse.delta.apply import DeltaChangeApplier
from cdcflow.connectors.lakehouse.delta.options import ApplyOptions, Materialize
from cdcflow.connectors.lakehouse.delta.storage import Storage
from cdcflow.connectors.lakehouse.delta.tables import DeltaRsBackend, read_table
from cdcflow.connectors.lakehouse.ingest import IngestConfig
from cdcflow.connectors.lakehouse.sink import DeltaSink, apply_options
from cdcflow.connectors.lakehouse.spark_storage import create_new, hadoop_settings, require_filesystem
from cdcflow.formats.redact import PLACEHOLDER

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DUMP = str(resources.files("cdcflow.examples").joinpath("postgres-debezium.dump.jsonl"))
SECRET = "s3cr3t-Value-never-shown"  # noqa: S105 - a made-up secret


# --- refused on the driver ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "options", "message"),
    [
        ("hdfs://namenode/lake/t", {}, "the Delta sink writes local paths and s3://"),
        ("s3:///lake/t", {}, "names no bucket or container: write it as s3://BUCKET/path"),
        (f"s3://AKIA:{SECRET}@bucket/t", {}, "credentials in the URI are not read; give them as storage"),
        (
            "s3://bucket/t",
            {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_SECRET_ACCESS_KEY": SECRET},
            "is plain HTTP, which delta-rs refuses unless AWS_ALLOW_HTTP=true",
        ),
        ("gs://bucket/t", {"google_service_account_key": SECRET}, "set GOOGLE_APPLICATION_CREDENTIALS"),
        (
            "s3://bucket/t",
            {"AWS_S3_LOCKING_PROVIDER": "dynamodb"},
            "delta-rs 1.x has no DynamoDB locking provider",
        ),
    ],
)
def test_a_location_the_sink_cannot_write_is_refused_with_the_fix(
    uri: str, options: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP"):
        monkeypatch.delenv(name, raising=False)
    sink = DeltaSink(uri, apply_options(["id"]), "/tmp/checkpoint", storage_options=options)  # noqa: S108
    with pytest.raises(ConnectorOptionError, match=message.replace("?", r"\?")) as error:
        sink.check_identity()
    assert SECRET not in str(error.value)


def test_a_storage_option_given_twice_is_refused() -> None:
    with pytest.raises(ConnectorOptionError, match="AWS_REGION is given twice"):
        IngestConfig(
            format="debezium-json",
            key=("id",),
            target="s3://bucket/t",
            checkpoint="s3a://bucket/chk",
            path=DUMP,
            storage_options={"AWS_REGION": "eu-west-1", "region": "us-east-1"},
        )


def test_secret_storage_options_are_hidden_in_reprs() -> None:
    secrets = {
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_SESSION_TOKEN": SECRET + "-token",
        "azure_storage_account_key": SECRET + "-azure",
        "AZURE_STORAGE_SAS_KEY": SECRET + "-sas",
        "GOOGLE_SERVICE_ACCOUNT_KEY": SECRET + "-gcs",
    }
    config = IngestConfig(
        format="debezium-json",
        key=("id",),
        target="s3://bucket/t",
        checkpoint="s3a://bucket/chk",
        path=DUMP,
        storage_options={**secrets, "AWS_REGION": "eu-west-1"},
    )
    for shown in (repr(config), repr(Storage(config.storage_options))):
        assert SECRET not in shown
        assert shown.count(PLACEHOLDER) == len(secrets)
        assert "'AWS_REGION': 'eu-west-1'" in shown


def test_the_session_this_job_starts_reaches_s3_with_the_storage_options() -> None:
    storage = Storage(
        {
            "endpoint": "http://127.0.0.1:9000",
            "AWS_ACCESS_KEY_ID": "me",
            "aws_secret_access_key": SECRET,
            "AWS_REGION": "eu-west-1",
        }
    )
    settings = hadoop_settings(storage, ["s3a://bucket/chk", "/local/t"])
    assert settings == {
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1",
        "spark.hadoop.fs.s3a.access.key": "me",
        "spark.hadoop.fs.s3a.secret.key": SECRET,
    }
    assert hadoop_settings(storage, ["/local/chk", "/local/t"]) == {}


@pytest.mark.integration
def test_spark_without_the_stores_file_system_fails_with_the_jars_to_add(spark: SparkSession) -> None:
    with pytest.raises(SparkSetupError, match=r"no file system for abfss://.*hadoop-azure"):
        require_filesystem(spark, "abfss://lake@account.dfs.core.windows.net/chk", "the checkpoint")


# --- against the S3 test server --------------------------------------------------------------------


def test_an_unreachable_bucket_fails_before_the_query_starts(s3_server: S3Server) -> None:
    options = {**s3_server.options(), "AWS_SECRET_ACCESS_KEY": SECRET}
    sink = DeltaSink("s3://no-such-bucket/t", apply_options(["id"]), "/tmp/chk", storage_options=options)  # noqa: S108
    with pytest.raises(
        ConnectorOptionError, match="the target 's3://no-such-bucket/t' cannot be reached: NoSuchBucket"
    ):
        sink.check_identity()


def test_concurrent_commits_on_s3_do_not_overwrite_each_other(s3_bucket: Bucket) -> None:
    """Two writers commit the same table version: delta-rs writes each commit file only if it is absent
    (S3's conditional put; no locking provider), so the second one retries at the next version and
    both appends are kept."""
    options = s3_bucket.server.options()
    uri = s3_bucket.uri("t")
    write_deltalake(uri, pa.table({"id": [0]}), storage_options=options)
    first, second = DeltaTable(uri, storage_options=options), DeltaTable(uri, storage_options=options)
    write_deltalake(first, pa.table({"id": [1]}), mode="append")
    write_deltalake(second, pa.table({"id": [2]}), mode="append")  # still at version 0
    latest = DeltaTable(uri, storage_options=options)
    assert latest.version() == 2
    assert sorted(latest.to_pyarrow_table().column("id").to_pylist()) == [0, 1, 2]
    assert sorted(
        key.rsplit("/", 1)[1] for key in s3_bucket.keys("t/_delta_log/") if key.endswith(".json")
    ) == [f"{version:020d}.json" for version in range(3)]


def test_the_applier_keeps_table_state_and_app_id_on_s3_with_credentials_from_the_environment(
    s3_bucket: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_bucket.server.options().items():
        monkeypatch.setenv(name, value)
    storage = Storage()  # nothing given: delta-rs and pyarrow read AWS_* from the environment
    target, checkpoint = s3_bucket.uri("t"), s3_bucket.uri("chk", "s3a")
    state = f"{checkpoint}/cdcflow-key-state"
    options = ApplyOptions(key=("id",), upsert_key=("id",), materialize=Materialize.FORCE)
    applier = DeltaChangeApplier(
        target, options, app_id="orders", state_path=state, backend=DeltaRsBackend(storage)
    )
    batches = [
        pa.table({"_row_kind": ["+I", "+I", "+I"], "id": [1, 2, 3], "name": ["a", "b", "c"]}),
        pa.table({"_row_kind": ["-U", "+U", "-D"], "id": [2, 2, 3], "name": ["b", "B", "c"]}),
        pa.table({"_row_kind": ["+I"], "id": [2], "name": ["again"]}),  # upsert materialization: 2 is live
    ]
    for batch_id, batch in enumerate(batches):
        assert not applier.apply(batch, batch_id).skipped
    assert applier.done(2) and not applier.done(3)
    rows = sorted(read_table(target, storage).to_pylist(), key=lambda row: row["id"])
    assert rows == [{"id": 1, "name": "a"}, {"id": 2, "name": "again"}]
    assert DeltaTable(state).transaction_version("orders") == 2
    assert s3_bucket.keys("chk/cdcflow-key-state/_delta_log/")

    app_identity.claim(checkpoint, "orders-2", target, state, record=True, chosen=False, storage=storage)
    assert s3_bucket.read("chk/cdcflow-app-id") == b"orders-2\n"
    with pytest.raises(ConnectorOptionError, match="as application id 'orders-2', not 'orders'"):
        app_identity.claim(checkpoint, "orders", target, state, record=False, storage=storage)


def test_the_checkpoints_lease_on_s3_is_written_with_a_conditional_put(
    s3_spark: SparkSession, s3_bucket: Bucket
) -> None:
    """A second job on an S3 checkpoint is refused; and the lease file of the first is never
    overwritten, even when S3A skips its own existence check: the store's If-None-Match keeps it."""
    storage = Storage(s3_bucket.server.options())
    checkpoint = s3_bucket.uri("chk", "s3a")
    first = CheckpointLease(checkpoint, storage)
    first.take(s3_spark)
    try:
        key = f"chk/{LEASE_DIR}/0000000001.json"
        assert s3_bucket.keys(f"chk/{LEASE_DIR}/") == [key]
        with pytest.raises(CheckpointInUseError, match=f"process {os.getpid()} on host"):
            CheckpointLease(checkpoint, storage).take(s3_spark)
        hadoop = s3_spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
        unchecked = {"fs.s3a.create.performance": "true", "fs.s3a.impl.disable.cache": "true"}
        for name, value in unchecked.items():
            hadoop.set(name, value)
        try:
            assert create_new(s3_spark, f"s3a://{s3_bucket.name}/{key}", "{}") is False
        finally:
            for name in unchecked:
                hadoop.unset(name)
        assert json.loads(s3_bucket.read(key))["pid"] == os.getpid()
    finally:
        first.release()
    assert json.loads(s3_bucket.read(key))["released"] is True


def _cdcflow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own command, fixed arguments
        [sys.executable, "-m", "cdcflow", "ingest", *args], capture_output=True, text=True, timeout=300
    )


def test_the_command_line_refuses_an_unreachable_bucket_without_showing_the_secret(
    s3_server: S3Server,
) -> None:
    options = {**s3_server.options(), "AWS_SECRET_ACCESS_KEY": SECRET}
    given = [arg for key, value in options.items() for arg in ("--storage-option", f"{key}={value}")]
    run = _cdcflow(
        *("--path", DUMP, "--option", "schema-include=true", "--key", "id"),
        *("--target", "s3://no-such-bucket/t", "--checkpoint", "s3a://no-such-bucket/c"),
        *given,
    )
    assert run.returncode == 2, run.stderr
    assert "cannot be reached: NoSuchBucket" in run.stderr
    assert SECRET not in run.stdout + run.stderr
    malformed = _cdcflow("--path", DUMP, "--key", "id", "--storage-option", f"AWS_SECRET_ACCESS_KEY {SECRET}")
    assert malformed.returncode == 2
    assert "--storage-option 'AWS_SECRET_ACCESS_KEY ***' must look like KEY=VALUE" in malformed.stderr
    assert SECRET not in malformed.stdout + malformed.stderr


@pytest.mark.integration
def test_the_command_line_ingests_to_s3_with_the_checkpoint_on_s3(s3_bucket: Bucket, tmp_path: Path) -> None:
    """``cdcflow ingest --storage-option ... --jars <hadoop-aws>``: its own Spark session writes the
    checkpoint through S3A with the options, delta-rs the table and the app id the checkpoint's files;
    nothing is written locally and the secret is never printed."""
    jars = hadoop_aws_jars()
    given = [
        arg
        for key, value in s3_bucket.server.options().items()
        for arg in ("--storage-option", f"{key}={value}")
    ]
    target, checkpoint = s3_bucket.uri("products"), s3_bucket.uri("chk", "s3a")
    args = [
        *("--path", DUMP, "--option", "schema-include=true", "--key", "id"),
        *("--target", target, "--checkpoint", checkpoint, *given, "--jars", jars),
    ]
    first = subprocess.run(  # noqa: S603 - our own command, fixed arguments
        [sys.executable, "-m", "cdcflow", "ingest", *args, "--app-id", "products", "--show"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"Delta table {target} (version " in first.stdout and ", 4 rows)" in first.stdout
    assert SECRET_KEY not in first.stdout + first.stderr
    assert list(tmp_path.iterdir()) == [], "the job wrote to the working directory"
    assert s3_bucket.read("chk/cdcflow-app-id") == b"products\n"
    assert s3_bucket.keys("chk/commits/") and s3_bucket.keys("chk/offsets/")
    table = DeltaTable(target, storage_options=s3_bucket.server.options())
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [1, 4, 10, 20]
    assert table.transaction_version("products") is not None

    again = _cdcflow(*args, "--app-id", "other")
    assert again.returncode == 2
    assert "applies to s3://" in again.stderr and "as application id 'products', not 'other'" in again.stderr
