"""Hostile values: each one fails its record as a dead letter naming the field (or a DecodeError with
coordinates in FAIL mode), never a raw exception, and is refused in time linear in its length.

The suite runs with CDCFLOW_STRICT_DECODE (tests/conftest.py): an unexpected exception type is raised,
not dead-lettered, so each case here fails if a conversion raises anything but a FieldError.
"""

from __future__ import annotations

import base64
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import orjson
import pytest

from cdcflow.formats import DecodeError, Message, parse_ddl, resolve_format
from cdcflow.formats.base import Decoder
from cdcflow.formats.decimals import EXACT, decimal_from_bytes
from cdcflow.formats.errors import FieldError

COLUMNS = "id INT NOT NULL, s STRING, d DECIMAL(10, 2), t TIMESTAMP, n TIMESTAMP_NTZ(3), b BIGINT, f DOUBLE"


def decoder(
    name: str, schema: str | None = COLUMNS, metadata: tuple[str, ...] = (), **options: str
) -> Decoder:
    key = "ignore-parse-errors"
    chosen = {key: "true", **{k.replace("_", "-"): v for k, v in options.items()}}
    return resolve_format(name).create_decoder(chosen, parse_ddl(schema) if schema else None, metadata)


def dead_letter(d: Decoder, value: bytes | Any, key: bytes | None = None) -> tuple[str | None, str]:
    """Decode one message that must become a dead letter with its exact bytes: (field, reason)."""
    data = value if isinstance(value, bytes) else orjson.dumps(value)
    out = d.decode_all([Message(data, key=key, topic="t", partition=0, offset=5)])
    assert out.changes == [] and out.events == []
    assert len(out.dead_letters) == 1, out.dead_letters
    letter = out.dead_letters[0]
    assert letter.message.value == data
    assert "internal error" not in letter.reason
    assert len(letter.reason) < 600
    return letter.field, letter.reason


@contextmanager
def within_seconds(seconds: int) -> Iterator[None]:
    """Fails a hang (a quadratic conversion of a long value took minutes); never a speed assertion."""

    def hung(*_: Any) -> None:
        raise AssertionError(f"no answer within {seconds} s: the conversion is not linear")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# --- 1. an op field that is a list or an object (unhashable) -------------------------------------------

OPS = {
    "debezium-json": lambda op: {"op": op, "after": {"id": 1}},
    "canal-json": lambda op: {"type": op, "data": [{"id": "1"}], "isDdl": False},
    "maxwell-json": lambda op: {"type": op, "data": {"id": 1}},
    "ogg-json": lambda op: {"op_type": op, "after": {"id": 1}},
    "generic": lambda op: {"op": op, "id": 1},
}
OP_FIELDS = {"debezium-json": "op", "canal-json": "type", "maxwell-json": "type", "ogg-json": "op_type"}


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("op", [["c", "INSERT", "I"], {"op": "c"}], ids=["list", "object"])
def test_an_op_that_is_a_list_or_an_object_is_a_dead_letter_naming_the_op_field(name: str, op: Any) -> None:
    field, reason = dead_letter(decoder(name), OPS[name](op))
    assert field == OP_FIELDS.get(name, "op")
    assert ("[" in reason) or ("{" in reason)  # the excerpt of what was found


def test_an_op_nested_a_thousand_levels_deep_gets_a_bounded_excerpt() -> None:
    deep = b"[" * 1000 + b"]" * 1000
    for name, envelope in (
        ("ogg-json", b'{"op_type":%s,"after":{"id":1}}'),
        ("generic", b'{"op":%s,"id":1}'),
        ("maxwell-json", b'{"type":%s,"data":{"id":1}}'),
    ):
        field, reason = dead_letter(decoder(name), envelope % deep)
        assert field in ("op_type", "op", "type"), name
        assert "[[[" in reason


# --- 2. decimals: huge scales, huge digits, declared precision ----------------------------------------


