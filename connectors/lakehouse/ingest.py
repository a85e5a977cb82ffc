"""``cdcflow ingest``: a CDC topic (Kafka or a recorded dump) applied to a Delta table, continuously.

source (``cdc-*``) → decode → FROM_CHANGELOG → :class:`DeltaSink` (one merge per micro-batch, exactly
once) with a checkpoint. Debezium changes are ordered by their log position (``source.sequence``)
unless ``sequence_by`` names another column or ``none``.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Literal, TextIO

from cdcflow.connectors.errors import ConnectorError, ConnectorOptionError, schema_change
from cdcflow.connectors.lakehouse import added_columns, checkpoint_logs
from cdcflow.connectors.lakehouse.checkpoint_lease import CheckpointLease
from cdcflow.connectors.lakehouse.delta.batch import OnTruncate
from cdcflow.connectors.lakehouse.delta.options import Materialize
from cdcflow.connectors.lakehouse.delta.result import BatchApplied
from cdcflow.connectors.lakehouse.delta.storage import Storage, is_remote, join
from cdcflow.connectors.lakehouse.delta.tables import BACKENDS, open_table
from cdcflow.connectors.lakehouse.group_offsets import committing
from cdcflow.connectors.lakehouse.ingest_defaults import (
    LEGACY_FILE_RECORDS_PER_PARTITION,
    SourceLinks,
    add_metadata,
    add_source_defaults,
    given_key,
    metadata_of,
    source_links,
)
from cdcflow.connectors.lakehouse.ingest_report import IngestSummary, lag_text, progress_line, reported_batch
from cdcflow.connectors.lakehouse.progress_json import ProgressLog
from cdcflow.connectors.lakehouse.sink import DeltaSink, apply_options
from cdcflow.connectors.lakehouse.target_names import is_database_target
from cdcflow.connectors.spark import inferred_columns
from cdcflow.connectors.spark.accounting import CountsSince
from cdcflow.formats.redact import redacted_repr
from cdcflow.formats.registry import resolve_format
from cdcflow.formats.types import parse_ddl

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from cdcflow.connectors.spark.read_plan import ReadPlan

LOG_POSITION = ("source.sequence", "source.timestamp")
"""The metadata columns a format orders each key's changes by, by default, where it declares both."""
DEBEZIUM_SEQUENCE = "source_sequence"
DEBEZIUM_RESTART = "source_timestamp"
"""The commit time: tells a restarted log position (failover, RESET MASTER) from a late change."""
Trigger = Literal["available-now", "continuous"]
Backend = Literal["delta-rs", "spark"]
OnTableError = Literal["stop", "isolate"]
Mode = Literal["scd1", "scd2"]
ACCOUNTING_DIRECTORY = "cdcflow-accounting"
HANDOFF_DIRECTORY = "cdcflow-handoff"


