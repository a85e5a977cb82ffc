"""The primary key each format reads off a message (:meth:`FormatFactory.primary_key`), on recorded data.

The expected keys are the recorded tables' own: the PostgreSQL tables of ``recorded/postgres`` are
created with ``id integer PRIMARY KEY`` (scripts/record_postgres_debezium.py), Paimon's Canal recording
lists ``pkNames: ["k1"]`` in every message, its Maxwell and OGG recordings ``["id"]``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdcflow.formats import resolve_format

HERE = Path(__file__).parent
POSTGRES = HERE / "recorded" / "postgres"
PAIMON = HERE / "testdata" / "apache_paimon" / "kafka"
FLINK = HERE / "testdata" / "flink"


def lines(path: Path) -> list[bytes]:
    return [line.encode() for line in path.read_text().splitlines() if line.startswith("{")]


@pytest.mark.parametrize("recording", ["schemas.jsonl", "no-schemas.jsonl"])
def test_debezium_takes_the_key_columns_from_the_kafka_key_in_either_converter_form(recording: str) -> None:
    factory = resolve_format("debezium-json")
    by_topic: dict[str, set[tuple[str, ...] | None]] = {}
    keyless: set[tuple[str, ...] | None] = set()
    for line in (POSTGRES / recording).read_text().splitlines():
        record = json.loads(line)
        key = record["key"].encode() if record["key"] is not None else None
        found = factory.primary_key(key, record["value"].encode() if record["value"] else None)
        by_topic.setdefault(record["topic"], set()).add(found)
        if key is None:
            keyless.add(found)
    assert {topic: keys for topic, keys in by_topic.items() if topic.startswith("cdcflow.inventory.")} == {
        "cdcflow.inventory.cdc_types": {("id",)},
        "cdcflow.inventory.cdc_types_full": {("id",)},
        "cdcflow.inventory.cdc_small": {("id",), None},
    }
    assert keyless == {None}, "the TRUNCATE has no key, and names none"


def test_a_key_schema_gives_the_key_columns_in_its_order() -> None:
    factory = resolve_format("debezium-json")
    schema = {"type": "struct", "fields": [{"type": "int32", "field": "b"}, {"type": "int32", "field": "a"}]}
    enveloped = json.dumps({"schema": schema, "payload": {"a": 1, "b": 2}}).encode()
    assert factory.primary_key(enveloped, None) == ("b", "a")
    assert factory.primary_key(b'{"tenant": "x", "id": 7}', None) == ("tenant", "id")
    # a one-column key named like the envelope's parts is a plain key
    assert factory.primary_key(b'{"schema": 3}', None) == ("schema",)


@pytest.mark.parametrize("key", [None, b"", b"7", b'"id"', b"{}", b"not json", b"[1, 2]"])
def test_a_key_that_is_no_object_of_columns_names_none(key: bytes | None) -> None:
    assert resolve_format("debezium-json").primary_key(key, b"{}") is None


@pytest.mark.parametrize(
    ("name", "recording", "want"),
    [
        ("canal-json", PAIMON / "canal/database/include/topic0/canal-data-1.stripped.txt", ("k1",)),
        ("maxwell-json", PAIMON / "maxwell/database/include/topic0/maxwell-data-1.stripped.txt", ("id",)),
        ("ogg-json", PAIMON / "ogg/database/include/topic0/ogg-data-1.stripped.txt", ("id",)),
        ("canal-json", FLINK / "canal-data.txt", ("id",)),
        ("maxwell-json", FLINK / "maxwell-data.txt", ("id",)),
        ("ogg-json", FLINK / "ogg-data.txt", ("id",)),
    ],
)
def test_flat_formats_take_the_key_columns_the_envelope_lists(
    name: str, recording: Path, want: tuple[str, ...]
) -> None:
    factory = resolve_format(name)
    found = {factory.primary_key(None, value) for value in lines(recording)}
    assert found - {None} == {want}


def test_a_message_that_lists_no_key_columns_names_none() -> None:
    canal = {resolve_format("canal-json").primary_key(None, v) for v in lines(FLINK / "canal-data.txt")}
    assert canal == {("id",), None}, "canal-data.txt has one message with pkNames null"
    maxwell = resolve_format("maxwell-json")
    # Maxwell lists the key only with output_primary_key_columns; an empty list names none either
    assert maxwell.primary_key(None, b'{"database": "d", "table": "t", "type": "insert", "data": {}}') is None
    assert maxwell.primary_key(None, b'{"type": "insert", "primary_key_columns": []}') is None


@pytest.mark.parametrize("name", ["generic", "upsert-kafka"])
def test_formats_that_declare_no_key_source_name_none(name: str) -> None:
    assert resolve_format(name).primary_key(b'{"id": 1}', b'{"pkNames": ["id"]}') is None


def test_registry_formats_take_the_key_columns_from_the_key_schema_in_the_registry() -> None:
    """Debezium with AvroConverter / JsonSchemaConverter keys: the key is framed (magic byte, schema
    id) and its schema, in the registry, lists the key columns (a composite key here, in key order)."""
    from confluent_kafka.schema_registry import Schema as RegistrySchema

    from cdcflow.formats.confluent.client import header_bytes, registry_client

    url = "mock://primary-keys"
    client = registry_client((("url", url),))
    avro_key = {
        "type": "record",
        "name": "Key",
        "namespace": "dbserver1.inventory.order_lines",
        "fields": [{"name": "order_id", "type": "long"}, {"name": "line_no", "type": "int"}],
    }
    json_key = {
        "type": "object",
        "title": "dbserver1.inventory.order_lines.Key",
        "properties": {
            "line_no": {"type": "integer", "connect.index": 1, "connect.type": "int32"},
            "order_id": {"type": "integer", "connect.index": 0, "connect.type": "int64"},
        },
    }
    avro_id = client.register_schema("order_lines-key", RegistrySchema(json.dumps(avro_key), "AVRO"))
    json_id = client.register_schema("order_lines-json-key", RegistrySchema(json.dumps(json_key), "JSON"))
    avro = resolve_format("debezium-avro-confluent")
    registry = resolve_format("debezium-json-registry")
    body = b"\x02\x08"  # the Avro body is not read: the key schema names the columns
    assert avro.primary_key(header_bytes(avro_id) + body, None, {"url": url}) == ("order_id", "line_no")
    framed_json = header_bytes(json_id) + b'{"order_id": 1, "line_no": 4}'
    assert registry.primary_key(framed_json, None, {"url": url}) == ("order_id", "line_no")
    # a plain JSON key (JsonConverter for keys, the registry for values), no key, no registry
    assert registry.primary_key(b'{"order_id": 1, "line_no": 4}', None, {"url": url}) == (
        "order_id",
        "line_no",
    )
    assert avro.primary_key(None, None, {"url": url}) is None
    assert avro.primary_key(header_bytes(avro_id) + body, None, {}) is None