def _vsd(number: int, scale: int) -> dict[str, Any]:
    length = max(1, (number.bit_length() + 8) // 8)
    return {"scale": scale, "value": base64.b64encode(number.to_bytes(length, "big", signed=True)).decode()}


@pytest.mark.parametrize("column", ["s", "d"])
@pytest.mark.parametrize("scale", [10**9, -(10**6), 10**18])
def test_a_variable_scale_decimal_with_a_huge_scale_is_a_dead_letter(column: str, scale: int) -> None:
    field, reason = dead_letter(
        decoder("debezium-json"), {"op": "c", "after": {"id": 1, column: _vsd(1, scale)}}
    )
    assert field == f"after.{column}"
    assert "scale" in reason and "10,000" in reason


def schema_envelope(fields: Any, after: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": {
            "type": "struct",
            "fields": [
                {"field": "after", "type": "struct", "optional": True, "fields": fields},
                {"field": "op", "type": "string"},
            ],
        },
        "payload": {"op": "c", "after": after},
    }


def connect_decimal(**parameters: Any) -> list[dict[str, Any]]:
    return [
        {
            "field": "d",
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {k.replace("_", "."): v for k, v in parameters.items()},
        }
    ]


def test_a_connect_decimal_beyond_its_declared_precision_is_a_dead_letter_without_a_declared_schema() -> None:
    d = decoder("debezium-json", None, schema_include="true")
    # 100000 unscaled at scale 2 is 1000.00: five digits before the point, DECIMAL(5, 2) holds three.
    unscaled = base64.b64encode((100000).to_bytes(3, "big", signed=True)).decode()
    field, reason = dead_letter(
        d, schema_envelope(connect_decimal(scale="2", connect_decimal_precision="5"), {"d": unscaled})
    )
    assert (field, reason) == ("after.d", "1000.00 does not fit DECIMAL(5, 2)")
    # The same value fits DECIMAL(6, 2).
    out = d.decode_all(
        [
            Message(
                orjson.dumps(
                    schema_envelope(
                        connect_decimal(scale="2", connect_decimal_precision="6"), {"d": unscaled}
                    )
                )
            )
        ]
    )
    assert [c.row["d"] for c in out.changes] == [Decimal("1000.00")]


def test_a_connect_decimal_with_a_huge_scale_is_a_dead_letter_naming_the_schema() -> None:
    d = decoder("debezium-json", None, schema_include="true")
    field, reason = dead_letter(d, schema_envelope(connect_decimal(scale=str(10**9)), {"d": "AQ=="}))
    assert field == "schema"
    assert "field 'd'" in reason and "scale" in reason


def test_a_variable_scale_decimal_of_more_than_1000_digits_is_kept_exactly() -> None:
    number = 10**1100 + 7
    vsd_field = [{"field": "d", "type": "struct", "name": "io.debezium.data.VariableScaleDecimal"}]
    d = decoder("debezium-json", None, schema_include="true")
    out = d.decode_all([Message(orjson.dumps(schema_envelope(vsd_field, {"d": _vsd(number, 3)})))])
    assert [c.row["d"] for c in out.changes] == [Decimal(number).scaleb(-3, EXACT)]
    assert str(out.changes[0].row["d"]) == f"{str(number)[:-3]}.{str(number)[-3:]}"
    # Into a declared STRING column: the exact digits too.
    out = decoder("debezium-json").decode_all(
        [Message(orjson.dumps({"op": "c", "after": {"id": 1, "s": _vsd(number, 0)}}))]
    )
    assert out.changes[0].row["s"] == str(number)


def test_a_decimal_over_the_digit_limit_is_refused_by_its_length_before_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded: list[int] = []
    real = base64.b64decode
    monkeypatch.setattr(base64, "b64decode", lambda text, **kw: decoded.append(len(text)) or real(text, **kw))
    huge = base64.b64encode(b"\x01" * 750_000).decode()  # 1 MB of base64: ~1.8 million digits
    d = decoder("debezium-json")
    with within_seconds(10):
        field, reason = dead_letter(d, {"op": "c", "after": {"id": 1, "s": {"scale": 0, "value": huge}}})
        assert field == "after.s" and "10,000 digits" in reason
        # A DECIMAL(10, 2) column's precision bounds its bytes: 8,000 characters of base64 are refused unread.
        field, reason = dead_letter(d, {"op": "c", "after": {"id": 1, "d": huge[:8_000]}})
        assert field == "after.d" and "precision 10 has at most 5 bytes" in reason
        field, reason = dead_letter(d, {"op": "c", "after": {"id": 1, "d": huge[:300_000]}})
        assert field == "after.d" and "300,000 characters long" in reason
        # A Connect Decimal of precision 38.
        si = decoder("debezium-json", None, schema_include="true")
        field, reason = dead_letter(si, schema_envelope(connect_decimal(scale="2"), {"d": huge}))
        assert field == "after.d" and "precision 38" in reason
    assert decoded == []


