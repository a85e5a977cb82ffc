"""Avro Kafka keys in Confluent's wire format: upsert-kafka's ``key.format=avro-confluent`` (a tombstone
deletes the key it names) and the keys debezium-avro-confluent's encoder writes for the sink.

Key bytes are built and read back here with fastavro directly (``b"\\x00"`` + the 4-byte schema id +
the Avro body), independently of the serde under test. Registries are confluent-kafka's ``mock://``
ones: one per URL in the process, so each test has its own URL.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import pickle
import struct
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from avro_events import ENVELOPE, EVENTS, FACTORY, NAMESPACE, confluent
from registry_server import RegistryHandler, serving

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import FormatOptionError, Message, parse_ddl, render_change, resolve_format
from cdcflow.formats.confluent.client import registry_client

UPSERT = resolve_format("upsert-kafka")
PAGEVIEWS = parse_ddl("user_region STRING NOT NULL, pv BIGINT, uv BIGINT")
REGION_KEY = {"type": "record", "name": "Key", "fields": [{"name": "user_region", "type": "string"}]}
# Debezium's key of a table keyed by (region, day): a Connect Date is an int of days since 1970.
DAY_KEY = {
    "type": "record",
    "name": "Key",
    "namespace": "dbserver1.public.pageviews",
    "fields": [
        {"name": "region", "type": "string"},
        {
            "name": "day",
            "type": {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"},
        },
    ],
}
PREFIXED = parse_ddl("k_region STRING NOT NULL, k_day DATE NOT NULL, region STRING, pv BIGINT")


def wire(schema_id: int, schema: dict[str, Any], datum: dict[str, Any]) -> bytes:
    """Confluent's framing by hand: magic byte 0, the big-endian schema id, the Avro body."""
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), datum)
    return b"\x00" + struct.pack(">I", schema_id) + body.getvalue()


def read_wire(data: bytes, schema_text: str) -> tuple[int, Any]:
    """(schema id, record) of Confluent-framed Avro, read with fastavro alone."""
    assert data[:1] == b"\x00"
    (schema_id,) = struct.unpack(">I", data[1:5])
    return schema_id, fastavro.schemaless_reader(
        io.BytesIO(data[5:]), fastavro.parse_schema(json.loads(schema_text))
    )


def register(url: str, subject: str, schema: dict[str, Any]) -> int:
    from confluent_kafka.schema_registry import Schema as RegistrySchema

    return registry_client((("url", url),)).register_schema(
        subject, RegistrySchema(json.dumps(schema), "AVRO")
    )


def record(key: bytes | None, value: bytes | None, offset: int = 0) -> Message:
    return Message(value, key=key, topic="pageviews", partition=1, offset=offset)


# upsert-kafka: reading Avro keys ------------------------------------------------------------------------


def test_upsert_tombstone_with_an_avro_key_deletes_that_key() -> None:
    url = "mock://upsert-key-decode"
    key_id = register(url, "pageviews-key", REGION_KEY)
    eu = wire(key_id, REGION_KEY, {"user_region": "eu"})
    us = wire(key_id, REGION_KEY, {"user_region": "us"})
    decoder = UPSERT.create_decoder(
        {"key.fields": "user_region", "key.format": "avro-confluent", "key.avro-confluent.url": url},
        PAGEVIEWS,
    )
    out = decoder.decode_all(
        [
            record(eu, b'{"user_region":"eu","pv":10,"uv":3}', 0),
            record(us, b'{"user_region":"us","pv":1,"uv":1}', 1),
            record(eu, None, 2),
        ]
    )
    assert [render_change(c, PAGEVIEWS) for c in out.changes] == [
        "+U[eu, 10, 3]",
        "+U[us, 1, 1]",
        "-D[eu, null, null]",
    ]
    assert out.changes[2].row == {"user_region": "eu", "pv": None, "uv": None}
    clone = pickle.loads(pickle.dumps(decoder))  # the serde is not pickled; the clone builds its own
    assert [c.row for c in clone.decode_all([record(us, None)]).changes] == [
        {"user_region": "us", "pv": None, "uv": None}
    ]


