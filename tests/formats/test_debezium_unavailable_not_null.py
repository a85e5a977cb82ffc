"""An unchanged-TOAST placeholder in a NOT NULL column: a dead letter naming the column, unless the
output lists it in ``unavailable-columns`` (then the column is nullable in the output schema).

Recorded PostgreSQL events, REPLICA IDENTITY DEFAULT (``cdc_types``): the update at line 14 leaves
``big_text`` and ``big_jsonb`` unchanged, so Debezium sends its placeholder for both.
"""

from __future__ import annotations

import pytest

from cdcflow.formats import DecodeError, parse_ddl, resolve_format
from cdcflow.formats.base import DecodeOutput, Decoder, Message
from tests.formats.avro_events import ENVELOPE_TEXT, FACTORY, messages
from tests.formats.test_postgres_recorded import recorded

DECLARED = "id INT NOT NULL, c_text STRING, big_text STRING NOT NULL, big_jsonb STRING"
REASON = "Debezium did not send this unchanged TOASTed value"


def cdc_types(run: str = "no-schemas") -> list[Message]:
    return [m for m in recorded(run) if m.topic == "cdcflow.inventory.cdc_types"]


def decoder(options: dict[str, str] | None = None, metadata: tuple[str, ...] = ()) -> Decoder:
    return resolve_format("debezium-json").create_decoder(
        {"changelog-mode": "upsert", "ignore-parse-errors": "true", **(options or {})},
        parse_ddl(DECLARED),
        metadata,
    )


@pytest.mark.parametrize("unavailable", ["report", "fill"])
def test_a_not_null_column_left_unavailable_is_a_dead_letter_naming_it(unavailable: str) -> None:
    messages = cdc_types()
    updates = [m for m in messages if m.value and b"__debezium_unavailable_value" in m.value]
    # FILL without an earlier image of the key (a fresh decoder) cannot fill either.
    out = decoder({"unavailable-values": unavailable}).decode_all(updates[:1])
    assert out.changes == []
    [letter] = out.dead_letters
    assert letter.field == "after.big_text"
    assert letter.reason.startswith(REASON) and "declared NOT NULL" in letter.reason
    assert "REPLICA IDENTITY FULL" in letter.reason
    assert letter.message.offset == updates[0].offset and letter.message.value == updates[0].value
    assert out.metrics.unavailable_values == 0 and out.metrics.filled_values == 0


def test_the_other_rows_still_land_and_a_fill_from_state_is_not_an_error() -> None:
    messages = cdc_types()
    update = next(m for m in messages if m.value and b"__debezium_unavailable_value" in m.value)
    reported = decoder({"unavailable-values": "report"}).decode_all(messages)
    # (the recording also has NULL big_text values and key-only delete images: dead letters of their own)
    toast = [d for d in reported.dead_letters if d.reason.startswith(REASON)]
    assert [(d.message.offset, d.field) for d in toast] == [(update.offset, "after.big_text")]
    assert reported.changes and all(c.row["big_text"] is not None for c in reported.changes)
    # line 16 leaves only big_jsonb (nullable) unchanged: reported, not refused
    assert reported.metrics.unavailable_values == 1
    filled = decoder().decode_all(messages)  # FILL: the snapshot row of the key gives the value
    assert not [d for d in filled.dead_letters if d.reason.startswith(REASON)]
    assert filled.metrics.unavailable_values == 0 and filled.metrics.filled_values > 0


def test_without_ignore_parse_errors_the_error_has_coordinates_and_the_column() -> None:
    update = next(m for m in cdc_types() if m.value and b"__debezium_unavailable_value" in m.value)
    strict = resolve_format("debezium-json").create_decoder(
        {"changelog-mode": "upsert", "unavailable-values": "report"}, parse_ddl(DECLARED)
    )
    with pytest.raises(DecodeError) as raised:
        strict.decode(update, DecodeOutput())
    text = str(raised.value)
    assert "after.big_text" in text and f"offset {update.offset}" in text and REASON in text


@pytest.mark.parametrize("run", ["no-schemas", "schemas"])
def test_with_unavailable_columns_the_column_is_nullable_null_and_listed(run: str) -> None:
    options = {"unavailable-values": "report", "key-columns": "id"}
    if run == "schemas":
        options["schema-include"] = "true"
    reading = decoder(options, ("unavailable-columns",))
    nullable = {f.name: f.nullable for f in reading.schema}
    assert nullable["big_text"] is True and nullable["id"] is False  # a key column is always sent
    out = reading.decode_all(cdc_types(run))
    # a NULL Debezium did send still breaks NOT NULL: only the values it did not send are let through
    assert not [d for d in out.dead_letters if d.reason.startswith(REASON)]
    assert {d.reason for d in out.dead_letters} == {"is NULL or missing, but the column is declared NOT NULL"}
    listed = [c.row for c in out.changes if c.row["unavailable_columns"]]
    assert [row["unavailable_columns"] for row in listed] == [["big_text", "big_jsonb"], ["big_jsonb"]]
    assert listed[0]["big_text"] is None


def test_fail_keeps_the_declared_nullability() -> None:
    reading = decoder({"unavailable-values": "fail"}, ("unavailable-columns",))
    assert reading.schema.field("big_text").nullable is False


def test_the_avro_form_refuses_it_the_same_way() -> None:
    schema = parse_ddl("id INT NOT NULL, notes STRING NOT NULL")
    options = {"schema": ENVELOPE_TEXT, "unavailable-values": "report", "ignore-parse-errors": "true"}
    update = messages()[1:2]  # notes unchanged: the placeholder in before and after
    out = FACTORY.create_decoder(options, schema).decode_all(update)
    [letter] = out.dead_letters
    assert letter.field == "before.notes" and letter.reason.startswith(REASON)
    listed = FACTORY.create_decoder(options, schema, ["unavailable-columns"])
    assert listed.schema.field("notes").nullable is True
    out = listed.decode_all(update)
    assert out.dead_letters == [] and out.changes[-1].row["unavailable_columns"] == ["notes"]