def test_decimal_bytes_over_the_limit_are_refused_unconverted() -> None:
    with within_seconds(10), pytest.raises(FieldError, match="at most"):
        decimal_from_bytes(b"\x01" * 1_000_000, 0)
    assert decimal_from_bytes(b"\x01" * 4000, 0) == Decimal(int.from_bytes(b"\x01" * 4000, "big"))


def test_a_long_run_of_digits_is_checked_in_linear_time() -> None:
    # The old number pattern backtracked quadratically: 20,000 digits took 7 s, 300,000 hours.
    d = decoder("debezium-json")
    with within_seconds(10):
        field, reason = dead_letter(d, {"op": "c", "after": {"id": 1, "f": "1" * 300_000 + "x"}})
        assert field == "after.f" and "expected a number" in reason
        field, reason = dead_letter(d, {"op": "c", "after": {"id": 1, "d": "9" * 300_000}})
        assert field == "after.d" and "300,000 characters" in reason


# --- 3. deep JSON inside a STRING column ---------------------------------------------------------------


@pytest.mark.parametrize("depth", [300, 1000])
def test_json_nested_deeper_than_the_limit_in_a_string_column_is_a_dead_letter(depth: int) -> None:
    nested = b"[" * depth + b"]" * depth
    for name, envelope in (
        ("debezium-json", b'{"op":"c","after":{"id":1,"s":%s}}'),
        ("maxwell-json", b'{"type":"insert","data":{"id":1,"s":%s}}'),
        ("generic", b'{"op":"INSERT","id":1,"s":%s}'),
    ):
        field, reason = dead_letter(decoder(name), envelope % nested)
        assert field in ("after.s", "data.s", "s"), name
        assert "nested deeper than 254 levels" in reason


def test_deep_json_read_again_for_its_exact_numbers_is_a_dead_letter() -> None:
    # A long decimal makes the decoder read the message again with exact numbers (json.loads).
    d = decoder("debezium-json", "id INT NOT NULL, s STRING, d DECIMAL(38, 18)")
    nested = b"[" * 1000 + b"]" * 1000
    field, reason = dead_letter(d, b'{"op":"c","after":{"id":1,"d":1.123456789012345678,"s":%s}}' % nested)
    assert field is not None and reason


# --- 4. timestamps at the edges of the range ------------------------------------------------------------

EDGES = ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "0001-01-01 00:30:00+00:45"]


@pytest.mark.parametrize("text", EDGES)
@pytest.mark.parametrize("column", ["t", "n"])
def test_a_timestamp_outside_years_1_to_9999_in_utc_is_a_dead_letter(text: str, column: str) -> None:
    for name, envelope, path in (
        ("debezium-json", {"op": "c", "after": {"id": 1, column: text}}, f"after.{column}"),
        ("ogg-json", {"op_type": "I", "after": {"id": 1, column: text}}, f"after.{column}"),
        ("generic", {"op": "INSERT", "id": 1, column: text}, column),
    ):
        field, reason = dead_letter(decoder(name), envelope)
        assert field == path, name
        assert "TIMESTAMP range" in reason


def test_a_timestamp_at_the_edge_that_stays_in_range_is_read() -> None:
    out = decoder("debezium-json").decode_all(
        [Message(orjson.dumps({"op": "c", "after": {"id": 1, "t": "0001-01-01T01:00:00+01:00"}}))]
    )
    assert out.changes[0].row["t"].isoformat() == "0001-01-01T00:00:00+00:00"