def test_avro_key_fields_take_the_declared_types_without_a_registry() -> None:
    key = wire(7, DAY_KEY, {"region": "eu", "day": 19724})  # 2024-01-02
    options = {
        "key.fields": "k_region, k_day",
        "key.fields-prefix": "k_",
        "value.fields-include": "EXCEPT_KEY",
        "key.format": "avro-confluent",
        "key.avro-confluent.schema": json.dumps(DAY_KEY),
        "key.avro-confluent.schema-id": "7",
    }
    decoder = UPSERT.create_decoder(options, PREFIXED)
    out = decoder.decode_all([record(key, b'{"region":"Europe","pv":7}'), record(key, None, 1)])
    assert [render_change(c, PREFIXED) for c in out.changes] == [
        "+U[eu, 2024-01-02, Europe, 7]",
        "-D[eu, 2024-01-02, null, null]",
    ]
    assert out.changes[1].row["k_day"] == dt.date(2024, 1, 2)


def test_unreadable_avro_keys_are_dead_lettered_with_the_reason() -> None:
    options = {
        "key.fields": "user_region",
        "key.format": "avro-confluent",
        "key.avro-confluent.schema": json.dumps(REGION_KEY),
        "key.avro-confluent.schema-id": "5",
        "ignore-parse-errors": "true",
    }
    decoder = UPSERT.create_decoder(options, PAGEVIEWS)
    out = decoder.decode_all(
        [
            record(b'{"user_region":"eu"}', None, 0),
            record(wire(6, REGION_KEY, {"user_region": "eu"}), None, 1),
            record(wire(5, REGION_KEY, {"user_region": "eu"})[:6], None, 2),
        ]
    )
    assert out.changes == []
    assert [(d.message.offset, d.field, d.reason[:60]) for d in out.dead_letters] == [
        (0, "key", "not Confluent wire format: first byte is 0x7b, expected 0x00"),
        (1, "key", "unknown schema id 6 (the 'upsert-kafka.key.avro-confluent.sc"),
        (2, "key", "the Avro body does not match writer schema 5 (EOFError: Expe"),
    ]
    assert "'upsert-kafka.key.format'='json'" in out.dead_letters[0].reason


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"key.avro-confluent.url": "mock://x"},
            r"key.avro-confluent.url are for an Avro key: set 'upsert-kafka.key.format'='avro-confluent'",
        ),
        ({"key.format": "avro-confluent"}, r"an Avro key needs its writer schemas: set 'upsert-kafka.key.av"),
        ({"key.format": "avro"}, r"'avro' is not one of json, avro-confluent"),
        (
            {"key.format": "avro-confluent", "key.avro-confluent.schema": json.dumps(DAY_KEY)},
            r"has no field 'user_region'",
        ),
        (
            {"key.format": "avro-confluent", "key.avro-confluent.basic-auth.user-info": "u:secret"},
            r"need 'upsert-kafka.key.avro-confluent.url'",
        ),
    ],
)
def test_avro_key_option_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(FormatOptionError, match=message) as raised:
        UPSERT.create_decoder({"key.fields": "user_region", **options}, PAGEVIEWS)
    assert "secret" not in str(raised.value)


# upsert-kafka: writing Avro keys ------------------------------------------------------------------------


def test_upsert_encoder_writes_an_avro_key_and_a_tombstone() -> None:
    url = "mock://upsert-key-encode"
    options = {"key.fields": "user_region", "key.format": "avro-confluent", "key.avro-confluent.url": url}
    encoder = UPSERT.create_encoder(options, PAGEVIEWS, topic="pageviews")  # type: ignore[call-arg]
    changes = [
        Change(RowKind.INSERT, {"user_region": "eu", "pv": 10, "uv": 3}),
        Change(RowKind.DELETE, {"user_region": "eu", "pv": 10, "uv": 3}),
    ]
    encoded = encoder.encode_all(changes)
    registered = registry_client((("url", url),)).get_latest_version("pageviews-key")
    assert json.loads(registered.schema.schema_str)["name"] == "Key"
    assert encoded[0].value == b'{"user_region":"eu","pv":10,"uv":3}'
    assert encoded[1].value is None  # the tombstone
    for item in encoded:
        assert item.key is not None
        assert read_wire(item.key, registered.schema.schema_str) == (
            registered.schema_id,
            {"user_region": "eu"},
        )
    # decode(encode(x)): the insert is an upsert, the tombstone a -D of the Avro key.
    decoder = UPSERT.create_decoder(options, PAGEVIEWS)
    out = decoder.decode_all(record(e.key, e.value, i) for i, e in enumerate(encoded))
    assert [render_change(c, PAGEVIEWS) for c in out.changes] == ["+U[eu, 10, 3]", "-D[eu, null, null]"]


