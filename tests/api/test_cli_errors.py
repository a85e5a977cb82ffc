"""Hostile input and unreachable services at the command line: one clear line, never a traceback.

inspect and record run through ``cdcflow.cli.main`` in the test's process (``tests/cli_runner.py``); the
tests about what the Spark commands print before and instead of Spark's output (no session started, no
JVM lines, Ctrl-C) run ``python -m cdcflow`` as a child process, whose whole stderr they read."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli_in_process
from deltalake import DeltaTable
from test_cli import run_cli

from cdcflow.cli import main
from cdcflow.connectors.spark.read_plan import plan_read
from cdcflow.formats import DecodeOutput, Message, parse_ddl, resolve_format
from cdcflow.formats.errors import DecodeError

DEBEZIUM = ("inspect", "--format", "debezium-json", "--schema", "id INT")
IGNORE = ("--option", "debezium-json.ignore-parse-errors=true")


def closed_port() -> int:
    """A local port with nothing listening: connections to it are refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def assert_one_clean_error(stderr: str) -> None:
    assert "Traceback" not in stderr and "py4j" not in stderr.lower() and "\tat " not in stderr, stderr


def test_invalid_utf8_is_a_dead_letter_and_the_good_lines_around_it_are_printed(tmp_path: Path) -> None:
    file = tmp_path / "mixed.jsonl"
    file.write_bytes(
        b'{"before": null, "after": {"id": 1}, "op": "c"}\n'
        b'{"before": null, "after": {"id": "\xff\xfe"}, "op": "c"}\n'
        b'{"before": null, "after": {"id": 3}, "op": "c"}\n'
    )
    result = run_cli_in_process(*DEBEZIUM, *IGNORE, str(file))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "+I[1]\n+I[3]\n"
    assert f"dead letter {file}:2: " in result.stderr
    assert "3 messages, 2 changes" in result.stderr and "1 dead letters" in result.stderr
    assert_one_clean_error(result.stderr)


def test_a_bare_carriage_return_is_data_and_line_numbers_stay_those_of_the_file(tmp_path: Path) -> None:
    # As the Spark sources read files: lines end at \n only, \r\n loses its \r.
    file = tmp_path / "cr.jsonl"
    file.write_bytes(
        b'{"before": null, "after": {"id": 1}, "op": "c"}\r\n'
        b'{"before": null, "after": {"id": 2}, "op": "c"}\r{"before": null, "after": {"id": 9}, "op": "c"}\n'
        b"not json\n"
        b'{"before": null, "after": {"id": 4}, "op": "c"}\n'
    )
    result = run_cli_in_process(*DEBEZIUM, *IGNORE, str(file))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "+I[1]\n+I[4]\n"
    dead = re.findall(r"dead letter \S+:(\d+):", result.stderr)
    assert dead == ["2", "3"], result.stderr


def test_flat_records_with_invalid_utf8_name_the_line(tmp_path: Path) -> None:
    file = tmp_path / "flat.jsonl"
    file.write_bytes(b'{"op": "INSERT", "id": 1}\n{"op": "INSERT", "id": "\xff"}\n')
    result = run_cli_in_process("inspect", "--path", str(file))
    assert result.returncode == 1
    assert result.stdout == "+I[1]\n"
    assert (
        result.stderr
        == f"cdcflow: {file}:2: not valid UTF-8 (byte 0xff at byte 25); each line must hold one JSON "
        "object in UTF-8\n"
    )


