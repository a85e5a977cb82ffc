"""A deterministic stream of real Debezium change events for the Kafka tests, and its expected changelog."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import Encoded, Message, parse_ddl, resolve_format

COLUMNS = "id INT NOT NULL, name STRING, price DECIMAL(10,2), qty BIGINT, updated TIMESTAMP_NTZ(6)"
SCHEMA = parse_ddl(COLUMNS)


def spark_schema(ddl: str) -> Any:
    """``ddl`` (cdcflow's DDL, with time precisions Spark 4.2's parser lacks) as a Spark StructType."""
    from cdcflow.connectors.spark.arrow_types import struct_type

    return struct_type(parse_ddl(ddl))


def changelog(events: int, seed: int = 7) -> list[Change]:
    """Inserts, updates (-U/+U) and deletes over a few dozen keys."""
    import datetime as dt
    from decimal import Decimal

    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    live: dict[int, dict[str, Any]] = {}
    changes: list[Change] = []
    start = dt.datetime(2026, 1, 1)
    for number in range(events):
        row = {
            "name": rng.choice(["scooter", "hammer", "rocks", None, "ßpanner ✓"]),
            "price": Decimal(rng.randint(-99999, 99999)).scaleb(-2),
            "qty": rng.randint(-(2**40), 2**40),
            "updated": start + dt.timedelta(seconds=number, microseconds=rng.randint(0, 999_999)),
        }
        action = rng.choice(["insert", "update", "update", "delete"]) if live else "insert"
        if action == "insert" or len(live) < 3:
            key = rng.choice([k for k in range(60) if k not in live])
            live[key] = {"id": key, **row}
            changes.append(Change(RowKind.INSERT, dict(live[key])))
        elif action == "update":
            key = rng.choice(sorted(live))
            old, live[key] = live[key], {"id": key, **row}
            changes += [
                Change(RowKind.UPDATE_BEFORE, dict(old)),
                Change(RowKind.UPDATE_AFTER, dict(live[key])),
            ]
        else:
            key = rng.choice(sorted(live))
            changes.append(Change(RowKind.DELETE, live.pop(key)))
    return changes


def debezium_events(changes: Sequence[Change]) -> list[Encoded]:
    """The changes as Debezium JSON envelopes keyed by id (an update is one ``u`` event)."""
    encoder = resolve_format("debezium-json").create_encoder({}, SCHEMA, ["id"])
    return encoder.encode_all(changes)


def decode(messages: Sequence[Message]) -> list[Change]:
    """What the per-message decoder makes of ``messages``: the reference for the Spark source."""
    decoder = resolve_format("debezium-json").create_decoder({}, SCHEMA)
    return decoder.decode_all(messages).changes
