"""What the command line's Spark jobs share: a local session (:func:`local_session`), checks before
Spark starts (:func:`check_source`, :func:`check_local_dir`), Spark's errors as one line
(:func:`spark_errors`), and the query of ``cdcflow stream`` (:func:`stream_changelog`).

``stream_changelog`` prints each micro-batch as Flink prints changelogs (``+I[...]``), prefixed with
the record's ``topic/partition@offset`` (``file:line`` for a plain file); a control event (a truncate,
a logical message, a DDL) is printed in its place as ``! truncate`` (``controlEvents=emit``, unless the
options set it). The query runs until the input available at its start is read
(``Trigger.AvailableNow``), and resumes from its checkpoint when run again with the same one.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import pyarrow.compute as pc

from cdcflow.connectors.errors import ConnectorError, ConnectorOptionError
from cdcflow.connectors.spark.arrow_types import changes_from_arrow, schema_of_struct
from cdcflow.connectors.spark.options import CONTROL_COLUMN
from cdcflow.connectors.spark.session import (
    LOG_LEVEL_KEY,
    cdcflow_spark_config,
    installed_pyspark_workers,
    jvm_stderr_without,
    quiet_session_config,
    verbose_spark,
)
from cdcflow.formats import render_change

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

ORIGIN_COLUMNS = ("topic", "partition", "offset")
FILE_ORIGIN = ("file", "line")
"""Where a record of a plain file (no topic) came from, asked for when no column has those names."""
_OUR_ERROR = re.compile(r"^(?:[\w.]*\.)?cdcflow\.[\w.]*?\.(\w+): (.+)$", re.MULTILINE)
_USAGE_ERRORS = frozenset(
    {"ConnectorOptionError", "FormatOptionError", "UnknownFormatError", "ChangelogValidationError"}
)


class SparkJobError(ConnectorError, RuntimeError):
    """A Spark query failed: the cdcflow error inside Spark's wrapping (else Spark's first line)."""

    def __init__(self, message: str, *, usage_error: bool = False) -> None:
        super().__init__(message)
        self.usage_error = usage_error


def spark_failure(error: BaseException) -> SparkJobError:
    """The one line that matters in an error Spark raised: the cdcflow error it wraps (a Python worker's
    traceback inside a Java stack trace inside a ``StreamingQueryException``), or Spark's own message."""
    text = str(error)
    found = _OUR_ERROR.search(text)
    if found is not None:
        return SparkJobError(found.group(2).strip(), usage_error=found.group(1) in _USAGE_ERRORS)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    return SparkJobError(f"Spark failed: {first[:1000]}")


@contextmanager
def spark_errors() -> Iterator[None]:
    """Turn errors raised through Spark (Py4J, captured JVM exceptions) into :class:`SparkJobError`."""
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException

    try:
        yield
    except (PySparkException, Py4JError) as error:
        raise spark_failure(error) from error


def stop_quietly(query: StreamingQuery) -> None:
    """Stop ``query`` after a Ctrl-C: without a second interrupt breaking the stop, and without the
    tracebacks Py4J logs for the call the interrupt cut short."""
    import logging
    import signal
    import threading

    py4j = logging.getLogger("py4j")
    level = py4j.level
    py4j.setLevel(logging.CRITICAL)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        # A stop whose answer the interrupt cut short (Py4J: "Answer from Java side is empty") may leave
        # the query's thread running, and a session stopped under that thread's last call to the driver
        # makes the JVM print a stack trace: the stop is made again (once stopped, a no-op).
        for _ in range(2):
            try:
                query.stop()
                break
            except Exception:  # noqa: BLE001, S112 - a cut connection: once more, then the session stops it
                continue
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        py4j.setLevel(level)


def check_local_dir(path: str, flag: str) -> None:
    """Fail now, before Spark starts, when the local directory ``path`` cannot be created or written."""
    if "://" in path and not path.startswith("file:"):
        return  # a remote store: Spark's file system reports its own errors
    target = Path(path.removeprefix("file://").removeprefix("file:")).absolute()
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    problem = None
    if not existing.is_dir():
        problem = f"{existing} is a file, not a directory"
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = f"{existing} is not writable"
    if problem is not None:
        raise ConnectorOptionError(
            f"{flag} {path}: cannot be written ({problem}); choose a writable directory"
        )


def check_source(source: str, options: Mapping[str, str]) -> None:
    """Check a ``cdc-*`` source's options (and reach its Kafka cluster) before a Spark session starts, as
    the source itself does on the driver, so a mistake is one clear error instead of Spark's traces."""
    from cdcflow.connectors.kafka import admin as kafka_admin
    from cdcflow.connectors.spark.read_plan import KafkaInput, plan_read
    from cdcflow.connectors.spark.sources import source_formats

    by_name = source_formats()
    if source not in by_name:
        raise ConnectorOptionError(f"--source {source!r} is not one of {', '.join(by_name)}")
    plan = plan_read(by_name[source], options, None)
    if isinstance(plan.input, KafkaInput):
        kafka_admin.discover_partitions(plan.input.options)


