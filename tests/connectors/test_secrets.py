"""Secrets given to a ``cdc-*`` source or sink never show: not in the plans' reprs (what Spark and
debuggers print), not in option errors, not in the dead letters a read writes."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from avro_events import FACTORY, messages
from kafka_fixture import KafkaCluster, unique_topic
from pyspark.sql import types as st
from registry_server import JsonHandler, serving
from source_cases import topic_records

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.kafka.options import ClientConfig, KafkaOptions
from cdcflow.connectors.kafka.reader import new_consumer
from cdcflow.connectors.replay import dumps as replay
from cdcflow.connectors.spark.dead_letters import dead_letter_record, read_dead_letters
from cdcflow.connectors.spark.options import split_options
from cdcflow.connectors.spark.read_plan import plan_read
from cdcflow.connectors.spark.readers import CdcBatchReader
from cdcflow.connectors.spark.sink import plan_write
from cdcflow.formats import FormatError, FormatOptionError, Message, resolve_format
from cdcflow.formats.base import DeadLetter
from cdcflow.formats.debezium import avro as debezium_avro
from cdcflow.formats.redact import PLACEHOLDER, redact

SECRET = "hunter2-s3cr3t"  # noqa: S105 - a made-up password
AVRO = "debezium-avro-confluent"
KAFKA_SECRETS = {
    "kafka.sasl.password": SECRET,
    "kafka.sasl.jaas.config": f'org.apache.kafka.common.security.plain.PlainLoginModule password="{SECRET}";',
    "kafka.sasl.oauthbearer.config": f"principal=me token={SECRET}",
    "kafka.sasl.oauthbearer.client.secret": SECRET,
    "kafka.ssl.key.password": SECRET,
    "kafka.ssl.key.pem": f"-----BEGIN PRIVATE KEY-----{SECRET}",
    "kafka.ssl.keystore.password": SECRET,
}
REGISTRY_SECRETS = [
    {f"{AVRO}.url": f"mock://alice:{SECRET}@plans"},
    {f"{AVRO}.url": "mock://plans", f"{AVRO}.basic-auth.user-info": f"alice:{SECRET}"},
    {
        f"{AVRO}.url": "mock://plans",
        f"{AVRO}.bearer-auth.token": SECRET,
        f"{AVRO}.bearer-auth.logical-cluster": "c",
    },
]
COLUMNS = "id INT NOT NULL, name STRING"


def assert_hidden(text: str) -> None:
    assert SECRET not in text
    assert PLACEHOLDER in text


@pytest.mark.parametrize("kafka_key", sorted(KAFKA_SECRETS))
def test_the_read_plan_repr_hides_each_kafka_secret(kafka_key: str) -> None:
    options = {
        "kafka.bootstrap.servers": "broker:9092",
        "subscribe": "orders",
        "columns": COLUMNS,
        "deadLetterTopic": "rejected",
        "ignore-parse-errors": "true",
        kafka_key: KAFKA_SECRETS[kafka_key],
    }
    plan = plan_read("debezium-json", options, None)
    assert_hidden(repr(plan))
    assert_hidden(repr(split_options(options, resolve_format("debezium-json"))))


@pytest.mark.parametrize("registry", REGISTRY_SECRETS, ids=["url", "basic-auth", "bearer-auth"])
def test_the_plans_hide_the_registry_credentials(registry: dict[str, str]) -> None:
    source = {"kafka.bootstrap.servers": "broker:9092", "subscribe": "orders", "columns": COLUMNS, **registry}
    plan = plan_read(AVRO, source, None)
    assert SECRET not in repr(plan)
    assert_hidden(repr(plan.decoder.config))  # type: ignore[attr-defined]
    assert_hidden(repr(split_options(source, resolve_format(AVRO))))
    sink = {"kafka.bootstrap.servers": "broker:9092", "topic": "out", "keyColumns": "id", **registry}
    schema = st.StructType(
        [
            st.StructField("id", st.IntegerType(), False),
            st.StructField("name", st.StringType()),
            st.StructField("_row_kind", st.StringType(), False),
        ]
    )
    assert_hidden(repr(plan_write(AVRO, sink, schema)))


def test_an_invalid_registry_url_is_refused_without_its_credentials() -> None:
    options = {
        "kafka.bootstrap.servers": "broker:9092",
        "subscribe": "orders",
        "columns": COLUMNS,
        f"{AVRO}.url": f"ftp://alice:{SECRET}@registry",
    }
    with pytest.raises(FormatOptionError, match="Invalid url ftp://") as error:
        plan_read(AVRO, options, None)
    assert_hidden(str(error.value))


def test_a_replay_path_is_named_without_its_credentials() -> None:
    options = {"path": f"s3a://key:{SECRET}@bucket/cdc", "columns": COLUMNS}
    with pytest.raises(ConnectorOptionError, match="path 's3a://") as error:
        plan_read("debezium-json", options, None)
    assert_hidden(str(error.value))


def test_a_dead_letter_url_is_refused_without_its_credentials(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("{}\n")
    options = {"path": str(tmp_path), "columns": COLUMNS, "deadLetterPath": f"s3a://key:{SECRET}@bucket/dl"}
    with pytest.raises(ConnectorOptionError, match="deadLetterPath 's3a://") as error:
        plan_read("debezium-json", options, None)
    assert_hidden(str(error.value))


def test_dead_letters_written_by_a_read_hold_no_registry_credentials(tmp_path: Path) -> None:
    dump = tmp_path / "in" / "topic.dump.jsonl"
    dump.parent.mkdir()
    unknown_schema = [replace(m, topic="orders", partition=0) for m in messages(schema_id=77)[:2]]
    replay.write_dump(dump, unknown_schema)
    options = {
        "path": str(dump),
        "columns": COLUMNS,
        f"{AVRO}.url": f"mock://alice:{SECRET}@letters",
        "deadLetterPath": str(tmp_path / "dead"),
    }
    reader = CdcBatchReader(plan_read(AVRO, options, None))
    assert [b for p in reader.partitions() for b in reader.read(p)] == []
    letters = read_dead_letters(str(tmp_path / "dead"))
    assert [(letter["offset"], letter["line"]) for letter in letters] == [(0, 2), (1, 3)]
    written = "".join(path.read_text() for path in (tmp_path / "dead").iterdir())
    assert f"schema id 77 is not in the Schema Registry at mock://{PLACEHOLDER}@letters" in written
    assert SECRET not in written


def test_the_ingest_configuration_repr_hides_the_options_secrets() -> None:
    from cdcflow.connectors.lakehouse.ingest import IngestConfig

    config = IngestConfig(
        format="debezium-json",
        key=("id",),
        target="t",
        checkpoint="c",
        bootstrap_servers="broker:9092",
        topics=("orders",),
        options={"kafka.sasl.password": SECRET, "kafka.sasl.username": "me"},
    )
    assert_hidden(repr(config))
    assert "'kafka.sasl.username': 'me'" in repr(config)


def test_credentials_in_a_checkpoint_uri_are_refused_without_showing_them() -> None:
    from cdcflow.connectors.lakehouse.sink import DeltaSink, apply_options

    sink = DeltaSink("/lake/t", apply_options(["id"]), f"s3a://key:{SECRET}@bucket/chk", app_id="orders")
    with pytest.raises(ConnectorOptionError, match="credentials in the URI are not read") as error:
        sink.check_identity()
    assert_hidden(str(error.value))


# --- the secrecy of every path a credential takes (issue 12) --------------------------------------
# Each test below fails when redaction is removed (formats/redact.py's ``redact`` made a no-op).

URL_SECRET = "hunter2/s3cr3t#x"  # noqa: S105 - a made-up password with characters a URL parser cuts at


@pytest.mark.parametrize(
    "text",
    [
        "token_count=5",
        "tokens=3, password_length=8",
        "Bearer tokens are refused",
        "Bearer authentication failed.",
        "token-based Bearer token-based login",
        "GET /subjects?author=bob&partition=1",
        "http://registry:8081/subjects/orders@v2",
        "user@example.com wrote http://registry:8081/",
    ],
)
def test_ordinary_words_are_not_redacted(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("api_key=abcdef123 token=abcdef123", f"api_key={PLACEHOLDER} token={PLACEHOLDER}"),
        (f"{{'sasl': {{'password': '{SECRET}'}}}}", f"{{'sasl': {{'password': '{PLACEHOLDER}'}}}}"),
        (f'password="{SECRET} with blanks"; next', f'password="{PLACEHOLDER}"; next'),
        (f"at https://alice:{URL_SECRET}@registry:8081/x", f"at https://{PLACEHOLDER}@registry:8081/x"),
        (f"('https://me@corp.com:{SECRET}@registry')", f"('https://{PLACEHOLDER}@registry')"),
        ("Bearer eyJhbGciOi.eyJzdWIi.c2lnbmF0dXJl", f"Bearer {PLACEHOLDER}"),
    ],
)
def test_secrets_in_text_are_replaced(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_a_registry_url_whose_password_a_parser_cuts_is_never_shown() -> None:
    """httpx reads ``alice:hunter2`` of ``http://alice:hunter2/s3cr3t#x@host`` as host and port, and
    quotes the "port"; the registry's options know the whole URL."""
    url = f"http://alice:{URL_SECRET}@127.0.0.1:9"
    decoder = FACTORY.create_decoder({"url": url, "ignore-parse-errors": "true"})
    with pytest.raises(FormatError) as error:
        decoder.decode_all(messages(schema_id=5)[:1])
    text = str(error.value)
    assert "Schema Registry at http://***@127.0.0.1:9" in text
    for piece in ("hunter2", "s3cr3t", URL_SECRET):
        assert piece not in text
    with_blank = f"http://alice:{SECRET} x@127.0.0.1:9"
    assert (
        redact(f"cannot reach {with_blank}", [("url", with_blank)])
        == f"cannot reach http://{PLACEHOLDER}@127.0.0.1:9"
    )