@pytest.mark.parametrize("value", [10**18, -(10**17), 2**63 - 1])
def test_an_epoch_beyond_the_range_is_a_dead_letter_in_data_and_metadata(value: int) -> None:
    d = decoder("debezium-json", metadata=("ingestion-timestamp", "source.timestamp"))
    field, reason = dead_letter(d, {"op": "c", "after": {"id": 1, "t": value}})
    assert field == "after.t" and "TIMESTAMP range" in reason
    field, reason = dead_letter(d, {"op": "c", "after": {"id": 1}, "ts_ms": value})
    assert field == "ts_ms" and "TIMESTAMP range" in reason
    field, reason = dead_letter(d, {"op": "c", "after": {"id": 1}, "source": {"ts_ms": value}})
    assert field == "source.ts_ms" and "TIMESTAMP range" in reason
    c = decoder("canal-json", metadata=("ingestion-timestamp",))
    field, reason = dead_letter(c, {"type": "INSERT", "data": [{"id": "1"}], "isDdl": False, "ts": value})
    assert field == "ts" and "TIMESTAMP range" in reason
    m = decoder("maxwell-json", metadata=("ingestion-timestamp",))
    field, reason = dead_letter(m, {"type": "insert", "data": {"id": 1}, "ts": value})
    assert field == "ts" and "TIMESTAMP range" in reason


def test_metadata_source_values_nested_deeply_are_a_dead_letter_naming_them() -> None:
    d = decoder("debezium-json", metadata=("source.properties",))
    nested = b"[" * 600 + b"]" * 600
    field, reason = dead_letter(d, b'{"op":"c","after":{"id":1},"source":{"db":"x","extra":%s}}' % nested)
    assert field == "source.extra" and "nested deeper" in reason
    out = d.decode_all([Message(b'{"op":"c","after":{"id":1},"source":{"db":"x","extra":{"a":[1]}}}')])
    assert out.changes[0].row["source_properties"] == {"db": "x", "extra": '{"a":[1]}'}


# --- 5. malformed Connect schema blocks -----------------------------------------------------------------

