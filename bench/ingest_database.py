"""A whole database in one ``ingest`` against the same tables one job each, and against one big table.

Contenders, each a ``python -m cdcflow ingest`` process of its own (its Spark application's start
counts: that is what a job per table costs), interleaved round by round after a warm-up round that is
left out:

- **database**: one job over a folder of ``--tables`` Debezium histories of ``--changes`` changes each
  (``--target .../{table}``: each routed to its own Delta table by ``source.table``);
- **job per table**: the same files, one single-table job after another (``--target .../<table>``);
- **one table**: one job over a history of ``--tables`` × ``--changes`` changes of one table.

Prints changes/s of each (the job's wall time, Spark's start included), its ratio to the one-table
job, and the driver's peak resident memory (the ``python`` process and its Spark JVM, VmHWM); with
``--small-tables N``, also one database job over N tables of ``--small-changes`` changes (the
per-table cost: a query per table). Every Delta table is checked against its history folded by id
(bench/cdc_history.py).

    .venv/bin/python bench/ingest_database.py [--tables 20] [--changes 50000] [--rounds 3]
        [--small-tables 500 --small-changes 200] [--work DIR] [--json FILE]

The default flags of ``ingest`` are used (delta-rs, 64 MiB micro-batches); the histories carry no
Kafka key and no schema block, so every job is given ``--key id`` and ``--schema``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import results as bench_results
from cdc_history import COLUMNS, events, fold
from deltalake import DeltaTable

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ("--key", "id", "--schema", COLUMNS)
"""The histories are plain envelopes (no Kafka key, no schema block): every job is given both."""


def write_tables(folder: Path, tables: int, changes: int, keys: int, prefix: str = "t") -> list[str]:
    """``tables`` histories in ``folder``, one file per table, each naming its table in ``source``."""
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"{prefix}{i:03d}" for i in range(tables)]
    for i, name in enumerate(names):
        path = folder / f"{name}.jsonl"
        if path.exists():
            continue
        with path.open("wb") as out:
            for event in events(changes, keys, seed=100 + i):
                event["source"]["table"] = name
                out.write(orjson.dumps(event) + b"\n")
    return names


@dataclass
class Result:
    seconds: list[float] = field(default_factory=list)
    python_peak: int = 0
    jvm_peak: int = 0


def peak_rss(pids: Sequence[int]) -> tuple[int, int]:
    """The python driver's and its JVM's VmHWM (the JVM: the java child of the python process)."""

    def hwm(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/status") as status:
                return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM"))
        except (OSError, StopIteration):
            return 0

    python = max((hwm(pid) for pid in pids), default=0)
    jvm = 0
    for pid in pids:
        children = Path(f"/proc/{pid}/task/{pid}/children")
        if children.exists():
            jvm = max([jvm, *(hwm(int(child)) for child in children.read_text().split())])
    return python, jvm


def run_ingest(args: list[str], result: Result) -> float:
    """One ``python -m cdcflow ingest`` with ``args``; its wall time, its peaks into ``result``."""
    began = time.monotonic()
    job = subprocess.Popen(  # noqa: S603 - this interpreter, cdcflow's command line
        [sys.executable, "-m", "cdcflow", "ingest", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    peaks = [0, 0]

    def watch() -> None:
        while job.poll() is None:
            python, jvm = peak_rss([job.pid])
            peaks[0], peaks[1] = max(peaks[0], python), max(peaks[1], jvm)
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    _, err = job.communicate()
    watcher.join()
    if job.returncode != 0:
        log = Path(tempfile.mkstemp(prefix="cdcflow-bench-database-", suffix=".log")[1])
        log.write_bytes(err)
        raise SystemExit(f"ingest {' '.join(args)} failed (its output: {log}):\n{err.decode()[-3000:]}")
    result.python_peak, result.jvm_peak = max(result.python_peak, peaks[0]), max(result.jvm_peak, peaks[1])
    return time.monotonic() - began


def check(target: Path, history: Path) -> None:
    got = {row["id"]: row for row in DeltaTable(str(target)).to_pyarrow_table().to_pylist()}
    if got != fold(history):
        raise SystemExit(f"{target} is NOT its folded history")


def database(folder: Path, out: Path, result: Result) -> float:
    shutil.rmtree(out, ignore_errors=True)
    seconds = run_ingest(
        ["--path", str(folder), *FLAGS, "--target", f"{out}/{{table}}", "--checkpoint", f"{out}/ck"],
        result,
    )
    for history in folder.iterdir():
        check(out / history.stem, history)
    return seconds


def job_per_table(folder: Path, out: Path, result: Result) -> float:
    shutil.rmtree(out, ignore_errors=True)
    total = 0.0
    for history in sorted(folder.iterdir()):
        target, checkpoint = out / history.stem, out / "ck" / history.stem
        total += run_ingest(
            ["--path", str(history), *FLAGS, "--target", str(target), "--checkpoint", str(checkpoint)],
            result,
        )
        check(target, history)
    return total


def one_table(history: Path, out: Path, result: Result) -> float:
    shutil.rmtree(out, ignore_errors=True)
    seconds = run_ingest(
        ["--path", str(history), *FLAGS, "--target", f"{out}/table", "--checkpoint", f"{out}/ck"],
        result,
    )
    check(out / "table", history)
    return seconds


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", type=int, default=20)
    parser.add_argument("--changes", type=int, default=50_000, help="changes per table")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (a warm-up round more)")
    parser.add_argument("--small-tables", type=int, default=0, help="also N tables of --small-changes")
    parser.add_argument("--small-changes", type=int, default=200)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "cdcflow-bench-database")
    parser.add_argument("--json", type=Path, help="also write the measurements here (bench/all.py)")
    args = parser.parse_args(argv)
    work = args.work
    keys = max(1, args.changes // 10)
    folder = work / f"tables-{args.tables}x{args.changes}"
    write_tables(folder, args.tables, args.changes, keys)
    big = work / f"one-table-{args.tables * args.changes}.jsonl"
    if not big.exists():
        with big.open("wb") as out:
            for event in events(args.tables * args.changes, keys * args.tables, seed=99):
                out.write(orjson.dumps(event) + b"\n")
    total = args.tables * args.changes
    contenders = {
        "database (one job)": lambda r: database(folder, work / "out-database", r),
        f"job per table ({args.tables} jobs)": lambda r: job_per_table(folder, work / "out-jobs", r),
        "one table": lambda r: one_table(big, work / "out-one", r),
    }
    results = {name: Result() for name in contenders}
    warmup: dict[str, float] = {}
    for round_ in range(args.rounds + 1):
        for name, run in contenders.items():
            seconds = run(results[name])
            if round_ > 0:
                results[name].seconds.append(seconds)
            else:
                warmup[name] = seconds
            print(f"round {round_}{' (warm-up)' if round_ == 0 else ''}: {name}: {seconds:.1f} s", flush=True)
    base = total / statistics.median(results["one table"].seconds)
    print(
        f"\n{args.tables} tables x {args.changes:,} changes ({total:,}), default flags, {args.rounds} rounds"
    )
    print(f"{'contender':<28} {'changes/s':>10} {'ratio':>6} {'py MiB':>7} {'JVM MiB':>8}  rounds (s)")
    for name, result in results.items():
        rate = total / statistics.median(result.seconds)
        rounds = ", ".join(f"{s:.1f}" for s in result.seconds)
        print(
            f"{name:<28} {rate:>10,.0f} {rate / base:>6.2f} {result.python_peak / 2**20:>7,.0f} "
            f"{result.jvm_peak / 2**20:>8,.0f}  {rounds}"
        )
    if args.json is not None:
        bench_results.write(
            args.json,
            [
                bench_results.Comparison(
                    name=f"ingest, a database of {args.tables} tables x {args.changes:,} changes (file, "
                    "Spark's start included)",
                    unit="changes/s",
                    amount=total,
                    baseline=f"job per table ({args.tables} jobs)",
                    seconds={name: [warmup[name], *result.seconds] for name, result in results.items()},
                    warmup=1,
                )
            ],
        )
    if args.small_tables:
        small = work / f"tables-{args.small_tables}x{args.small_changes}"
        write_tables(small, args.small_tables, args.small_changes, max(1, args.small_changes // 4), "s")
        result = Result()
        seconds = database(small, work / "out-small", result)
        changes = args.small_tables * args.small_changes
        per_table = seconds / args.small_tables
        print(
            f"\n{args.small_tables} tables x {args.small_changes} changes ({changes:,}) in one job: "
            f"{seconds:.1f} s, {changes / seconds:,.0f} changes/s, {per_table:.2f} s per table; driver peak: "
            f"python {result.python_peak / 2**20:,.0f} MiB, JVM {result.jvm_peak / 2**20:,.0f} MiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
