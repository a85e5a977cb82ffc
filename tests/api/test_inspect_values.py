"""``cdcflow inspect`` (in-process, through ``cdcflow.cli.main``) on values that do not fit their declared
type and on messages that broke the decoders (issue 27): each such message is one dead letter with its
reason, never a wrong row, never an internal error; and rows are printed with their own message's types."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from cdcflow.cli import main
from cdcflow.connectors.replay.dumps import write_dump
from cdcflow.formats import Message

sys.path.insert(0, str(Path(__file__).parents[1] / "formats"))  # the registry test's writer schema

NO_INTERNAL_ERRORS = "dead letters (0 internal errors)"


def inspect(
    capsys: pytest.CaptureFixture[str], path: Path, fmt: str, *flags: str
) -> tuple[list[str], list[str]]:
    """stdout's rows and stderr's lines of ``cdcflow inspect --format fmt --path path flags``, bad records
    printed as dead letters."""
    dead_letters = ["--option", f"{fmt}.ignore-parse-errors=true"]
    assert main(["inspect", "--format", fmt, "--path", str(path), *dead_letters, *flags]) == 0
    captured = capsys.readouterr()
    return captured.out.splitlines(), captured.err.splitlines()


def lines(path: Path, *records: Any) -> Path:
    path.write_text("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))
    return path


def test_a_float_beyond_float_or_in_other_digits_is_a_dead_letter_not_infinity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = [{"op": "c", "after": {"id": n, "w": w}} for n, w in enumerate([1e39, "１", 2.5, "-3.5e38"], 1)]
    rows, err = inspect(
        capsys, lines(tmp_path / "w.jsonl", *events), "debezium-json", "--schema", "id INT, w FLOAT"
    )
    assert rows == ["+I[3, 2.5]"]
    letters = [line for line in err if line.startswith("cdcflow: dead letter ")]
    file = tmp_path / "w.jsonl"
    assert letters == [
        f"cdcflow: dead letter {file}:1, field 'after.w': 1e+39 is out of range for FLOAT",
        f"cdcflow: dead letter {file}:2, field 'after.w': expected a number, got '１'",
        f"cdcflow: dead letter {file}:4, field 'after.w': '-3.5e38' is out of range for FLOAT",
    ]
    assert "4 messages, 1 changes" in err[-1] and f"3 {NO_INTERNAL_ERRORS}" in err[-1]


@pytest.mark.parametrize(
    ("fmt", "record"),
    [
        ("generic", {"op": "c", "id": 1, "d": "1\x1c"}),
        ("generic", {"op": "c", "id": 1, "d": "１２"}),
        (
            "canal-json",
            {"type": "INSERT", "data": [{"id": 1, "d": "\x1f2.5"}], "database": "db", "table": "t"},
        ),
        ("canal-json", {"type": "INSERT", "data": [{"id": "١", "d": "2.5"}], "database": "db", "table": "t"}),
    ],
    ids=["control-character", "full-width", "canal-control-character", "canal-arabic-indic"],
)
def test_numeric_text_in_other_digits_or_with_control_characters_is_a_dead_letter(
    fmt: str, record: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--schema", "id INT, d DOUBLE"]
    if fmt == "generic":
        flags += ["--option", "generic.op-mapping=c=INSERT"]
    rows, err = inspect(capsys, lines(tmp_path / "in.jsonl", record), fmt, *flags)
    assert rows == []
    [letter] = [line for line in err if line.startswith("cdcflow: dead letter ")]
    assert "expected a number" in letter or "expected an integer" in letter
    assert f"1 {NO_INTERNAL_ERRORS}" in err[-1]


def _envelope(row: dict[str, Any], value_schema: dict[str, Any]) -> dict[str, Any]:
    fields = [
        {"type": "int32", "optional": False, "field": "id"},
        {**value_schema, "optional": True, "field": "v"},
    ]
    image = {"type": "struct", "optional": True, "fields": fields}
    schema = {
        "type": "struct",
        "fields": [
            {**image, "field": "before"},
            {**image, "field": "after"},
            {"type": "string", "optional": False, "field": "op"},
        ],
    }
    return {"schema": schema, "payload": {"op": "c", "before": None, "after": row}}


@pytest.mark.parametrize("as_json", [False, True], ids=["rows", "json"])
def test_a_schema_that_changes_and_changes_back_prints_each_row_with_its_own_types(
    as_json: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    single = {"type": "float"}
    nested = {"type": "struct", "fields": [{"type": "int32", "optional": True, "field": "a"}]}
    events = [
        _envelope({"id": 1, "v": 0.1}, single),
        _envelope({"id": 2, "v": {"a": 7}}, nested),
        _envelope({"id": 3, "v": 0.1}, single),  # the first schema again: a cache hit
    ]
    flags = ["--option", "debezium-json.schema-include=true", *(["--json"] if as_json else [])]
    rows, err = inspect(capsys, lines(tmp_path / "schemas.jsonl", *events), "debezium-json", *flags)
    if as_json:
        assert [json.loads(row)["row"] for row in rows] == [
            {"id": 1, "v": 0.1},
            {"id": 2, "v": {"a": 7}},
            {"id": 3, "v": 0.1},
        ]
    else:
        assert rows == ["+I[1, 0.1]", "+I[2, +I[7]]", "+I[3, 0.1]"]
    assert f"0 {NO_INTERNAL_ERRORS}" in err[-1]


def test_a_registry_record_too_deep_to_validate_is_a_dead_letter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_debezium_json_registry import SMALL_SCHEMA

    deep = b"[" * 1000 + b"]" * 1000
    bodies = [
        b'{"op":"c","before":null,"after":{"id":1,"label":"ok"}}',
        b'{"op":"c","before":null,"after":{"id":2,"label":' + deep + b"}}",
    ]
    messages = [
        Message(b"\x00" + struct.pack(">I", 17) + body, topic="t", partition=0, offset=n)
        for n, body in enumerate(bodies)
    ]
    write_dump(tmp_path / "in.dump.jsonl", messages)
    rows, err = inspect(
        capsys,
        tmp_path / "in.dump.jsonl",
        "debezium-json-registry",
        "--option",
        f"debezium-json-registry.schema={SMALL_SCHEMA}",
        "--option",
        "debezium-json-registry.validate=true",
    )
    assert rows == ["+I[1, ok]"]
    [letter] = [line for line in err if line.startswith("cdcflow: dead letter ")]
    assert "topic 't' partition 0 offset 1" in letter and "nested too deeply" in letter
    assert f"1 {NO_INTERNAL_ERRORS}" in err[-1]
