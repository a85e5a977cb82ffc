"""Bytes kept in a STRING column stay lossless: base64 text, as Flink keeps Kafka Connect's JSON text.

A Debezium ``bytes`` field (or an Avro ``bytes``) declared STRING is its base64 text; a struct with bytes
(a PostGIS / MySQL geometry, ``io.debezium.data.geometry.Geometry {wkb, srid}``) declared STRING is its
JSON text with the bytes as base64 — Flink's ``JsonNode.toString()`` of the same object. No Python repr
(``b'\\x01...'``) reaches a row or anything an encoder writes, and JSON kept as text keeps exact digits.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import orjson
import pytest
from avro_events import ENVELOPE, EVENTS, confluent

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import Message, parse_ddl, resolve_format

# A MySQL POINT(1 1) as Debezium writes it: WKB (little-endian point) and the SRID.
WKB = bytes.fromhex("0101000000000000000000f03f000000000000f03f")
NOT_UTF8 = b"\xff\x00\x89PNG\x80"
GEOMETRY = {
    "type": "struct",
    "fields": [
        {"type": "bytes", "optional": False, "field": "wkb"},
        {"type": "int32", "optional": True, "field": "srid"},
    ],
    "optional": True,
    "name": "io.debezium.data.geometry.Geometry",
}
DECIMAL_FIELD = {
    "type": "bytes",
    "optional": True,
    "name": "org.apache.kafka.connect.data.Decimal",
    "parameters": {"scale": "2", "connect.decimal.precision": "10"},
}
VALUE = {
    "type": "struct",
    "fields": [
        {"type": "int32", "optional": False, "field": "id"},
        {**GEOMETRY, "field": "geom"},
        {**GEOMETRY, "field": "shape"},
        {"type": "bytes", "optional": True, "field": "raw"},
        {
            "type": "struct",
            "fields": [
                {**DECIMAL_FIELD, "field": "price"},
                {"type": "bytes", "optional": True, "field": "tag"},
            ],
            "optional": True,
            "name": "shop.Priced",
            "field": "priced",
        },
    ],
    "optional": True,
    "name": "dbserver1.shop.things.Value",
}
ENVELOPE_SCHEMA = {
    "type": "struct",
    "fields": [{**VALUE, "field": "before"}, {**VALUE, "field": "after"}, {"type": "string", "field": "op"}],
    "optional": False,
    "name": "dbserver1.shop.things.Envelope",
}
B64 = base64.b64encode
AFTER = {
    "id": 1,
    "geom": {"wkb": B64(WKB).decode(), "srid": 4326},
    "shape": {"wkb": B64(WKB).decode(), "srid": None},
    "raw": B64(NOT_UTF8).decode(),
    "priced": {"price": B64((1250).to_bytes(2, "big")).decode(), "tag": B64(b"\x01\x02").decode()},
}
DECLARED = "id INT NOT NULL, geom STRING, shape STRUCT<wkb: STRING, srid: INT>, raw STRING, priced STRING"


def flink_text(value: Any) -> str:
    """Flink's STRING of a JSON value: the text itself, else ``JsonNode.toString()`` (compact JSON)."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def schema_include_message() -> Message:
    payload = {"before": None, "after": AFTER, "op": "c"}
    return Message(orjson.dumps({"schema": ENVELOPE_SCHEMA, "payload": payload}))


def decoded_row(declared: str = DECLARED) -> dict[str, Any]:
    factory = resolve_format("debezium-json")
    decoder = factory.create_decoder({"schema-include": "true"}, parse_ddl(declared))
    out = decoder.decode_all([schema_include_message()])
    [change] = out.changes
    return change.row


def test_connect_bytes_declared_string_is_the_base64_text_flink_keeps() -> None:
    row = decoded_row()
    assert row["raw"] == flink_text(AFTER["raw"]) == "/wCJUE5HgA=="
    assert base64.b64decode(row["raw"]) == NOT_UTF8  # lossless, no replacement characters
    assert "\ufffd" not in row["raw"]


def test_geometry_struct_declared_string_is_json_with_base64() -> None:
    row = decoded_row()
    assert row["geom"] == flink_text(AFTER["geom"]) == '{"wkb":"AQEAAAAAAAAAAADwPwAAAAAAAPA/","srid":4326}'
    assert base64.b64decode(json.loads(row["geom"])["wkb"]) == WKB
    assert "b'" not in row["geom"]


def test_struct_with_a_decimal_and_bytes_declared_string_is_exact_json() -> None:
    row = decoded_row()
    # The decimal keeps its digits as a JSON number; the bytes stay base64.
    assert row["priced"] == '{"price":12.50,"tag":"AQI="}'


def test_bytes_field_of_a_declared_struct_as_string_is_base64() -> None:
    assert decoded_row()["shape"] == {"wkb": "AQEAAAAAAAAAAADwPwAAAAAAAPA/", "srid": None}


