"""Spark settings the connectors need, and checks that fail with the fix when they are missing."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from cdcflow.connectors.errors import SparkSetupError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
TIME_TYPE_KEY = "spark.sql.timeType.enabled"
SHUFFLE_PARTITIONS_KEY = "spark.sql.shuffle.partitions"
SHUFFLE_PARTITIONS_PER_CORE = 2
LOG_LEVEL_KEY = "spark.log.level"
DRIVER_JAVA_OPTIONS_KEY = "spark.driver.extraJavaOptions"
ERRORS_ONLY_LOG4J2 = """\
# cdcflow: Spark's and Kafka's logs, errors only (the command line's --verbose: Spark's own settings)
status = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
rootLogger.level = error
rootLogger.appenderRef.console.ref = console
# PySpark's JVM counts as a shell: when its logger's level differs from the root's, Spark prints two lines
logger.shell.name = org.apache.spark.api.python.PythonGatewayServer
logger.shell.level = error
"""
JVM_NOISE = (b"WARNING: Using incubator modules:",)
"""Lines the JVM itself prints at start (no logger to quiet): Spark adds ``jdk.incubator.vector``."""


def cdcflow_spark_config() -> dict[str, str]:
    """Settings to put on the session builder: stateful operators need the RocksDB state store, and
    Debezium's TIME columns Spark's TIME type (off by default in Spark 4.x)."""
    return {PROVIDER_KEY: ROCKSDB_PROVIDER, TIME_TYPE_KEY: "true"}


def verbose_spark() -> bool:
    """Whether Spark and Kafka log as they do by default: when the ``cdcflow`` logger is at INFO or
    below (the command line's ``--verbose``); else a session cdcflow starts logs errors only."""
    return logging.getLogger("cdcflow").isEnabledFor(logging.INFO)


def quiet_session_config(config: dict[str, str], cache: Path | None = None) -> dict[str, str]:
    """``config`` with the driver's JVM started on :data:`ERRORS_ONLY_LOG4J2` (a file in ``cache``, default
    ``~/.cache/cdcflow``), unless ``config`` names a log4j2 configuration already."""
    quiet = {**config}
    options = quiet.get(DRIVER_JAVA_OPTIONS_KEY, "")
    if "log4j2.configurationFile" not in options:
        path = _errors_only_log4j2(cache)
        if path is not None:
            quiet[DRIVER_JAVA_OPTIONS_KEY] = f"{options} -Dlog4j2.configurationFile={path.as_uri()}".strip()
    return quiet


def _errors_only_log4j2(cache: Path | None) -> Path | None:
    root = cache or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cdcflow"
    for folder in (root, Path(tempfile.gettempdir())):
        path = folder / "log4j2-errors-only.properties"
        try:
            if not path.is_file() or path.read_text(encoding="utf-8") != ERRORS_ONLY_LOG4J2:
                folder.mkdir(parents=True, exist_ok=True)
                temporary = folder / f".{path.name}.{os.getpid()}"
                temporary.write_text(ERRORS_ONLY_LOG4J2, encoding="utf-8")
                temporary.replace(path)
            return path
        except OSError:
            continue
    return None


@contextmanager
def jvm_stderr_without(noise: tuple[bytes, ...] = JVM_NOISE) -> Iterator[None]:
    """While a JVM is started: the standard error it inherits (and keeps) is a pipe whose lines, but
    those starting with one of ``noise``, a thread passes on to this process's standard error."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
        read, write = os.pipe()
    except OSError:
        yield
        return
    os.dup2(write, 2)
    os.close(write)
    threading.Thread(
        target=_pass_on, args=(read, saved, noise), name="cdcflow-jvm-stderr", daemon=True
    ).start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)


def _pass_on(read: int, write: int, noise: tuple[bytes, ...]) -> None:
    """Copy lines from ``read`` to ``write`` until the last writer closes it, but the ``noise``."""
    with os.fdopen(read, "rb") as lines:
        for line in lines:
            if not line.startswith(noise):
                try:
                    os.write(write, line)
                except OSError:
                    pass  # the terminal is gone: keep reading, so that the JVM never blocks on a full pipe
    os.close(write)


def require_stateful_setup(spark: SparkSession) -> None:
    """Fail before a stateful query starts if Spark cannot run ``transformWithState`` here."""
    provider = spark.conf.get(PROVIDER_KEY, None)
    if provider != ROCKSDB_PROVIDER:
        raise SparkSetupError(
            f"stateful changelog operators run on transformWithState, which needs the RocksDB state store; "
            f"{PROVIDER_KEY} is {provider!r}. Set it before the first streaming query: "
            f"spark.conf.set('{PROVIDER_KEY}', '{ROCKSDB_PROVIDER}') "
            "(or build the session with cdcflow.connectors.spark.session.cdcflow_spark_config())"
        )
    if importlib.util.find_spec("google.protobuf") is None:
        raise SparkSetupError(
            "stateful changelog operators need the 'protobuf' package in the Python that runs Spark's "
            "workers (PYSPARK_PYTHON): pip install protobuf  (or pip install 'cdcflow[spark]')"
        )


def default_parallelism(spark: SparkSession) -> int | None:
    """The session's ``defaultParallelism`` (its cores); None for a Spark Connect session, which has no
    SparkContext to ask."""
    if getattr(spark, "_jsparkSession", None) is None:
        return None
    return max(1, spark.sparkContext.defaultParallelism)


def default_shuffle_partitions(spark: SparkSession) -> int | None:
    """Set ``spark.sql.shuffle.partitions`` to 2 per core when nobody set it; returns what it set.

    Spark's default, 200, is fixed into a stateful streaming query's checkpoint when it first starts:
    a small stream would then run 200 state-store tasks per micro-batch, most of them empty. A value
    set on the builder, with ``--conf`` or ``spark.conf.set`` is kept. Spark Connect sessions are
    left alone (whether a value was set is not visible there).
    """
    session = getattr(spark, "_jsparkSession", None)
    if session is None:
        return None
    if session.sessionState().conf().contains(SHUFFLE_PARTITIONS_KEY):
        return None
    partitions = SHUFFLE_PARTITIONS_PER_CORE * (default_parallelism(spark) or 1)
    spark.conf.set(SHUFFLE_PARTITIONS_KEY, str(partitions))
    return partitions


@contextmanager
def installed_pyspark_workers() -> Iterator[None]:
    """While a local session's JVM starts: let its Python processes import this interpreter's pyspark,
    and fork its streaming sources' planners from a warm process.

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on every Python worker's path, and Python
    compiles modules imported from a zip anew in each process: 1.1 s of CPU for every streaming
    query's offset planner (``python_streaming_source_runner``) and every worker daemon, against
    0.4 s from the installed package's bytecode. When the JVM comes from the pip-installed pyspark
    that the workers' Python (``PYSPARK_PYTHON``, this interpreter) imports anyway, the JVM is started
    with ``SPARK_HOME`` set to :func:`worker_spark_home`: the same Spark without the zips. A
    ``SPARK_HOME`` the user set, another worker Python or a failure to build the folder leaves Spark
    as it is.

    With that, and unless ``PYSPARK_DRIVER_PYTHON`` names another Python, the JVM's Python for data
    sources is the launcher of :mod:`~cdcflow.connectors.spark.warm_planners`: each streaming query's
    planner is forked from a process that has imported it, instead of importing it for ~0.45 s.
    """
    home = None if "SPARK_HOME" in os.environ else worker_spark_home()
    if home is None:
        yield
        return
    started = {"SPARK_HOME": home}
    from pyspark import SparkContext

    # A JVM already running keeps the environment it was started with.
    if (
        SparkContext._gateway is None
        and os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable) == sys.executable
    ):
        from cdcflow.connectors.spark import warm_planners

        server = warm_planners.start()
        if server is not None:
            started |= {"PYSPARK_DRIVER_PYTHON": server.launcher, warm_planners.SOCKET_ENV: server.socket}
    before = {key: os.environ.get(key) for key in started}
    os.environ.update(started)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def worker_spark_home(cache: Path | None = None) -> str | None:
    """A folder that is the installed pyspark's Spark (links to its ``bin``, ``jars``, ...) with an
    empty ``python/lib``, in ``cache`` (default ``~/.cache/cdcflow``); None unless ``PYSPARK_PYTHON`` is
    this interpreter and pyspark an installed package with Spark's launch scripts and jars."""
    if os.environ.get("PYSPARK_PYTHON") != sys.executable:
        return None
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    package = Path(spec.origin).parent
    if not (package / "bin" / "spark-submit").is_file() or not (package / "jars").is_dir():
        return None
    from pyspark.version import __version__

    digest = hashlib.sha256(f"{package}\0{sys.executable}".encode()).hexdigest()[:12]
    root = cache or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cdcflow"
    home = root / "spark-home" / f"{__version__}-{digest}"
    if (home / "bin" / "spark-submit").is_file():
        return str(home)
    try:
        root.joinpath("spark-home").mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f".{home.name}-", dir=home.parent))
    except OSError:
        return None
    try:
        _link_entries(package, building, but="python")
        _link_entries(package / "python", building / "python", but="lib")
        (building / "python" / "lib").mkdir()
        building.rename(home)
    except OSError:  # a read-only cache, or another process built it first
        shutil.rmtree(building, ignore_errors=True)
    return str(home) if (home / "bin" / "spark-submit").is_file() else None


def _link_entries(source: Path, target: Path, *, but: str) -> None:
    """Links in ``target`` (created) to every entry of ``source`` except the one named ``but``."""
    target.mkdir(exist_ok=True)
    for entry in source.iterdir():
        if entry.name != but:
            (target / entry.name).symlink_to(entry)
