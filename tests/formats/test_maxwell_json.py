"""maxwell-json: recorded messages, old-image overlay, side outputs, errors, metadata, encoding."""

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
from cdcflow.formats.flat_json.maxwell import MaxwellJsonDecoder, MaxwellJsonEncoder

PRODUCTS = "id INT NOT NULL, name STRING, description STRING, weight FLOAT"
EVOLVED = "id INT NOT NULL, name STRING, description STRING, weight DOUBLE, age INT, address STRING"
FACTORY = resolve_format("maxwell-json")


def decoder(
    schema: str = PRODUCTS, metadata: tuple[str, ...] = (), *, options: dict[str, str] | None = None
) -> MaxwellJsonDecoder:
    built = FACTORY.create_decoder(options or {}, parse_ddl(schema), metadata)
    assert isinstance(built, MaxwellJsonDecoder)
    return built


def rendered(decoder: MaxwellJsonDecoder, items: list[Message]) -> list[str]:
    return [render_change(c, decoder.schema) for c in decoder.decode_all(items).changes]


def maxwell(kind: str, data: Any, **extra: Any) -> Message:
    return Message(orjson.dumps({"database": "d", "table": "t", "type": kind, "data": data, **extra}))


def test_flink_maxwell_data() -> None:
    assert rendered(decoder(), messages("flink/maxwell-data.txt")) == flink_rows("flink-maxwell-data")


