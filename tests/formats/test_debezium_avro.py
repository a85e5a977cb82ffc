"""debezium-avro-confluent decoding: Connect logical types from the writer schema, errors, and the
same changelog as debezium-json with its schema block."""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal
from typing import Any

import orjson
import pytest
from avro_events import (
    ENVELOPE,
    ENVELOPE_TEXT,
    EVENTS,
    FACTORY,
    INFERRED_DDL,
    ROWS,
    confluent,
    explicit_decoder,
    messages,
    rendered,
)

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import (
    DecodeError,
    EncodeError,
    FormatOptionError,
    Message,
    parse_ddl,
    resolve_format,
)

# Decoding a realistic Debezium Avro event.


def test_decodes_connect_logical_types_with_exact_values() -> None:
    decoder = explicit_decoder()
    out = decoder.decode_all(messages())
    assert decoder.schema.ddl() == INFERRED_DDL
    assert rendered(decoder, out.changes) == ROWS
    assert out.changes[0].row["created"] == dt.datetime(2021, 1, 1, 0, 0, 0, 123456)
    assert out.changes[0].row["updated"] == dt.datetime(2021, 1, 1, 6, 0, 0, 500000, tzinfo=dt.UTC)
    assert out.changes[0].row["weight"] == Decimal("5.125")
    assert out.changes[0].row["photo"] == b"\x89PNG"
    assert out.metrics.filled_values == 1  # the TOASTed notes, from the snapshot image of id 101
    assert [e.kind for e in out.events] == ["truncate"]
    assert out.events[0].payload["source"]["lsn"] == 4


def test_key_headers_and_control_event_metadata() -> None:
    decoder = FACTORY.create_decoder({"schema": ENVELOPE_TEXT}, None, ["old-key", "new-key", "source.lsn"])
    events = messages()
    header = b'{"schema":{"type":"struct"},"payload":{"id":100}}'
    first = Message(events[0].value, headers=(("__debezium.oldkey", header),))
    out = decoder.decode_all([first, *events[1:]])
    assert [(c.row["old_key"], c.row["new_key"]) for c in out.changes[:2]] == [
        ('{"id":100}', None),
        (None, None),
    ]
    assert [(e.kind, e.metadata) for e in out.events] == [
        ("truncate", {"old_key": None, "new_key": None, "source_lsn": 4})
    ]


def test_declared_schema_takes_its_columns_from_the_record() -> None:
    schema = parse_ddl(
        "id BIGINT NOT NULL, price DECIMAL(12, 3), created TIMESTAMP_NTZ(6), uid STRING, gone INT"
    )
    decoder = FACTORY.create_decoder({"schema": ENVELOPE_TEXT}, schema)
    out = decoder.decode_all(messages()[:1])
    assert rendered(decoder, out.changes) == [
        "+I[101, 12.500, 2021-01-01T00:00:00.123456, f3b1e7a2-0c4d-4e8b-9a1f-2b3c4d5e6f70, null]"
    ]


def test_a_null_in_a_declared_not_null_column_is_a_dead_letter_not_a_row() -> None:
    # Spark fails the whole query on a NULL in a NOT NULL column (found by the sources' fuzz).
    schema = parse_ddl("id BIGINT NOT NULL, gone INT NOT NULL")
    decoder = FACTORY.create_decoder({"schema": ENVELOPE_TEXT, "ignore-parse-errors": "true"}, schema)
    out = decoder.decode_all(messages()[:1])
    assert out.changes == []
    [letter] = out.dead_letters
    assert letter.field == "after.gone" and "declared NOT NULL" in letter.reason


def test_metadata_columns() -> None:
    keys = ["op", "source.table", "source.lsn", "ingestion-timestamp", "unavailable-columns", "schema"]
    decoder = FACTORY.create_decoder({"schema": ENVELOPE_TEXT, "unavailable-values": "report"}, None, keys)
    out = decoder.decode_all(messages()[1:2])
    row = out.changes[1].row
    assert row["op"] == "u" and row["source_table"] == "products" and row["source_lsn"] == 2
    assert row["ingestion_timestamp"] == dt.datetime(2021, 1, 1, 0, 0, 2, tzinfo=dt.UTC)
    assert row["unavailable_columns"] == ["notes"] and row["notes"] is None
    assert json.loads(row["schema"])["name"] == "Envelope"
    assert decoder.schema.names[-6:] == [
        "op",
        "source_table",
        "source_lsn",
        "ingestion_timestamp",
        "unavailable_columns",
        "schema",
    ]


