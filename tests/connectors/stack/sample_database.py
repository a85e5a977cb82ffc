"""docker/postgres/10-inventory.sql's other tables (``inventory.items`` has workload.py): seeded DML on
them, the schema changes of a running database, and each table as PostgreSQL and as Delta hold it.

The DML picks its rows in SQL (``... WHERE key = (SELECT key ... OFFSET n LIMIT 1)``) and inserts with
``ON CONFLICT DO NOTHING``, so it needs no model of the table: PostgreSQL's SELECT is the truth the Delta
tables are compared with.
"""

# SQL is assembled from this module's constants and generated values.
# ruff: noqa: S608

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from postgres_server import PostgresServer

SEED_ROWS = {"items": 20, "customers": 8, "order_lines": 12, "readings": 10, "stock": 6}
"""The rows 10-inventory.sql inserts into each table."""
DELTA_TYPES = {
    "items": {"id": pa.int32(), "qty": pa.int32(), "body": pa.string()},
    "customers": {"email": pa.string(), "vip": pa.bool_(), "since": pa.date32()},
    "order_lines": {"order_id": pa.int64(), "line_no": pa.int16(), "amount": pa.decimal128(12, 2)},
    "readings": {
        "id": pa.int64(),
        "value": pa.float64(),
        "taken_at": pa.timestamp("us"),
        "unit": pa.string(),
    },
    "stock": {"warehouse": pa.int16(), "units": pa.int64(), "counted_at": pa.timestamp("us", tz="UTC")},
    "shipments": {"order_id": pa.int64(), "shipped_at": pa.timestamp("us", tz="UTC")},
}
"""The Delta column each PostgreSQL type lands as: integer/smallint/bigint(serial) as int32/int16/int64,
numeric(12,2) as decimal(12,2), date as date, double precision as double, timestamp as a timestamp
without zone, timestamptz as an instant (UTC), text and varchar as strings; stock.units after its
widening to bigint. (The row comparison converts PostgreSQL's values to the Delta column's type, so
the types are checked here.)"""
KEYS = {
    "items": ("id",),
    "customers": ("email",),
    "order_lines": ("order_id", "line_no"),
    "readings": ("id",),
    "stock": ("sku",),
    "shipments": ("id",),
}


def nth(table: str, key: str, rng: random.Random) -> str:
    """A row of ``table`` picked in SQL: ``key`` of its ``n``-th row by key (none past the end)."""
    return f"(SELECT {key} FROM inventory.{table} ORDER BY {key} OFFSET {rng.randint(0, 7)} LIMIT 1)"


