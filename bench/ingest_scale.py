"""The main job at scale: ``ingest`` of a 10M-change, 1M-key Debezium history from a file into Delta.

Prints the cost of each million changes as the table grows (changes/s of that million, seconds per
million) and the driver's peak memory: the Python driver process and its Spark JVM (VmHWM, the peak
resident set each kernel records), both bounded by the micro-batch size, not by the history's. The
table is checked against the history folded by id (bench/cdc_history.py), read with ``deltalake``.

    .venv/bin/python bench/ingest_scale.py [--changes 10000000] [--keys 1000000] [--work DIR]

The history file is kept in ``--work`` (about 420 bytes a change) and reused by the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cdc_history import COLUMNS, fold, write_history
from deltalake import DeltaTable

CHILD = r"""
import json, os, sys, time
from cdcflow.connectors.spark.jobs import local_session
from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest

source, work = sys.argv[1], sys.argv[2]
spark = local_session("bench-ingest-scale")
marks = []

def seen(applied):
    marks.append((time.monotonic() - started, applied.changes, applied.seconds))

config = IngestConfig(format="debezium-json", key=("id",), target=os.path.join(work, "table"),
                      checkpoint=os.path.join(work, "checkpoint"), path=source, schema=sys.argv[3])
started = time.monotonic()
summary = ingest(config, spark, out=open(os.devnull, "w"), on_batch=seen)

def peak(pid):
    with open(f"/proc/{pid}/status") as status:
        return next(int(l.split()[1]) for l in status if l.startswith("VmHWM")) * 1024

process = getattr(spark.sparkContext._gateway, "proc", None)
jvm = process.pid if process is not None else None
print(json.dumps({"marks": marks, "seconds": summary.seconds, "rows": summary.table_rows,
                  "python_peak": peak(os.getpid()), "jvm_peak": peak(jvm) if jvm else None}))
"""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--changes", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "cdcflow-bench-scale")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    source = args.work / f"history-{args.changes}-{args.keys}.jsonl"
    if not source.exists():
        began = time.monotonic()
        stats = write_history(source, args.changes, args.keys)
        print(f"history: {stats.bytes / 1e9:.2f} GB written in {time.monotonic() - began:.0f} s", flush=True)
    run = args.work / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    done = subprocess.run(  # noqa: S603 - this interpreter, this file's script
        [sys.executable, "-c", CHILD, str(source), str(run), COLUMNS],
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    report = json.loads(done.stdout.decode().strip().splitlines()[-1])
    print(
        f"{args.changes:,} changes over {args.keys:,} keys in {report['seconds']:.0f} s "
        f"({args.changes / report['seconds']:,.0f} changes/s, Spark session start excluded)"
    )
    print("million  changes/s  s/million  apply s/million")
    total, apply_total, previous, previous_apply, million = 0, 0.0, 0.0, 0.0, 1
    for at, changes, apply_seconds in report["marks"]:
        total, apply_total = total + changes, apply_total + apply_seconds
        if total >= million * 1_000_000 or total == args.changes:
            span, millions = at - previous, (total - (million - 1) * 1_000_000) / 1_000_000
            print(
                f"{million:>7}  {millions * 1_000_000 / span:>9,.0f}  {span / millions:>9.1f}"
                f"  {(apply_total - previous_apply) / millions:>15.1f}"
            )
            previous, previous_apply, million = at, apply_total, million + 1
    print(
        f"driver peak RSS: python {report['python_peak'] / 2**20:,.0f} MiB, "
        f"JVM {(report['jvm_peak'] or 0) / 2**20:,.0f} MiB"
    )
    got = {row["id"]: row for row in DeltaTable(str(run / "table")).to_pyarrow_table().to_pylist()}
    if got != fold(source):
        print("the table is NOT the folded history", file=sys.stderr)
        return 1
    print(f"table equals the folded history ({len(got):,} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
