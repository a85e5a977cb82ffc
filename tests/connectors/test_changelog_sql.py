"""Spec 4.1–4.5 as SQL text: FROM_CHANGELOG / TO_CHANGELOG through ``spark.sql`` equal the engine.

Each example of the spec is written as Spark SQL (the spellings Spark lacks are rewritten as
docs/sql.md says: ``TABLE(t)``, ``'field'`` for ``DESCRIPTOR(field)``, ``map(...)`` for ``MAP[...]``,
and the key / event time / input order as ``partition_by`` / ``order_by`` / ``on_time`` /
``sequence_by`` arguments where the call keeps state). Its input is a temporary view; the expected
output is the engine's (:mod:`cdcflow.core`, called with Python arguments written out here) over the
same rows in ``seq`` order. A keyed call returns each key's rows together: both sides are then
compared per key, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from pyspark.errors import AnalysisException, PythonException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as st

from cdcflow import Change, InvalidOperationError, NullKeyError, RowKind, from_changelog, to_changelog
from cdcflow.connectors.spark.changelog.sql import register_functions

Row = dict[str, Any]
Engine = Callable[[list[Row]], list[Row]]

DEBEZIUM_MAP = "map('c, r', 'INSERT', 'd', 'DELETE', 'u', 'UPDATE_AFTER')"
DEBEZIUM = {"c, r": "INSERT", "d": "DELETE", "u": "UPDATE_AFTER"}
DEBEZIUM_RETRACT_MAP = "map('c, r', 'INSERT', 'd', 'DELETE', 'u', 'UPDATE_BEFORE, UPDATE_AFTER')"
DEBEZIUM_RETRACT = {"c, r": "INSERT", "d": "DELETE", "u": "UPDATE_BEFORE, UPDATE_AFTER"}
CDU_MAP = "map('c', 'INSERT', 'd', 'DELETE', 'u', 'UPDATE_AFTER')"
CDU = {"c": "INSERT", "d": "DELETE", "u": "UPDATE_AFTER"}
TO_CDU_MAP = "map('INSERT', 'c', 'DELETE', 'd', 'UPDATE_AFTER', 'u')"
TO_CDU = {"INSERT": "c", "DELETE": "d", "UPDATE_AFTER": "u"}
TO_COMBINED_MAP = "map('INSERT', 'c', 'DELETE', 'd', 'UPDATE_BEFORE, UPDATE_AFTER', 'u')"
TO_COMBINED = {"INSERT": "c", "DELETE": "d", "UPDATE_BEFORE, UPDATE_AFTER": "u"}


@dataclass(frozen=True)
class Table:
    """A temporary view: its columns (Spark DDL) and rows (``seq``, when present, is the order)."""

    schema: str
    rows: list[Row]


@dataclass(frozen=True)
class Case:
    id: str
    sql: str
    tables: dict[str, Table]
    engine: Engine
    key: Callable[[Row], Any] | None = None  # keyed output comes per key: compare per key
    input: str = field(default="")

    def input_rows(self) -> list[Row]:
        name = self.input or next(iter(self.tables))
        return ordered(self.tables[name].rows)


def ordered(rows: list[Row]) -> list[Row]:
    """The rows in ``seq`` order, without ``seq``: what the engine is fed."""
    if rows and "seq" in rows[0]:
        rows = sorted(rows, key=lambda row: row["seq"])
    return [{k: v for k, v in row.items() if k != "seq"} for row in rows]


def engine_from(**params: Any) -> Engine:
    def run(rows: list[Row]) -> list[Row]:
        return [{**c.row, "_row_kind": c.kind.value} for c in from_changelog(rows, **params)]

    return run


def engine_to(**params: Any) -> Engine:
    def run(rows: list[Row]) -> list[Row]:
        changes = [
            Change(RowKind(row["_row_kind"]), {k: v for k, v in row.items() if k != "_row_kind"})
            for row in rows
        ]
        return list(to_changelog(changes, **params))

    return run


def by(*names: str) -> Callable[[Row], Any]:
    return lambda row: tuple(row[name] for name in names)


def in_image(name: str, *images: str) -> Callable[[Row], Any]:
    """The key inside the first non-NULL image (a nested envelope's)."""
    return lambda row: next(row[i][name] for i in images if row[i] is not None)


def t(hhmm: str) -> datetime:
    hours, minutes = hhmm.split(":")
    return datetime(2024, 1, 1, int(hours), int(minutes))


FLAT = "op STRING, id INT, name STRING"
NAME_IMAGE = "STRUCT<id: INT, name: STRING>"
VAL_IMAGE = "STRUCT<id: INT, val: INT>"


def flat_stream() -> Table:
    return Table(FLAT, [{"op": "INSERT", "id": 5, "name": "name"}, {"op": "DELETE", "id": 5, "name": "name"}])


def changes(schema: str, *rows: tuple[Any, ...]) -> Table:
    """A changelog view: ``_row_kind``, ``seq``, then the columns of ``schema``."""
    names = ["_row_kind", "seq", *(part.split()[0] for part in schema.split(", "))]
    return Table(
        f"_row_kind STRING, seq INT, {schema}",
        [dict(zip(names, (kind, seq, *values), strict=True)) for seq, (kind, *values) in enumerate(rows)],
    )


def envelopes(schema: str, *rows: tuple[Any, ...]) -> Table:
    """An envelope view: ``seq``, then the columns of ``schema``."""
    names = ["seq", *(part.split(" ")[0] for part in _columns(schema))]
    return Table(
        f"seq INT, {schema}",
        [dict(zip(names, (seq, *values), strict=True)) for seq, values in enumerate(rows)],
    )


def _columns(schema: str) -> list[str]:
    """Top-level column definitions of a DDL string (commas inside STRUCT<...> are not splits)."""
    parts, depth, current = [], 0, ""
    for char in schema:
        depth += char == "<"
        depth -= char == ">"
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [*parts, current.strip()]


def image(id_: int, name: str | None = None) -> Row:
    return {"id": id_, "name": name}


def vals(id_: int, val: int | None) -> Row:
    return {"id": id_, "val": val}


NESTED = f"op STRING, partition_key INT, before {NAME_IMAGE}, after {NAME_IMAGE}"
NESTED_ROWS = (
    ("c", 1, None, image(1, "Alice")),
    ("r", 2, None, image(2, "Bob")),
    ("u", 1, image(1, "Alice"), image(1, "Alice Updated")),
    ("d", 2, image(2, "Bob"), None),
)
AFTER_ONLY_ROWS = (
    ("c", 1, None, image(1, "Alice")),
    ("u", 1, None, image(1, "Alice Updated")),
    ("r", 2, None, image(2, "Bob")),
    ("u", 1, None, image(1, "Alice Final")),
    ("d", 2, image(2, "Bob"), None),
)
OPS = "__op STRING, partition_key INT, name STRING"
OPS_ROWS = (("c", 1, "Alice"), ("u", 1, "Alice Updated"), ("r", 2, "Bob"), ("u", 1, "Final"), ("d", 2, "Bob"))
DELETION_FLAG_ROWS = ((False, 1, "A"), (False, 1, "A2"), (False, 2, "B"), (True, 1, "A2"), (False, 1, "A3"))
TTL = {"state_ttl": timedelta(minutes=10)}

FROM_CASES = [
    Case(
        "4.1.1",
        "SELECT * FROM FROM_CHANGELOG(input => TABLE(flat_stream))",
        {"flat_stream": flat_stream()},
        engine_from(),
    ),
    Case(
        "4.1.2.1.1",
        "SELECT * FROM FROM_CHANGELOG(input => TABLE(flat_stream), op => 'type')",
        {
            "flat_stream": Table(
                "type STRING, id INT, name STRING",
                [{"type": "INSERT", "id": 5, "name": "name"}, {"type": "DELETE", "id": 5, "name": "name"}],
            )
        },
        engine_from(op="type"),
    ),
    Case(
        "4.1.2.1.1-descriptor-text",
        "SELECT * FROM FROM_CHANGELOG(input => TABLE(flat_stream), op => 'DESCRIPTOR(type)')",
        {
            "flat_stream": Table(
                "type STRING, id INT, name STRING",
                [{"type": "INSERT", "id": 5, "name": "name"}, {"type": "DELETE", "id": 5, "name": "name"}],
            )
        },
        engine_from(op="type"),
    ),
    Case(
        "4.1.2.1.2",
        """SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream),
            before => 'before',
            after => 'after',
            op_mapping => map('u', 'UPDATE_BEFORE, UPDATE_AFTER'))""",
        {
            "cdc_stream": Table(
                f"op STRING, before {NAME_IMAGE}, after {NAME_IMAGE}",
                [{"op": "u", "before": image(5, "old"), "after": image(5, "new")}],
            )
        },
        engine_from(before="before", after="after", op_mapping={"u": "UPDATE_BEFORE, UPDATE_AFTER"}),
    ),
    Case(
        "4.1.2.2.1",  # the watermark's late-record drop needs a stream: here one window, the batch
        """SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream), partition_by => 'id', order_by => 'event_time')""",
        {
            "cdc_stream": Table(
                "op STRING, id INT, name STRING, event_time TIMESTAMP",
                [
                    {"op": "INSERT", "id": 6, "name": "A", "event_time": t("10:05")},
                    {"op": "INSERT", "id": 5, "name": "B", "event_time": t("09:55")},
                    {"op": "INSERT", "id": 7, "name": "C", "event_time": t("10:11")},
                ],
            )
        },
        engine_from(partition_by="id", order_by="event_time"),
        key=by("id"),
    ),
    Case(
        "4.1.2.2.2",
        """SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream),
            partition_by => 'id',
            sequence_by => 'seq',
            uid => 'upsert-unzip-example',
            state_ttl => INTERVAL '5' MINUTE,
            op_mapping => map(
                'upsert', 'INSERT, UPDATE_BEFORE, UPDATE_AFTER',
                'delete', 'DELETE'
            ))""",
        {
            "cdc_stream": envelopes(
                FLAT,
                ("upsert", 99, "Orphan"),
                ("upsert", 7, "Other"),
                ("upsert", 99, "Orphan Updated"),
                ("delete", 99, "Orphan Updated"),
                ("upsert", 99, "Resurrected"),
            )
        },
        engine_from(
            partition_by="id",
            state_ttl=timedelta(minutes=5),
            uid="upsert-unzip-example",
            op_mapping={"upsert": "INSERT, UPDATE_BEFORE, UPDATE_AFTER", "delete": "DELETE"},
        ),
        key=by("id"),
    ),
    Case(
        "4.1.2.2.3",  # one window: each key's changes compacted at the end of the batch
        """SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream), partition_by => 'id', order_by => 'event_time')""",
        {
            "cdc_stream": Table(
                "op STRING, id INT, name STRING, event_time TIMESTAMP",
                [
                    {"op": "INSERT", "id": 5, "name": "A", "event_time": t("09:55")},
                    {"op": "UPDATE_AFTER", "id": 5, "name": "Updated A", "event_time": t("09:57")},
                    {"op": "UPDATE_AFTER", "id": 5, "name": "Between updates A", "event_time": t("09:56")},
                    {"op": "INSERT", "id": 6, "name": "B", "event_time": t("10:20")},
                ],
            )
        },
        engine_from(partition_by="id", order_by="event_time"),
        key=by("id"),
    ),
    Case(
        "4.1.2.3.1",
        f"""SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream) PARTITION BY id ORDER BY seq,
            sequence_by => 'seq',
            uid => 'partial-delete-example',
            op_mapping => {CDU_MAP})""",
        {"cdc_stream": envelopes(FLAT, ("c", 5, "Alice"), ("c", 6, "Bob"), ("d", 5, None))},
        engine_from(op_mapping=CDU, uid="partial-delete-example"),
        key=by("id"),
    ),
    Case(
        "4.1.2.3.2",
        f"""SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream) PARTITION BY id ORDER BY seq,
            sequence_by => 'seq',
            uid => 'full-delete-example',
            consume_full_deletes => true,
            op_mapping => {CDU_MAP})""",
        {
            "cdc_stream": envelopes(
                "op STRING, id INT, name STRING, age INT", ("c", 5, "Alice", 30), ("d", 5, "Alice", 30)
            )
        },
        engine_from(op_mapping=CDU, consume_full_deletes=True, uid="full-delete-example"),
        key=by("id"),
    ),
    Case(
        "4.1.2.4.1",
        f"""SELECT * FROM FROM_CHANGELOG(
            input => TABLE(debezium_source) PARTITION BY id ORDER BY seq,
            sequence_by => 'seq',
            before => 'before',
            after => 'after',
            passthrough => 'ts_ms',
            op_mapping => {DEBEZIUM_MAP})""",
        {
            "debezium_source": envelopes(
                f"op STRING, id INT, ts_ms BIGINT, before {NAME_IMAGE}, after {NAME_IMAGE}",
                ("c", 1, 1234, None, image(1, "Alice")),
                ("u", 1, 1240, image(1, "Alice"), image(1, "Alicia")),
            )
        },
        engine_from(before="before", after="after", passthrough="ts_ms", op_mapping=DEBEZIUM),
        key=by("id"),
    ),
    Case(
        "4.1.2.5",
        f"""SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream),
            partition_by => 'partition_key',
            order_by => 'event_time',
            uid => 'my-cdc-ptf',
            before => 'DESCRIPTOR(before)',
            after => 'DESCRIPTOR(after)',
            op => 'DESCRIPTOR(op)',
            state_ttl => INTERVAL '10' MINUTE,
            consume_full_deletes => false,
            passthrough => 'DESCRIPTOR(field1, field2)',
            op_mapping => {DEBEZIUM_RETRACT_MAP},
            invalid_op_handling => 'FAIL')""",
        {
            "cdc_stream": Table(
                "op STRING, field1 STRING, field2 INT, event_time TIMESTAMP, "
                "before STRUCT<partition_key: INT, name: STRING>, "
                "after STRUCT<partition_key: INT, name: STRING>",
                [
                    {
                        "op": "c",
                        "field1": "x",
                        "field2": 1,
                        "event_time": t("10:00"),
                        "before": None,
                        "after": {"partition_key": 1, "name": "A"},
                    },
                    {
                        "op": "u",
                        "field1": "y",
                        "field2": 2,
                        "event_time": t("10:02"),
                        "before": {"partition_key": 1, "name": "A"},
                        "after": {"partition_key": 1, "name": "B"},
                    },
                    {
                        "op": "r",
                        "field1": "z",
                        "field2": 3,
                        "event_time": t("10:01"),
                        "before": None,
                        "after": {"partition_key": 2, "name": "C"},
                    },
                    {
                        "op": "d",
                        "field1": "w",
                        "field2": 4,
                        "event_time": t("10:03"),
                        "before": {"partition_key": 2, "name": "C"},
                        "after": None,
                    },
                ],
            )
        },
        engine_from(
            partition_by="partition_key",
            order_by="event_time",
            uid="my-cdc-ptf",
            before="before",
            after="after",
            op="op",
            state_ttl=timedelta(minutes=10),
            consume_full_deletes=False,
            passthrough=["field1", "field2"],
            op_mapping=DEBEZIUM_RETRACT,
            invalid_op_handling="FAIL",
        ),
        key=by("partition_key"),
    ),
    Case(
        "4.1.3.1",
        f"""SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream) PARTITION BY partition_key ORDER BY seq,
            sequence_by => 'seq',
            uid => 'my-cdc-ptf',
            op => '__op',
            op_mapping => {DEBEZIUM_MAP})""",
        {"cdc_stream": envelopes(OPS, *OPS_ROWS)},
        engine_from(op="__op", op_mapping=DEBEZIUM),
        key=by("partition_key"),
    ),
    Case(
        "4.1.3.2",
        f"""SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream) PARTITION BY partition_key ORDER BY seq,
            sequence_by => 'seq',
            uid => 'my-cdc-ptf',
            before => 'before',
            after => 'after',
            op_mapping => {DEBEZIUM_RETRACT_MAP})""",
        {"cdc_stream": envelopes(NESTED, *NESTED_ROWS)},
        engine_from(before="before", after="after", op_mapping=DEBEZIUM_RETRACT),
        key=by("id"),
    ),
    Case(
        "4.1.3.3",
        f"""SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream) PARTITION BY partition_key ORDER BY seq,
            sequence_by => 'seq',
            uid => 'my-cdc-ptf',
            before => 'before',
            after => 'after',
            op_mapping => {DEBEZIUM_MAP})""",
        {"cdc_stream": envelopes(NESTED, *NESTED_ROWS)},
        engine_from(before="before", after="after", op_mapping=DEBEZIUM),
        key=by("id"),
    ),
    Case(
        "4.1.3.4",
        f"""SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream) PARTITION BY partition_key ORDER BY seq,
            sequence_by => 'seq',
            uid => 'my-cdc-ptf',
            before => 'before',
            after => 'after',
            op_mapping => {DEBEZIUM_MAP})""",
        {"cdc_stream": envelopes(NESTED, *AFTER_ONLY_ROWS)},
        engine_from(before="before", after="after", op_mapping=DEBEZIUM),
        key=by("id"),
    ),
    Case(
        "4.1.3.5",
        f"""SELECT * FROM FROM_CHANGELOG(
            input => TABLE(upsert_source) PARTITION BY id ORDER BY seq,
            sequence_by => 'seq',
            uid => 'partial-delete-consumer',
            op_mapping => {CDU_MAP})""",
        {"upsert_source": envelopes(FLAT, ("c", 5, "Alice"), ("u", 5, "Alicia"), ("d", 5, None))},
        engine_from(op_mapping=CDU),
        key=by("id"),
    ),
    Case(
        "4.1.3.6",
        f"""SELECT * FROM FROM_CHANGELOG(
            input => TABLE(debezium_source) PARTITION BY id ORDER BY seq,
            sequence_by => 'seq',
            uid => 'full-delete-consumer',
            consume_full_deletes => true,
            op_mapping => {CDU_MAP})""",
        {
            "debezium_source": envelopes(
                "op STRING, id INT, name STRING, age INT", ("c", 5, "Alice", 30), ("d", 5, "Alice", 30)
            )
        },
        engine_from(op_mapping=CDU, consume_full_deletes=True),
        key=by("id"),
    ),
    Case(
        "4.1.3.7",
        """SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream),
            partition_by => 'partition_key',
            sequence_by => 'seq',
            uid => 'my-cdc-ptf',
            op => 'deleted',
            state_ttl => INTERVAL '10' MINUTE,
            op_mapping => map(
                'false', 'INSERT, UPDATE_BEFORE, UPDATE_AFTER',
                'true', 'DELETE'
            ))""",
        {"cdc_stream": envelopes("deleted BOOLEAN, partition_key INT, name STRING", *DELETION_FLAG_ROWS)},
        engine_from(
            op="deleted",
            partition_by="partition_key",
            op_mapping={"false": "INSERT, UPDATE_BEFORE, UPDATE_AFTER", "true": "DELETE"},
            **TTL,
        ),
        key=by("partition_key"),
    ),
    Case(
        "4.1.3.8",
        """SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream),
            partition_by => 'partition_key',
            sequence_by => 'seq',
            uid => 'my-cdc-ptf',
            op => 'deleted',
            state_ttl => INTERVAL '10' MINUTE,
            op_mapping => map(
                'false', 'INSERT, UPDATE_AFTER',
                'true', 'DELETE'
            ))""",
        {
            "cdc_stream": envelopes(
                "deleted STRING, partition_key INT, name STRING",
                *((str(d).lower(), k, n) for d, k, n in DELETION_FLAG_ROWS),
            )
        },
        engine_from(
            op="deleted",
            partition_by="partition_key",
            op_mapping={"false": "INSERT, UPDATE_AFTER", "true": "DELETE"},
            **TTL,
        ),
        key=by("partition_key"),
    ),
    Case(
        "4.1.3.9",
        f"""SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream),
            partition_by => 'partition_key',
            sequence_by => 'seq',
            uid => 'my-cdc-ptf',
            op => '__op',
            state_ttl => INTERVAL '10' MINUTE,
            op_mapping => {DEBEZIUM_RETRACT_MAP})""",
        {"cdc_stream": envelopes(OPS, *OPS_ROWS)},
        engine_from(op="__op", partition_by="partition_key", op_mapping=DEBEZIUM_RETRACT, **TTL),
        key=by("partition_key"),
    ),
    Case(
        "4.1.3.10",
        f"""SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream),
            partition_by => 'id',
            sequence_by => 'seq',
            uid => 'my-cdc-ptf',
            before => 'before',
            after => 'after',
            state_ttl => INTERVAL '10' MINUTE,
            op_mapping => {DEBEZIUM_RETRACT_MAP})""",
        {
            "cdc_stream": envelopes(
                f"op STRING, before {NAME_IMAGE}, after {NAME_IMAGE}",
                *((op, b, a) for op, _, b, a in AFTER_ONLY_ROWS),
            )
        },
        engine_from(before="before", after="after", partition_by="id", op_mapping=DEBEZIUM_RETRACT, **TTL),
        key=by("id"),
    ),
    Case(
        "4.1.3.11",
        f"""SELECT * FROM FROM_CHANGELOG(
            input => TABLE(debezium_source) PARTITION BY (user_id, tenant_id) ORDER BY seq,
            sequence_by => 'seq',
            before => 'before',
            after => 'after',
            passthrough => 'ts_ms',
            op_mapping => {DEBEZIUM_MAP})""",
        {
            "debezium_source": envelopes(
                "op STRING, user_id INT, tenant_id INT, ts_ms BIGINT, "
                "before STRUCT<user_id: INT, tenant_id: INT, name: STRING>, "
                "after STRUCT<user_id: INT, tenant_id: INT, name: STRING>",
                ("c", 1, 7, 1234, None, {"user_id": 1, "tenant_id": 7, "name": "Alice"}),
                ("c", 1, 8, 1235, None, {"user_id": 1, "tenant_id": 8, "name": "Ann"}),
                ("d", 1, 7, 1236, {"user_id": 1, "tenant_id": 7, "name": "Alice"}, None),
            )
        },
        engine_from(before="before", after="after", passthrough="ts_ms", op_mapping=DEBEZIUM),
        key=by("user_id", "tenant_id"),
    ),
]

KINDS = "id INT, name STRING"
ALICE = (
    ("+I", 5, "name"),
    ("-U", 5, "name"),
    ("+U", 5, "updated_name"),
    ("+I", 6, "other"),
    ("-D", 5, "updated_name"),
)
ALICE_AGE = (("+I", 5, "Alice", 30), ("+U", 5, "Alice", 31), ("-D", 5, "Alice", 31))

TO_CASES = [
    Case(
        "4.2.1.1",
        "SELECT * FROM TO_CHANGELOG(input => TABLE(t))",
        {
            "t": Table(
                "_row_kind STRING, id INT, name STRING",
                [
                    {"_row_kind": "+I", "id": 5, "name": "name"},
                    {"_row_kind": "+U", "id": 5, "name": "updated_name"},
                    {"_row_kind": "-D", "id": 5, "name": "updated_name"},
                ],
            )
        },
        engine_to(),
    ),
    Case(
        "4.2.1.2.1",
        "SELECT * FROM TO_CHANGELOG(input => TABLE(t) PARTITION BY id ORDER BY seq, sequence_by => 'seq')",
        {"t": changes(KINDS, *ALICE)},
        engine_to(),
        key=by("id"),
    ),
    Case(
        "4.2.1.2.2",
        f"""SELECT * FROM TO_CHANGELOG(
            input => TABLE(t),
            sequence_by => 'seq',
            before => 'before_state',
            after => 'after_state',
            op_mapping => {TO_COMBINED_MAP})""",
        {"t": changes(KINDS, ("-U", 5, "old"), ("+U", 5, "new"))},
        engine_to(before="before_state", after="after_state", op_mapping=TO_COMBINED),
    ),
    Case(
        "4.2.1.3.1",
        """SELECT * FROM TO_CHANGELOG(
            input => TABLE(t),
            sequence_by => 'seq',
            state_ttl => INTERVAL '5' MINUTE,
            op_mapping => map(
                'INSERT', 'INSERT',
                'DELETE', 'DELETE',
                'UPDATE_BEFORE, UPDATE_AFTER', 'UPDATE'
            ))""",
        {"t": changes("id INT, val INT", ("-U", 1, 10), ("+U", 1, 20))},
        engine_to(
            state_ttl=timedelta(minutes=5),
            op_mapping={"INSERT": "INSERT", "DELETE": "DELETE", "UPDATE_BEFORE, UPDATE_AFTER": "UPDATE"},
        ),
    ),
    Case(
        "4.2.1.3.2",  # one window: each key's changes compacted at the end of the batch
        f"""SELECT * FROM TO_CHANGELOG(
            input => TABLE(t),
            partition_by => 'id',
            on_time => 'event_time',
            sequence_by => 'seq',
            state_ttl => INTERVAL '7' DAY,
            before => 'before_state',
            after => 'after_state',
            op_mapping => {TO_COMBINED_MAP})""",
        {
            "t": changes(
                "id INT, name STRING, event_time TIMESTAMP",
                ("+I", 5, "Alice", t("10:05")),
                ("-U", 5, "Alice", t("10:06")),
                ("+U", 5, "Alice Updated", t("10:06")),
                ("+I", 6, "Bob", t("10:30")),
                ("-U", 5, "Alice Updated", t("10:50")),
                ("+U", 5, "Alice Final", t("10:50")),
                ("+I", 7, "Carol", t("11:10")),
            )
        },
        engine_to(
            partition_by="id",
            on_time="event_time",
            state_ttl=timedelta(days=7),
            before="before_state",
            after="after_state",
            op_mapping=TO_COMBINED,
        ),
        key=in_image("id", "after_state", "before_state"),
    ),
    Case(
        "4.2.1.4.1",
        f"""SELECT * FROM TO_CHANGELOG(
            input => TABLE(dynamic_table) PARTITION BY id ORDER BY seq,
            sequence_by => 'seq',
            partition_by => 'id',
            op_mapping => {TO_CDU_MAP})""",
        {"dynamic_table": changes("id INT, name STRING, age INT", *ALICE_AGE)},
        engine_to(partition_by="id", op_mapping=TO_CDU),
        key=by("id"),
    ),
    Case(
        "4.2.1.4.2",
        f"""SELECT * FROM TO_CHANGELOG(
            input => TABLE(dynamic_table) PARTITION BY id ORDER BY seq,
            sequence_by => 'seq',
            partition_by => 'id',
            produces_full_deletes => true,
            op_mapping => {TO_CDU_MAP})""",
        {"dynamic_table": changes("id INT, name STRING, age INT", *ALICE_AGE)},
        engine_to(partition_by="id", produces_full_deletes=True, op_mapping=TO_CDU),
        key=by("id"),
    ),
    Case(
        "4.2.1.5.1",
        f"""SELECT * FROM TO_CHANGELOG(
            input => TABLE(dynamic_table),
            partition_by => 'id',
            sequence_by => 'seq',
            before => 'before',
            after => 'after',
            passthrough => 'ts_ms',
            op_mapping => {TO_COMBINED_MAP})""",
        {
            "dynamic_table": changes(
                "id INT, name STRING, ts_ms BIGINT",
                ("+I", 1, "Alice", 1234),
                ("-U", 1, "Alice", 1240),
                ("+U", 1, "Alicia", 1240),
            )
        },
        engine_to(
            partition_by="id", before="before", after="after", passthrough="ts_ms", op_mapping=TO_COMBINED
        ),
        key=in_image("id", "after", "before"),
    ),
    Case(
        "4.2.1.6",
        f"""SELECT * FROM TO_CHANGELOG(
            input => TABLE(t),
            partition_by => 'k',
            sequence_by => 'seq',
            uid => 'my-cdc-ptf',
            before => 'DESCRIPTOR(before)',
            after => 'DESCRIPTOR(after)',
            op => 'DESCRIPTOR(op)',
            state_ttl => INTERVAL '10' MINUTE,
            produces_full_deletes => false,
            passthrough => 'DESCRIPTOR(field1, field2)',
            op_mapping => {TO_COMBINED_MAP})""",
        {
            "t": changes(
                "k INT, name STRING, field1 STRING, field2 INT",
                ("+I", 5, "name", "a", 1),
                ("-U", 5, "name", "b", 2),
                ("+U", 5, "updated_name", "b", 2),
                ("-D", 5, "updated_name", "c", 3),
            )
        },
        engine_to(
            partition_by="k",
            uid="my-cdc-ptf",
            before="before",
            after="after",
            op="op",
            state_ttl=timedelta(minutes=10),
            produces_full_deletes=False,
            passthrough=["field1", "field2"],
            op_mapping=TO_COMBINED,
        ),
        key=in_image("k", "after", "before"),
    ),
    Case(
        "4.2.2.1",
        """SELECT * FROM TO_CHANGELOG(
            input => TABLE(dynamic_table) PARTITION BY id ORDER BY seq,
            sequence_by => 'seq',
            op => 'deleted',
            op_mapping => map(
                'INSERT, UPDATE_AFTER', 'false',
                'DELETE', 'true'
            ))""",
        {"dynamic_table": changes(KINDS, *ALICE)},
        engine_to(op="deleted", op_mapping={"INSERT, UPDATE_AFTER": "false", "DELETE": "true"}),
        key=by("id"),
    ),
    Case(
        "4.2.2.2",
        """SELECT * FROM TO_CHANGELOG(
            input => TABLE(dynamic_table) PARTITION BY id ORDER BY seq,
            sequence_by => 'seq',
            op => 'op_code',
            op_mapping => map('INSERT', 'I', 'DELETE', 'D', 'UPDATE_AFTER', 'U'))""",
        {"dynamic_table": changes("id INT, val INT", ("+I", 7, 40), ("+U", 7, 50))},
        engine_to(op="op_code", op_mapping={"INSERT": "I", "DELETE": "D", "UPDATE_AFTER": "U"}),
        key=by("id"),
    ),
    Case(
        "4.2.2.3-flat",
        f"""SELECT * FROM TO_CHANGELOG(
            input => TABLE(dynamic_table) PARTITION BY id ORDER BY seq,
            sequence_by => 'seq',
            uid => 'nested-cdc-out',
            op_mapping => {TO_CDU_MAP})""",
        {"dynamic_table": changes("id INT, val INT", ("+I", 1, 10), ("-U", 1, 10), ("+U", 1, 20))},
        engine_to(op_mapping=TO_CDU),
        key=by("id"),
    ),
    Case(
        "4.2.2.3-payload",
        f"""SELECT * FROM TO_CHANGELOG(
            input => TABLE(dynamic_table) PARTITION BY id ORDER BY seq,
            sequence_by => 'seq',
            uid => 'nested-cdc-out',
            before => 'payload',
            after => 'payload',
            op_mapping => {TO_CDU_MAP})""",
        {"dynamic_table": changes("id INT, val INT", ("+I", 1, 10), ("-U", 1, 10), ("+U", 1, 20))},
        engine_to(before="payload", after="payload", op_mapping=TO_CDU),
        key=in_image("id", "payload"),
    ),
    Case(
        "4.2.2.4",
        f"""SELECT * FROM TO_CHANGELOG(
            input => TABLE(dynamic_table) PARTITION BY id ORDER BY seq,
            sequence_by => 'seq',
            uid => 'nested-cdc-out',
            before => 'payload',
            after => 'payload',
            op_mapping => {TO_CDU_MAP})""",
        {"dynamic_table": changes("id INT, val INT", ("+I", 1, 10), ("+U", 1, 20), ("-D", 1, 20))},
        engine_to(before="payload", after="payload", op_mapping=TO_CDU),
        key=in_image("id", "payload"),
    ),
    Case(
        "4.2.2.5",
        f"""SELECT * FROM TO_CHANGELOG(
            input => TABLE(dynamic_table) PARTITION BY id ORDER BY seq,
            sequence_by => 'seq',
            partition_by => 'id',
            op_mapping => {TO_CDU_MAP})""",
        {"dynamic_table": changes("id INT, name STRING, age INT", *ALICE_AGE)},
        engine_to(partition_by="id", op_mapping=TO_CDU),
        key=by("id"),
    ),
    Case(
        "4.2.2.6",
        f"""SELECT * FROM TO_CHANGELOG(
            input => TABLE(dynamic_table) PARTITION BY id ORDER BY seq,
            sequence_by => 'seq',
            partition_by => 'id',
            produces_full_deletes => true,
            op_mapping => {TO_CDU_MAP})""",
        {"dynamic_table": changes("id INT, name STRING, age INT", *ALICE_AGE)},
        engine_to(partition_by="id", produces_full_deletes=True, op_mapping=TO_CDU),
        key=by("id"),
    ),
    Case(
        "4.2.2.7",
        f"""SELECT * FROM TO_CHANGELOG(
            input => TABLE(dynamic_table),
            partition_by => 'id',
            sequence_by => 'seq',
            uid => 'nested-cdc-out',
            before => 'before',
            after => 'after',
            state_ttl => INTERVAL '1' HOUR,
            op_mapping => {TO_COMBINED_MAP})""",
        {
            "dynamic_table": changes(
                "id INT, val INT", ("+I", 1, 10), ("+I", 2, 5), ("-U", 1, 10), ("+U", 1, 20), ("-D", 2, 5)
            )
        },
        engine_to(
            partition_by="id",
            before="before",
            after="after",
            state_ttl=timedelta(hours=1),
            op_mapping=TO_COMBINED,
        ),
        key=in_image("id", "after", "before"),
    ),
    Case(
        "4.2.2.8",
        f"""SELECT * FROM TO_CHANGELOG(
            input => TABLE(dynamic_table),
            partition_by => 'id',
            sequence_by => 'seq',
            uid => 'nested-cdc-out',
            before => 'before',
            after => 'after',
            state_ttl => INTERVAL '1' HOUR,
            op_mapping => {TO_CDU_MAP})""",
        {
            "dynamic_table": changes(
                "id INT, val INT", ("+I", 1, 10), ("+U", 1, 20), ("+I", 2, 5), ("-D", 1, None)
            )
        },
        engine_to(
            partition_by="id", before="before", after="after", state_ttl=timedelta(hours=1), op_mapping=TO_CDU
        ),
        key=in_image("id", "after", "before"),
    ),
    Case(
        "4.2.2.9",
        f"""SELECT * FROM TO_CHANGELOG(
            input => TABLE(dynamic_table),
            partition_by => 'id',
            sequence_by => 'seq',
            before => 'before',
            after => 'after',
            passthrough => 'ts_ms',
            op_mapping => {TO_COMBINED_MAP})""",
        {
            "dynamic_table": changes(
                "id INT, name STRING, ts_ms BIGINT",
                ("+I", 1, "Alice", 1234),
                ("-U", 1, "Alice", 1300),
                ("+U", 1, "Al", 1300),
                ("-D", 1, "Al", 1400),
            )
        },
        engine_to(
            partition_by="id", before="before", after="after", passthrough="ts_ms", op_mapping=TO_COMBINED
        ),
        key=in_image("id", "after", "before"),
    ),
    Case(
        "4.3.1-skip",
        f"""SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream), op_mapping => {CDU_MAP}, invalid_op_handling => 'SKIP')""",
        {
            "cdc_stream": Table(
                FLAT,
                [
                    {"op": "c", "id": 1, "name": "a"},
                    {"op": "x", "id": 2, "name": "b"},
                    {"op": "d", "id": 1, "name": "a"},
                ],
            )
        },
        engine_from(op_mapping=CDU, invalid_op_handling="SKIP"),
    ),
    Case(
        "4.3.1-log",
        f"""SELECT * FROM FROM_CHANGELOG(
            input => TABLE(cdc_stream), op_mapping => {CDU_MAP}, invalid_op_handling => 'LOG')""",
        {
            "cdc_stream": Table(
                FLAT,
                [
                    {"op": "c", "id": 1, "name": "a"},
                    {"op": "x", "id": 2, "name": "b"},
                    {"op": "d", "id": 1, "name": "a"},
                ],
            )
        },
        engine_from(op_mapping=CDU, invalid_op_handling="LOG"),
    ),
    Case(
        "4.3.4-unpaired-update-before",
        f"""SELECT * FROM TO_CHANGELOG(
            input => TABLE(t), sequence_by => 'seq', op_mapping => {TO_COMBINED_MAP})""",
        {"t": changes(KINDS, ("+I", 1, "a"), ("-U", 1, "a"))},
        engine_to(op_mapping=TO_COMBINED),
    ),
    Case(
        "4.3.4-with-state",
        f"""SELECT * FROM TO_CHANGELOG(
            input => TABLE(t),
            partition_by => 'id',
            sequence_by => 'seq',
            state_ttl => INTERVAL '1' HOUR,
            op_mapping => {TO_COMBINED_MAP})""",
        {
            "t": changes(
                KINDS, ("+I", 1, "a"), ("-U", 1, "a"), ("+I", 2, "b"), ("+U", 1, "a2"), ("-U", 2, "b")
            )
        },
        engine_to(partition_by="id", state_ttl=timedelta(hours=1), op_mapping=TO_COMBINED),
        key=by("id"),
    ),
    Case(
        "4.3.7-passthrough-without-images",
        "SELECT * FROM FROM_CHANGELOG(input => TABLE(flat_stream), passthrough => 'name')",
        {"flat_stream": flat_stream()},
        engine_from(passthrough="name"),
    ),
    Case(
        "4.5.1",
        """SELECT * FROM FROM_CHANGELOG(
            input => TABLE(SELECT * FROM TO_CHANGELOG(input => TABLE(my_table))))""",
        {
            "my_table": Table(
                "_row_kind STRING, id INT, name STRING",
                [
                    {"_row_kind": "+I", "id": 1, "name": "Alice"},
                    {"_row_kind": "+U", "id": 1, "name": "Alice Updated"},
                    {"_row_kind": "-D", "id": 1, "name": "Alice Updated"},
                ],
            )
        },
        lambda rows: engine_from()(engine_to()(rows)),
    ),
    Case(
        "4.5.2",
        """SELECT * FROM TO_CHANGELOG(
            input => TABLE(SELECT * FROM FROM_CHANGELOG(input => TABLE(cdc_stream))))""",
        {
            "cdc_stream": Table(
                FLAT,
                [
                    {"op": "INSERT", "id": 1, "name": "Alice"},
                    {"op": "UPDATE_AFTER", "id": 1, "name": "Alice Updated"},
                    {"op": "DELETE", "id": 1, "name": "Alice Updated"},
                ],
            )
        },
        lambda rows: engine_to()(engine_from()(rows)),
    ),
]


@pytest.fixture(scope="module")
def sql(spark: SparkSession) -> SparkSession:
    register_functions(spark)
    return spark


def create_views(spark: SparkSession, tables: dict[str, Table]) -> None:
    for name, table in tables.items():
        schema = st.StructType.fromDDL(table.schema)
        rows = [tuple(row.get(f) for f in schema.names) for row in table.rows]
        spark.createDataFrame(rows, schema).createOrReplaceTempView(name)


def conform(value: Any, data_type: st.DataType) -> Any:
    """An engine value shaped as Spark returns it: a struct has every field (absent ones NULL)."""
    if isinstance(data_type, st.StructType) and isinstance(value, dict):
        return {f.name: conform(value.get(f.name), f.dataType) for f in data_type.fields}
    return value


def collected(df: DataFrame) -> list[Row]:
    return [row.asDict(recursive=True) for row in df.collect()]


def per_key(rows: Sequence[Row], key: Callable[[Row], Any] | None) -> list[Row]:
    """Each key's rows together, in their order (a stable sort by key)."""
    return list(rows) if key is None else sorted(rows, key=lambda row: repr(key(row)))


@pytest.mark.parametrize("case", FROM_CASES + TO_CASES, ids=lambda case: case.id)
def test_spec_example_as_sql_equals_the_engine(sql: SparkSession, case: Case) -> None:
    create_views(sql, case.tables)
    df = sql.sql(case.sql)
    expected = [conform(row, df.schema) for row in case.engine(case.input_rows())]
    assert expected, "every example emits rows"
    assert per_key(collected(df), case.key) == per_key(expected, case.key)


def test_output_columns_are_the_engines_with_the_row_kind_last(sql: SparkSession) -> None:
    create_views(sql, {"cdc_stream": envelopes(NESTED, *NESTED_ROWS)})
    df = sql.sql(
        "SELECT * FROM FROM_CHANGELOG(input => TABLE(cdc_stream), before => 'before', after => 'after', "
        f"passthrough => array('partition_key'), sequence_by => 'seq', op_mapping => {DEBEZIUM_MAP})"
    )
    assert df.schema.simpleString() == "struct<id:int,name:string,partition_key:int,_row_kind:string>"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (  # 4.3.6: one side must name row kinds
            "FROM_CHANGELOG(input => TABLE(cdc_stream), op_mapping => map('MY_INSERT', 'NEW_INSERT'))",
            "op_mapping value 'NEW_INSERT' is not a row kind name",
        ),
        (  # 4.3.6: a row kind at most once
            "FROM_CHANGELOG(input => TABLE(cdc_stream), "
            "op_mapping => map('c', 'INSERT', 'r', 'INSERT, DELETE', 'x', 'DELETE'))",
            "DELETE",
        ),
        (  # 4.3.6: groupings must be compatible
            "FROM_CHANGELOG(input => TABLE(cdc_stream), op_mapping => map('c', 'INSERT, DELETE'))",
            "op_mapping groups INSERT, DELETE together, which is not a compatible grouping",
        ),
        (  # 4.3.7: passthrough and the images' fields are disjoint
            "FROM_CHANGELOG(input => TABLE(keyed_stream), before => 'before', after => 'after', "
            "passthrough => 'id')",
            "passthrough field(s) ['id'] are also columns of the image",
        ),
        (  # 4.3.7: passthrough must not name an image
            "FROM_CHANGELOG(input => TABLE(cdc_stream), before => 'before', after => 'after', "
            "passthrough => 'after')",
            "passthrough names the image field(s) ['after']",
        ),
        (  # state needs a key, said in SQL
            "FROM_CHANGELOG(input => TABLE(cdc_stream), op_mapping => map('c', 'INSERT, UPDATE_AFTER'))",
            "set state_ttl (INTERVAL '0' MINUTE keeps state forever) and partition_by",
        ),
        (  # state needs each key's rows in order, which Spark does not keep
            "FROM_CHANGELOG(input => TABLE(cdc_stream), before => 'before', after => 'after', "
            "partition_by => 'id', state_ttl => INTERVAL '0' MINUTE)",
            "name the order with sequence_by => 'seq'",
        ),
        ("FROM_CHANGELOG(input => TABLE(cdc_stream), opp => 'op')", "no argument(s) named ['opp']"),
        ("FROM_CHANGELOG(input => TABLE(cdc_stream), op => uuid())", "argument op must be a constant"),
        ("FROM_CHANGELOG(input => TABLE(cdc_stream), op => 'nope')", "op names ['nope']"),
        (
            "FROM_CHANGELOG(input => TABLE(cdc_stream), state_ttl => 'ten minutes', partition_by => 'id')",
            "state_ttl must be a day-time INTERVAL",
        ),
        ("TO_CHANGELOG(input => TABLE(cdc_stream))", "row_kind_column names ['_row_kind']"),
        ("FROM_CHANGELOG(op => 'op')", "needs its input as a table argument"),
    ],
    ids=[
        "4.3.6-names",
        "4.3.6-once",
        "4.3.6-grouping",
        "4.3.7-image-field",
        "4.3.7",
        "needs-state",
        "needs-order",
        "unknown",
        "column",
        "missing",
        "ttl",
        "to-kind",
        "no-table",
    ],
)
def test_arguments_are_checked_when_spark_analyses_the_query(
    sql: SparkSession, call: str, message: str
) -> None:
    keyed = f"op STRING, id INT, before {NAME_IMAGE}, after {NAME_IMAGE}"
    create_views(sql, {"cdc_stream": envelopes(NESTED, *NESTED_ROWS), "keyed_stream": envelopes(keyed)})
    with pytest.raises(AnalysisException) as raised:
        sql.sql(f"SELECT * FROM {call}")  # no action: the error comes from the analysis
    assert "TABLE_VALUED_FUNCTION_FAILED_TO_ANALYZE_IN_PYTHON" in str(raised.value)
    assert message in str(raised.value)


