"""``cdcflow ingest``: a CDC topic (Kafka or a recorded dump) applied to a Delta table, continuously.

source (``cdc-*``) → decode → FROM_CHANGELOG → :class:`DeltaSink` (one merge per micro-batch, exactly
once) with a checkpoint. Debezium changes are ordered by their log position (``source.sequence``)
unless ``sequence_by`` names another column or ``none``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TextIO

from cdcflow.connectors.errors import ConnectorOptionError, schema_change
from cdcflow.connectors.lakehouse.delta.apply import BatchApplied, Materialize
from cdcflow.connectors.lakehouse.delta.backend import BACKENDS
from cdcflow.connectors.lakehouse.delta.control import OnTruncate
from cdcflow.connectors.lakehouse.delta.storage import Storage, is_remote, join
from cdcflow.connectors.lakehouse.delta.tables import open_table
from cdcflow.connectors.lakehouse.ingest_defaults import (
    LEGACY_FILE_RECORDS_PER_PARTITION,
    SourceLinks,
    add_metadata,
    add_source_defaults,
    given_key,
    metadata_of,
    source_links,
)
from cdcflow.connectors.lakehouse.sink import DeltaSink, SinkProgress, apply_options
from cdcflow.connectors.spark.accounting import CountsSince, MessageCounts
from cdcflow.formats.redact import redacted_repr
from cdcflow.formats.types import parse_ddl

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

SOURCES = {
    "debezium-json": "cdc-debezium",
    "debezium-avro-confluent": "cdc-debezium-avro",
    "canal-json": "cdc-canal",
    "maxwell-json": "cdc-maxwell",
    "ogg-json": "cdc-ogg",
    "generic": "cdc-generic",
    "upsert-kafka": "cdc-upsert-kafka",
}
DEBEZIUM_SEQUENCE = "source_sequence"
DEBEZIUM_RESTART = "source_timestamp"
"""The commit time: tells a restarted log position (failover, RESET MASTER) from a late change."""
Trigger = Literal["available-now", "continuous"]
Backend = Literal["delta-rs", "spark"]
ACCOUNTING_DIRECTORY = "cdcflow-accounting"
HANDOFF_DIRECTORY = "cdcflow-handoff"


@dataclass(frozen=True)
class IngestConfig:
    """Everything one ingestion needs; the command line and the Python API both build one."""

    format: str
    key: tuple[str, ...]
    target: str
    checkpoint: str
    path: str | None = None
    bootstrap_servers: str | None = None
    topics: tuple[str, ...] = ()
    schema: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    trigger: Trigger = "available-now"
    interval: str = "1 second"
    sequence_by: str | None = None
    """A column ordering each key's changes; None = the default (Debezium: source.sequence); 'none' = off."""
    materialize: Materialize = Materialize.AUTO
    upsert_key: tuple[str, ...] | None = None
    """The changelog's upsert key; None = the key (topics keyed by primary key, as Debezium writes them)."""
    delete_retention: timedelta = timedelta(days=7)
    state_ttl: timedelta | None = None
    app_id: str | None = None
    on_truncate: OnTruncate = OnTruncate.APPLY
    max_offsets_per_trigger: int | None = None
    """Kafka records per micro-batch; None = DEFAULT_MAX_OFFSETS_PER_TRIGGER, 0 = no limit."""
    max_bytes_per_trigger: int | None = None
    """Bytes of recorded files per micro-batch; None = DEFAULT_MAX_BYTES_PER_TRIGGER, 0 = no limit."""
    backend: Backend = "delta-rs"
    """Who merges: delta-rs in the driver, or Spark with Delta Lake's jars (see :mod:`.spark_backend`)."""
    delta_jars: str | None = None
    """``backend='spark'`` in a local session: delta-spark's jars or folders (default $CDCFLOW_DELTA_JARS)."""
    storage_options: Mapping[str, str] = field(default_factory=dict)
    """delta-rs's storage options for a target or checkpoint on S3, ADLS, GCS (:mod:`.delta.storage`)."""
    jars: str | None = None
    """Jars or folders a local session loads, e.g. hadoop-aws for an S3 checkpoint (default $CDCFLOW_JARS)."""

    def __repr__(self) -> str:
        return redacted_repr(self)

    def __post_init__(self) -> None:
        if self.format not in SOURCES:
            raise ConnectorOptionError(f"--format {self.format!r} is not one of {', '.join(SOURCES)}")
        if bool(self.path) == bool(self.bootstrap_servers):
            raise ConnectorOptionError(
                "give either --path (recorded files) or --bootstrap-servers and --topic"
            )
        if self.bootstrap_servers and not self.topics:
            raise ConnectorOptionError("--bootstrap-servers needs at least one --topic")
        if self.trigger not in ("available-now", "continuous"):
            raise ConnectorOptionError(f"--trigger must be available-now or continuous, not {self.trigger!r}")
        if not self.key:
            raise ConnectorOptionError("--key: name the primary key columns of the table, e.g. --key id")
        if self.backend not in BACKENDS:
            raise ConnectorOptionError(
                f"--backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}"
            )
        Storage(dict(self.storage_options))  # malformed or repeated storage options fail here

    @property
    def source(self) -> str:
        return SOURCES[self.format]

    def resolved_sequence(self) -> str | None:
        if self.sequence_by == "none":
            return None
        if self.sequence_by is None and self.format.startswith("debezium"):
            return DEBEZIUM_SEQUENCE
        return self.sequence_by

    def source_options(self) -> dict[str, str]:
        options = dict(self.options)
        if self.schema:
            options["columns"] = self.schema
        if self.path:
            options["path"] = self.path
        else:
            options["kafka.bootstrap.servers"] = str(self.bootstrap_servers)
            options.setdefault("subscribe", ",".join(self.topics))
            options.setdefault("startingOffsets", "earliest")
        if self.resolved_sequence() == DEBEZIUM_SEQUENCE:
            add_metadata(options, "source.sequence", "source.timestamp")
        add_source_defaults(
            options,
            self.format,
            kafka=not self.path,
            max_offsets_per_trigger=self.max_offsets_per_trigger,
            max_bytes_per_trigger=self.max_bytes_per_trigger,
        )
        accounting = self.accounting_path()
        if accounting is not None and given_key(options, "accountingPath") is None:
            options["accountingPath"] = accounting
        return options

    def accounting_path(self) -> str | None:
        """Where the source's per-range message counts go: the checkpoint's ``cdcflow-accounting``
        (None for a checkpoint on an object store: each task writes its counts with local file I/O;
        ``--option accountingPath=`` a shared mounted directory keeps them)."""
        given = given_key(self.options, "accountingPath")
        if given is not None:
            return self.options[given].removeprefix("file://")
        return None if is_remote(self.checkpoint) else join(self.checkpoint, ACCOUNTING_DIRECTORY)

    def links(self) -> SourceLinks:
        """The columns of the source the applier reads (unavailable columns, keys, control events)."""
        return source_links(self.source_options(), self.format, self._metadata())

    def _metadata(self) -> list[str]:
        """The metadata columns the user asked for (kept in the table)."""
        return metadata_of(self.options)

    def ordering_columns(self) -> list[str]:
        """The metadata columns the job adds only to order changes (kept out of the table)."""
        if self.resolved_sequence() != DEBEZIUM_SEQUENCE:
            return []
        requested = self._metadata()
        pairs = ((DEBEZIUM_SEQUENCE, "source.sequence"), (DEBEZIUM_RESTART, "source.timestamp"))
        return [column for column, name in pairs if name not in requested]


