"""upsert-kafka: key + value → +U, tombstone → key-only -D; key prefix, EXCEPT_KEY, errors, options,
encoder bytes and the decode(encode(x)) property."""

from __future__ import annotations

import datetime as dt
import pickle
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import (
    DecodeError,
    EncodeError,
    FormatOptionError,
    Message,
    parse_ddl,
    render_change,
    resolve_format,
)
from cdcflow.formats.upsert_kafka import UpsertKafkaDecoder, UpsertKafkaEncoder

FACTORY = resolve_format("upsert-kafka")
PAGEVIEWS = "user_region STRING NOT NULL, pv BIGINT, uv BIGINT"
PREFIXED = "k_region STRING NOT NULL, k_day DATE NOT NULL, region STRING, pv BIGINT"
PREFIX_OPTIONS = {
    "key.fields": "k_region, k_day",
    "key.fields-prefix": "k_",
    "value.fields-include": "EXCEPT_KEY",
}


def decoder(schema: str = PAGEVIEWS, **options: str) -> UpsertKafkaDecoder:
    built = FACTORY.create_decoder({"key.fields": "user_region", **options}, parse_ddl(schema))
    assert isinstance(built, UpsertKafkaDecoder)
    return built


def rendered(decoding: UpsertKafkaDecoder, messages: list[Message]) -> list[str]:
    return [render_change(change, decoding.schema) for change in decoding.decode_all(messages).changes]


def record(key: bytes | None, value: bytes | None, offset: int = 0) -> Message:
    return Message(value, key=key, topic="pageviews", partition=1, offset=offset)


# Decoding ---------------------------------------------------------------------------------------------


def test_values_are_upserts_and_tombstones_delete_the_key() -> None:
    messages = [
        record(b'{"user_region":"eu"}', b'{"user_region":"eu","pv":10,"uv":3}'),
        record(b'{"user_region":"us"}', b'{"user_region":"us","pv":1,"uv":1}'),
        record(b'{"user_region":"eu"}', b'{"user_region":"eu","pv":12,"uv":4}'),
        record(b'{"user_region":"eu"}', None),
        record(b'{"user_region":"us"}', b""),
    ]
    out = decoder().decode_all(messages)
    assert [render_change(c, parse_ddl(PAGEVIEWS)) for c in out.changes] == [
        "+U[eu, 10, 3]",
        "+U[us, 1, 1]",
        "+U[eu, 12, 4]",
        "-D[eu, null, null]",
        "-D[us, null, null]",
    ]
    assert out.metrics.tombstones == 0 and out.metrics.changes == 5


def test_except_key_with_a_key_prefix() -> None:
    decoding = decoder(PREFIXED, **PREFIX_OPTIONS)
    messages = [
        record(b'{"region":"eu","day":"2024-01-02"}', b'{"region":"Europe","pv":7}'),
        record(b'{"region":"eu","day":"2024-01-02"}', None),
    ]
    out = decoding.decode_all(messages)
    assert [render_change(c, decoding.schema) for c in out.changes] == [
        "+U[eu, 2024-01-02, Europe, 7]",
        "-D[eu, 2024-01-02, null, null]",
    ]
    assert out.changes[1].row == {"k_region": "eu", "k_day": dt.date(2024, 1, 2), "region": None, "pv": None}


def test_with_all_the_values_copy_of_a_key_column_wins_and_no_key_reads_it_from_the_value() -> None:
    messages = [
        record(b'{"user_region":"key-side"}', b'{"user_region":"value-side","pv":1,"uv":1}'),
        record(None, b'{"user_region":"eu","pv":2,"uv":2}'),
    ]
    assert rendered(decoder(), messages) == ["+U[value-side, 1, 1]", "+U[eu, 2, 2]"]


def test_composite_key_order_follows_key_fields() -> None:
    decoding = decoder(
        "a INT, b STRING, v STRING", **{"key.fields": "b, a", "value.fields-include": "except_key"}
    )
    assert rendered(decoding, [record(b'{"b":"x","a":1}', b'{"v":"y"}')]) == ["+U[1, x, y]"]


