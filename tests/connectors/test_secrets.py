"""Secrets given to a ``cdc-*`` source or sink never show: not in the plans' reprs (what Spark and
debuggers print), not in option errors, not in the dead letters a read writes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from avro_events import messages
from pyspark.sql import types as st

from cdcflow.connectors import replay
from cdcflow.connectors.dead_letters import read_dead_letters
from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.read_plan import plan_read
from cdcflow.connectors.readers import CdcBatchReader
from cdcflow.connectors.sink import plan_write
from cdcflow.connectors.source_options import split_options
from cdcflow.formats import FormatOptionError, resolve_format
from cdcflow.formats.redact import PLACEHOLDER

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


def test_a_remote_checkpoint_is_refused_without_its_credentials() -> None:
    from cdcflow.connectors.lakehouse.delta_sink import DeltaSink, apply_options

    sink = DeltaSink("/lake/t", apply_options(["id"]), f"s3a://key:{SECRET}@bucket/chk", app_id="orders")
    with pytest.raises(ConnectorOptionError, match="is not a local or mounted path") as error:
        sink.check_identity()
    assert_hidden(str(error.value))
