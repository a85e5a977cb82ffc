"""``cdcflow ingest`` vs the Spark job a competent user writes by hand, from a file and from Kafka: changes/s.

One seeded Debezium history (bench/cdc_history.py: inserts, updates, deletes and re-inserts over
``--keys`` ids, ``source.lsn`` increasing) is written as one file of envelopes, one per line, and
produced to a real Kafka topic (the same envelopes, keyed ``{"id":N}`` and spread over
``--partitions`` partitions by id, lz4, no tombstones; ``KAFKA_BOOTSTRAP`` if set, else a single-node
KRaft broker the bench starts, see bench/kafka_spark.py). Each is applied to a new Delta table by:

- ``cdcflow``: ``ingest(IngestConfig(format="debezium-json", key=("id",), ...), spark=session)``,
  the ``python -m cdcflow ingest`` job: the ``cdc-debezium`` source, ordering by ``source.sequence``
  with its key state, one exactly-once delta-rs merge per micro-batch applied while Spark decodes
  the next one (the batch kept in the checkpoint's pending log meanwhile), the decoded rows handed
  to the driver as Arrow files, its default batch sizes (64 MiB of file / 100k Kafka records per
  micro-batch);
- ``hand-written``: ``readStream.text`` (file) or ``readStream.format("kafka")`` (Kafka, read_committed,
  ``maxOffsetsPerTrigger`` = cdcflow's records per batch) + ``from_json`` with a lean schema (``op``,
  ``before.id``, the ``after`` image, ``source.lsn``) + ``foreachBatch``: ``toArrow``, each id's last
  change in the batch by ``source.lsn``, one delta-rs ``DeltaTable.merge`` (delete when ``op`` is ``d``,
  update / insert the ``after`` image otherwise) recording the batch as a Delta application
  transaction (a replayed batch is skipped: exactly once, as cdcflow's). Spark's ``text`` source
  limits micro-batches by files only, so it reads the history cut (untimed, beforehand) into files at
  the line boundaries where cdcflow's ``maxBytesPerTrigger`` cuts the one file, with
  ``maxFilesPerTrigger=1``: both sides apply the same changes in each micro-batch.

The ``schemas`` source is real Kafka Connect output: the same history as messages of the recorded
PostgreSQL ``cdc_types`` table with their ~5 kB schema block (bench/schema_history.py, ``--schema-bytes``
of them, 200 MiB by default), one per line in a file. Both jobs are given the same five columns:
cdcflow ``--schema`` with ``debezium-json.schema-include``, the hand-written job a ``from_json`` schema
of ``payload`` with those columns; its bytes/s are printed too.

Both are streaming queries with the available-now trigger in ONE local[2] session (Spark's Kafka
jars; no Delta jars: both merge with delta-rs in the driver). A run's wall time includes the
query's start and ends when it has applied everything; the session's start is excluded. Runs are
interleaved per source (cdcflow, hand-written, cdcflow, ...), after ``--warmup`` rounds of the same
runs that are printed but left out of the medians: the first runs in a session pay the JVM's class
loading and JIT and the start of Spark's Python workers, and the job that runs first pays most of the
JVM's share. Every table is checked (untimed) against the history folded by id
(``cdc_history.fold``, independent of cdcflow) and the two tables of a round against each other,
schemas included. A "change" is one envelope. Memory per run: the high-water mark (VmHWM, reset
before the run through /proc/<pid>/clear_refs) of the Python driver and of Spark's JVM (a child
process), and how far it rose above the process's resident size at the run's start (what earlier
runs left resident counts in the peak, not in the rise); the Python workers that decode cdcflow's
source are not counted.

    .venv/bin/python bench/ingest.py [--changes 1000000] [--keys 100000] [--rounds 3] [--warmup 1]
        [--sources file,kafka,schemas] [--partitions 4] [--schema-bytes N] [--file-batch-bytes N]
        [--kafka-batch-records N] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import results
import schema_history
from cdc_history import COLUMNS, Row, events, fold, write_history
from deltalake import CommitProperties, DeltaTable, Transaction
from kafka_spark import kafka_cluster, session

from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest
from cdcflow.connectors.lakehouse.ingest_defaults import (
    DEFAULT_MAX_BYTES_PER_TRIGGER,
    DEFAULT_MAX_OFFSETS_PER_TRIGGER,
)

SOURCES = ("file", "kafka", "schemas")
JOBS = ("cdcflow", "hand-written")
LEAN = (
    "op STRING, before STRUCT<id: INT>, "
    "after STRUCT<id: INT, name: STRING, qty: BIGINT, price: DOUBLE, rev: BIGINT>, source STRUCT<lsn: BIGINT>"
)
SCHEMAS_LEAN = (
    "payload STRUCT<op: STRING, before: STRUCT<id: INT>, after: STRUCT<id: INT, c_text: STRING, "
    "c_bigint: BIGINT, c_double: DOUBLE, c_smallint: SMALLINT>, source: STRUCT<lsn: BIGINT>>"
)
TABLE = pa.schema(
    [
        pa.field("id", pa.int32(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("qty", pa.int64()),
        pa.field("price", pa.float64()),
        pa.field("rev", pa.int64()),
    ]
)


SCHEMAS_TABLE = pa.schema(
    [
        pa.field("id", pa.int32(), nullable=False),
        pa.field("c_text", pa.string()),
        pa.field("c_bigint", pa.int64()),
        pa.field("c_double", pa.float64()),
        pa.field("c_smallint", pa.int16()),
    ]
)


@dataclass(frozen=True)
class Data:
    """One source's history as both jobs are told about it, and the table it leaves."""

    history: Path
    pieces: Path
    changes: int
    bytes: int
    truth: dict[int, Row]
    table: pa.Schema
    columns: str
    """The columns cdcflow is given (``--schema``)."""
    lean: str
    """The hand-written job's ``from_json`` schema."""
    envelope: str
    """Where the envelope is in the hand-written job's parsed value."""
    options: dict[str, str]
    """cdcflow's format options."""