@dataclass
class IngestSummary:
    batches: int
    progress: SinkProgress
    seconds: float
    table_version: int | None
    table_rows: int | None
    messages: MessageCounts | None = None
    """What became of the messages this run read (None without an accounting directory)."""
    interrupted: bool = False
    """Whether Ctrl-C (KeyboardInterrupt) stopped the run before its input was applied."""

    def __str__(self) -> str:
        p = self.progress
        rate = p.changes / self.seconds if self.seconds else 0.0
        rows = self.table_rows if self.table_rows is not None else 0
        return (
            f"{self.batches} batch(es), {p.changes:,} changes ({rate:,.0f}/s): {p.upserts:,} upserted, "
            f"{p.deletes:,} deleted, {p.late:,} late, {p.restarts:,} restarted positions, "
            f"{p.unmatched_retractions:,} unmatched retractions, {p.truncates:,} truncate(s), "
            f"{p.control_events:,} other control event(s) skipped, {p.unavailable_unfilled:,} unavailable "
            f"value(s) left NULL, {p.skipped} replayed batch(es) skipped; "
            f"table version {self.table_version}, {rows:,} rows"
            + (f"; {self.messages}" if self.messages is not None else "")
            + ("; interrupted (Ctrl-C): run again to go on from the checkpoint" if self.interrupted else "")
        )


