"""Seeded DML on docker/postgres/10-inventory.sql's ``inventory.items``, and its contents as PostgreSQL
returns them.

Transactions of 1-6 statements (3 % rolled back): inserts (some re-using deleted ids), updates of the
small columns (the TOASTed ``body`` left alone, so Debezium sends it as unavailable under REPLICA
IDENTITY DEFAULT), updates of ``body`` (new out-of-line values), updates to NULL, deletes and
primary-key changes.
"""

# SQL is assembled from this module's constants and generated values, quoted by lit().
# ruff: noqa: S608

from __future__ import annotations

import json
import random
from typing import Any

from postgres_server import PostgresServer

ID_SPACE = 200
SEED_ROWS = 20  # the rows 10-inventory.sql inserts: ids 1..20
COLUMNS = ("id", "name", "qty", "active", "note", "body")
SCHEMA_DDL = "id INT NOT NULL, name STRING, qty INT, active BOOLEAN, note STRING, body STRING"
OPERATIONS = {
    "insert": 25,
    "update_small": 30,
    "update_body": 12,
    "update_null": 8,
    "delete": 10,
    "pk_change": 10,
}


def lit(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


class Workload:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)  # noqa: S311 - test data
        self.live = set(range(1, SEED_ROWS + 1))
        self.revision = 0
        self.committed = 0
        self.rolled_back = 0

    def body(self, row_id: int) -> str | None:
        self.revision += 1
        roll = self.rng.random()
        if roll < 0.1:
            return None
        head = f"[id {row_id} rev {self.revision}] "
        if roll < 0.25:
            return head + "inline"
        # over the ~2 kB TOAST threshold, and STORAGE EXTERNAL: out of line
        return (head + "toasted text keeps its value when other columns change. " * 80)[
            : self.rng.randint(2300, 4000)
        ]

    def small(self, name: str, row_id: int) -> Any:
        rng = self.rng
        if name == "name":
            return rng.choice((None, f"name-{row_id}-{rng.randint(0, 999)}", "naïve ✓", "it's"))
        if name == "qty":
            return rng.choice((None, rng.randint(-1000, 100_000)))
        if name == "active":
            return rng.choice((None, True, False))
        return rng.choice((None, "", "note", "line\nbreak", 'q"uote\\'))

    def statement(self, live: set[int]) -> str | None:
        rng = self.rng
        op = rng.choices(list(OPERATIONS), weights=list(OPERATIONS.values()))[0]
        free = sorted(set(range(1, ID_SPACE + 1)) - live)
        if op == "insert":
            row_id = rng.choice(free)
            values = [row_id, *(self.small(c, row_id) for c in COLUMNS[1:5]), self.body(row_id)]
            live.add(row_id)
            return (
                f"INSERT INTO inventory.items ({', '.join(COLUMNS)}) VALUES ({', '.join(map(lit, values))})"
            )
        if len(live) < 10:
            return None
        row_id = rng.choice(sorted(live))
        where = f" WHERE id = {row_id}"
        if op == "update_small":
            cols = rng.sample(COLUMNS[1:5], rng.randint(1, 3))
            return (
                "UPDATE inventory.items SET "
                + ", ".join(f"{c} = {lit(self.small(c, row_id))}" for c in cols)
                + where
            )
        if op == "update_body":
            return (
                f"UPDATE inventory.items SET body = {lit(self.body(row_id))}, qty = {rng.randint(0, 9)}"
                + where
            )
        if op == "update_null":
            return f"UPDATE inventory.items SET {rng.choice(COLUMNS[1:])} = NULL" + where
        if op == "delete":
            live.discard(row_id)
            return "DELETE FROM inventory.items" + where
        new_id = rng.choice(free)
        live.discard(row_id)
        live.add(new_id)
        extra = rng.choice(("", f", name = 'moved from {row_id}'"))
        return f"UPDATE inventory.items SET id = {new_id}{extra}" + where

    def transaction(self) -> str:
        live = set(self.live)
        statements: list[str] = []
        length = self.rng.randint(1, 6)
        while len(statements) < length:
            stmt = self.statement(live)
            if stmt is not None:
                statements.append(stmt + ";")
        if self.rng.random() < 0.03:
            self.rolled_back += 1
            return "BEGIN;\n" + "\n".join(statements) + "\nROLLBACK;\n"
        self.live = live
        self.committed += 1
        return "BEGIN;\n" + "\n".join(statements) + "\nCOMMIT;\n"

    def key_chain(self, row_id: int, moves: int) -> list[str]:
        """Transactions that move ``row_id`` to a new key ``moves`` times, each move followed by an update
        that leaves ``body`` alone: a source that sends them again after the key moved on must change
        nothing, and the unchanged TOAST value must survive every move."""
        assert row_id in self.live, row_id
        transactions = []
        for _ in range(moves):
            new_id = self.rng.choice(sorted(set(range(1, ID_SPACE + 1)) - self.live))
            self.live.discard(row_id)
            self.live.add(new_id)
            transactions.append(f"UPDATE inventory.items SET id = {new_id} WHERE id = {row_id};")
            transactions.append(
                f"UPDATE inventory.items SET qty = {self.rng.randint(0, 99)} WHERE id = {new_id};"
            )
            row_id = new_id
        self.committed += len(transactions)
        return transactions


def table_rows(pg: PostgresServer, db: str) -> list[dict[str, Any]]:
    """PostgreSQL's own SELECT of ``inventory.items``, by id."""
    text = pg.psql("SELECT coalesce(json_agg(to_jsonb(t) ORDER BY id), '[]') FROM inventory.items t;", db=db)
    rows: list[dict[str, Any]] = json.loads(text)
    return rows