def test_4_3_1_unknown_code_fails_the_query_with_the_engines_message(sql: SparkSession) -> None:
    create_views(
        sql,
        {"cdc_stream": Table(FLAT, [{"op": "c", "id": 1, "name": "a"}, {"op": "x", "id": 2, "name": "b"}])},
    )
    with pytest.raises(InvalidOperationError) as engine_error:
        engine_from(op_mapping=CDU)([{"op": "x", "id": 2, "name": "b"}])
    with pytest.raises(PythonException) as raised:
        sql.sql(
            f"SELECT * FROM FROM_CHANGELOG(input => TABLE(cdc_stream), op_mapping => {CDU_MAP})"
        ).collect()
    assert "unknown operation code 'x'" in str(engine_error.value)
    assert "unknown operation code 'x'" in str(raised.value)


def test_4_3_5_null_operation_fails_the_query(sql: SparkSession) -> None:
    create_views(sql, {"cdc_stream": Table(FLAT, [{"op": None, "id": 1, "name": "a"}])})
    with pytest.raises(PythonException, match="NULL"):
        sql.sql("SELECT * FROM FROM_CHANGELOG(input => TABLE(cdc_stream))").collect()


def test_4_3_5_null_key_fails_the_query_with_the_engines_message(sql: SparkSession) -> None:
    rows = [{"op": "c", "id": None, "name": "a"}]
    create_views(sql, {"cdc_stream": envelopes(FLAT, ("c", None, "a"))})
    mapping = {"c": "INSERT, UPDATE_AFTER"}
    with pytest.raises(NullKeyError) as engine_error:
        engine_from(op_mapping=mapping, partition_by="id", state_ttl=0)(rows)
    with pytest.raises(PythonException) as raised:
        sql.sql(
            "SELECT * FROM FROM_CHANGELOG(input => TABLE(cdc_stream), op_mapping => map('c', "
            "'INSERT, UPDATE_AFTER'), partition_by => 'id', sequence_by => 'seq', "
            "state_ttl => INTERVAL '0' MINUTE)"
        ).collect()
    assert engine_error.value.reason in str(raised.value)


