"""canal-json decoding: recorded messages, old-image overlay, filters, side outputs, errors, metadata."""

from __future__ import annotations

import datetime as dt
import pickle
from decimal import Decimal
from typing import Any

import orjson
import pytest
from golden_cases import flink_rows, messages

from cdcflow.formats import DecodeError, FormatOptionError, Message, parse_ddl, render_change, resolve_format
from cdcflow.formats.flat_json.canal import CanalJsonDecoder, mysql_type

PRODUCTS = "id INT NOT NULL, name STRING, description STRING, weight FLOAT"
FACTORY = resolve_format("canal-json")
UTC = dt.UTC


def decoder(
    schema: str | None = PRODUCTS, metadata: tuple[str, ...] = (), *, options: dict[str, str] | None = None
) -> CanalJsonDecoder:
    built = FACTORY.create_decoder(options or {}, parse_ddl(schema) if schema else None, metadata)
    assert isinstance(built, CanalJsonDecoder)
    return built


def rendered(decoder: CanalJsonDecoder, items: list[Message]) -> list[str]:
    out = decoder.decode_all(items)
    return [render_change(change, decoder.schema) for change in out.changes]


def canal(kind: str, data: Any, old: Any = None, **extra: Any) -> Message:
    return Message(orjson.dumps({"data": data, "old": old, "type": kind, "isDdl": False, **extra}))


# Flink's changelog of the file, which ours equals: old = [{"description": null}] on 106 is a change from
# NULL, so its -U row has null.
CANAL_DATA = flink_rows("flink-canal-data")


# --- recorded files ---------------------------------------------------------------------------------


def test_flink_canal_data_with_declared_schema_and_ddl_to_side_output() -> None:
    d = decoder()
    out = d.decode_all(messages("flink/canal-data.txt"))
    assert [render_change(c, d.schema) for c in out.changes] == CANAL_DATA
    assert [(e.kind, e.message.line, e.payload["type"]) for e in out.events] == [
        ("schema-change", 10, "CREATE")
    ]
    assert out.metrics.events == 1 and out.metrics.changes == 26


def test_flink_canal_data_without_schema_reads_mysql_type() -> None:
    d = decoder(None)
    assert rendered(d, messages("flink/canal-data.txt")) == CANAL_DATA
    assert d.schema.ddl() == "id INT, name STRING, description STRING, weight FLOAT"


def test_init_message_goes_to_the_init_side_output() -> None:
    d = decoder()
    out = d.decode_all(messages("flink/canal-data-with-init.txt"))
    assert [(e.kind, e.message.line) for e in out.events] == [("init", 1), ("schema-change", 10)]
    assert [render_change(c, d.schema) for c in out.changes] == CANAL_DATA[9:]


def test_database_and_table_include_filter_and_count() -> None:
    d = decoder(options={"canal-json.database.include": "mydb", "canal-json.table.include": "prod.*"})
    out = d.decode_all(messages("flink/canal-data-filter-table.txt"))
    assert [render_change(c, d.schema) for c in out.changes] == CANAL_DATA
    assert out.metrics.filtered == 6 and out.events == []


def test_table_include_is_a_whole_name_match() -> None:
    d = decoder("k1 INT NOT NULL, v0 STRING", options={"table.include": "paimon_[0-9]"})
    out = d.decode_all(
        messages("apache_paimon/kafka/canal/database/include/topic0/canal-data-1.stripped.txt")
    )
    assert [render_change(c, d.schema) for c in out.changes] == ["+I[1, one]", "+I[3, three]"]
    assert out.metrics.filtered == 2
    everything = decoder("k1 INT NOT NULL, v0 STRING", options={"table.include": "paimon"})
    assert (
        everything.decode_all(
            messages("apache_paimon/kafka/canal/database/include/topic0/canal-data-1.stripped.txt")
        ).changes
        == []
    )


def test_unfiltered_mixed_tables_fail_on_the_first_row_of_another_table() -> None:
    # Line 4 is a row of another table, with no 'id': NULL in a NOT NULL column.
    with pytest.raises(DecodeError) as raised:
        decoder().decode_all(messages("flink/canal-data-filter-table.txt"))
    assert "flink/canal-data-filter-table.txt:4, field 'data[0].id': is NULL or missing" in str(raised.value)


