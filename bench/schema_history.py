"""The seeded history of bench/cdc_history.py as real Kafka Connect messages, schema block included.

Each envelope of ``cdc_history.events`` becomes a message of the recorded PostgreSQL table
``inventory.cdc_types`` (tests/formats/recorded/postgres/schemas.jsonl: Debezium 3.6.3,
``JsonConverter`` with ``schemas.enable=true``, a ~5 kB schema block in every message): the recorded
create, update or delete of that table with the history's id, ``source.lsn``, ``source.sequence`` and
``txId``, and its values in five of the table's columns (:data:`LEAN`); the other twenty keep their
recorded values (decimals, dates, JSON, arrays, TOAST placeholders).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from cdc_history import Row, events

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "tests" / "formats" / "recorded" / "postgres" / "schemas.jsonl"
TABLE = "cdc_types"
LEAN = "id INT NOT NULL, c_text STRING, c_bigint BIGINT, c_double DOUBLE, c_smallint SMALLINT"
"""The columns both jobs are given; the history's ``name, rev, price`` go to the first three after id."""
HISTORY_COLUMNS = {"c_text": "name", "c_bigint": "rev", "c_double": "price"}


def _recorded() -> dict[str, dict[str, Any]]:
    """The recorded ``cdc_types`` message of each op (the first of each), parsed."""
    found: dict[str, dict[str, Any]] = {}
    for line in RECORDING.read_bytes().splitlines():
        record = orjson.loads(line)
        if record["value"] is None:
            continue
        message = orjson.loads(record["value"])
        payload = message["payload"]
        if payload["source"]["table"] == TABLE and payload["op"] in ("c", "u", "d"):
            found.setdefault(payload["op"], message)
    return found


def _image(template: dict[str, Any], row: Row, smallint: int) -> dict[str, Any]:
    image = dict(template)
    image["id"] = row["id"]
    for column, name in HISTORY_COLUMNS.items():
        image[column] = row[name]
    image["c_smallint"] = smallint
    return image


def messages(changes: int, keys: int) -> Iterator[tuple[bytes, int, Row | None]]:
    """Each change as the Connect JSON message's bytes, its id and the lean row it leaves (None: deleted)."""
    recorded = _recorded()
    for event in events(changes, keys):
        op = event["op"]
        message = recorded[op]
        payload = dict(message["payload"])
        row = event["after"] or event["before"]
        smallint = row["qty"] % 32_768
        source = dict(payload["source"])
        source.update(
            lsn=event["source"]["lsn"],
            sequence=event["source"]["sequence"],
            txId=event["source"]["txId"],
            ts_ms=event["source"]["ts_ms"],
        )
        payload["source"] = source
        if op == "d":
            payload["before"] = {**payload["before"], "id": row["id"]}
            lean = None
        else:
            payload["after"] = _image(payload["after"], row, smallint)
            lean = {
                "id": row["id"],
                **{c: row[n] for c, n in HISTORY_COLUMNS.items()},
                "c_smallint": smallint,
            }
        yield orjson.dumps({"schema": message["schema"], "payload": payload}), row["id"], lean


def write(path: Path, min_bytes: int, keys: int) -> tuple[int, int, dict[int, Row]]:
    """At least ``min_bytes`` of messages to ``path``, one per line; returns (changes, bytes, table)."""
    table: dict[int, Row] = {}
    changes = written = 0
    with path.open("wb") as out:
        for value, key, lean in messages(2**62, keys):
            out.write(value + b"\n")
            changes, written = changes + 1, written + len(value) + 1
            if lean is None:
                del table[key]
            else:
                table[key] = lean
            if written >= min_bytes:
                break
    return changes, written, table
