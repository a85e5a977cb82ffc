"""debezium-avro-confluent: Confluent wire format, Connect logical types, registry and explicit schemas."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import io
import json
import pickle
from decimal import Decimal
from typing import Any

import fastavro
import orjson
import pytest
from changelog_strategies import DEBEZIUM_VALUES, normalised, per_key_changelogs
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import (
    DataType,
    DecodeError,
    EncodeError,
    Field,
    FormatError,
    FormatOptionError,
    Message,
    MissingDependencyError,
    Schema,
    TypeKind,
    debezium_avro,
    parse_ddl,
    render_change,
    resolve_format,
)
from cdcflow.formats.debezium_avro import DebeziumAvroConfig, DebeziumAvroDecoder

FACTORY = debezium_avro.DebeziumAvroFormat()
TOAST = "__debezium_unavailable_value"

# The writer schema Debezium's PostgreSQL connector gets from Confluent's AvroConverter, for a table
#   products(id int primary key, name text, price numeric(10,2), weight numeric, born date,
#            opens time, created timestamp, updated timestamptz, attrs jsonb, uid uuid, photo bytea,
#            notes text, small smallint)
# (before defines the Value record, after refers to it by name, as the converter writes it).
VALUE_FIELDS: list[dict[str, Any]] = [
    {"name": "id", "type": "int"},
    {"name": "name", "type": ["null", "string"], "default": None},
    {
        "name": "price",
        "type": [
            "null",
            {
                "type": "bytes",
                "scale": 2,
                "precision": 10,
                "connect.version": 1,
                "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
                "connect.name": "org.apache.kafka.connect.data.Decimal",
                "logicalType": "decimal",
            },
        ],
        "default": None,
    },
    {
        "name": "weight",
        "type": [
            "null",
            {
                "type": "record",
                "name": "VariableScaleDecimal",
                "namespace": "io.debezium.data",
                "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
                "connect.doc": "Variable scaled decimal",
                "connect.version": 1,
                "connect.name": "io.debezium.data.VariableScaleDecimal",
            },
        ],
        "default": None,
    },
    {
        "name": "born",
        "type": ["null", {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"}],
        "default": None,
    },
    {
        "name": "opens",
        "type": [
            "null",
            {"type": "long", "connect.version": 1, "connect.name": "io.debezium.time.MicroTime"},
        ],
        "default": None,
    },
    {
        "name": "created",
        "type": [
            "null",
            {"type": "long", "connect.version": 1, "connect.name": "io.debezium.time.MicroTimestamp"},
        ],
        "default": None,
    },
    {
        "name": "updated",
        "type": [
            "null",
            {"type": "string", "connect.version": 1, "connect.name": "io.debezium.time.ZonedTimestamp"},
        ],
        "default": None,
    },
    {
        "name": "attrs",
        "type": ["null", {"type": "string", "connect.version": 1, "connect.name": "io.debezium.data.Json"}],
        "default": None,
    },
    {
        "name": "uid",
        "type": ["null", {"type": "string", "connect.version": 1, "connect.name": "io.debezium.data.Uuid"}],
        "default": None,
    },
    {"name": "photo", "type": ["null", "bytes"], "default": None},
    {"name": "notes", "type": ["null", "string"], "default": None},
    {"name": "small", "type": ["null", {"type": "int", "connect.type": "int16"}], "default": None},
]
NAMESPACE = "dbserver1.inventory.products"
SOURCE = {
    "type": "record",
    "name": "Source",
    "namespace": "io.debezium.connector.postgresql",
    "fields": [
        {"name": "version", "type": "string"},
        {"name": "connector", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "ts_ms", "type": "long"},
        {
            "name": "snapshot",
            "type": [
                {
                    "type": "string",
                    "connect.version": 1,
                    "connect.parameters": {"allowed": "true,last,false,incremental"},
                    "connect.default": "false",
                    "connect.name": "io.debezium.data.Enum",
                },
                "null",
            ],
            "default": "false",
        },
        {"name": "db", "type": "string"},
        {"name": "schema", "type": "string"},
        {"name": "table", "type": "string"},
        {"name": "txId", "type": ["null", "long"], "default": None},
        {"name": "lsn", "type": ["null", "long"], "default": None},
    ],
    "connect.name": "io.debezium.connector.postgresql.Source",
}
ENVELOPE: dict[str, Any] = {
    "type": "record",
    "name": "Envelope",
    "namespace": NAMESPACE,
    "fields": [
        {
            "name": "before",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Value",
                    "fields": VALUE_FIELDS,
                    "connect.name": f"{NAMESPACE}.Value",
                },
            ],
            "default": None,
        },
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": SOURCE},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
    "connect.name": f"{NAMESPACE}.Envelope",
}
ENVELOPE_TEXT = json.dumps(ENVELOPE)

PRODUCT = {
    "id": 101,
    "name": "scooter",
    "price": Decimal("12.50"),  # written by fastavro's decimal logical type: unscaled 1250 as bytes
    "weight": {"scale": 3, "value": (5125).to_bytes(2, "big")},
    "born": 18628,  # 2021-01-01
    "opens": 34_200_000_001,  # 09:30:00.000001
    "created": 1_609_459_200_123_456,  # 2021-01-01T00:00:00.123456
    "updated": "2021-01-01T08:00:00.5+02:00",
    "attrs": '{"color":"red"}',
    "uid": "f3b1e7a2-0c4d-4e8b-9a1f-2b3c4d5e6f70",
    "photo": b"\x89PNG",
    "notes": "long text",
    "small": -7,
}
UPDATED = {**PRODUCT, "name": "e-scooter", "price": Decimal("-0.99"), "notes": TOAST, "weight": None}
BEFORE_UPDATE = {**PRODUCT, "notes": TOAST}


def _source(lsn: int) -> dict[str, Any]:
    return {
        "version": "2.7.0.Final",
        "connector": "postgresql",
        "name": "dbserver1",
        "ts_ms": 1_609_459_200_000 + lsn,
        "snapshot": "false",
        "db": "postgres",
        "schema": "inventory",
        "table": "products",
        "txId": 500 + lsn,
        "lsn": lsn,
    }


EVENTS = [
    {"before": None, "after": PRODUCT, "source": _source(1), "op": "r", "ts_ms": 1_609_459_201_000},
    {"before": BEFORE_UPDATE, "after": UPDATED, "source": _source(2), "op": "u", "ts_ms": 1_609_459_202_000},
    {"before": {**UPDATED, "notes": None}, "after": None, "source": _source(3), "op": "d", "ts_ms": None},
    {"before": None, "after": None, "source": _source(4), "op": "t", "ts_ms": 1_609_459_204_000},
]
_SAME = (
    '2021-01-01, 09:30:00.000001, 2021-01-01T00:00:00.123456, 2021-01-01T06:00:00.500Z, {"color":"red"}, '
    "f3b1e7a2-0c4d-4e8b-9a1f-2b3c4d5e6f70, [-119, 80, 78, 71]"
)
ROWS = [
    f"+I[101, scooter, 12.50, 5.125, {_SAME}, long text, -7]",
    f"-U[101, scooter, 12.50, 5.125, {_SAME}, null, -7]",  # the before image's TOAST placeholder
    f"+U[101, e-scooter, -0.99, null, {_SAME}, long text, -7]",  # filled from the snapshot image
    f"-D[101, e-scooter, -0.99, null, {_SAME}, null, -7]",
]
INFERRED_DDL = (
    "id INT NOT NULL, name STRING, price DECIMAL(10, 2), weight DECIMAL, born DATE, opens TIME, "
    "created TIMESTAMP_NTZ, updated TIMESTAMP, attrs STRING, uid STRING, photo BINARY, notes STRING, "
    "small SMALLINT"
)


def confluent(schema_id: int, schema: Any, datum: Any) -> bytes:
    """A message as Confluent's KafkaAvroSerializer writes it (fastavro applies the logical types)."""
    out = io.BytesIO()
    out.write(b"\x00" + schema_id.to_bytes(4, "big"))
    fastavro.schemaless_writer(out, fastavro.parse_schema(copy.deepcopy(schema)), datum)
    return out.getvalue()