@dataclass(frozen=True)
class IngestConfig:
    """Everything one ingestion needs; the command line and the Python API both build one."""

    format: str
    key: tuple[str, ...]
    """The primary key; () = the one the messages name (:meth:`FormatFactory.primary_key`)."""
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
    commit_group: str | None = None
    """Kafka: the consumer group each applied micro-batch's end offsets are committed to, for lag tools
    (never read back: the checkpoint says where the job goes on; :mod:`.group_offsets`)."""
    topic_pattern: str | None = None
    """Kafka: every topic matching this regular expression, each routed to its table (Spark's
    ``subscribePattern``); needs a target with placeholders."""
    include_tables: str | None = None
    """A whole-database job lands only the tables whose qualified name matches this expression."""
    exclude_tables: str | None = None
    """A whole-database job leaves out the tables whose qualified name matches this expression."""
    table_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """A whole-database job's primary keys by table (qualified or bare name), over the messages'."""
    mode: Mode = "scd1"
    """scd1: the table holds each key's latest row; scd2: every version (:mod:`.delta.history_apply`)."""
    table_modes: Mapping[str, Mode] = field(default_factory=dict)
    """A whole-database job's modes by table (qualified or bare name), over ``mode``."""
    on_table_error: OnTableError = "stop"
    """A whole-database job: a table that fails stops the job, or is ``isolate``d while the others go on."""
    progress_json: str | None = None
    """A file to append one JSON object per applied micro-batch to (:mod:`.progress_json`)."""

    def __repr__(self) -> str:
        return redacted_repr(self)

    def __post_init__(self) -> None:
        sources = _source_names()
        if self.format not in sources:
            raise ConnectorOptionError(f"--format {self.format!r} is not one of {', '.join(sources)}")
        if bool(self.path) == bool(self.bootstrap_servers):
            raise ConnectorOptionError(
                "give either --path (recorded files) or --bootstrap-servers and --topic"
            )
        if self.bootstrap_servers and not self.topics and not self.topic_pattern:
            raise ConnectorOptionError("--bootstrap-servers needs at least one --topic or a --topic-pattern")
        if self.topics and self.topic_pattern:
            raise ConnectorOptionError("give --topic or --topic-pattern, not both")
        database = is_database_target(self.target)
        for flag, given in (
            ("--topic-pattern", self.topic_pattern),
            ("--include-tables", self.include_tables),
            ("--exclude-tables", self.exclude_tables),
            ("--table-key", bool(self.table_keys)),
            ("--table-mode", bool(self.table_modes)),
            ("--on-table-error isolate", self.on_table_error == "isolate"),
        ):
            if given and not database:
                raise ConnectorOptionError(
                    f"{flag} is for a whole database: give a --target with placeholders, e.g. "
                    "--target '/lake/{db}/{table}'"
                )
            if isinstance(given, str) and flag.endswith("-tables"):
                try:
                    re.compile(given)
                except re.error as error:
                    raise ConnectorOptionError(
                        f"{flag} {given!r} is no regular expression: {error}"
                    ) from None
        if database and self.path and not os.path.isdir(self.path.removeprefix("file://")):
            raise ConnectorOptionError(
                f"--path {self.path}: a whole-database target reads a folder of recorded topics (one file "
                "or folder per topic); give the folder"
            )
        if self.commit_group is not None and not self.bootstrap_servers:
            raise ConnectorOptionError("--commit-group commits Kafka offsets: it needs --bootstrap-servers")
        if self.on_table_error not in ("stop", "isolate"):
            raise ConnectorOptionError(
                f"--on-table-error must be stop or isolate, not {self.on_table_error!r}"
            )
        for mode in (self.mode, *self.table_modes.values()):
            if mode not in ("scd1", "scd2"):
                raise ConnectorOptionError(f"--mode must be scd1 or scd2, not {mode!r}")
        if "scd2" in (self.mode, *self.table_modes.values()):
            if self.backend != "delta-rs":
                raise ConnectorOptionError("--mode scd2 writes with delta-rs: use --backend delta-rs")
            self.history_time()
        if self.trigger not in ("available-now", "continuous"):
            raise ConnectorOptionError(f"--trigger must be available-now or continuous, not {self.trigger!r}")
        if self.backend not in BACKENDS:
            raise ConnectorOptionError(
                f"--backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}"
            )
        Storage(dict(self.storage_options))  # malformed or repeated storage options fail here
        # Local paths made absolute here: Spark resolves the checkpoint and the files against the JVM's
        # directory, the lease, the pending log, the key state and the table against Python's, and
        # these differ once a process whose JVM is up changes directory (a notebook's os.chdir).
        for name in ("target", "checkpoint", "path"):
            value = getattr(self, name)
            if value and not is_remote(value):
                object.__setattr__(self, name, os.path.abspath(value.removeprefix("file://")))

    @property
    def source(self) -> str:
        return _source_names()[self.format]

    def resolved_sequence(self) -> str | None:
        if self.sequence_by == "none":
            return None
        if self.sequence_by is None and resolve_format(self.format).has_metadata(*LOG_POSITION):
            return DEBEZIUM_SEQUENCE
        return self.sequence_by

    def history_time(self) -> str:
        """The column whose value starts a version under ``--mode scd2``: ``--sequence-by``, or the
        commit time of a format with a log position (Debezium's ``source.ts_ms``)."""
        sequence = self.resolved_sequence()
        if sequence == DEBEZIUM_SEQUENCE:
            return DEBEZIUM_RESTART
        if sequence is None:
            raise ConnectorOptionError(
                f"--mode scd2 needs each change's time: give --sequence-by COLUMN (a timestamp or number "
                f"rising with each key's changes; {self.format} has no commit time of its own)"
            )
        return sequence

    def source_options(self) -> dict[str, str]:
        """The source's options: the user's with the job's defaults (decided once; a copy to add to)."""
        return dict(self._source_options)

    @cached_property
    def _source_options(self) -> Mapping[str, str]:
        options = dict(self.options)
        if self.schema:
            options["columns"] = self.schema
        if self.path:
            options["path"] = self.path
        else:
            options["kafka.bootstrap.servers"] = str(self.bootstrap_servers)
            if self.topic_pattern:
                options.setdefault("subscribePattern", self.topic_pattern)
            else:
                options.setdefault("subscribe", ",".join(self.topics))
            options.setdefault("startingOffsets", "earliest")
        if self.resolved_sequence() == DEBEZIUM_SEQUENCE:
            add_metadata(options, *LOG_POSITION)
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
        pairs = zip((DEBEZIUM_SEQUENCE, DEBEZIUM_RESTART), LOG_POSITION, strict=True)
        return [column for column, name in pairs if name not in requested]