# Errors -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "options", "expected"),
    [
        (None, None, {}, "field 'key': a tombstone (null value) deletes its key, but the message has no key"),
        (
            None,
            b'{"region":"Europe","pv":7}',
            PREFIX_OPTIONS,
            "field 'key': the message has no key, and with 'value.fields-include'='EXCEPT_KEY' the key "
            "columns ['k_region', 'k_day'] are only there",
        ),
        (b"{nope", None, {}, "field 'key': not valid JSON"),
        (b'"eu"', None, {}, "field 'key': the key must be a JSON object, got str"),
        (b'{"region":"eu"}', None, PREFIX_OPTIONS, "field 'key.day': a key column is missing or null"),
        (b'{"region":"eu","day":"soon"}', None, PREFIX_OPTIONS, "field 'key.day': expected"),
        (b'{"user_region":"eu"}', b'{"pv":"many"}', {}, "field 'value.pv': expected an integer for BIGINT"),
        (b'{"user_region":"eu"}', b"[1]", {}, "the value must be a JSON object, got list"),
        (b'{"user_region":"eu"}', b"{x", {}, "not valid JSON"),
        (None, b'{"pv":1}', {}, "field 'value.user_region': a key column is missing or null"),
    ],
    ids=[
        "keyless-tombstone",
        "keyless-except-key",
        "key-not-json",
        "key-not-object",
        "key-column-missing",
        "key-bad-date",
        "value-bad-bigint",
        "value-not-object",
        "value-not-json",
        "keyless-value-without-key-column",
    ],
)
def test_errors_name_coordinates_and_field(
    key: bytes | None, value: bytes | None, options: dict[str, str], expected: str
) -> None:
    schema = PREFIXED if options else PAGEVIEWS
    with pytest.raises(DecodeError) as raised:
        decoder(schema, **options).decode_all([record(key, value, offset=41)])
    text = str(raised.value)
    assert text.startswith("upsert-kafka: cannot decode topic 'pageviews' partition 1 offset 41")
    assert expected in text
    assert "'upsert-kafka.ignore-parse-errors'='true'" in text


def test_ignore_parse_errors_dead_letters_key_and_value_bytes() -> None:
    bad = record(b'{"user_region":"eu"}', b'{"pv":"many"}', offset=3)
    good = record(b'{"user_region":"eu"}', None, offset=4)
    out = decoder(**{"ignore-parse-errors": "true"}).decode_all([bad, good])
    assert [str(c) for c in out.changes] == ["-D[eu, null, null]"]
    (letter,) = out.dead_letters
    assert (letter.field, letter.message.key, letter.message.value) == ("value.pv", bad.key, bad.value)
    assert out.metrics.dead_letters == 1


# Options --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {},
            "format 'upsert-kafka' needs the primary key, which makes the Kafka key: set "
            "'upsert-kafka.key.fields'",
        ),
        ({"key.fields": "id"}, "'id' is not a column of the schema (['user_region', 'pv', 'uv'])"),
        ({"key.fields": "user_region, user_region"}, "lists a column twice"),
        (
            {"key.fields": "user_region", "key.fields-prefix": "user_"},
            "needs 'upsert-kafka.value.fields-include'='EXCEPT_KEY'",
        ),
        (
            {"key.fields": "pv", "key.fields-prefix": "k_", "value.fields-include": "EXCEPT_KEY"},
            "'pv' does not start with the key prefix 'k_'",
        ),
        (
            {"key.fields": "pv", "value.format": "avro"},
            "option 'upsert-kafka.value.format': 'avro' is not one of json",
        ),
        ({"key.fields": "pv", "value.fields-include": "some"}, "'some' is not one of ALL, EXCEPT_KEY"),
        ({"key.fields": "pv", "key.json.ignore-parse-errors": "true"}, "Unsupported options for format"),
    ],
)
def test_options_are_checked_before_any_record(options: dict[str, str], message: str) -> None:
    with pytest.raises(FormatOptionError) as raised:
        FACTORY.create_decoder(options, parse_ddl(PAGEVIEWS))
    assert message in str(raised.value)


def test_prefixed_options_metadata_and_schema() -> None:
    assert FACTORY.create_decoder(
        {"upsert-kafka.key.fields": "pv"}, parse_ddl(PAGEVIEWS)
    ).schema == parse_ddl(PAGEVIEWS)
    with pytest.raises(FormatOptionError, match="needs the table schema"):
        FACTORY.create_decoder({"key.fields": "pv"}, None)
    with pytest.raises(FormatOptionError, match="no metadata columns"):
        FACTORY.create_decoder({"key.fields": "pv"}, parse_ddl(PAGEVIEWS), ["offset"])
    with pytest.raises(FormatOptionError, match="differ from 'upsert-kafka.key.fields'"):
        FACTORY.create_encoder({"key.fields": "pv"}, parse_ddl(PAGEVIEWS), ["user_region"])


def test_decoder_pickles() -> None:
    original = decoder(PREFIXED, **PREFIX_OPTIONS)
    copy = pickle.loads(pickle.dumps(original))  # noqa: S301 - our own bytes
    assert copy.config == original.config
    message = record(b'{"region":"eu","day":"2024-01-02"}', None)
    assert rendered(copy, [message]) == rendered(original, [message])


# Encoding -------------------------------------------------------------------------------------------------

ORDERS = "id INT NOT NULL, item STRING, price DECIMAL(10, 2), at TIMESTAMP_LTZ(3)"
O1 = {
    "id": 1,
    "item": "pen",
    "price": Decimal("2.50"),
    "at": dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=dt.UTC),
}


