"""Reading Debezium JSON with Spark: ``spark.read.format("cdc-debezium")`` against Spark's own JSON path.

Writes ``--messages`` Debezium update envelopes of a products table (id INT NOT NULL, name, description,
weight DOUBLE, plus a PostgreSQL source block; ~420 bytes each) to a temporary file, then times, on
``local[2]`` with a ``noop`` sink:

- ``spark``: ``spark.read.text`` + ``from_json`` with the envelope schema + the changelog expansion
  (-U before, +U after for each update) written the way a Spark user would, with ``explode``;
- ``cdc``: ``spark.read.format("cdc-debezium").option("columns", ...)`` (the columnar path);
- ``lines``: the columnar decoder behind a bare reader of raw file chunks
  (:meth:`ColumnarDecoder.decode_lines`), for reference: what the decoder leaves room for;
- ``flink``: Flink 2.3's ``debezium-json`` over the same file into a ``blackhole`` sink, parallelism 2,
  when a PyFlink venv is there (``--flink-python``, default /tmp/flinkvenv/bin/python); else skipped.

and, on one core without Spark (``decode``): the columnar decoder, orjson + ``RecordBatch.from_pylist``,
and the per-record decoder, over the same messages. Rates are changelog rows per second; the ratios
against Spark's own path are what to track, since these machines are shared.

    .venv/bin/python bench/spark_read.py [--messages 1000000] [--only decode,spark,cdc,lines,flink]
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from products_events import COLUMNS, changelog_rows, envelope

SOURCE_FIELDS = {
    "version": "string",
    "connector": "string",
    "name": "string",
    "ts_ms": "long",
    "db": "string",
}
SOURCE_FIELDS |= {"schema": "string", "table": "string", "txId": "long", "lsn": "long"}
WARMUP_MESSAGES = 20_000


def write_envelopes(path: Path, count: int, seed: int = 7) -> int:
    """Writes ``count`` update envelopes, one per line; returns the file's size."""
    rng = random.Random(seed)
    with path.open("wb") as out:
        for start in range(0, count, 10_000):
            out.write(b"".join(envelope(i, rng) + b"\n" for i in range(start, min(count, start + 10_000))))
    return path.stat().st_size


def report(label: str, seconds: float, rows: int) -> None:
    print(f"  {label:16} {seconds:6.2f} s, {rows / seconds / 1e3:8.0f}k changelog rows/s")