def messages(schema_id: int = 42) -> list[Message]:
    return [Message(confluent(schema_id, ENVELOPE, e), offset=i) for i, e in enumerate(EVENTS)]


def rendered(decoder: DebeziumAvroDecoder, changes: list[Change]) -> list[str]:
    return [render_change(c, decoder.schema) for c in changes]


def explicit_decoder(**options: str) -> DebeziumAvroDecoder:
    decoder = FACTORY.create_decoder({"schema": ENVELOPE_TEXT, "key-columns": "id", **options})
    assert isinstance(decoder, DebeziumAvroDecoder)
    return decoder


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


def test_declared_schema_takes_its_columns_from_the_record() -> None:
    schema = parse_ddl(
        "id BIGINT NOT NULL, price DECIMAL(12, 3), created TIMESTAMP_NTZ(6), uid STRING, gone INT"
    )
    decoder = FACTORY.create_decoder({"schema": ENVELOPE_TEXT}, schema)
    out = decoder.decode_all(messages()[:1])
    assert rendered(decoder, out.changes) == [
        "+I[101, 12.500, 2021-01-01T00:00:00.123456, f3b1e7a2-0c4d-4e8b-9a1f-2b3c4d5e6f70, null]"
    ]


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


# The schema registry (confluent-kafka's mock: one registry per mock:// URL in the process).