def _source_names() -> dict[str, str]:
    from cdcflow.connectors.spark.sources import source_names

    return source_names()


def ingest(
    config: IngestConfig,
    spark: SparkSession | None = None,
    out: TextIO = sys.stderr,
    on_batch: Callable[[BatchApplied], None] | None = None,
) -> IngestSummary:
    """Run the ingestion; with ``available-now`` it returns once the input available at start is applied.

    ``on_batch`` sees what each micro-batch did (its apply latency, counts), as it happens. The job holds
    the checkpoint's lease while it runs (:mod:`.checkpoint_lease`): a second job on it is refused.
    """
    storage = Storage(dict(config.storage_options))
    lease = CheckpointLease(config.checkpoint, storage)
    if config.commit_group is not None and not is_database_target(config.target):  # else per table
        on_batch = committing(
            config.commit_group, config.checkpoint, storage, config.source_options(), on_batch
        )
    try:
        return _ingest(config, spark, out, lease.guard(on_batch), lease)
    finally:
        lease.release()


def _ingest(
    config: IngestConfig,
    spark: SparkSession | None,
    out: TextIO,
    on_batch: Callable[[BatchApplied], None],
    lease: CheckpointLease,
) -> IngestSummary:
    if is_database_target(config.target):
        from cdcflow.connectors.lakehouse.database import ingest_database

        return ingest_database(config, spark, out, on_batch, lease)
    progress = ProgressLog(config.progress_json) if config.progress_json else None
    table = prepare_table(config, on_batch, out, progress=progress)
    if not is_remote(config.checkpoint):
        lease.take()  # before Spark starts: a second job on the checkpoint is refused at once
    with job_session(config, spark) as session:
        lease.take(session)  # on an object store: written with Spark's file system, conditionally
        started = time.monotonic()
        try:
            interrupted = table.run(session, out)
        finally:
            table.sink.close()
            if progress is not None:
                progress.close()
    summary = table.summary(started, interrupted)
    out.write(f"cdcflow ingest: {summary}\n")
    out.flush()
    return summary


@contextlib.contextmanager
def job_session(config: IngestConfig, spark: SparkSession | None) -> Iterator[SparkSession]:
    """The given or active session, or a local one this job starts and stops (a notebook's or a test's
    own keeps running)."""
    from cdcflow.connectors.spark.jobs import local_session

    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    own_session = spark is None
    session = spark or local_session("cdcflow-ingest", _session_config(config))
    try:
        yield session
    finally:
        if own_session:
            session.stop()


