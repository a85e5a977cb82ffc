"""A seeded history of a PostgreSQL table as Debezium JSON envelopes, and the table it leaves.

``events`` yields the envelopes: inserts, many updates, deletes (REPLICA IDENTITY FULL: ``before``
is the whole row) and re-inserts of deleted keys, in transactions of 1-5 changes whose ``source``
carries increasing ``lsn``, ``txId`` and ``sequence`` (``["<last commit lsn>", "<lsn>"]``).
``write_history`` writes them one plain envelope per line (no schema/payload wrapper); ``fold``
replays envelopes into the table by id, independently of cdcflow, so readers can be checked.

Shared by ``bench/delta_apply.py`` (imported) and tests/connectors/lakehouse/test_crash.py (loaded
by path: bench/ stays off the tests' sys.path).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

COLUMNS = "id INT NOT NULL, name STRING, qty BIGINT, price DOUBLE, rev BIGINT"
NAMES = ("scooter", "car battery", "drill bits", "hammer", "rocks", "jacket", "spare tire", None)
FIRST_LSN = 24_023_128
Row = dict[str, Any]


@dataclass(frozen=True)
class HistoryStats:
    changes: int
    inserts: int
    reinserts: int
    updates: int
    deletes: int
    live: int
    bytes: int


def events(changes: int, keys: int, seed: int = 5) -> Iterator[Row]:
    """``changes`` envelopes over ids ``1..keys``: a picked id is inserted when absent, else updated
    (85%) or deleted (15%), so most ids are live at any time and deleted ids come back."""
    rng = random.Random(seed)
    live: dict[int, Row] = {}
    lsn, commit_lsn, tx, in_tx = FIRST_LSN, FIRST_LSN - 8, 700, 0
    for rev in range(changes):
        if in_tx == 0:
            tx, in_tx = tx + 1, rng.randint(1, 5)
        key = rng.randint(1, keys)
        before = live.get(key)
        after: Row | None
        if before is None:
            op, after = "c", _row(key, rev, rng)
        elif rng.random() < 0.85:
            op, after = "u", _row(key, rev, rng)
        else:
            op, after = "d", None
        if after is None:
            del live[key]
        else:
            live[key] = after
        lsn += rng.randint(1, 6) * 8
        yield _envelope(op, before, after, lsn, commit_lsn, tx, rev)
        in_tx -= 1
        if in_tx == 0:
            commit_lsn, lsn = lsn + 8, lsn + 16


def write_history(path: Path, changes: int, keys: int, seed: int = 5) -> HistoryStats:
    """Writes :func:`events` to ``path``, one envelope per line."""
    counts = {"c": 0, "u": 0, "d": 0}
    seen: set[int] = set()
    reinserts = 0
    live = 0
    with path.open("wb") as out:
        lines: list[bytes] = []
        for event in events(changes, keys, seed):
            op = event["op"]
            counts[op] += 1
            if op == "c":
                key = event["after"]["id"]
                reinserts += key in seen
                seen.add(key)
            live += {"c": 1, "u": 0, "d": -1}[op]
            lines.append(orjson.dumps(event) + b"\n")
            if len(lines) >= 10_000:
                out.write(b"".join(lines))
                lines.clear()
        out.write(b"".join(lines))
    return HistoryStats(
        changes=changes,
        inserts=counts["c"],
        reinserts=reinserts,
        updates=counts["u"],
        deletes=counts["d"],
        live=live,
        bytes=path.stat().st_size,
    )


def _row(key: int, rev: int, rng: random.Random) -> Row:
    return {
        "id": key,
        "name": rng.choice(NAMES),
        "qty": rng.randint(-1000, 1_000_000),
        "price": round(rng.uniform(0.01, 500.0), 2),
        "rev": rev,
    }


def _envelope(
    op: str, before: Row | None, after: Row | None, lsn: int, commit_lsn: int, tx: int, rev: int
) -> Row:
    source = {
        "version": "2.7.3.Final",
        "connector": "postgresql",
        "name": "dbserver1",
        "ts_ms": 1_700_000_000_000 + rev,
        "snapshot": "false",
        "db": "inventory",
        "sequence": orjson.dumps([str(commit_lsn), str(lsn)]).decode(),
        "schema": "inventory",
        "table": "items",
        "txId": tx,
        "lsn": lsn,
        "xmin": None,
    }
    return {"before": before, "after": after, "source": source, "op": op, "ts_ms": 1_700_000_000_100 + rev}


def read_history(path: Path) -> Iterator[Row]:
    with path.open("rb") as lines:
        for line in lines:
            yield orjson.loads(line)


def fold(history: Path | Iterable[Row]) -> dict[int, Row]:
    """The table the envelopes leave, applied in order (c/u/r put ``after``, d removes ``before``)."""
    table: dict[int, Row] = {}
    for event in read_history(history) if isinstance(history, Path) else history:
        op = event["op"]
        if op in ("c", "u", "r"):
            table[event["after"]["id"]] = event["after"]
        elif op == "d":
            del table[event["before"]["id"]]
        else:
            raise ValueError(f"unexpected op {op!r}")
    return table