def test_upsert_mode_reads_updates_without_before() -> None:
    event = {**EVENTS[1], "before": None}
    decoder = explicit_decoder(**{"changelog-mode": "upsert"})
    out = decoder.decode_all(
        [Message(confluent(1, ENVELOPE, EVENTS[0])), Message(confluent(1, ENVELOPE, event))]
    )
    assert [c.kind for c in out.changes] == [RowKind.INSERT, RowKind.UPDATE_AFTER]
    assert out.changes[1].row["notes"] == "long text"


def test_plain_avro_logical_types_without_connect_names() -> None:
    value = {
        "type": "record",
        "name": "V",
        "fields": [
            {"name": "d", "type": {"type": "int", "logicalType": "date"}},
            {"name": "t", "type": {"type": "long", "logicalType": "time-micros"}},
            {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "n", "type": {"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 1}},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "m", "type": {"type": "map", "values": ["null", "long"]}},
            {"name": "s", "type": {"type": "record", "name": "S", "fields": [{"name": "a", "type": "int"}]}},
        ],
    }
    envelope = {
        "type": "record",
        "name": "E",
        "fields": [
            {"name": "after", "type": ["null", value]},
            {"name": "before", "type": ["null", "V"]},
            {"name": "op", "type": "string"},
        ],
    }
    datum = {
        "d": dt.date(2020, 2, 29),
        "t": dt.time(23, 59, 59, 999999),
        "ts": dt.datetime(2020, 1, 1, 12, 0, 0, 1000, tzinfo=dt.UTC),
        "n": Decimal("-1234.5"),
        "tags": ["a"],
        "m": {"k": 1, "z": None},
        "s": {"a": 3},
    }
    decoder = FACTORY.create_decoder({"schema": json.dumps(envelope)})
    out = decoder.decode_all([Message(confluent(3, envelope, {"after": datum, "before": None, "op": "c"}))])
    assert decoder.schema.ddl() == (
        "d DATE NOT NULL, t TIME NOT NULL, ts TIMESTAMP_NTZ(3) NOT NULL, n DECIMAL(5, 1) NOT NULL, "
        "tags ARRAY<STRING> NOT NULL, m MAP<STRING, BIGINT> NOT NULL, s STRUCT<a: INT NOT NULL> NOT NULL"
    )
    assert rendered(decoder, out.changes) == [
        "+I[2020-02-29, 23:59:59.999999, 2020-01-01T12:00:00.001, -1234.5, [a], {k=1, z=null}, +I[3]]"
    ]


# The same events through debezium-json with Kafka Connect's schema block give the same changelog.


def _connect_value_schema() -> list[dict[str, Any]]:
    def leaf(kind: str, field: str, name: str | None = None, **extra: Any) -> dict[str, Any]:
        out = {"type": kind, "optional": True, "field": field, **extra}
        return {**out, "name": name} if name else out

    return [
        {"type": "int32", "optional": False, "field": "id"},
        leaf("string", "name"),
        leaf(
            "bytes",
            "price",
            "org.apache.kafka.connect.data.Decimal",
            version=1,
            parameters={"scale": "2", "connect.decimal.precision": "10"},
        ),
        {
            "type": "struct",
            "optional": True,
            "field": "weight",
            "name": "io.debezium.data.VariableScaleDecimal",
            "fields": [
                {"type": "int32", "optional": False, "field": "scale"},
                {"type": "bytes", "optional": False, "field": "value"},
            ],
        },
        leaf("int32", "born", "io.debezium.time.Date"),
        leaf("int64", "opens", "io.debezium.time.MicroTime"),
        leaf("int64", "created", "io.debezium.time.MicroTimestamp"),
        leaf("string", "updated", "io.debezium.time.ZonedTimestamp"),
        leaf("string", "attrs", "io.debezium.data.Json"),
        leaf("string", "uid", "io.debezium.data.Uuid"),
        leaf("bytes", "photo"),
        leaf("string", "notes"),
        leaf("int16", "small"),
    ]


def _connect_row(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    out = dict(row)
    if row["price"] is not None:
        unscaled = int(row["price"].scaleb(2))
        out["price"] = base64.b64encode(unscaled.to_bytes(2, "big", signed=True)).decode()
    if row["weight"] is not None:
        out["weight"] = {"scale": 3, "value": base64.b64encode(row["weight"]["value"]).decode()}
    out["photo"] = base64.b64encode(row["photo"]).decode()
    return out


def test_same_changelog_as_debezium_json_with_schema_block() -> None:
    value = {"type": "struct", "optional": True, "fields": _connect_value_schema()}
    schema_block = {
        "type": "struct",
        "fields": [
            {**value, "field": "before"},
            {**value, "field": "after"},
            {"type": "string", "field": "op"},
        ],
    }
    json_messages = [
        Message(
            orjson.dumps(
                {
                    "schema": schema_block,
                    "payload": {**e, "before": _connect_row(e["before"]), "after": _connect_row(e["after"])},
                }
            ),
            offset=i,
        )
        for i, e in enumerate(EVENTS)
    ]
    json_decoder = resolve_format("debezium-json").create_decoder(
        {"schema-include": "true", "key-columns": "id"}, None
    )
    json_out = json_decoder.decode_all(json_messages)
    avro_decoder = explicit_decoder()
    avro_out = avro_decoder.decode_all(messages())
    assert json_decoder.schema == avro_decoder.schema
    assert [(c.kind, c.row) for c in avro_out.changes] == [(c.kind, c.row) for c in json_out.changes]
    assert rendered(json_decoder, json_out.changes) == ROWS


# Errors.


def test_not_confluent_wire_format() -> None:
    decoder = explicit_decoder()
    with pytest.raises(
        DecodeError, match=r"offset 3: not Confluent wire format: first byte is 0x7b, expected 0x00"
    ):
        decoder.decode_all([Message(b'{"op": "c"}', offset=3)])


def test_unknown_schema_id_without_registry() -> None:
    decoder = FACTORY.create_decoder({"schema": ENVELOPE_TEXT, "schema-id": "42"})
    with pytest.raises(
        DecodeError,
        match=r"unknown schema id 7 \(the 'debezium-avro-confluent.schema' option is "
        r"for id 42\): set 'debezium-avro-confluent.url'",
    ):
        decoder.decode_all(messages(7)[:1])


def test_bad_records_are_dead_lettered() -> None:
    decoder = explicit_decoder(**{"ignore-parse-errors": "true"})
    short, truncated = Message(b"\x00\x00\x00"), Message(messages()[0].value[:20])  # type: ignore[index]
    out = decoder.decode_all([short, truncated, Message(b"\x01abc")])
    assert [d.reason[:40] for d in out.dead_letters] == [
        "the message has 3 bytes, fewer than the ",
        "the Avro body does not match writer sche",
        "not Confluent wire format: first byte is",
    ]


def test_update_without_before_in_retract_mode() -> None:
    decoder = explicit_decoder()
    with pytest.raises(DecodeError, match=r"field 'before': the UPDATE has no before image"):
        decoder.decode_all([Message(confluent(1, ENVELOPE, {**EVENTS[1], "before": None}))])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, r"needs the writer schemas: set 'debezium-avro-confluent.url'"),
        ({"schema": "{not json"}, r"option 'debezium-avro-confluent.schema' is not a valid Avro schema"),
        ({"schema": ENVELOPE_TEXT, "schema-id": "x"}, r"'x' is not a schema id"),
        ({"basic-auth.user-info": "u:p"}, r"need 'debezium-avro-confluent.url'"),
        ({"url": "ftp://registry"}, r"Schema Registry options are not valid: Invalid url ftp://registry"),
        ({"url": "http://r:8081", "bearer-auth.token": "t"}, r"bearer.auth.logical.cluster"),
        (
            {"url": "http://r:8081", "format": "x"},
            r"Unsupported options for format 'debezium-avro-confluent'",
        ),
    ],
)
def test_option_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(FormatOptionError, match=message):
        FACTORY.create_decoder(options)


def test_encoder_needs_a_schema_id_or_registry() -> None:
    schema = parse_ddl("id INT NOT NULL")
    with pytest.raises(FormatOptionError, match=r"set 'debezium-avro-confluent.url' to register"):
        FACTORY.create_encoder({}, schema)
    with pytest.raises(FormatOptionError, match=r"set 'debezium-avro-confluent.subject'"):
        FACTORY.create_encoder({"url": "mock://x"}, schema)


def test_encoder_reports_unwritable_values() -> None:
    encoder = FACTORY.create_encoder({"schema-id": "1"}, parse_ddl("id INT NOT NULL"))
    with pytest.raises(EncodeError, match=r"cannot write 'c' event as Avro"):
        encoder.encode_all([Change(RowKind.INSERT, {"id": None})])