def ingest(
    config: IngestConfig,
    spark: SparkSession | None = None,
    out: TextIO = sys.stderr,
    on_batch: Callable[[BatchApplied], None] | None = None,
) -> IngestSummary:
    """Run the ingestion; with ``available-now`` it returns once the input available at start is applied.

    ``on_batch`` sees what each micro-batch did (its apply latency, counts), as it happens.
    """
    from cdcflow.connectors.spark.jobs import local_session

    sequence = config.resolved_sequence()
    links = config.links()
    origin = origin_columns(config)
    options = apply_options(
        config.key,
        sequence_by=sequence,
        materialize=config.materialize,
        upsert_key=config.upsert_key if config.upsert_key is not None else config.key,
        exclude=[*config.ordering_columns(), *links.exclude, *origin],
        restart_by=DEBEZIUM_RESTART if sequence == DEBEZIUM_SEQUENCE else None,
        delete_retention=config.delete_retention,
        state_ttl=config.state_ttl,
        on_truncate=config.on_truncate,
        **links.apply,
    )
    sink = DeltaSink(
        config.target,
        options,
        config.checkpoint,
        config.app_id,
        on_batch,
        config.backend,
        storage_options=config.storage_options,
        pipeline=config.backend == "delta-rs",
    )
    sink.check_identity()
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    # Only a session this call starts is stopped: a notebook's or a test's own keeps running.
    own_session = spark is None
    session = spark or local_session("cdcflow-ingest", _session_config(config))
    started = time.monotonic()
    accounting = config.accounting_path()
    local = None if is_remote(config.checkpoint) else config.checkpoint.removeprefix("file://")
    counts = CountsSince(accounting, local) if accounting is not None else None
    try:
        sink.bind(session)
        sink.recover()
        handoff_path = _handoff_path(config, session)
        interrupted = _run(config, session, sink, started, out, counts, origin, handoff_path)
        sink.drain()
    finally:
        sink.close()
        if own_session:
            session.stop()
    table = open_table(config.target, sink.storage)
    return IngestSummary(
        batches=sink.progress.batches,
        progress=sink.progress,
        seconds=time.monotonic() - started,
        table_version=table.version() if table is not None else None,
        table_rows=table.count() if table is not None else None,
        messages=counts.counts() if counts is not None else None,
        interrupted=interrupted,
    )


def _handoff_path(config: IngestConfig, session: SparkSession) -> str | None:
    """Where the source's tasks hand the decoded rows to the delta-rs writer (cleared of what a run
    that died left), when driver and executors share the checkpoint's disk; else None (``toArrow``)."""
    from cdcflow.connectors.spark import handoff

    if config.backend != "delta-rs" or is_remote(config.checkpoint):
        return None
    if not str(session.conf.get("spark.master", "")).startswith("local"):
        return None
    path = os.path.abspath(join(config.checkpoint.removeprefix("file://"), HANDOFF_DIRECTORY))
    handoff.clear(path)
    return path


def _session_config(config: IngestConfig) -> dict[str, str]:
    """Settings for the local session this job starts: Delta's jars under ``backend='spark'``, the
    ``jars`` (hadoop-aws, ...), and S3A's settings for a checkpoint (or Spark-written target) on S3."""
    from cdcflow.connectors.lakehouse.spark_storage import extra_jars, hadoop_settings

    settings = hadoop_settings(Storage(dict(config.storage_options)), [config.checkpoint, config.target])
    jars = extra_jars(config.jars)
    if config.backend == "spark":
        from cdcflow.connectors.lakehouse.spark_backend import delta_jars, session_config

        delta = delta_jars(config.delta_jars)
        if delta:
            return {**settings, **session_config([*delta, *jars])}
    if jars:
        settings["spark.jars"] = ",".join(jars)
    return settings


def origin_columns(config: IngestConfig) -> tuple[str, ...]:
    """The metadata columns the job adds so that the applier's errors name where a change came from
    (``topic/partition@offset``, or ``file:line`` for recorded files), kept out of the table: none when
    the user asked for them already or a column of the table has one of their names."""
    from cdcflow.connectors.spark.read_plan import plan_read

    wanted = ("file", "line") if config.path else ("topic", "partition", "offset")
    requested = set(config._metadata())
    if config.schema:
        columns = {f.name for f in parse_ddl(config.schema)}
    else:  # the columns the source infers, as it will when the query starts
        plan = plan_read(config.format, config.source_options(), None)
        columns = {f.name for f in plan.decoded_columns}
    if columns & set(wanted):
        return ()
    return tuple(name for name in wanted if name not in requested)


def _legacy_batch_pending(storage: Storage, config: IngestConfig) -> bool:
    """Whether the checkpoint's last planned micro-batch is uncommitted and was logged without its
    ranges' length (by cdcflow before ``minPartitions``): the restart replays it, in the ranges the
    job planned then, so that its dead letters and counts are written once."""
    from cdcflow.connectors.spark.readers import SPLIT_KEY

    offsets = join(config.checkpoint, "offsets")
    batches = [int(name) for name in storage.names(offsets) if name.isdigit()]
    if not batches or storage.exists(join(config.checkpoint, "commits", str(max(batches)))):
        return False
    text = storage.read_text(join(offsets, str(max(batches))))
    try:
        logged = json.loads(text.splitlines()[-1]) if text else None
    except ValueError:
        return False  # not ours to judge: Spark reads its own log
    return isinstance(logged, dict) and "files" in logged and SPLIT_KEY not in logged


