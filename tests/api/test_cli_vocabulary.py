"""One vocabulary of flags across inspect, stream, record and ingest; the old spellings still work for one
release and say so on one line of stderr. The commands run through ``cdcflow.cli.main`` in the test's
process (``tests/cli_runner.py``); stream on the session's SparkSession."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cli_runner import run_cli_in_process as run_cli

from cdcflow.cli import parser
from cdcflow.cli.common import CdcflowUsageError, kafka_timeout_option, merge_columns, parse_duration

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEBEZIUM_LINE = (
    '{"op": "c", "before": null, "after": {"id": 7, "name": "pen"}, '
    '"source": {"db": "shop", "table": "items", "lsn": 1}}\n'
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30),
        (2.5, 2.5),
        ("500ms", 0.5),
        ("30s", 30),
        ("5m", 300),
        ("1h", 3600),
        ("7d", 7 * 86400),
        ("1 second", 1),
        ("10 seconds", 10),
        ("2 minutes", 120),
        ("250 milliseconds", 0.25),
        ("3 hours", 3 * 3600),
        ("1 day", 86400),
    ],
)
def test_one_duration_syntax(text: str | float, seconds: float) -> None:
    assert parse_duration(text, "--x") == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "soon", "5 fortnights", "-1", "0", "0s", "1e3", "5 m s"])
def test_a_bad_duration_names_the_flag_and_the_syntax(text: str) -> None:
    with pytest.raises(CdcflowUsageError, match=r"--state-ttl"):
        parse_duration(text, "--state-ttl")


def test_the_kafka_timeout_becomes_the_poll_timeout_unless_an_option_sets_it() -> None:
    options: dict[str, str] = {}
    kafka_timeout_option(options, parse_duration("1500ms", "--kafka-timeout"))
    assert options == {"kafkaConsumer.pollTimeoutMs": "1500"}
    given = {"kafkaconsumer.pollTimeoutMs": "9"}
    kafka_timeout_option(given, timedelta(seconds=1))
    assert given == {"kafkaconsumer.pollTimeoutMs": "9"}


def test_schema_and_metadata_flags_are_the_source_options_columns_and_metadata() -> None:
    options = {"schema-include": "false"}
    merge_columns(options, "id INT NOT NULL", ["source.table", "source.db"])
    assert options == {
        "schema-include": "false",
        "columns": "id INT NOT NULL",
        "metadata": "source.table,source.db",
    }
    with pytest.raises(CdcflowUsageError, match="--schema or --option columns"):
        merge_columns({"Columns": "id INT"}, "id INT", [])
    with pytest.raises(CdcflowUsageError, match="--metadata or --option metadata"):
        merge_columns({"metadata": "source.db"}, None, ["source.table"])


@pytest.mark.parametrize("command", ["inspect", "stream", "ingest"])
def test_inspect_stream_and_ingest_share_the_input_flags(command: str) -> None:
    args = parser().parse_args(
        [
            command,
            "--path",
            "in.jsonl",
            "--format",
            "canal-json",
            "--schema",
            "id INT",
            "--metadata",
            "database",
            "--metadata",
            "table",
            "--option",
            "k=v",
            "--kafka-timeout",
            "5s",
        ]
    )
    assert (args.path, args.format, args.schema, args.metadata, args.option) == (
        "in.jsonl",
        "canal-json",
        "id INT",
        ["database", "table"],
        ["k=v"],
    )
    assert args.kafka_timeout == timedelta(seconds=5)
    kafka = parser().parse_args([command, "--bootstrap-servers", "h:9092", "--topic", "a", "--topic", "b"])
    assert (kafka.bootstrap_servers, kafka.topic) == ("h:9092", ["a", "b"])


def test_inspect_path_and_the_deprecated_positional_file_print_the_same(tmp_path: Path) -> None:
    file = tmp_path / "in.jsonl"
    file.write_text(DEBEZIUM_LINE)
    flags = ("--format", "debezium-json", "--schema", "id INT, name STRING")
    new = run_cli("inspect", *flags, "--path", str(file))
    old = run_cli("inspect", *flags, str(file))
    assert new.returncode == old.returncode == 0, (new.stderr, old.stderr)
    assert new.stdout == old.stdout == "+I[7, pen]\n"
    assert "deprecated" not in new.stderr
    assert old.stderr.splitlines()[0] == (
        "cdcflow: warning: 'inspect FILE' is deprecated; use 'inspect --path FILE' (the old form goes in 0.3)"
    )
    assert old.stderr.splitlines()[1:] == new.stderr.splitlines()


def test_inspect_takes_metadata_and_columns_as_source_options_too(tmp_path: Path) -> None:
    file = tmp_path / "in.jsonl"
    file.write_text(DEBEZIUM_LINE)
    by_flags = run_cli(
        "inspect",
        "--format",
        "debezium-json",
        "--schema",
        "id INT",
        "--metadata",
        "source.table",
        "--path",
        str(file),
    )
    by_options = run_cli(
        "inspect",
        "--format",
        "debezium-json",
        "--option",
        "columns=id INT",
        "--option",
        "metadata=source.table",
        "--path",
        str(file),
    )
    assert by_flags.returncode == by_options.returncode == 0, (by_flags.stderr, by_options.stderr)
    assert by_flags.stdout == by_options.stdout == "+I[7, items]\n"
    columns = ("--schema", "id INT", "--option", "columns=id INT")
    both = run_cli("inspect", "--format", "debezium-json", *columns, "--path", str(file))
    assert both.returncode == 2
    assert both.stderr == "cdcflow: give the columns once: --schema or --option columns=..., not both\n"


def test_inspect_refuses_a_file_given_twice(tmp_path: Path) -> None:
    file = tmp_path / "in.jsonl"
    file.write_text('{"op": "INSERT", "id": 1}\n')
    result = run_cli("inspect", "--path", str(file), str(file))
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == "cdcflow: give the input once: --path FILE"


def test_record_refuses_a_format_option_naming_its_namespace() -> None:
    flags = "--bootstrap-servers 127.0.0.1:1 --topic t --output x --option debezium-json.schema-include=true"
    result = run_cli("record", *flags.split())
    assert result.returncode == 2
    assert result.stderr == (
        "cdcflow: --option debezium-json.schema-include: record takes Kafka options only (kafka.*, "
        "startingOffsets, endingOffsets, ...); format and connector options apply when the dump is read\n"
    )


def test_a_bad_kafka_timeout_is_a_usage_error() -> None:
    result = run_cli(
        "record", "--bootstrap-servers", "127.0.0.1:1", "--output", "x", "--kafka-timeout", "soon"
    )
    assert result.returncode == 2
    expected = "argument --kafka-timeout: expected a duration: 30 (seconds), 500ms, 30s, 5m, 1h, 7d"
    assert expected in result.stderr


@pytest.mark.integration
def test_stream_new_and_deprecated_spellings_print_the_same_changelog(
    tmp_path: Path, spark: SparkSession
) -> None:
    """``stream --path P --format canal-json --schema DDL`` and the old ``stream P --source cdc-canal
    --option columns=DDL`` read the same file to the same changelog; the old one warns once per spelling."""
    canal = tmp_path / "canal.jsonl"
    canal.write_text(
        '{"data": [{"id": "1", "name": "a"}], "old": null, "type": "INSERT", "database": "d", "table": "t", '
        '"pkNames": ["id"], "isDdl": false, "es": 1, "ts": 2}\n'
        '{"data": [{"id": "1", "name": "b"}], "old": [{"name": "a"}], "type": "UPDATE", "database": "d", '
        '"table": "t", "pkNames": ["id"], "isDdl": false, "es": 3, "ts": 4}\n'
    )
    schema = "id INT NOT NULL, name STRING"
    new = run_cli(
        "stream", "--path", str(canal), "--format", "canal-json", "--schema", schema, "--metadata", "table",
        spark=spark, timeout=300,
    )  # fmt: skip
    old = run_cli(
        "stream", str(canal), "--source", "cdc-canal",
        "--option", f"columns={schema}", "--option", "metadata=table", spark=spark, timeout=300,
    )  # fmt: skip
    assert new.returncode == old.returncode == 0, (new.stderr, old.stderr)
    lines = [line.split(" ", 1)[1] for line in new.stdout.splitlines()]
    assert lines == ["+I[1, a, t]", "-U[1, a, t]", "+U[1, b, t]"]
    assert old.stdout == new.stdout
    warnings = [line for line in old.stderr.splitlines() if "deprecated" in line]
    assert warnings == [
        "cdcflow: warning: 'stream PATH' is deprecated; use 'stream --path PATH' (the old form goes in 0.3)",
        "cdcflow: warning: --source is deprecated; use --format canal-json (the old form goes in 0.3)",
    ]
    assert "deprecated" not in new.stderr


def _ingest_config(*flags: str) -> Any:
    from cdcflow.cli.ingest import config_from, settings

    args = parser().parse_args(
        ["ingest", "--path", "in.jsonl", "--key", "id", "--target", "t", "--checkpoint", "c", *flags]
    )
    return config_from(settings(args))[0]


@pytest.mark.parametrize(
    ("interval", "spark"),
    [
        (None, "1 second"),
        ("1s", "1000 milliseconds"),
        ("250ms", "250 milliseconds"),
        ("5 sec", "5000 milliseconds"),
        ("1 second", "1000 milliseconds"),
        ("1 minute 30 seconds", "1 minute 30 seconds"),  # not this syntax: Spark judges it, as before
        ("interval 2 weeks", "interval 2 weeks"),
    ],
)
def test_ingest_interval_reaches_spark_in_a_form_it_reads(interval: str | None, spark: str) -> None:
    flags = ("--trigger", "continuous", *(("--interval", interval) if interval else ()))
    assert _ingest_config(*flags).interval == spark


@pytest.mark.parametrize("interval", ["0.0001", "soon", "-1s"])
def test_a_bad_interval_is_a_usage_error(interval: str) -> None:
    with pytest.raises(CdcflowUsageError, match="--interval"):
        _ingest_config("--trigger", "continuous", f"--interval={interval}")


def test_ingest_durations_accept_zero_where_it_has_a_meaning() -> None:
    config = _ingest_config("--state-ttl", "0", "--delete-retention", "1h")
    assert (config.state_ttl, config.delete_retention) == (timedelta(0), timedelta(hours=1))


def test_ingest_refuses_the_columns_given_twice() -> None:
    with pytest.raises(CdcflowUsageError, match="give the columns once"):
        _ingest_config("--schema", "id INT", "--option", "Columns=id INT")


@pytest.mark.integration
def test_stream_of_a_table_with_a_line_column_keeps_it(tmp_path: Path, spark: SparkSession) -> None:
    """A plain file's origin is printed as file:line only when no column has those names."""
    canal = tmp_path / "canal.jsonl"
    canal.write_text(
        '{"data": [{"id": "1", "line": "a"}], "old": null, "type": "INSERT", "database": "d", "table": "t", '
        '"pkNames": ["id"], "isDdl": false, "es": 1, "ts": 2}\n'
    )
    flags = ("--path", str(canal), "--format", "canal-json", "--schema", "id INT NOT NULL, line STRING")
    result = run_cli("stream", *flags, spark=spark, timeout=300)
    assert result.returncode == 0, result.stderr
    assert [line.split(" ", 1)[1] for line in result.stdout.splitlines()] == ["+I[1, a]"]