# --- dead letters: files and the cdcflow.error.reason header, the registry quoted by its URL ------


class _Registry(JsonHandler):
    """A Schema Registry that knows no schema (404, as Confluent's answers)."""

    def answer(self) -> tuple[int, dict[str, Any]]:
        return 404, {"error_code": 40403, "message": "Schema not found"}


@pytest.fixture(scope="module")
def empty_registry() -> Iterator[str]:
    with serving(_Registry) as port:
        yield f"127.0.0.1:{port}"


def _unknown_schema_dump(tmp_path: Path) -> str:
    dump = tmp_path / "in" / "topic.dump.jsonl"
    dump.parent.mkdir()
    replay.write_dump(dump, [replace(m, topic="orders", partition=0) for m in messages(schema_id=77)[:2]])
    return str(dump)


def _read_all(options: dict[str, str]) -> None:
    reader = CdcBatchReader(plan_read(AVRO, options, None))
    for partition in reader.partitions():
        for _ in reader.read(partition):
            pass


def test_dead_letter_files_name_the_registry_without_its_credentials(
    tmp_path: Path, empty_registry: str
) -> None:
    options = {
        "path": _unknown_schema_dump(tmp_path),
        "columns": COLUMNS,
        f"{AVRO}.url": f"http://alice:{SECRET}@{empty_registry}",
        "deadLetterPath": str(tmp_path / "dead"),
    }
    _read_all(options)
    letters = read_dead_letters(str(tmp_path / "dead"))
    assert [letter["offset"] for letter in letters] == [0, 1]
    for letter in letters:
        assert (
            letter["reason"] == f"schema id 77 is not in the Schema Registry at http://***@{empty_registry}"
        )
    assert SECRET not in "".join(path.read_text() for path in (tmp_path / "dead").iterdir())


