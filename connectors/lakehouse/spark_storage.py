"""Spark's side of an object store: the S3A settings and jars its streaming checkpoint needs, and the
conditional create (:func:`create_new`) the checkpoint's lease is written with.

Spark writes the checkpoint itself through Hadoop's file systems: ``s3a://`` (and ``s3://``, mapped
to S3A in a session ``cdcflow ingest`` starts) needs ``org.apache.hadoop:hadoop-aws`` (3.5.0 for
Spark 4.2.0's Hadoop) and the AWS SDK v2 modules it loads (``scripts/java_deps.sh hadoop-aws``),
ADLS ``hadoop-azure``, GCS Google's ``gcs-connector``. A session the job starts gets them from
``--jars`` / ``CDCFLOW_JARS``, and the S3A settings from the storage options; a session of the
caller's (spark-submit, a notebook) keeps its own settings and is only checked.
"""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING

from cdcflow.connectors.errors import ConnectorOptionError, SparkSetupError
from cdcflow.connectors.lakehouse.delta.storage import S3, Storage, scheme
from cdcflow.formats.redact import redact

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JARS_ENV = "CDCFLOW_JARS"
HADOOP_AWS = "org.apache.hadoop:hadoop-aws:3.5.0"
_HADOOP_JARS = {
    "s3": f"hadoop-aws ({HADOOP_AWS} and the AWS SDK v2 s3, s3-transfer-manager and sts modules; "
    "scripts/java_deps.sh hadoop-aws fetches them)",
    "abfss": "hadoop-azure (org.apache.hadoop:hadoop-azure:3.5.0)",
    "gs": "Google's gcs-connector (com.google.cloud.bigdataoss:gcs-connector, hadoop3)",
}
_FAMILY = {"s3a": "s3", "abfs": "abfss", "wasb": "abfss", "wasbs": "abfss", "gcs": "gs"}


def extra_jars(given: str | None = None) -> list[str]:
    """The jar files named by ``given`` (else ``CDCFLOW_JARS``): jars or folders, comma separated."""
    text = given if given is not None else os.environ.get(JARS_ENV, "")
    found: list[str] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if os.path.isdir(part):
            jars = sorted(glob.glob(os.path.join(part, "*.jar")))
            if not jars:
                raise ConnectorOptionError(f"--jars: the folder {part!r} holds no .jar file")
            found.extend(jars)
        elif os.path.isfile(part):
            found.append(part)
        else:
            raise ConnectorOptionError(f"--jars: {part!r} is neither a jar file nor a folder of jars")
    return found


def hadoop_settings(storage: Storage, uris: list[str]) -> dict[str, str]:
    """``spark.hadoop.*`` settings for a session the job starts: S3A reaching the store of ``uris`` with
    the storage options (credentials given as options only: the environment's reach the JVM anyway)."""
    if not any(scheme(uri) in S3 for uri in uris):
        return {}
    settings = {
        "fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
    }
    endpoint = storage.setting("AWS_ENDPOINT_URL")
    if endpoint:
        settings["fs.s3a.endpoint"] = endpoint
        settings["fs.s3a.connection.ssl.enabled"] = str(not endpoint.lower().startswith("http://")).lower()
        virtual = (storage.setting("AWS_VIRTUAL_HOSTED_STYLE_REQUEST") or "").strip().lower() == "true"
        settings["fs.s3a.path.style.access"] = str(not virtual).lower()
    region = storage.setting("AWS_REGION")
    if region:
        settings["fs.s3a.endpoint.region"] = region
    key = storage.setting("AWS_ACCESS_KEY_ID", environment=False)
    secret = storage.setting("AWS_SECRET_ACCESS_KEY", environment=False)
    if key and secret:
        settings["fs.s3a.access.key"] = key
        settings["fs.s3a.secret.key"] = secret
        token = storage.setting("AWS_SESSION_TOKEN", environment=False)
        if token:
            settings["fs.s3a.session.token"] = token
            settings["fs.s3a.aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
            )
    return {f"spark.hadoop.{name}": value for name, value in settings.items()}


def require_filesystem(spark: SparkSession, uri: str, what: str) -> None:
    """Fail with the fix when Spark has no Hadoop file system for ``uri``'s scheme (its jars missing)."""
    kind = scheme(uri)
    jvm = getattr(spark, "_jvm", None)
    if kind == "" or jvm is None:
        return  # local, or Spark Connect: the server has its own file systems
    try:
        conf = spark._jsparkSession.sessionState().newHadoopConf()
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(kind, conf)
    except Exception as error:
        family = _FAMILY.get(kind, kind)
        needed = _HADOOP_JARS.get(family, f"a Hadoop file system for {kind}://")
        where = f"--packages {HADOOP_AWS}" if family == "s3" else "--packages or --jars"
        mapping = (
            "; with hadoop-aws loaded, write s3a:// (or set spark.hadoop.fs.s3.impl="
            "org.apache.hadoop.fs.s3a.S3AFileSystem)"
            if kind == "s3"
            else ""
        )
        raise SparkSetupError(
            f"{what} {redact(uri)!r}: Spark has no file system for {kind}:// ({type(error).__name__}); it "
            f"needs {needed}: give cdcflow ingest --jars (or {JARS_ENV}) their folder, or add them to the "
            f"session (spark-submit {where}){mapping}"
        ) from None


_CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite"
"""S3A (hadoop-aws 3.4.2+): a new file is PUT with If-None-Match, so a file written meanwhile is kept."""
_NO_CONDITIONAL_CREATE = "Conditional Writes Unavailable"
_ALREADY_THERE = frozenset(
    {"org.apache.hadoop.fs.FileAlreadyExistsException", "org.apache.hadoop.fs.s3a.RemoteFileChangedException"}
)


def create_new(spark: SparkSession, uri: str, text: str) -> bool | None:
    """Write ``text`` to a new file at ``uri`` with Spark's Hadoop file system, only if there is none:
    a conditional put on S3A (unless ``fs.s3a.create.conditional.enabled=false``: then S3A looks first),
    ABFS and GCS, as Spark's own checkpoint files are. False when a file is there; None without a JVM to
    ask (Spark Connect)."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return None
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

    path = jvm.org.apache.hadoop.fs.Path(uri)
    fs = path.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf())

    def create(conditional: bool) -> None:
        builder = fs.createFile(path).overwrite(False)
        stream = (builder.opt(_CONDITIONAL_CREATE, True) if conditional else builder).build()
        try:
            stream.write(text.encode("utf-8"))
        finally:
            stream.close()

    try:
        try:
            create(conditional=True)
        except Py4JJavaError as error:
            if _NO_CONDITIONAL_CREATE not in str(error.java_exception.getMessage()):
                raise
            create(conditional=False)
    except Py4JJavaError as error:
        cause = error.java_exception
        while cause is not None:
            if cause.getClass().getName() in _ALREADY_THERE:
                return False
            cause = cause.getCause()
        raise
    return True