def test_registry_decoding_fetches_each_schema_once(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = (("url", "mock://decode"),)
    client = debezium_avro.registry_client(registry)
    from confluent_kafka.schema_registry import Schema as RegistrySchema

    schema_id = client.register_schema(
        "dbserver1.inventory.products-value", RegistrySchema(ENVELOPE_TEXT, "AVRO")
    )
    decoder = FACTORY.create_decoder({"url": "mock://decode", "key-columns": "id"})
    fetched: list[int] = []
    get_schema = client.get_schema
    monkeypatch.setattr(client, "get_schema", lambda i, *a, **k: fetched.append(i) or get_schema(i, *a, **k))
    out = decoder.decode_all(messages(schema_id))
    assert rendered(decoder, out.changes) == ROWS
    assert fetched == [schema_id]
    unknown = Message(confluent(9999, ENVELOPE, EVENTS[0]), topic="products", offset=5)
    with pytest.raises(DecodeError, match=r"schema id 9999 is not in the Schema Registry at mock://decode"):
        decoder.decode_all([unknown])


def test_registry_round_trip_registers_under_topic_value() -> None:
    schema = parse_ddl("id INT NOT NULL, name STRING, price DECIMAL(10, 2)")
    options = {"url": "mock://roundtrip"}
    encoder = debezium_avro.DebeziumAvroFormat().create_encoder(options, schema, ["id"], topic="shop.orders")
    changes = [Change(RowKind.INSERT, {"id": 1, "name": "a", "price": Decimal("1.50")})]
    encoded = encoder.encode_all(changes)
    client = debezium_avro.registry_client((("url", "mock://roundtrip"),))
    registered = client.get_latest_version("shop.orders-value")
    assert encoded[0].value is not None
    assert encoded[0].value[:5] == b"\x00" + registered.schema_id.to_bytes(4, "big")
    decoder = FACTORY.create_decoder(options)
    out = decoder.decode_all([Message(encoded[0].value)])
    assert [(c.kind, c.row) for c in out.changes] == [(c.kind, c.row) for c in changes]
    assert decoder.schema == schema


def test_toast_state_is_keyed_by_the_avro_kafka_key() -> None:
    from confluent_kafka.schema_registry import Schema as RegistrySchema

    client = debezium_avro.registry_client((("url", "mock://keys"),))
    key_schema = {
        "type": "record",
        "name": "Key",
        "namespace": NAMESPACE,
        "fields": [{"name": "id", "type": "int"}],
    }
    key_id = client.register_schema(
        "dbserver1.inventory.products-key", RegistrySchema(json.dumps(key_schema), "AVRO")
    )
    value_id = client.register_schema(
        "dbserver1.inventory.products-value", RegistrySchema(ENVELOPE_TEXT, "AVRO")
    )
    key = confluent(key_id, key_schema, {"id": 101})
    decoder = FACTORY.create_decoder({"url": "mock://keys"})
    out = decoder.decode_all(Message(m.value, key=key) for m in messages(value_id)[:2])
    assert rendered(decoder, out.changes) == ROWS[:3]
    assert out.metrics.filled_values == 1


def test_unreachable_registry_is_a_clear_error_not_a_dead_letter() -> None:
    registry = (("url", "http://127.0.0.1:9"),)
    client = debezium_avro.registry_client(registry)
    client._rest_client.max_retries = 0  # keep the test fast
    decoder = FACTORY.create_decoder({"url": "http://127.0.0.1:9", "ignore-parse-errors": "true"})
    with pytest.raises(
        FormatError,
        match=r"cannot reach the Schema Registry at http://127.0.0.1:9 to fetch "
        r"schema id 42 .*Check 'debezium-avro-confluent.url'",
    ):
        decoder.decode_all(messages()[:1])


def test_missing_confluent_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_confluent(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("confluent_kafka"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_confluent)
    with pytest.raises(MissingDependencyError, match=r"confluent-kafka.*cdcflow\[kafka\]"):
        FACTORY.create_decoder({"url": "http://registry.invalid:8081"})
    # An explicit schema needs no registry client.
    FACTORY.create_decoder({"schema": ENVELOPE_TEXT})


def test_decoder_pickles_without_the_client() -> None:
    decoder = FACTORY.create_decoder({"url": "mock://pickled", "schema": ENVELOPE_TEXT, "schema-id": "42"})
    clone = pickle.loads(pickle.dumps(decoder))  # noqa: S301 - our own bytes
    assert rendered(clone, clone.decode_all(messages()[:1]).changes) == ROWS[:1]


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


# Encoding: exact bytes for the explicit schema id.

SMALL = parse_ddl("id INT NOT NULL, name STRING")
HEADER = b"\x00\x00\x00\x00\x07"


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        # before: null (union 0); after: union 1, id=1 (zigzag 2), name: union 1, "a"; op "c".
        ([Change(RowKind.INSERT, {"id": 1, "name": "a"})], [HEADER + b"\x00\x02\x02\x02\x02a\x02c"]),
        # -U/+U → ONE "u" event with both images; NULL name is union branch 0.
        (
            [
                Change(RowKind.UPDATE_BEFORE, {"id": -1, "name": None}),
                Change(RowKind.UPDATE_AFTER, {"id": -1, "name": "bc"}),
            ],
            [HEADER + b"\x02\x01\x00" + b"\x02\x01\x02\x04bc" + b"\x02u"],
        ),
        ([Change(RowKind.DELETE, {"id": 64, "name": ""})], [HEADER + b"\x02\x80\x01\x02\x00\x00\x02d"]),
    ],
)
def test_encoder_exact_bytes(changes: list[Change], expected: list[bytes]) -> None:
    encoder = FACTORY.create_encoder({"schema-id": "7"}, SMALL, ["id"])
    assert [e.value for e in encoder.encode_all(changes)] == expected
    assert all(e.key is None for e in encoder.encode_all(changes))


