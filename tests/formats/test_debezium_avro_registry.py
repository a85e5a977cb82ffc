"""debezium-avro-confluent with a Schema Registry.

confluent-kafka's mock registry: one registry per mock:// URL in the process.
"""

from __future__ import annotations

import json
import pickle
from decimal import Decimal
from typing import Any

import pytest
from avro_events import (
    ENVELOPE,
    ENVELOPE_TEXT,
    EVENTS,
    FACTORY,
    NAMESPACE,
    ROWS,
    confluent,
    messages,
    rendered,
)

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import DecodeError, FormatError, Message, MissingDependencyError, parse_ddl
from cdcflow.formats.debezium import avro as debezium_avro


def test_registry_decoding_fetches_each_schema_once(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = (("url", "mock://decode"),)
    client = debezium_avro.registry_client(registry)
    from confluent_kafka.schema_registry import Schema as RegistrySchema

    schema_id = client.register_schema(
        "dbserver1.inventory.products-value", RegistrySchema(ENVELOPE_TEXT, "AVRO")
    )
    decoder = FACTORY.create_decoder({"url": "mock://decode", "key-columns": "id"})
    fetched: list[int] = []
    get_schema = client.get_schema
    monkeypatch.setattr(client, "get_schema", lambda i, *a, **k: fetched.append(i) or get_schema(i, *a, **k))
    out = decoder.decode_all(messages(schema_id))
    assert rendered(decoder, out.changes) == ROWS
    assert fetched == [schema_id]
    unknown = Message(confluent(9999, ENVELOPE, EVENTS[0]), topic="products", offset=5)
    with pytest.raises(DecodeError, match=r"schema id 9999 is not in the Schema Registry at mock://decode"):
        decoder.decode_all([unknown])


def test_registry_round_trip_registers_under_topic_value() -> None:
    schema = parse_ddl("id INT NOT NULL, name STRING, price DECIMAL(10, 2)")
    options = {"url": "mock://roundtrip"}
    encoder = debezium_avro.DebeziumAvroFormat().create_encoder(options, schema, ["id"], topic="shop.orders")
    changes = [Change(RowKind.INSERT, {"id": 1, "name": "a", "price": Decimal("1.50")})]
    encoded = encoder.encode_all(changes)
    client = debezium_avro.registry_client((("url", "mock://roundtrip"),))
    registered = client.get_latest_version("shop.orders-value")
    assert encoded[0].value is not None
    assert encoded[0].value[:5] == b"\x00" + registered.schema_id.to_bytes(4, "big")
    decoder = FACTORY.create_decoder(options)
    out = decoder.decode_all([Message(encoded[0].value)])
    assert [(c.kind, c.row) for c in out.changes] == [(c.kind, c.row) for c in changes]
    assert decoder.schema == schema


def test_toast_state_is_keyed_by_the_avro_kafka_key() -> None:
    from confluent_kafka.schema_registry import Schema as RegistrySchema

    client = debezium_avro.registry_client((("url", "mock://keys"),))
    key_schema = {
        "type": "record",
        "name": "Key",
        "namespace": NAMESPACE,
        "fields": [{"name": "id", "type": "int"}],
    }
    key_id = client.register_schema(
        "dbserver1.inventory.products-key", RegistrySchema(json.dumps(key_schema), "AVRO")
    )
    value_id = client.register_schema(
        "dbserver1.inventory.products-value", RegistrySchema(ENVELOPE_TEXT, "AVRO")
    )
    key = confluent(key_id, key_schema, {"id": 101})
    decoder = FACTORY.create_decoder({"url": "mock://keys"})
    out = decoder.decode_all(Message(m.value, key=key) for m in messages(value_id)[:2])
    assert rendered(decoder, out.changes) == ROWS[:3]
    assert out.metrics.filled_values == 1


def test_unreachable_registry_is_a_clear_error_not_a_dead_letter() -> None:
    registry = (("url", "http://127.0.0.1:9"),)
    client = debezium_avro.registry_client(registry)
    client._rest_client.max_retries = 0  # keep the test fast
    decoder = FACTORY.create_decoder({"url": "http://127.0.0.1:9", "ignore-parse-errors": "true"})
    with pytest.raises(
        FormatError,
        match=r"cannot reach the Schema Registry at http://127.0.0.1:9 to fetch "
        r"schema id 42 .*Check 'debezium-avro-confluent.url'",
    ):
        decoder.decode_all(messages()[:1])


def test_missing_confluent_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_confluent(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("confluent_kafka"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_confluent)
    with pytest.raises(MissingDependencyError, match=r"confluent-kafka.*cdcflow\[kafka\]"):
        FACTORY.create_decoder({"url": "http://registry.invalid:8081"})
    # An explicit schema needs no registry client.
    FACTORY.create_decoder({"schema": ENVELOPE_TEXT})


def test_decoder_pickles_without_the_client() -> None:
    decoder = FACTORY.create_decoder({"url": "mock://pickled", "schema": ENVELOPE_TEXT, "schema-id": "42"})
    clone = pickle.loads(pickle.dumps(decoder))  # noqa: S301 - our own bytes
    assert rendered(clone, clone.decode_all(messages()[:1]).changes) == ROWS[:1]