def _run(
    config: IngestConfig,
    session: SparkSession,
    sink: DeltaSink,
    started: float,
    out: TextIO,
    counts: CountsSince | None = None,
    origin_metadata: tuple[str, ...] = (),
    handoff_path: str | None = None,
) -> bool:
    """Run the query; when a message brings columns the inferred ones lack (SchemaChangedError), start
    it again from its checkpoint with them, so they reach the table in the batch where they appear.
    True when Ctrl-C stopped it."""
    from pyspark.errors import StreamingQueryException

    from cdcflow.connectors.spark.jobs import spark_failure

    options = config.source_options()
    if origin_metadata:
        add_metadata(options, *origin_metadata)
    if handoff_path is not None:
        options["handoffPath"] = handoff_path
    if config.path and given_key(options, "minPartitions") is None:
        from cdcflow.connectors.spark.session import default_parallelism

        # A batch in one range per core: each range has a fixed cost, and fewer of them decode faster.
        cores = default_parallelism(session)  # None through Spark Connect: ranges as before
        if cores is not None:
            options["minPartitions"] = str(cores)
        if given_key(options, "maxRecordsPerPartition") is None and (
            cores is None or _legacy_batch_pending(sink.storage, config)
        ):
            options["maxRecordsPerPartition"] = str(LEGACY_FILE_RECORDS_PER_PARTITION)
    added = {f.name for f in parse_ddl(options["addedColumns"])} if "addedColumns" in options else set()
    while True:
        changelog = session.readStream.format(config.source).options(**options).load()
        writer = changelog.writeStream.foreachBatch(sink).option("checkpointLocation", config.checkpoint)
        if config.trigger == "available-now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=config.interval)
        query = writer.start()
        try:
            return _follow(query, sink.progress, started, out, counts)
        except StreamingQueryException as error:
            change = schema_change(str(error))
            if change is None:
                raise spark_failure(error) from error
            origin, columns = change
            new = {f.name for f in parse_ddl(columns)}
            if config.schema or new <= added:
                raise spark_failure(error) from error  # declared columns, or no progress: it says what to do
            sink.drain()  # the batches before the one that failed are in the table when it restarts
            added |= new
            options["addedColumns"] = ", ".join(filter(None, (options.get("addedColumns"), columns)))
            out.write(
                f"cdcflow ingest: {origin} adds column(s) {columns}: restarting from the checkpoint with "
                "them; the table gains them in this batch\n"
            )
            out.flush()


def _follow(
    query: StreamingQuery,
    progress: SinkProgress,
    started: float,
    out: TextIO,
    counts: CountsSince | None = None,
) -> bool:
    """Print progress until the query ends (False) or Ctrl-C stops it (True)."""
    shown = -1
    try:
        while query.isActive:
            query.awaitTermination(1)
            if progress.batches != shown:
                shown = progress.batches
                messages = counts.counts() if counts is not None else None
                line = progress_line(progress, time.monotonic() - started, _lag(query.lastProgress), messages)
                out.write(line + "\n")
                out.flush()
    except KeyboardInterrupt:
        from cdcflow.connectors.spark.jobs import stop_quietly

        out.write("cdcflow ingest: interrupted: stopping the query (the checkpoint keeps its place)\n")
        out.flush()
        stop_quietly(query)
        return True
    query.awaitTermination()
    return False


def progress_line(
    progress: SinkProgress, seconds: float, lag: str, messages: MessageCounts | None = None
) -> str:
    last = progress.last
    latency = f"{last.seconds * 1000:.0f} ms" if last is not None else "-"
    rate = progress.changes / seconds if seconds > 0 else 0.0
    return (
        f"cdcflow ingest: {progress.batches} batches, {progress.changes:,} changes, {rate:,.0f} changes/s, "
        f"last batch applied in {latency}, lag {lag}"
        + (f"; this run: {messages}" if messages is not None else "")
    )


def _lag(last: Mapping[str, Any] | None) -> str:
    """How far the source is behind its latest offsets: records (Kafka) or bytes (recorded files)."""
    if not last or not last.get("sources"):
        return "-"
    source = last["sources"][0]
    end, latest = _parse(source.get("endOffset")), _parse(source.get("latestOffset"))
    if latest is None or end is None:
        return "-"
    if "files" in latest:  # recorded files: bytes per file (the end offset also has its split length)
        return f"{max(0, _total(latest['files']) - _total(end.get('files'))):,} bytes"
    return f"{max(0, _total(latest) - _total(end)):,} records"


def _parse(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _total(offsets: Any) -> int:
    if isinstance(offsets, Mapping):
        return sum(_total(v) for v in offsets.values())
    return int(offsets) if isinstance(offsets, int) and offsets >= 0 else 0