@pytest.mark.integration
def test_the_dead_letter_header_names_the_registry_without_its_credentials(
    tmp_path: Path, empty_registry: str, kafka_cluster: KafkaCluster
) -> None:
    dead = unique_topic("secret-dead")
    kafka_cluster.create_topic(dead, 1)
    options = {
        "path": _unknown_schema_dump(tmp_path),
        "columns": COLUMNS,
        f"{AVRO}.url": f"http://alice:{SECRET}@{empty_registry}",
        "deadLetterTopic": dead,
        "kafka.bootstrap.servers": kafka_cluster.bootstrap_servers,
    }
    _read_all(options)
    letters = topic_records(kafka_cluster.bootstrap_servers, dead)
    assert len(letters) == 2
    for letter in letters:
        headers = dict(letter.headers)
        reason = f"schema id 77 is not in the Schema Registry at http://***@{empty_registry}"
        assert headers["cdcflow.error.reason"] == reason.encode()
        assert SECRET.encode() not in b"".join(value or b"" for _, value in letter.headers)


def test_an_unreachable_registry_stops_the_read_without_its_credentials(tmp_path: Path) -> None:
    """Not the record's fault: no dead letter, an error naming the registry by its redacted URL."""
    url = f"http://alice:{SECRET}@127.0.0.1:9"
    debezium_avro.registry_client((("url", url),))._rest_client.max_retries = 0  # keep the test fast
    options = {
        "path": _unknown_schema_dump(tmp_path),
        "columns": COLUMNS,
        f"{AVRO}.url": url,
        "deadLetterPath": str(tmp_path / "dead"),
    }
    with pytest.raises(FormatError) as error:
        _read_all(options)
    assert f"cannot reach the Schema Registry at http://{PLACEHOLDER}@127.0.0.1:9" in str(error.value)
    assert SECRET not in str(error.value)
    assert read_dead_letters(str(tmp_path / "dead")) == []


