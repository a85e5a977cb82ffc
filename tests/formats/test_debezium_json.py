"""debezium-json: decoding recorded and hand-built events, errors, TOAST placeholders, metadata, encoding."""

from __future__ import annotations

import base64
import datetime as dt
import json
import pickle
from decimal import Decimal
from typing import Any

import orjson
import pytest
from golden_cases import messages

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import (
    DecodeError,
    FormatOptionError,
    Message,
    parse_ddl,
    render_change,
    resolve_format,
)
from cdcflow.formats.debezium.json import DebeziumJsonDecoder

PRODUCTS = "id INT NOT NULL, name STRING, description STRING, weight FLOAT"
FACTORY = resolve_format("debezium-json")


def decoder(
    schema: str | None = PRODUCTS, metadata: tuple[str, ...] = (), **options: str
) -> DebeziumJsonDecoder:
    decoder = FACTORY.create_decoder(options, parse_ddl(schema) if schema else None, metadata)
    assert isinstance(decoder, DebeziumJsonDecoder)
    return decoder


def rendered(decoder: DebeziumJsonDecoder, items: list[Message]) -> list[str]:
    out = decoder.decode_all(items)
    return [render_change(change, decoder.schema) for change in out.changes]


def event(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, **extra: Any) -> Message:
    return Message(orjson.dumps({"before": before, "after": after, "op": op, **extra}))


def test_schema_block_and_declared_schema_give_the_same_changelog() -> None:
    # The schema block types weight as a Connect float64, so it is declared DOUBLE here to compare.
    as_double = PRODUCTS.replace("FLOAT", "DOUBLE")
    declared = rendered(decoder(as_double), messages("flink/debezium-data-schema-exclude.txt"))
    from_block = rendered(
        decoder(None, **{"debezium-json.schema-include": "true"}),
        messages("flink/debezium-data-schema-include.txt"),
    )
    assert declared == from_block
    assert declared[:1] == ["+I[101, scooter, Small 2-wheel scooter, 3.140000104904175]"]
    as_float = rendered(decoder(), messages("flink/debezium-data-schema-exclude.txt"))
    assert as_float[:2] == [
        "+I[101, scooter, Small 2-wheel scooter, 3.14]",
        "+I[102, car battery, 12V car battery, 8.1]",
    ]
    assert as_float[-3:] == [
        "-U[111, scooter, Big 2-wheel scooter , 5.18]",
        "+U[111, scooter, Big 2-wheel scooter , 5.17]",
        "-D[111, scooter, Big 2-wheel scooter , 5.17]",
    ]


def test_update_without_before_image_says_replica_identity_and_where() -> None:
    items = messages("flink/debezium-postgres-data-replica-identity.txt")
    with pytest.raises(DecodeError) as raised:
        decoder().decode_all(items)
    text = str(raised.value)
    assert "flink/debezium-postgres-data-replica-identity.txt:" in text
    assert "field 'before'" in text
    assert "REPLICA IDENTITY" in text and "changelog-mode'='upsert'" in text
    assert raised.value.value is not None and b'"op":"u"' in raised.value.value


def test_update_without_before_image_is_an_upsert_in_upsert_mode() -> None:
    items = messages("flink/debezium-postgres-data-replica-identity.txt")
    out = decoder(**{"changelog-mode": "upsert", "ignore-parse-errors": "true"}).decode_all(items)
    kinds = [change.kind for change in out.changes]
    assert RowKind.UPDATE_BEFORE not in kinds
    assert kinds.count(RowKind.UPDATE_AFTER) == 4
    # The one delete with neither a before image nor a Kafka key cannot say what it deletes.
    assert [(d.message.line, d.field) for d in out.dead_letters] == [(16, "before")]


def test_upsert_delete_without_before_image_deletes_the_kafka_key() -> None:
    keyed = Message(b'{"before": null, "after": null, "op": "d"}', key=b'{"id": 7}')
    out = decoder(**{"changelog-mode": "upsert"}).decode_all([keyed])
    assert [str(c) for c in out.changes] == ["-D[7, null, null, null]"]


def test_ignore_parse_errors_dead_letters_the_update_with_its_bytes() -> None:
    items = messages("flink/debezium-postgres-data-replica-identity.txt")
    out = decoder(**{"ignore-parse-errors": "true"}).decode_all(items)
    assert out.metrics.dead_letters == len(out.dead_letters) == 5
    letter = out.dead_letters[0]
    assert letter.field == "before"
    assert letter.message.value in {m.value for m in items}
    assert "REPLICA IDENTITY" in letter.reason
    assert out.metrics.messages == len(items)


