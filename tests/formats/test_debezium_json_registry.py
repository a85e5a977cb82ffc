"""debezium-json-registry: Debezium envelopes in Confluent's JSON Schema wire format.

The golden inputs are real Debezium 3.6 PostgreSQL envelopes (``recorded/postgres/no-schemas.jsonl``,
Kafka Connect's JSON converter without schemas: the same envelope JSON the JsonSchemaConverter
writes, decimals as base64 as its default ``decimal.format``), framed here by hand as
``0x00 + id (4 bytes, big-endian) + JSON``, with the JSON Schema the JsonSchemaConverter registers
for their Connect schema (``recorded/postgres/schemas.jsonl``), written out below. Registries:
confluent-kafka's ``mock://`` client, and the HTTP stand-in of ``registry_server.py``.
"""

from __future__ import annotations

import datetime as dt
import json
import pickle
import struct
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from registry_server import RegistryHandler, serving

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import DecodeError, Message, parse_ddl, resolve_format
from cdcflow.formats.confluent.client import registry_client

FACTORY = resolve_format("debezium-json-registry")
RECORDED = Path(__file__).parent / "recorded" / "postgres" / "no-schemas.jsonl"


def optional(schema: dict[str, Any], index: int) -> dict[str, Any]:
    return {"oneOf": [{"type": "null"}, schema], "connect.index": index}


# What JsonSchemaConverter registers for cdcflow.inventory.cdc_small (Debezium 3.6, PostgreSQL);
# the source block is cut to a few of its fields (objects allow additional properties).
SMALL_VALUE = {
    "type": "object",
    "title": "cdcflow.inventory.cdc_small.Value",
    "properties": {
        "id": {"type": "integer", "connect.index": 0, "connect.type": "int32"},
        "label": optional({"type": "string"}, 1),
    },
}
SMALL_SCHEMA = json.dumps(
    {
        "type": "object",
        "title": "cdcflow.inventory.cdc_small.Envelope",
        "connect.version": 2,
        "properties": {
            "before": optional(SMALL_VALUE, 0),
            "after": optional(SMALL_VALUE, 1),
            "source": {
                "type": "object",
                "title": "io.debezium.connector.postgresql.Source",
                "properties": {
                    "version": {"type": "string", "connect.index": 0},
                    "connector": {"type": "string", "connect.index": 1},
                    "table": {"type": "string", "connect.index": 10},
                    "lsn": optional({"type": "integer", "connect.type": "int64"}, 12),
                },
                "connect.index": 2,
            },
            "op": {"type": "string", "connect.index": 4},
            "ts_ms": optional({"type": "integer", "connect.type": "int64"}, 5),
        },
    }
)

# cdcflow.inventory.cdc_types, a few of its columns: Decimal (base64 in the records), MicroTimestamp,
# ZonedTimestamp, Date, bytes. The record's other columns are not in this schema: not read.
TYPES_VALUE = {
    "type": "object",
    "title": "cdcflow.inventory.cdc_types.Value",
    "properties": {
        "id": {"type": "integer", "connect.index": 0, "connect.type": "int32"},
        "c_numeric": optional(
            {
                "type": "number",
                "title": "org.apache.kafka.connect.data.Decimal",
                "connect.version": 1,
                "connect.parameters": {"scale": "3", "connect.decimal.precision": "12"},
                "connect.type": "bytes",
            },
            1,
        ),
        "c_bigint": optional({"type": "integer", "connect.type": "int64"}, 7),
        "c_boolean": optional({"type": "boolean"}, 8),
        "c_date": optional(
            {
                "type": "integer",
                "title": "io.debezium.time.Date",
                "connect.version": 1,
                "connect.type": "int32",
            },
            9,
        ),
        "c_timestamp": optional(
            {
                "type": "integer",
                "title": "io.debezium.time.MicroTimestamp",
                "connect.version": 1,
                "connect.type": "int64",
            },
            12,
        ),
        "c_timestamptz": optional(
            {"type": "string", "title": "io.debezium.time.ZonedTimestamp", "connect.version": 1}, 14
        ),
        "c_bytea": optional({"type": "string", "connect.type": "bytes"}, 18),
    },
}
TYPES_SCHEMA = json.dumps(
    {
        "type": "object",
        "title": "cdcflow.inventory.cdc_types.Envelope",
        "properties": {
            "before": optional(TYPES_VALUE, 0),
            "after": optional(TYPES_VALUE, 1),
            "op": {"type": "string", "connect.index": 4},
        },
    }
)