def prepare_table(
    config: IngestConfig,
    on_batch: Callable[[BatchApplied], None],
    out: TextIO,
    plan: ReadPlan | None = None,
    label: str = "",
    progress: ProgressLog | None = None,
) -> Table:
    """One table's read planned, its key and columns checked and its sink built: all before Spark."""
    from cdcflow.connectors.kafka.admin import discover_partitions
    from cdcflow.connectors.spark.read_plan import KafkaInput

    sequence = config.resolved_sequence()
    links = config.links()
    plan = plan or _plan(config)
    if isinstance(plan.input, KafkaInput):
        discover_partitions(plan.input.options)  # an unreachable cluster or a missing topic: before Spark
    if not config.key:
        config = replace(config, key=source_key(config, plan))
        out.write(f"cdcflow ingest: {label}primary key ({', '.join(config.key)}), named by the messages\n")
    check_columns(config, plan)
    origin = origin_columns(config, plan)
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
        # The job's own ordering (source.sequence) is NULL for connectors without a log position.
        unsequenced="arrival" if config.sequence_by is None else "dead-letter",
        **links.apply,
    )
    accounting = config.accounting_path()
    local = None if is_remote(config.checkpoint) else config.checkpoint.removeprefix("file://")
    counts = CountsSince(accounting, local) if accounting is not None else None
    gates: list[_BatchGate] = []
    if progress is not None:
        name = label.strip("[] ") or config.target
        on_batch = progress.recorder(
            name, on_batch, lambda: gates[0].query if gates else None, lambda: counts
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
        history_time=config.history_time() if config.mode == "scd2" else None,
    )
    sink.check_identity()
    gates.append(_BatchGate(sink, label))
    return Table(config, plan, sink, origin, gates[0], counts)


@dataclass
class Table:
    """One source table's ingestion: its read plan, its sink (target, key state, transaction) and the
    gate Spark calls it through."""

    config: IngestConfig
    plan: ReadPlan
    sink: DeltaSink
    origin: tuple[str, ...]
    gate: _BatchGate
    counts: CountsSince | None

    def run(self, session: SparkSession, out: TextIO) -> bool:
        """Recover the sink and run the query to its end; True when Ctrl-C stopped it."""
        self.sink.bind(session)
        self.sink.recover()
        handoff_path = _handoff_path(self.config, session)
        interrupted = _run(
            self.config, self.plan, session, self.sink, self.gate, out, self.counts, self.origin, handoff_path
        )
        self.sink.drain()
        return interrupted

    def summary(self, started: float, interrupted: bool) -> IngestSummary:
        """What the run since ``started`` (``time.monotonic()``) did."""
        table = open_table(self.config.target, self.sink.storage)
        ended, gate = time.monotonic(), self.gate
        return IngestSummary(
            batches=self.sink.progress.batches,
            progress=self.sink.progress.now,
            seconds=ended - started,
            table_version=table.version() if table is not None else None,
            table_rows=table.count() if table is not None else None,
            messages=self.counts.counts() if self.counts is not None else None,
            interrupted=interrupted,
            batch_seconds=None if gate.first_started is None else ended - gate.first_started,
            key=self.config.key,
            dead_letters_to=_dead_letters_to(self.config.options),
        )


def _dead_letters_to(options: Mapping[str, str]) -> str | None:
    path, topic = given_key(options, "deadLetterPath"), given_key(options, "deadLetterTopic")
    if path is not None:
        return options[path]
    return f"topic {options[topic]}" if topic is not None else None


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


def _plan(config: IngestConfig) -> ReadPlan:
    """The source's read as the query will plan it: the declared columns, or those it infers."""
    from cdcflow.connectors.spark.read_plan import plan_read

    return plan_read(config.format, config.source_options(), None, primary_key=not config.key)


def source_key(config: IngestConfig, plan: ReadPlan) -> tuple[str, ...]:
    """The primary key the input's first messages name, or a usage error saying to give ``--key``."""
    from cdcflow.connectors.spark.read_plan import INFERENCE_SAMPLE

    if plan.primary_key is None:
        source = config.path or ", ".join(config.topics)
        raise ConnectorOptionError(
            f"--key: no message among the first {INFERENCE_SAMPLE} of {source} names a primary key "
            f"({config.format} takes it from the Kafka key's fields or the envelope's key list; a table "
            "without one sends none, an empty topic has none yet): name the primary key columns, e.g. "
            "--key id"
        )
    return plan.primary_key