@pytest.mark.parametrize(
    ("schema", "options", "change", "expected"),
    [
        (
            ORDERS,
            {"key.fields": "id"},
            Change(RowKind.INSERT, O1),
            [(b'{"id":1}', b'{"id":1,"item":"pen","price":2.50,"at":"2024-05-06 07:08:09.123Z"}')],
        ),
        (
            ORDERS,
            {
                "key.fields": "id",
                "value.fields-include": "EXCEPT_KEY",
                "timestamp-format.standard": "ISO-8601",
            },
            Change(RowKind.UPDATE_AFTER, O1),
            [(b'{"id":1}', b'{"item":"pen","price":2.50,"at":"2024-05-06T07:08:09.123Z"}')],
        ),
        (ORDERS, {"key.fields": "id"}, Change(RowKind.DELETE, O1), [(b'{"id":1}', None)]),
        (ORDERS, {"key.fields": "id"}, Change(RowKind.UPDATE_BEFORE, O1), []),
        (
            PREFIXED,
            PREFIX_OPTIONS,
            Change(
                RowKind.UPDATE_AFTER, {"k_region": "eu", "k_day": dt.date(2024, 1, 2), "region": "E", "pv": 7}
            ),
            [(b'{"region":"eu","day":"2024-01-02"}', b'{"region":"E","pv":7}')],
        ),
    ],
    ids=["insert", "update-except-key-iso", "delete-is-a-tombstone", "update-before-dropped", "key-prefix"],
)
def test_encoder_exact_bytes(
    schema: str, options: dict[str, str], change: Change, expected: list[tuple[bytes, bytes | None]]
) -> None:
    encoding = FACTORY.create_encoder(options, parse_ddl(schema))
    assert [(e.key, e.value) for e in encoding.encode_all([change])] == expected


def test_encoder_counts_dropped_update_before_and_refuses_null_keys() -> None:
    encoding = FACTORY.create_encoder({}, parse_ddl(ORDERS), ["id"])
    assert isinstance(encoding, UpsertKafkaEncoder)
    encoding.encode_all([Change(RowKind.UPDATE_BEFORE, O1), Change(RowKind.UPDATE_AFTER, O1)])
    assert encoding.dropped_update_before == 1
    with pytest.raises(EncodeError, match="the key column 'id' is NULL in -D"):
        encoding.encode(Change(RowKind.DELETE, {**O1, "id": None}))


# Round trip -------------------------------------------------------------------------------------------------

ROUND_SCHEMA = "k_id INT NOT NULL, name STRING, score DOUBLE, ok BOOLEAN, amount DECIMAL(8, 3)"
VALUE_COLUMNS = ("name", "score", "ok", "amount")
ROWS = st.fixed_dictionaries(
    {
        "k_id": st.integers(min_value=-(2**31), max_value=2**31 - 1),
        "name": st.one_of(st.none(), st.text(max_size=8)),
        "score": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
        "ok": st.one_of(st.none(), st.booleans()),
        "amount": st.one_of(
            st.none(), st.decimals(places=3, min_value=-99999, max_value=99999, allow_nan=False)
        ),
    }
)
CHANGES = st.lists(
    st.builds(Change, st.sampled_from(list(RowKind)), ROWS),
    max_size=20,
)


def expected_upsert(changes: list[Change]) -> list[Change]:
    """What an upsert topic keeps: +I/+U → +U, -U gone, -D → the key alone."""
    out = []
    for change in changes:
        if change.kind is RowKind.DELETE:
            out.append(Change(RowKind.DELETE, {**change.row, **dict.fromkeys(VALUE_COLUMNS)}))
        elif change.kind is not RowKind.UPDATE_BEFORE:
            out.append(Change(RowKind.UPDATE_AFTER, change.row))
    return out


@settings(max_examples=100, deadline=None)
@given(CHANGES, st.sampled_from([{"key.fields": "k_id"}, {**PREFIX_OPTIONS, "key.fields": "k_id"}]))
def test_round_trip(changes: list[Change], options: dict[str, str]) -> None:
    """decode(encode(x)) == expected_upsert(x) for any changelog; so decode(encode(x)) == x exactly when x
    holds only +U rows and key-only -D rows."""
    encoded = FACTORY.create_encoder(options, parse_ddl(ROUND_SCHEMA)).encode_all(changes)
    decoding = FACTORY.create_decoder(options, parse_ddl(ROUND_SCHEMA))
    decoded = decoding.decode_all([Message(e.value, key=e.key) for e in encoded]).changes
    expected = expected_upsert(changes)
    assert decoded == expected
    encoded_again = FACTORY.create_encoder(options, parse_ddl(ROUND_SCHEMA)).encode_all(expected)
    assert decoding.decode_all([Message(e.value, key=e.key) for e in encoded_again]).changes == expected


def test_a_value_without_its_key_columns_takes_them_from_the_key_and_nulls_in_not_null_columns_fail() -> None:
    # Spark fails the whole query on a NULL in a NOT NULL column (found by the sources' fuzz).
    decoding = decoder("user_region STRING NOT NULL, pv BIGINT NOT NULL", **{"ignore-parse-errors": "true"})
    out = decoding.decode_all(
        [
            record(b'{"user_region":"eu"}', b'{"pv":7}', offset=0),
            record(b'{"user_region":"eu"}', b"{}", offset=1),
        ]
    )
    assert [render_change(change, decoding.schema) for change in out.changes] == ["+U[eu, 7]"]
    assert [(letter.message.offset, letter.field) for letter in out.dead_letters] == [(1, "value.pv")]
