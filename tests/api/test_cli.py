"""The inspector, run as users run it: ``python -m cdcflow inspect``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own module, fixed arguments
        [sys.executable, "-m", "cdcflow", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=60,
        check=False,
    )


def test_inspect_prints_flink_style_rows(tmp_path: Path) -> None:
    file = tmp_path / "flat.jsonl"
    file.write_text(
        '{"op": "INSERT", "id": 5, "name": "name"}\n\n{"op": "DELETE", "id": 5, "name": "name"}\n'
    )
    result = run_cli("inspect", str(file))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "+I[5, name]\n-D[5, name]\n"


def test_inspect_json_writes_kind_and_row_objects(tmp_path: Path) -> None:
    file = tmp_path / "flat.jsonl"
    file.write_text('{"op": "INSERT", "id": 5, "name": "name"}\n')
    result = run_cli("inspect", str(file), "--json")
    assert result.returncode == 0, result.stderr
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {"kind": "+I", "row": {"id": 5, "name": "name"}}
    ]


def test_inspect_with_custom_op_field_and_mapping_from_stdin() -> None:
    lines = '{"type": "c", "id": 1}\n{"type": "u", "id": 1}\n{"type": "d", "id": 1}\n'
    result = run_cli(
        "inspect",
        "-",
        "--op",
        "type",
        "--op-mapping",
        "c, r=INSERT",
        "--op-mapping",
        "u=UPDATE_AFTER",
        "--op-mapping",
        "d=DELETE",
        stdin=lines,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["+I[1]", "+U[1]", "-D[1]"]


def test_inspect_without_file_reads_the_bundled_example() -> None:
    result = run_cli("inspect")
    assert result.returncode == 0, result.stderr
    assert "bundled example" in result.stderr
    assert result.stdout.splitlines()[:4] == [
        "+I[1, Alice, Berlin]",
        "+I[2, Bob, Paris]",
        "-U[1, Alice, Berlin]",
        "+U[1, Alice, Lisbon]",
    ]


def test_bad_json_names_file_and_line(tmp_path: Path) -> None:
    file = tmp_path / "bad.jsonl"
    file.write_text('{"op": "INSERT", "id": 1}\n{"op": "INSERT", "id": \n')
    result = run_cli("inspect", str(file))
    assert result.returncode == 1
    assert f"{file}:2: not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_op_error_says_the_fix(tmp_path: Path) -> None:
    file = tmp_path / "ops.jsonl"
    file.write_text('{"op": "TRUNCATE"}\n')
    result = run_cli("inspect", str(file))
    assert result.returncode == 1
    assert "record #0, field 'op': unknown operation code 'TRUNCATE'" in result.stderr
    assert "invalid_op_handling" in result.stderr
    skipped = run_cli("inspect", str(file), "--invalid-op-handling", "skip")
    assert skipped.returncode == 0 and skipped.stdout == ""


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    result = run_cli("inspect", str(tmp_path / "nope.jsonl"))
    assert result.returncode == 1
    assert "no such file" in result.stderr