@dataclass(frozen=True)
class Input:
    """Where one source's changes are, for both jobs."""

    source: str
    data: Data
    bootstrap: str | None
    topic: str
    file_batch_bytes: int
    kafka_batch_records: int


@dataclass(frozen=True)
class Run:
    seconds: float
    batches: int
    driver: Memory
    jvm: Memory


@dataclass(frozen=True)
class Memory:
    """A process's peak resident set during a run and how far it rose above its size at the start."""

    peak: int | None = None
    rise: int | None = None

    def __str__(self) -> str:
        if self.peak is None or self.rise is None:
            return "-"
        return f"{mib(self.peak)} (+{self.rise / 2**20:,.0f})"


def split(history: Path, folder: Path, budget: int) -> int:
    """Cuts ``history`` into files where cdcflow's ``maxBytesPerTrigger`` cuts it (after the line in which
    each ``budget`` bytes run out), named and dated in order; returns how many."""
    folder.mkdir()
    base = time.time() - 3600
    pieces: list[Path] = []
    with history.open("rb") as lines:
        out = None
        written = 0
        for line in lines:
            if out is None:
                pieces.append(folder / f"part-{len(pieces):05d}.jsonl")
                out, written = pieces[-1].open("wb"), 0
            out.write(line)
            written += len(line)
            if written >= budget:
                out.close()
                out = None
        if out is not None:
            out.close()
    for index, piece in enumerate(pieces):  # Spark's file source takes new files by modification time
        os.utime(piece, (base + index, base + index))
    return len(pieces)


