"""Applying a changelog to Delta: changes per second and per-batch latency, against plain delta-rs.

A seeded Debezium history (bench/cdc_history.py: inserts, updates, deletes, re-inserts over
``--keys`` ids) as changelog batches of ``--batch`` changes (+I; -U/+U per update; -D), applied by:

- ``stateless``: ``DeltaChangeApplier`` with ``upsert_key=key`` (last change per key wins, no state);
- ``sequence``: plus ``sequence_by`` the Debezium position (per-key state, late changes dropped);
- ``force``: ``materialize=force`` with the same sequence (the upsert materializer, a Python loop;
  ``--force-changes`` of the history, fewer when time is short: it is much slower);
- ``ingest``: end to end through Spark, ``ingest()`` of the history written as a replay file
  (``--ingest-changes``; ``maxBytesPerTrigger`` sized to ``--batch`` changes; Spark startup excluded);

and the baselines, measured in the same run over the same batches:

- ``append``: ``write_deltalake(mode="append")`` of each batch as it is (no key, nothing read back);
- ``merge``: the floor of any upsert: the last change per key by Arrow group-by, then one plain
  delta-rs merge (upsert / delete), no checks and no application transaction;
- ``group-by``: the Arrow last-per-key alone (no Delta).

Each case's table is checked against the history folded by id. A "change" is one database change
(one envelope); an update is two changelog rows. Ratios are against ``append`` and ``merge``.

    .venv/bin/python bench/delta_apply.py [--changes 1000000] [--keys 100000] [--batch 25000]
        [--force-changes N] [--ingest-changes 1000000] [--only stateless,sequence,force,ingest]

On 2 shared cores the default run takes ~2 minutes (force ~40 s, ingest ~40 s plus Spark's start).
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from cdc_history import Row, events, fold, write_history
from deltalake import DeltaTable, write_deltalake

from cdcflow.connectors.lakehouse.delta.apply import DeltaChangeApplier
from cdcflow.connectors.lakehouse.delta.options import ApplyOptions, Materialize
from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int32(), nullable=False),
        ("name", pa.string()),
        ("qty", pa.int64()),
        ("price", pa.float64()),
        ("rev", pa.int64()),
        ("source_sequence", pa.list_(pa.int64())),
        pa.field("_row_kind", pa.string(), nullable=False),
    ]
)
DATA = ["id", "name", "qty", "price", "rev"]
KEY = ("id",)
SEQUENCE = "source_sequence"


@dataclass
class Result:
    case: str
    changes: int
    rows: int
    batches: int
    seconds: float
    latencies: list[float]
    note: str = ""

    @property
    def rate(self) -> float:
        return self.changes / self.seconds


def changelog(chunk: list[Row]) -> pa.Table:
    """One batch of envelopes as the changelog Spark hands the sink (with the Debezium position)."""
    columns: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}

    def add(row: Row, kind: str, sequence: list[int]) -> None:
        for name in DATA:
            columns[name].append(row[name])
        columns[SEQUENCE].append(sequence)
        columns["_row_kind"].append(kind)

    for event in chunk:
        sequence = [int(part) for part in orjson.loads(event["source"]["sequence"])]
        op = event["op"]
        if op == "c":
            add(event["after"], "+I", sequence)
        elif op == "u":
            add(event["before"], "-U", sequence)
            add(event["after"], "+U", sequence)
        else:
            add(event["before"], "-D", sequence)
    return pa.table(columns, schema=SCHEMA)


def batches(changes: int, keys: int, size: int) -> list[pa.Table]:
    stream = events(changes, keys)
    return [changelog(chunk) for chunk in iter(lambda: list(itertools.islice(stream, size)), [])]


def timed(case: str, tables: list[pa.Table], step: Callable[[pa.Table, int], object], changes: int) -> Result:
    latencies = []
    for batch_id, table in enumerate(tables):
        started = time.perf_counter()
        step(table, batch_id)
        latencies.append(time.perf_counter() - started)
    rows = sum(t.num_rows for t in tables)
    return Result(case, changes, rows, len(tables), sum(latencies), latencies)


def run_applier(case: str, tables: list[pa.Table], options: ApplyOptions, work: Path, changes: int) -> Result:
    target = work / case
    state = str(work / f"{case}-state") if options.stateful else None
    applier = DeltaChangeApplier(str(target), options, app_id=f"bench-{case}", state_path=state)
    return timed(case, tables, applier.apply, changes)


def last_per_key(table: pa.Table) -> pa.Table:
    """The last non -U row of each id, with ``op`` U or D (what an upsert must write)."""
    kinds = table.column("_row_kind")
    rows = table.filter(pc.not_equal(kinds, "-U"))
    rank = pa.array(np.arange(rows.num_rows, dtype=np.int64))
    picked = rows.select(["id"]).append_column("rank", rank).group_by("id").aggregate([("rank", "max")])
    winners = rows.take(pa.array(np.sort(np.asarray(picked.column("rank_max")))))
    op = pc.if_else(pc.equal(winners.column("_row_kind"), "-D"), "D", "U")
    return winners.select(DATA).append_column("op", op)


def raw_merge(target: Path) -> Callable[[pa.Table, int], None]:
    def step(table: pa.Table, batch_id: int) -> None:
        winners = last_per_key(table)
        if not DeltaTable.is_deltatable(str(target)):
            write_deltalake(str(target), winners.filter(pc.equal(winners.column("op"), "U")).select(DATA))
            return
        assignments = {f'"{c}"': f's."{c}"' for c in DATA}
        (
            DeltaTable(str(target))
            .merge(winners, predicate='t."id" = s."id"', source_alias="s", target_alias="t")
            .when_matched_delete(predicate="s.op = 'D'")
            .when_matched_update(updates=assignments, predicate="s.op = 'U'")
            .when_not_matched_insert(updates=assignments, predicate="s.op = 'U'")
            .execute()
        )

    return step


def check(target: Path, truth: dict[int, Row], case: str) -> None:
    rows = DeltaTable(str(target)).to_pyarrow_table(columns=DATA).to_pylist()
    got = {row["id"]: row for row in rows}
    if len(got) != len(rows) or got != truth:
        sys.exit(
            f"{case}: the table is not the history folded by id ({len(rows)} rows, {len(truth)} expected)"
        )


def run_ingest(path: Path, changes: int, keys: int, batch: int, work: Path) -> Result:
    from cdcflow.connectors.spark.jobs import local_session

    stats = write_history(path, changes, keys)
    spark = local_session("bench-delta-apply")
    try:
        config = IngestConfig(
            format="debezium-json",
            key=KEY,
            target=str(work / "ingest"),
            checkpoint=str(work / "ingest-checkpoint"),
            path=str(path),
            schema="id INT NOT NULL, name STRING, qty BIGINT, price DOUBLE, rev BIGINT",
            options={"maxBytesPerTrigger": str(stats.bytes * batch // changes + 1)},
        )
        latencies: list[float] = []
        with open(os.devnull, "w") as quiet:
            summary = ingest(config, spark=spark, out=quiet, on_batch=lambda b: latencies.append(b.seconds))
    finally:
        spark.stop()
    note = (
        f"latencies are the sink's apply; {summary.seconds / summary.batches * 1000:.0f} ms per batch on "
        f"average end to end; {summary.progress.totals.seconds:.1f} s of {summary.seconds:.1f} s applying"
    )
    return Result(
        "ingest (Spark)",
        changes,
        summary.progress.totals.changes,
        summary.batches,
        summary.seconds,
        latencies,
        note,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=25_000)
    parser.add_argument("--force-changes", type=int, help="changes for force (default: --changes)")
    parser.add_argument("--ingest-changes", type=int, default=1_000_000)
    parser.add_argument("--only", default="stateless,sequence,force,ingest")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    work = Path(tempfile.mkdtemp(prefix="cdcflow-delta-apply-"))
    try:
        return _run(args, only, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(args: argparse.Namespace, only: set[str], work: Path) -> int:
    started = time.perf_counter()
    tables = batches(args.changes, args.keys, args.batch)
    truth = fold(events(args.changes, args.keys))
    rows = sum(t.num_rows for t in tables)
    print(
        f"{args.changes:,} changes ({rows:,} changelog rows) over {args.keys:,} keys in {len(tables)} "
        f"batches of {args.batch:,}; {len(truth):,} rows at the end; "
        f"generated in {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    results: list[Result] = []

    def record(result: Result, target: Path | None = None, expected: dict[int, Row] | None = None) -> None:
        if target is not None:
            check(target, expected if expected is not None else truth, result.case)
        results.append(result)
        print(f"  {result.case}: {result.seconds:.1f} s", flush=True)

    record(
        timed(
            "append",
            tables,
            lambda t, _: write_deltalake(str(work / "append"), t, mode="append"),
            args.changes,
        )
    )
    record(timed("merge", tables, raw_merge(work / "merge"), args.changes), work / "merge")
    record(timed("group-by", tables, lambda t, _: last_per_key(t), args.changes))
    stateless = ApplyOptions(KEY, upsert_key=KEY, exclude=(SEQUENCE,))
    if "stateless" in only:
        record(run_applier("stateless", tables, stateless, work, args.changes), work / "stateless")
    sequenced = ApplyOptions(KEY, sequence_by=SEQUENCE, upsert_key=KEY, exclude=(SEQUENCE,))
    if "sequence" in only:
        record(run_applier("sequence", tables, sequenced, work, args.changes), work / "sequence")
    if "force" in only:
        count = min(args.force_changes or args.changes, args.changes)
        subset = batches(count, args.keys, args.batch)
        forced = ApplyOptions(
            KEY, sequence_by=SEQUENCE, materialize=Materialize.FORCE, upsert_key=KEY, exclude=(SEQUENCE,)
        )
        record(
            run_applier("force", subset, forced, work, count), work / "force", fold(events(count, args.keys))
        )
    if "ingest" in only:
        count = args.ingest_changes
        result = run_ingest(work / "history.jsonl", count, args.keys, args.batch, work)
        record(result, work / "ingest", truth if count == args.changes else fold(events(count, args.keys)))
    print()
    print(table(results))
    return 0


def table(results: list[Result]) -> str:
    base = {r.case: r.rate for r in results}
    lines = [
        "| case | changes | changelog rows | batches | changes/s | p50 ms | p95 ms | max ms "
        "| vs append | vs merge |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        p50, p95 = np.percentile(r.latencies, [50, 95]) * 1000
        lines.append(
            f"| {r.case} | {r.changes:,} | {r.rows:,} | {r.batches} | {r.rate:,.0f} | {p50:.0f} | "
            f"{p95:.0f} | {max(r.latencies) * 1000:.0f} | {r.rate / base['append']:.2f}x "
            f"| {r.rate / base['merge']:.2f}x |"
        )
    notes = [f"- {r.case}: {r.note}" for r in results if r.note]
    return "\n".join(lines + ([""] + notes if notes else []))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