@pytest.mark.parametrize(
    "first",
    [
        b"not json",
        b'{"schema": null, "payload": null}',
        b'{"schema": {"type": "struct", "fields": []}, "payload": {"op": "t", "source": {}}}',
    ],
    ids=["bad-record", "tombstone-like", "truncate"],
)
def test_schema_include_columns_come_from_the_first_message_with_a_schema_block(
    tmp_path: Path, first: bytes
) -> None:
    recorded = (
        Path(__file__).parent.parent / "formats" / "testdata" / "flink" / "debezium-data-schema-include.txt"
    )
    file = tmp_path / "first-has-no-change.jsonl"
    file.write_bytes(first + b"\n" + recorded.read_bytes().splitlines()[0] + b"\n")
    result = run_cli_in_process(
        "inspect",
        "--format",
        "debezium-json",
        "--option",
        "debezium-json.schema-include=true",
        *IGNORE,
        str(file),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("+I[101, scooter, Small 2-wheel scooter, "), result.stdout
    assert_one_clean_error(result.stderr)


def test_inspect_takes_kafka_options_and_gives_up_on_an_unreachable_broker_after_the_timeout() -> None:
    result = run_cli_in_process(
        *DEBEZIUM,
        "--bootstrap-servers",
        f"127.0.0.1:{closed_port()}",
        "--topic",
        "orders",
        "--kafka-timeout",
        "2",
        "--option",
        "kafka.client.id=inspector",
        "--option",
        "kafka.reconnect.backoff.ms=10",
    )
    assert result.returncode == 1
    assert_one_clean_error(result.stderr)
    assert "could not list the topics of Kafka" in result.stderr and "within 2s" in result.stderr
    assert len(result.stderr) < 2000, result.stderr  # librdkafka's repeated connection failures, once
    assert result.stderr.count("Connection refused") <= 2


def test_inspect_refuses_kafka_options_without_a_broker(tmp_path: Path) -> None:
    file = tmp_path / "in.jsonl"
    file.write_text("{}\n")
    result = run_cli_in_process(*DEBEZIUM, "--option", "kafka.client.id=x", "--path", str(file))
    assert result.returncode == 2
    assert (
        result.stderr == "cdcflow: Kafka options (kafka.*, startingOffsets, ...) need --bootstrap-servers\n"
    )


def test_record_gives_up_on_an_unreachable_broker_after_the_timeout(tmp_path: Path) -> None:
    result = run_cli_in_process(
        "record",
        "--bootstrap-servers",
        f"127.0.0.1:{closed_port()}",
        "--topic",
        "orders",
        "--output",
        str(tmp_path / "dump.jsonl"),
        "--kafka-timeout",
        "1.5",
    )
    assert result.returncode == 1
    assert "within 1.5s" in result.stderr
    assert_one_clean_error(result.stderr)


@pytest.mark.process
@pytest.mark.parametrize("command", ["stream", "ingest"])
def test_unknown_options_and_unreachable_kafka_fail_before_spark_starts(command: str, tmp_path: Path) -> None:
    kafka = ("--bootstrap-servers", f"127.0.0.1:{closed_port()}", "--topic", "orders", "--kafka-timeout", "2")
    table = ("--key", "id", "--target", str(tmp_path / "t"), "--checkpoint", str(tmp_path / "cp"))
    extra = table if command == "ingest" else ()
    unknown = run_cli(command, *kafka, *extra, "--option", "columns=id INT NOT NULL", "--option", "colums=x")
    assert unknown.returncode == 2
    assert unknown.stderr.splitlines()[-1].startswith(
        "cdcflow: Unsupported options for format 'debezium-json': colums."
    )
    assert_one_clean_error(unknown.stderr)
    unreachable = run_cli(command, *kafka, *extra, "--option", "columns=id INT NOT NULL")
    assert unreachable.returncode == 1
    assert unreachable.stderr.splitlines()[-1].startswith(
        "cdcflow: could not list the topics of Kafka at bootstrap servers 127.0.0.1:"
    )
    assert "within 2s" in unreachable.stderr
    assert_one_clean_error(unreachable.stderr)
    assert "Spark" not in unknown.stderr + unreachable.stderr  # no session was started


@pytest.mark.process
@pytest.mark.parametrize("command", ["stream", "ingest"])
def test_an_unwritable_checkpoint_is_named_before_spark_starts(command: str, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    checkpoint = blocker / "checkpoint"
    extra = ("--key", "id", "--target", str(tmp_path / "t")) if command == "ingest" else ()
    result = run_cli(command, *extra, "--checkpoint", str(checkpoint))
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"cdcflow: --checkpoint {checkpoint}: cannot be written ({blocker} is a file, not a directory); "
        "choose a writable directory"
    )
    assert_one_clean_error(result.stderr)


def test_no_command_prints_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "usage: cdcflow [-h] COMMAND ...\ncdcflow: error: the following arguments are required: COMMAND\n"
    )