def recorded(table: str) -> list[bytes]:
    """The recorded envelopes of ``cdcflow.inventory.<table>`` (tombstones left out), as JSON bytes."""
    values = []
    for line in RECORDED.read_text().splitlines():
        record = json.loads(line)
        if record["topic"] == f"cdcflow.inventory.{table}" and record["value"] is not None:
            values.append(record["value"].encode())
    return values


def framed(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + body


def messages(schema_id: int, table: str, topic: str = "cdcflow.inventory.cdc_small") -> list[Message]:
    return [
        Message(framed(schema_id, body), topic=topic, partition=0, offset=offset)
        for offset, body in enumerate(recorded(table))
    ]


def test_golden_recorded_postgres_events_with_an_explicit_writer_schema() -> None:
    decoder = FACTORY.create_decoder({"schema": SMALL_SCHEMA, "schema-id": "17"})
    wire = messages(17, "cdc_small")
    # The framing is the one the JsonSchemaConverter writes: 0x00, the id, the JSON text.
    assert wire[0].value is not None
    assert wire[0].value[:5] == b"\x00\x00\x00\x00\x11"
    assert wire[0].value[5:].startswith(b'{"before":null,"after":{"id":1,"label":"snapshot row"}')
    out = decoder.decode_all(wire)
    assert [str(c) for c in out.changes] == [
        "+I[1, snapshot row]",
        "+I[2, streamed row]",
        "+I[99, end]",
    ]
    assert [(e.kind, e.message.offset) for e in out.events] == [("truncate", 2)]
    assert decoder.schema == parse_ddl("id INT NOT NULL, label STRING")
    assert out.dead_letters == []


def test_golden_recorded_types_read_through_the_connect_annotations() -> None:
    decoder = FACTORY.create_decoder({"schema": TYPES_SCHEMA, "validate": "true"})
    first = messages(3, "cdc_types", topic="cdcflow.inventory.cdc_types")[0]
    out = decoder.decode_all([first])
    assert out.dead_letters == []  # base64 decimals pass validation against "type": "number"
    assert decoder.schema == parse_ddl(
        "id INT NOT NULL, c_numeric DECIMAL(12, 3), c_bigint BIGINT, c_boolean BOOLEAN, c_date DATE, "
        "c_timestamp TIMESTAMP_NTZ(6), c_timestamptz TIMESTAMP, c_bytea BINARY"
    )
    # As PostgreSQL printed the row (expected.json): 123456789.123, 9223372036854775807, true,
    # 2024-02-29, 2024-02-29 13:14:15.123456, 2024-02-29 07:44:15.123456+00, \x00ff00ff7f80.
    assert [(c.kind, c.row) for c in out.changes] == [
        (
            RowKind.INSERT,
            {
                "id": 1,
                "c_numeric": Decimal("123456789.123"),
                "c_bigint": 9223372036854775807,
                "c_boolean": True,
                "c_date": dt.date(2024, 2, 29),
                "c_timestamp": dt.datetime(2024, 2, 29, 13, 14, 15, 123456),
                "c_timestamptz": dt.datetime(2024, 2, 29, 7, 44, 15, 123456, tzinfo=dt.UTC),
                "c_bytea": bytes.fromhex("00ff00ff7f80"),
            },
        )
    ]


def test_golden_with_the_mock_registry_and_declared_columns() -> None:
    url = "mock://golden"
    from confluent_kafka.schema_registry import Schema as RegistrySchema

    schema_id = registry_client((("url", url),)).register_schema(
        "cdcflow.inventory.cdc_small-value", RegistrySchema(SMALL_SCHEMA, "JSON")
    )
    decoder = FACTORY.create_decoder({"url": url, "validate": "true"}, parse_ddl("label STRING, id BIGINT"))
    out = decoder.decode_all(messages(schema_id, "cdc_small"))
    assert [str(c) for c in out.changes] == ["+I[snapshot row, 1]", "+I[streamed row, 2]", "+I[end, 99]"]
    unknown = Message(framed(9999, recorded("cdc_small")[0]), topic="products", partition=0, offset=5)
    with pytest.raises(
        DecodeError,
        match=r"topic 'products' partition 0 offset 5: schema id 9999 is not in the Schema Registry at "
        r"mock://golden",
    ):
        decoder.decode_all([unknown])


def test_bad_magic_byte_and_non_json_bytes_are_clear_errors() -> None:
    decoder = FACTORY.create_decoder({"schema": SMALL_SCHEMA})
    body = recorded("cdc_small")[0]
    with pytest.raises(
        DecodeError,
        match=r"cannot decode topic 't' partition 1 offset 9: not Confluent wire format: first byte is 0x7b",
    ):
        decoder.decode_all([Message(body, topic="t", partition=1, offset=9)])
    with pytest.raises(DecodeError, match=r"topic 't' partition 1 offset 10: not valid JSON"):
        decoder.decode_all([Message(framed(1, b"\xff\xfe not json"), topic="t", partition=1, offset=10)])
    with pytest.raises(DecodeError, match=r"fewer than the 5-byte Confluent header"):
        decoder.decode_all([Message(b"\x00\x00\x01")])


BROKEN = (
    b'{"before":null,"after":{"id":"x","label":"snapshot row"},"source":{"version":"3.6.3.Final",'
    b'"connector":"postgresql","table":"cdc_small","lsn":1},"op":"c","ts_ms":1}'
)


def test_a_record_breaking_its_schema_is_dead_lettered_with_the_validator_message() -> None:
    decoder = FACTORY.create_decoder(
        {"schema": SMALL_SCHEMA, "validate": "true", "ignore-parse-errors": "true"}
    )
    good = messages(17, "cdc_small")[:2]
    bad = Message(framed(17, BROKEN), topic="cdcflow.inventory.cdc_small", partition=0, offset=2)
    out = decoder.decode_all([good[0], bad, good[1]])
    assert [str(c) for c in out.changes] == ["+I[1, snapshot row]", "+I[2, streamed row]"]
    [letter] = out.dead_letters
    assert letter.message.value == framed(17, BROKEN)
    assert letter.field == "after.id"
    assert letter.reason == "does not match writer schema 17 at $.after.id: 'x' is not of type 'integer'"
    assert letter.format_name == "debezium-json-registry"

    strict = FACTORY.create_decoder({"schema": SMALL_SCHEMA, "validate": "true"})
    with pytest.raises(
        DecodeError,
        match=r"cannot decode topic 'cdcflow.inventory.cdc_small' partition 0 offset 2, field 'after.id': "
        r"does not match writer schema 17 at \$.after.id: 'x' is not of type 'integer'",
    ):
        strict.decode_all([bad])


def test_without_validate_the_same_record_fails_as_the_format_does_for_bad_data() -> None:
    decoder = FACTORY.create_decoder({"schema": SMALL_SCHEMA, "ignore-parse-errors": "true"})
    bad = Message(framed(17, BROKEN), offset=2)
    out = decoder.decode_all([bad])
    [letter] = out.dead_letters
    assert letter.field == "after.id"
    assert "writer schema" not in letter.reason  # not the validator: the INT column's converter
    assert "'x'" in letter.reason or '"x"' in letter.reason


def test_validation_catches_what_the_columns_do_not_read() -> None:
    # "op" is a string in the schema; a number passes the column converters (op is not a column)
    # only to be refused as an operation code: with validate, the schema says why first.
    body = BROKEN.replace(b'"id":"x"', b'"id":3').replace(b'"op":"c"', b'"op":5')
    decoder = FACTORY.create_decoder(
        {"schema": SMALL_SCHEMA, "validate": "true", "ignore-parse-errors": "true"}
    )
    [letter] = decoder.decode_all([Message(framed(17, body))]).dead_letters
    assert letter.reason == "does not match writer schema 17 at $.op: 5 is not of type 'string'"


TABLE = parse_ddl(
    "id INT NOT NULL, name STRING, price DECIMAL(10, 2), ts TIMESTAMP_NTZ(6), at TIMESTAMP, day DATE, "
    "data BINARY, tags ARRAY<STRING>, attrs MAP<INT, STRING>, ratio DOUBLE"
)
CHANGES = [
    Change(
        RowKind.INSERT,
        {
            "id": 1,
            "name": "a",
            "price": Decimal("1.50"),
            "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 678901),
            "at": dt.datetime(2024, 1, 2, 3, 4, 5, 1, tzinfo=dt.UTC),
            "day": dt.date(1969, 12, 31),
            "data": b"\x00\xff",
            "tags": ["x", None],
            "attrs": {1: "one", 2: None},
            "ratio": 0.1,
        },
    ),
    Change(RowKind.INSERT, dict.fromkeys(TABLE.names) | {"id": 2}),
    Change(RowKind.UPDATE_BEFORE, dict.fromkeys(TABLE.names) | {"id": 2}),
    Change(
        RowKind.UPDATE_AFTER,
        dict.fromkeys(TABLE.names) | {"id": 2, "price": Decimal("-99999999.99"), "name": "é ✓"},
    ),
    Change(RowKind.DELETE, dict.fromkeys(TABLE.names) | {"id": 1}),
]


def test_round_trip_through_the_mock_registry() -> None:
    options = {"url": "mock://roundtrip", "validate": "true"}
    encoder = FACTORY.create_encoder(options, TABLE, ["id"], topic="shop.orders")  # type: ignore[call-arg]
    encoded = encoder.encode_all(CHANGES)
    assert len(encoded) == 4  # the update is one "u" event
    registered = registry_client((("url", "mock://roundtrip"),)).get_latest_version("shop.orders-value")
    assert registered.schema.schema_type == "JSON"
    header = b"\x00" + struct.pack(">I", registered.schema_id)
    assert all(e.value is not None and e.value.startswith(header) for e in encoded)
    decoder = FACTORY.create_decoder(options)
    out = decoder.decode_all(Message(e.value, topic="shop.orders") for e in encoded)
    assert out.dead_letters == []
    assert [(c.kind, c.row) for c in out.changes] == [(c.kind, c.row) for c in CHANGES]
    assert decoder.schema == TABLE


def test_encoder_golden_bytes_with_a_known_schema_id() -> None:
    table = parse_ddl("id INT NOT NULL, name STRING, price DECIMAL(10, 2), ts TIMESTAMP_NTZ(6)")
    encoder = FACTORY.create_encoder({"schema-id": "7"}, table)
    row = {"id": 1, "name": "a", "price": Decimal("1.50"), "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 678901)}
    [encoded] = encoder.encode_all([Change(RowKind.INSERT, row)])
    assert encoded.key is None
    assert encoded.value == (
        b"\x00\x00\x00\x00\x07"
        b'{"before":null,"after":{"id":1,"name":"a","price":1.50,"ts":1704164645678901},"op":"c"}'
    )
    keyed = FACTORY.create_encoder({"schema-id": "7"}, table, ["id"])
    [encoded_with_key] = keyed.encode_all([Change(RowKind.INSERT, row)])
    assert encoded_with_key.key == b'{"id":1}'  # the key columns, so a key keeps to one partition
    assert encoded_with_key.value == encoded.value


def test_generated_writer_schema_is_the_converters_form() -> None:
    table = parse_ddl("id INT NOT NULL, price DECIMAL(10, 2)")
    encoder = FACTORY.create_encoder({"schema-id": "7"}, table, topic="shop")  # type: ignore[call-arg]
    value = {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "connect.type": "int32", "connect.index": 0},
            "price": {
                "oneOf": [
                    {"type": "null"},
                    {
                        "type": "number",
                        "connect.type": "bytes",
                        "title": "org.apache.kafka.connect.data.Decimal",
                        "connect.version": 1,
                        "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
                    },
                ],
                "connect.index": 1,
            },
        },
        "title": "shop.Value",
    }
    assert json.loads(encoder.writer_schema) == {
        "type": "object",
        "properties": {
            "before": {"oneOf": [{"type": "null"}, value], "connect.index": 0},
            "after": {"oneOf": [{"type": "null"}, value], "connect.index": 1},
            "op": {"type": "string", "connect.index": 2},
        },
        "title": "shop.Envelope",
    }


