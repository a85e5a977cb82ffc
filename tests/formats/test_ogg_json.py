"""ogg-json: recorded messages, truncate side output, errors, metadata, encoding."""

from __future__ import annotations

import datetime as dt
import pickle
from decimal import Decimal
from typing import Any

import orjson
import pytest
from changelog_strategies import assert_round_trips, retract_changelogs
from golden_cases import flink_rows, messages
from hypothesis import given, settings

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import DecodeError, FormatOptionError, Message, parse_ddl, render_change, resolve_format
from cdcflow.formats.flat_json.ogg import OggJsonDecoder, OggJsonEncoder

PRODUCTS = "id INT NOT NULL, name STRING, description STRING, weight FLOAT"
EVOLVED = "id INT NOT NULL, name STRING, description STRING, weight DOUBLE, age INT, address STRING"
FACTORY = resolve_format("ogg-json")


def decoder(
    schema: str = PRODUCTS, metadata: tuple[str, ...] = (), *, options: dict[str, str] | None = None
) -> OggJsonDecoder:
    built = FACTORY.create_decoder(options or {}, parse_ddl(schema), metadata)
    assert isinstance(built, OggJsonDecoder)
    return built


def rendered(decoder: OggJsonDecoder, items: list[Message]) -> list[str]:
    return [render_change(c, decoder.schema) for c in decoder.decode_all(items).changes]


def ogg(op: str, before: Any = None, after: Any = None, **extra: Any) -> Message:
    return Message(orjson.dumps({"table": "S.T", "op_type": op, "before": before, "after": after, **extra}))


def test_flink_ogg_data() -> None:
    assert rendered(decoder(), messages("flink/ogg-data.txt")) == flink_rows("flink-ogg-data")


def test_paimon_files() -> None:
    evolution = "apache_paimon/kafka/ogg/table/schemaevolution/ogg-data-1-2-3.concat.stripped.txt"
    assert rendered(decoder(EVOLVED), messages(evolution)) == [
        "+I[101, scooter, Small 2-wheel scooter, 3.14, null, null]",
        "+I[102, car battery, 12V car battery, 8.1, null, null]",
        "+I[103, 12-pack drill bits, 12-pack of drill bits with sizes ranging from #40 to #3, 0.8, 18, null]",
        "+I[104, hammer, 12oz carpenter's hammer, 0.75, 24, null]",
        "+I[105, hammer, 14oz carpenter's hammer, 0.875, null, Shanghai]",
        "-D[101, scooter, Small 2-wheel scooter, 3.14, null, null]",
        "-U[105, hammer, 14oz carpenter's hammer, 0.875, null, Shanghai]",
        "+U[105, hammer, 14oz carpenter's hammer, 0.875, null, Beijing]",
        "+I[107, rocks, box of assorted rocks, 5.3, null, null]",
    ]
    events = "apache_paimon/kafka/ogg/table/event/event-insert-update-delete.concat.stripped.txt"
    assert rendered(decoder(), messages(events)) == [
        "+I[101, scooter, Small 2-wheel scooter, 3.14]",
        "+I[102, car battery, 12V car battery, 8.1]",
        "+I[103, scooter, Big 2-wheel scooter , 5.1]",
        "-U[103, scooter, Big 2-wheel scooter , 5.1]",
        "+U[103, scooter, Big 2-wheel scooter , 8.1]",
        "-D[103, scooter, Big 2-wheel scooter , 8.1]",
    ]
    d = decoder(metadata=("table",))
    topic0 = "apache_paimon/kafka/ogg/database/include/topic0/ogg-data-1.stripped.txt"
    assert [c.row["table"] for c in d.decode_all(messages(topic0)).changes] == [
        "PAIMON_SYNC_DATABASE_AFFIX.paimon_1",
        "PAIMON_SYNC_DATABASE_AFFIX.paimon_2",
        "PAIMON_SYNC_DATABASE_AFFIX.ignore",
        "PAIMON_SYNC_DATABASE_AFFIX.flink",
    ]