def test_tombstones_are_skipped_and_counted() -> None:
    out = decoder().decode_all([Message(None), Message(b""), event("c", None, {"id": 1})])
    assert out.metrics.tombstones == 2
    assert [str(c) for c in out.changes] == ["+I[1, null, null, null]"]


def test_truncate_and_message_events_go_to_the_side_output() -> None:
    truncate = Message(b'{"op": "t", "before": null, "after": null, "source": {"table": "p"}}', offset=7)
    message = Message(b'{"op": "m", "message": {"prefix": "cdcflow", "content": "aGVsbG8="}}', offset=8)
    out = decoder().decode_all([truncate, message])
    assert out.changes == []
    assert [(e.kind, e.message.offset) for e in out.events] == [("truncate", 7), ("message", 8)]
    assert out.events[1].payload["message"]["prefix"] == "cdcflow"


def test_schema_include_on_plain_events_and_vice_versa_say_which_option_to_set() -> None:
    plain = messages("flink/debezium-data-schema-exclude.txt")[:1]
    with pytest.raises(DecodeError, match="schema-include'='false'"):
        decoder(None, **{"schema-include": "true"}).decode_all(plain)
    wrapped = messages("flink/debezium-data-schema-include.txt")[:1]
    with pytest.raises(DecodeError, match="schema-include'='true'"):
        decoder().decode_all(wrapped)


def test_bad_value_names_topic_partition_offset_and_field() -> None:
    bad = Message(
        b'{"before": null, "after": {"id": "x1"}, "op": "c"}',
        topic="dbserver1.inventory",
        partition=2,
        offset=41,
    )
    with pytest.raises(DecodeError) as raised:
        decoder().decode_all([bad])
    assert str(raised.value).startswith(
        "debezium-json: cannot decode topic 'dbserver1.inventory' partition 2 offset 41, field 'after.id': "
        "expected an integer for INT, got 'x1'."
    )
    assert "debezium-json.ignore-parse-errors'='true'" in str(raised.value)


def test_not_json_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="not valid JSON"):
        decoder().decode_all([Message(b"{not json", offset=3)])


def test_options_are_checked_before_any_record() -> None:
    with pytest.raises(FormatOptionError) as raised:
        FACTORY.create_decoder({"debezium-json.schema-inclde": "true"}, parse_ddl(PRODUCTS))
    assert "Unsupported options for format 'debezium-json': debezium-json.schema-inclde" in str(raised.value)
    assert "debezium-json.schema-include" in str(raised.value)
    with pytest.raises(FormatOptionError, match="'ture' is not a boolean"):
        FACTORY.create_decoder({"ignore-parse-errors": "ture"}, parse_ddl(PRODUCTS))
    with pytest.raises(FormatOptionError, match="not one of RETRACT, UPSERT"):
        FACTORY.create_decoder({"changelog-mode": "append"}, parse_ddl(PRODUCTS))
    with pytest.raises(FormatOptionError, match="needs the table schema"):
        FACTORY.create_decoder({}, None)
    with pytest.raises(FormatOptionError, match="no metadata column 'source.tabel'"):
        FACTORY.create_decoder({}, parse_ddl(PRODUCTS), ["source.tabel"])


def test_decoder_pickles_to_an_equivalent_decoder() -> None:
    original = decoder(**{"changelog-mode": "upsert"})
    copy = pickle.loads(pickle.dumps(original))
    items = messages("flink/debezium-postgres-data-replica-identity.txt")[:15]
    assert rendered(copy, items) == rendered(decoder(**{"changelog-mode": "upsert"}), items)
    assert len(rendered(copy, items)) == 15


def test_metadata_columns() -> None:
    decoded = decoder(
        "id INT NOT NULL, name STRING",
        metadata=("source.database", "source.table", "source.timestamp", "ingestion-timestamp", "op"),
    )
    out = decoded.decode_all(messages("flink/debezium-data-schema-exclude.txt")[:1])
    assert decoded.schema.names == [
        "id",
        "name",
        "source_database",
        "source_table",
        "source_timestamp",
        "ingestion_timestamp",
        "op",
    ]
    assert out.changes[0].row == {
        "id": 101,
        "name": "scooter",
        "source_database": "inventory",
        "source_table": "products",
        "source_timestamp": dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
        "ingestion_timestamp": dt.datetime(2020, 5, 13, 7, 40, 6, 100000, tzinfo=dt.UTC),
        "op": "c",
    }