def check_columns(config: IngestConfig, plan: ReadPlan | None = None) -> None:
    """Fail before Spark starts when ``--key``, ``--upsert-key`` or ``--sequence-by`` names no column of
    the table (declared with ``--schema``, or inferred from the input), with the nearest names."""
    plan = plan or _plan(config)
    hidden = (plan.row_kind_column, plan.control_column)
    changelog = [f.name for f in plan.output.fields if f.name not in hidden]
    internal = {*config.links().exclude, *config.ordering_columns()}
    table = [name for name in changelog if name not in internal]
    wanted = [("--key", config.key, table), ("--upsert-key", config.upsert_key or (), table)]
    if config.sequence_by not in (None, "none"):
        wanted.append(("--sequence-by", (str(config.sequence_by),), changelog))
    for flag, names, columns in wanted:
        for name in names:
            if name not in columns:
                raise ConnectorOptionError(
                    f"{flag} {name}: the table has no column {name!r}{_did_you_mean(name, columns)}; "
                    f"its columns: {', '.join(table)}"
                )


def _did_you_mean(name: str, columns: list[str]) -> str:
    lowered = {column.lower(): column for column in columns}
    near = difflib.get_close_matches(name.lower(), list(lowered), n=1)
    near = near or [c for c in lowered if len(c) > 1 and (c in name.lower() or name.lower() in c)][:1]
    return f" (did you mean {lowered[near[0]]!r}?)" if near else ""


def origin_columns(config: IngestConfig, plan: ReadPlan | None = None) -> tuple[str, ...]:
    """The metadata columns the job adds so that the applier's errors name where a change came from
    (``topic/partition@offset``, or ``file:line`` for recorded files), kept out of the table: none when
    the user asked for them already or a column of the table has one of their names."""
    wanted = ("file", "line") if config.path else ("topic", "partition", "offset")
    requested = set(config._metadata())
    if config.schema:
        columns = {f.name for f in parse_ddl(config.schema)}
    else:  # the columns the source infers, as it will when the query starts
        columns = {f.name for f in (plan or _plan(config)).decoded_columns}
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
    plan: ReadPlan,
    session: SparkSession,
    sink: DeltaSink,
    gate: _BatchGate,
    out: TextIO,
    counts: CountsSince | None = None,
    origin_metadata: tuple[str, ...] = (),
    handoff_path: str | None = None,
) -> bool:
    """Run the query; when a message brings columns the inferred ones lack or widens one's type
    (SchemaChangedError), start it again from its checkpoint with them, so they reach the table in the
    batch where they appear.
    True when Ctrl-C stopped it."""
    from pyspark.errors import StreamingQueryException

    from cdcflow.connectors.spark.jobs import spark_failure

    options = config.source_options()
    if plan.inferred_columns is not None:  # the columns this run inferred: the query samples nothing again
        options[inferred_columns.OPTION] = inferred_columns.encode(plan.inferred_columns)
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
    if not config.schema and given_key(options, "columns") is None:
        kept = added_columns.recorded(config.checkpoint, sink.storage)
        if kept is not None:
            options["addedColumns"] = added_columns.merged(options.get("addedColumns"), kept)
    added = {f.name: f.type for f in parse_ddl(options["addedColumns"])} if "addedColumns" in options else {}
    while True:
        changelog = session.readStream.format(config.source).options(**options).load()
        writer = changelog.writeStream.foreachBatch(gate).option("checkpointLocation", config.checkpoint)
        if config.trigger == "available-now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=config.interval)
        if gate.stopping:
            return True
        with checkpoint_logs.local_logs(session, config.checkpoint):
            query = gate.query = writer.start()
        try:
            return _follow(query, gate, out, counts)
        except StreamingQueryException as error:
            if gate.stopping:
                return True
            change = schema_change(str(error))
            if change is None:
                raise spark_failure(error) from error
            origin, columns = change
            new = {f.name: f.type for f in parse_ddl(columns)}
            if config.schema or all(added.get(name) == kind for name, kind in new.items()):
                raise spark_failure(error) from error  # declared columns, or no progress: it says what to do
            sink.drain()  # the batches before the one that failed are in the table when it restarts
            added |= new
            options["addedColumns"] = added_columns.merged(options.get("addedColumns"), columns)
            added_columns.record(config.checkpoint, sink.storage, options["addedColumns"])
            out.write(
                f"cdcflow ingest: {gate.label}{origin} adds or widens column(s) {columns}: restarting from "
                "the checkpoint with them; the table gains them in this batch\n"
            )
            out.flush()