def session_is_active() -> bool:
    """A SparkSession is active in this process (a notebook's, a job's, or spark-submit's)."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() is not None


def local_session(app_name: str = "cdcflow", config: Mapping[str, str] | None = None) -> SparkSession:
    """A local[2] session whose Python workers run this interpreter (cdcflow is importable there).

    Under ``spark-submit`` its ``--master``, ``--conf`` and log settings win; these are defaults.
    An active session (a notebook's, a job's) is returned as it is: its log level and Ctrl-C handling
    stay the caller's. Spark and Kafka log errors only, from the JVM's start, unless the ``cdcflow``
    logger is at INFO (:func:`~cdcflow.connectors.spark.session.verbose_spark`)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    settings = {
        **cdcflow_spark_config(),
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
    }
    verbose = verbose_spark()
    # spark-submit starts the JVM first and hands this Python its gateway: its --master and --conf rule.
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        session = _submitted_session(verbose)
        for key, value in settings.items():
            if session.conf.get(key, None) is None:
                session.conf.set(key, value)
    else:
        static = {
            **settings,
            **(config or {}),  # static settings (jars, extensions): only a session started here takes them
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
        }
        builder = SparkSession.builder.master("local[2]").appName(app_name)
        for key, value in (static if verbose else quiet_session_config(static)).items():
            builder = builder.config(key, value)
        with installed_pyspark_workers(), contextlib.nullcontext() if verbose else jvm_stderr_without():
            session = builder.getOrCreate()
        if not verbose:
            # A failed query's error reaches the caller; Spark's ERROR lines would repeat it with traces.
            session.sparkContext.setLogLevel("FATAL")
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        # PySpark's handler cancels the jobs through Py4J from inside the interrupted Py4J call, which
        # logs tracebacks; a plain KeyboardInterrupt lets the caller stop its query (see stop_quietly).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return session


def _submitted_session(verbose: bool) -> SparkSession:
    """The session of the JVM ``spark-submit`` started: at Spark's ERROR level from the SparkContext's
    start unless ``--conf spark.log.level`` (or ``verbose``) says otherwise."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    SparkContext._ensure_initialized()  # the gateway, for the --conf settings spark-submit was given
    if not verbose and not SparkConf().contains(LOG_LEVEL_KEY):
        builder = builder.config(LOG_LEVEL_KEY, "ERROR")
    return builder.getOrCreate()


def changelog_printer(
    row_kind_column: str, out: TextIO, origin: tuple[str, ...] = ORIGIN_COLUMNS
) -> Callable[[DataFrame, int], None]:
    def print_batch(batch: DataFrame, batch_id: int) -> None:
        from pyspark.sql.types import StructType

        hidden = {row_kind_column, CONTROL_COLUMN, *origin}
        columns = schema_of_struct(StructType([f for f in batch.schema.fields if f.name not in hidden]))
        table = batch.toArrow()
        origins = table.select(list(origin)).to_pylist()
        controls: list[str | None] = [None] * table.num_rows
        data = table
        if CONTROL_COLUMN in table.column_names:
            controls = table.column(CONTROL_COLUMN).to_pylist()
            data = table.filter(pc.is_null(table.column(CONTROL_COLUMN)))
        changes = iter(changes_from_arrow(data, columns, row_kind_column))
        for place, control in zip(origins, controls, strict=True):
            where = (
                f"{place['topic']}/{place['partition']}@{place['offset']}"
                if place["topic"] is not None or "file" not in place
                else f"{place['file']}:{place['line']}"
            )
            shown = f"! {control}" if control is not None else render_change(next(changes), columns)
            out.write(f"{where} {shown}\n")
        out.flush()

    return print_batch


def stream_changelog(
    spark: SparkSession,
    source: str,
    options: Mapping[str, str],
    checkpoint: str,
    out: TextIO | None = None,
) -> int:
    """Run the query to the end of the input available now, printing the changelog to ``out`` (default:
    ``sys.stdout`` as it is then); returns the number of micro-batches."""
    given = {key.lower(): value for key, value in options.items()}
    metadata = [m.strip() for m in given.get("metadata", "").split(",") if m.strip()]
    extra = [key for key in ORIGIN_COLUMNS if key not in metadata]
    shown = {"metadata": ",".join([*metadata, *extra])}
    if "controlevents" not in given:
        shown["controlEvents"] = "emit"
    stream = spark.readStream.format(source).options(**{**options, **shown}).load()
    origin: tuple[str, ...] = ORIGIN_COLUMNS
    if "kafka.bootstrap.servers" not in given and not set(FILE_ORIGIN) & {*stream.columns, *metadata}:
        origin = (*ORIGIN_COLUMNS, *FILE_ORIGIN)
        shown["metadata"] = ",".join([*metadata, *extra, *FILE_ORIGIN])
        stream = spark.readStream.format(source).options(**{**options, **shown}).load()
    row_kind = given.get("rowkindcolumn", "_row_kind")
    query = (
        stream.writeStream.foreachBatch(changelog_printer(row_kind, out or sys.stdout, origin))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        stop_quietly(query)
    batch_ids = [progress["batchId"] for progress in query.recentProgress]
    return len(set(batch_ids))
