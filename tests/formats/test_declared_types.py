"""A declared column type that differs from the type in the message's schema block: the value is
decoded with the message's type (decimal scale, epoch unit) and converted exactly, or the record fails
naming the column, both types and the fix. Never a silently different value.

Real events: ``recorded/postgres/schemas.jsonl`` (numeric(12,3), numeric(5,0), timestamp(3) sent as
``io.debezium.time.Timestamp`` epoch milliseconds, date, timestamptz). Synthetic envelopes for MySQL's
DECIMAL(10,2) and DATETIME(3).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from avro_events import ENVELOPE_TEXT, FACTORY, messages

from cdcflow.core.rowkind import RowKind
from cdcflow.formats import DecodeError, Message, parse_ddl, resolve_format
from cdcflow.formats.coerce import exact_cast

RECORDED = Path(__file__).parent / "recorded" / "postgres"
TOPIC = "cdcflow.inventory.cdc_types_full"


def _recorded() -> list[Message]:
    out = []
    for offset, line in enumerate((RECORDED / "schemas.jsonl").read_text(encoding="utf-8").splitlines()):
        record = json.loads(line)
        if record["topic"] == TOPIC and record["value"] is not None:
            out.append(Message(record["value"].encode(), topic=TOPIC, partition=0, offset=offset))
    return out


def _final_table(ddl: str) -> dict[int, dict[str, Any]]:
    decoder = resolve_format("debezium-json").create_decoder({"schema-include": "true"}, parse_ddl(ddl))
    table: dict[int, dict[str, Any]] = {}
    for change in decoder.decode_all(_recorded()).changes:
        if change.kind in (RowKind.INSERT, RowKind.UPDATE_AFTER):
            table[change.row["id"]] = change.row
        elif change.kind is RowKind.DELETE:
            del table[change.row["id"]]
    return table


def _postgres_final() -> dict[int, dict[str, str | None]]:
    truth = json.loads((RECORDED / "expected.json").read_text(encoding="utf-8"))["final"][
        TOPIC.split(".")[-1]
    ]
    return {int(row["id"]): row for row in truth["text"]}


def test_wider_declared_types_keep_postgres_values_exactly() -> None:
    table = _final_table(
        "id INT NOT NULL, c_numeric DECIMAL(20, 6), c_decimal BIGINT, c_timestamp3 TIMESTAMP, "
        "c_date TIMESTAMP_NTZ, c_timestamp TIMESTAMP"
    )
    truth = _postgres_final()
    assert sorted(table) == sorted(truth)
    for key, row in truth.items():
        ours = table[key]
        assert ours["c_numeric"] == Decimal(row["c_numeric"]) and ours["c_numeric"].as_tuple().exponent == -6
        assert ours["c_decimal"] == int(row["c_decimal"])
        # timestamp(3) comes as epoch milliseconds (io.debezium.time.Timestamp): the same instant in UTC.
        assert ours["c_timestamp3"] == dt.datetime.fromisoformat(row["c_timestamp3"]).replace(tzinfo=dt.UTC)
        assert ours["c_timestamp"] == dt.datetime.fromisoformat(row["c_timestamp"]).replace(tzinfo=dt.UTC)
        assert ours["c_date"] == dt.datetime.fromisoformat(row["c_date"])


def test_a_narrower_decimal_scale_fails_instead_of_rounding() -> None:
    """numeric(12,3) holds -98765.432: DECIMAL(12, 2) would round it; the record fails instead."""
    decoder = resolve_format("debezium-json").create_decoder(
        {"schema-include": "true"}, parse_ddl("id INT NOT NULL, c_numeric DECIMAL(12, 2)")
    )
    with pytest.raises(DecodeError) as error:
        decoder.decode_all(_recorded())
    text = str(error.value)
    assert "c_numeric" in text and "DECIMAL(12, 3)" in text and "DECIMAL(12, 2)" in text
    assert "declare it DECIMAL(12, 3)" in text and f"topic '{TOPIC}'" in text


def test_a_declared_date_over_a_timestamp_with_a_time_of_day_fails() -> None:
    decoder = resolve_format("debezium-json").create_decoder(
        {"schema-include": "true"}, parse_ddl("id INT NOT NULL, c_timestamp3 DATE")
    )
    with pytest.raises(DecodeError, match=r"c_timestamp3.*time of day.*TIMESTAMP_NTZ\(3\).*declare it"):
        decoder.decode_all(_recorded())


def test_types_with_no_exact_conversion_are_refused_naming_both() -> None:
    decoder = resolve_format("debezium-json").create_decoder(
        {"schema-include": "true"}, parse_ddl("id INT NOT NULL, c_boolean INT")
    )
    with pytest.raises(
        DecodeError, match=r"schema.c_boolean.*declared INT.*says BOOLEAN.*declare it BOOLEAN"
    ):
        decoder.decode_all(_recorded()[:1])


def test_a_declared_struct_keeps_its_fields_of_the_same_type_dates_included() -> None:
    """A struct declared with fewer fields than the message's: each kept field converts, a DATE too."""
    (source,) = parse_ddl("s STRUCT<x: INT, d: DATE, t: TIME, extra: STRING>")
    (target,) = parse_ddl("s STRUCT<x: BIGINT, d: DATE, t: TIME>")
    cast = exact_cast(source.type, target.type, str)
    assert cast is not None
    value = {"x": 1, "d": dt.date(2024, 2, 29), "t": dt.time(12, 30), "extra": "dropped"}
    assert cast(value) == {"x": 1, "d": dt.date(2024, 2, 29), "t": dt.time(12, 30)}