BROKEN_SCHEMAS = {
    "fields not a list": ({"a": 1}, "'fields' must be a list"),
    "fields a number": (5, "'fields' must be a list"),
    "a field not an object": (["d"], "'fields' must be a list of objects"),
    "a field without a type": ([{"field": "d"}], "must be strings"),
    "a type that is a list": ([{"field": "d", "type": ["string"]}], "must be strings"),
    "a name that is a list": ([{"field": "d", "type": "string", "name": ["x"]}], "must be strings"),
    "parameters not an object": (
        [{"field": "d", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": [1]}],
        "'parameters' must be an object",
    ),
    "scale not an integer": (connect_decimal(scale="abc"), "'scale' must be an integer"),
    "scale a float": (connect_decimal(scale=2.5), "'scale' must be an integer"),
    "scale with a control character": (connect_decimal(scale="2\x1c"), "'scale' must be an integer"),
    "scale in superscript digits": (connect_decimal(scale="²"), "'scale' must be an integer"),
    "precision over 4,300 digits": (
        connect_decimal(connect_decimal_precision="9" * 5000),
        "must be an integer",
    ),
    "optional not a boolean": ([{"field": "d", "type": "string", "optional": [1]}], "'optional' must be"),
    "items not an object": ([{"field": "d", "type": "array", "items": 3}], "has no 'items'"),
    "a field twice": ([{"field": "d", "type": "string"}, {"field": "d", "type": "int32"}], "two fields"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_SCHEMAS))
def test_a_malformed_connect_schema_is_a_dead_letter_naming_the_schema(case: str) -> None:
    fields, expected = BROKEN_SCHEMAS[case]
    d = decoder("debezium-json", None, schema_include="true")
    field, reason = dead_letter(d, schema_envelope(fields, {"d": "1"}))
    assert field == "schema"
    assert expected in reason


def test_a_malformed_envelope_schema_and_deep_nesting_are_dead_letters() -> None:
    d = decoder("debezium-json", None, schema_include="true")
    field, reason = dead_letter(
        d, {"schema": {"type": "struct", "fields": "x"}, "payload": {"op": "c", "after": {}}}
    )
    assert field == "schema" and "'fields' must be a list" in reason
    deep = b'{"type":"array","items":' * 200 + b'{"type":"string"}' + b"}" * 200
    envelope = (
        b'{"schema":{"type":"struct","fields":[{"field":"after","type":"struct","fields":[{"field":"d",'
    )
    envelope += b'"type":"array","items":' + deep + b'}]}]},"payload":{"op":"c","after":{"d":[]}}}'
    field, reason = dead_letter(d, envelope)
    assert field == "schema" and "nests deeper than 64 levels" in reason


def test_a_malformed_connect_map_value_is_a_dead_letter() -> None:
    d = decoder("debezium-json", None, schema_include="true")
    map_field = [{"field": "d", "type": "map", "keys": {"type": "int32"}, "values": {"type": "int32"}}]
    field, reason = dead_letter(d, schema_envelope(map_field, {"d": [1, 2]}))
    assert field == "after.d" and "[key, value] pairs" in reason
    field, reason = dead_letter(d, schema_envelope(map_field, {"d": [[1, "x"]]}))
    assert field == "after.d[0]" and "INT" in reason


# --- 6. integer text over Python's 4,300-digit limit ----------------------------------------------------


def test_integer_text_over_4300_digits_is_a_dead_letter() -> None:
    field, reason = dead_letter(decoder("debezium-json"), {"op": "c", "after": {"id": 1, "b": "9" * 5000}})
    assert field == "after.b" and "too long to be a BIGINT" in reason
    field, reason = dead_letter(
        decoder("canal-json"), {"type": "INSERT", "data": [{"id": "9" * 5000}], "isDdl": False}
    )
    assert field == "data[0].id" and "too long to be a INT" in reason


# --- FAIL mode: the same failures carry coordinates -----------------------------------------------------


def test_fail_mode_raises_a_decode_error_with_coordinates_and_field() -> None:
    d = resolve_format("debezium-json").create_decoder({}, parse_ddl(COLUMNS))
    message = Message(orjson.dumps({"op": ["c"], "after": {"id": 1}}), topic="orders", partition=2, offset=41)
    with pytest.raises(DecodeError, match=r"topic 'orders' partition 2 offset 41, field 'op'") as caught:
        d.decode_all([message])
    assert caught.value.value == message.value
    message = Message(
        orjson.dumps({"op": "c", "after": {"id": 1, "s": _vsd(1, 10**9)}}), topic="orders", offset=42
    )
    with pytest.raises(DecodeError, match=r"offset 42, field 'after.s': the decimal's scale"):
        d.decode_all([message])


def test_canal_mysql_types_nested_deeply_are_a_dead_letter() -> None:
    nested = b"[" * 300 + b"]" * 300
    message = b'{"type":"INSERT","isDdl":false,"data":[{"id":"1"}],"mysqlType":{"id":%s}}' % nested
    field, reason = dead_letter(decoder("canal-json", None), message)
    assert field == "mysqlType" and "must be text" in reason


def test_canal_mysql_type_lengths_of_thousands_of_digits_are_read_as_huge() -> None:
    # int() refuses over 4,300 digits: such a length must not fail the record as a cdcflow bug.
    types = {"id": "int(11)", "d": "decimal(" + "9" * 5000 + ",2)", "v": "varchar(" + "9" * 5000 + ")"}
    message = {
        "type": "INSERT",
        "isDdl": False,
        "data": [{"id": "1", "d": "1.5", "v": "x"}],
        "mysqlType": types,
    }
    out = decoder("canal-json", None).decode_all(
        [Message(orjson.dumps(message), topic="t", partition=0, offset=5)]
    )
    assert out.dead_letters == [] and [change.row for change in out.changes] == [
        {"id": 1, "d": "1.5", "v": "x"}
    ]


def test_an_avro_decimal_scale_that_is_no_ascii_integer_is_an_option_error() -> None:
    from avro_events import ENVELOPE_TEXT

    from cdcflow.formats.errors import FormatOptionError

    broken = ENVELOPE_TEXT.replace('"scale": "2"', '"scale": "2\\u001c"', 1)
    assert broken != ENVELOPE_TEXT
    with pytest.raises(FormatOptionError, match="field 'price': the decimal's scale must be an integer"):
        resolve_format("debezium-avro-confluent").create_decoder({"schema": broken})