def test_metadata_columns() -> None:
    keys = ("table", "primary-keys", "ingestion-timestamp", "event-timestamp")
    d = decoder(metadata=keys)
    out = d.decode_all(messages("flink/ogg-data.txt")[:2])
    assert [f.name for f in d.schema][4:] == [
        "table",
        "primary_keys",
        "ingestion_timestamp",
        "event_timestamp",
    ]
    assert [render_change(c, d.schema) for c in out.changes] == [
        "+I[101, scooter, Small 2-wheel scooter, 3.14, OGG.TBL_TEST, [id], 2020-05-13T13:39:35.766Z, "
        "2020-05-13T15:40:06Z]",
        "+I[102, car battery, 12V car battery, 8.1, OGG.TBL_TEST, [id], null, 2020-05-13T15:40:07Z]",
    ]
    with pytest.raises(DecodeError, match="field 'op_ts': expected a timestamp"):
        decoder(metadata=("event-timestamp",)).decode_all([ogg("I", after={"id": 1}, op_ts="yesterday")])


def test_truncate_goes_to_the_side_output() -> None:
    out = decoder().decode_all([ogg("T")])
    assert [e.kind for e in out.events] == ["truncate"] and out.changes == []


def test_truncate_carries_the_requested_metadata() -> None:
    out = decoder(metadata=("table", "event-timestamp")).decode_all(
        [ogg("T", op_ts="2020-05-13 15:40:06.000000")]
    )
    assert out.events[0].metadata == {
        "table": "S.T",
        "event_timestamp": dt.datetime(2020, 5, 13, 15, 40, 6, tzinfo=dt.UTC),
    }


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (ogg("U", None, {"id": 1}), "field 'before': GoldenGate wrote no before image.*-U row"),
        (ogg("D", None, None), "field 'before': GoldenGate wrote no before image.*deleted row"),
        (ogg("I", None, None), "field 'after': an insert .* needs the after image"),
        (ogg("U", {"id": 1}, None), "field 'after': an update .* needs the after image"),
        (ogg("X", None, {"id": 1}), "field 'op_type': unknown GoldenGate op_type 'X': expected I, U, D or T"),
        (ogg("U", {"id": "one"}, {"id": 1}), "field 'before.id': expected an integer for INT, got 'one'"),
        (ogg("I", None, [1]), "field 'after': a row image must be a JSON object, got list"),
    ],
)
def test_errors(message: Message, match: str) -> None:
    with pytest.raises(DecodeError, match=match) as raised:
        decoder().decode_all([Message(message.value, file="ogg.jsonl", line=3)])
    assert "ogg.jsonl:3" in str(raised.value) and "'ogg-json.ignore-parse-errors'='true'" in str(raised.value)


def test_dead_letters_keep_the_bytes() -> None:
    items = [ogg("I", after={"id": 1}), ogg("U", None, {"id": 1}), ogg("D", {"id": 1})]
    d = decoder(options={"ogg-json.ignore-parse-errors": "true"})
    out = d.decode_all(items)
    assert [render_change(c, d.schema) for c in out.changes] == [
        "+I[1, null, null, null]",
        "-D[1, null, null, null]",
    ]
    [dead] = out.dead_letters
    assert dead.message.value == items[1].value and dead.field == "before"
    assert out.metrics.dead_letters == 1


def test_options_and_factory() -> None:
    with pytest.raises(FormatOptionError, match="format 'ogg-json' needs the table schema"):
        FACTORY.create_decoder({}, None)
    with pytest.raises(
        FormatOptionError, match=r"Unsupported options for format 'ogg-json': ogg-json\.foo\. Supported"
    ):
        decoder(options={"ogg-json.foo": "1"})
    with pytest.raises(FormatOptionError, match="option 'ogg-json.map-null-key.mode': 'KEEP' is not one of"):
        decoder(options={"ogg-json.map-null-key.mode": "KEEP"})
    copy = pickle.loads(pickle.dumps(decoder()))  # noqa: S301 - our own bytes
    assert rendered(copy, messages("flink/ogg-data.txt")[:1]) == [
        "+I[101, scooter, Small 2-wheel scooter, 3.14]"
    ]


