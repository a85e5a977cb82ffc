"""The Debezium events the benchmarks read: PostgreSQL update events (op u, before and after) of
Debezium's ``inventory.products`` example table, ~420 bytes each."""

from __future__ import annotations

import random

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
