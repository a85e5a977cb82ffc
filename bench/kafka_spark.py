"""One real-Kafka topic of Debezium envelopes read three ways on Spark, in turns, in one session:

- ``cdc``: ``spark.read.format("cdc-debezium")`` (cdcflow's source, confluent-kafka on the executors);
- ``decode``: ``spark.read.format("kafka")`` (Spark's own source, spark-sql-kafka jars) +
  ``cdcflow.spark.decode_kafka`` (the same executor-side decoder, in a ``mapInArrow``);
- ``from_json``: ``spark.read.format("kafka")`` + ``from_json`` with a lean schema (``op`` and the four
  columns of ``before``/``after``, nothing else) + the changelog expansion a Spark user writes
  (``c``/``r`` → +I, ``u`` → -U then +U, ``d`` → -D, with ``when`` / ``array`` / ``explode``).

Every path writes ``id, name, description, weight, _row_kind`` (2 rows per update envelope) into a
``noop`` sink, which materializes every output column, so Spark cannot prune the parse. For
reference, ``kafka`` times Spark's source alone (its raw columns into ``noop``, nothing decoded): the
cost the last two paths share. Runs are interleaved (cdc, decode, from_json, kafka, cdc, ...), a
warm-up round first (printed, left out); the medians of ``--rounds`` are reported as changelog rows/s
with the ratios against ``from_json``. Row counts of the three paths are checked equal (untimed).

The topic (``--records`` update envelopes of bench/products_events.py, ~420 bytes, keyed by id,
lz4, over ``--partitions`` partitions) is created and filled by the bench on ``KAFKA_BOOTSTRAP`` if
set, else on a real single-node KRaft broker it starts on 127.0.0.1 (tests/connectors/kafka_broker.py,
jars from the Java cache; scripts/java_deps.sh kafka spark-kafka fetches them). Both Spark's source and
cdcflow's read committed records (``kafka.isolation.level=read_committed`` on Spark's).
``--unavailable-values report`` reads without the state of each key's last image the default ``fill``
keeps (both take the columnar path); ``--metadata topic,partition,offset`` adds those columns to all
three paths.

    .venv/bin/python bench/kafka_spark.py [--records 500000] [--partitions 4] [--rounds 3]
        [--unavailable-values fill|report] [--metadata topic,partition,offset]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import results
from products_events import COLUMNS, changelog_rows, produce

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "connectors"))
IMAGE = "id INT, name STRING, description STRING, weight DOUBLE"


@contextlib.contextmanager
def kafka_cluster() -> Iterator[str]:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if bootstrap:
        yield bootstrap
        return
    from kafka_broker import KafkaBroker

    with tempfile.TemporaryDirectory(prefix="cdcflow-bench-kafka-") as workdir:
        broker = KafkaBroker(Path(workdir)).start()
        try:
            yield broker.bootstrap_servers
        finally:
            broker.stop()


def fill_topic(bootstrap: str, topic: str, records: int, partitions: int) -> int:
    """Creates ``topic`` and writes the envelopes round-robin, keyed by id; returns the values' bytes."""
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=60)
    return produce(bootstrap, topic, records, partitions, key=lambda index: b'{"id":%d}' % index)


def session() -> Any:
    import java_cache

    from cdcflow.connectors.spark.jobs import local_session

    compiled()

    jars = java_cache.jars("spark-kafka")
    if not jars:
        sys.exit("Spark's Kafka source jars are missing: run scripts/java_deps.sh spark-kafka")
    config = {
        "spark.jars": ",".join(jars),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
    }
    spark = local_session("cdcflow-bench-kafka-spark", config)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def compiled() -> None:
    """cdcflow's modules compiled, as pip installs a package. An editable install under
    PYTHONDONTWRITEBYTECODE (set on some machines) has none, and every Python process Spark starts (a
    streaming source's planner, each worker) would compile them again, ~0.1 s each, which no installed
    cdcflow pays."""
    import compileall

    import cdcflow

    compileall.compile_dir(os.path.dirname(cdcflow.__file__), quiet=1)


