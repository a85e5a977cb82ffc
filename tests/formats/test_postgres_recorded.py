"""Real Debezium events from a real PostgreSQL reproduce the table's rows exactly.

``recorded/postgres/`` holds what Debezium 3.6 (pgoutput, Kafka Connect's JSON converter) emitted for a
scripted session on PostgreSQL 15, with schemas, without schemas, and with ``time.precision.mode=connect``,
and ``expected.json`` holds the tables as PostgreSQL itself printed them (``col::text``) after the
snapshot and at the end. Decoding the events and folding the changelog must give those rows.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import DecodeError, DecodeOutput, Message, parse_ddl, resolve_format

RECORDED = Path(__file__).parent / "recorded" / "postgres"
TABLES = ("cdc_types", "cdc_types_full")
# How a user declares the table when the events carry no schema: the precisions say which integer
# unit Debezium used (time(3)/timestamp(3): ms, default precision: µs).
DECLARED = (
    "id INT NOT NULL, c_numeric DECIMAL(12, 3), c_numeric_var STRING, c_decimal DECIMAL(5, 0), c_real FLOAT, "
    "c_double DOUBLE, c_smallint SMALLINT, c_bigint BIGINT, c_boolean BOOLEAN, c_date DATE, c_time TIME(6), "
    "c_time3 TIME(3), c_timestamp TIMESTAMP_NTZ(6), c_timestamp3 TIMESTAMP_NTZ(3), c_timestamptz TIMESTAMP, "
    "c_json STRING, c_jsonb STRING, c_uuid STRING, c_bytea BINARY, c_text STRING, c_varchar STRING, "
    "c_enum STRING, c_int_array ARRAY<INT>, big_text STRING, big_jsonb STRING"
)
RUNS = {
    "schemas": ({"schema-include": "true"}, None),
    "no-schemas": ({}, DECLARED),
    "connect-time": ({"schema-include": "true"}, None),
}


@cache
def expected() -> dict[str, Any]:
    return json.loads((RECORDED / "expected.json").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def recorded(run: str) -> list[Message]:
    out = []
    for offset, line in enumerate((RECORDED / f"{run}.jsonl").read_text(encoding="utf-8").splitlines()):
        record = json.loads(line)
        out.append(
            Message(
                None if record["value"] is None else record["value"].encode(),
                key=None if record["key"] is None else record["key"].encode(),
                topic=record["topic"],
                partition=0,
                offset=offset,
                headers=tuple((name, value.encode()) for name, value in record.get("headers", [])),
            )
        )
    return out


def decode(run: str, table: str, *, snapshot_only: bool = False) -> DecodeOutput:
    options, ddl = RUNS[run]
    # cdc_types has REPLICA IDENTITY DEFAULT: updates carry no before image, so it is read as upserts.
    mode = {"changelog-mode": "upsert"} if table == "cdc_types" else {}
    decoder = resolve_format("debezium-json").create_decoder(
        {**options, **mode}, parse_ddl(ddl) if ddl else None
    )
    topic = f"cdcflow.inventory.{table}"
    messages = [m for m in recorded(run) if m.topic == topic]
    if snapshot_only:
        messages = [m for m in messages if m.value is not None and b'"op":"r"' in m.value]
    return decoder.decode_all(messages)


def fold(changes: list[Change], *, check_retractions: bool) -> dict[int, dict[str, Any]]:
    table: dict[int, dict[str, Any]] = {}
    for change in changes:
        key = change.row["id"]
        if change.kind in (RowKind.INSERT, RowKind.UPDATE_AFTER):
            table[key] = change.row
        elif change.kind is RowKind.DELETE:
            assert key in table, f"-D of a row that is not there: {key}"
            del table[key]
        elif check_retractions:
            assert table.get(key) == change.row, f"-U does not retract the current row of {key}"
    return table


def pg_text(value: Any) -> Any:
    """A decoded value as PostgreSQL prints it with ``col::text`` (UTC, ISO dates)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, list):
        return "{" + ",".join("NULL" if v is None else str(v) for v in value) + "}"
    if isinstance(value, dt.datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S") + _fraction(value.microsecond)
        return text + "+00" if value.tzinfo is not None else text
    if isinstance(value, dt.time):
        return value.strftime("%H:%M:%S") + _fraction(value.microsecond)
    if isinstance(value, (dt.date, Decimal, int)):
        return str(value)
    return value


def _fraction(micros: int) -> str:
    return f".{micros:06d}".rstrip("0") if micros else ""


def assert_rows_equal(decoded: dict[int, dict[str, Any]], truth: list[dict[str, Any]], run: str) -> None:
    assert sorted(decoded) == [int(row["id"]) for row in truth]
    for row in truth:
        ours = decoded[int(row["id"])]
        for column, text in row.items():
            value = ours[column]
            if column in ("c_real", "c_double") and text is not None:
                assert math.isclose(value, float(text)) or (math.isnan(value) and text == "NaN"), column
                continue
            if column == "c_numeric_var" and text == "NaN":
                # Debezium sends numeric NaN as NULL (its VariableScaleDecimal has no NaN): not ours to fix.
                assert value is None
                continue
            if run == "connect-time" and column in ("c_time", "c_timestamp") and text is not None:
                text = _millis_floor(text)
            assert pg_text(value) == text, f"row {row['id']} column {column}"


def _millis_floor(text: str) -> str:
    """time.precision.mode=connect keeps milliseconds (Connect Time/Timestamp), truncating the rest."""
    head, dot, fraction = text.partition(".")
    fraction = fraction[:3].rstrip("0")
    return f"{head}.{fraction}" if fraction else head


@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("table", TABLES)
def test_snapshot_events_reproduce_the_snapshot(run: str, table: str) -> None:
    out = decode(run, table, snapshot_only=True)
    assert {c.kind for c in out.changes} == {RowKind.INSERT}
    truth = expected()["snapshot"][table]["text"]
    assert_rows_equal(fold(out.changes, check_retractions=True), truth, run)


@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("table", TABLES)
def test_all_events_reproduce_the_final_table(run: str, table: str) -> None:
    out = decode(run, table)
    assert out.dead_letters == []
    truth = expected()["final"][table]["text"]
    assert_rows_equal(fold(out.changes, check_retractions=table == "cdc_types_full"), truth, run)
    assert out.metrics.tombstones > 0


@pytest.mark.parametrize("run", list(RUNS))
def test_unchanged_toasted_columns_are_filled_never_landed(run: str) -> None:
    """REPLICA IDENTITY DEFAULT: updates that leave big_text/big_jsonb/c_int_array alone carry
    Debezium's placeholder (as text, as a non-JSON jsonb string, as character codes for int[])."""
    out = decode(run, "cdc_types")
    assert out.metrics.filled_values > 0
    assert out.metrics.unavailable_values == 0
    for change in out.changes:
        assert "__debezium_unavailable_value" not in json.dumps(change.row, default=str)
        assert change.row["c_int_array"] != [ord(c) for c in "__debezium_unavailable_value"]


def test_unchanged_toasted_columns_without_state_are_reported() -> None:
    options, _ = RUNS["schemas"]
    decoder = resolve_format("debezium-json").create_decoder(
        {**options, "changelog-mode": "upsert", "unavailable-values": "report"}, None, ["unavailable-columns"]
    )
    messages = [m for m in recorded("schemas") if m.topic == "cdcflow.inventory.cdc_types"]
    out = decoder.decode_all(messages)
    reported = [c.row["unavailable_columns"] for c in out.changes if c.row["unavailable_columns"]]
    assert reported and all(set(columns) <= {"big_text", "big_jsonb", "c_int_array"} for columns in reported)
    assert out.metrics.unavailable_values == sum(len(columns) for columns in reported)


@pytest.mark.parametrize("run", list(RUNS))
def test_truncate_and_logical_message_are_side_outputs(run: str) -> None:
    decoder = resolve_format("debezium-json").create_decoder(
        {**RUNS[run][0], "changelog-mode": "upsert"}, parse_ddl("id INT NOT NULL, label STRING")
    )
    messages = [m for m in recorded(run) if m.topic in ("cdcflow.inventory.cdc_small", "cdcflow.message")]
    out = decoder.decode_all(messages)
    assert [(e.kind, e.message.topic) for e in out.events] == [
        ("truncate", "cdcflow.inventory.cdc_small"),
        ("message", "cdcflow.message"),
    ]
    assert out.events[1].payload["message"]["prefix"] == "cdcflow"
    assert fold(out.changes, check_retractions=False).keys() == {1, 2, 99}
    # The truncate empties the table: what follows it is the final table.
    truncated_at = out.events[0].message.offset
    assert truncated_at is not None
    after = decoder.decode_all(m for m in messages if (m.offset or 0) > truncated_at)
    truth = expected()["final"]["cdc_small"]["text"]
    assert fold(after.changes, check_retractions=False) == {
        int(r["id"]): {"id": int(r["id"]), "label": r["label"]} for r in truth
    }


def test_the_three_recordings_agree_where_precision_allows() -> None:
    schemas = fold(decode("schemas", "cdc_types_full").changes, check_retractions=True)
    plain = fold(decode("no-schemas", "cdc_types_full").changes, check_retractions=True)
    for key, row in schemas.items():
        for column, value in row.items():
            other = plain[key][column]
            if column == "c_numeric_var" and value is not None:
                assert other == str(value)
            elif isinstance(value, float) and math.isnan(value):
                assert math.isnan(other)
            else:
                assert other == value, (key, column)


@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("table", TABLES)
def test_primary_key_change_names_the_other_key(run: str, table: str) -> None:
    """``UPDATE ... SET id = 20 WHERE id = 2`` is a delete of 2 carrying header ``__debezium.newkey`` and a
    create of 20 carrying ``__debezium.oldkey`` (in Connect's ``{schema, payload}`` form with schemas):
    metadata ``new-key`` / ``old-key`` give the other key's fields as JSON text, null elsewhere."""
    options, ddl = RUNS[run]
    mode = {"changelog-mode": "upsert"} if table == "cdc_types" else {}
    decoder = resolve_format("debezium-json").create_decoder(
        {**options, **mode}, parse_ddl(ddl) if ddl else None, ["old-key", "new-key", "op"]
    )
    out = decoder.decode_all(m for m in recorded(run) if m.topic == f"cdcflow.inventory.{table}")
    paired = [
        (c.kind.value, c.row["id"], c.row["op"], c.row["old_key"], c.row["new_key"])
        for c in out.changes
        if c.row["old_key"] is not None or c.row["new_key"] is not None
    ]
    assert paired == [("-D", 2, "d", None, '{"id":20}'), ("+I", 20, "c", '{"id":2}', None)]
    assert (
        sum(1 for c in out.changes if c.row["old_key"] is None and c.row["new_key"] is None)
        == len(out.changes) - 2
    )


def test_key_headers_in_other_forms() -> None:
    decoder = resolve_format("debezium-json").create_decoder(
        {}, parse_ddl("id INT NOT NULL, label STRING"), ["old-key", "new-key"]
    )
    value = b'{"op":"c","before":null,"after":{"id":7,"label":"x"}}'

    def old_key(header: bytes | None) -> Any:
        return (
            decoder.decode_all([Message(value, headers=(("__debezium.oldkey", header),))])
            .changes[0]
            .row["old_key"]
        )

    assert old_key(b'{"id":5}') == '{"id":5}'
    assert (
        old_key(b'{"schema":{"type":"struct"},"payload":{"id":5,"region":"eu"}}') == '{"id":5,"region":"eu"}'
    )
    assert old_key(None) is None
    with pytest.raises(DecodeError, match=r"headers.__debezium.oldkey.*header.converter"):
        old_key(b"Struct{id=5}")


@pytest.mark.parametrize("run", list(RUNS))
def test_control_events_carry_their_metadata(run: str) -> None:
    decoder = resolve_format("debezium-json").create_decoder(
        {**RUNS[run][0], "changelog-mode": "upsert"},
        parse_ddl("id INT NOT NULL, label STRING"),
        ["source.table", "source.sequence", "op", "old-key"],
    )
    messages = [m for m in recorded(run) if m.topic in ("cdcflow.inventory.cdc_small", "cdcflow.message")]
    out = decoder.decode_all(messages)
    truncate, message = out.events
    assert truncate.metadata["source_table"] == "cdc_small" and truncate.metadata["op"] == "t"
    assert truncate.metadata["old_key"] is None
    sequences = {c.row["id"]: c.row["source_sequence"] for c in out.changes}
    assert sequences[2] < truncate.metadata["source_sequence"] < sequences[99]
    assert message.metadata["op"] == "m" and message.metadata["source_table"] == ""