def test_unfiltered_mixed_tables_fail_on_the_non_numeric_id() -> None:
    nullable_id = PRODUCTS.replace(" NOT NULL", "")
    with pytest.raises(DecodeError) as raised:
        decoder(nullable_id).decode_all(messages("flink/canal-data-filter-table.txt"))
    assert "flink/canal-data-filter-table.txt:16, field 'data[0].id'" in str(raised.value)
    assert "'A101'" in str(raised.value)


def test_paimon_event_files_binary_is_iso_8859_1_text() -> None:
    schema = "pt INT, _id INT NOT NULL, v1 STRING, v2 BIGINT, v3 DECIMAL(8,3), v4 BINARY, v5 FLOAT"
    d = decoder(schema)
    out = d.decode_all(
        messages("apache_paimon/kafka/canal/table/event/event-insert-update-delete-row.concat.stripped.txt")
    )
    assert [render_change(c, d.schema) for c in out.changes] == [
        "+I[1, 1, one, null, null, null, null]",
        "+I[1, 2, two, null, null, null, null]",
        "+I[2, 4, four, null, null, null, null]",
        "-U[1, 2, two, null, null, null, null]",
        "+U[1, 2, second, null, null, null, null]",
        "-D[1, 1, one, null, null, null, null]",
        "+I[1, 9, nine, 90000000000, 99999.999, [110, 105, 110, 101, 46, 98, 105, 110], 9.9]",
    ]
    assert out.changes[-1].row["v4"] == b"nine.bin"  # Flink fails here: it expects base64


def test_paimon_incomplete_messages_with_declared_schema() -> None:
    d = decoder("k INT NOT NULL, v STRING")
    assert rendered(d, messages("apache_paimon/kafka/canal/table/incomplete/canal-data-1.stripped.txt")) == [
        "+I[1, Hi]",
        "+I[2, Hello]",
    ]
    d = decoder("k INT NOT NULL, v DECIMAL(10,0)")
    assert rendered(d, messages("apache_paimon/kafka/canal/table/incomplete/canal-data-2.stripped.txt")) == [
        "+I[1, 1]"
    ]
    # Without a schema, `decimal` alone is MySQL's DECIMAL(10, 0)
    d = decoder(None)
    assert rendered(d, messages("apache_paimon/kafka/canal/table/incomplete/canal-data-2.stripped.txt")) == [
        "+I[1, 1]"
    ]
    with pytest.raises(DecodeError, match=r"field 'mysqlType'.*declare the schema"):
        decoder(None).decode_all(
            messages("apache_paimon/kafka/canal/table/incomplete/canal-data-1.stripped.txt")
        )


def test_paimon_all_types_without_schema() -> None:
    d = decoder(None)
    out = d.decode_all(messages("apache_paimon/kafka/canal/table/alltype/canal-data.stripped.txt"))
    types = {f.name: f.type.ddl() for f in d.schema}
    assert {k: types[k] for k in ("_tinyint1", "_boolean", "_tinyint_unsigned", "_int_unsigned")} == {
        "_tinyint1": "BOOLEAN",
        "_boolean": "BOOLEAN",
        "_tinyint_unsigned": "SMALLINT",
        "_int_unsigned": "BIGINT",
    }
    assert types["_bigint_unsigned"] == types["_serial"] == "DECIMAL(20, 0)"
    assert types["_fixed"] == "STRING"  # FIXED(40,3) is wider than 38 digits
    assert types["_datetime"] == "TIMESTAMP_NTZ(0)" and types["_timestamp"] == "TIMESTAMP_NTZ"
    assert types["_time"] == "TIME(0)" and types["_point"] == "BINARY" and types["_json"] == "STRING"
    first, second = out.changes[0].row, out.changes[1].row
    assert first["_tinyint1"] is True and first["_bool"] is False
    assert first["_bigint_unsigned"] == Decimal(20000000000)
    assert first["_timestamp"] == dt.datetime(2023, 3, 23, 15, 0, 10, 123456)
    assert first["_datetime_p2"] == dt.datetime(2023, 3, 24, 14, 30, 5, 120000)
    assert first["_time"] == dt.time(10, 13, 23)
    assert first["_point"] == bytes.fromhex(
        "0000000001010000000000000000 00f03f000000000000f03f".replace(" ", "")
    )
    assert first["_json"] == '{"a": "b"}'
    assert second["_serial"] == Decimal(50000000000) and second["_int"] is None


