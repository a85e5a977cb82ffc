"""The inspector, through ``cdcflow.cli.main`` in the test's process (``tests/cli_runner.py``), and as users
run it: ``python -m cdcflow inspect`` (``run_cli``, also for the other modules' process tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli_in_process


def run_cli(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own module, fixed arguments
        [sys.executable, "-m", "cdcflow", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=timeout,
        check=False,
    )


def test_inspect_prints_flink_style_rows(tmp_path: Path) -> None:
    file = tmp_path / "flat.jsonl"
    file.write_text(
        '{"op": "INSERT", "id": 5, "name": "name"}\n\n{"op": "DELETE", "id": 5, "name": "name"}\n'
    )
    result = run_cli_in_process("inspect", str(file))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "+I[5, name]\n-D[5, name]\n"


def test_inspect_json_writes_kind_and_row_objects(tmp_path: Path) -> None:
    file = tmp_path / "flat.jsonl"
    file.write_text('{"op": "INSERT", "id": 5, "name": "name"}\n')
    result = run_cli_in_process("inspect", str(file), "--json")
    assert result.returncode == 0, result.stderr
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {"kind": "+I", "row": {"id": 5, "name": "name"}}
    ]


@pytest.mark.process
def test_inspect_with_custom_op_field_and_mapping_from_stdin() -> None:
    """The smoke test of ``python -m cdcflow inspect`` in this module: a child process reading its stdin."""
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
    result = run_cli_in_process("inspect")
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
    result = run_cli_in_process("inspect", str(file))
    assert result.returncode == 1
    assert f"{file}:2: not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_op_error_says_the_fix(tmp_path: Path) -> None:
    file = tmp_path / "ops.jsonl"
    file.write_text('{"op": "TRUNCATE"}\n')
    result = run_cli_in_process("inspect", str(file))
    assert result.returncode == 1
    assert "record #0, field 'op': unknown operation code 'TRUNCATE'" in result.stderr
    assert "invalid_op_handling" in result.stderr
    skipped = run_cli_in_process("inspect", str(file), "--invalid-op-handling", "skip")
    assert skipped.returncode == 0 and skipped.stdout == ""


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    result = run_cli_in_process("inspect", str(tmp_path / "nope.jsonl"))
    assert result.returncode == 2  # a usage error: the command line names no file
    assert "no such file" in result.stderr


TESTDATA = Path(__file__).parent.parent / "formats" / "testdata"


def test_inspect_format_decodes_with_options_and_schema() -> None:
    result = run_cli_in_process(
        "inspect",
        "--format",
        "debezium-json",
        "--schema",
        "id INT NOT NULL, name STRING, description STRING, weight FLOAT",
        "--option",
        "debezium-json.ignore-parse-errors=false",
        str(TESTDATA / "flink" / "debezium-data-schema-exclude.txt"),
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "+I[101, scooter, Small 2-wheel scooter, 3.14]"
    assert lines[-1] == "-D[111, scooter, Big 2-wheel scooter , 5.17]"
    assert len(lines) == 20
    assert "16 messages, 20 changes" in result.stderr


def test_inspect_format_json_output_uses_iso_timestamps() -> None:
    result = run_cli_in_process(
        "inspect",
        "--format",
        "debezium-json",
        "--option",
        "debezium-json.schema-include=true",
        "--metadata",
        "source.table",
        "--json",
        str(TESTDATA / "risingwavelabs_risingwave" / "debezium_timestamp.1"),
    )
    assert result.returncode == 0, result.stderr
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {
            "kind": "+I",
            "row": {
                "id": 1,
                "ts": "2022-10-14T23:55:31.989360",
                "d": "2022-10-14",
                "t": "23:55:31.989360",
                "source_table": "t",
            },
        }
    ]


def test_inspect_format_errors_name_the_line_and_the_option(tmp_path: Path) -> None:
    file = tmp_path / "bad.jsonl"
    file.write_text('{"before": null, "after": {"id": "x"}, "op": "c"}\n')
    result = run_cli_in_process("inspect", "--format", "debezium-json", "--schema", "id INT", str(file))
    assert result.returncode == 1
    assert f"{file}:1, field 'after.id'" in result.stderr
    unknown = run_cli_in_process(
        "inspect", "--format", "debezium-json", "--option", "nope=1", "--schema", "id INT", str(file)
    )
    assert unknown.returncode == 2 and "Supported options: debezium-json.schema-include" in unknown.stderr
    no_format = run_cli_in_process("inspect", "--format", "kafka-avro", str(file))
    assert (
        no_format.returncode == 2
        and "unknown format 'kafka-avro'; available: debezium-json" in no_format.stderr
    )


def test_inspect_format_dead_letters_are_reported(tmp_path: Path) -> None:
    file = tmp_path / "mixed.jsonl"
    file.write_text('{"before": null, "after": {"id": 1}, "op": "c"}\nnot json\n')
    result = run_cli_in_process(
        "inspect",
        "--format",
        "debezium-json",
        "--schema",
        "id INT",
        "--option",
        "ignore-parse-errors=true",
        str(file),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "+I[1]\n"
    assert f"dead letter {file}:2: not valid JSON" in result.stderr


def test_inspect_json_writes_float_columns_as_their_32_bit_value() -> None:
    result = run_cli_in_process(
        "inspect",
        "--format",
        "canal-json",
        "--schema",
        "id INT NOT NULL, name STRING, description STRING, weight FLOAT",
        "--json",
        str(TESTDATA / "flink" / "canal-data.txt"),
    )
    assert result.returncode == 0, result.stderr
    first = json.loads(result.stdout.splitlines()[0])
    assert first["row"] == {
        "id": 101,
        "name": "scooter",
        "description": "Small 2-wheel scooter",
        "weight": 3.14,
    }


SECRET = "hunter2-s3cr3t"  # noqa: S105 - a made-up password


def test_cli_errors_never_print_a_registry_credential(tmp_path: Path) -> None:
    file = tmp_path / "in.txt"
    file.write_text("{}\n")
    url = f"debezium-avro-confluent.url=ftp://alice:{SECRET}@registry"
    result = run_cli_in_process("inspect", str(file), "--format", "debezium-avro-confluent", "--option", url)
    assert result.returncode == 2
    assert "Invalid url ftp://***@registry" in result.stderr
    assert SECRET not in result.stderr + result.stdout


def test_cli_errors_never_print_a_kafka_secret() -> None:
    # The password typed into the mechanism setting too: librdkafka quotes the mechanism in its error.
    result = run_cli_in_process(
        "record",
        "--bootstrap-servers",
        "127.0.0.1:1",
        "--topic",
        "orders",
        "--output",
        "unused.jsonl",
        "--option",
        "kafka.security.protocol=SASL_PLAINTEXT",
        "--option",
        f"kafka.sasl.mechanisms={SECRET}",
        "--option",
        f"kafka.sasl.password={SECRET}",
    )
    assert result.returncode == 2
    assert "Unsupported SASL mechanism: ***" in result.stderr
    assert SECRET not in result.stderr + result.stdout
