"""The Debezium events the benchmarks read: PostgreSQL update events (op u, before and after) of
Debezium's ``inventory.products`` example table, ~420 bytes each."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from typing import Any

import orjson

COLUMNS = "id INT NOT NULL, name STRING, description STRING, weight DOUBLE"
PRODUCTS = [
    ("scooter", "Small 2-wheel scooter"),
    ("car battery", "12V car battery"),
    ("12-pack drill bits", "12-pack of drill bits with sizes ranging from #40 to #3"),
    ("hammer", "12oz carpenter's hammer"),
    ("rocks", "box of assorted rocks"),
    ("jacket", "water resistent black wind breaker"),
    ("spare tire", "24 inch spare tire"),
]


def envelope(index: int, rng: random.Random) -> bytes:
    """A Debezium PostgreSQL update event with before and after images."""
    name, description = PRODUCTS[index % len(PRODUCTS)]
    before = {"id": index, "name": name, "description": description, "weight": round(rng.uniform(0.1, 30), 3)}
    after = {**before, "weight": round(rng.uniform(0.1, 30), 3)}
    lsn = 24_023_128 + 48 * index
    source = {
        "version": "2.7.3.Final",
        "connector": "postgresql",
        "name": "dbserver1",
        "ts_ms": 1_700_000_000_000 + index,
        "db": "inventory",
        "schema": "inventory",
        "table": "products",
        "txId": 767 + index,
        "lsn": lsn,
    }
    event = {
        "before": before,
        "after": after,
        "source": source,
        "op": "u",
        "ts_ms": 1_700_000_000_500 + index,
    }
    return orjson.dumps(event)


def produce(
    bootstrap: str,
    topic: str,
    records: int,
    partitions: int,
    *,
    compression: str = "lz4",
    key: Callable[[int], bytes] = lambda index: str(index).encode(),
    flush_seconds: float = 300,
) -> int:
    """Writes ``records`` envelopes to ``topic`` round-robin over its partitions, each under
    ``key(index)``; returns the bytes of the values."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "compression.type": compression,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 200_000,
        }
    )
    rng, size = random.Random(7), 0  # noqa: S311 - bench data
    for index in range(records):
        value = envelope(index, rng)
        size += len(value)
        while True:
            try:
                producer.produce(topic, value, key(index), partition=index % partitions)
                break
            except BufferError:
                producer.poll(0.1)
        if index % 10_000 == 0:
            producer.poll(0)
    if producer.flush(flush_seconds):
        sys.exit(f"not every record was delivered to Kafka within {flush_seconds:.0f} s")
    return size


def changelog_rows(envelopes: Any) -> Any:
    """The changelog expansion a Spark user writes over a DataFrame whose column ``e`` holds parsed
    envelopes (``op``, ``before``, ``after``): +I / -U +U / -D rows of ``id, name, description, weight,
    _row_kind``, with native Spark functions. Columns other than ``e`` are kept."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

    def change(kind: str, image: str) -> Any:
        return F.struct(F.lit(kind).alias("kind"), F.col(f"e.{image}").alias("image"))

    changes = (
        F.when(F.col("e.op").isin("c", "r"), F.array(change("+I", "after")))
        .when(F.col("e.op") == "u", F.array(change("-U", "before"), change("+U", "after")))
        .when(F.col("e.op") == "d", F.array(change("-D", "before")))
    )
    kept = [F.col(c) for c in envelopes.columns if c != "e"]
    return envelopes.select(F.explode(changes).alias("c"), *kept).select(
        *(F.col(f"c.image.{name}").alias(name) for name in ("id", "name", "description", "weight")),
        *kept,
        F.col("c.kind").alias("_row_kind"),
    )