def test_risingwave_bad_int_fails_the_whole_message_naming_the_row() -> None:
    items = messages("risingwavelabs_risingwave/canal_json_double_field.1")
    with pytest.raises(DecodeError) as raised:
        decoder("v1 INT, v2 INT").decode_all(items)
    text = str(raised.value)
    assert "risingwavelabs_risingwave/canal_json_double_field.1:1, field 'data[2].v1'" in text
    assert "expected an integer for INT, got 'a'" in text
    assert "'canal-json.ignore-parse-errors'='true'" in text
    assert raised.value.value == items[0].value


def test_risingwave_bad_int_goes_to_dead_letters_with_its_bytes() -> None:
    items = messages("risingwavelabs_risingwave/canal_json_double_field.1")
    d = decoder("v1 INT, v2 INT", options={"canal-json.ignore-parse-errors": "true"})
    out = d.decode_all(items)
    # none of the first message's rows is written (all-or-nothing); the two others decode
    assert [render_change(c, d.schema) for c in out.changes] == [
        "-U[1, 2]",
        "+U[5, 6]",
        "-U[3, 4]",
        "+U[7, 8]",
        "-D[5, 6]",
        "-D[7, 8]",
    ]
    [dead] = out.dead_letters
    assert dead.message.value == items[0].value and dead.field == "data[2].v1"
    assert out.metrics.dead_letters == 1 and out.metrics.changes == 6


# --- the -U row: data[i] overlaid by old[i] ---------------------------------------------------------


def test_each_row_takes_its_own_old_image() -> None:
    d = decoder("id INT NOT NULL, a STRING, b INT")
    message = canal(
        "UPDATE",
        [{"id": "1", "a": "x2", "b": "10"}, {"id": "2", "a": "y", "b": "21"}],
        [{"a": "x1"}, {"b": "20"}],
    )
    assert rendered(d, [message]) == ["-U[1, x1, 10]", "+U[1, x2, 10]", "-U[2, y, 20]", "+U[2, y, 21]"]


def test_a_null_in_old_is_a_change_from_null() -> None:
    d = decoder("id INT NOT NULL, a STRING, b INT")
    message = canal("UPDATE", [{"id": "1", "a": "now", "b": "5"}], [{"a": None, "unknown": "ignored"}])
    assert rendered(d, [message]) == ["-U[1, null, 5]", "+U[1, now, 5]"]


def test_bad_value_in_old_names_its_path() -> None:
    message = canal("UPDATE", [{"id": "1", "a": "x", "b": "5"}], [{"b": "five"}])
    with pytest.raises(DecodeError, match=r"field 'old\[0\]\.b': expected an integer"):
        decoder("id INT NOT NULL, a STRING, b INT").decode_all([message])


@pytest.mark.parametrize(
    ("old", "found"),
    [(None, "old = None"), ([{"a": "1"}, {"a": "2"}], "2 old images"), ([], "0 old images")],
)
def test_update_needs_one_old_image_per_row(old: Any, found: str) -> None:
    message = canal("UPDATE", [{"id": "1", "a": "x"}], old)
    with pytest.raises(
        DecodeError, match=rf"field 'old': an UPDATE needs one old image per data row \(1\), found {found}"
    ):
        decoder("id INT NOT NULL, a STRING").decode_all([message])


# --- other message shapes and errors ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ALTER", "ERASE", "RENAME", "QUERY", "CINDEX"])
def test_ddl_types_are_schema_changes(kind: str) -> None:
    message = Message(orjson.dumps({"data": None, "type": kind, "sql": "...", "database": "d", "table": "t"}))
    out = decoder().decode_all([message])
    assert [e.kind for e in out.events] == ["schema-change"] and out.changes == []
    assert out.events[0].payload["sql"] == "..."