def test_upsert_encoder_with_a_fixed_key_schema_id_writes_exact_bytes() -> None:
    options = {
        "key.fields": "k_region, k_day",
        "key.fields-prefix": "k_",
        "value.fields-include": "EXCEPT_KEY",
        "key.format": "avro-confluent",
        "key.avro-confluent.schema": json.dumps(DAY_KEY),
        "key.avro-confluent.schema-id": "7",
    }
    encoder = UPSERT.create_encoder(options, PREFIXED)
    row = {"k_region": "eu", "k_day": dt.date(2024, 1, 2), "region": None, "pv": None}
    (encoded,) = encoder.encode_all([Change(RowKind.DELETE, row)])
    # magic 0, id 7; "eu" (length 2 zigzag = 0x04), day 19724 as a zigzag varint.
    assert encoded.key == b"\x00\x00\x00\x00\x07" + b"\x04eu" + b"\x98\xb4\x02"
    assert encoded.value is None
    assert read_wire(encoded.key, json.dumps(DAY_KEY)) == (7, {"region": "eu", "day": 19724})


def test_upsert_encoder_needs_a_key_schema_id_or_registry() -> None:
    options = {"key.fields": "user_region", "key.format": "avro-confluent"}
    with pytest.raises(FormatOptionError, match=r"an Avro key needs a schema id"):
        UPSERT.create_encoder(options, PAGEVIEWS)
    with pytest.raises(FormatOptionError, match=r"set 'upsert-kafka.key.avro-confluent.subject'"):
        UPSERT.create_encoder({**options, "key.avro-confluent.url": "mock://x"}, PAGEVIEWS)


# debezium-avro-confluent: the sink's Avro keys -----------------------------------------------------------

TABLE = parse_ddl("id INT NOT NULL, day DATE NOT NULL, name STRING, price DECIMAL(10, 2)")
TOPIC = "dbserver1.inventory.orders"


def test_debezium_avro_encoder_keys_records_by_the_primary_key() -> None:
    url = "mock://dbz-sink-keys"
    encoder = FACTORY.create_encoder({"url": url}, TABLE, ["id", "day"], topic=TOPIC)
    row = {"id": 1, "day": dt.date(2021, 1, 1), "name": "a", "price": Decimal("1.50")}
    changes = [
        Change(RowKind.INSERT, row),
        Change(RowKind.UPDATE_BEFORE, row),
        Change(RowKind.UPDATE_AFTER, {**row, "name": "b"}),
        Change(RowKind.DELETE, {**row, "name": "b"}),
    ]
    encoded = encoder.encode_all(changes)
    client = registry_client((("url", url),))
    key_schema = client.get_latest_version(f"{TOPIC}-key")
    schema = json.loads(key_schema.schema.schema_str)
    assert (schema["name"], schema["namespace"], schema["connect.name"]) == ("Key", TOPIC, f"{TOPIC}.Key")
    assert [f["name"] for f in schema["fields"]] == ["id", "day"]
    assert len(encoded) == 3  # c, u, d
    for item in encoded:
        assert item.key is not None
        assert read_wire(item.key, key_schema.schema.schema_str) == (
            key_schema.schema_id,
            {"id": 1, "day": 18628},  # Debezium's Date: days since 1970-01-01
        )
    value_schema = client.get_latest_version(f"{TOPIC}-value")
    assert [read_wire(e.value, value_schema.schema.schema_str)[1]["op"] for e in encoded if e.value] == [
        "c",
        "u",
        "d",
    ]
    # decode(encode(x)) with the keys: without key-columns, the TOAST state is keyed by the Avro key.
    decoder = FACTORY.create_decoder({"url": url})
    out = decoder.decode_all(Message(e.value, key=e.key, offset=i) for i, e in enumerate(encoded))
    assert [(c.kind, c.row) for c in out.changes] == [(c.kind, c.row) for c in changes]
    assert decoder._key(Message(encoded[0].value, key=encoded[0].key)) == {"id": 1, "day": 18628}


def test_debezium_avro_encoder_without_registry_writes_no_key() -> None:
    encoder = FACTORY.create_encoder({"schema-id": "9"}, TABLE, ["id"], topic=TOPIC)
    row = {"id": 1, "day": dt.date(2021, 1, 1), "name": None, "price": None}
    (encoded,) = encoder.encode_all([Change(RowKind.INSERT, row)])
    assert encoded.key is None and encoded.value is not None and encoded.value[:5] == b"\x00\x00\x00\x00\x09"


