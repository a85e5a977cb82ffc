"""Spark DDL schemas, option declarations and the format registry."""

from __future__ import annotations

import re
from enum import Enum
from importlib.metadata import EntryPoint
from typing import Any

import pytest

from cdcflow.formats import (
    FormatOptionError,
    SchemaError,
    TypeKind,
    UnknownFormatError,
    available_formats,
    parse_ddl,
    resolve_format,
)
from cdcflow.formats import registry as registry_module
from cdcflow.formats.options import Option, OptionSet, boolean, choice, regex


def test_ddl_reads_spark_and_flink_spellings() -> None:
    schema = parse_ddl(
        "id INT NOT NULL, `weird name` STRING, price DECIMAL(10, 2), n NUMERIC, at TIMESTAMP, "
        "local TIMESTAMP_NTZ, flink_ts TIMESTAMP(3), ltz TIMESTAMP_LTZ(6), t TIME(3), b BYTES, "
        "v VARCHAR(20), tags ARRAY<STRING>, attrs MAP<STRING, BIGINT>, "
        "address STRUCT<street: STRING, zip INT NOT NULL> COMMENT 'where', r ROW<a DOUBLE>"
    )
    kinds = [(f.name, f.type.kind, f.type.precision, f.type.scale, f.nullable) for f in schema]
    assert kinds[:11] == [
        ("id", TypeKind.INT, None, None, False),
        ("weird name", TypeKind.STRING, None, None, True),
        ("price", TypeKind.DECIMAL, 10, 2, True),
        ("n", TypeKind.DECIMAL, 10, 0, True),
        ("at", TypeKind.TIMESTAMP_LTZ, 6, None, True),
        ("local", TypeKind.TIMESTAMP_NTZ, 6, None, True),
        ("flink_ts", TypeKind.TIMESTAMP_NTZ, 3, None, True),
        ("ltz", TypeKind.TIMESTAMP_LTZ, 6, None, True),
        ("t", TypeKind.TIME, 3, None, True),
        ("b", TypeKind.BINARY, None, None, True),
        ("v", TypeKind.STRING, None, None, True),
    ]
    assert schema.ddl().endswith(
        "tags ARRAY<STRING>, attrs MAP<STRING, BIGINT>, address STRUCT<street: STRING, zip: INT NOT NULL>, "
        "r STRUCT<a: DOUBLE>"
    )
    assert parse_ddl(schema.ddl()) == schema


@pytest.mark.parametrize(
    ("ddl", "message"),
    [
        ("", "the schema is empty"),
        ("id INTEGR", "unknown type 'INTEGR'"),
        ("id INT,", "unexpected end of the schema"),
        ("id DECIMAL(40, 2)", "DECIMAL takes (precision, scale)"),
        ("a INT, a STRING", "column 'a' is declared twice"),
        ("id INT NOT", "unexpected end"),
        ("tags ARRAY<INT", "unexpected end"),
        ("t TIME(12)", "a time precision is one number from 0 to 9"),
    ],
)
def test_ddl_errors_say_where_and_how(ddl: str, message: str) -> None:
    with pytest.raises(SchemaError, match=re.escape(message)):
        parse_ddl(ddl)


class Color(Enum):
    RED = "RED"
    LIGHT_BLUE = "LIGHT-BLUE"


OPTIONS = OptionSet(
    "demo-json",
    [
        Option("flag", boolean, False, "a flag"),
        Option("color", choice(Color), Color.RED, "a color"),
        Option("pattern", regex, None, "a regex"),
    ],
)


def test_options_accept_the_prefix_or_not_and_any_case() -> None:
    values: dict[str, Any] = OPTIONS.parse(
        {"demo-json.FLAG": "TRUE", "color": "light_blue", "pattern": "^a.*"}
    )
    assert values["flag"] is True and values["color"] is Color.LIGHT_BLUE
    assert values["pattern"].fullmatch("abc")
    assert OPTIONS.parse({}) == {"flag": False, "color": Color.RED, "pattern": None}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"flag": "ture"}, "option 'demo-json.flag': 'ture' is not a boolean: write true or false"),
        ({"color": "green"}, "'green' is not one of RED, LIGHT-BLUE"),
        ({"pattern": "["}, "'[' is not a valid regular expression"),
        (
            {"other-json.flag": "true", "colour": "RED"},
            "Unsupported options for format 'demo-json': colour, other-json.flag. Supported options: "
            "demo-json.flag, demo-json.color, demo-json.pattern",
        ),
    ],
)
def test_bad_options_fail_listing_what_is_valid(raw: dict[str, str], message: str) -> None:
    with pytest.raises(FormatOptionError, match=re.escape(message)):
        OPTIONS.parse(raw)


def test_registry_knows_the_builtin_formats() -> None:
    assert available_formats()[:8] == [
        "debezium-json",
        "debezium-avro-confluent",
        "canal-json",
        "maxwell-json",
        "ogg-json",
        "generic",
        "upsert-kafka",
        "debezium-json-registry",
    ]
    for name in available_formats():
        assert resolve_format(name).name == name
    with pytest.raises(UnknownFormatError, match="unknown format 'protobuf'; available: debezium-json"):
        resolve_format("protobuf")


def test_third_party_formats_plug_in_through_the_entry_point_group(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = EntryPoint("shouty-json", "cdcflow.formats.op_rows:GenericFormat", "cdcflow.formats")
    broken = EntryPoint("not-a-format", "json:loads", "cdcflow.formats")

    def fake_entry_points(*, group: str) -> list[EntryPoint]:
        return [plugin, broken] if group == "cdcflow.formats" else []

    monkeypatch.setattr(registry_module, "entry_points", fake_entry_points)
    assert "shouty-json" in available_formats()
    assert resolve_format("shouty-json").name == "generic"
    with pytest.raises(UnknownFormatError, match="is not a FormatFactory"):
        resolve_format("not-a-format")