def test_truncate_ddl_is_a_truncate_event_with_its_metadata() -> None:
    """A TRUNCATE empties the table: it is a ``truncate`` control event (which ingest applies), not a
    schema change; the requested metadata columns are read from it as from a row change."""
    message = Message(
        orjson.dumps(
            {
                "data": None,
                "type": "TRUNCATE",
                "isDdl": True,
                "sql": "TRUNCATE TABLE t",
                "database": "d",
                "table": "t",
                "es": 1700000000000,
            }
        )
    )
    out = (
        resolve_format("canal-json")
        .create_decoder({}, parse_ddl("id INT NOT NULL"), ["database", "table", "event-timestamp"])
        .decode_all([message])
    )
    assert [e.kind for e in out.events] == ["truncate"] and out.changes == []
    assert out.events[0].metadata == {
        "database": "d",
        "table": "t",
        "event_timestamp": dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC),
    }


def test_is_ddl_flag_wins_over_the_type() -> None:
    message = Message(orjson.dumps({"data": None, "type": "INSERT", "isDdl": True, "sql": "create"}))
    assert [e.kind for e in decoder().decode_all([message]).events] == ["schema-change"]


def test_unknown_type_lists_the_known_ones() -> None:
    with pytest.raises(
        DecodeError, match=r"field 'type': unknown Canal message type 'UPSERT': expected one of"
    ):
        decoder().decode_all([canal("UPSERT", [{"id": "1"}])])


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (b"[1, 2]", "a Canal message must be a JSON object, got list"),
        (b"{not json", "not valid JSON"),
        (
            orjson.dumps({"type": "INSERT", "data": None}),
            "field 'data': a Canal INSERT message needs a 'data' array",
        ),
        (
            orjson.dumps({"type": "INSERT", "data": [1]}),
            r"field 'data\[0\]': a row image must be a JSON object",
        ),
    ],
)
def test_malformed_messages(value: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        decoder().decode_all([Message(value, topic="t", partition=0, offset=7)])


def test_tombstones_are_skipped_and_counted() -> None:
    out = decoder().decode_all([Message(None), Message(b"")])
    assert out.metrics.tombstones == 2 and out.changes == []


def test_boolean_binary_and_nested_values_as_canal_writes_them() -> None:
    d = decoder("flag BOOLEAN, raw BINARY, tags ARRAY<INT>, attrs MAP<STRING, STRING>")
    data = [{"flag": "1", "raw": "\u00ff\u0000A", "tags": "[1, 2]", "attrs": '{"k": "v"}'}]
    [change] = d.decode_all([canal("INSERT", data)]).changes
    assert change.row == {"flag": True, "raw": b"\xff\x00A", "tags": [1, 2], "attrs": {"k": "v"}}
    with pytest.raises(DecodeError, match=r"field 'data\[0\]\.raw': expected binary data as ISO-8859-1 text"):
        d.decode_all([canal("INSERT", [{"raw": "\u20ac"}])])
    with pytest.raises(DecodeError, match=r"field 'data\[0\]\.tags': expected JSON text for ARRAY<INT>"):
        d.decode_all([canal("INSERT", [{"tags": "[1,"}])])


# --- metadata ---------------------------------------------------------------------------------------


def test_metadata_columns() -> None:
    keys = (
        "database",
        "table",
        "sql-type",
        "pk-names",
        "ingestion-timestamp",
        "event-timestamp",
        "mysql-type",
    )
    d = decoder(metadata=keys)
    out = d.decode_all(messages("flink/canal-data.txt")[1:2])
    assert [f.name for f in d.schema][4:] == [
        "database",
        "table",
        "sql_type",
        "pk_names",
        "ingestion_timestamp",
        "event_timestamp",
        "mysql_type",
    ]
    row = out.changes[0].row
    assert row["database"] == "inventory" and row["table"] == "products2"
    assert row["sql_type"] == {"id": 4, "name": 12, "description": 12, "weight": 7}
    assert row["pk_names"] == ["id"]
    assert row["ingestion_timestamp"] == dt.datetime(2020, 5, 13, 12, 39, 6, 301000, tzinfo=UTC)
    assert row["event_timestamp"] == dt.datetime(2020, 5, 13, 12, 39, 6, tzinfo=UTC)
    assert row["mysql_type"]["weight"] == "FLOAT"
    assert out.changes[0].row is not out.changes[1].row
    assert render_change(out.changes[0], d.schema).endswith(
        "inventory, products2, {id=4, name=12, description=12, weight=7}, [id], 2020-05-13T12:39:06.301Z, "
        "2020-05-13T12:39:06Z, {id=INTEGER, name=VARCHAR(255), description=VARCHAR(512), weight=FLOAT}]"
    )


def test_metadata_errors() -> None:
    with pytest.raises(
        FormatOptionError, match="format 'canal-json' has no metadata column 'op'; available: database"
    ):
        decoder(metadata=("op",))
    with pytest.raises(FormatOptionError, match="metadata column 'table' .* clashes"):
        decoder("id INT, table STRING", metadata=("table",))
    message = canal("INSERT", [{"id": "1"}], ts="soon")
    with pytest.raises(DecodeError, match="field 'ts': expected epoch milliseconds"):
        decoder(metadata=("ingestion-timestamp",)).decode_all([message])


# --- options and factory ----------------------------------------------------------------------------


def test_unknown_option_lists_the_supported_ones() -> None:
    with pytest.raises(FormatOptionError) as raised:
        decoder(options={"canal-json.database": "x"})
    text = str(raised.value)
    assert "Unsupported options for format 'canal-json': canal-json.database" in text
    for key in (
        "canal-json.ignore-parse-errors",
        "canal-json.timestamp-format.standard",
        "canal-json.database.include",
        "canal-json.table.include",
        "canal-json.map-null-key.mode",
        "canal-json.map-null-key.literal",
        "canal-json.encode.decimal-as-plain-number",
        "canal-json.encode.ignore-null-fields",
    ):
        assert key in text


def test_bad_regex_fails_before_any_record() -> None:
    with pytest.raises(
        FormatOptionError, match=r"option 'canal-json.table.include': '\[' is not a valid regular"
    ):
        decoder(options={"canal-json.table.include": "["})


def test_flink_options_are_accepted() -> None:
    decoder(
        options={
            "canal-json.encode.decimal-as-plain-number": "true",
            "canal-json.timestamp-format.standard": "ISO-8601",
            "canal-json.map-null-key.mode": "LITERAL",
            "canal-json.map-null-key.literal": "nil",
        }
    )


def test_decoder_pickles_with_its_compiled_filters() -> None:
    d = decoder(options={"canal-json.table.include": "prod.*"})
    copy = pickle.loads(pickle.dumps(d))  # noqa: S301 - our own bytes
    assert rendered(copy, messages("flink/canal-data-filter-table.txt")[:2]) == CANAL_DATA[:11]


@pytest.mark.parametrize(
    ("text", "ddl"),
    [
        ("int(11)", "INT"),
        ("INTEGER", "INT"),
        ("INT unsigned", "BIGINT"),
        ("TINYINT(1)", "BOOLEAN"),
        ("tinyint(1) unsigned", "SMALLINT"),
        ("TINYINT(2) unsigned zerofill", "SMALLINT"),
        ("smallint unsigned", "INT"),
        ("MEDIUMINT unsigned", "INT"),
        ("bigint", "BIGINT"),
        ("bigint(20) unsigned", "DECIMAL(20, 0)"),
        ("SERIAL", "DECIMAL(20, 0)"),
        ("decimal(10,2)", "DECIMAL(10, 2)"),
        ("DECIMAL(8, 0) unsigned", "DECIMAL(8, 0)"),
        ("decimal", "DECIMAL(10, 0)"),
        ("decimal(65,30)", "STRING"),
        ("float", "FLOAT"),
        ("REAL(10,7) unsigned zerofill", "DOUBLE"),
        ("DOUBLE PRECISION(10,7)", "DOUBLE"),
        ("varchar(255)", "STRING"),
        ("longtext", "STRING"),
        ("json", "STRING"),
        ("ENUM('a','b(c)')", "STRING"),
        ("date", "DATE"),
        ("datetime", "TIMESTAMP_NTZ(0)"),
        ("datetime(3)", "TIMESTAMP_NTZ(3)"),
        ("timestamp(6)", "TIMESTAMP_NTZ"),
        ("time", "TIME(0)"),
        ("year", "INT"),
        ("bit(1)", "BOOLEAN"),
        ("bit(8)", "BIGINT"),
        ("varbinary(10)", "BINARY"),
        ("geometry", "BINARY"),
        ("something new", "STRING"),
    ],
)
def test_mysql_types(text: str, ddl: str) -> None:
    assert mysql_type(text).ddl() == ddl