def test_a_debezium_delete_keyed_by_an_avro_key_forgets_that_key() -> None:
    """Without key-columns, debezium-avro-confluent keeps each row's last image under the fields of its
    Avro Kafka key (to fill TOASTed values): a delete of key 101 drops it, so a later upsert of 101
    cannot fill its unchanged ``notes`` from the deleted row."""
    url = "mock://dbz-delete-key"
    key_schema = {
        "type": "record",
        "name": "Key",
        "namespace": NAMESPACE,
        "fields": [{"name": "id", "type": "int"}],
    }
    key_id = register(url, "dbserver1.inventory.products-key", key_schema)
    value_id = register(url, "dbserver1.inventory.products-value", ENVELOPE)
    key = wire(key_id, key_schema, {"id": 101})
    snapshot, delete = EVENTS[0], EVENTS[2]
    upsert = {**EVENTS[1], "before": None}  # notes: the TOAST placeholder

    def notes_after(events: list[dict[str, Any]]) -> list[tuple[RowKind, Any]]:
        decoder = FACTORY.create_decoder({"url": url, "changelog-mode": "upsert"})
        messages = [
            Message(confluent(value_id, ENVELOPE, e), key=key, offset=i) for i, e in enumerate(events)
        ]
        return [(c.kind, c.row["notes"]) for c in decoder.decode_all(messages).changes]

    assert notes_after([snapshot, upsert]) == [
        (RowKind.INSERT, "long text"),
        (RowKind.UPDATE_AFTER, "long text"),
    ]
    assert notes_after([snapshot, delete, upsert]) == [
        (RowKind.INSERT, "long text"),
        (RowKind.DELETE, None),
        (RowKind.UPDATE_AFTER, None),  # reported unavailable: the deleted row's notes are forgotten
    ]


def test_sink_plan_passes_the_topic_to_upsert_kafka() -> None:
    pytest.importorskip("pyspark")
    from cdcflow.connectors.kafka import admin as kafka_admin
    from cdcflow.connectors.spark.sink import WritePlan

    plan = WritePlan(
        format_name="upsert-kafka",
        format_options={"key.format": "avro-confluent", "key.avro-confluent.url": "mock://plan-keys"},
        table=PAGEVIEWS,
        row_kind_column="_row_kind",
        key_columns=("user_region",),
        topic="pageviews-by-region",
        producer_config=kafka_admin.producer_config({"kafka.bootstrap.servers": "127.0.0.1:9"}),
    )
    encoder = plan.encoder()
    (encoded,) = encoder.encode_all([Change(RowKind.DELETE, {"user_region": "eu", "pv": None, "uv": None})])
    assert encoded.key is not None and encoded.value is None
    assert registry_client((("url", "mock://plan-keys"),)).get_subjects() == ["pageviews-by-region-key"]


def test_sink_keys_through_an_http_registry() -> None:
    """The real client over HTTP (as on Spark executors): key and value registered under the TOPIC
    strategy's subjects, and no /associations lookup."""
    handler = RegistryHandler.fresh()
    with serving(handler) as port:
        url = f"http://127.0.0.1:{port}"
        encoder = FACTORY.create_encoder({"url": url}, TABLE, ["id"], topic=TOPIC)
        row = {"id": 7, "day": dt.date(2021, 1, 2), "name": "x", "price": None}
        encoded = encoder.encode_all([Change(RowKind.INSERT, row), Change(RowKind.DELETE, row)])
        decoder = FACTORY.create_decoder({"url": url, "key-columns": "id"})
        out = decoder.decode_all(Message(e.value, key=e.key, offset=i) for i, e in enumerate(encoded))
    assert [(c.kind, c.row) for c in out.changes] == [(RowKind.INSERT, row), (RowKind.DELETE, row)]
    assert sorted(handler.subjects) == [f"{TOPIC}-key", f"{TOPIC}-value"]
    (key_id,) = handler.subjects[f"{TOPIC}-key"]
    for item in encoded:
        assert item.key is not None
        assert read_wire(item.key, handler.schemas[key_id][0]) == (key_id, {"id": 7})
    assert not any("association" in r for r in handler.requests)