# Logical types -------------------------------------------------------------------------------------


def _b64_unscaled(unscaled: int) -> str:
    length = (unscaled + (unscaled < 0)).bit_length() // 8 + 1
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


LOGICAL_FIELDS = [
    {"type": "int32", "optional": False, "field": "id"},
    {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "3", "connect.decimal.precision": "12"},
        "field": "price",
    },
    {
        "type": "struct",
        "optional": True,
        "name": "io.debezium.data.VariableScaleDecimal",
        "fields": [{"type": "int32", "field": "scale"}, {"type": "bytes", "field": "value"}],
        "field": "amount",
    },
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "field": "day"},
    {"type": "int32", "optional": True, "name": "org.apache.kafka.connect.data.Date", "field": "cday"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Time", "field": "t_ms"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTime", "field": "t_us"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.NanoTime", "field": "t_ns"},
    {"type": "int32", "optional": True, "name": "org.apache.kafka.connect.data.Time", "field": "ct"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.Timestamp", "field": "ts_ms"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "field": "ts_us"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.NanoTimestamp", "field": "ts_ns"},
    {"type": "int64", "optional": True, "name": "org.apache.kafka.connect.data.Timestamp", "field": "cts"},
    {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "field": "zts"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Json", "field": "doc"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Uuid", "field": "uid"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "field": "mood"},
    {"type": "bytes", "optional": True, "field": "raw"},
    {"type": "float", "optional": True, "field": "ratio"},
    {"type": "double", "optional": True, "field": "score"},
    {"type": "array", "optional": True, "items": {"type": "int32"}, "field": "tags"},
]
LOGICAL_AFTER = {
    "id": 1,
    "price": _b64_unscaled(-1234567),
    "amount": {"scale": 4, "value": _b64_unscaled(31415926)},
    "day": -365,
    "cday": 19000,
    "t_ms": 3_723_004,
    "t_us": 3_723_000_005,
    "t_ns": 3_723_000_006_789,
    "ct": 1000,
    "ts_ms": 1_600_000_000_123,
    "ts_us": -1_000_001,
    "ts_ns": 1_600_000_000_123_456_789,
    "cts": 0,
    "zts": "2023-03-23T22:00:10.123456+02:00",
    "doc": '{"a": [1, 2]}',
    "uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    "mood": "happy",
    "raw": base64.b64encode(b"\x00\xff\x10").decode(),
    "ratio": 0.1,
    "score": "NaN",
    "tags": [1, None, 3],
}
LOGICAL_VALUES = {
    "id": 1,
    "price": Decimal("-1234.567"),
    "amount": Decimal("3141.5926"),
    "day": dt.date(1969, 1, 1),
    "cday": dt.date(2022, 1, 8),
    "t_ms": dt.time(1, 2, 3, 4000),
    "t_us": dt.time(1, 2, 3, 5),
    "t_ns": dt.time(1, 2, 3, 6),
    "ct": dt.time(0, 0, 1),
    "ts_ms": dt.datetime(2020, 9, 13, 12, 26, 40, 123000),
    "ts_us": dt.datetime(1969, 12, 31, 23, 59, 58, 999999),
    "ts_ns": dt.datetime(2020, 9, 13, 12, 26, 40, 123456),
    "cts": dt.datetime(1970, 1, 1),
    "zts": dt.datetime(2023, 3, 23, 20, 0, 10, 123456, tzinfo=dt.UTC),
    "doc": '{"a": [1, 2]}',
    "uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    "mood": "happy",
    "raw": b"\x00\xff\x10",
    "ratio": pytest.approx(0.1, rel=1e-7),
    "score": pytest.approx(float("nan"), nan_ok=True),
    "tags": [1, None, 3],
}


def _with_schema(payload: dict[str, Any], fields: list[dict[str, Any]]) -> Message:
    value_schema = {"type": "struct", "optional": True, "fields": fields, "name": "db.t.Value"}
    schema = {
        "type": "struct",
        "fields": [{**value_schema, "field": "before"}, {**value_schema, "field": "after"}],
        "name": "db.t.Envelope",
    }
    return Message(orjson.dumps({"schema": schema, "payload": payload}))