def avro_envelope() -> dict[str, Any]:
    envelope = copy.deepcopy(ENVELOPE)
    value = envelope["fields"][0]["type"][1]
    value["fields"].append(
        {
            "name": "geom",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Geometry",
                    "namespace": "io.debezium.data.geometry",
                    "fields": [{"name": "wkb", "type": "bytes"}, {"name": "srid", "type": ["null", "int"]}],
                    "connect.name": "io.debezium.data.geometry.Geometry",
                },
            ],
            "default": None,
        }
    )
    return envelope


def test_avro_bytes_and_geometry_declared_string_are_base64() -> None:
    envelope = avro_envelope()
    event = copy.deepcopy(EVENTS[0])
    event["after"] = {**event["after"], "photo": NOT_UTF8, "geom": {"wkb": WKB, "srid": 4326}}
    factory = resolve_format("debezium-avro-confluent")
    decoder = factory.create_decoder(
        {"schema": json.dumps(envelope)}, parse_ddl("id INT NOT NULL, photo STRING, geom STRING")
    )
    out = decoder.decode_all([Message(confluent(42, envelope, event))])
    row = out.changes[0].row
    assert row["photo"] == B64(NOT_UTF8).decode()
    assert row["geom"] == '{"wkb":"AQEAAAAAAAAAAADwPwAAAAAAAPA/","srid":4326}'


ROUND_TRIP_DDL = (
    "id INT NOT NULL, geom STRING, raw STRING, blob BINARY, shape STRUCT<wkb: BINARY, srid: INT>, "
    "tags ARRAY<BINARY>"
)
ENCODERS = [
    ("debezium-json", {}),
    ("debezium-json", {"schema-include": "true"}),
    ("debezium-avro-confluent", {"schema-id": "7"}),
    ("canal-json", {}),
    ("maxwell-json", {}),
    ("ogg-json", {}),
    ("generic", {}),
    ("upsert-kafka", {"key.fields": "id"}),
]


def changes_with_bytes() -> list[Change]:
    decoded = decoded_row("id INT NOT NULL, geom STRING, raw STRING")
    row = {
        "id": 1,
        "geom": decoded["geom"],
        "raw": decoded["raw"],
        "blob": WKB,
        "shape": {"wkb": WKB, "srid": 4326},
        "tags": [b"\x01", NOT_UTF8],
    }
    after = {**row, "blob": NOT_UTF8, "shape": {"wkb": NOT_UTF8, "srid": None}}
    return [
        Change(RowKind.INSERT, row),
        Change(RowKind.UPDATE_BEFORE, row),
        Change(RowKind.UPDATE_AFTER, after),
        Change(RowKind.DELETE, after),
    ]


@pytest.mark.parametrize(("name", "options"), ENCODERS, ids=[f"{n}{'+' if o else ''}" for n, o in ENCODERS])
def test_no_python_repr_in_any_encoded_output_and_it_reads_back(name: str, options: dict[str, str]) -> None:
    schema = parse_ddl(ROUND_TRIP_DDL)
    factory = resolve_format(name)
    encoder = factory.create_encoder(options, schema, ["id"])
    changes = changes_with_bytes()
    encoded = encoder.encode_all(changes)
    assert encoded
    for item in encoded:
        for data in (item.key, item.value):
            assert data is None or (b"b'" not in data and b"bytearray(" not in data), data
    writer = {"schema": encoder.writer_schema} if name == "debezium-avro-confluent" else {}
    decoder = factory.create_decoder({**options, **writer}, schema)
    out = decoder.decode_all([Message(item.value, key=item.key) for item in encoded])
    # Every image read back holds the same text (upsert-kafka's delete is a tombstone: no image).
    texts = {(c.row["geom"], c.row["raw"]) for c in out.changes if c.row["geom"] is not None}
    assert texts == {(changes[0].row["geom"], changes[0].row["raw"])}


EXACT_DDL = "id INT, amount DECIMAL(20,2), attrs STRING"
EXACT_MESSAGES = {
    "maxwell-json": b'{"database":"d","table":"t","type":"insert","data":{"id":1,'
    b'"amount":123456789012345678.12,"attrs":{"w":1.5,"big":12345678901234567890.5}}}',
    "generic": b'{"id":1,"amount":123456789012345678.12,"attrs":{"w":1.5,"big":12345678901234567890.5},'
    b'"op":"INSERT"}',
}


@pytest.mark.parametrize("name", sorted(EXACT_MESSAGES))
def test_json_in_a_string_column_of_a_message_read_with_exact_decimals_keeps_its_digits(name: str) -> None:
    """A long DECIMAL makes the decoder re-read the message with exact decimals: the JSON object in the
    STRING column then holds decimals, which used to fail with a TypeError (not even a DecodeError)."""
    decoder = resolve_format(name).create_decoder({}, parse_ddl(EXACT_DDL))
    [change] = decoder.decode_all([Message(EXACT_MESSAGES[name])]).changes
    assert change.row["attrs"] == '{"w":1.5,"big":12345678901234567890.5}'
