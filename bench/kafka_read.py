"""Reading Debezium JSON from Kafka: ``spark.read.format("cdc-debezium")`` against a bare consumer.

Produces ``--records`` Debezium update envelopes of a products table (~420 bytes each, keyed by id)
over ``--partitions`` partitions of a fresh topic, then times, in the same run:

- ``consumer``: one confluent-kafka consumer assigned every partition, reading every record;
- ``consumer+orjson``: the same, with ``orjson.loads`` of every value (the least any decoder does);
- ``cdc``: ``spark.read.format("cdc-debezium")`` over the topic into a ``noop`` sink on ``local[2]``
  (one Spark task per partition; the first read, which starts Spark's Python workers, is not timed);
  by default (``unavailable-values=fill``) keyed records go through the per-record decoder, which
  keeps each key's last image; ``cdc report`` sets ``unavailable-values=report``, which lets the
  columnar decoder take them.

Rates are Kafka records per second (the cdc source emits two changelog rows, -U and +U, per update);
the ratios against the bare consumer (and the consumer that also parses each value with orjson, on
one core where Spark has two) are what to track, since these machines are shared.
The Kafka cluster is ``KAFKA_BOOTSTRAP`` if set, else librdkafka's mock cluster in a child process.
The mock keeps at most 5 MiB (as stored, i.e. compressed) and 100k message sets per partition and
silently drops older data beyond that: the records are lz4-compressed by default, and the bench stops
if a partition lost any.

    .venv/bin/python bench/kafka_read.py [--records 240000] [--partitions 6] [--compression lz4]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
from products_events import COLUMNS, produce

from cdcflow.connectors.spark.jobs import local_session


@contextlib.contextmanager
def kafka_cluster(partitions: int, topic: str) -> Iterator[str]:
    """The bootstrap servers of a cluster holding a fresh, empty ``topic``."""
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if bootstrap:
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=60)
        yield bootstrap
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "connectors"))
    from kafka_mock import MockKafkaCluster

    with MockKafkaCluster() as mock:
        mock.create_topic(topic, partitions)
        yield mock.bootstrap_servers


def check_nothing_dropped(bootstrap: str, topic: str, partitions: int, records: int) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}"})
    try:
        bounds = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30) for p in range(partitions)
        ]
    finally:
        consumer.close()
    kept = sum(high - low for low, high in bounds)
    if kept != records or any(low for low, _ in bounds):
        sys.exit(
            f"the cluster kept {kept} of {records} records (watermarks {bounds}); the mock cluster drops "
            "data beyond 5 MiB per partition: use more --partitions, fewer --records or --compression lz4"
        )


def consume_all(bootstrap: str, topic: str, partitions: int, records: int, parse: bool) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    loads, seen = orjson.loads, 0
    try:
        while seen < records:
            batch = consumer.consume(num_messages=5000, timeout=1.0)
            for record in batch:
                if record.error() is not None:
                    continue
                seen += 1
                if parse:
                    loads(record.value() or b"null")
    finally:
        consumer.close()


def spark_read(spark: Any, bootstrap: str, topic: str, **options: str) -> None:
    (
        spark.read.format("cdc-debezium")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("columns", COLUMNS)
        .options(**options)
        .load()
        .write.format("noop")
        .mode("overwrite")
        .save()
    )


def best_of(runs: int, function: Callable[[], Any]) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=240_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--compression", default="lz4", help="the producer's compression.type")
    parser.add_argument("--runs", type=int, default=2, help="timed runs per case; the best is reported")
    args = parser.parse_args()
    records, partitions = args.records, args.partitions
    topic = f"bench-debezium-{uuid.uuid4().hex[:8]}"
    with kafka_cluster(partitions, topic) as bootstrap:
        started = time.perf_counter()
        size = produce(bootstrap, topic, records, partitions, compression=args.compression, flush_seconds=120)
        produced_s = time.perf_counter() - started
        check_nothing_dropped(bootstrap, topic, partitions, records)
        print(
            f"{records} Debezium update envelopes ({size / records:.0f} B avg, {args.compression}) over "
            f"{partitions} partitions, produced in {produced_s:.1f} s; best of {args.runs} runs; "
            "Spark on local[2]"
        )
        results = {
            "consumer": best_of(args.runs, lambda: consume_all(bootstrap, topic, partitions, records, False)),
            "consumer+orjson": best_of(
                args.runs, lambda: consume_all(bootstrap, topic, partitions, records, True)
            ),
        }
        spark = local_session("cdcflow-bench-kafka-read")
        try:
            spark_read(spark, bootstrap, topic)  # starts the Python workers
            results["cdc"] = best_of(args.runs, lambda: spark_read(spark, bootstrap, topic))
            report = {"unavailable-values": "report"}
            results["cdc report"] = best_of(args.runs, lambda: spark_read(spark, bootstrap, topic, **report))
        finally:
            spark.stop()
    bare, parsed = (records / results[name] for name in ("consumer", "consumer+orjson"))
    print(
        f"{'case':<16} {'seconds':>8} {'records/s':>10} {'rows/s':>10} {'vs consumer':>12} {'vs +orjson':>11}"
    )
    for name, seconds in results.items():
        rate = records / seconds
        rows = f"{2 * rate / 1e3:>9.0f}k" if name.startswith("cdc") else f"{'':>10}"
        ratios = f"{rate / bare:>12.2f} {rate / parsed:>11.2f}"
        print(f"{name:<16} {seconds:>8.2f} {rate / 1e3:>9.0f}k {rows} {ratios}")


if __name__ == "__main__":
    main()