def test_schema_block_decodes_debezium_and_connect_logical_types() -> None:
    decoded = decoder(None, **{"schema-include": "true"})
    out = decoded.decode_all(
        [_with_schema({"op": "r", "before": None, "after": LOGICAL_AFTER}, LOGICAL_FIELDS)]
    )
    assert out.changes[0].row == LOGICAL_VALUES
    assert decoded.schema.ddl().startswith(
        "id INT NOT NULL, price DECIMAL(12, 3), amount DECIMAL, day DATE, cday DATE, t_ms TIME(3), "
        "t_us TIME, t_ns TIME(9), ct TIME(3), ts_ms TIMESTAMP_NTZ(3), ts_us TIMESTAMP_NTZ, "
        "ts_ns TIMESTAMP_NTZ(9)"
    )


def test_declared_schema_applies_the_same_conversions_without_a_schema_block() -> None:
    declared = (
        "id INT NOT NULL, price DECIMAL(12, 3), amount DECIMAL(20, 4), day DATE, cday DATE, t_ms TIME(3), "
        "t_us TIME(6), t_ns TIME(9), ct TIME(3), ts_ms TIMESTAMP_NTZ(3), ts_us TIMESTAMP_NTZ, "
        "ts_ns TIMESTAMP_NTZ(9), cts TIMESTAMP_NTZ(3), zts TIMESTAMP, doc STRING, uid STRING, mood STRING, "
        "raw BINARY, ratio FLOAT, score DOUBLE, tags ARRAY<INT>"
    )
    out = decoder(declared).decode_all([event("r", None, LOGICAL_AFTER)])
    assert out.changes[0].row == LOGICAL_VALUES


def test_declared_schema_with_a_schema_block_casts_to_the_declared_types() -> None:
    decoded = decoder(
        "id BIGINT NOT NULL, price STRING, day STRING, score DOUBLE", **{"schema-include": "true"}
    )
    out = decoded.decode_all(
        [_with_schema({"op": "c", "before": None, "after": LOGICAL_AFTER}, LOGICAL_FIELDS)]
    )
    assert out.changes[0].row == {
        "id": 1,
        "price": "-1234.567",
        "day": "1969-01-01",
        "score": pytest.approx(float("nan"), nan_ok=True),
    }


# Unchanged TOASTed columns -------------------------------------------------------------------------

TOAST_SCHEMA = "id INT NOT NULL, note STRING, big STRING, codes ARRAY<INT>, blob BINARY"
PLACEHOLDER = "__debezium_unavailable_value"


def _keyed(op: str, after: dict[str, Any] | None, before: dict[str, Any] | None = None) -> Message:
    row = after or before
    assert row is not None
    key = orjson.dumps({"id": row["id"]})
    return Message(orjson.dumps({"before": before, "after": after, "op": op}), key=key)


def _unchanged_toast(row_id: int, note: str) -> dict[str, Any]:
    return {
        "id": row_id,
        "note": note,
        "big": PLACEHOLDER,
        "codes": [ord(c) for c in PLACEHOLDER],
        "blob": base64.b64encode(PLACEHOLDER.encode()).decode(),
    }


def test_unchanged_toast_values_are_filled_from_the_previous_image_of_the_key() -> None:
    first = {"id": 1, "note": "a", "big": "x" * 5000, "codes": [1, 2], "blob": "AAE="}
    decoded = decoder(TOAST_SCHEMA, metadata=("unavailable-columns",), **{"changelog-mode": "upsert"})
    out = decoded.decode_all([_keyed("c", first), _keyed("u", _unchanged_toast(1, "b"))])
    assert out.changes[1].row == {
        "id": 1,
        "note": "b",
        "big": "x" * 5000,
        "codes": [1, 2],
        "blob": b"\x00\x01",
        "unavailable_columns": [],
    }
    assert out.metrics.filled_values == 3 and out.metrics.unavailable_values == 0


def test_unchanged_toast_values_without_state_are_reported_never_landed() -> None:
    decoded = decoder(TOAST_SCHEMA, metadata=("unavailable-columns",), **{"changelog-mode": "upsert"})
    out = decoded.decode_all([_keyed("u", _unchanged_toast(2, "b"))])
    row = out.changes[0].row
    assert row == {
        "id": 2,
        "note": "b",
        "big": None,
        "codes": None,
        "blob": None,
        "unavailable_columns": ["big", "codes", "blob"],
    }
    assert out.metrics.unavailable_values == 3
    assert PLACEHOLDER not in json.dumps(row, default=str)


def test_unchanged_toast_values_come_from_the_before_image_when_it_has_them() -> None:
    before = {"id": 3, "note": "a", "big": "y" * 3000, "codes": [9], "blob": None}
    out = decoder(TOAST_SCHEMA).decode_all([event("u", before, _unchanged_toast(3, "b"))])
    assert out.changes[1].row["big"] == "y" * 3000 and out.changes[1].row["codes"] == [9]