def test_a_dead_letter_reason_quoting_a_credential_is_written_without_it() -> None:
    """Whatever a reason quotes (a library's text in an internal error), files and headers hide URL
    credentials and assigned secrets."""
    message = Message(b"{}", topic="orders", partition=0, offset=3)
    reason = f"internal error in cdcflow (ValueError: GET http://alice:{SECRET}@registry token={SECRET})"
    record = dead_letter_record(DeadLetter(message, "debezium-json", reason, None))
    assert record["reason"] == "internal error in cdcflow (ValueError: GET http://***@registry token=***)"


# --- Kafka client settings: librdkafka's errors and logs -----------------------------------------


@pytest.mark.integration
def test_librdkafkas_error_quoting_the_oauthbearer_config_is_explained_without_it(
    kafka_cluster: KafkaCluster,
) -> None:
    """librdkafka quotes an unparsable ``sasl.oauthbearer.config`` in the errors its clients report;
    the readers report them through ``explain``."""
    options = KafkaOptions.parse(
        {
            "kafka.bootstrap.servers": kafka_cluster.bootstrap_servers,
            "subscribe": "any",
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanisms": "OAUTHBEARER",
            "kafka.enable.sasl.oauthbearer.unsecure.jwt": "true",
            "kafka.sasl.oauthbearer.config": f"principal=me unparsable{SECRET}",
        }
    )
    errors: list[Any] = []
    consumer = new_consumer(options, errors.append)
    try:
        for _ in range(20):
            consumer.poll(0.5)
            if errors:
                break
    finally:
        consumer.close()
    assert errors, "librdkafka reported no error"
    assert SECRET in str(errors[0])  # what librdkafka says, quoted by a naive message
    explained = options.client.explain(errors[0])
    assert "Unrecognized sasl.oauthbearer.config" in explained
    assert_hidden(explained)


def test_librdkafkas_log_lines_are_logged_without_secrets(caplog: pytest.LogCaptureFixture) -> None:
    client = ClientConfig.of("broker:9092", sasl_password=SECRET, sasl_username="me")
    logger = client.redacting(logging.getLogger("cdcflow.connectors.kafka"))
    with caplog.at_level(logging.DEBUG, logger="cdcflow.connectors.kafka"):
        logger.log(logging.WARNING, "SASL: login as %s with %s failed", "me", SECRET)
    assert caplog.messages == [f"SASL: login as me with {PLACEHOLDER} failed"]


# --- the command line: --option flags, well-formed or not, and the ingest config file -------------

