"""Spark Declarative Pipelines' ``create_auto_cdc_flow`` into Delta Lake, against ``cdcflow ingest``.

A pipeline project (``spark-pipelines init`` layout) whose one flow applies a Debezium history file
(bench/cdc_history.py) to a Delta streaming table with AUTO CDC, SCD type 1: ``from_json`` with the
lean schema of bench/ingest.py, ``keys=["id"]``, ``sequence_by`` the LSN, ``apply_as_deletes`` on
``op = 'd'``. It runs with ``spark-pipelines run`` on stock pyspark and delta-spark's jars
(``CDCFLOW_DELTA_JARS``, else the Java cache scripts/java_deps.sh fills), Delta's extension and catalog
given to the pipeline's Spark Connect server. Where the run is refused, this prints the refusal and
writes it as the contender's note (``--json``) for bench/all.py; where it runs, the two are timed in
interleaved rounds (Spark's start included for both, a process each; AUTO CDC first) and both tables
checked against the folded history.

    .venv/bin/python bench/auto_cdc.py [--changes 200000] [--keys 20000] [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import results
from cdc_history import COLUMNS, fold, write_history
from deltalake import DeltaTable
from ingest import LEAN

from cdcflow.connectors.lakehouse.spark_backend import CATALOG, EXTENSION, delta_jars

HERE = Path(__file__).resolve().parent
FLOW = """from pyspark import pipelines as dp
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

LEAN = {lean!r}
spark = SparkSession.active()


@dp.temporary_view
def changes():
    e = F.from_json("value", LEAN).alias("e")
    return spark.readStream.format("text").load({history!r}).select(e).select(
        F.coalesce("e.after.id", "e.before.id").alias("id"),
        *(F.col(f"e.after.{{name}}").alias(name) for name in ("name", "qty", "price", "rev")),
        F.col("e.op").alias("op"),
        F.col("e.source.lsn").alias("lsn"),
    )


dp.create_streaming_table("items", format="delta")
dp.create_auto_cdc_flow(
    target="items",
    source="changes",
    keys=["id"],
    sequence_by=F.col("lsn"),
    apply_as_deletes=F.expr("op = 'd'"),
    except_column_list=["op", "lsn"],
    stored_as_scd_type=1,
)
"""


def jars() -> list[str]:
    found = delta_jars()
    cache = Path(os.environ.get("CDCFLOW_JAVA_CACHE") or Path.home() / ".cache" / "cdcflow-java") / "delta"
    if not found and cache.is_dir():
        found = delta_jars(str(cache))
    if not found:
        sys.exit("no delta-spark jars: set CDCFLOW_DELTA_JARS or run scripts/java_deps.sh delta")
    return found


def auto_cdc(history: Path, work: Path) -> tuple[float, str | None]:
    """One pipeline run in ``work/pipeline``: its seconds and, when refused, the error it printed."""
    project = work / "pipeline"
    (project / "transformations").mkdir(parents=True)
    (project / "transformations" / "cdc.py").write_text(FLOW.format(lean=LEAN, history=str(history.parent)))
    (project / "spark-pipeline.yml").write_text(
        f"name: bench\nstorage: file://{project / 'storage'}\nlibraries:\n  - glob:\n"
        "      include: transformations/**\n"
    )
    spark_home = Path(__import__("pyspark").__file__).parent
    env = {**os.environ, "SPARK_HOME": str(spark_home), "PYSPARK_PYTHON": sys.executable}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    command = [
        str(Path(sys.executable).parent / "spark-pipelines"),
        "run",
        "--jars",
        ",".join(jars()),
        "--conf",
        f"spark.sql.extensions={EXTENSION}",
        "--conf",
        f"spark.sql.catalog.spark_catalog={CATALOG}",
    ]  # the table goes to the project's spark-warehouse/ (a warehouse.dir given here loses Delta's catalog)
    started = time.perf_counter()
    done = subprocess.run(  # noqa: S603 - this interpreter's spark-pipelines
        command, cwd=project, env=env, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        found = re.search(r"Error: (\[[A-Z_]+\][^\n]*)", done.stdout + done.stderr)
        if found is None:  # not Spark refusing the flow: this bench is broken
            sys.exit(
                f"spark-pipelines run failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}"
            )
        return seconds, found.group(1)
    return seconds, None


def cdcflow(history: Path, work: Path) -> float:
    command = [
        sys.executable, "-m", "cdcflow", "ingest", "--format", "debezium-json", "--path", str(history),
        "--key", "id", "--schema", COLUMNS, "--target", str(work / "table"),
        "--checkpoint", str(work / "checkpoint"),
    ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)  # noqa: S603 - this interpreter, cdcflow's CLI
    return time.perf_counter() - started


def check(target: Path, truth: dict[int, dict[str, object]], label: str) -> None:
    rows = DeltaTable(str(target)).to_pyarrow_table().to_pylist()
    got = {row["id"]: {name: row[name] for name in ("id", "name", "qty", "price", "rev")} for row in rows}
    if got != truth or len(got) != len(rows):
        sys.exit(f"{label}: the table is not the folded history")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the measurements here (bench/all.py)")
    args = parser.parse_args(argv)
    seconds: dict[str, list[float]] = {"cdcflow ingest": [], "AUTO CDC (Declarative Pipelines)": []}
    notes: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="cdcflow-bench-autocdc-") as folder:
        work = Path(folder)
        (work / "in").mkdir()
        history = work / "in" / "history.jsonl"
        write_history(history, args.changes, args.keys)
        truth = fold(history)
        for round_ in range(1 + args.rounds):
            took, refused = auto_cdc(history, work / f"auto-cdc-{round_}")
            if refused:
                print(f"AUTO CDC refused: {refused}", flush=True)
                notes["AUTO CDC (Declarative Pipelines)"] = f"does not run: {refused.split(' SQLSTATE')[0]}"
                notes["cdcflow ingest"] = "not timed: no AUTO CDC run to compare with"
                break
            check(work / f"auto-cdc-{round_}" / "pipeline" / "spark-warehouse" / "items", truth, "AUTO CDC")
            run = work / f"cdcflow-{round_}"
            ours = cdcflow(history, run)
            check(run / "table", truth, "cdcflow")
            seconds["AUTO CDC (Declarative Pipelines)"].append(took)
            seconds["cdcflow ingest"].append(ours)
            label = f"round {round_}{' (warm-up)' if round_ == 0 else ''}"
            print(f"{label}: AUTO CDC {took:.1f} s, cdcflow {ours:.1f} s", flush=True)
    if args.json is not None:
        results.write(
            args.json,
            [
                results.Comparison(
                    name=f"ingest vs AUTO CDC, file ({args.changes:,} changes, Spark's start included)",
                    unit="changes/s",
                    amount=args.changes,
                    baseline="AUTO CDC (Declarative Pipelines)",
                    seconds=seconds,
                    warmup=1,
                    notes=notes,
                )
            ],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