def test_a_null_row_kind_fails_the_query_as_in_the_dataframe_api(sql: SparkSession) -> None:
    create_views(sql, {"t": Table("_row_kind STRING, id INT", [{"_row_kind": None, "id": 1}])})
    with pytest.raises(PythonException, match="the row kind is NULL: each change needs"):
        sql.sql("SELECT * FROM TO_CHANGELOG(input => TABLE(t))").collect()


def test_a_keyed_call_refuses_the_partition_by_clause(sql: SparkSession) -> None:
    """The function partitions by ``partition_by`` itself; Spark then refuses a second partitioning."""
    create_views(sql, {"t": changes(KINDS, ("-U", 5, "old"), ("+U", 5, "new"))})
    with pytest.raises(
        AnalysisException, match="TABLE_VALUED_FUNCTION_REQUIRED_METADATA_INCOMPATIBLE_WITH_CALL"
    ):
        sql.sql(
            "SELECT * FROM TO_CHANGELOG(input => TABLE(t) PARTITION BY id, partition_by => 'id', "
            "sequence_by => 'seq', before => 'before', after => 'after', "
            f"op_mapping => {TO_COMBINED_MAP})"
        )


def test_stateless_calls_run_on_a_stream(sql: SparkSession, tmp_path: Any) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text(
        '{"op": "INSERT", "id": 1, "name": "a"}\n{"op": "DELETE", "id": 1, "name": "a"}\n'
    )
    sql.readStream.schema(FLAT).json(str(tmp_path / "in")).createOrReplaceTempView("src")
    df = sql.sql("SELECT * FROM FROM_CHANGELOG(input => TABLE(SELECT * FROM src))")
    assert df.isStreaming
    out: list[Row] = []
    query = (
        df.writeStream.trigger(availableNow=True)
        .foreachBatch(lambda batch, _: out.extend(collected(batch)))
        .start()
    )
    query.awaitTermination(120)
    assert out == engine_from()(
        [{"op": "INSERT", "id": 1, "name": "a"}, {"op": "DELETE", "id": 1, "name": "a"}]
    )


def test_a_stateful_call_on_a_stream_fails_and_names_the_dataframe_api(
    sql: SparkSession, tmp_path: Any
) -> None:
    """All rows in one instance (no partition_by, no sequence_by): no sort, so Spark accepts the stream
    and the task refuses it. With a key or an order Spark refuses the sort on a stream at the start."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text(
        '{"op": "c", "id": 1, "name": "a", "ts": "2024-01-01T00:00:00"}\n'
    )
    schema = "op STRING, id INT, name STRING, ts TIMESTAMP"
    sql.readStream.schema(schema).json(str(tmp_path / "in")).createOrReplaceTempView("timed_src")
    df = sql.sql(
        f"SELECT * FROM FROM_CHANGELOG(input => TABLE(timed_src), order_by => 'ts', op_mapping => {CDU_MAP})"
    )
    query = df.writeStream.trigger(availableNow=True).format("noop").start()
    with pytest.raises(Exception, match="DataFrame API"):
        query.awaitTermination(120)