def test_paimon_schema_evolution_files_match_flink_golden() -> None:
    path = "apache_paimon/kafka/maxwell/table/schemaevolution/maxwell-data-1-2-3.concat.stripped.txt"
    assert rendered(decoder(EVOLVED), messages(path)) == [
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
    path4 = "apache_paimon/kafka/maxwell/table/schemaevolution/maxwell-data-4.stripped.txt"
    assert rendered(decoder(EVOLVED), messages(path4)) == [
        "+I[103, 12-pack drill bits, 12-pack of drill bits with sizes ranging from #40 to #3, "
        "null, null, null]",
        "+I[104, hammer, 12oz carpenter's hammer, 0.75, null, null]",
    ]
    topic0 = "apache_paimon/kafka/maxwell/database/include/topic0/maxwell-data-1.stripped.txt"
    assert rendered(decoder(), messages(topic0))[-1] == "+I[104, hammer, 12oz carpenter's hammer, 0.75]"


def test_risingwave_tinyint1_as_boolean_and_datetime() -> None:
    d = decoder("id INT, name STRING, is_adult BOOLEAN, birthday TIMESTAMP_NTZ")
    assert rendered(d, messages("risingwavelabs_risingwave/maxwell_json.1")) == [
        "+I[1, tom, false, 2017-12-31T16:00:01]",
        "+I[2, alex, true, 1999-12-31T16:00:01]",
        "-U[2, alex, true, 1999-12-31T16:00:01]",
        "+U[2, chi, true, 1999-12-31T16:00:01]",
    ]


def test_old_null_is_a_change_from_null_and_missing_old_is_no_change() -> None:
    d = decoder("id INT NOT NULL, a STRING, b INT")
    items = [
        maxwell("update", {"id": 1, "a": "now", "b": 2}, old={"a": None, "gone": 1}),
        maxwell("update", {"id": 1, "a": "now", "b": 3}, old={"b": 2}),
        maxwell("update", {"id": 1, "a": "now", "b": 3}),
    ]
    assert rendered(d, items) == [
        "-U[1, null, 2]",
        "+U[1, now, 2]",
        "-U[1, now, 2]",
        "+U[1, now, 3]",
        "-U[1, now, 3]",
        "+U[1, now, 3]",
    ]


def test_bootstrap_and_ddl_messages() -> None:
    d = decoder()
    items = [
        maxwell("bootstrap-start", {}),
        maxwell("bootstrap-insert", {"id": 1, "name": "a"}),
        maxwell("bootstrap-complete", {}),
        Message(orjson.dumps({"type": "table-alter", "database": "d", "sql": "alter table t add c int"})),
        Message(orjson.dumps({"type": "database-create", "database": "e", "sql": "create database e"})),
    ]
    out = d.decode_all(items)
    assert [render_change(c, d.schema) for c in out.changes] == ["+I[1, a, null, null]"]
    assert [e.kind for e in out.events] == ["bootstrap", "bootstrap", "schema-change", "schema-change"]
    assert out.events[2].payload["sql"] == "alter table t add c int"


def test_errors_name_the_field_and_the_option() -> None:
    bad = maxwell("insert", {"id": "x"})
    with pytest.raises(DecodeError) as raised:
        decoder().decode_all([Message(bad.value, topic="mx", partition=1, offset=42)])
    text = str(raised.value)
    assert "topic 'mx' partition 1 offset 42, field 'data.id': expected an integer for INT, got 'x'" in text
    assert "'maxwell-json.ignore-parse-errors'='true'" in text
    with pytest.raises(DecodeError, match=r"field 'old\.id': expected an integer"):
        decoder().decode_all([maxwell("update", {"id": 1}, old={"id": "one"})])
    with pytest.raises(DecodeError, match="field 'type': unknown Maxwell message type 'upsert'"):
        decoder().decode_all([maxwell("upsert", {"id": 1})])
    with pytest.raises(DecodeError, match="field 'data': a row image must be a JSON object, got null"):
        decoder().decode_all([maxwell("insert", None)])


def test_dead_letters_keep_the_bytes() -> None:
    items = [maxwell("insert", {"id": 1}), maxwell("insert", {"id": "x"}), maxwell("delete", {"id": 1})]
    d = decoder(options={"ignore-parse-errors": "true"})
    out = d.decode_all(items)
    assert [render_change(c, d.schema) for c in out.changes] == [
        "+I[1, null, null, null]",
        "-D[1, null, null, null]",
    ]
    [dead] = out.dead_letters
    assert dead.message.value == items[1].value and dead.field == "data.id"
    assert out.metrics.dead_letters == 1


def test_metadata_columns() -> None:
    keys = ("database", "table", "primary-key-columns", "ingestion-timestamp")
    d = decoder(metadata=keys)
    [change] = d.decode_all(messages("flink/maxwell-data.txt")[:1]).changes
    assert [f.name for f in d.schema][4:] == [
        "database",
        "table",
        "primary_key_columns",
        "ingestion_timestamp",
    ]
    assert render_change(change, d.schema) == (
        "+I[101, scooter, Small 2-wheel scooter, 3.14, test, product, [id], 2020-08-06T03:34:43Z]"
    )
    assert change.row["ingestion_timestamp"] == dt.datetime(2020, 8, 6, 3, 34, 43, tzinfo=dt.UTC)


def test_options_and_factory() -> None:
    with pytest.raises(FormatOptionError, match="format 'maxwell-json' needs the table schema"):
        FACTORY.create_decoder({}, None)
    with pytest.raises(FormatOptionError) as raised:
        decoder(options={"maxwell-json.database.exclude": "x"})
    assert (
        "Supported options: maxwell-json.ignore-parse-errors, maxwell-json.timestamp-format.standard"
        in str(raised.value)
    )
    assert "maxwell-json.encode.decimal-as-plain-number" in str(raised.value)
    with pytest.raises(FormatOptionError, match="has no metadata column 'es'"):
        decoder(metadata=("es",))
    copy = pickle.loads(pickle.dumps(decoder()))  # noqa: S301 - our own bytes
    assert rendered(copy, messages("flink/maxwell-data.txt")[:1]) == [
        "+I[101, scooter, Small 2-wheel scooter, 3.14]"
    ]


def test_include_options_read_one_tables_messages_and_count_the_others_as_filtered() -> None:
    """Not Flink's: a whole-database job reads each table of a shared Maxwell topic through them."""
    items = [
        maxwell("insert", {"id": 1, "name": "a"}),
        Message(orjson.dumps({"database": "d", "table": "u", "type": "insert", "data": {"id": 2}})),
        Message(orjson.dumps({"database": "e", "table": "t", "type": "insert", "data": {"id": 3}})),
    ]
    only = decoder(options={"maxwell-json.database.include": "d", "maxwell-json.table.include": "t"})
    out = only.decode_all(items)
    assert [render_change(c, only.schema) for c in out.changes] == ["+I[1, a, null, null]"]
    assert out.metrics.filtered == 2


# --- encoding ---------------------------------------------------------------------------------------

ENC_SCHEMA = "id INT NOT NULL, name STRING, price DECIMAL(10,2), ts TIMESTAMP_NTZ(3), ok BOOLEAN"
T0 = dt.datetime(2024, 1, 2, 3, 4, 5, 600000)


def row(
    id_: int, name: str | None, price: str | None, ts: dt.datetime | None = None, ok: bool | None = None
) -> dict[str, Any]:
    return {"id": id_, "name": name, "price": Decimal(price) if price else None, "ts": ts, "ok": ok}


def encoder(
    key_columns: tuple[str, ...] = ("id",), *, options: dict[str, str] | None = None
) -> MaxwellJsonEncoder:
    built = FACTORY.create_encoder(options or {}, parse_ddl(ENC_SCHEMA), key_columns)
    assert isinstance(built, MaxwellJsonEncoder)
    return built


HEAD = b'{"database":"shop","table":"orders","type":'
ENCODE_CASES = [
    (
        "insert",
        [Change(RowKind.INSERT, row(1, "a", "1.50", T0, True))],
        [
            (
                b'{"id":1}',
                HEAD + b'"insert","data":{"id":1,"name":"a","price":1.50,"ts":"2024-01-02 03:04:05.600",'
                b'"ok":true},'
                b'"primary_key_columns":["id"]}',
            )
        ],
    ),
    (
        "update is one message with the changed columns in old",
        [
            Change(RowKind.UPDATE_BEFORE, row(1, "a", "1.50", T0, True)),
            Change(RowKind.UPDATE_AFTER, row(1, None, "1.50", T0, False)),
        ],
        [
            (
                b'{"id":1}',
                HEAD + b'"update","data":{"id":1,"name":null,"price":1.50,"ts":"2024-01-02 03:04:05.600",'
                b'"ok":false},'
                b'"old":{"name":"a","ok":true},"primary_key_columns":["id"]}',
            )
        ],
    ),
    (
        "delete, decimals without an exponent",
        [Change(RowKind.DELETE, row(2, "b", "0.0000001"))],
        [
            (
                b'{"id":2}',
                HEAD + b'"delete","data":{"id":2,"name":"b","price":0.0000001,"ts":null,"ok":null},'
                b'"primary_key_columns":["id"]}',
            )
        ],
    ),
    (
        "a -U without its +U is a delete",
        [Change(RowKind.UPDATE_BEFORE, row(3, "c", None))],
        [
            (
                b'{"id":3}',
                HEAD + b'"delete","data":{"id":3,"name":"c","price":null,"ts":null,"ok":null},'
                b'"primary_key_columns":["id"]}',
            )
        ],
    ),
]


@pytest.mark.parametrize(
    ("changes", "expected"), [c[1:] for c in ENCODE_CASES], ids=[c[0] for c in ENCODE_CASES]
)
def test_encoder_exact_bytes(changes: list[Change], expected: list[tuple[bytes, bytes]]) -> None:
    e = encoder(options={"maxwell-json.encode.database": "shop", "encode.table": "orders"})
    assert [(x.key, x.value) for x in e.encode_all(changes)] == expected


def test_encoder_without_keys_or_names_and_ignoring_nulls() -> None:
    e = encoder((), options={"encode.ignore-null-fields": "true", "timestamp-format.standard": "ISO-8601"})
    out = e.encode_all(
        [
            Change(RowKind.UPDATE_BEFORE, row(1, None, None, T0)),
            Change(RowKind.UPDATE_AFTER, row(1, "x", None, T0)),
        ]
    )
    assert [(x.key, x.value) for x in out] == [
        (
            None,
            b'{"database":null,"table":null,"type":"update","data":{"id":1,"name":"x","ts":"2024-01-02T03:04:05.600"},'
            b'"old":{"name":null}}',
        )
    ]


@settings(max_examples=60, deadline=None)
@given(retract_changelogs())
def test_round_trip(changes: list[Change]) -> None:
    assert_round_trips(FACTORY, changes)


def test_long_json_numbers_keep_every_digit_in_wide_decimals() -> None:
    # orjson reads 1234567890123456789.123456789 as a double; the decimal column needs every digit.
    value = b'{"type": "insert", "data": {"id": 1, "amount": 1234567890123456789.123456789, "ratio": 0.1}}'
    schema = parse_ddl("id INT NOT NULL, amount DECIMAL(38, 9), ratio DOUBLE")
    out = FACTORY.create_decoder({}, schema).decode_all([Message(value)])
    assert out.changes[0].row == {"id": 1, "amount": Decimal("1234567890123456789.123456789"), "ratio": 0.1}