# --- MySQL: DECIMAL(10,2) as base64 bytes, DATETIME(3) as io.debezium.time.Timestamp (epoch ms) ------

_MYSQL_FIELDS = [
    {"field": "id", "type": "int32", "optional": False},
    {
        "field": "amount",
        "type": "bytes",
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "optional": True,
    },
    {"field": "created", "type": "int64", "name": "io.debezium.time.Timestamp", "optional": True},
]
_CREATED_MS = 1_700_000_000_123  # 2023-11-14 22:13:20.123


def _mysql_event(amount_unscaled: int, *, with_schema: bool) -> Message:
    amount = base64.b64encode(amount_unscaled.to_bytes(4, "big", signed=True)).decode()
    payload = {"before": None, "after": {"id": 1, "amount": amount, "created": _CREATED_MS}, "op": "c"}
    if not with_schema:
        return Message(orjson.dumps(payload), topic="mysql.shop.orders", partition=0, offset=7)
    image = {"type": "struct", "optional": True, "fields": _MYSQL_FIELDS}
    schema = {
        "type": "struct",
        "fields": [
            {**image, "field": "before"},
            {**image, "field": "after"},
            {"type": "string", "field": "op"},
        ],
    }
    return Message(orjson.dumps({"schema": schema, "payload": payload}), topic="mysql.shop.orders", offset=7)


def _row(ddl: str, message: Message, options: dict[str, str]) -> dict[str, Any]:
    decoder = resolve_format("debezium-json").create_decoder(options, parse_ddl(ddl))
    return decoder.decode_all([message]).changes[0].row


def test_mysql_decimal_and_datetime3_with_a_schema_block_convert_exactly() -> None:
    row = _row(
        "id INT NOT NULL, amount DECIMAL(10, 3), created TIMESTAMP",
        _mysql_event(17711, with_schema=True),
        {"schema-include": "true"},
    )
    assert row["amount"] == Decimal("177.11") and str(row["amount"]) == "177.110"
    assert row["created"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.UTC)


def test_mysql_decimal_too_narrow_for_the_value_fails() -> None:
    with pytest.raises(DecodeError, match=r"after.amount.*12345678.91 does not fit DECIMAL\(9, 2\)"):
        _row(
            "id INT NOT NULL, amount DECIMAL(9, 2), created TIMESTAMP",
            _mysql_event(1_234_567_891, with_schema=True),
            {"schema-include": "true"},
        )


def test_without_a_schema_block_the_documented_declarations_read_mysql_values() -> None:
    """No schema block: the declared type is the only description, so it must match the source
    (docs/formats.md): the column's own scale, TIMESTAMP(3) for epoch milliseconds."""
    row = _row(
        "id INT NOT NULL, amount DECIMAL(10, 2), created TIMESTAMP(3)",
        _mysql_event(17711, with_schema=False),
        {},
    )
    assert row["amount"] == Decimal("177.11")
    assert row["created"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000)


def test_avro_writer_schema_types_convert_exactly_too() -> None:
    schema = parse_ddl("id INT NOT NULL, price DECIMAL(12, 4), created TIMESTAMP, born TIMESTAMP_NTZ")
    row = FACTORY.create_decoder({"schema": ENVELOPE_TEXT}, schema).decode_all(messages()[:1]).changes[0].row
    assert str(row["price"]) == "12.5000"
    assert row["created"] == dt.datetime(2021, 1, 1, 0, 0, 0, 123456, tzinfo=dt.UTC)
    assert row["born"] == dt.datetime(2021, 1, 1)
    narrow = parse_ddl("id INT NOT NULL, price DECIMAL(3, 2)")
    with pytest.raises(
        DecodeError, match=r"'after.price': 12.50 does not fit DECIMAL\(3, 2\).*declare it DECIMAL\(10, 2\)"
    ):
        FACTORY.create_decoder({"schema": ENVELOPE_TEXT}, narrow).decode_all(messages()[:1])