def test_generated_writer_schema_uses_debezium_connect_types() -> None:
    schema = Schema(
        (
            Field("id", DataType(TypeKind.INT), nullable=False),
            Field("price", DataType(TypeKind.DECIMAL, 10, 2)),
            Field("weight", DataType(TypeKind.DECIMAL)),
            Field("day", DataType(TypeKind.DATE)),
            Field("at", DataType(TypeKind.TIMESTAMP_NTZ, 6)),
            Field("seen", DataType(TypeKind.TIMESTAMP_LTZ, 6)),
        )
    )
    encoder = debezium_avro.DebeziumAvroFormat().create_encoder(
        {"schema-id": "7"}, schema, topic="dbserver1.inventory.t-1"
    )
    generated = json.loads(encoder.writer_schema)
    assert generated["namespace"] == "dbserver1.inventory.t_1"
    value = generated["fields"][0]["type"][1]
    types = {f["name"]: f["type"] for f in value["fields"]}
    assert types["id"] == "int"
    assert types["price"][1]["connect.name"] == "org.apache.kafka.connect.data.Decimal"
    assert types["price"][1]["connect.parameters"] == {"scale": "2", "connect.decimal.precision": "10"}
    assert types["weight"][1]["connect.name"] == "io.debezium.data.VariableScaleDecimal"
    assert types["day"][1]["connect.name"] == "io.debezium.time.Date"
    assert types["at"][1] == {
        "type": "long",
        "connect.version": 1,
        "connect.name": "io.debezium.time.MicroTimestamp",
    }
    assert types["seen"][1]["connect.name"] == "io.debezium.time.ZonedTimestamp"
    row = {
        "id": 1,
        "price": Decimal("-3.10"),
        "weight": Decimal("0.001"),
        "day": dt.date(1969, 12, 31),
        "at": dt.datetime(1970, 1, 1, 0, 0, 0, 1),
        "seen": dt.datetime(2000, 1, 1, tzinfo=dt.UTC),
    }
    encoded = encoder.encode_all([Change(RowKind.INSERT, row)])[0].value
    assert encoded is not None
    datum = fastavro.schemaless_reader(io.BytesIO(encoded[5:]), fastavro.parse_schema(generated), None)
    assert datum["after"] == {
        "id": 1,
        "price": Decimal("-3.10"),
        "weight": {"scale": 3, "value": b"\x01"},
        "day": -1,
        "at": 1,
        "seen": "2000-01-01T00:00:00Z",
    }