def produce_history(bootstrap: str, topic: str, changes: int, keys: int, partitions: int) -> int:
    """The history's envelopes on a new ``topic``, keyed by id, each id on one partition; returns bytes."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=60)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "compression.type": "lz4",
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 200_000,
        }
    )
    size = 0
    for index, event in enumerate(events(changes, keys)):
        key = (event["after"] or event["before"])["id"]
        value = orjson.dumps(event)
        size += len(value)
        while True:
            try:
                producer.produce(topic, value, b'{"id":%d}' % key, partition=key % partitions)
                break
            except BufferError:
                producer.poll(0.1)
        if index % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300):
        sys.exit("not every record was delivered to Kafka within 300 s")
    return size


def run_cdcflow(spark: Any, given: Input, work: Path) -> int:
    """``cdcflow ingest`` into ``work/table``; returns its micro-batches."""
    common: dict[str, Any] = {
        "format": "debezium-json",
        "key": ("id",),
        "target": str(work / "table"),
        "checkpoint": str(work / "checkpoint"),
        "schema": given.data.columns,
        "options": given.data.options,
    }
    if given.source != "kafka":
        config = IngestConfig(
            **common, path=str(given.data.history), max_bytes_per_trigger=given.file_batch_bytes
        )
    else:
        config = IngestConfig(
            **common,
            bootstrap_servers=given.bootstrap,
            topics=(given.topic,),
            max_offsets_per_trigger=given.kafka_batch_records,
        )
    with open(os.devnull, "w") as quiet:
        summary = ingest(config, spark=spark, out=quiet)
    if summary.interrupted:
        sys.exit("cdcflow ingest was interrupted")
    return summary.batches


class LastChangeMerge:
    """The hand-written ``foreachBatch``: each id's last change in the batch, merged by delta-rs."""

    def __init__(self, target: Path, data: Data) -> None:
        self.target = str(target)
        self.table = data.table
        self.envelope = data.envelope
        self.app_id = f"bench-{uuid.uuid4().hex}"
        self.batches = 0

    def __call__(self, frame: Any, batch_id: int) -> None:
        if DeltaTable.is_deltatable(self.target):
            table = DeltaTable(self.target)
            done = table.transaction_version(self.app_id)
            if done is not None and done >= batch_id:
                return
        else:
            table = DeltaTable.create(self.target, self.table)
        from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

        e = self.envelope
        changes = frame.select(
            F.coalesce(f"{e}.after.id", f"{e}.before.id").alias("id"),
            *(F.col(f"{e}.after.{name}").alias(name) for name in self.table.names[1:]),
            F.col(f"{e}.op").alias("op"),
            F.col(f"{e}.source.lsn").alias("lsn"),
        ).toArrow()
        self.batches += 1
        if changes.num_rows == 0:
            return
        changes = changes.take(pc.sort_indices(changes, [("id", "ascending"), ("lsn", "descending")]))
        ids = changes.column("id").to_numpy()
        first = np.ones(len(ids), dtype=bool)
        first[1:] = ids[1:] != ids[:-1]
        last = changes.filter(pa.array(first))
        columns = {name: f"s.{name}" for name in self.table.names}
        (
            table.merge(
                last,
                predicate="t.id = s.id",
                source_alias="s",
                target_alias="t",
                commit_properties=CommitProperties(app_transactions=[Transaction(self.app_id, batch_id)]),
            )
            .when_matched_delete(predicate="s.op = 'd'")
            .when_matched_update(updates=columns, predicate="s.op <> 'd'")
            .when_not_matched_insert(updates=columns, predicate="s.op <> 'd'")
            .execute()
        )