DEMO = str(Path(__file__).parent.parent.parent / "api" / "examples" / "postgres-debezium.dump.jsonl")


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (
            ["--schema", "id INT NOT NULL, name STRNG"],
            "--schema: cannot parse the schema at character 27 (...NOT NULL, name STRNG...): "
            "unknown type 'STRNG'; known: ",
        ),
        (["--option", "schema-include"], "--option 'schema-include' must look like KEY=VALUE"),
        (
            ["--option", "schema-include=true", "--key", "item_id"],
            "--key item_id: the table has no column 'item_id' (did you mean 'id'?); its columns: id, "
            "c_numeric, c_numeric_var, c_decimal, c_real, c_double, c_smallint, c_bigint, c_boolean, c_date, "
            "c_time, c_time3, c_timestamp, c_timestamp3, c_timestamptz, c_json, c_jsonb, c_uuid, c_bytea, "
            "c_text, c_varchar, c_enum, c_int_array, big_text, big_jsonb\n",
        ),
        (
            ["--option", "schema-include=true", "--sequence-by", "c_timestmp"],
            "--sequence-by c_timestmp: the table has no column 'c_timestmp' (did you mean 'c_timestamp'?)",
        ),
    ],
    ids=["schema", "option", "key", "sequence-by"],
)
def test_ingest_usage_errors_exit_2_naming_the_flag_before_spark_starts(
    flags: list[str], error: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = tmp_path / "checkpoint"
    command = ["ingest", "--path", DEMO, "--key", "id", "--target", str(tmp_path / "t")]
    assert main([*command, "--checkpoint", str(checkpoint), *flags]) == 2
    last = capsys.readouterr().err.splitlines(keepends=True)[-1]
    assert last.startswith(f"cdcflow: {error}"), last
    assert "_row_kind" not in last and "source_sequence" not in last  # internal columns
    assert not checkpoint.exists()  # no query started


def test_spark_failure_is_the_cdcflow_error_inside_spark_text() -> None:
    from cdcflow.connectors.spark.jobs import spark_failure

    line = "debezium-json: cannot decode in.jsonl:2, field 'after.id': expected an integer for INT, got 'x'."
    wrapped = (
        "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function.\n"
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/cdcflow/formats/base.py", line 224, in _reject\n'
        f"cdcflow.formats.errors.DecodeError: {line}\n\n"
        "\tat py4j.Protocol.getReturnValue(Protocol.java:476)\n"
        f"Traceback (most recent call last):\ncdcflow.formats.errors.DecodeError: {line}\n"
    )
    failure = spark_failure(RuntimeError(wrapped))
    assert str(failure) == line and not failure.usage_error
    option = spark_failure(
        RuntimeError("x\ncdcflow.connectors.errors.ConnectorOptionError: option 'x': bad\n")
    )
    assert str(option) == "option 'x': bad" and option.usage_error
    spark_only = spark_failure(RuntimeError("\n[STREAM_FAILED] Query terminated\n\tat org.apache.spark.X"))
    assert str(spark_only) == "Spark failed: [STREAM_FAILED] Query terminated"


def test_decode_error_advice_names_options_the_source_accepts(tmp_path: Path) -> None:
    file = tmp_path / "bad.jsonl"
    file.write_bytes(b'{"before": null, "after": {"id": "x"}, "op": "c"}\n')
    decoder = resolve_format("debezium-json").create_decoder({}, parse_ddl("id INT"), [])
    with pytest.raises(DecodeError) as raised:
        decoder.decode(Message(file.read_bytes().strip(), file=str(file), line=1), DecodeOutput())
    advice = str(raised.value)
    suggested = dict.fromkeys(re.findall(r"'([\w.-]+)'='true'", advice), "true")
    assert suggested == {"debezium-json.ignore-parse-errors": "true"}
    assert "deadLetterPath=DIR" in advice
    # What the advice says together is accepted by the Spark source; the first half alone is not.
    options = {"path": str(file), "columns": "id INT", **suggested}
    plan = plan_read("debezium-json", {**options, "deadLetterPath": str(tmp_path / "dead")}, None)
    assert plan.dead_letters is not None
    with pytest.raises(Exception, match="set deadLetterPath"):
        plan_read("debezium-json", options, None)


@pytest.mark.integration
@pytest.mark.process
def test_a_bad_record_in_ingest_is_one_line_naming_it(tmp_path: Path) -> None:
    recorded = tmp_path / "orders.jsonl"
    recorded.write_text(
        '{"before": null, "after": {"id": 1}, "op": "c"}\n{"before": null, "after": {"id": "x"}, "op": "c"}\n'
    )
    result = run_cli(
        "ingest",
        "--path",
        str(recorded),
        "--schema",
        "id INT NOT NULL",
        "--key",
        "id",
        "--sequence-by",
        "none",
        "--target",
        str(tmp_path / "table"),
        "--checkpoint",
        str(tmp_path / "checkpoint"),
        timeout=300,
    )
    assert result.returncode == 1
    assert_one_clean_error(result.stderr)
    where = f"cannot decode {recorded}:2, field 'after.id'"
    assert result.stderr.count(where) == 1, result.stderr
    assert result.stderr.splitlines()[-1].startswith(f"cdcflow: debezium-json: {where}")


@pytest.mark.integration
@pytest.mark.process
def test_ctrl_c_stops_a_file_ingest_between_batches_and_exits_130_saying_what_was_committed(
    tmp_path: Path,
) -> None:
    """Ctrl-C once a batch is committed: the batch in progress finishes, the query stops, the run
    exits 130 (an orchestrator must not record it as a success) with one line saying what was
    committed, which is what the table holds; no JVM noise before it, no stack trace after it."""
    recorded = tmp_path / "orders.jsonl"
    with recorded.open("w") as out:  # about 20 micro-batches of 1 MB
        for n in range(200_000):
            after = {"id": n % 50_000, "name": f"order {n:09d}"}
            out.write(json.dumps({"before": None, "after": after, "op": "c"}) + "\n")
    target = tmp_path / "table"
    command = [sys.executable, "-m", "cdcflow", "ingest", "--path", str(recorded)]
    command += ["--schema", "id INT NOT NULL, name STRING", "--key", "id", "--sequence-by", "none"]
    command += ["--max-bytes-per-trigger", "1000000"]
    command += ["--target", str(target), "--checkpoint", str(tmp_path / "checkpoint")]
    process = subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
        command, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    assert process.stderr is not None
    seen = []
    for line in process.stderr:  # until the first micro-batch is committed
        seen.append(line)
        if line.startswith("cdcflow ingest: batches: "):
            break
    os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C does: the whole process group
    rest = process.stderr.read().splitlines()
    process.stderr.close()
    assert process.wait(timeout=120) == 130, "".join(seen) + "\n".join(rest)

    # quiet: cdcflow's own lines only; the first progress line is about a batch, short, no zero counts
    assert all(line.startswith("cdcflow") for line in [*seen, *rest]), "".join(seen) + "\n".join(rest)
    progress = seen[-1].rstrip("\n")
    assert re.fullmatch(
        r"cdcflow ingest: batches: 1, changes: [\d,]+ \([\d,]+ changes/s\), upserted: [\d,]+, "
        r"last batch: [\d,]+ ms, lag: [\d.]+ MiB",
        progress,
    ), progress
    committed = [line for line in rest if "committed" in line]
    assert len(committed) == 1, rest
    found = re.fullmatch(
        r"cdcflow ingest: interrupted \(Ctrl-C\): committed (\d+) batch(?:es)?, ([\d,]+) changes .*"
        r"; table version (\d+), ([\d,]+) rows; .*; run again to go on from the checkpoint",
        committed[0],
    )
    assert found is not None, committed[0]
    table = DeltaTable(str(target))
    changes = int(found[2].replace(",", ""))
    assert 0 < changes < 200_000, "the run should have been stopped midway"
    assert (int(found[3]), int(found[4].replace(",", ""))) == (table.version(), len(table.to_pyarrow_table()))
    assert len(table.to_pyarrow_table()) == min(changes, 50_000)


def test_inspect_accounts_for_every_message(tmp_path: Path) -> None:
    file = tmp_path / "mixed.jsonl"
    file.write_text(
        '{"before": null, "after": {"id": 1}, "op": "c"}\n'  # one change
        '{"before": {"id": 1}, "after": {"id": 2}, "op": "u"}\n'  # two changes (-U, +U)
        '{"before": null, "after": null, "op": "t"}\n'  # a side-output event
        '{"before": null, "after": {"id": "x"}, "op": "c"}\n'  # a dead letter
        '{"before": null, "after": {"id": 3}, "op": ["c"]}\n'  # a dead letter (op is a list)
    )
    result = run_cli_in_process(*DEBEZIUM, *IGNORE, str(file))
    assert result.returncode == 0, result.stderr
    assert (
        "cdcflow: 5 messages, 3 changes: 2 with changes, 2 dead letters (0 internal errors), "
        "1 side-output events, 0 filtered, 0 tombstones, 0 empty\n"
    ) in result.stderr
    assert "UNACCOUNTED" not in result.stderr
    assert_one_clean_error(result.stderr)