def timed(run: Callable[[], Any]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def cpu_timed(run: Callable[[], Any]) -> float:
    """CPU seconds: steadier than wall time on a machine other processes share."""
    started = time.process_time()
    run()
    return time.process_time() - started


# ---------------------------------------------------------------------------------------------- one core


def bench_decode(path: Path, count: int) -> dict[str, float]:
    """Changelog rows per CPU second, in blocks of 8192 messages: the columnar decoder (message values,
    and a file's raw lines), orjson + ``RecordBatch.from_pylist``, the per-record decoder."""
    import pyarrow as pa

    from cdcflow.connectors.spark.arrow_types import arrow_schema, struct_type
    from cdcflow.formats import Message, parse_ddl, resolve_format
    from cdcflow.formats.debezium.arrow import ColumnarDecoder

    schema = parse_ddl(COLUMNS)
    decoder = resolve_format("debezium-json").create_decoder({}, schema)
    physical = arrow_schema(struct_type(schema))
    columnar = ColumnarDecoder.for_decoder(decoder, physical)
    assert columnar is not None
    with path.open("rb") as stream:
        values = [line.rstrip(b"\n") for _, line in zip(range(count), stream, strict=False)]
    blocks = [values[i : i + 8192] for i in range(0, len(values), 8192)]
    chunks = [b"\n".join(block) + b"\n" for block in blocks]
    rows = 2 * len(values)
    target = pa.schema([*physical, pa.field("_row_kind", pa.string(), nullable=False)])
    names = physical.names

    def columnar_run() -> None:
        for block in blocks:
            assert columnar.decode(block) is not None

    def columnar_lines_run() -> None:
        for chunk in chunks:
            assert columnar.decode_lines(chunk) is not None

    def orjson_run() -> None:
        for block in blocks:
            out = []
            for value in block:
                event = orjson.loads(value)
                op = event["op"]
                if op == "u":
                    out.append({**event["before"], "_row_kind": "-U"})
                    out.append({**event["after"], "_row_kind": "+U"})
                elif op in ("c", "r"):
                    out.append({**event["after"], "_row_kind": "+I"})
                elif op == "d":
                    out.append({**event["before"], "_row_kind": "-D"})
            pa.RecordBatch.from_pylist(out, schema=target)

    def record_run() -> None:
        for block in blocks:
            decoded = decoder.decode_all(Message(value) for value in block)
            columns = [
                pa.array([c.row[n] for c in decoded.changes], f.type)
                for n, f in zip(names, physical, strict=True)
            ]
            kinds = pa.array([c.kind.value for c in decoded.changes])
            pa.RecordBatch.from_arrays([*columns, kinds], schema=target)

    rates = {}
    for label, run in (
        ("columnar", columnar_run),
        ("columnar, file lines", columnar_lines_run),
        ("orjson+from_pylist", orjson_run),
        ("per-record", record_run),
    ):
        run_seconds = min(cpu_timed(run) for _ in range(2))
        rates[label] = rows / run_seconds
        print(f"  {label:22} {rates[label] / 1e3:8.0f}k changelog rows per CPU second")
    print(
        f"  columnar / orjson+from_pylist: {rates['columnar'] / rates['orjson+from_pylist']:.2f}x, "
        f"columnar / per-record: {rates['columnar'] / rates['per-record']:.2f}x"
    )
    return rates


# ------------------------------------------------------------------------------------------------- Spark


def spark_session() -> Any:
    from cdcflow.connectors.spark.jobs import local_session

    spark = local_session("cdcflow-bench-spark-read")
    import cdcflow

    cdcflow.register(spark)
    spark.dataSource.register(lines_source())
    return spark


def envelope_schema() -> Any:
    """The Debezium envelope as Spark's ``from_json`` reads it."""
    from pyspark.sql import types as T

    def field(name: str, type_name: str) -> Any:
        return T.StructField(name, T._parse_datatype_json_value(type_name))

    image = T.StructType([field("id", "integer"), field("name", "string"), field("description", "string")])
    image = image.add("weight", T.DoubleType())
    source = T.StructType([field(name, type_name) for name, type_name in SOURCE_FIELDS.items()])
    return T.StructType(
        [field("op", "string"), T.StructField("before", image), T.StructField("after", image)]
        + [T.StructField("source", source), field("ts_ms", "long")]
    )


def spark_own(spark: Any, path: Path) -> None:
    """``read.text`` + ``from_json`` + the changelog expansion, as a Spark user writes it."""
    from pyspark.sql import functions as F

    (
        changelog_rows(spark.read.text(str(path)).select(F.from_json("value", envelope_schema()).alias("e")))
        .write.format("noop")
        .mode("overwrite")
        .save()
    )


def spark_cdc(spark: Any, path: Path) -> None:
    spark.read.format("cdc-debezium").option("columns", COLUMNS).load(str(path)).write.format("noop").mode(
        "overwrite"
    ).save()


def lines_source() -> type:
    """A bare file source around :meth:`ColumnarDecoder.decode_lines`: raw 4 MiB chunks of the file,
    no per-line Python objects, no metadata, no dead letters. What the decoder allows a reader."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class ByteRange(InputPartition):
        def __init__(self, path: str, start: int, end: int) -> None:
            self.path, self.start, self.end = path, start, end

    class LinesReader(DataSourceReader):
        def __init__(self, path: str) -> None:
            self.path = path

        def partitions(self) -> list[ByteRange]:
            size = os.path.getsize(self.path)
            step = size // 4 + 1  # two rounds of two tasks on local[2]
            return [ByteRange(self.path, start, min(size, start + step)) for start in range(0, size, step)]

        def read(self, partition: InputPartition) -> Any:
            assert isinstance(partition, ByteRange)
            from cdcflow.connectors.spark.arrow_types import arrow_schema, struct_type
            from cdcflow.formats import parse_ddl, resolve_format
            from cdcflow.formats.debezium.arrow import ColumnarDecoder

            schema = parse_ddl(COLUMNS)
            decoder = resolve_format("debezium-json").create_decoder({}, schema)
            columnar = ColumnarDecoder.for_decoder(decoder, arrow_schema(struct_type(schema)))
            assert columnar is not None
            with open(partition.path, "rb") as stream:  # the lines that start in [start, end)
                position = partition.start
                if position:
                    stream.seek(position - 1)
                    position += len(stream.readline()) - 1
                while position < partition.end:
                    chunk = stream.read(min(4 << 20, partition.end - position))
                    if not chunk.endswith(b"\n"):
                        chunk += stream.readline()
                    position += len(chunk)
                    result = columnar.decode_lines(chunk)
                    assert result is not None
                    yield result.rows

    class LinesSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "cdcflow-bench-lines"

        def schema(self) -> str:
            return COLUMNS + ", _row_kind STRING NOT NULL"

        def reader(self, schema: Any) -> LinesReader:
            return LinesReader(self.options["path"])

    return LinesSource


def spark_lines(spark: Any, path: Path) -> None:
    spark.read.format("cdcflow-bench-lines").option("path", str(path)).load().write.format("noop").mode(
        "overwrite"
    ).save()


def count_rows(spark: Any, path: Path, labels: list[str]) -> dict[str, int]:
    """Each path's row count (not timed): the comparison is only fair if they agree."""
    from pyspark.sql import functions as F

    frames = {
        "spark": spark.read.text(str(path))
        .select(F.from_json("value", envelope_schema()).alias("e"))
        .select(F.explode(F.array(F.col("e.before"), F.col("e.after"))).alias("image")),
        "cdc": spark.read.format("cdc-debezium").option("columns", COLUMNS).load(str(path)),
        "lines": spark.read.format("cdcflow-bench-lines").option("path", str(path)).load(),
    }
    return {label: frames[label].count() for label in labels}


def bench_spark(path: Path, warmup: Path, rows: int, labels: list[str], repeat: int) -> dict[str, float]:
    """Changelog rows/s of each Spark path, best of ``repeat`` runs taken in turns (the machine is shared)."""
    if not labels:
        return {}
    spark = spark_session()
    try:
        runs = {"spark": spark_own, "cdc": spark_cdc, "lines": spark_lines}
        for label in labels:
            runs[label](spark, warmup)
        best = dict.fromkeys(labels, float("inf"))
        for _ in range(repeat):
            for label in labels:
                best[label] = min(best[label], timed(functools.partial(runs[label], spark, path)))
        for label in labels:
            report(f"{label} local[2]", best[label], rows)
        if "spark" in labels:
            counts = count_rows(spark, path, labels)
            assert set(counts.values()) == {rows}, f"row counts differ: {counts}"
        return {label: rows / seconds for label, seconds in best.items()}
    finally:
        spark.stop()


# ------------------------------------------------------------------------------------------------- Flink

FLINK_JOB = textwrap.dedent(
    """
    import sys, time
    from pyflink.table import EnvironmentSettings, TableEnvironment
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    env.get_config().set("parallelism.default", "2")
    env.get_config().set("table.local-time-zone", "UTC")
    columns = sys.argv[1]
    for n, path in enumerate(sys.argv[2:]):
        env.execute_sql(f"CREATE TEMPORARY TABLE src{n} ({columns}) WITH ('connector' = 'filesystem', "
                        f"'path' = 'file://{path}', 'format' = 'debezium-json')")
        env.execute_sql(f"CREATE TEMPORARY TABLE sink{n} ({columns}) WITH ('connector' = 'blackhole')")
        started = time.perf_counter()
        env.execute_sql(f"INSERT INTO sink{n} SELECT * FROM src{n}").wait()
        print("seconds", time.perf_counter() - started, flush=True)
    """
)


def bench_flink(flink_python: str, warmup: Path, path: Path) -> float | None:
    """Seconds Flink takes for ``path`` (after a warm-up job on ``warmup``), or None without PyFlink."""
    if not Path(flink_python).exists():
        return None
    check = subprocess.run([flink_python, "-c", "import pyflink"], capture_output=True, check=False)  # noqa: S603
    if check.returncode != 0:
        return None
    result = subprocess.run(  # noqa: S603 - the PyFlink venv's python, given on the command line
        [flink_python, "-c", FLINK_JOB, COLUMNS, str(warmup), str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    seconds = [float(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("seconds ")]
    if result.returncode != 0 or len(seconds) != 2:
        print(f"  flink failed: {result.stderr.strip().splitlines()[-1:]}")
        return None
    return seconds[1]


# -------------------------------------------------------------------------------------------------- main


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--only", default="decode,spark,cdc,lines,flink")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per Spark path (best is kept)")
    flink_venv = "/tmp/flinkvenv/bin/python"  # noqa: S108 - where scripts/flink_golden.py puts PyFlink
    parser.add_argument("--flink-python", default=flink_venv)
    parser.add_argument("--decode-messages", type=int, default=200_000)
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    workdir = Path(tempfile.mkdtemp(prefix="cdcflow-bench-"))
    try:
        path, warmup = workdir / "products.jsonl", workdir / "warmup.jsonl"
        size = write_envelopes(path, args.messages)
        write_envelopes(warmup, WARMUP_MESSAGES)
        rows = 2 * args.messages
        average = size / args.messages
        print(f"{args.messages} Debezium updates, {average:.0f} bytes each on average, {rows} changelog rows")
        if "decode" in only:
            print("one core, no Spark:")
            bench_decode(path, min(args.messages, args.decode_messages))
        labels = [label for label in ("spark", "cdc", "lines") if label in only]
        rates = bench_spark(path, warmup, rows, labels, args.repeat)
        if "flink" in only:
            flink_seconds = bench_flink(args.flink_python, warmup, path)
            if flink_seconds is None:
                print("  flink: skipped (no PyFlink at --flink-python)")
            else:
                rates["flink"] = rows / flink_seconds
                report("flink 2 slots", flink_seconds, rows)
        if "spark" in rates:
            for label, rate in rates.items():
                if label != "spark":
                    print(f"ratio {label} / Spark's own from_json path: {rate / rates['spark']:.2f}x")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