COMMANDS = {
    "inspect": ["inspect", "--format", "debezium-json"],
    "record": ["record", "--bootstrap-servers", "127.0.0.1:9", "--output", "out.dump.jsonl"],
    "stream": ["stream"],
    "ingest": ["ingest"],
}
MALFORMED = {
    "colon": ["--option", f"kafka.sasl.password:{SECRET}"],
    "blank": ["--option", f"kafka.sasl.password {SECRET}"],
    "two-arguments": ["--option", "kafka.sasl.password", SECRET],
    "misspelt-flag": ["--options", f"kafka.sasl.password={SECRET}"],
    "no-flag": [f"kafka.sasl.jaas.config=PlainLoginModule required password='{SECRET}';"],
}


def _run_cli(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from cdcflow.cli import main

    try:
        code = main(arguments)
    except SystemExit as exit_:  # argparse's usage errors
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize("malformed", sorted(MALFORMED))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_malformed_option_is_refused_without_its_secret(
    command: str,
    malformed: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, output = _run_cli([*COMMANDS[command], *MALFORMED[malformed]], capsys)
    assert code != 0
    assert "cdcflow" in output
    assert SECRET not in output
    shown = {"colon": f"kafka.sasl.password:{PLACEHOLDER}", "blank": f"kafka.sasl.password {PLACEHOLDER}"}
    if malformed in shown:
        assert f"--option '{shown[malformed]}' must look like KEY=VALUE" in output


def test_a_well_formed_option_quoted_by_an_error_is_hidden(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"ftp://alice:{SECRET}@registry"
    code, output = _run_cli(["inspect", "--format", AVRO, "--option", f"{AVRO}.url={url}"], capsys)
    assert code != 0
    assert f"Invalid url ftp://{PLACEHOLDER}@registry" in output
    assert SECRET not in output


def _subprocess_cli(arguments: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it (stream and ingest start Spark if they get that far)."""
    return subprocess.run(  # noqa: S603 - our own module, fixed arguments
        [sys.executable, "-m", "cdcflow", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


TOML = f"""
key = "id"
target = "table"
checkpoint = "checkpoint"
[options]
schema-include = "true"
kafka.sasl.password = "{SECRET}"
kafka.sasl.jaas.config = "PlainLoginModule required username='me' password='{SECRET}';"
"""


def test_the_ingest_config_files_options_are_read_as_keys_and_never_shown(tmp_path: Path) -> None:
    """TOML reads ``kafka.sasl.password = ...`` in ``[options]`` as nested tables: they become the
    dotted option, not an option ``kafka`` whose value shows the password."""
    from cdcflow.cli import _parser
    from cdcflow.cli.ingest import config_from, settings

    (tmp_path / "ingest.toml").write_text(TOML)
    args = _parser().parse_args(["ingest", "--config", str(tmp_path / "ingest.toml"), "--path", "x"])
    config, _ = config_from(settings(args))
    assert config.options["kafka.sasl.password"] == SECRET
    assert set(config.options) == {"schema-include", "kafka.sasl.password", "kafka.sasl.jaas.config"}
    assert_hidden(repr(config))


@pytest.mark.parametrize("command", ["stream", "ingest"])
def test_stream_and_ingest_refuse_options_without_showing_their_secrets(command: str, tmp_path: Path) -> None:
    """Kafka options on a recorded-file source are refused (before Spark starts): the message names the
    keys, never the values, whether given as flags or in the ingest config file."""
    dump = tmp_path / "in.dump.jsonl"
    replay.write_dump(dump, [Message(b'{"op":"c"}', topic="t", partition=0, offset=0)])
    path = [str(dump)] if command == "stream" else ["--path", str(dump)]
    arguments = [command, *path, "--option", f"kafka.sasl.password={SECRET}"]
    if command == "ingest":
        (tmp_path / "ingest.toml").write_text(TOML)
        arguments += ["--config", str(tmp_path / "ingest.toml")]
    result = _subprocess_cli(arguments, tmp_path)
    assert result.returncode != 0
    assert "kafka.sasl.password" in result.stderr
    assert SECRET not in result.stdout + result.stderr
