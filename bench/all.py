"""Every comparison of the performance issue in one go, printed as one table.

Runs, one after another (never two at once: each wants the machine's cores), each with its defaults
and ``--json``: bench/ingest.py (``cdcflow ingest`` against the hand-written ``from_json`` +
``foreachBatch`` + delta-rs job: 1M changes from a file, from a 4-partition Kafka topic, and 200 MiB of
real Kafka Connect messages with schema blocks), bench/kafka_spark.py twice (the ``cdc-debezium``
source and ``decode_kafka`` against Spark's Kafka source + ``from_json`` + changelog expansion, with
the default ``unavailable-values=fill`` and with ``report``), bench/ingest_database.py (a database of
8 tables in one job against a job per table, and one table of as many changes) and bench/auto_cdc.py
(Spark's Declarative Pipelines ``create_auto_cdc_flow`` into Delta Lake: where Spark refuses it, the
table says why). Each bench interleaves its contenders (A B A B), leaves its warm-up round out and
measures ≥ 3 rounds (5 by default: on a 2-core machine a median of 3 moved by ±15% between runs); the
table shows each contender's median rate, its ratio to the comparison's baseline (median time over
median time) and the ratio of every round.

    .venv/bin/python bench/all.py [--rounds 5] [--only ingest,kafka_spark,ingest_database,auto_cdc]
        [--markdown FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import results

HERE = Path(__file__).resolve().parent
BENCHES: dict[str, list[list[str]]] = {
    "ingest": [["ingest.py"]],
    "kafka_spark": [["kafka_spark.py"], ["kafka_spark.py", "--unavailable-values", "report"]],
    # 8 tables, not the bench's 20: a job per table is 8 Spark applications a round.
    "ingest_database": [["ingest_database.py", "--tables", "8"]],
    "auto_cdc": [["auto_cdc.py"]],
}


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown CPU",
    )
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {memory:.0f} GiB, {platform.system()} {platform.release()}"


def run(script: list[str], rounds: int, out: Path) -> list[results.Comparison]:
    command = [
        sys.executable,
        str(HERE / script[0]),
        *script[1:],
        "--rounds",
        str(rounds),
        "--json",
        str(out),
    ]
    print(f"$ {' '.join(command[1:])}", flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, check=False)  # noqa: S603 - this interpreter, the bench's scripts
    if done.returncode != 0:
        sys.exit(f"{script[0]} failed (exit {done.returncode})")
    print(f"  ({time.perf_counter() - started:.0f} s)", flush=True)
    return results.read(out)


def rows(comparisons: list[results.Comparison]) -> list[list[str]]:
    table = []
    for comparison in comparisons:
        for contender in comparison.seconds:
            if not comparison.measured(contender):
                table.append(
                    [comparison.name, contender, "-", "-", comparison.notes.get(contender, "not run")]
                )
                continue
            if not comparison.measured(comparison.baseline):
                shown = f"{comparison.rate(contender):,.0f} {comparison.unit}"
                table.append([comparison.name, contender, shown, "-", "no baseline to compare with"])
                continue
            rate = comparison.rate(contender)
            shown = f"{rate:,.0f} {comparison.unit}"
            if comparison.bytes:
                shown += f", {comparison.bytes / comparison.median(contender) / 2**20:,.1f} MiB/s"
            is_base = contender == comparison.baseline
            table.append(
                [
                    comparison.name,
                    contender + (" (baseline)" if is_base else ""),
                    shown,
                    "1" if is_base else f"{comparison.ratio(contender):.2f}x",
                    " ".join(f"{r:.2f}" for r in comparison.round_ratios(contender))
                    if not is_base
                    else " ".join(f"{s:.1f}s" for s in comparison.measured(contender)),
                ]
            )
    return table


HEADER = ["comparison", "contender", "median rate", "ratio", "per round (ratio, or the baseline's s)"]


def plain(table: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [HEADER, *table]) for i in range(len(HEADER))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in [HEADER, *table]
    )


def markdown(table: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * 3 + "---:|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds of every bench (≥ 3)")
    parser.add_argument("--only", default=",".join(BENCHES), help=f"some of {', '.join(BENCHES)}")
    parser.add_argument("--markdown", type=Path, help="also write the table as Markdown here")
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    if not only or set(only) - set(BENCHES):
        parser.error(f"--only: some of {', '.join(BENCHES)}")
    if args.rounds < 3:
        parser.error("--rounds: 3 or more (the figures are medians of interleaved rounds)")
    started = datetime.now(UTC)
    comparisons: list[results.Comparison] = []
    with tempfile.TemporaryDirectory(prefix="cdcflow-bench-all-") as work:
        for name in only:
            for index, script in enumerate(BENCHES[name]):
                comparisons += run(script, args.rounds, Path(work) / f"{name}-{index}.json")
    table = rows(comparisons)
    heading = (
        f"{started:%Y-%m-%d %H:%M} UTC, {machine()}; medians of {args.rounds} interleaved rounds after a "
        "warm-up round; ratio = how many times faster than the comparison's baseline"
    )
    print(f"\n{heading}\n{plain(table)}")
    if args.markdown is not None:
        args.markdown.write_text(f"{heading}\n\n{markdown(table)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