def run_hand_written(spark: Any, given: Input, work: Path) -> int:
    """The hand-written streaming job into ``work/table``; returns its micro-batches."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

    if given.source != "kafka":
        raw = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(given.data.pieces))
        text = F.col("value")
    else:
        raw = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", given.bootstrap)
            .option("subscribe", given.topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", given.kafka_batch_records)
            .option("kafka.isolation.level", "read_committed")
            .load()
        )
        text = F.col("value").cast("string")
    merge = LastChangeMerge(work / "table", given.data)
    query = (
        raw.select(F.from_json(text, given.data.lean).alias("e"))
        .writeStream.foreachBatch(merge)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return merge.batches


def jvm_pid(spark: Any) -> int | None:
    with contextlib.suppress(Exception):
        return int(spark._jvm.java.lang.ProcessHandle.current().pid())
    return None


def reset_peak(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/clear_refs", "w") as refs:
            refs.write("5")  # resets the process's peak resident set size (VmHWM)


def status(pid: int | None, field: str) -> int | None:
    """``field`` (VmRSS, VmHWM) of ``pid`` in bytes (None where /proc has none)."""
    if pid is None:
        return None
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as lines:
        for line in lines:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    return None


def memory(pid: int | None, start: int | None) -> Memory:
    peak = status(pid, "VmHWM")
    return Memory(peak, peak - start if peak is not None and start is not None else None)


def timed(spark: Any, job: str, given: Input, work: Path) -> Run:
    pids = (os.getpid(), jvm_pid(spark))
    for pid in pids:
        reset_peak(pid)
    starts = [status(pid, "VmRSS") for pid in pids]
    started = time.perf_counter()
    batches = (run_cdcflow if job == "cdcflow" else run_hand_written)(spark, given, work)
    seconds = time.perf_counter() - started
    return Run(seconds, batches, memory(pids[0], starts[0]), memory(pids[1], starts[1]))


def table_of(target: Path, label: str) -> pa.Table:
    if not DeltaTable.is_deltatable(str(target)):
        sys.exit(f"{label}: no Delta table at {target}")
    return DeltaTable(str(target)).to_pyarrow_table().sort_by("id")


def check(tables: dict[str, pa.Table], truth: dict[int, Row], label: str) -> None:
    """Each table is the folded history; the tables are equal, schemas included."""
    for job, table in tables.items():
        rows = table.to_pylist()
        got = {row["id"]: row for row in rows}
        if len(got) != len(rows) or got != truth:
            missing, extra = truth.keys() - got.keys(), got.keys() - truth.keys()
            wrong = sum(1 for key in truth.keys() & got.keys() if truth[key] != got[key])
            sys.exit(
                f"{label} {job}: the table is not the folded history ({len(missing)} ids missing, "
                f"{len(extra)} extra, {wrong} rows differ, {len(rows) - len(got)} duplicates)"
            )
    first, second = (tables[job] for job in JOBS)
    if not first.schema.remove_metadata().equals(second.schema.remove_metadata()):
        sys.exit(f"{label}: the tables' schemas differ:\n{first.schema}\n-- vs --\n{second.schema}")
    if not first.equals(second):
        sys.exit(f"{label}: the tables differ")


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f} MiB"


@contextlib.contextmanager
def broker(wanted: bool) -> Iterator[str | None]:
    if not wanted:
        yield None
        return
    with kafka_cluster() as bootstrap:
        yield bootstrap


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="rounds before the measured ones")
    parser.add_argument("--sources", default=",".join(SOURCES), help=f"one or more of {', '.join(SOURCES)}")
    parser.add_argument("--partitions", type=int, default=4, help="of the Kafka topic")
    parser.add_argument("--schema-bytes", type=int, default=200 * 2**20, help="of the schemas source's file")
    parser.add_argument("--schema-keys", type=int, default=3_000, help="ids of the schemas source")
    parser.add_argument("--file-batch-bytes", type=int, default=DEFAULT_MAX_BYTES_PER_TRIGGER)
    parser.add_argument("--kafka-batch-records", type=int, default=DEFAULT_MAX_OFFSETS_PER_TRIGGER)
    parser.add_argument("--json", type=Path, help="also write the measurements here (bench/all.py)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0:
        parser.error("--rounds: at least 1; --warmup: 0 or more")
    sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    if not sources or set(sources) - set(SOURCES):
        parser.error(f"--sources: one or more of {', '.join(SOURCES)}")
    work = Path(tempfile.mkdtemp(prefix="cdcflow-bench-ingest-"))
    topic = f"bench-ingest-{uuid.uuid4().hex[:8]}"
    try:
        with broker("kafka" in sources) as bootstrap:
            data = prepare(args, sources, work, bootstrap, topic)
            spark = session()
            try:
                runs = measure(spark, args, data, bootstrap, topic)
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(runs, data, args.warmup)
    if args.json is not None:
        comparisons = [
            results.Comparison(
                name=f"ingest, {LABELS[source]}",
                unit="changes/s",
                amount=data[source].changes,
                bytes=data[source].bytes,
                baseline="hand-written",
                seconds={job: [run.seconds for run in by_job[job]] for job in JOBS},
                warmup=args.warmup,
            )
            for source, by_job in runs.items()
        ]
        results.write(args.json, comparisons)
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"python driver ru_maxrss over the whole bench (history, fold, producer included): {mib(maxrss)}")
    return 0


LABELS = {
    "file": "file",
    "kafka": "Kafka, 4 partitions",
    "schemas": "file, Connect schema blocks",
}


def prepare(
    args: argparse.Namespace, sources: list[str], work: Path, bootstrap: str | None, topic: str
) -> dict[str, Data]:
    """Each source's history written (and produced), untimed."""
    data: dict[str, Data] = {}
    if {"file", "kafka"} & set(sources):
        history = work / "history.jsonl"
        stats = write_history(history, args.changes, args.keys)
        truth = fold(history)
        pieces = split(history, work / "pieces", args.file_batch_bytes)
        print(
            f"{args.changes:,} changes over {args.keys:,} keys ({stats.inserts:,} inserts, "
            f"{stats.updates:,} updates, {stats.deletes:,} deletes; {stats.bytes / args.changes:.0f} B "
            f"avg), {len(truth):,} rows at the end; file: {stats.bytes / 2**20:,.0f} MiB in "
            f"micro-batches of {args.file_batch_bytes / 2**20:g} MiB ({pieces} files for Spark's text "
            "source)",
            flush=True,
        )
        plain = Data(
            history, work / "pieces", args.changes, stats.bytes, truth, TABLE, COLUMNS, LEAN, "e", {}
        )
        data.update({source: plain for source in ("file", "kafka") if source in sources})
        if bootstrap is not None:
            started = time.perf_counter()
            produce_history(bootstrap, topic, args.changes, args.keys, args.partitions)
            print(
                f"kafka: topic {topic}, {args.partitions} partitions, produced in "
                f"{time.perf_counter() - started:.1f} s; micro-batches of {args.kafka_batch_records:,} "
                "records",
                flush=True,
            )
    if "schemas" in sources:
        history = work / "schemas.jsonl"
        changes, size, truth = schema_history.write(history, args.schema_bytes, args.schema_keys)
        pieces = split(history, work / "schema-pieces", args.file_batch_bytes)
        print(
            f"schemas: {changes:,} Kafka Connect messages of the recorded {schema_history.TABLE} table "
            f"(schema block included, {size / changes:,.0f} B avg) over {args.schema_keys:,} ids, "
            f"{size / 2**20:,.0f} MiB, {len(truth):,} rows at the end ({pieces} files for Spark's text "
            "source)",
            flush=True,
        )
        data["schemas"] = Data(
            history,
            work / "schema-pieces",
            changes,
            size,
            truth,
            SCHEMAS_TABLE,
            schema_history.LEAN,
            SCHEMAS_LEAN,
            "e.payload",
            {"debezium-json.schema-include": "true"},
        )
    return data