def test_encoder_with_explicit_writer_schema_reads_back() -> None:
    schema = parse_ddl("id INT NOT NULL, name STRING, price DECIMAL(10, 2), created TIMESTAMP_NTZ(6)")
    with pytest.raises(
        FormatOptionError, match=r"requires the field 'source', which the encoder does not write"
    ):
        FACTORY.create_encoder({"schema": ENVELOPE_TEXT, "schema-id": "42"}, schema, ["id"])
    envelope = copy.deepcopy(ENVELOPE)
    envelope["fields"][2] = {"name": "source", "type": ["null", SOURCE], "default": None}
    encoder = FACTORY.create_encoder({"schema": json.dumps(envelope), "schema-id": "42"}, schema, ["id"])
    row = {"id": 5, "name": "x", "price": Decimal("1.25"), "created": dt.datetime(2021, 1, 1)}
    encoded = encoder.encode_all([Change(RowKind.INSERT, row)])
    decoder = FACTORY.create_decoder({"schema": json.dumps(envelope)})
    out = decoder.decode_all([Message(e.value) for e in encoded])
    assert {k: out.changes[0].row[k] for k in row} == row
    with pytest.raises(FormatOptionError, match=r"column 'nope' is not in the Value record"):
        FACTORY.create_encoder({"schema": json.dumps(envelope), "schema-id": "42"}, parse_ddl("nope INT"))


