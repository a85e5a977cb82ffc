"""A whole database in one job: every source table ingested into a Delta table of its own.

The job reads many topics (``--topic`` repeated, ``--topic-pattern``) or a folder of recorded topics
(one file or folder per topic) and runs one streaming query per topic in one Spark session. Each table
has its own checkpoint under the job's (``tables/<topic>``), its own key state and its own Delta
application transaction: a crash after some tables committed a micro-batch replays the batch of each
of the others, and every table applies it exactly once. Each table's primary key and columns come from
its messages, ``--target``'s placeholders from its envelope (:mod:`.target_names`). Under ``--trigger
continuous`` the job looks for new topics (or files) every :data:`DISCOVERY_SECONDS` and starts them
from their first change; a topic with no message yet waits for one.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TextIO

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.lakehouse.delta.result import BatchApplied
from cdcflow.connectors.lakehouse.delta.storage import Storage, join
from cdcflow.connectors.lakehouse.group_offsets import committing
from cdcflow.connectors.lakehouse.ingest import IngestConfig, Table, job_session, prepare_table
from cdcflow.connectors.lakehouse.ingest_defaults import given_key
from cdcflow.connectors.lakehouse.ingest_report import IngestSummary
from cdcflow.connectors.lakehouse.progress_json import ProgressLog
from cdcflow.connectors.lakehouse.sink import Progress
from cdcflow.connectors.lakehouse.target_names import render
from cdcflow.connectors.replay.dumps import list_files, read_messages
from cdcflow.connectors.spark.accounting import MessageCounts
from cdcflow.core.errors import CdcflowError
from cdcflow.formats.base import Message
from cdcflow.formats.registry import resolve_format
from cdcflow.formats.source_tables import SourceTable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdcflow.connectors.kafka.options import TopicPartition
    from cdcflow.connectors.lakehouse.checkpoint_lease import CheckpointLease
    from cdcflow.connectors.spark.read_plan import ReadPlan

TABLES_DIRECTORY = "tables"
DISCOVERY_SECONDS = 10.0
_RECORDED_SUFFIXES = (".gz", ".jsonl", ".ndjson", ".json", ".txt", ".dump")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class Topic:
    """One topic of the job's input: a Kafka topic, or a recorded topic's file or folder (``path``)."""

    name: str
    path: str | None = None


def topics(config: IngestConfig) -> list[Topic]:
    """The topics the job reads now: the folder's entries, the ``--topic`` list, or the pattern's matches."""
    if config.path:
        folder = config.path.removeprefix("file://")
        return [
            Topic(_recorded_name(entry), os.path.join(folder, entry))
            for entry in sorted(os.listdir(folder))
            if not entry.startswith((".", "_"))
        ]
    if config.topics:
        return [Topic(name) for name in config.topics]
    from cdcflow.connectors.kafka.admin import discover_partitions
    from cdcflow.connectors.kafka.options import KafkaOptions

    found = discover_partitions(KafkaOptions.parse(config.source_options()))
    return [Topic(name) for name in dict.fromkeys(tp.topic for tp in found)]


def _recorded_name(entry: str) -> str:
    name = entry
    while name.endswith(_RECORDED_SUFFIXES):
        name = name[: name.rindex(".")]
    return name or entry


class TableSkipped(Exception):
    """A topic the job does not ingest (now): excluded by ``--exclude-tables``/``--include-tables``."""


def _unit(topic: str, shared: SourceTable | None) -> list[str]:
    """The folder names of one table of the job (in its checkpoint, dead-letter and accounting folders)."""
    return [_UNSAFE.sub("_", part) for part in ([topic] if shared is None else [topic, shared.qualified])]


def table_config(config: IngestConfig, topic: Topic, shared: SourceTable | None = None) -> IngestConfig:
    """The single-table job of one topic (of one table of a topic many share: ``shared``, read through
    the format's filter); its target is decided once its messages are sampled."""
    unit = _unit(topic.name, shared)
    options = {**config.options}
    if shared is not None:
        options |= resolve_format(config.format).table_filter(shared) or {}
    for name in ("deadLetterPath", "accountingPath"):  # a folder of the job's: each table its own in it
        given = given_key(options, name)
        if given is not None:
            options[given] = join(options[given], *unit)
    return replace(
        config,
        target="",
        path=topic.path,
        topics=() if topic.path else (topic.name,),
        options=options,
        topic_pattern=None,
        include_tables=None,
        exclude_tables=None,
        table_keys={},
        table_modes={},
        on_table_error="stop",
        progress_json=None,
        checkpoint=join(config.checkpoint, TABLES_DIRECTORY, *unit),
        app_id=f"{config.app_id}.{'.'.join(unit)}" if config.app_id else None,
    )


class TopicScan:
    """The tables a topic many tables share holds (Canal's, Maxwell's), each with its first messages
    (its key and columns come from them): the topic read to its end, and on from there when asked
    again; a recorded topic is read once."""

    def __init__(self, config: IngestConfig, topic: Topic) -> None:
        self.config = table_config(config, topic)
        self.factory = resolve_format(config.format)
        self.tables: dict[SourceTable, list[Message]] = {}
        self._positions: dict[TopicPartition, int] = {}
        self._read = False

    def scan(self) -> dict[SourceTable, list[Message]]:
        from cdcflow.connectors.spark.read_plan import INFERENCE_SAMPLE

        for message in self._new_messages():
            table = self.factory.source_table(message.value)
            if table is not None:
                first = self.tables.setdefault(table, [])
                if len(first) < INFERENCE_SAMPLE:
                    first.append(message)
        return self.tables

    def _new_messages(self) -> Iterator[Message]:
        if self.config.path:
            if not self._read:
                for path in list_files(self.config.path):
                    yield from read_messages(path)
            self._read = True
            return
        from cdcflow.connectors.kafka.admin import subscription_bounds
        from cdcflow.connectors.kafka.options import KafkaOptions, OffsetRange
        from cdcflow.connectors.kafka.reader import read_range

        options = KafkaOptions.parse(self.config.source_options())
        for tp, (low, high) in subscription_bounds(options).items():
            start = max(low, self._positions.get(tp, low))
            if start < high:
                yield from read_range(
                    options, OffsetRange(tp.topic, tp.partition, start, high), fail_on_data_loss=False
                )
            self._positions[tp] = high


def source_table(plan: ReadPlan, topic: Topic) -> SourceTable:
    """The table a topic's messages name; a topic holding several is refused, one naming none is
    named after the topic (``prefix.schema.table`` → ``table``)."""
    if len(plan.source_tables) > 1:
        names = ", ".join(t.qualified for t in plan.source_tables)
        raise ConnectorOptionError(
            f"topic {topic.name} holds several tables ({names}), and its format reads one table per "
            "topic (Debezium writes one topic per table unless a router merges them): give the topics of "
            "one table each, or land this one with a single-table job"
        )
    if plan.source_tables:
        return plan.source_tables[0]
    return SourceTable(None, None, (plan.sampled_topic or topic.name).rsplit(".", 1)[-1])


def included(config: IngestConfig, table: SourceTable) -> bool:
    name = table.qualified
    if config.include_tables and re.fullmatch(config.include_tables, name) is None:
        return False
    return not (config.exclude_tables and re.fullmatch(config.exclude_tables, name) is not None)


def table_key(config: IngestConfig, table: SourceTable, plan: ReadPlan) -> tuple[tuple[str, ...], bool]:
    """``--table-key``'s key of the table (qualified or bare name), else ``--key``, else the messages'
    (and True)."""
    given = config.table_keys.get(table.qualified) or config.table_keys.get(table.table) or config.key
    if given:
        return given, False
    if plan.primary_key is None:
        raise ConnectorOptionError(
            f"table {table.qualified}: its messages name no primary key (a table without one, or keyless "
            f"messages): give it with --table-key '{table.qualified}=<columns>'"
        )
    return plan.primary_key, True


Shared = tuple[SourceTable, list[Message]]
"""One table of a topic many share, and its first messages."""


def units(config: IngestConfig, scans: dict[str, TopicScan]) -> Iterator[tuple[str, Topic, Shared | None]]:
    """The tables of the input as the job names them (a topic, or ``topic/db.table`` of a shared one),
    reading on in the shared topics (``scans``, kept between calls)."""
    shared = resolve_format(config.format).table_filter(SourceTable(None, None, "t")) is not None
    for topic in topics(config):
        if not shared:
            yield topic.name, topic, None
            continue
        scan = scans.setdefault(topic.name, TopicScan(config, topic))
        for table, first in scan.scan().items():
            yield f"{topic.name}/{table.qualified}", topic, (table, first)


@dataclass(frozen=True)
class Route:
    """Where one source table goes: its single-table job (target, key, checkpoint) and read plan."""

    table: SourceTable
    config: IngestConfig
    plan: ReadPlan
    named: bool
    """Whether the key is the one the messages name (no --key or --table-key for it)."""


def route(config: IngestConfig, topic: Topic, shared: Shared | None = None) -> Route:
    """One topic (or one table of a shared topic) planned: its table, target and key, before Spark;
    :class:`TableSkipped` when it is left out, ``EmptyInputError`` while it has no change."""
    from cdcflow.connectors.spark.read_plan import EmptyInputError, plan_read

    if shared is not None and not included(config, shared[0]):
        raise TableSkipped(shared[0].qualified)  # before its messages are decoded
    single = table_config(config, topic, shared[0] if shared else None)
    plan = plan_read(
        single.format,
        single.source_options(),
        None,
        primary_key=True,
        tables=True,
        first_messages=shared[1] if shared else None,
    )
    if not plan.sampled:
        raise EmptyInputError(f"topic {topic.name} has no message yet")
    table = source_table(plan, topic)
    if not included(config, table):
        raise TableSkipped(table.qualified)
    values = {"db": table.db, "schema": table.schema, "table": table.table, "topic": topic.name}
    key, named = table_key(config, table, plan)
    mode = config.table_modes.get(table.qualified) or config.table_modes.get(table.table) or config.mode
    single = replace(single, target=render(config.target, values, table.qualified), key=key, mode=mode)
    return Route(table, single, plan, named)


def plan_table(
    config: IngestConfig,
    topic: Topic,
    on_batch: Callable[[BatchApplied], None],
    out: TextIO,
    shared: Shared | None = None,
    progress: ProgressLog | None = None,
) -> tuple[SourceTable, Table]:
    """One topic (or one table of a shared topic and its first messages) routed and checked, its sink
    built: all before Spark (:func:`prepare_table`)."""
    found = route(config, topic, shared)
    table, single = found.table, found.config
    if found.named:
        key = ", ".join(single.key)
        out.write(f"cdcflow ingest: [{table.qualified}] primary key ({key}), named by the messages\n")
    if config.commit_group is not None:
        storage = Storage(dict(config.storage_options))
        on_batch = committing(
            config.commit_group, single.checkpoint, storage, single.source_options(), on_batch
        )
    return table, prepare_table(single, on_batch, out, found.plan, f"[{table.qualified}] ", progress)


class _Job:
    """The tables of one run, each on a thread of its own running its query; the supervisor (the
    caller's thread) starts new ones, stops them all on Ctrl-C or on one's failure."""

    def __init__(self, config: IngestConfig, on_batch: Callable[[BatchApplied], None], out: TextIO) -> None:
        self.config = config
        self.on_batch = on_batch
        self.out = out
        self.tables: dict[str, tuple[SourceTable, Table]] = {}
        self.skipped: dict[str, str] = {}
        self.waiting: set[str] = set()
        self.scans: dict[str, TopicScan] = {}
        self.targets: dict[str, str] = {}
        self.threads: dict[str, threading.Thread] = {}
        self.interrupted: dict[str, bool] = {}
        self.failures: dict[str, BaseException] = {}
        self.isolated: dict[str, str] = {}
        """``--on-table-error isolate``: the tables stopped by their error (name: reason)."""
        self.progress = ProgressLog(config.progress_json) if config.progress_json else None
        self.storage = Storage(dict(config.storage_options))
        self._first_start: float | None = None

    def discover(self) -> list[str]:
        """Plan the tables not seen yet; the names of those now ready to run."""
        ready = []
        for name, topic, shared in units(self.config, self.scans):
            ready += self._plan(name, topic, shared)
        return ready

    def _plan(
        self, name: str, topic: Topic, shared: tuple[SourceTable, list[Message]] | None = None
    ) -> list[str]:
        """Plan the table ``name`` unless it was: ``[name]`` when it is ready to run."""
        from cdcflow.connectors.spark.read_plan import EmptyInputError

        if name in self.tables or name in self.skipped:
            return []
        try:
            table, prepared = plan_table(self.config, topic, self.on_batch, self.out, shared, self.progress)
        except TableSkipped as skipped:
            self.skipped[name] = str(skipped)
            self._say(f"table {skipped} (topic {topic.name}) left out by --include/--exclude-tables")
            return []
        except EmptyInputError:
            if name not in self.waiting:
                self._say(f"{name} has no change yet: its table starts with its first")
            self.waiting.add(name)
            return []
        except CdcflowError as error:
            if self.config.on_table_error != "isolate":
                raise
            self.isolate(name, shared[0].qualified if shared else name, error)
            return []
        other = self.targets.get(prepared.config.target)
        if other is not None:
            raise ConnectorOptionError(
                f"tables {other} and {table.qualified} both land in {prepared.config.target}: add "
                "{db} or {schema} to --target so that each table has a path of its own"
            )
        self.targets[prepared.config.target] = table.qualified
        self.waiting.discard(name)
        self.tables[name] = (table, prepared)
        return [name]

    def start(self, name: str, session: SparkSession) -> None:
        table = self.tables[name][1]

        def work() -> None:
            try:
                self.interrupted[name] = table.run(session, self.out)
            except CdcflowError as error:
                if self.config.on_table_error != "isolate":
                    self.failures[name] = error
                else:
                    self.isolate(name, self.tables[name][0].qualified, error)
            except BaseException as error:  # noqa: BLE001 - handed to the supervisor, which raises it
                self.failures[name] = error
            finally:
                table.sink.close()

        thread = threading.Thread(target=work, name=f"cdcflow-table-{name}", daemon=True)
        self.threads[name] = thread
        thread.start()

    def isolate(self, name: str, table: str, error: BaseException) -> None:
        """Stop ``table`` alone (``--on-table-error isolate``): its reason is said, and written to its
        dead-letter folder (or the checkpoint's ``isolated``); its checkpoint is where it stopped, so a
        run after the fix goes on from there."""
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        self.isolated[table] = reason
        given = given_key(self.config.options, "deadLetterPath")
        folder = self.config.options[given] if given is not None else join(self.config.checkpoint, "isolated")
        where = join(folder, f"{_UNSAFE.sub('_', name)}.isolated.json")
        self.storage.write_text(
            where, json.dumps({"table": table, "topic": name, "reason": str(error)}) + "\n"
        )
        self._say(f"table {table} isolated (--on-table-error isolate), the others go on: {reason} ({where})")

    def warm(self) -> bool:
        """Whether another query may start. The first query of a session adds keys to the environment
        map of the cdc-* source's Python function (Spark's PythonStreamingSourceRunner.init), which the
        tasks of every query of that source serialize: a task serialized meanwhile fails ("Illegal size
        5 of collection, expected 6"). So the others start once the first has planned a batch (or
        ended, or had a minute)."""
        if len(self.threads) != 1:
            return True
        name, thread = next(iter(self.threads.items()))
        gate = self.tables[name][1].gate
        return gate.first_started is not None or not thread.is_alive() or self._since_first() > 60

    def _since_first(self) -> float:
        if self._first_start is None:
            self._first_start = time.monotonic()
        return time.monotonic() - self._first_start

    def stop(self) -> None:
        for _, table in self.tables.values():
            table.gate.stop()

    def _say(self, text: str) -> None:
        self.out.write(f"cdcflow ingest: {text}\n")
        self.out.flush()


def ingest_database(
    config: IngestConfig,
    spark: SparkSession | None,
    out: TextIO,
    on_batch: Callable[[BatchApplied], None],
    lease: CheckpointLease,
) -> IngestSummary:
    """Ingest every table of the input into the table ``config.target`` names for it."""
    from cdcflow.connectors.lakehouse.delta.storage import is_remote

    job = _Job(config, on_batch, out)
    job.discover()
    if not job.tables and not job.waiting and not job.isolated:
        raise ConnectorOptionError(
            f"no table to ingest in {config.path or config.topic_pattern or ', '.join(config.topics)}"
            + (f" ({len(job.skipped)} left out by --include/--exclude-tables)" if job.skipped else "")
        )
    unmatched = [name for name in config.table_keys if not _names_a_table(name, job)]
    if unmatched and config.trigger == "available-now":
        raise ConnectorOptionError(
            f"--table-key {', '.join(unmatched)}: no such table; the tables: "
            + ", ".join(table.qualified for table, _ in job.tables.values())
        )
    if not is_remote(config.checkpoint):
        lease.take()
    interrupted = False
    with job_session(config, spark) as session:
        lease.take(session)
        started = time.monotonic()
        try:
            interrupted = _supervise(job, session)
        finally:
            job.stop()
            for thread in job.threads.values():
                thread.join()
            if job.progress is not None:
                job.progress.close()
    if job.failures:
        name, error = next(iter(job.failures.items()))
        out.write(f"cdcflow ingest: table {job.tables[name][0].qualified} (topic {name}) failed\n")
        raise error
    summaries = {
        table.qualified: prepared.summary(started, job.interrupted.get(name, interrupted))
        for name, (table, prepared) in job.tables.items()
    }
    for name, summary in summaries.items():
        out.write(f"cdcflow ingest: [{name}] {summary}\n")
    summary = combined(summaries, time.monotonic() - started, interrupted, job.skipped, job.isolated)
    out.write(f"cdcflow ingest: {summary}\n")
    out.flush()
    return summary


def _names_a_table(name: str, job: _Job) -> bool:
    return any(name in (table.qualified, table.table) for table, _ in job.tables.values())


def _supervise(job: _Job, session: SparkSession) -> bool:
    """Run the tables to their end (available-now: a few at a time; continuous: all, and the new ones
    as they appear); True when Ctrl-C stopped them."""
    config = job.config
    parallel = max(2, os.cpu_count() or 2) if config.trigger == "available-now" else None
    queued = list(job.tables)
    discovered = time.monotonic()
    try:
        while True:
            running = [name for name, thread in job.threads.items() if thread.is_alive()]
            if job.failures:
                return False
            while queued and (parallel is None or len(running) < parallel) and job.warm():
                name = queued.pop(0)
                job.start(name, session)
                running.append(name)
            if not running and not queued and config.trigger == "available-now":
                return False
            if config.trigger == "continuous" and time.monotonic() - discovered > DISCOVERY_SECONDS:
                queued += job.discover()
                discovered = time.monotonic()
            time.sleep(0.2)
    except KeyboardInterrupt:
        job.out.write(
            "cdcflow ingest: Ctrl-C: stopping every table after its batch in progress "
            "(Ctrl-C again: at once)\n"
        )
        job.out.flush()
        job.stop()
        for thread in job.threads.values():
            try:
                thread.join()
            except KeyboardInterrupt:
                break
        return True


def combined(
    summaries: Mapping[str, IngestSummary],
    seconds: float,
    interrupted: bool,
    skipped: Mapping[str, str],
    isolated: Mapping[str, str],
) -> IngestSummary:
    """The job's totals over its tables' summaries."""
    progress = Progress()
    messages = MessageCounts()
    for summary in summaries.values():
        p = summary.progress
        progress = Progress(
            progress.batches + p.batches, progress.skipped + p.skipped, progress.totals.plus(p.totals), None
        )
        if summary.messages is not None:
            messages.add(summary.messages)
    started = [s.seconds - s.batch_seconds for s in summaries.values() if s.batch_seconds is not None]
    return IngestSummary(
        batches=progress.batches,
        progress=progress,
        seconds=seconds,
        table_version=None,
        table_rows=sum(s.table_rows or 0 for s in summaries.values()),
        messages=messages,
        interrupted=interrupted or any(s.interrupted for s in summaries.values()),
        batch_seconds=seconds - min(started) if started else None,
        tables=dict(summaries),
        skipped_tables=tuple(skipped.values()),
        isolated_tables=dict(isolated),
    )