def measure(
    spark: Any, args: argparse.Namespace, data: dict[str, Data], bootstrap: str | None, topic: str
) -> dict[str, dict[str, list[Run]]]:
    runs: dict[str, dict[str, list[Run]]] = {source: {job: [] for job in JOBS} for source in data}
    print(
        f"{args.warmup} warm-up and {args.rounds} measured round(s), Spark local[2], cdcflow and the "
        "hand-written job interleaved",
        flush=True,
    )
    for round_ in range(args.warmup + args.rounds):
        for source, given_data in data.items():
            given = Input(
                source, given_data, bootstrap, topic, args.file_batch_bytes, args.kafka_batch_records
            )
            tables: dict[str, pa.Table] = {}
            for job in JOBS:
                folder = work_folder(given_data) / f"{source}-{job}-{round_}"
                run = timed(spark, job, given, folder)
                runs[source][job].append(run)
                print(
                    f"  {'warm-up' if round_ < args.warmup else 'round'} {round_ + 1} {source:<7} {job:<12}: "
                    f"{run.seconds:6.1f} s, "
                    f"{run.batches} batches, {given_data.changes / run.seconds:>9,.0f} changes/s, "
                    f"{given_data.bytes / run.seconds / 2**20:,.1f} MiB/s; "
                    f"peak RSS (+MiB risen) driver {run.driver}, JVM {run.jvm}",
                    flush=True,
                )
                tables[job] = table_of(folder / "table", f"round {round_ + 1} {source} {job}")
                shutil.rmtree(folder, ignore_errors=True)
            check(tables, given_data.truth, f"round {round_ + 1} {source}")
    return runs


def work_folder(data: Data) -> Path:
    return data.history.parent


def report(runs: dict[str, dict[str, list[Run]]], data: dict[str, Data], warmup: int) -> None:
    """Rates: medians over the measured rounds; memory: over every run, the warm-up's too."""
    for source, by_job in runs.items():
        if warmup and all(len(by_job[job]) > warmup for job in JOBS):
            first = {job: by_job[job][0].seconds for job in JOBS}
            print(
                f"{source} warm-up round 1: cdcflow {first['cdcflow']:.1f} s, hand-written "
                f"{first['hand-written']:.1f} s ({first['hand-written'] / first['cdcflow']:.2f}x)"
            )
    print(
        f"{'source':<8}{'cdcflow changes/s':>19}{'MiB/s':>8}{'hand-written':>14}{'MiB/s':>8}"
        f"{'cdcflow/hand':>14}"
        f"{'driver RSS rise':>23}{'JVM RSS rise':>23}"
    )
    for source, by_job in runs.items():
        seconds = {job: statistics.median(r.seconds for r in by_job[job][warmup:]) for job in JOBS}
        given = data[source]
        rises = {
            process: " / ".join(mib(largest_rise(by_job[job], process)) for job in JOBS)
            for process in ("driver", "jvm")
        }
        ours, theirs = seconds["cdcflow"], seconds["hand-written"]
        print(
            f"{source:<8}{given.changes / ours:>19,.0f}{given.bytes / ours / 2**20:>8.1f}"
            f"{given.changes / theirs:>14,.0f}{given.bytes / theirs / 2**20:>8.1f}"
            f"{seconds['hand-written'] / seconds['cdcflow']:>13.2f}x{rises['driver']:>23}{rises['jvm']:>23}"
        )
    print(
        "(changes/s: medians over the measured rounds; RSS rise, over every run: the most a run's peak rose "
        "above the process's size at its start, cdcflow / hand-written)"
    )


def largest_rise(runs: list[Run], process: str) -> int | None:
    rises = [r for r in (getattr(run, process).rise for run in runs) if r is not None]
    return max(rises) if rises else None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