# --- encoding ---------------------------------------------------------------------------------------

ENC_SCHEMA = "id INT NOT NULL, name STRING, price DECIMAL(10,2), ts TIMESTAMP_NTZ(3)"
T0 = dt.datetime(2024, 1, 2, 3, 4, 5, 600000)


def row(id_: int, name: str | None, price: str | None, ts: dt.datetime | None = None) -> dict[str, Any]:
    return {"id": id_, "name": name, "price": Decimal(price) if price else None, "ts": ts}


def encoder(
    key_columns: tuple[str, ...] = ("id",), *, options: dict[str, str] | None = None
) -> OggJsonEncoder:
    built = FACTORY.create_encoder(options or {}, parse_ddl(ENC_SCHEMA), key_columns)
    assert isinstance(built, OggJsonEncoder)
    return built


ENCODE_CASES = [
    (
        "insert",
        [Change(RowKind.INSERT, row(1, "a", "1.50", T0))],
        [
            (
                b'{"id":1}',
                b'{"table":"S.ORDERS","op_type":"I","primary_keys":["id"],'
                b'"after":{"id":1,"name":"a","price":1.50,"ts":"2024-01-02 03:04:05.600"}}',
            )
        ],
    ),
    (
        "update is one message with before and after",
        [
            Change(RowKind.UPDATE_BEFORE, row(1, "a", "1.50")),
            Change(RowKind.UPDATE_AFTER, row(1, "b", "1.50")),
        ],
        [
            (
                b'{"id":1}',
                b'{"table":"S.ORDERS","op_type":"U","primary_keys":["id"],'
                b'"before":{"id":1,"name":"a","price":1.50,"ts":null},'
                b'"after":{"id":1,"name":"b","price":1.50,"ts":null}}',
            )
        ],
    ),
    (
        "delete",
        [Change(RowKind.DELETE, row(2, None, "0.0000001"))],
        [
            (
                b'{"id":2}',
                b'{"table":"S.ORDERS","op_type":"D","primary_keys":["id"],'
                b'"before":{"id":2,"name":null,"price":0.0000001,"ts":null}}',
            )
        ],
    ),
    (
        "a -U without its +U is a delete",
        [Change(RowKind.UPDATE_BEFORE, row(3, "c", None))],
        [
            (
                b'{"id":3}',
                b'{"table":"S.ORDERS","op_type":"D","primary_keys":["id"],'
                b'"before":{"id":3,"name":"c","price":null,"ts":null}}',
            )
        ],
    ),
]


@pytest.mark.parametrize(
    ("changes", "expected"), [c[1:] for c in ENCODE_CASES], ids=[c[0] for c in ENCODE_CASES]
)
def test_encoder_exact_bytes(changes: list[Change], expected: list[tuple[bytes, bytes]]) -> None:
    e = encoder(options={"ogg-json.encode.table": "S.ORDERS"})
    assert [(x.key, x.value) for x in e.encode_all(changes)] == expected


def test_encoder_without_keys_ignoring_nulls() -> None:
    e = encoder((), options={"encode.ignore-null-fields": "true"})
    [out] = e.encode_all([Change(RowKind.INSERT, row(1, None, None))])
    assert (out.key, out.value) == (None, b'{"table":null,"op_type":"I","after":{"id":1}}')
    with pytest.raises(FormatOptionError, match="Unsupported options for format 'ogg-json': encode.database"):
        encoder(options={"encode.database": "x"})


@settings(max_examples=60, deadline=None)
@given(retract_changelogs())
def test_round_trip(changes: list[Change]) -> None:
    assert_round_trips(FACTORY, changes)
