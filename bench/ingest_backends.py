"""Ingest into Delta with the delta-rs and the Spark back ends on the same input: changes per second.

A seeded Debezium history (bench/cdc_history.py: inserts, updates, deletes, re-inserts over
``--keys`` ids) written as a replay file is ingested end to end by ``ingest()`` (the ``cdc-debezium``
source, ``source.sequence`` ordering with its key state, one merge per micro-batch of about
``--batch`` changes) into a new table, once per back end per round, the back ends interleaved
(delta-rs, spark, delta-rs, ...) in ONE local Spark session that has Delta Lake's jars:

- ``delta-rs``: the batch is planned on the driver and merged by delta-rs in the driver (the default);
- ``spark``: the same planning, the merge (and the key state's) run by Delta Lake on Spark's executors.

Each table is checked against the history folded by id, read with ``deltalake`` and with
``spark.read.format("delta")``. A "change" is one database change (one envelope; an update is two
changelog rows). The session's start is excluded; each run includes the query's start.

    .venv/bin/python bench/ingest_backends.py [--changes 200000] [--keys 20000] [--batch 25000]
        [--rounds 2] [--delta-jars DIR]   (default: $CDCFLOW_DELTA_JARS, else scripts/java_deps.sh's cache)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cdc_history import COLUMNS, Row, fold, write_history
from deltalake import DeltaTable

from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

BACKENDS = ("delta-rs", "spark")


def jars_folder(given: str | None) -> str:
    if given:
        return given
    if os.environ.get("CDCFLOW_DELTA_JARS"):
        return os.environ["CDCFLOW_DELTA_JARS"]
    cache = Path(os.environ.get("CDCFLOW_JAVA_CACHE") or Path.home() / ".cache" / "cdcflow-java")
    return str(cache / "delta")


def session(jars: str) -> SparkSession:
    from cdcflow.connectors.lakehouse.spark_backend import delta_jars, session_config
    from cdcflow.connectors.spark.jobs import local_session

    return local_session("bench-ingest-backends", session_config(delta_jars(jars)))


def check(spark: SparkSession, target: Path, truth: dict[int, Row], label: str) -> None:
    readers = {
        "deltalake": DeltaTable(str(target)).to_pyarrow_table().to_pylist(),
        "spark.read.format('delta')": spark.read.format("delta").load(str(target)).toArrow().to_pylist(),
    }
    for reader, rows in readers.items():
        got = {row["id"]: row for row in rows}
        if len(got) != len(rows) or got != truth:
            raise SystemExit(f"{label}: the table as {reader} reads it is not the folded history")


def run(
    spark: SparkSession, backend: str, source: Path, work: Path, batch_bytes: int
) -> tuple[float, int, int, float]:
    """Seconds, changelog rows, batches and the seconds spent applying, of one ingestion into a new table."""
    config = IngestConfig(
        format="debezium-json",
        key=("id",),
        target=str(work / "table"),
        checkpoint=str(work / "checkpoint"),
        path=str(source),
        schema=COLUMNS,
        options={"maxBytesPerTrigger": str(batch_bytes)},
        backend=backend,  # type: ignore[arg-type]
    )
    started = time.perf_counter()
    with open(os.devnull, "w") as quiet:
        summary = ingest(config, spark=spark, out=quiet)
    seconds = time.perf_counter() - started
    return seconds, summary.progress.totals.changes, summary.batches, summary.progress.totals.seconds


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=25_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--delta-jars", help="delta-spark's jars (a folder or files, comma separated)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="cdcflow-ingest-backends-"))
    spark = session(jars_folder(args.delta_jars))
    try:
        source = work / "history.jsonl"
        stats = write_history(source, args.changes, args.keys)
        truth = fold(source)
        batch_bytes = stats.bytes * args.batch // args.changes + 1
        print(
            f"{args.changes:,} changes over {args.keys:,} keys, micro-batches of ~{args.batch:,} changes; "
            f"{len(truth):,} rows at the end; {args.rounds} round(s), back ends interleaved",
            flush=True,
        )
        rates: dict[str, list[float]] = {name: [] for name in BACKENDS}
        for round_ in range(args.rounds):
            for backend in BACKENDS:
                folder = work / f"{backend}-{round_}"
                seconds, rows, batches, applying = run(spark, backend, source, folder, batch_bytes)
                check(spark, folder / "table", truth, f"{backend} round {round_ + 1}")
                rates[backend].append(args.changes / seconds)
                print(
                    f"  round {round_ + 1} {backend:>8}: {args.changes:,} changes ({rows:,} changelog rows) "
                    f"in {batches} batches, {seconds:.1f} s ({args.changes / seconds:,.0f} changes/s; "
                    f"{applying:.1f} s applying)",
                    flush=True,
                )
                shutil.rmtree(folder, ignore_errors=True)
        medians = {name: statistics.median(values) for name, values in rates.items()}
        for name, rate in medians.items():
            print(f"{name:>8}: {rate:,.0f} changes/s (median of {len(rates[name])})")
        print(f"spark / delta-rs: {medians['spark'] / medians['delta-rs']:.2f}x")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
