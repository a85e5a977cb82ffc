"""debezium-avro-confluent encoding: exact bytes, generated writer schemas, decode(encode(x)) == x."""

from __future__ import annotations

import copy
import datetime as dt
import io
import json
import pickle
from decimal import Decimal

import fastavro
import pytest
from avro_events import (
    ENVELOPE,
    ENVELOPE_TEXT,
    FACTORY,
    SOURCE,
)
from changelog_strategies import DEBEZIUM_VALUES, normalised, per_key_changelogs
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import (
    DataType,
    Field,
    FormatOptionError,
    Message,
    Schema,
    TypeKind,
    parse_ddl,
    resolve_format,
)
from cdcflow.formats.debezium import avro as debezium_avro
from cdcflow.formats.debezium.avro import DebeziumAvroConfig

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
