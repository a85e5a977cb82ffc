"""canal-json encoding: exact bytes of every message shape, and decode(encode(x)) == x."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import orjson
import pytest
from changelog_strategies import assert_round_trips, retract_changelogs
from hypothesis import given, settings

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import FormatOptionError, Message, parse_ddl, render_change, resolve_format
from cdcflow.formats.flat_json.canal import CanalJsonDecoder, CanalJsonEncoder

FACTORY = resolve_format("canal-json")


def decoder(schema: str | None) -> CanalJsonDecoder:
    built = FACTORY.create_decoder({}, parse_ddl(schema) if schema else None)
    assert isinstance(built, CanalJsonDecoder)
    return built


def rendered(decoder: CanalJsonDecoder, items: list[Message]) -> list[str]:
    return [render_change(change, decoder.schema) for change in decoder.decode_all(items).changes]


# --- encoding ---------------------------------------------------------------------------------------

ENC_SCHEMA = "id INT NOT NULL, name STRING, price DECIMAL(10,2), ts TIMESTAMP_NTZ(3), ok BOOLEAN"
TYPES = (
    b'"mysqlType":{"id":"int","name":"longtext","price":"decimal(10,2)","ts":"datetime(3)",'
    b'"ok":"tinyint(1)"},'
)
SQL_TYPES = b'"sqlType":{"id":4,"name":-1,"price":3,"ts":93,"ok":-6},'


def encoder(
    key_columns: tuple[str, ...] = ("id",), schema: str = ENC_SCHEMA, *, options: dict[str, str] | None = None
) -> CanalJsonEncoder:
    built = FACTORY.create_encoder(options or {}, parse_ddl(schema), key_columns)
    assert isinstance(built, CanalJsonEncoder)
    return built


def row(
    id_: int, name: str | None, price: str | None, ts: dt.datetime | None = None, ok: bool | None = None
) -> dict[str, Any]:
    return {"id": id_, "name": name, "price": Decimal(price) if price else None, "ts": ts, "ok": ok}


T0 = dt.datetime(2024, 1, 2, 3, 4, 5, 600000)


def message(data: bytes, old: bytes, kind: bytes, pk: bytes = b'["id"]', db: bytes = b'"shop"') -> bytes:
    return (
        b'{"data":['
        + data
        + b'],"database":'
        + db
        + b',"isDdl":false,'
        + TYPES
        + b'"old":'
        + old
        + b',"pkNames":'
        + pk
        + b","
        + SQL_TYPES
        + b'"table":"orders","type":"'
        + kind
        + b'"}'
    )


ENCODE_CASES = [
    (
        "insert",
        [Change(RowKind.INSERT, row(1, "a", "1.50", T0, True))],
        [
            (
                b'{"id":"1"}',
                message(
                    b'{"id":"1","name":"a","price":"1.50","ts":"2024-01-02 03:04:05.600","ok":"true"}',
                    b"null",
                    b"INSERT",
                ),
            )
        ],
    ),
    (
        "update is one message, old holds the changed columns (a change to NULL kept)",
        [
            Change(RowKind.UPDATE_BEFORE, row(1, "a", "1.50", T0, True)),
            Change(RowKind.UPDATE_AFTER, row(1, None, "2.00", T0, True)),
        ],
        [
            (
                b'{"id":"1"}',
                message(
                    b'{"id":"1","name":null,"price":"2.00","ts":"2024-01-02 03:04:05.600","ok":"true"}',
                    b'[{"name":"a","price":"1.50"}]',
                    b"UPDATE",
                ),
            )
        ],
    ),
    (
        "delete, decimals written without an exponent",
        [Change(RowKind.DELETE, row(2, "b", "0.0000001", None, False))],
        [
            (
                b'{"id":"2"}',
                message(
                    b'{"id":"2","name":"b","price":"0.0000001","ts":null,"ok":"false"}', b"null", b"DELETE"
                ),
            )
        ],
    ),
    (
        "update after only is an insert",
        [Change(RowKind.UPDATE_AFTER, row(3, "c", None))],
        [
            (
                b'{"id":"3"}',
                message(b'{"id":"3","name":"c","price":null,"ts":null,"ok":null}', b"null", b"INSERT"),
            )
        ],
    ),
    (
        "a -U without its +U is written as a delete at flush",
        [Change(RowKind.UPDATE_BEFORE, row(4, "d", None))],
        [
            (
                b'{"id":"4"}',
                message(b'{"id":"4","name":"d","price":null,"ts":null,"ok":null}', b"null", b"DELETE"),
            )
        ],
    ),
]


@pytest.mark.parametrize(
    ("changes", "expected"), [c[1:] for c in ENCODE_CASES], ids=[c[0] for c in ENCODE_CASES]
)
def test_encoder_exact_bytes(changes: list[Change], expected: list[tuple[bytes, bytes]]) -> None:
    e = encoder(options={"canal-json.encode.database": "shop", "encode.table": "orders"})
    assert [(x.key, x.value) for x in e.encode_all(changes)] == expected


def test_encoder_ignore_null_fields_keeps_nulls_in_old_and_no_keys() -> None:
    e = encoder((), options={"encode.ignore-null-fields": "true", "encode.table": "orders"})
    out = e.encode_all(
        [
            Change(RowKind.UPDATE_BEFORE, row(1, None, "1.00")),
            Change(RowKind.UPDATE_AFTER, row(1, "x", "1.00")),
        ]
    )
    assert [(x.key, x.value) for x in out] == [
        (
            None,
            message(b'{"id":"1","name":"x","price":"1.00"}', b'[{"name":null}]', b"UPDATE", b"null", b"null"),
        )
    ]


def test_encoder_writes_other_types_as_canal_text() -> None:
    schema = "f FLOAT, d DOUBLE, b BINARY, t TIME, dd DATE, l TIMESTAMP_LTZ, a ARRAY<INT>, s SMALLINT"
    e = encoder((), schema)
    values = {
        "f": 3.140000104904175,
        "d": float("nan"),
        "b": b"\xff\x00",
        "t": dt.time(1, 2, 3),
        "dd": dt.date(2020, 2, 29),
        "l": dt.datetime(2020, 1, 1, 10, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        "a": [1, None],
        "s": -5,
    }
    [out] = e.encode_all([Change(RowKind.INSERT, values)])
    assert orjson.loads(out.value or b"")["data"] == [
        {
            "f": "3.14",
            "d": "NaN",
            "b": "\u00ff\u0000",
            "t": "01:02:03",
            "dd": "2020-02-29",
            "l": "2020-01-01 08:00:00",
            "a": "[1,null]",
            "s": "-5",
        }
    ]
    back = decoder(schema).decode_all([Message(out.value)]).changes
    assert back[0].row["b"] == b"\xff\x00" and back[0].row["a"] == [1, None]
    assert back[0].row["l"] == dt.datetime(2020, 1, 1, 8, 0, tzinfo=dt.UTC)


def test_encoder_rejects_unknown_key_columns_and_needs_no_schema_for_decoding_output() -> None:
    with pytest.raises(FormatOptionError, match="key column 'nope' is not in the schema"):
        encoder(("nope",))
    # what the encoder writes decodes without a declared schema, through mysqlType
    [out] = encoder().encode_all([Change(RowKind.INSERT, row(1, "a", "1.50", T0, True))])
    d = decoder(None)
    assert rendered(d, [Message(out.value)]) == ["+I[1, a, 1.50, 2024-01-02T03:04:05.600, true]"]


# --- round trip -------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(retract_changelogs())
def test_round_trip(changes: list[Change]) -> None:
    assert_round_trips(FACTORY, changes)
