"""Throughput of the changelog engine alone, against a raw Python loop over the same rows.

Each case runs the engine and a hand-written loop that does the same conversion with no
validation, state abstraction or error handling; the ratio engine/baseline is what to track, since
these machines are shared and absolute numbers drift.

    .venv/bin/python bench/engine.py [--rows 1000000] [--keys 100000]
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from cdcflow import Change, RowKind, from_changelog, to_changelog

INSERT, UB, UA, DELETE = RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE
KINDS = {"INSERT": INSERT, "UPDATE_AFTER": UA, "DELETE": DELETE}


def flat_rows(n: int, keys: int, rng: random.Random) -> list[dict[str, Any]]:
    ops = ["INSERT", "UPDATE_AFTER", "UPDATE_AFTER", "DELETE"]
    return [{"op": ops[rng.randrange(4)], "id": rng.randrange(keys), "name": "n", "v": i} for i in range(n)]


def debezium_rows(n: int, keys: int, rng: random.Random) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        key = rng.randrange(keys)
        rows.append({"op": "u", "ts_ms": i, "before": {"id": key, "v": i - 1}, "after": {"id": key, "v": i}})
    return rows


def upsert_rows(n: int, keys: int, rng: random.Random) -> list[dict[str, Any]]:
    return [{"op": "upsert", "id": rng.randrange(keys), "v": i} for i in range(n)]


def retract_changes(n: int, keys: int, rng: random.Random) -> list[Change]:
    changes = []
    for i in range(n // 2):
        key = rng.randrange(keys)
        changes.append(Change(UB, {"id": key, "v": i - 1}))
        changes.append(Change(UA, {"id": key, "v": i}))
    return changes


def baseline_flat(rows: Iterable[dict[str, Any]]) -> Iterator[Change]:
    for row in rows:
        yield Change(KINDS[row["op"]], {k: v for k, v in row.items() if k != "op"})


def baseline_debezium(rows: Iterable[dict[str, Any]]) -> Iterator[Change]:
    for row in rows:
        yield Change(UB, {**row["before"], "ts_ms": row["ts_ms"]})
        yield Change(UA, {**row["after"], "ts_ms": row["ts_ms"]})


def baseline_upsert(rows: Iterable[dict[str, Any]]) -> Iterator[Change]:
    state: dict[Any, dict[str, Any]] = {}
    for record in rows:
        row = {k: v for k, v in record.items() if k != "op"}
        old = state.get(row["id"])
        if old is None:
            yield Change(INSERT, row)
        else:
            yield Change(UB, old)
            yield Change(UA, row)
        state[row["id"]] = row


def baseline_combine(changes: Iterable[Change]) -> Iterator[dict[str, Any]]:
    pending: dict[Any, dict[str, Any]] = {}
    for change in changes:
        if change.kind is UB:
            pending[change.row["id"]] = change.row
        else:
            yield {"op": "u", "before": pending.pop(change.row["id"]), "after": change.row}


def timed(run: Callable[[], Iterator[Any]]) -> tuple[float, int]:
    gc.collect()
    start = time.perf_counter()
    produced = sum(1 for _ in run())
    return time.perf_counter() - start, produced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    args = parser.parse_args()
    rng = random.Random(42)
    n, keys = args.rows, args.keys

    flat = flat_rows(n, keys, rng)
    debezium = debezium_rows(n, keys, rng)
    upserts = upsert_rows(n, keys, rng)
    retract = retract_changes(n, keys, rng)
    cases: list[tuple[str, int, Callable[[], Iterator[Any]], Callable[[], Iterator[Any]]]] = [
        (
            "from_changelog flat, default mapping (stateless)",
            n,
            lambda: from_changelog(flat),
            lambda: baseline_flat(flat),
        ),
        (
            "from_changelog Debezium u -> -U/+U + passthrough (stateless)",
            n,
            lambda: from_changelog(
                debezium,
                before="before",
                after="after",
                passthrough="ts_ms",
                op_mapping={"u": "UPDATE_BEFORE, UPDATE_AFTER"},
            ),
            lambda: baseline_debezium(debezium),
        ),
        (
            f"from_changelog upsert -> retract over {keys} keys (stateful)",
            n,
            lambda: from_changelog(
                upserts,
                partition_by="id",
                state_ttl=0,
                op_mapping={"upsert": "INSERT, UPDATE_BEFORE, UPDATE_AFTER"},
            ),
            lambda: baseline_upsert(upserts),
        ),
        (
            f"to_changelog -U/+U -> one 'u' over {keys} keys (stateful)",
            len(retract),
            lambda: to_changelog(
                retract,
                before="before",
                after="after",
                partition_by="id",
                op_mapping={"UPDATE_BEFORE, UPDATE_AFTER": "u"},
            ),
            lambda: baseline_combine(retract),
        ),
    ]
    print(
        f"engine benchmark: {n:,} input rows per case, {keys:,} keys; ratio = engine rows/s / baseline rows/s"
    )
    for name, rows_in, engine, baseline in cases:
        base_seconds, base_out = timed(baseline)
        engine_seconds, engine_out = timed(engine)
        assert engine_out == base_out, f"{name}: engine produced {engine_out} rows, baseline {base_out}"
        engine_rate, base_rate = rows_in / engine_seconds, rows_in / base_seconds
        print(
            f"  {name}\n    engine {engine_rate:>12,.0f} rows/s   raw loop {base_rate:>12,.0f} rows/s"
            f"   ratio {engine_rate / base_rate:.2f}"
        )


if __name__ == "__main__":
    main()
