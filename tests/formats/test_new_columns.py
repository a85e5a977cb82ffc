"""A column added upstream, for a decoder whose columns were inferred: the message's own schema (Connect
schema block, Avro writer schema, Canal ``mysqlType``) has a column the inferred ones lack. The decoder
raises :class:`NewColumnsError` with the new columns and their types (never a dead letter); a decoder
whose columns were declared by the user keeps reading its own columns."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from avro_events import ENVELOPE_TEXT, FACTORY, messages

from cdcflow.formats import Message, parse_ddl, resolve_format
from cdcflow.formats.errors import NewColumnsError

_ID = {"field": "id", "type": "int32", "optional": False}
_NAME = {"field": "name", "type": "string", "optional": True}
_NOTE = {
    "field": "note",
    "type": "bytes",
    "name": "org.apache.kafka.connect.data.Decimal",
    "parameters": {"scale": "2", "connect.decimal.precision": "8"},
    "optional": False,
}


def _debezium(fields: list[dict[str, Any]], after: dict[str, Any]) -> Message:
    image = {"type": "struct", "optional": True, "fields": fields}
    schema = {
        "type": "struct",
        "fields": [
            {**image, "field": "before"},
            {**image, "field": "after"},
            {"type": "string", "field": "op"},
        ],
    }
    payload = {"before": None, "after": after, "op": "c"}
    return Message(orjson.dumps({"schema": schema, "payload": payload}), topic="t", partition=0, offset=3)


def _inferred(options: dict[str, str], first: Message, name: str = "debezium-json") -> Any:
    """What the Spark source does: infer from a first message, then pin those columns."""
    factory = resolve_format(name)
    probe = factory.create_decoder(options, None)
    probe.decode_all([first])
    return factory.create_decoder(options, probe.schema).failing_on_new_columns()


def test_debezium_json_schema_block_with_a_new_column() -> None:
    options = {"schema-include": "true", "ignore-parse-errors": "true"}
    old = _debezium([_ID, _NAME], {"id": 1, "name": "a"})
    new = _debezium([_ID, _NAME, _NOTE], {"id": 2, "name": "b", "note": "MDk="})
    decoder = _inferred(options, old)
    assert [c.row for c in decoder.decode_all([old]).changes] == [{"id": 1, "name": "a"}]
    with pytest.raises(NewColumnsError) as error:
        decoder.decode_all([old, new])
    assert error.value.columns == parse_ddl("note DECIMAL(8, 2)")
    # Declared by the user: the declared columns are what is read, the rest of the message is not.
    declared = resolve_format("debezium-json").create_decoder(
        options, parse_ddl("id INT NOT NULL, name STRING")
    )
    assert [c.row for c in declared.decode_all([new]).changes] == [{"id": 2, "name": "b"}]


def test_debezium_json_a_removed_column_is_null_not_an_error() -> None:
    decoder = _inferred({"schema-include": "true"}, _debezium([_ID, _NAME], {"id": 1, "name": "a"}))
    out = decoder.decode_all([_debezium([_ID], {"id": 2})])
    assert [c.row for c in out.changes] == [{"id": 2, "name": None}]


def _canal(types: dict[str, str], row: dict[str, Any]) -> Message:
    envelope = {
        "type": "INSERT",
        "database": "d",
        "table": "t",
        "isDdl": False,
        "mysqlType": types,
        "data": [row],
    }
    return Message(orjson.dumps(envelope), topic="t", partition=0, offset=9)


def test_canal_mysql_type_with_a_new_column() -> None:
    old = _canal({"id": "int", "name": "varchar(10)"}, {"id": "1", "name": "a"})
    new = _canal(
        {"id": "int", "name": "varchar(10)", "note": "decimal(8,2)"}, {"id": "2", "name": "b", "note": "1.50"}
    )
    decoder = _inferred({}, old, "canal-json")
    assert decoder.decode_all([old]).changes[0].row == {"id": 1, "name": "a"}
    with pytest.raises(NewColumnsError) as error:
        decoder.decode_all([new])
    assert error.value.columns == parse_ddl("note DECIMAL(8, 2)")


def test_avro_writer_schema_with_a_new_column() -> None:
    narrow = orjson.loads(ENVELOPE_TEXT)
    value = narrow["fields"][0]["type"][1]
    value["fields"] = [f for f in value["fields"] if f["name"] != "small"]
    inferred = FACTORY.create_decoder({"schema": orjson.dumps(narrow).decode()}, None).schema
    # The writer schema is read when the decoder is built (option 'schema'), else per schema id.
    pinned = FACTORY.create_decoder({"schema": ENVELOPE_TEXT}, inferred)
    assert "small" not in pinned.decode_all(messages()[:1]).changes[0].row
    with pytest.raises(NewColumnsError) as error:
        pinned.failing_on_new_columns()
    assert error.value.columns == parse_ddl("small SMALLINT")


def test_debezium_json_a_column_whose_type_widens_is_named_with_its_wider_type() -> None:
    """``ALTER TABLE ... ALTER COLUMN qty TYPE bigint``: the schema block's qty turns int64."""
    qty = {"field": "qty", "type": "int32", "optional": True}
    old = _debezium([_ID, qty], {"id": 1, "qty": 5})
    new = _debezium([_ID, {**qty, "type": "int64"}], {"id": 2, "qty": 2**40})
    decoder = _inferred({"schema-include": "true"}, old)
    with pytest.raises(NewColumnsError) as error:
        decoder.decode_all([old, new])
    assert error.value.columns == parse_ddl("qty BIGINT")
    # narrower or of another kind: no widening; the value is converted to the column's type (or fails)
    narrower = _debezium([_ID, {**qty, "type": "int16"}], {"id": 3, "qty": 7})
    assert [c.row for c in decoder.decode_all([narrower]).changes] == [{"id": 3, "qty": 7}]


def test_canal_mysql_type_that_widens_is_named_with_its_wider_type() -> None:
    old = _canal({"id": "int", "qty": "int(11)"}, {"id": "1", "qty": "5"})
    new = _canal({"id": "int", "qty": "bigint(20)"}, {"id": "2", "qty": str(2**40)})
    decoder = _inferred({}, old, "canal-json")
    with pytest.raises(NewColumnsError) as error:
        decoder.decode_all([old, new])
    assert error.value.columns == parse_ddl("qty BIGINT")


@pytest.mark.parametrize(
    ("old", "new", "widens"),
    [
        ("TINYINT", "SMALLINT", True),
        ("INT", "BIGINT", True),
        ("BIGINT", "INT", False),
        ("FLOAT", "DOUBLE", True),
        ("DOUBLE", "FLOAT", False),
        ("DECIMAL(10, 2)", "DECIMAL(12, 2)", True),
        ("DECIMAL(10, 2)", "DECIMAL(12, 3)", False),
        ("INT", "STRING", False),
        ("INT", "DOUBLE", False),
    ],
)
def test_widens_is_what_delta_holds_exactly(old: str, new: str, widens: bool) -> None:
    from cdcflow.formats.types import widens as widening

    assert widening(parse_ddl(f"c {old}").field("c").type, parse_ddl(f"c {new}").field("c").type) is widens