def test_round_trip_through_the_http_registry_stand_in() -> None:
    handler = RegistryHandler.fresh()
    with serving(handler) as port:
        options = {"url": f"http://127.0.0.1:{port}"}
        encoder = FACTORY.create_encoder(options, TABLE, ["id"], topic="shop.orders")  # type: ignore[call-arg]
        encoded = encoder.encode_all(CHANGES)
        # A fresh decoder process has no client cache: a new URL spelling gives a new client.
        decoder = FACTORY.create_decoder({"url": f"http://localhost:{port}"})
        out = decoder.decode_all(Message(e.value, topic="shop.orders") for e in encoded)
    assert [(c.kind, c.row) for c in out.changes] == [(c.kind, c.row) for c in CHANGES]
    assert handler.requests[0] == "POST /subjects/shop.orders-value/versions?normalize=False"
    # One fetch of the writer schema, no /associations lookup (the TOPIC strategy).
    assert handler.requests[1:] == ["GET /schemas/ids/1?subject=shop.orders-value"]
    assert handler.schemas[1] == (encoder.writer_schema, "JSON")


def test_decoder_pickles_without_the_client() -> None:
    decoder = FACTORY.create_decoder({"url": "mock://pickled", "schema": SMALL_SCHEMA, "schema-id": "17"})
    decoder.decode_all(messages(17, "cdc_small")[:1])  # builds the deserializer
    clone = pickle.loads(pickle.dumps(decoder))
    assert [str(c) for c in clone.decode_all(messages(17, "cdc_small")[:1]).changes] == [
        "+I[1, snapshot row]"
    ]


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"needs the writer schemas: set 'debezium-json-registry.url'"):
        FACTORY.create_decoder({})
    with pytest.raises(ValueError, match=r"'ture' is not a boolean"):
        FACTORY.create_decoder({"schema": SMALL_SCHEMA, "validate": "ture"})
    with pytest.raises(ValueError, match=r"neither an 'after' nor a 'before' property"):
        FACTORY.create_decoder({"schema": '{"type": "object", "properties": {"op": {"type": "string"}}}'})
    with pytest.raises(ValueError, match=r"the encoder needs a schema id"):
        FACTORY.create_encoder({"schema": SMALL_SCHEMA}, TABLE)


def test_upsert_delete_without_before_takes_the_framed_json_key() -> None:
    decoder = FACTORY.create_decoder(
        {"schema": SMALL_SCHEMA, "changelog-mode": "upsert"}, parse_ddl("id INT NOT NULL, label STRING")
    )
    delete = b'{"before":null,"after":null,"source":{"version":"3.6.3.Final"},"op":"d","ts_ms":1}'
    key = framed(18, b'{"id":7}')  # the key is in the wire format too, under its own schema
    out = decoder.decode_all([Message(framed(17, delete), key=key)])
    assert [str(c) for c in out.changes] == ["-D[7, null]"]