class DatabaseWorkload:
    """Statements on customers, order_lines, readings, stock (and shipments once :meth:`new_table` ran):
    inserts, updates, deletes, key changes. After :meth:`widen`, stock's units go past 32 bits."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)  # noqa: S311 - test data
        self.tables = ["customers", "order_lines", "readings", "stock"]
        self.wide_units = False
        self.has_unit = False
        self.moves = 0

    def customers(self) -> str:
        rng = self.rng
        roll = rng.random()
        email = f"'c{rng.randint(1, 40)}@example.com'"
        if roll < 0.35:
            since = f"DATE '2021-01-01' + {rng.randint(0, 2000)}"
            return (
                f"INSERT INTO inventory.customers VALUES ({email}, 'new {rng.randint(0, 99)}', "
                f"{rng.choice(('true', 'false', 'NULL'))}, {since}) ON CONFLICT DO NOTHING"
            )
        row = nth("customers", "email", rng)
        if roll < 0.75:
            flip = "vip = NOT coalesce(vip, false), since = NULL"
            return f"UPDATE inventory.customers SET {flip} WHERE email = {row}"
        if roll < 0.9:
            return f"DELETE FROM inventory.customers WHERE email = {row}"
        self.moves += 1
        return f"UPDATE inventory.customers SET email = 'moved{self.moves}@example.com' WHERE email = {row}"

    def order_lines(self) -> str:
        rng = self.rng
        roll = rng.random()
        order, line = 1000 + rng.randint(0, 12), rng.randint(1, 4)
        if roll < 0.4:
            amount = Decimal(rng.randint(-99_999, 9_999_999)) / 100
            return (
                f"INSERT INTO inventory.order_lines VALUES ({order}, {line}, 'SKU-{rng.randint(0, 9)}', "
                f"{amount}) ON CONFLICT DO NOTHING"
            )
        row = nth("order_lines", "order_id * 10 + line_no", rng)
        if roll < 0.8:
            value = rng.choice(("NULL", str(Decimal(rng.randint(0, 10**12 - 1)) / 100)))
            return f"UPDATE inventory.order_lines SET amount = {value} WHERE order_id * 10 + line_no = {row}"
        return f"DELETE FROM inventory.order_lines WHERE order_id * 10 + line_no = {row}"

    def readings(self) -> str:
        rng = self.rng
        roll = rng.random()
        value = rng.choice(("NULL", repr(rng.uniform(-1e6, 1e6)), "0.1", "-0.0", "1e300"))
        if roll < 0.45:
            unit = f", '{rng.choice(('C', 'F', 'K'))}'" if self.has_unit else ""
            columns = "sensor, value, taken_at" + (", unit" if self.has_unit else "")
            stamp = f"TIMESTAMP '2026-03-01 00:00:00' + {rng.randint(0, 10**9)} * INTERVAL '1 microsecond'"
            values = f"{rng.randint(0, 9)}, {value}, {stamp}{unit}"
            return f"INSERT INTO inventory.readings ({columns}) VALUES ({values})"
        row = nth("readings", "id", rng)
        if roll < 0.85:
            unit = f", unit = '{rng.choice(('C', 'F'))}'" if self.has_unit and rng.random() < 0.5 else ""
            return f"UPDATE inventory.readings SET value = {value}{unit} WHERE id = {row}"
        return f"DELETE FROM inventory.readings WHERE id = {row}"

    def stock(self) -> str:
        rng = self.rng
        roll = rng.random()
        units = (
            rng.randint(5_000_000_000, 9_000_000_000) if self.wide_units else rng.randint(-(2**31), 2**31 - 1)
        )
        if roll < 0.3:
            return (
                f"INSERT INTO inventory.stock VALUES ('SKU-{rng.randint(0, 30)}', {rng.randint(1, 3)}, "
                f"{units}, now()) ON CONFLICT DO NOTHING"
            )
        row = nth("stock", "sku", rng)
        if roll < 0.8:
            return f"UPDATE inventory.stock SET units = {units}, counted_at = now() WHERE sku = {row}"
        if roll < 0.9:
            self.moves += 1
            return f"UPDATE inventory.stock SET sku = 'MOVED-{self.moves}' WHERE sku = {row}"
        return f"DELETE FROM inventory.stock WHERE sku = {row}"

    def shipments(self) -> str:
        rng = self.rng
        row_id = rng.randint(1, 30)
        if rng.random() < 0.6:
            return (
                f"INSERT INTO inventory.shipments VALUES ({row_id}, {1000 + rng.randint(0, 12)}, "
                f"'{rng.choice(('post', 'rail', 'air'))}', now()) ON CONFLICT DO NOTHING"
            )
        if rng.random() < 0.7:
            return (
                f"UPDATE inventory.shipments SET carrier = 'rerouted', shipped_at = NULL WHERE id = {row_id}"
            )
        return f"DELETE FROM inventory.shipments WHERE id = {row_id}"

    def transaction(self) -> str:
        statements = [
            getattr(self, self.rng.choice(self.tables))() + ";" for _ in range(self.rng.randint(1, 4))
        ]
        return "BEGIN;\n" + "\n".join(statements) + "\nCOMMIT;\n"

    def new_table(self) -> str:
        self.tables.append("shipments")
        return (
            "CREATE TABLE inventory.shipments (id integer PRIMARY KEY, order_id bigint, carrier text, "
            "shipped_at timestamptz);\n"
            "INSERT INTO inventory.shipments VALUES (1, 1000, 'post', '2026-05-01 10:00:00+02');\n"
        )

    def add_column(self) -> str:
        self.has_unit = True
        return (
            "ALTER TABLE inventory.readings ADD COLUMN unit varchar(8);\n"
            "UPDATE inventory.readings SET unit = 'C' WHERE id % 2 = 0;\n"
        )

    def widen(self) -> str:
        self.wide_units = True
        return (
            "ALTER TABLE inventory.stock ALTER COLUMN units TYPE bigint;\n"
            "UPDATE inventory.stock SET units = units + 4000000000 WHERE warehouse = 1;\n"
        )


def postgres_rows(pg: PostgresServer, db: str, table: str) -> list[dict[str, Any]]:
    """PostgreSQL's own SELECT of ``inventory.<table>``, JSON numbers read as Decimal."""
    text = pg.psql(f"SELECT coalesce(json_agg(to_jsonb(t)), '[]') FROM inventory.{table} t;", db=db)
    rows: list[dict[str, Any]] = json.loads(text, parse_float=Decimal)
    return rows


def comparable(row: dict[str, Any], schema: pa.Schema) -> dict[str, Any]:
    """A row of :func:`postgres_rows` with each value as Delta's column type reads back in Python."""
    out = {}
    for name, value in row.items():
        kind = schema.field(name).type if name in schema.names else None
        if value is not None and kind is not None:
            if pa.types.is_floating(kind):
                value = float(value)
            elif pa.types.is_date(kind):
                value = dt.date.fromisoformat(value)
            elif pa.types.is_timestamp(kind):
                value = dt.datetime.fromisoformat(value)
        out[name] = value
    return out


def by_key(table: str) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    return lambda row: tuple(row[k] for k in KEYS[table])


def delta_rows(target: Path, table: str) -> tuple[pa.Schema, list[dict[str, Any]]] | None:
    if not (target / "_delta_log").is_dir():
        return None
    data = DeltaTable(str(target)).to_pyarrow_table()
    return data.schema, sorted(data.to_pylist(), key=by_key(table))


def difference(pg: PostgresServer, db: str, table: str, target: Path) -> str | None:
    """Why the Delta table at ``target`` is not PostgreSQL's ``inventory.<table>`` (None: it is)."""
    delta = delta_rows(target, table)
    if delta is None:
        return "no Delta table yet"
    schema, got = delta
    want = sorted((comparable(row, schema) for row in postgres_rows(pg, db, table)), key=by_key(table))
    columns = sorted(want[0]) if want else None
    if columns is not None and sorted(schema.names) != columns:
        return f"Delta columns {sorted(schema.names)}, PostgreSQL's {columns}"
    if got == want:
        return None
    mine, theirs = {by_key(table)(r): r for r in want}, {by_key(table)(r): r for r in got}
    changed = [(k, mine[k], theirs[k]) for k in sorted(mine.keys() & theirs.keys()) if mine[k] != theirs[k]]
    return (
        f"{len(want)} rows in PostgreSQL, {len(got)} in Delta; missing keys "
        f"{sorted(mine.keys() - theirs.keys())[:5]}, extra {sorted(theirs.keys() - mine.keys())[:5]}, "
        f"differing (postgres, delta): {str(changed[:2])[:1200]}"
    )
