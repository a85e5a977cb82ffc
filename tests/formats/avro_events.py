"""Debezium Avro events as Confluent's AvroConverter writes them: the shared fixtures of the avro tests."""

from __future__ import annotations

import copy
import io
import json
from decimal import Decimal
from typing import Any

import fastavro

from cdcflow.core.model import Change
from cdcflow.formats import Message, render_change
from cdcflow.formats.debezium import avro as debezium_avro
from cdcflow.formats.debezium.avro import DebeziumAvroDecoder

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