class _Interrupted(ConnectorError, RuntimeError):
    """A micro-batch Spark started after Ctrl-C: refused, so that Spark does not commit it."""


class _BatchGate:
    """The sink as Spark calls it: notes when the first batch starts (the rate leaves out the session's
    start) and, after Ctrl-C, stops the query between two batches. A batch cut short fails inside a
    Py4J call, and Spark's check of that error overflows the JVM's stack (a StackOverflowError of a
    thousand lines); a batch that finishes is committed, and the run says so."""

    def __init__(self, sink: DeltaSink, label: str = "") -> None:
        self.sink = sink
        self.label = label
        """``[db.table] ``: what the progress lines of one table of many start with."""
        self.query: StreamingQuery | None = None
        """The query running now (a schema change starts another)."""
        self.first_started: float | None = None
        self._stopping = False
        self._running = False
        self._idle = threading.Condition()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        with self._idle:
            if self._stopping:
                raise _Interrupted(f"batch {batch_id} not started: the run was interrupted (Ctrl-C)")
            self._running = True
            if self.first_started is None:
                self.first_started = time.monotonic()
        try:
            self.sink(batch, batch_id)
        finally:
            with self._idle:
                self._running = False
                self._idle.notify_all()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self) -> None:
        """Let the batch in progress finish, then stop the query; a second Ctrl-C stops it at once."""
        from cdcflow.connectors.spark.jobs import stop_quietly

        try:
            with self._idle:
                self._stopping = True
                while self._running:
                    self._idle.wait(0.2)
        finally:
            if self.query is not None:
                stop_quietly(self.query)


def _follow(query: StreamingQuery, gate: _BatchGate, out: TextIO, counts: CountsSince | None = None) -> bool:
    """Print a line per applied batch until the query ends (False) or Ctrl-C stops it (True)."""
    shown = 0
    try:
        while query.isActive:
            query.awaitTermination(1)
            shown = _show_progress(query, gate, out, counts, shown)
    except KeyboardInterrupt:
        out.write("cdcflow ingest: Ctrl-C: stopping after the batch in progress (Ctrl-C again: at once)\n")
        out.flush()
        with contextlib.suppress(KeyboardInterrupt):
            gate.stop()
        return True
    if gate.stopping:  # stopped by the job (another table's Ctrl-C)
        return True
    query.awaitTermination()
    gate.sink.drain()  # the last batch's line too
    _show_progress(query, gate, out, counts, shown, final=True)
    return False


def _show_progress(
    query: StreamingQuery,
    gate: _BatchGate,
    out: TextIO,
    counts: CountsSince | None,
    shown: int,
    final: bool = False,
) -> int:
    """A line per batch applied since the first ``shown`` ones; returns the batches shown. The sink
    reports a batch before Spark's progress does: until the query's progress covers it (or the query
    ended) its line waits, so that it carries the lag after that batch."""
    pending = gate.sink.progress.after(shown)
    if not pending:
        return shown
    reported, lag = reported_batch(query), lag_text(query.lastProgress)
    since = None if gate.first_started is None else time.monotonic() - gate.first_started
    committed = counts.committed() if counts is not None else None
    for progress in pending:
        if not final and progress.last is not None and reported < progress.last.batch_id:
            break
        out.write(progress_line(progress, since, lag, committed, gate.label) + "\n")
        shown = progress.batches
    out.flush()
    return shown