# decode(encode(x)) == x.

ROUND_TRIP = Schema(
    (
        Field("id", DataType(TypeKind.INT), nullable=False),
        Field("name", DataType(TypeKind.STRING)),
        Field("price", DataType(TypeKind.DECIMAL, 12, 3)),
        Field("weight", DataType(TypeKind.DECIMAL)),
        Field("at", DataType(TypeKind.TIMESTAMP_NTZ, 6)),
        Field("seen", DataType(TypeKind.TIMESTAMP_LTZ, 6)),
        Field("day", DataType(TypeKind.DATE)),
        Field("clock", DataType(TypeKind.TIME, 6)),
        Field("raw", DataType(TypeKind.BINARY)),
        Field("score", DataType(TypeKind.DOUBLE)),
        Field("ratio", DataType(TypeKind.FLOAT)),
        Field("tiny", DataType(TypeKind.TINYINT)),
        Field("ok", DataType(TypeKind.BOOLEAN)),
        Field("tags", DataType(TypeKind.ARRAY, element=DataType(TypeKind.STRING))),
        Field("counts", DataType(TypeKind.MAP, key=DataType(TypeKind.INT), value=DataType(TypeKind.BIGINT))),
        Field("point", DataType(TypeKind.STRUCT, fields=(Field("x", DataType(TypeKind.DOUBLE)),))),
    )
)
VALUES = {
    **DEBEZIUM_VALUES,
    "weight": st.decimals(min_value=-(10**20), max_value=10**20, places=6, allow_nan=False),
    "score": st.floats(allow_nan=False),
    "ratio": st.floats(width=32, allow_nan=False),
    "tiny": st.integers(-128, 127),
    "counts": st.dictionaries(st.integers(-5, 5), st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))),
    "point": st.builds(lambda x: {"x": x}, st.one_of(st.none(), st.floats(allow_nan=False))),
}


@settings(max_examples=60, deadline=None)
@given(per_key_changelogs(VALUES))
def test_round_trip_explicit_schema(changes: list[Change]) -> None:
    encoder = FACTORY.create_encoder({"schema-id": "3"}, ROUND_TRIP, ["id"])
    encoded = encoder.encode_all(changes)
    assert len(encoded) == sum(c.kind is not RowKind.UPDATE_BEFORE for c in changes)  # one event per update
    decoder = FACTORY.create_decoder({"schema": encoder.writer_schema, "schema-id": "3"})
    out = decoder.decode_all(Message(e.value, offset=i) for i, e in enumerate(encoded))
    assert out.dead_letters == [] and out.events == []
    assert decoder.schema == ROUND_TRIP
    assert normalised(out.changes) == normalised(changes)


@settings(max_examples=30, deadline=None)
@given(per_key_changelogs(VALUES))
def test_round_trip_upsert_mode(changes: list[Change]) -> None:
    upserts = [c for c in changes if c.kind is not RowKind.UPDATE_BEFORE]
    options = {"schema-id": "3", "changelog-mode": "upsert"}
    encoder = FACTORY.create_encoder(options, ROUND_TRIP, ["id"])
    decoder = FACTORY.create_decoder({**options, "schema": encoder.writer_schema}, ROUND_TRIP)
    out = decoder.decode_all(Message(e.value) for e in encoder.encode_all(upserts))
    assert normalised(out.changes) == normalised(upserts)


def test_resolve_format_finds_it() -> None:
    assert isinstance(resolve_format("debezium-avro-confluent"), debezium_avro.DebeziumAvroFormat)


def test_config_is_picklable_and_frozen() -> None:
    config = DebeziumAvroConfig.from_options({"url": "mock://cfg", "basic-auth.user-info": "u:p"}, None)
    assert config.registry == (("basic.auth.user.info", "u:p"), ("url", "mock://cfg"))
    assert pickle.loads(pickle.dumps(config))  # noqa: S301 - our own bytes == config