class Paths:
    def __init__(
        self, spark: Any, bootstrap: str, topic: str, options: dict[str, str], metadata: str
    ) -> None:
        self.spark, self.bootstrap, self.topic = spark, bootstrap, topic
        self.options = options
        self.metadata = [m for m in metadata.split(",") if m]

    def kafka(self) -> Any:
        return (
            self.spark.read.format("kafka")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("subscribe", self.topic)
            .option("kafka.isolation.level", "read_committed")
            .load()
        )

    def raw(self) -> Any:
        """Spark's source alone, no parse: the floor every path that reads with it stands on."""
        return self.kafka().select("key", "value", "topic", "partition", "offset", "timestamp")

    def cdc(self) -> Any:
        options = {**self.options, **({"metadata": ",".join(self.metadata)} if self.metadata else {})}
        return (
            self.spark.read.format("cdc-debezium")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("subscribe", self.topic)
            .option("columns", COLUMNS)
            .options(**options)
            .load()
        )

    def decode(self) -> Any:
        from cdcflow.spark import decode_kafka

        options = {**self.options, **({"metadata": ",".join(self.metadata)} if self.metadata else {})}
        return decode_kafka(self.kafka(), "debezium-json", columns=COLUMNS, options=options)

    def from_json(self) -> Any:
        from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

        schema = f"op STRING, before STRUCT<{_colon(IMAGE)}>, after STRUCT<{_colon(IMAGE)}>"

        kept = [F.col(m) for m in self.metadata]
        parsed = self.kafka().select(F.from_json(F.col("value").cast("string"), schema).alias("e"), *kept)
        return changelog_rows(parsed)


def _colon(ddl: str) -> str:
    return ", ".join(": ".join(part.strip().split(" ", 1)) for part in ddl.split(","))


def timed(run: Callable[[], Any]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def noop(frame: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        frame().write.format("noop").mode("overwrite").save()

    return run


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds after the warm-up")
    parser.add_argument("--unavailable-values", default="fill", choices=("fill", "report"))
    parser.add_argument("--metadata", default="", help="e.g. topic,partition,offset (all three paths)")
    parser.add_argument("--json", type=Path, help="also write the measurements here (bench/all.py)")
    args = parser.parse_args(argv)
    topic = f"bench-kafka-spark-{uuid.uuid4().hex[:8]}"
    options = {} if args.unavailable_values == "fill" else {"debezium-json.unavailable-values": "report"}
    rows = 2 * args.records
    with kafka_cluster() as bootstrap:
        started = time.perf_counter()
        size = fill_topic(bootstrap, topic, args.records, args.partitions)
        print(
            f"{args.records} Debezium update envelopes ({size / args.records:.0f} B avg, keyed, lz4) over "
            f"{args.partitions} partitions, produced in {time.perf_counter() - started:.1f} s; "
            f"{rows} changelog rows; unavailable-values={args.unavailable_values}; "
            f"metadata={args.metadata or 'none'}; Spark local[2]"
        )
        spark = session()
        try:
            paths = Paths(spark, bootstrap, topic, options, args.metadata)
            frames = {"cdc": paths.cdc, "decode": paths.decode, "from_json": paths.from_json}
            counts = {label: frame().count() for label, frame in frames.items()}
            frames["kafka"] = paths.raw
            if set(counts.values()) != {rows}:
                sys.exit(f"the paths disagree on the row count (want {rows}): {counts}")
            # The first round warms up Python workers, the JIT and the page cache: left out of the figures.
            seconds: dict[str, list[float]] = {label: [] for label in frames}
            for _ in range(1 + args.rounds):
                for label, frame in frames.items():
                    seconds[label].append(timed(noop(frame)))
        finally:
            spark.stop()
    measured = {label: runs[1:] for label, runs in seconds.items()}
    rates = {label: rows / statistics.median(runs) for label, runs in measured.items()}
    print(f"{'path':<10} {'warm-up, runs (s)':<30} {'rows/s':>10} {'vs from_json':>13}  (medians)")
    for label, runs in seconds.items():
        shown = f"{runs[0]:.2f}; " + ", ".join(f"{s:.2f}" for s in runs[1:])
        if label == "kafka":
            rate = args.records / statistics.median(measured[label])
            print(f"{label:<10} {shown:<30} {rate / 1e3:>9.0f}k records/s, not decoded")
            continue
        print(
            f"{label:<10} {shown:<30} {rates[label] / 1e3:>9.0f}k {rates[label] / rates['from_json']:>12.2f}x"
        )
    if args.json is not None:
        results.write(
            args.json,
            [
                results.Comparison(
                    name=f"{NAMES[label]} over Kafka ({args.records:,} keyed updates, {args.partitions} "
                    f"partitions, unavailable-values={args.unavailable_values})",
                    unit="rows/s",
                    amount=rows,
                    baseline="from_json + changelog expansion",
                    seconds={
                        NAMES[label]: seconds[label],
                        "from_json + changelog expansion": seconds["from_json"],
                        **({"Spark's Kafka source alone": seconds["kafka"]} if label == "decode" else {}),
                    },
                    warmup=1,
                )
                for label in ("cdc", "decode")
            ],
        )
    return 0


NAMES = {"cdc": "cdc-debezium source", "decode": "decode_kafka"}


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
