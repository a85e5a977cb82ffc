"""The cost of the exactly-once Kafka sink: ``df.write.format("cdc-debezium")`` of the same changelog
with ``sink.delivery-guarantee`` at-least-once (idempotent producer, acks=all) and exactly-once (a
transaction per task, with its marker), interleaved, on ``local[2]``.

The input is ``--rows`` inserts of a products table (id, name, description, weight), cached in memory
over ``--tasks`` partitions; each write goes to a fresh topic of ``--partitions`` partitions. Rates are
changelog rows per second; the best of ``--runs`` per mode is reported with the exactly-once /
at-least-once ratio (what to track, since these machines are shared). The first write of each mode
(Python workers starting, the transaction coordinator loading) is not timed. Needs a real broker with
transactions: ``KAFKA_BOOTSTRAP`` (librdkafka's mock cluster has no transactions).

    KAFKA_BOOTSTRAP=host:9092 .venv/bin/python bench/kafka_sink.py [--rows 200000] [--tasks 2] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

from cdcflow.connectors.spark.jobs import local_session


def fresh_topic(bootstrap: str, partitions: int) -> str:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    topic = f"bench-sink-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=60)
    return topic


def records_in(bootstrap: str, topic: str, partitions: int, isolation: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "isolation.level": isolation})
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)[1]
            for p in range(partitions)
        )
    finally:
        consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--tasks", type=int, default=2, help="input partitions (Spark tasks) per write")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the sink topic")
    parser.add_argument("--runs", type=int, default=3, help="timed writes per mode, interleaved")
    args = parser.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        sys.exit("set KAFKA_BOOTSTRAP to a broker with transactions (the mock cluster has none)")

    spark = local_session("cdcflow-bench-kafka-sink")
    from pyspark.sql import functions as F

    changelog = (
        spark.range(args.rows, numPartitions=args.tasks)
        .select(
            F.col("id").cast("int").alias("id"),
            F.concat(F.lit("product-"), F.col("id").cast("string")).alias("name"),
            F.lit("a description of some forty characters..").alias("description"),
            (F.col("id") % 1000 / 10).cast("float").alias("weight"),
            F.lit("+I").alias("_row_kind"),
        )
        .cache()
    )
    changelog.count()

    def write(mode: str) -> float:
        topic = fresh_topic(bootstrap, args.partitions)
        began = time.perf_counter()
        (
            changelog.write.format("cdc-debezium")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", topic)
            .option("keyColumns", "id")
            .option("sink.delivery-guarantee", mode)
            .mode("append")
            .save()
        )
        seconds = time.perf_counter() - began
        # Offsets count records plus one commit marker per transaction (per task and partition).
        isolation = "read_committed" if mode == "exactly-once" else "read_uncommitted"
        assert records_in(bootstrap, topic, args.partitions, isolation) >= args.rows
        return seconds

    modes = ["at-least-once", "exactly-once"]
    for mode in modes:
        write(mode)  # warm-up
    best = {mode: float("inf") for mode in modes}
    for run in range(args.runs):
        for mode in modes if run % 2 == 0 else reversed(modes):
            seconds = write(mode)
            best[mode] = min(best[mode], seconds)
            print(
                f"run {run + 1} {mode:>14}: {args.rows / seconds:>10,.0f} rows/s ({seconds:.2f} s)",
                flush=True,
            )
    rates = {mode: args.rows / best[mode] for mode in modes}
    print(
        f"\n{args.rows:,} rows, {args.tasks} tasks, sink topic of {args.partitions} partitions, "
        f"best of {args.runs}"
    )
    for mode in modes:
        print(f"{mode:>14}: {rates[mode]:>10,.0f} rows/s")
    print(f"exactly-once / at-least-once: {rates['exactly-once'] / rates['at-least-once']:.2f}")
    spark.stop()


if __name__ == "__main__":
    main()