def test_unavailable_values_fail_mode_names_the_column() -> None:
    with pytest.raises(DecodeError, match="field 'after.big'.*TOASTed"):
        decoder(TOAST_SCHEMA, **{"unavailable-values": "fail", "changelog-mode": "upsert"}).decode_all(
            [_keyed("u", _unchanged_toast(4, "b"))]
        )


def test_a_delete_forgets_the_kept_image() -> None:
    first = {"id": 5, "note": "a", "big": "z", "codes": [], "blob": None}
    decoded = decoder(TOAST_SCHEMA, **{"changelog-mode": "upsert"})
    out = decoded.decode_all(
        [_keyed("c", first), _keyed("d", None, before={"id": 5}), _keyed("u", _unchanged_toast(5, "c"))]
    )
    assert out.changes[-1].row["big"] is None and out.metrics.unavailable_values == 3


# Encoding ------------------------------------------------------------------------------------------

ENCODE_SCHEMA = "id INT NOT NULL, name STRING, price DECIMAL(10, 2), at TIMESTAMP_NTZ(3), weight FLOAT"
ROW_1 = {
    "id": 1,
    "name": "a",
    "price": Decimal("1.50"),
    "at": dt.datetime(2024, 1, 2, 3, 4, 5, 6000),
    "weight": 0.1,
}
ROW_1B = {**ROW_1, "name": "b"}


def _encoder(**options: str) -> Any:
    return FACTORY.create_encoder(options, parse_ddl(ENCODE_SCHEMA), ["id"])


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            [Change(RowKind.INSERT, ROW_1)],
            [
                (
                    b'{"id":1}',
                    b'{"before":null,"after":{"id":1,"name":"a","price":1.50,"at":"2024-01-02 03:04:05.006",'
                    b'"weight":0.1},"op":"c"}',
                )
            ],
        ),
        (
            [Change(RowKind.UPDATE_BEFORE, ROW_1), Change(RowKind.UPDATE_AFTER, ROW_1B)],
            [
                (
                    b'{"id":1}',
                    b'{"before":{"id":1,"name":"a","price":1.50,"at":"2024-01-02 03:04:05.006","weight":0.1},'
                    b'"after":{"id":1,"name":"b","price":1.50,"at":"2024-01-02 03:04:05.006","weight":0.1},'
                    b'"op":"u"}',
                )
            ],
        ),
        (
            [Change(RowKind.DELETE, ROW_1)],
            [
                (
                    b'{"id":1}',
                    b'{"before":{"id":1,"name":"a","price":1.50,"at":"2024-01-02 03:04:05.006","weight":0.1},'
                    b'"after":null,"op":"d"}',
                )
            ],
        ),
    ],
    ids=["insert", "update-is-one-event", "delete"],
)
def test_encoder_exact_bytes(changes: list[Change], expected: list[tuple[bytes, bytes]]) -> None:
    encoded = _encoder().encode_all(changes)
    assert [(e.key, e.value) for e in encoded] == expected


def test_encoder_iso_timestamps_and_schema_include_bytes() -> None:
    iso = _encoder(**{"timestamp-format.standard": "ISO-8601"}).encode_all([Change(RowKind.INSERT, ROW_1)])
    assert b'"at":"2024-01-02T03:04:05.006"' in (iso[0].value or b"")
    wrapped = _encoder(**{"schema-include": "true"}).encode_all([Change(RowKind.INSERT, ROW_1)])
    value = orjson.loads(wrapped[0].value or b"")
    assert value["payload"] == {
        "before": None,
        "after": {"id": 1, "name": "a", "price": "AJY=", "at": 1704164645006000, "weight": 0.1},
        "op": "c",
    }
    price = value["schema"]["fields"][1]["fields"][2]
    assert price == {
        "type": "bytes",
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "optional": True,
        "field": "price",
    }
    key = orjson.loads(wrapped[0].key or b"")
    assert key["payload"] == {"id": 1} and key["schema"]["fields"] == [
        {"type": "int32", "optional": False, "field": "id"}
    ]


def test_an_update_before_without_its_after_is_still_written() -> None:
    encoded = _encoder().encode_all([Change(RowKind.UPDATE_BEFORE, ROW_1)])
    assert len(encoded) == 1 and b'"op":"u"' in (encoded[0].value or b"")
